r"""Reliability diagrams drawn from the per-bin sums of an equal-width calibration metric.

A top-label calibration metric with ``B`` equal-width bins keeps three arrays of length ``B``:
``count[k]`` (samples whose confidence falls in bin ``k``), ``conf_sum[k]`` (the sum of their
confidences) and ``correct_sum[k]`` (how many of them were predicted correctly). Everything a
reliability diagram shows follows from them:

.. math::

    \operatorname{acc}(k) = \frac{\text{correct\_sum}_k}{n_k}, \qquad
    \operatorname{conf}(k) = \frac{\text{conf\_sum}_k}{n_k}, \qquad
    \operatorname{ECE} = \sum_k \frac{n_k}{N}\,\lvert \operatorname{acc}(k) -
    \operatorname{conf}(k) \rvert = \frac{1}{N} \sum_k \lvert \text{conf\_sum}_k -
    \text{correct\_sum}_k \rvert .

The layout follows Guo et al., "On Calibration of Modern Neural Networks" (ICML 2017), Fig. 1:
accuracy bars per bin with the gap to the mean confidence drawn on top, the diagonal of perfect
calibration, and a confidence histogram below. Figures are built on
:class:`matplotlib.figure.Figure` with an Agg canvas, never through ``pyplot``: no window opens,
no global figure registry fills up, and drawing is safe from several threads.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_losses.functional.checks import check_choice, check_fraction

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "axis_labels",
    "gamma_diagram",
    "panel_title",
    "reliability_diagram",
    "save_reliability_diagram",
    "wilson_interval",
]

#: Figure size in inches and resolution of the saved PNG (500 x 600 pixels).
FIGSIZE = (5.0, 6.0)
DPI = 100
#: What a diagram's axes show, by task: (x axis, y axis). Multiclass bins the top label's
#: probability against how often it is right; binary bins the positive-class probability
#: against how often the sample is positive, multi-label each label's probability against how
#: often that label is on (as :func:`~lightning_losses.calibration.functional.calibration_error`
#: bins them).
AXES = {
    "multiclass": ("Confidence", "Accuracy"),
    "binary": ("P(positive)", "Observed positive frequency"),
    "multilabel": ("P(label)", "Observed label frequency"),
}
#: Characters of a title line before it wraps (the panel is 5 inches wide), and their size.
TITLE_WIDTH = 60
TITLE_SIZE = "medium"


def axis_labels(task: str) -> tuple[str, str]:
    """The (x, y) axis labels of a reliability diagram of ``task``.

    Example:
        >>> axis_labels("binary")
        ('P(positive)', 'Observed positive frequency')
    """
    check_choice("task", task, tuple(AXES))
    return AXES[task]


def panel_title(title: str | None, value: str) -> str:
    """``title``, each of its lines wrapped at :data:`TITLE_WIDTH`, above ``value``.

    Example:
        >>> print(panel_title("digits_focal · run 3f2a9c1e", "ECE = 0.1000"))
        digits_focal · run 3f2a9c1e
        ECE = 0.1000
        >>> panel_title(None, "ECE = 0.1000")
        'ECE = 0.1000'
    """
    import textwrap

    if title is None:
        return value
    lines = [part for line in title.splitlines() for part in textwrap.wrap(line, TITLE_WIDTH)]
    return "\n".join([*lines, value])


def _as_float64(x: Any, name: str) -> np.ndarray:
    """A 1-D float64 NumPy copy of a tensor, array or sequence."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().cpu().double().numpy()
    array = np.asarray(x, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D (one value per bin), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` contains non-finite values")
    return array


def _check_bins(count: Any, conf_sum: Any, correct_sum: Any) -> tuple[np.ndarray, ...]:
    """Validate the three per-bin arrays and return them as float64 NumPy arrays."""
    count = _as_float64(count, "count")
    conf_sum = _as_float64(conf_sum, "conf_sum")
    correct_sum = _as_float64(correct_sum, "correct_sum")
    if not count.shape == conf_sum.shape == correct_sum.shape:
        raise ValueError(
            "count, conf_sum and correct_sum must have the same length, got "
            f"{count.shape[0]}, {conf_sum.shape[0]} and {correct_sum.shape[0]}"
        )
    if count.shape[0] == 0:
        raise ValueError("need at least one bin")
    if np.any(count < 0):
        raise ValueError("`count` must be non-negative")
    slack = 1e-9 * np.maximum(count, 1.0)
    for name, sums in (("conf_sum", conf_sum), ("correct_sum", correct_sum)):
        if np.any(sums < -slack) or np.any(sums > count + slack):
            raise ValueError(f"`{name}` must lie in [0, count] bin by bin")
    if count.sum() <= 0:
        raise ValueError("all bins are empty (N = 0): there is nothing to draw")
    return count, conf_sum, correct_sum


def _ece(count: np.ndarray, conf_sum: np.ndarray, correct_sum: np.ndarray) -> float:
    """``sum_k |conf_sum_k - correct_sum_k| / N``, the top-label l1 calibration error."""
    return float(np.abs(conf_sum - correct_sum).sum() / count.sum())


def _figure(height_ratios: list[int] | None, title_lines: int = 2) -> tuple[Figure, Any]:
    """An Agg figure of :data:`FIGSIZE` with one panel, or panels stacked by ``height_ratios``.

    Fixed margins, not a layout engine: constrained layout measures every tick label and
    doubled the drawing time, which matters when a callback draws every few epochs. The top
    margin leaves room for ``title_lines`` lines of title.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    top = 0.96 - 0.03 * max(title_lines, 2)  # 0.9 for the usual two lines
    margins = {"left": 0.13, "right": 0.97, "bottom": 0.08, "top": top}
    if height_ratios is None:
        return fig, fig.subplots(gridspec_kw=margins)
    grid = {"height_ratios": height_ratios, "hspace": 0.08, **margins}
    return fig, fig.subplots(len(height_ratios), 1, sharex=True, gridspec_kw=grid)


def reliability_diagram(
    count: Any,
    conf_sum: Any,
    correct_sum: Any,
    *,
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    ece: float | None = None,
    show_histogram: bool = True,
    level: float | None = None,
    task: str = "multiclass",
) -> Figure:
    """Draw a reliability diagram (and a confidence histogram) from per-bin sums.

    Bin ``k`` of ``B`` covers confidences ``(k/B, (k+1)/B]``. The top panel draws, for every
    non-empty bin, a bar up to its accuracy ``correct_sum_k / n_k`` and a red hatched bar
    between the accuracy and the mean confidence ``conf_sum_k / n_k`` (the calibration gap),
    with the diagonal of perfect calibration; an empty bin gets no bar at all. Its title shows
    the expected calibration error ``ECE = sum_k |conf_sum_k - correct_sum_k| / N``. The bottom
    panel is the histogram of ``n_k`` with the overall mean confidence and accuracy marked.

    The bars carry labels so that they can be found on the returned figure:
    ``fig.axes[0].containers`` holds a ``"Accuracy"`` and a ``"Gap"`` container with one patch
    per non-empty bin, and ``fig.axes[1].containers`` a ``"Samples"`` container with one patch
    per bin.

    ``task`` names what the bins hold, for the axes (:data:`AXES`): ``"multiclass"``, the top
    label's confidence against accuracy; ``"binary"``, the positive-class probability,
    ``P(positive)``, against the observed positive frequency (then the bars' container is
    labelled ``"Observed positive frequency"``); ``"multilabel"``, each label's probability
    against how often the label is on.

    With ``level`` (e.g. 0.95) every non-empty bin's accuracy also gets an error bar: the
    Wilson score interval at that level of ``correct_sum_k`` successes in ``n_k`` trials,
    ``(p + z^2/2n ± z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``z`` the normal
    quantile of ``(1 + level) / 2`` (Wilson, "Probable inference, the law of succession, and
    statistical inference", JASA 1927); it stays within [0, 1] and is not empty for a bin of one
    sample. Its container is labelled ``"<level> Wilson interval"`` (e.g. ``"95% Wilson
    interval"``) and its bounds are :func:`wilson_interval`.

    Args:
        count: samples per bin, shape ``[B]`` (tensor, array or sequence).
        conf_sum: sum of the top-label confidences per bin, shape ``[B]``.
        correct_sum: number of correct top-label predictions per bin, shape ``[B]``.
        path: if given, the figure is saved there (PNG unless the suffix says otherwise)
            at ``5 x 6`` inches and 100 dpi, i.e. 500 x 600 pixels.
        title: first line of the title of the top panel; the ECE goes on the line below.
        ece: the ECE to show; computed from the three arrays if ``None``.
        show_histogram: draw the bottom panel.
        level: draw each bin's Wilson interval of its accuracy at this confidence level, in
            (0, 1); ``None`` draws none.
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``: the axes' labels.

    Returns:
        The :class:`matplotlib.figure.Figure` (Agg canvas, not registered with ``pyplot``).

    Raises:
        ValueError: if the arrays are not 1-D of one length, hold non-finite or inconsistent
            values, or are all empty (``N = 0``), or ``task`` is none of the three.

    Example:
        >>> fig = reliability_diagram([0, 2, 3, 5], [0.0, 0.7, 1.9, 4.6], [0, 1, 2, 4])
        >>> fig.axes[0].get_title()
        'ECE = 0.1000'
        >>> len(fig.axes[0].containers[0])  # one accuracy bar per non-empty bin
        3
        >>> binary = reliability_diagram([0, 2, 3, 5], [0.0, 0.7, 1.9, 4.6], [0, 1, 2, 4],
        ...                              task="binary", show_histogram=False)
        >>> binary.axes[0].get_xlabel(), binary.axes[0].get_ylabel()
        ('P(positive)', 'Observed positive frequency')
    """
    x_label, y_label = axis_labels(task)
    count, conf_sum, correct_sum = _check_bins(count, conf_sum, correct_sum)
    n_bins = count.shape[0]
    total = count.sum()
    if ece is None:
        ece = _ece(count, conf_sum, correct_sum)

    nonempty = count > 0
    edges = np.arange(n_bins, dtype=np.float64)[nonempty] / n_bins
    accuracy = correct_sum[nonempty] / count[nonempty]
    confidence = conf_sum[nonempty] / count[nonempty]
    width = 1.0 / n_bins

    heading = panel_title(title, f"ECE = {ece:.4f}")
    fig, axes = _figure([3, 1] if show_histogram else None, heading.count("\n") + 1)
    ax, hist_ax = axes if show_histogram else (axes, None)

    ax.bar(
        edges,
        accuracy,
        width=width,
        align="edge",
        color="tab:blue",
        edgecolor="black",
        linewidth=0.6,
        label=y_label,
    )
    ax.bar(
        edges,
        np.abs(confidence - accuracy),
        bottom=np.minimum(accuracy, confidence),
        width=width,
        align="edge",
        color="tab:red",
        alpha=0.35,
        edgecolor="tab:red",
        hatch="//",
        linewidth=0.6,
        label="Gap",
    )
    if level is not None:
        low, high = wilson_interval(count[nonempty], correct_sum[nonempty], level)
        ax.errorbar(
            edges + width / 2,
            accuracy,
            yerr=np.stack([accuracy - low, high - accuracy]).clip(min=0.0),
            fmt="none",
            ecolor="black",
            elinewidth=0.9,
            capsize=2.5,
            label=f"{level:.0%} Wilson interval",
        )
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", label="Perfect calibration")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel(y_label)
    ax.set_title(heading, fontsize=TITLE_SIZE)
    ax.legend(loc="upper left")

    if hist_ax is not None:
        all_edges = np.arange(n_bins, dtype=np.float64) / n_bins
        hist_ax.bar(
            all_edges,
            count,
            width=width,
            align="edge",
            color="tab:gray",
            edgecolor="black",
            linewidth=0.6,
            label="Samples",
        )
        means = ("Avg. conf.", "Acc.") if task == "multiclass" else (f"Mean {x_label}", "Observed")
        hist_ax.axvline(conf_sum.sum() / total, color="tab:red", linestyle="--", label=means[0])
        hist_ax.axvline(correct_sum.sum() / total, color="tab:blue", linestyle="-", label=means[1])
        hist_ax.set_ylabel("Count")
        hist_ax.set_xlabel(x_label)
        hist_ax.legend(loc="upper left", fontsize="small")
    else:
        ax.set_xlabel(x_label)

    if path is not None:
        fig.savefig(os.fspath(path), dpi=DPI)
    return fig


def wilson_interval(count: Any, successes: Any, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of ``successes / count`` per bin, at ``level``: ``(low, high)``.

    Bins with ``count = 0`` get ``[0, 1]``. Source: Wilson, JASA 1927.

    Example:
        >>> low, high = wilson_interval([10, 1], [7, 1], 0.95)
        >>> np.round(low, 4), np.round(high, 4)
        (array([0.3968, 0.2065]), array([0.8922, 1.    ]))
    """
    from statistics import NormalDist

    level = check_fraction("level", level, example="0.95")
    n = np.asarray(count, dtype=np.float64)
    p = np.asarray(successes, dtype=np.float64) / np.where(n > 0, n, 1.0)
    z = NormalDist().inv_cdf((1.0 + level) / 2)
    safe = np.where(n > 0, n, 1.0)
    scale = 1.0 + z * z / safe
    centre = (p + z * z / (2 * safe)) / scale
    half = z * np.sqrt(p * (1 - p) / safe + z * z / (4 * safe * safe)) / scale
    low = np.where(n > 0, np.clip(centre - half, 0.0, 1.0), 0.0)
    high = np.where(n > 0, np.clip(centre + half, 0.0, 1.0), 1.0)
    return low, high


def save_reliability_diagram(
    metric_or_bins: Any, path: str | os.PathLike[str], **kwargs: Any
) -> Figure:
    """Save the reliability diagram of a metric, or of three per-bin arrays, to ``path``.

    Args:
        metric_or_bins: a tuple ``(count, conf_sum, correct_sum)``, or any object with a
            ``bins()`` method returning that tuple (e.g. an equal-width calibration metric).
        path: where to write the image (PNG unless the suffix says otherwise).
        **kwargs: passed on to :func:`reliability_diagram` (``title``, ``ece``,
            ``show_histogram``, ``level``, ``task``).

    Returns:
        The figure that was saved.

    Raises:
        TypeError: if ``metric_or_bins`` is neither three arrays nor has ``bins()``.
    """
    bins_method = getattr(metric_or_bins, "bins", None)
    bins = bins_method() if callable(bins_method) else metric_or_bins
    if not isinstance(bins, (tuple, list)) or len(bins) != 3:
        raise TypeError(
            "expected (count, conf_sum, correct_sum) or an object whose bins() returns them, "
            f"got {type(metric_or_bins).__name__}"
        )
    return reliability_diagram(*bins, path=path, **kwargs)


def gamma_diagram(
    edges: Any,
    count: Any,
    conf_sum: Any,
    correct_sum: Any,
    gammas: Any,
    *,
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> Figure:
    """AdaFocal's view: reliability of equal-mass bins above, each bin's gamma below.

    Bin ``k`` spans ``[edges[k], edges[k+1]]``. The top panel plots each non-empty bin's
    accuracy ``correct_sum_k / n_k`` against its mean confidence ``conf_sum_k / n_k`` with the
    diagonal of perfect calibration (points below it are over-confident bins); its title shows
    the ECE of these bins. The bottom panel draws ``gammas[k]`` as a step over the bin, with
    0 marked: above it the bin trains with focal loss, below it with inverse focal loss.

    Args:
        edges: ``[B + 1]`` non-decreasing bin edges.
        count: samples per bin, ``[B]``.
        conf_sum: sum of the confidences per bin, ``[B]``.
        correct_sum: correct predictions per bin, ``[B]``.
        gammas: ``[B]`` gammas, e.g. those the bins get after this validation.
        path: if given, the figure is saved there (500 x 600 pixels).
        title: first line of the top panel's title.

    Example:
        >>> fig = gamma_diagram([0.2, 0.6, 1.0], [2, 2], [0.7, 1.8], [1, 2], [1.5, -0.3])
        >>> fig.axes[0].get_title()
        'ECE = 0.1250'
        >>> fig.axes[1].patches[0].get_label()  # the step of the gammas
        'gamma'
    """
    count, conf_sum, correct_sum = _check_bins(count, conf_sum, correct_sum)
    edges = _as_float64(edges, "edges")
    gammas = _as_float64(gammas, "gammas")
    if edges.shape != (count.shape[0] + 1,) or gammas.shape != count.shape:
        raise ValueError(
            f"edges must hold B + 1 = {count.shape[0] + 1} values and gammas B = "
            f"{count.shape[0]}; got {edges.shape[0]} and {gammas.shape[0]}"
        )
    ece = _ece(count, conf_sum, correct_sum)
    nonempty = count > 0

    heading = panel_title(title, f"ECE = {ece:.4f}")
    fig, (ax, gamma_ax) = _figure([3, 2], heading.count("\n") + 1)
    ax.plot(
        conf_sum[nonempty] / count[nonempty],
        correct_sum[nonempty] / count[nonempty],
        marker="o",
        color="tab:blue",
        label="Accuracy per equal-mass bin",
    )
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", label="Perfect calibration")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("Accuracy")
    ax.set_title(heading, fontsize=TITLE_SIZE)
    ax.legend(loc="upper left")

    gamma_ax.stairs(gammas, edges, baseline=None, color="tab:orange", linewidth=1.5, label="gamma")
    gamma_ax.axhline(0.0, color="gray", linewidth=0.8)
    gamma_ax.set_ylabel("gamma (< 0: inverse focal)")
    gamma_ax.set_xlabel("Confidence")
    gamma_ax.legend(loc="upper left", fontsize="small")

    if path is not None:
        fig.savefig(os.fspath(path), dpi=DPI)
    return fig
