"""Pictures of the data: a grid of training or validation images with their boxes and class names
(``show_batch``), and the statistics of a dataset's labels (``plot_labels``)."""

from __future__ import annotations

import math

import numpy as np


def show_batch(batch, names: list[str] | dict[int, str] | None = None, max_images: int = 16, ax=None, fig=None,
               ncols: int | None = None, tile_inches: float = 3.0, title: str | None = None):
    """Draw the images of a loader batch with their boxes.

    Args:
        batch: ``(images uint8 (B, 3, H, W) RGB, targets (N, 6) [image, class, cx, cy, w, h] normalised, ...)``
            as yielded by :func:`yolo9kit.data.create_dataloader` (float images in [0, 1] work too).
        names: class names (list or {id: name}); ids are shown when None.
        max_images: draw at most this many images.
        ax: a single axes to draw a mosaic of the images into; or ``fig`` to add a grid of axes to.
        ncols: columns of the grid (default: about the square root).
        title: a title above the grid (laid out with the images, so it never covers them).

    Returns:
        The matplotlib Figure.
    """
    import matplotlib
    from matplotlib.patches import Rectangle

    from yolo9kit.figure import new_figure

    images, targets = batch[0], batch[1]
    n = min(len(images), max_images)
    ncols = ncols or math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    if ax is not None:
        axes, fig = None, ax.figure
    else:
        if fig is None:
            fig = new_figure((ncols * tile_inches, nrows * tile_inches))
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colours = matplotlib.colormaps["tab10"]
    targets = np.asarray(targets.cpu() if hasattr(targets, "cpu") else targets, dtype=np.float64)
    for i in range(n):
        image = images[i]
        image = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
        image = image.transpose(1, 2, 0)
        if image.dtype != np.uint8:
            image = (image.clip(0, 1) * 255).astype(np.uint8)
        h, w = image.shape[:2]
        if axes is not None:
            a, x_off, y_off = axes[i], 0, 0
            a.imshow(image)
        else:  # one axes: lay the images out on a grid in data coordinates
            a, x_off, y_off = ax, (i % ncols) * w, (i // ncols) * h
            a.imshow(image, extent=(x_off, x_off + w, y_off + h, y_off))
        for _, cls, cx, cy, bw, bh in targets[targets[:, 0] == i]:
            c = int(cls)
            colour = colours(c % 10)
            x1, y1 = x_off + (cx - bw / 2) * w, y_off + (cy - bh / 2) * h
            a.add_patch(Rectangle((x1, y1), bw * w, bh * h, fill=False, edgecolor=colour, linewidth=1.5))
            label = _class_name(names, c)
            a.text(x1, y1, label, color="white", fontsize=7, va="bottom",
                   bbox={"facecolor": colour, "alpha": 0.8, "pad": 1, "edgecolor": "none"})
        a.set_axis_off()
    if axes is not None:
        for a in axes[n:]:
            a.set_axis_off()
    else:
        ax.set_xlim(0, ncols * w)
        ax.set_ylim(nrows * h, 0)
    if title:
        fig.suptitle(title, fontsize=10)
    if fig.get_layout_engine() is None:  # a figure with its own layout (new_figure) lays out when drawn
        fig.tight_layout()  # after the title: the grid makes room for it
    return fig


def plot_labels(labels, names: list[str] | dict[int, str] | None = None, fig=None, max_boxes: int = 1000):
    """The statistics of a dataset's labels: boxes per class, where the box centres lie, the box sizes, and the
    outlines of up to ``max_boxes`` boxes drawn about one centre (2 x 2 axes).

    Args:
        labels: rows ``[class, cx, cy, w, h]`` normalised to [0, 1], shape (N, 5) (e.g. the concatenated
            ``YOLODataset.labels``), or a list of such arrays (one per image).
        names: class names (list or {id: name}); bars are labelled by id when None.
        fig: a matplotlib figure to draw into (cleared), or None for a new one outside pyplot.
        max_boxes: boxes drawn in the outline panel (the first ones; all of them count in the others).

    Returns:
        The figure.
    """
    from matplotlib.patches import Rectangle

    from yolo9kit.figure import new_figure

    if isinstance(labels, (list, tuple)):
        labels = np.concatenate([np.asarray(x, dtype=np.float64).reshape(-1, 5) for x in labels]) if labels \
            else np.zeros((0, 5))
    labels = np.asarray(labels, dtype=np.float64).reshape(-1, 5)
    classes = labels[:, 0].astype(int)
    nc = max(len(names or ()), int(classes.max()) + 1 if len(classes) else 0)
    fig = fig if fig is not None else new_figure((8, 8))
    fig.clear()
    axes = fig.subplots(2, 2)
    counts = np.bincount(classes, minlength=nc)
    axes[0, 0].bar(range(nc), counts, color=[f"C{c % 10}" for c in range(nc)])
    if 0 < nc <= 30:  # beyond that the tick labels overlap
        axes[0, 0].set_xticks(range(nc), [_class_name(names, c) for c in range(nc)], rotation=90 if nc > 8 else 0,
                              fontsize=8)
    axes[0, 0].set(title=f"boxes per class ({len(labels)} boxes)", ylabel="boxes")
    for ax, (i, j), title, xlabel, ylabel in ((axes[1, 0], (1, 2), "box centres", "x", "y"),
                                              (axes[1, 1], (3, 4), "box sizes", "width", "height")):
        ax.hist2d(labels[:, i], labels[:, j], bins=50, range=((0, 1), (0, 1)), cmap="Blues", cmin=1)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1), aspect="equal")
    axes[1, 0].invert_yaxis()  # image coordinates: y grows downwards
    outline = axes[0, 1]
    for cls, _, _, w, h in labels[:max_boxes]:
        outline.add_patch(Rectangle((0.5 - w / 2, 0.5 - h / 2), w, h, fill=False, linewidth=0.5, alpha=0.5,
                                    edgecolor=f"C{int(cls) % 10}"))
    outline.set(title="box outlines about one centre", xlim=(0, 1), ylim=(1, 0), aspect="equal")
    outline.set_xticks([])
    outline.set_yticks([])
    if fig.get_layout_engine() is None:  # a figure with its own layout (new_figure) lays out when drawn
        fig.tight_layout()
    return fig


def _class_name(names: list[str] | dict[int, str] | None, c: int) -> str:
    """The name of class ``c``, or its id when ``names`` does not name it."""
    if isinstance(names, dict):
        return str(names.get(c, c))
    return names[c] if names is not None and c < len(names) else str(c)
