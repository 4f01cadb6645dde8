"""A bridge to netcal: its inputs, its reference metrics and its reliability diagram.

netcal (Küppers et al., https://github.com/EFS-OpenSource/calibration-framework) works on NumPy
probabilities: an ``[N, C]`` array of class probabilities (multiclass, softmax) or an ``[N]``
array of positive-class probabilities (binary), with integer labels. :func:`to_netcal` turns
tensors (probabilities or logits, as the caller says; no guessing from the value range) into
that form; :func:`netcal_metrics` returns netcal's ECE, MCE and ACE (all three over
equal-width bins, netcal's default); :func:`netcal_reliability_diagram` draws netcal's own
diagram for those who prefer its style. netcal is imported inside these functions only, so
``import lightning_losses`` stays free of it.

For multiclass inputs (``C > 2``) netcal is handed the top-label pair (maximum probability,
whether the argmax is right). That is what netcal computes from ``[N, C]`` itself, but netcal
decides "binary" from the labels alone: a ``C``-class set whose labels take two values or fewer
would otherwise be read as binary and rejected.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["netcal_metrics", "netcal_reliability_diagram", "to_netcal"]

_INPUT_FORMATS = ("probs", "logits")


def _to_tensor(x: Any) -> Tensor:
    return x.detach().cpu() if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))


def to_netcal(
    preds: Tensor | np.ndarray,
    target: Tensor | np.ndarray,
    *,
    input_format: str = "probs",
    ignore_index: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Convert predictions and labels to the NumPy arrays netcal expects.

    Multiclass: ``preds`` is ``[N, C]`` (``C >= 2``) and becomes ``softmax(preds)`` for logits;
    binary: ``preds`` is ``[N]`` (the positive class) and becomes ``sigmoid(preds)`` for logits.
    The conversion is done in float64.

    Args:
        preds: probabilities or logits, ``[N, C]`` or ``[N]``.
        target: integer labels ``[N]`` in ``[0, C)``, or in ``{0, 1}`` for binary ``preds``.
        input_format: ``"probs"`` or ``"logits"``.
        ignore_index: the samples whose label equals it are dropped first (netcal has no such
            option); ``None`` keeps all.

    Returns:
        ``(confidences, labels)``: float64 probabilities of the shape of ``preds`` and int64
        labels ``[N]`` (the kept samples).

    Raises:
        ValueError: for an unknown ``input_format``, bad shapes, labels out of range,
            non-finite values, or ``"probs"`` that are not probabilities.

    Example:
        >>> probs, labels = to_netcal(torch.tensor([[0.0, 0.0]]), torch.tensor([1]),
        ...                           input_format="logits")
        >>> probs, labels
        (array([[0.5, 0.5]]), array([1]))
    """
    if input_format not in _INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {_INPUT_FORMATS}, got {input_format!r}")
    preds_t = _to_tensor(preds).double()
    target_t = _to_tensor(target)
    if preds_t.ndim not in (1, 2) or (preds_t.ndim == 2 and preds_t.shape[1] < 2):
        raise ValueError(
            "preds must be [N, C] with C >= 2 (multiclass) or [N] (binary), "
            f"got {tuple(preds_t.shape)}"
        )
    if target_t.ndim != 1 or target_t.shape[0] != preds_t.shape[0]:
        raise ValueError(
            f"target must be [N] with N = {preds_t.shape[0]}, got {tuple(target_t.shape)}"
        )
    if ignore_index is not None:
        from lightning_losses.calibration.functional import check_ignore_index

        check_ignore_index(ignore_index)
        kept = target_t != ignore_index
        preds_t, target_t = preds_t[kept], target_t[kept]
    if preds_t.shape[0] == 0:
        raise ValueError("need at least one sample")
    if target_t.is_floating_point() and not torch.equal(target_t, target_t.round()):
        raise ValueError("target must hold integer class labels")
    labels = target_t.long()
    n_classes = preds_t.shape[1] if preds_t.ndim == 2 else 2
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(f"target labels must lie in [0, {n_classes}), got {labels.unique()}")
    if not torch.isfinite(preds_t).all():
        raise ValueError("preds contains non-finite values")
    probs = _probabilities(preds_t, input_format)
    return np.ascontiguousarray(probs.numpy()), np.ascontiguousarray(labels.numpy())


def _probabilities(preds: Tensor, input_format: str) -> Tensor:
    """Softmax (``[N, C]``) or sigmoid (``[N]``) of logits; probabilities checked as given."""
    if input_format == "logits":
        return preds.softmax(dim=1) if preds.ndim == 2 else preds.sigmoid()
    if preds.min() < 0 or preds.max() > 1:
        raise ValueError("input_format='probs' but preds lie outside [0, 1]")
    if preds.ndim == 2 and not torch.allclose(
        preds.sum(dim=1), torch.ones((), dtype=preds.dtype), atol=1e-2, rtol=0
    ):
        raise ValueError("input_format='probs' but the rows of preds do not sum to 1")
    return preds


def _netcal_input(
    preds: Tensor | np.ndarray,
    target: Tensor | np.ndarray,
    input_format: str,
    ignore_index: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`to_netcal`, reduced to the top-label pair for ``C > 2`` (see the module notes)."""
    probs, labels = to_netcal(preds, target, input_format=input_format, ignore_index=ignore_index)
    if probs.ndim == 2 and probs.shape[1] > 2:
        correct = (probs.argmax(axis=1) == labels).astype(np.int64)
        return probs.max(axis=1), correct
    return probs, labels


def netcal_metrics(
    preds: Tensor | np.ndarray,
    target: Tensor | np.ndarray,
    *,
    n_bins: int = 15,
    input_format: str = "probs",
    ignore_index: int | None = None,
) -> dict[str, float]:
    """Expected, maximum and adaptive calibration errors computed by netcal.

    All three use ``n_bins`` equal-width bins ``[k/B, (k+1)/B)`` (netcal's ``ECE``, ``MCE`` and
    ``ACE`` classes with their default ``equal_intervals=True``):
    ``ECE = sum_b (n_b / N) |acc(b) - conf(b)|``, ``MCE = max_b |acc(b) - conf(b)|`` and
    ``ACE = mean_b |acc(b) - conf(b)|``, the unweighted mean over the non-empty bins (Neumann,
    Zisserman and Vedaldi, "Relaxed Softmax: Efficient Confidence Auto-Calibration for Safe
    Pedestrian Detection", NeurIPS-W 2018). netcal's ACE is thus *not* an adaptive (equal-mass)
    error despite its name: it is :func:`~lightning_losses.calibration.calibration_error` with
    ``norm="mean"``, up to the bin edges' convention; the equal-mass error is
    :func:`~lightning_losses.calibration.adaptive_calibration_error`. Multiclass inputs are
    measured on the top label; a binary ``[N]`` input is measured on the positive class, as
    netcal does.

    Args:
        preds: probabilities or logits, ``[N, C]`` or ``[N]``.
        target: integer labels ``[N]``.
        n_bins: number of bins.
        input_format: ``"probs"`` or ``"logits"``.
        ignore_index: the samples whose label equals it are left out; ``None`` keeps all.

    Returns:
        ``{"ece": ..., "mce": ..., "ace": ...}`` as Python floats.
    """
    from netcal.metrics import ACE, ECE, MCE

    x, y = _netcal_input(preds, target, input_format, ignore_index)
    metrics = {"ece": ECE, "mce": MCE, "ace": ACE}
    return {name: float(cls(bins=n_bins).measure(x, y)) for name, cls in metrics.items()}


def netcal_reliability_diagram(
    preds: Tensor | np.ndarray,
    target: Tensor | np.ndarray,
    *,
    path: str | os.PathLike[str],
    n_bins: int = 15,
    input_format: str = "probs",
    title_suffix: str | None = None,
    ignore_index: int | None = None,
) -> Figure:
    """Draw netcal's ``ReliabilityDiagram`` and save it to ``path``.

    netcal draws on the figure it is given, so it gets a :class:`matplotlib.figure.Figure`
    with an Agg canvas (7 x 6 inches, saved at 100 dpi): nothing is registered with ``pyplot``
    and no window opens, whatever the user's backend.

    Args:
        preds: probabilities or logits, ``[N, C]`` or ``[N]``.
        target: integer labels ``[N]``.
        path: where to write the image (PNG unless the suffix says otherwise).
        n_bins: number of equal-width bins.
        input_format: ``"probs"`` or ``"logits"``.
        title_suffix: appended to netcal's panel titles.
        ignore_index: the samples whose label equals it are left out; ``None`` keeps all.

    Returns:
        The saved figure.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from netcal.presentation import ReliabilityDiagram

    x, y = _netcal_input(preds, target, input_format, ignore_index)
    fig = Figure(figsize=(7.0, 6.0), dpi=100)
    FigureCanvasAgg(fig)
    ReliabilityDiagram(bins=n_bins, metric="ECE").plot(x, y, fig=fig, title_suffix=title_suffix)
    fig.savefig(os.fspath(path), dpi=100)
    return fig
