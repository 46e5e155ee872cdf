"""show_batch draws every image with its boxes and class names."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from yolo9kit.plots import show_batch  # noqa: E402


def test_show_batch_grid_and_single_axes():
    images = torch.zeros(5, 3, 32, 48, dtype=torch.uint8)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2], [3, 0, 0.3, 0.3, 0.1, 0.1], [3, 1, 0.6, 0.6, 0.2, 0.3]])
    fig = show_batch((images, targets), names=["cat", "dog"], max_images=4)
    assert len([a for a in fig.axes if a.images]) == 4
    labels = [t.get_text() for a in fig.axes for t in a.texts]
    assert sorted(labels) == ["cat", "dog", "dog"]
    assert len(fig.axes[3].patches) == 2
    plt.close(fig)
    fig, ax = plt.subplots()
    assert show_batch((images.float() / 255, targets), ax=ax) is fig
    assert len(ax.images) == 5 and sorted(t.get_text() for t in ax.texts) == ["0", "1", "1"]
    plt.close(fig)
