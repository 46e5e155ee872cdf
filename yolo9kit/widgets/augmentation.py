"""``augmentation_viewer()``: one training batch under adjustable augmentation hyper-parameters.

Each change builds the training loader with the new hyper-parameters (``workers=0``, fixed seed, so
the same sliders always give the same batch) and draws its first batch with ``plots.show_batch``.
"""

from __future__ import annotations

from typing import Any

from yolo9kit.widgets._common import WidgetApp, show_error, show_figure

# slider name -> (official hyp key(s), min, max, step)
_SLIDERS: dict[str, tuple[tuple[str, ...], float, float, float]] = {
    "mosaic": (("mosaic",), 0.0, 1.0, 0.05),
    "mixup": (("mixup",), 0.0, 1.0, 0.05),
    "hsv": (("hsv_h", "hsv_s", "hsv_v"), 0.0, 2.0, 0.1),  # scales the three official HSV gains together
    "scale": (("scale",), 0.0, 0.9, 0.05),
    "fliplr": (("fliplr",), 0.0, 1.0, 0.05),
}


def augmentation_hyp(values: dict[str, float], base: dict[str, float] | None = None) -> dict[str, float]:
    """Slider values -> an augmentation hyp dict: the official defaults (or ``base``) with the sliders applied.

    ``hsv`` multiplies the base ``hsv_h``, ``hsv_s`` and ``hsv_v`` (1.0 = official strength, 0 = off).
    """
    from yolo9kit.config import DEFAULT_AUGMENT_HYP

    hyp = {**DEFAULT_AUGMENT_HYP, **(base or {})}
    for name, value in values.items():
        keys = _SLIDERS[name][0]
        for key in keys:
            hyp[key] = hyp[key] * value if name == "hsv" else value
    return hyp


def augmentation_viewer(data, *, imgsz: int = 320, batch_size: int = 4, seed: int = 0,
                        hyp: dict[str, float] | None = None) -> WidgetApp:
    """Sliders for mosaic, mixup, HSV strength, scale and horizontal flip over a training batch.

    Args:
        data: data.yaml path or dict (as ``create_dataloader``).
        imgsz: training image size. batch_size: images drawn. seed: the first batch's seed (a slider too).
        hyp: starting augmentation hyper-parameters (default: official hyp.scratch-high).

    Returns:
        WidgetApp with controls ``mosaic``, ``mixup``, ``hsv``, ``scale``, ``fliplr``, ``seed``; output
        ``batch`` (the drawn batch); ``state["hyp"]`` the hyper-parameters used, ``state["batch"]`` the batch.
    """
    import ipywidgets as w

    from yolo9kit.data import create_dataloader
    from yolo9kit.plots import show_batch

    start = augmentation_hyp({}, hyp)
    controls: dict[str, Any] = {}
    for name, (keys, lo, hi, step) in _SLIDERS.items():
        value = 1.0 if name == "hsv" else start[keys[0]]
        controls[name] = w.FloatSlider(value=value, min=lo, max=hi, step=step, description=name,
                                       continuous_update=False, readout_format=".2f")
    controls["seed"] = w.IntSlider(value=seed, min=0, max=99, description="seed", continuous_update=False)
    outputs = {"batch": w.Output(), "text": w.HTML()}

    def update() -> None:
        values = {k: c.value for k, c in controls.items() if k in _SLIDERS}
        used = augmentation_hyp(values, hyp)
        try:
            loader = create_dataloader(data, "train", imgsz=imgsz, batch_size=batch_size, workers=0,
                                       seed=controls["seed"].value, hyp=used, cache=None)
            batch = next(iter(loader))
        except (OSError, ValueError) as error:
            show_error(outputs["batch"], f"cannot load a training batch: {error}")
            return
        names = getattr(loader.dataset, "names", None)
        fig = show_batch(batch, names=names, max_images=batch_size,
                         title=f"mosaic {used['mosaic']:.2f}, mixup {used['mixup']:.2f}, HSV x{values['hsv']:.1f}, "
                               f"scale {used['scale']:.2f}, seed {controls['seed'].value}")
        app.figures["batch"], app.state["hyp"], app.state["batch"] = fig, used, batch
        show_figure(outputs["batch"], fig)
        outputs["text"].value = f"{len(batch[1])} boxes in {len(batch[0])} images of {tuple(batch[0].shape[2:])} px"

    sliders = list(controls.values())
    container = w.VBox([w.HBox(sliders[:3]), w.HBox(sliders[3:]), outputs["text"], outputs["batch"]])
    app = WidgetApp(container=container, controls=controls, outputs=outputs, update=update)
    for control in controls.values():
        control.observe(lambda change: update(), names="value")
    update()
    return app
