"""Smooth reliability diagrams, drawn from the grid statistics of the smooth ECE.

The curve is the kernel-smoothed accuracy against the confidence, as in Błasiok and Nakkiran,
"Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing" (ICLR 2024): at the same
bandwidth ``σ`` as the smECE (the automatic ``σ*`` unless given), drawn thicker where the
kernel density of the confidences is higher, with that density in a panel below. It needs only
the two arrays of :func:`~lightning_losses.calibration.smooth.smooth_grid_statistics` (the
state of :class:`~lightning_losses.calibration.metrics.SmoothCalibrationError`). Figures use an
Agg canvas, never ``pyplot``, as :mod:`lightning_losses.calibration.diagram` does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_losses.calibration.diagram import (
    DPI,
    TITLE_SIZE,
    _figure,
    axis_labels,
    panel_title,
)
from lightning_losses.calibration.smooth import smooth_reliability_curve

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["save_smooth_reliability_diagram", "smooth_reliability_diagram"]

#: Line width (points) of the curve where the density is highest; it falls to
#: :data:`MIN_LINE_WIDTH` where there are no confidences.
MAX_LINE_WIDTH = 6.0
MIN_LINE_WIDTH = 0.5


def smooth_reliability_diagram(
    mass: Any,
    residual: Any,
    *,
    bandwidth: float | None = None,
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    show_density: bool = True,
    task: str = "multiclass",
) -> Figure:
    """Draw the smoothed reliability diagram of Błasiok and Nakkiran from the grid statistics.

    The top panel draws the kernel-smoothed accuracy ``sum_i K(t, f_i) y_i / sum_i K(t, f_i)``
    against the confidence ``t``, with line width following the kernel density of the
    confidences (thick where most predictions lie), and the diagonal of perfect calibration;
    its title shows ``smECE`` and ``σ``. The bottom panel (``show_density``) fills the density
    ``δ(t)`` of the confidences. Where the density is negligible the curve is not drawn.

    The curve is ``fig.axes[0].collections[0]`` (label ``"Smoothed accuracy"``; binary:
    ``"Smoothed observed positive frequency"``; one segment per mesh interval) and the density
    ``fig.axes[1].collections[0]`` (label ``"Density"``).

    Args:
        mass: float64 ``[G + 1]`` mass per grid node (tensor, array or sequence), e.g. from
            ``SmoothCalibrationError.grid()``.
        residual: float64 ``[G + 1]`` residual (confidence minus correctness) per node.
        bandwidth: ``None`` for the automatic ``σ*``, or a fixed ``σ >= 0.001``.
        path: if given, the figure is saved there (PNG unless the suffix says otherwise) at
            500 x 600 pixels.
        title: first line of the title of the top panel; smECE and ``σ`` go on the line below.
        show_density: draw the bottom panel.
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``: the axes' labels, as in
            :func:`~lightning_losses.calibration.diagram.reliability_diagram` (binary:
            ``P(positive)`` against the observed positive frequency).

    Returns:
        The :class:`matplotlib.figure.Figure` (Agg canvas, not registered with ``pyplot``).

    Raises:
        ValueError: arrays that are not grid statistics (see
            :func:`~lightning_losses.calibration.smooth.smooth_calibration_error_from_grid`),
            an empty grid, a bad ``bandwidth``, or ``task`` none of the three.

    Example:
        >>> import torch
        >>> from lightning_losses.calibration.smooth import smooth_grid_statistics
        >>> mass, residual = smooth_grid_statistics(
        ...     torch.tensor([0.9, 0.8, 0.7, 0.6]), torch.tensor([1.0, 0.0, 1.0, 0.0])
        ... )
        >>> fig = smooth_reliability_diagram(mass, residual)
        >>> fig.axes[0].get_title()
        'smECE = 0.2498 (σ = 0.2500)'
        >>> len(fig.axes)
        2
    """
    from matplotlib.collections import LineCollection

    x_label, y_label = axis_labels(task)
    curve = smooth_reliability_curve(mass, residual, bandwidth=bandwidth)
    mesh, accuracy, density = curve.mesh, curve.accuracy, curve.density

    heading = panel_title(title, f"smECE = {curve.value:.4f} (σ = {curve.bandwidth:.4f})")
    fig, axes = _figure([3, 1] if show_density else None, heading.count("\n") + 1)
    ax, density_ax = axes if show_density else (axes, None)

    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", label="Perfect calibration")
    points = np.stack([mesh, accuracy], axis=1)
    segments = np.stack([points[:-1], points[1:]], axis=1)
    middle = (density[:-1] + density[1:]) / 2
    widths = MIN_LINE_WIDTH + (MAX_LINE_WIDTH - MIN_LINE_WIDTH) * middle / middle.max()
    ax.add_collection(
        LineCollection(
            list(segments),  # one [2, 2] array per segment, the documented sequence
            linewidths=widths,
            colors="tab:red",
            capstyle="round",
            label=f"Smoothed {y_label.lower()}",
        )
    )
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel(y_label)
    ax.set_title(heading, fontsize=TITLE_SIZE)
    ax.legend(loc="upper left")

    if density_ax is not None:
        density_ax.fill_between(
            mesh, 0.0, density, color="tab:gray", alpha=0.5, linewidth=0.0, label="Density"
        )
        density_ax.set_ylim(bottom=0.0)
        density_ax.set_ylabel("Density")
        density_ax.set_xlabel(x_label)
        density_ax.legend(loc="upper left", fontsize="small")
    else:
        ax.set_xlabel(x_label)

    if path is not None:
        fig.savefig(os.fspath(path), dpi=DPI)
    return fig


def save_smooth_reliability_diagram(
    metric_or_grid: Any, path: str | os.PathLike[str], **kwargs: Any
) -> Figure:
    """Save the smooth reliability diagram of a metric, or of ``(mass, residual)``, to ``path``.

    Args:
        metric_or_grid: a pair ``(mass, residual)``, or any object with a ``grid()`` method
            returning that pair (e.g. a ``SmoothCalibrationError``); a ``bandwidth`` attribute
            of the object is used unless ``bandwidth`` is passed.
        path: where to write the image (PNG unless the suffix says otherwise).
        **kwargs: passed on to :func:`smooth_reliability_diagram` (``bandwidth``, ``title``,
            ``show_density``, ``task``).

    Returns:
        The figure that was saved.

    Raises:
        TypeError: if ``metric_or_grid`` is neither two arrays nor has ``grid()``.
    """
    grid_method = getattr(metric_or_grid, "grid", None)
    if callable(grid_method):
        grid = grid_method()
        kwargs.setdefault("bandwidth", getattr(metric_or_grid, "bandwidth", None))
    else:
        grid = metric_or_grid
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise TypeError(
            "metric_or_grid must be (mass, residual) or an object whose grid() returns them; "
            f"got {type(metric_or_grid).__name__}"
        )
    return smooth_reliability_diagram(*grid, path=path, **kwargs)
