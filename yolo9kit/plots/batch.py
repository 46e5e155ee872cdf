"""show_batch: a grid of training or validation images with their boxes and class names."""

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
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    images, targets = batch[0], batch[1]
    n = min(len(images), max_images)
    ncols = ncols or math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    if ax is not None:
        axes, fig = None, ax.figure
    else:
        if fig is None:
            fig = plt.figure(figsize=(ncols * tile_inches, nrows * tile_inches))
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colours = plt.get_cmap("tab10")
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
            label = names[c] if names is not None and (isinstance(names, dict) or c < len(names)) else str(c)
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
    fig.tight_layout()  # after the title: the grid makes room for it
    return fig
