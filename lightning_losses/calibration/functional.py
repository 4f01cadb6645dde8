"""Calibration metrics as pure functions: binned calibration errors, Brier score, NLL, accuracy.

Every function takes ``preds`` and ``target`` in one of three forms, told apart by shapes and
dtypes only (never by the values):

- ``"multiclass"``: ``preds`` ``[N, C]``, integer class indices ``target`` ``[N]``; or dense
  ``preds`` ``[N, C, *]`` with ``target`` ``[N, *]`` (segmentation masks ``[N, H, W]``,
  sequences ``[N, L]``), one multiclass decision per position: every function and ``Metric``
  gives the value of the ``[N * prod(*), C]`` rows ``preds.movedim(1, -1).reshape(-1, C)``
  with ``target.reshape(-1)``, flattened for you before any check;
- ``"binary"``: ``preds`` ``[N]`` (positive-class probabilities or logits), ``target`` ``[N]``
  in {0, 1} (bool, integer or float);
- ``"multilabel"``: ``preds`` ``[N, K]``, ``target`` ``[N, K]`` in {0, 1}; every label is a
  binary problem and the ``N * K`` decisions are pooled (flattened).

``input_format`` says whether ``preds`` are probabilities (``"probs"``, the default) or logits
(``"logits"``: softmax over classes for multiclass, sigmoid otherwise). Nothing is guessed
from value ranges; with ``validate_args=True`` probabilities outside [0, 1], multiclass rows
that do not sum to 1 (within ``max(1e-3, 4 eps)`` of the dtype: 1e-3 for float32 and float64,
3.9e-3 for float16, 0.031 for bfloat16; a float32 or float64 row whose values are all exactly
bfloat16 or float16 numbers, such as a half-precision softmax cast up, gets the tolerance of
that half dtype), NaN and infinite logits and out-of-range targets raise instead. ``preds`` and
``target`` must be on one device.

``ignore_index`` (default ``None``: every sample counts), as in torchmetrics: the entries of
``target`` equal to it are dropped before anything is computed or checked, and do not count in
``N``. Multiclass and binary: the sample (row) goes; multi-label: only that one (sample, label)
decision. ``target`` must then hold hard labels: integers, or floats that are 0 or 1 where not
ignored (soft targets raise a ``ValueError`` naming ``ignore_index``). When every entry is
ignored the result is that of an empty input: NaN for every score here. Dense inputs take
``ignore_index`` as well (ignored pixels or padding positions drop out), e.g. the ``[B, V, L]``
logits of a language model with ``[B, L]`` targets padded with -100::

    calibration_error(logits, target, input_format="logits", ignore_index=-100)

(the class dimension is the second: move a class-last ``[B, L, V]`` with ``logits.movedim(-1,
1)``, or flatten it to ``[B * L, V]``). Without ``ignore_index`` nothing is masked or copied,
except the one copy that moves the class dimension of dense inputs last.

Equal-width binning uses ``B`` bins ``(k/B, (k+1)/B]``, a confidence of 0 in the first: the
bin of ``c`` is ``clamp(ceil(c·B) - 1, 0, B-1)``, with the edges ``k/B`` rounded to the
confidences' own dtype, so that a confidence equal to ``k/B`` (as written in that dtype) lands
in bin ``k - 1``. Per-bin sums (count, sum of confidences, sum of correct) are float64.
"""

from __future__ import annotations

from functools import partial
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.calibration._dense import flatten_dense, is_dense
from lightning_losses.functional import evaluation as FE
from lightning_losses.functional.checks import (
    check_choice,
    check_ignore_index,
    check_int,
    check_same_device,
    check_sums_to_one,
    first_non_finite,
)
from lightning_losses.loss_ranges import N_BINS

Task = Literal["binary", "multiclass", "multilabel"]
Norm = Literal["l1", "max", "l2", "mean"]
InputFormat = Literal["probs", "logits"]

TASKS = ("binary", "multiclass", "multilabel")
NORMS = ("l1", "max", "l2", "mean")
INPUT_FORMATS = ("probs", "logits")

__all__ = [
    "accuracy",
    "adaptive_calibration_error",
    "binned_statistics",
    "brier_score",
    "calibration_error",
    "calibration_error_from_bins",
    "classwise_binned_statistics",
    "classwise_calibration_error",
    "confidence_and_correct",
    "equal_mass_binned_statistics",
    "mean_confidence",
    "negative_log_likelihood",
    "resolve_task",
]


# --- argument checks -------------------------------------------------------------------------


#: The number of bins, an int >= 1: the checks module's :func:`~lightning_losses.functional.
#: checks.check_int` with the name and minimum that every binned metric shares.
check_n_bins = partial(check_int, "n_bins", **N_BINS)


def resolve_task(preds: Tensor, target: Tensor, task: str | None = None) -> Task:
    """Return the task of ``(preds, target)`` from their shapes and dtypes, checking both.

    ``preds [N]`` is binary; ``preds [N, C]`` with ``target [N]`` is multiclass, and so is
    ``preds [N, C, *]`` with ``target [N, *]`` (dense, see :mod:`._dense`); ``preds [N, K]``
    with ``target [N, K]`` is multi-label. An explicit ``task`` must agree with the shapes.
    Both tensors must be on one device.

    Raises:
        TypeError: ``preds`` is not a floating tensor, ``target`` is not a tensor, or a
            multiclass ``target`` does not hold integers.
        ValueError: unknown ``task``, shapes that fit no task (or not the given one), or
            tensors on two devices.

    Example:
        >>> resolve_task(torch.rand(4, 3), torch.tensor([0, 2, 1, 0]))
        'multiclass'
        >>> resolve_task(torch.rand(4, 3), torch.ones(4, 3))
        'multilabel'
        >>> resolve_task(torch.rand(4), torch.tensor([0, 1, 1, 0]))
        'binary'
        >>> resolve_task(torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 8, dtype=torch.long))
        'multiclass'
    """
    if task is not None:
        check_choice("task", task, TASKS)
    if not isinstance(preds, Tensor):
        raise TypeError(f"preds must be a torch.Tensor; got {type(preds).__name__}")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if not preds.is_floating_point():
        raise TypeError(
            f"preds must be a floating-point tensor of probabilities or logits; got {preds.dtype}"
        )
    shapes = f"preds {list(preds.shape)} and target {list(target.shape)}"
    found = _task_of_shapes(preds, target, shapes)
    if task is not None and task != found:
        raise ValueError(f"task={task!r} does not fit {shapes}, which have the {found} shapes")
    if found == "multiclass" and (
        target.is_floating_point() or target.is_complex() or target.dtype == torch.bool
    ):
        raise TypeError(
            f"target must hold class indices (an integer tensor [N]) for multiclass preds "
            f"[N, C]; got dtype {target.dtype}"
        )
    if target.is_complex():
        raise TypeError(f"target must be a bool, integer or float tensor; got {target.dtype}")
    check_same_device("target", target, "preds", preds)
    return found


def _task_of_shapes(preds: Tensor, target: Tensor, shapes: str) -> Task:
    """The task whose shapes ``preds`` and ``target`` have (``shapes`` says them for errors)."""
    if preds.dim() == 1 and target.shape == preds.shape:
        return "binary"
    if preds.dim() == 2 and target.shape == preds.shape:
        return "multilabel"
    two_d = preds.dim() == 2 and target.dim() == 1 and target.shape[0] == preds.shape[0]
    if not (two_d or is_dense(preds, target)):
        class_last = preds.dim() >= 3 and target.shape == preds.shape[:-1]
        hint = " (class-last preds [N, *, C]: pass preds.movedim(-1, 1))" if class_last else ""
        raise ValueError(
            f"cannot match {shapes}: expected preds [N] with target [N] (binary), preds [N, C] "
            "with target [N] (multiclass), preds [N, C, *] with target [N, *] (dense "
            f"multiclass) or preds [N, K] with target [N, K] (multilabel){hint}"
        )
    if preds.shape[1] == 1:
        raise ValueError(
            f"preds [N, 1] with target [N] ({shapes}) has one class: for a binary problem pass "
            "preds as [N] (one probability or logit per sample, e.g. preds.squeeze(1)), or "
            "[N, 2] for the top label of two classes"
        )
    return "multiclass"


def _check_target_values(preds: Tensor, target: Tensor, task: str) -> None:
    """Multiclass targets in ``[0, C)``; binary and multi-label targets 0 or 1."""
    if target.numel() == 0:
        return
    if task == "multiclass":
        num_classes = preds.shape[1]
        low, high = torch.aminmax(target)
        if low < 0 or high >= num_classes:
            found = int(low) if low < 0 else int(high)
            raise ValueError(
                f"target values must lie in [0, {num_classes - 1}] for preds with "
                f"C={num_classes} classes; found {found}"
            )
    elif target.dtype != torch.bool:
        bad = (target != 0) & (target != 1)
        if bool(bad.any()):
            raise ValueError(
                f"target values must be 0 or 1 for {task} inputs; found "
                f"{target[bad].flatten()[0].item()}"
            )


def _check_preds_values(
    preds: Tensor,
    task: str,
    input_format: str,
    *,
    low: Tensor | None = None,
    high: Tensor | None = None,
    row_sums: Tensor | None = None,
) -> None:
    """Probabilities in [0, 1] whose multiclass rows sum to 1; logits finite.

    ``low``, ``high`` (the minimum and maximum of ``preds``) and ``row_sums`` (multiclass
    probabilities) save passes when the caller has them; the missing ones are computed here.
    Multiclass rows must sum to 1 within :func:`~lightning_losses.functional.checks.
    sum_tolerance` of the dtype (1e-3 for float32 and float64), or that of bfloat16 or float16
    for rows whose values are exactly numbers of that dtype (see :func:`~lightning_losses.
    functional.checks.sum_tolerances`).
    """
    if preds.numel() == 0:
        return
    if low is None or high is None:
        low, high = torch.aminmax(preds)
    if input_format == "logits":
        if not bool(torch.isfinite(low) & torch.isfinite(high)):
            value, index = first_non_finite(preds)
            raise ValueError(
                f"preds must be finite logits (input_format='logits'); found {value} at "
                f"preds{index}"
            )
        return
    if torch.isnan(low) or torch.isnan(high):
        raise ValueError("preds must be probabilities in [0, 1] (input_format='probs'); found nan")
    if low < 0 or high > 1:
        bad = float(low) if low < 0 else float(high)
        raise ValueError(
            f"preds must be probabilities in [0, 1] with input_format='probs'; found {bad} "
            "(pass input_format='logits' for logits)"
        )
    if task == "multiclass":
        if row_sums is None:
            row_sums = preds.sum(dim=1, dtype=_work_dtype(preds.dtype))
        check_sums_to_one(
            "preds",
            row_sums,
            preds.dtype,
            over="the classes of each row",
            hint=" (input_format='probs'; pass input_format='logits' for logits)",
            values=preds,
        )


def _check_values(preds: Tensor, target: Tensor, task: str, input_format: str) -> None:
    """Check target values and ``preds`` (probabilities or logits) as described above."""
    _check_target_values(preds, target, task)
    _check_preds_values(preds, task, input_format)


def _kept(target: Tensor, ignore_index: int) -> Tensor:
    """Mask of the ``target`` entries that are not ``ignore_index`` (hard labels only).

    A floating ``target`` must be 0 or 1 wherever it is kept: a soft target has no entries to
    ignore, so fractional values raise (whatever ``validate_args``) rather than being mixed with
    a padding value.
    """
    keep = target != ignore_index
    if target.is_floating_point():
        soft = keep & (target != 0) & (target != 1)
        if bool(soft.any()):
            raise ValueError(
                f"ignore_index={ignore_index} needs hard labels (integers, or floats 0 and 1 "
                f"where not ignored); target holds the soft value "
                f"{target[soft].flatten()[0].item()}: drop those entries instead"
            )
    return keep


def _drop_ignored(preds: Tensor, target: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """``preds`` and ``target`` without the entries whose target is ``ignore_index``.

    Rows for ``[N]`` targets; for multi-label ``[N, K]`` targets single (sample, label) pairs,
    so both come back flattened to 1-D (every multi-label computation pools the labels).
    Nothing is copied when nothing is ignored.
    """
    keep = _kept(target, ignore_index)
    if bool(keep.all()):
        return preds, target
    return preds[keep], target[keep]


def _prepare(
    preds: Tensor,
    target: Tensor,
    task: str | None,
    input_format: str,
    validate_args: bool,
    *,
    values_checked_later: bool = False,
    ignore_index: int | None = None,
) -> tuple[Tensor, Tensor, Task]:
    """Check arguments; return detached ``preds``, ``target`` and the resolved task.

    Dense ``[N, C, *]`` preds with ``[N, *]`` targets come back as ``[M, C]`` rows and ``[M]``
    targets (:func:`._dense.flatten_dense`). With ``ignore_index`` the ignored entries are
    dropped first (see :func:`_drop_ignored`; dense inputs in the same copy as the
    flattening), so the value checks see only the kept ones.
    """
    check_choice("input_format", input_format, INPUT_FORMATS)
    if ignore_index is not None:
        check_ignore_index(ignore_index)
    task = resolve_task(preds, target, task)
    preds, target = preds.detach(), target.detach()
    if is_dense(preds, target):
        keep = None if ignore_index is None else _kept(target, ignore_index)
        preds, target = flatten_dense(preds, target, None if keep is None or keep.all() else keep)
    elif ignore_index is not None:
        preds, target = _drop_ignored(preds, target, ignore_index)
    if validate_args and not values_checked_later:
        _check_values(preds, target, task, input_format)
    return preds, target, task


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _binary_probs(preds: Tensor, input_format: str) -> Tensor:
    """Positive-class probabilities (float64 sigmoid of logits, else as given)."""
    if input_format == "logits":
        return torch.sigmoid(preds.to(torch.float64))
    return preds


def _class_probs(preds: Tensor, input_format: str) -> Tensor:
    """``[N, C]`` class probabilities (float64 softmax of logits, else as given)."""
    if input_format == "logits":
        return torch.softmax(preds.to(torch.float64), dim=1)
    return preds


# --- per-sample confidence and correctness -----------------------------------------------------

#: Elements per chunk of :func:`_multiclass_top_label` on the CPU (4 MiB of float32): the row
#: maximum reads a chunk into the cache, where the checks read it again.
CPU_CHUNK_ELEMENTS = 1 << 20


class TopLabel(NamedTuple):
    """What :func:`_multiclass_top_label` finds in one walk over ``[N, C]`` preds."""

    maxima: Tensor
    confidence: Tensor
    correct: Tensor
    minimum: Tensor | None
    sums: Tensor | None


def _multiclass_top_label(preds: Tensor, target: Tensor, input_format: str) -> TopLabel:
    """Top-label confidence and correctness of ``[N, C]`` preds, with the checks' statistics.

    Returns :class:`TopLabel`: ``maxima`` the row maxima; ``confidence`` the row maxima of
    probabilities (their dtype) or ``exp(max - logsumexp)`` of logits (the log-sum-exp in
    float32, float64 for float64 logits, row by row; the difference and exponential in
    float64, so the result does not depend on how rows are batched; no ``[N, C]`` softmax);
    ``correct`` (bool) whether the first column holding the
    row maximum, ``argmax`` as ``torch.max`` picks it, is ``target`` (a target outside ``[0,
    C)`` never is); ``minimum`` of all of ``preds`` (``None`` for no rows); ``sums`` the row
    sums of probabilities (float32 or float64; ``None`` for logits).

    ``torch.max(dim=1)``, which returns indices, is not vectorised over short rows on the CPU;
    ``torch.amax`` is, about five times faster. So the maxima come from ``amax``, the target's
    entry from one gather, and ``correct = (p_t == max)``, which is ``argmax == t`` unless
    another column ties the maximum. A row can hold its maximum twice only if its top
    probability is at most 1/2: ``2 max <= sum`` for probabilities ``>= 0``, ``max - logsumexp
    <= log 1/2`` for logits. Only the rows where ``p_t`` is the maximum and that bound holds
    (with a slack for rounding, so that no tied row is missed) are looked at again: with the
    target's entry set to ``-inf``, a maximum still equal to the row's marks a tie, and
    ``argmax`` decides. On the CPU the rows are walked in chunks of about
    :data:`CPU_CHUNK_ELEMENTS`, so that the minimum, the sums and the log-sum-exp read each
    chunk from the cache. Elsewhere one chunk.
    """
    rows, classes = preds.shape
    logits = input_format == "logits"
    step = rows if preds.device.type != "cpu" else max(1, CPU_CHUNK_ELEMENTS // max(classes, 1))
    work = _work_dtype(preds.dtype)
    values = torch.empty(rows, dtype=preds.dtype, device=preds.device)
    reduced = torch.empty(rows, dtype=work, device=preds.device)  # row sums or log-sum-exp
    minima = []
    for start in range(0, rows, max(step, 1)):
        stop = min(start + step, rows)
        chunk = preds[start:stop]
        torch.amax(chunk, dim=1, out=values[start:stop])
        minima.append(chunk.amin())
        if logits:
            torch.logsumexp(chunk.to(work), dim=1, out=reduced[start:stop])
        else:
            torch.sum(chunk, dim=1, dtype=work, out=reduced[start:stop])
    minimum = torch.stack(minima).amin() if minima else None
    target = target.long()
    in_range = (target >= 0) & (target < classes)
    safe = torch.where(in_range, target, 0)
    correct = (preds.gather(1, safe[:, None])[:, 0] == values) & in_range
    slack = max(1e-3, 4 * classes * torch.finfo(work).eps)
    if logits:
        confidence = torch.exp(values.to(torch.float64) - reduced.to(torch.float64))
        candidates = correct & (confidence <= 0.5 * (1 + slack))
    elif minimum is not None and bool(minimum >= 0):
        confidence = values
        candidates = correct & (2 * values.to(work) <= reduced * (1 + slack))
    else:  # negative entries (unchecked input): no bound
        confidence, candidates = values, correct
    look = candidates.nonzero()[:, 0]
    if look.numel():
        others = preds[look].scatter_(1, safe[look, None], float("-inf"))
        tied = look[others.amax(dim=1) == values[look]]
        if tied.numel():
            correct[tied] = preds[tied].argmax(dim=1) == target[tied]
    return TopLabel(values, confidence, correct, minimum, None if logits else reduced)


def confidence_and_correct(
    preds: Tensor,
    target: Tensor,
    *,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-sample confidence and correctness, the inputs of every binned calibration error.

    - multiclass (top label): ``confidence = max_c p_c``, ``correct = 1[argmax_c p_c = y]``;
      one pass over ``[N, C]`` (see :func:`_multiclass_top_label`); from logits
      ``confidence = exp(max_c x_c - logsumexp_c x_c)``, no ``[N, C]`` softmax is made.
    - binary (positive class): ``confidence = p``, ``correct = y``, as netcal and torchmetrics'
      ``binary_calibration_error`` do; feed ``[N, 2]`` multiclass preds for the top label.
    - multilabel: each label as binary, flattened to ``N * K`` pairs.

    Args:
        preds: ``[N, C]`` (or dense ``[N, C, *]``), ``[N]`` or ``[N, K]`` probabilities or
            logits (see the module doc).
        target: ``[N]`` (dense: ``[N, *]``) class indices, ``[N]`` or ``[N, K]`` labels in
            {0, 1}.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``; ``None`` infers it from the
            shapes.
        validate_args: check target values, that probabilities lie in [0, 1] (and, for
            multiclass, that each row sums to 1 within 1e-3 for float32 and float64, 4 eps of
            half dtypes, and of bfloat16 or float16 for rows holding only such numbers: half
            precision cast up) and that logits are finite.
        ignore_index: drop the samples (multi-label: the single labels) whose target equals it
            before anything else; ``None`` keeps all (see the module doc).

    Returns:
        ``confidence`` and ``correct``, both 1-D, one entry per kept decision.
        ``confidence`` keeps the dtype of probabilities (the bin edges follow it, see
        :func:`binned_statistics`) and is float64 when computed from logits; ``correct`` is
        float64.

    Example:
        >>> preds = torch.tensor([[0.7, 0.2, 0.1], [0.3, 0.6, 0.1]])
        >>> conf, correct = confidence_and_correct(preds, torch.tensor([0, 0]))
        >>> conf, correct
        (tensor([0.7000, 0.6000]), tensor([1., 0.], dtype=torch.float64))
        >>> confidence_and_correct(preds, torch.tensor([0, -100]), ignore_index=-100)[0]
        tensor([0.7000])
    """
    preds, target, task = _prepare(
        preds,
        target,
        task,
        input_format,
        validate_args,
        values_checked_later=True,
        ignore_index=ignore_index,
    )
    if task == "multiclass":
        top = _multiclass_top_label(preds, target, input_format)
        if validate_args:
            _check_target_values(preds, target, task)
            high = top.maxima.max() if top.maxima.numel() else None
            _check_preds_values(
                preds, task, input_format, low=top.minimum, high=high, row_sums=top.sums
            )
        return top.confidence, top.correct.to(torch.float64)
    if validate_args:
        _check_values(preds, target, task, input_format)
    probs = _binary_probs(preds, input_format).reshape(-1)
    return probs, target.reshape(-1).to(torch.float64)


# --- binning ---------------------------------------------------------------------------------


def _bin_index(confidence: Tensor, n_bins: int) -> Tensor:
    """Equal-width bin of each confidence (int32): the number of edges ``e_k`` below it.

    The edges are ``e_k = k/B`` (``1 <= k < B``) rounded to the confidences' dtype, so the bins
    are ``(e_k, e_{k+1}]`` with 0 in the first, i.e. ``clamp(ceil(c·B) - 1, 0, B-1)``, and a
    confidence equal to ``k/B`` as written in its dtype falls in bin ``k - 1``.

    float64 confidences, and bins narrower than twice the dtype's epsilon, are located with
    ``torch.bucketize``. Otherwise (float32 up to 4M bins, float16 512, bfloat16 64) a faster
    exact form: ``k = floor(c·B)`` is exact in float64 (a 24-bit significand times ``B``), so
    ``k/B <= c < (k+1)/B``; each ``e_j`` lies within ``eps/4 < 1/(2B)`` of ``j/B`` and is the
    nearest dtype value to it (no dtype value lies strictly between them), hence every ``e_j``
    with ``j < k`` is below ``c``, none with ``j > k`` is, and the bin is ``k - [c <= e_k]``.
    """
    dtype = confidence.dtype
    if dtype == torch.float64 or n_bins * torch.finfo(dtype).eps > 0.5:
        edges = torch.arange(1, n_bins, dtype=torch.float64, device=confidence.device) / n_bins
        return torch.bucketize(confidence, edges.to(dtype), right=False, out_int32=True)
    # .to(float64) copies (float64 took the branch above), so in place is safe and spares two
    # [N] float64 buffers
    scaled = confidence.to(torch.float64).mul_(n_bins).nan_to_num_(nan=n_bins - 1.0)
    k = scaled.floor_().clamp_(0, n_bins - 1)
    on_lower_edge = (confidence <= k.div(n_bins).to(dtype)) & (k > 0)
    return k.to(torch.int32).sub_(on_lower_edge.to(torch.int32))


def binned_statistics(
    confidence: Tensor, correct: Tensor, n_bins: int = 15
) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-width bin sums: ``(count, conf_sum, correct_sum)``, float64 tensors ``[n_bins]``.

    ``count_b = #{i : c_i in bin b}``, ``conf_sum_b = sum_{i in b} c_i``, ``correct_sum_b =
    sum_{i in b} a_i``, bins ``(k/B, (k+1)/B]`` with 0 in the first (see :func:`_bin_index`).
    These three arrays are the whole state of the equal-width metrics and of a reliability
    diagram: mean confidence ``conf_sum / count`` and accuracy ``correct_sum / count`` per bin.

    Args:
        confidence: 1-D confidences in [0, 1] (any floating dtype).
        correct: 1-D correctness (0/1, or a frequency), same length.
        n_bins: number of bins ``B >= 1``.

    Example:
        >>> count, conf_sum, correct_sum = binned_statistics(
        ...     torch.tensor([0.0, 0.25, 0.3, 1.0]), torch.tensor([0.0, 1.0, 1.0, 1.0]), 4
        ... )
        >>> count  # 0.25 = 1/4 closes the first bin (0, 1/4]
        tensor([2., 1., 0., 1.], dtype=torch.float64)
        >>> conf_sum
        tensor([0.2500, 0.3000, 0.0000, 1.0000], dtype=torch.float64)
        >>> correct_sum
        tensor([1., 1., 0., 1.], dtype=torch.float64)
    """
    check_n_bins(n_bins)
    if not isinstance(confidence, Tensor) or not confidence.is_floating_point():
        raise TypeError("confidence must be a floating-point tensor of values in [0, 1]")
    confidence = confidence.detach().reshape(-1)
    correct = correct.detach().reshape(-1)
    if confidence.shape != correct.shape:
        raise ValueError(
            f"confidence and correct must have the same length; got {confidence.numel()} and "
            f"{correct.numel()}"
        )
    index = _bin_index(confidence, n_bins)
    return _bin_sums(index, confidence, correct, n_bins)


def _bin_sums(
    index: Tensor, confidence: Tensor, correct: Tensor, size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Count (``bincount``) and two float64 ``index_add_`` sums into ``size`` bins."""
    count = torch.bincount(index, minlength=size).to(torch.float64)
    conf_sum = count.new_zeros(size).index_add_(0, index, confidence.to(torch.float64))
    correct_sum = count.new_zeros(size).index_add_(0, index, correct.to(torch.float64))
    return count, conf_sum, correct_sum


def _sorted_pairs(confidence: Tensor, correct: Tensor) -> tuple[Tensor, Tensor]:
    """Flat float64 pairs sorted by confidence, ties by correctness: order-free sums follow."""
    confidence = confidence.detach().reshape(-1).to(torch.float64)
    correct = correct.detach().reshape(-1).to(torch.float64)
    if confidence.shape != correct.shape:
        raise ValueError(
            f"confidence and correct must have the same length; got {confidence.numel()} and "
            f"{correct.numel()}"
        )
    by_correct = torch.argsort(correct, stable=True)
    order = by_correct[torch.argsort(confidence[by_correct], stable=True)]
    return confidence[order], correct[order]


def equal_mass_binned_statistics(
    confidence: Tensor, correct: Tensor, n_bins: int = 15
) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-mass (adaptive) bin sums ``(count, conf_sum, correct_sum)``, float64 ``[n_bins]``.

    The ``N`` pairs are sorted by confidence (ties by correctness, so the result depends only on
    the multiset of pairs, not on their order) and bin ``b`` takes sorted positions
    ``[floor(b·N/B), floor((b+1)·N/B))``: counts differ by at most one; with ``N < B`` some bins
    are empty. Source: Nixon et al., "Measuring Calibration in Deep Learning", CVPR-W 2019.

    Example:
        >>> count, conf_sum, correct_sum = equal_mass_binned_statistics(
        ...     torch.tensor([0.9, 0.1, 0.8, 0.2]), torch.tensor([1.0, 0.0, 0.0, 1.0]), 2
        ... )
        >>> count, correct_sum
        (tensor([2., 2.], dtype=torch.float64), tensor([1., 1.], dtype=torch.float64))
    """
    check_n_bins(n_bins)
    confidence, correct = _sorted_pairs(confidence, correct)
    n = confidence.numel()
    positions = torch.arange(n, device=confidence.device)
    index = ((positions + 1) * n_bins - 1).div(max(n, 1), rounding_mode="floor")
    return _bin_sums(index, confidence, correct, n_bins)


def equal_mass_edges(confidence: Tensor, n_bins: int = 15) -> Tensor:
    """Bin edges ``[n_bins + 1]`` (float64) that split the confidences into equal-mass bins.

    With the ``N`` confidences sorted, ``c_(0) <= ... <= c_(N-1)``, edge ``k`` interpolates
    them linearly at position ``x_k = k N / B`` (``x_B = N``), holding the end values beyond
    them: ``e_k = c_(j) + (x_k - j)(c_(j+1) - c_(j))``, ``j = floor(x_k)``, and ``e_k =
    c_(N-1)`` for ``x_k >= N - 1``. This is ``numpy.interp(numpy.linspace(0, N, B + 1),
    numpy.arange(N), numpy.sort(c))``, the adaptive bins of Mukhoti et al.'s adaECE used by
    AdaFocal, computed in the same floating-point operations (same values to the last bit).
    ``e_0`` is the smallest confidence and ``e_B`` the largest.

    Example:
        >>> equal_mass_edges(torch.tensor([0.9, 0.3, 0.6, 0.8]), 2)
        tensor([0.3000, 0.8000, 0.9000], dtype=torch.float64)
    """
    check_n_bins(n_bins)
    values = torch.sort(confidence.detach().reshape(-1).to(torch.float64)).values
    n = values.numel()
    if n == 0:
        raise ValueError("equal_mass_edges needs at least one confidence; got none")
    positions = torch.arange(n_bins + 1, dtype=torch.float64, device=values.device)
    positions = positions * (n / n_bins)  # numpy.linspace: k * step, the last one exactly N
    positions[-1] = float(n)
    low = positions.floor().clamp(max=n - 1)
    j = low.long()
    high = (j + 1).clamp(max=n - 1)
    interpolated = (values[high] - values[j]) * (positions - low) + values[j]
    at_point = (positions == low) | (j == n - 1)
    return torch.where(at_point, values[j], interpolated)


def edge_binned_statistics(
    confidence: Tensor, correct: Tensor, edges: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Bin sums ``(count, conf_sum, correct_sum)`` (float64, ``[B]``) over given edges ``[B+1]``.

    Bin ``k`` is ``(e_k, e_{k+1}]`` and the first bin also holds ``e_0`` (and anything
    below it), so with the edges of :func:`equal_mass_edges` every sample is in a bin. (The
    adaECE code AdaFocal's reference uses leaves the smallest confidence out of every bin.)
    The pairs are summed in sorted order (by confidence, ties by correctness), so the sums
    depend only on the multiset of pairs: the same on one process as on several.

    Example:
        >>> conf = torch.tensor([0.9, 0.3, 0.6, 0.8])
        >>> edges = equal_mass_edges(conf, 2)
        >>> edge_binned_statistics(conf, torch.tensor([1.0, 0.0, 1.0, 0.0]), edges)[2]
        tensor([1., 1.], dtype=torch.float64)
    """
    confidence, correct = _sorted_pairs(confidence, correct)
    edges = edges.detach().to(device=confidence.device, dtype=torch.float64)
    index = torch.bucketize(confidence, edges[1:-1], right=False)
    return _bin_sums(index, confidence, correct, edges.numel() - 1)


def calibration_error_from_bins(
    count: Tensor, conf_sum: Tensor, correct_sum: Tensor, norm: Norm = "l1"
) -> Tensor:
    """Calibration error from bin sums (the last dimension indexes the bins).

    With ``N = sum_b count_b``, ``conf_b = conf_sum_b / count_b`` and ``acc_b = correct_sum_b /
    count_b`` over the non-empty bins:

    - ``"l1"`` (ECE): ``sum_b |conf_sum_b - correct_sum_b| / N = sum_b count_b/N |conf_b - acc_b|``
    - ``"max"`` (MCE): ``max_b |conf_b - acc_b|``
    - ``"l2"`` (RMSCE): ``sqrt(sum_b count_b (conf_b - acc_b)^2 / N)``
    - ``"mean"``: ``mean_b |conf_b - acc_b|``, every non-empty bin weighted alike (netcal's
      ``ACE``, Neumann et al. 2018).

    Sources: Naeini et al., "Obtaining Well Calibrated Probabilities Using Bayesian Binning",
    AAAI 2015 (ECE, MCE); Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.
    No sample at all gives NaN.

    Example:
        >>> count = torch.tensor([2.0, 0.0, 2.0], dtype=torch.float64)
        >>> conf_sum = torch.tensor([0.4, 0.0, 1.8], dtype=torch.float64)
        >>> correct_sum = torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64)
        >>> calibration_error_from_bins(count, conf_sum, correct_sum, "l1")
        tensor(0.1500, dtype=torch.float64)
        >>> calibration_error_from_bins(count, conf_sum, correct_sum, "max")
        tensor(0.2000, dtype=torch.float64)
    """
    check_choice("norm", norm, NORMS)
    count, conf_sum, correct_sum = (t.to(torch.float64) for t in (count, conf_sum, correct_sum))
    gap_sum = conf_sum - correct_sum
    total = count.sum(dim=-1)
    nonempty = count > 0
    safe_count = torch.where(nonempty, count, torch.ones_like(count))
    gap = (gap_sum / safe_count).abs()  # |conf_b - acc_b|; 0 in empty bins
    if norm == "l1":
        return gap_sum.abs().sum(dim=-1) / total
    if norm == "l2":
        return torch.sqrt((gap_sum * gap_sum / safe_count).sum(dim=-1) / total)
    if norm == "mean":
        return gap.sum(dim=-1) / nonempty.sum(dim=-1)
    worst = gap.amax(dim=-1) if gap.shape[-1] > 0 else total
    return torch.where(total > 0, worst, torch.full_like(worst, float("nan")))


# --- binned calibration errors ---------------------------------------------------------------


def calibration_error(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    norm: Norm = "l1",
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Top-label calibration error with equal-width bins: ECE, MCE or RMS calibration error.

    ``ECE = sum_b (n_b / N) |acc_b - conf_b|`` over ``B`` bins ``(k/B, (k+1)/B]`` of the
    confidence (see :func:`calibration_error_from_bins` for ``norm``, :func:`confidence_and_correct`
    for what confidence and correctness mean per task). Sources: Naeini et al., AAAI 2015;
    Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.

    Args:
        preds: ``[N, C]`` or dense ``[N, C, *]`` (multiclass), ``[N]`` (binary) or ``[N, K]``
            (multi-label) floats.
        target: ``[N]`` (dense: ``[N, *]``) class indices, or labels in {0, 1} of the shape of
            ``preds``.
        n_bins: number of equal-width bins.
        norm: ``"l1"`` (ECE), ``"max"`` (MCE), ``"l2"`` (RMSCE) or ``"mean"`` (netcal's ACE).
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred from shapes), ``"multiclass"``, ``"binary"``, ``"multilabel"``.
        validate_args: check target values, that probabilities lie in [0, 1] with multiclass
            rows summing to 1 (see :func:`confidence_and_correct`) and that logits are finite.
        ignore_index: target value whose samples (multi-label: labels) are left out, as in
            torchmetrics; ``None`` keeps all. All ignored gives NaN, as an empty input.

    Returns:
        A float64 scalar tensor.

    Example:
        >>> preds = torch.tensor([[0.25, 0.20, 0.55], [0.55, 0.05, 0.40],
        ...                       [0.10, 0.30, 0.60], [0.90, 0.05, 0.05]])
        >>> target = torch.tensor([0, 1, 2, 0])
        >>> calibration_error(preds, target, n_bins=3)
        tensor(0.2000, dtype=torch.float64)
        >>> calibration_error(preds.log(), target, n_bins=3, input_format="logits")
        tensor(0.2000, dtype=torch.float64)
        >>> padded = torch.cat([preds, torch.full((1, 3), 1 / 3)])
        >>> calibration_error(padded, torch.tensor([0, 1, 2, 0, -100]), n_bins=3,
        ...                   ignore_index=-100)
        tensor(0.2000, dtype=torch.float64)
    """
    check_n_bins(n_bins)
    check_choice("norm", norm, NORMS)
    confidence, correct = confidence_and_correct(
        preds,
        target,
        input_format=input_format,
        task=task,
        validate_args=validate_args,
        ignore_index=ignore_index,
    )
    return calibration_error_from_bins(*binned_statistics(confidence, correct, n_bins), norm)


def adaptive_calibration_error(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    norm: Norm = "l1",
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Adaptive (equal-mass) calibration error: the ECE over bins holding equal numbers of samples.

    ``sum_b |conf_sum_b - correct_sum_b| / N`` with the bins of
    :func:`equal_mass_binned_statistics` (confidence and correctness as in
    :func:`confidence_and_correct`). Source: Nixon et al., "Measuring Calibration in Deep
    Learning", CVPR Workshops 2019; Mukhoti et al., "Calibrating Deep Neural Networks using
    Focal Loss", NeurIPS 2020 (AdaECE).

    Arguments, ``ignore_index`` included, are those of :func:`calibration_error`.

    Example:
        >>> preds = torch.tensor([0.9, 0.1, 0.8, 0.2])
        >>> adaptive_calibration_error(preds, torch.tensor([1, 0, 0, 1]), n_bins=2)
        tensor(0.3500, dtype=torch.float64)
    """
    check_n_bins(n_bins)
    check_choice("norm", norm, NORMS)
    confidence, correct = confidence_and_correct(
        preds,
        target,
        input_format=input_format,
        task=task,
        validate_args=validate_args,
        ignore_index=ignore_index,
    )
    bins = equal_mass_binned_statistics(confidence, correct, n_bins)
    return calibration_error_from_bins(*bins, norm)


def _per_class(
    preds: Tensor, target: Tensor, task: str, input_format: str
) -> tuple[Tensor, Tensor]:
    """``[N, C]`` probabilities and ``[N, C]`` float64 indicators for the classwise metrics."""
    if task == "multiclass":
        probs = _class_probs(preds, input_format)
        onehot = F.one_hot(target.long(), probs.shape[1]).to(torch.float64)
        return probs, onehot
    probs = _binary_probs(preds, input_format)
    labels = target.to(torch.float64)
    if task == "binary":
        probs = torch.stack([1 - probs, probs], dim=1)
        labels = torch.stack([1 - labels, labels], dim=1)
    return probs, labels


def _classwise_inputs(
    preds: Tensor,
    target: Tensor,
    task: str | None,
    input_format: str,
    validate_args: bool,
    ignore_index: int | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``[N, C]`` probabilities and indicators for the classwise metrics, and the kept entries.

    Multiclass and binary: ignored rows are dropped (the mask is ``None``). Multi-label: the
    ``[N, K]`` layout is kept, since each label is a class of its own, and the mask of kept
    (sample, label) entries comes back (``None`` when all are kept); only kept entries are
    checked.
    """
    if ignore_index is None or resolve_task(preds, target, task) != "multilabel":
        preds, target, task = _prepare(
            preds, target, task, input_format, validate_args, ignore_index=ignore_index
        )
        return (*_per_class(preds, target, task, input_format), None)
    preds, target, task = _prepare(preds, target, task, input_format, False)
    check_ignore_index(ignore_index)
    kept_entries = _kept(target, ignore_index)
    keep = None if bool(kept_entries.all()) else kept_entries
    if validate_args:
        kept = (preds, target) if keep is None else (preds[keep], target[keep])
        _check_values(*kept, task, input_format)
    return (*_per_class(preds, target, task, input_format), keep)


def _classwise_sums(
    probs: Tensor, labels: Tensor, n_bins: int, keep: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Bin sums ``[C, n_bins]`` of the ``[N, C]`` entries (those of ``keep`` if given)."""
    num_classes = probs.shape[1]
    offset = torch.arange(num_classes, device=probs.device) * n_bins
    index = _bin_index(probs, n_bins) + offset
    if keep is None:
        index, probs, labels = index.reshape(-1), probs.reshape(-1), labels.reshape(-1)
    else:
        index, probs, labels = index[keep], probs[keep], labels[keep]
    sums = _bin_sums(index, probs, labels, num_classes * n_bins)
    return tuple(s.reshape(num_classes, n_bins) for s in sums)  # type: ignore[return-value]


def classwise_binned_statistics(
    probs: Tensor, labels: Tensor, n_bins: int = 15, *, ignore_index: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-width bin sums per class, float64 ``[C, n_bins]``: bins of ``p_c`` against ``y_c``.

    Args:
        probs: ``[N, C]`` probabilities.
        labels: ``[N, C]`` indicators ``1[y = c]`` (or multi-label targets).
        n_bins: number of bins per class.
        ignore_index: entries of ``labels`` equal to it are left out, each one (sample, class)
            pair; ``labels`` must then be hard (0 or 1 where kept). ``None`` keeps all.

    Example:
        >>> count, _, _ = classwise_binned_statistics(
        ...     torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]), 2
        ... )
        >>> count
        tensor([[1., 1.],
                [1., 1.]], dtype=torch.float64)
    """
    check_n_bins(n_bins)
    if ignore_index is not None:
        check_ignore_index(ignore_index)
    probs, labels = probs.detach(), labels.detach()
    if probs.dim() != 2 or labels.shape != probs.shape:
        raise ValueError(
            f"probs and labels must both be [N, C]; got {list(probs.shape)} and "
            f"{list(labels.shape)}"
        )
    keep = None if ignore_index is None else _kept(labels, ignore_index)
    return _classwise_sums(probs, labels, n_bins, keep)


def classwise_calibration_error(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    norm: Norm = "l1",
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Classwise ECE: the calibration error of each class's probability, averaged over classes.

    ``cwECE = (1/C) sum_c sum_b (n_{c,b} / N) |mean_{i in b} p_{i,c} - mean_{i in b} 1[y_i=c]|``
    with equal-width bins of ``p_c`` per class. Multi-label: one class per label (against its
    0/1 target); binary ``[N]`` preds: two classes, ``1 - p`` and ``p``. Source: Kull et al.,
    "Beyond temperature scaling: Obtaining well-calibrated multiclass probabilities with
    Dirichlet calibration", NeurIPS 2019.

    Arguments are those of :func:`calibration_error`. With ``ignore_index`` a multi-label
    entry equal to it leaves out that label of that sample only: each label's error is over
    its own kept samples, ``N`` then differs from label to label.

    Example:
        >>> preds = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
        >>> classwise_calibration_error(preds, torch.tensor([0, 0]), n_bins=2)
        tensor(0.4000, dtype=torch.float64)
    """
    check_n_bins(n_bins)
    check_choice("norm", norm, NORMS)
    probs, labels, keep = _classwise_inputs(
        preds, target, task, input_format, validate_args, ignore_index
    )
    bins = _classwise_sums(probs, labels, n_bins, keep)
    return calibration_error_from_bins(*bins, norm).mean()


# --- proper scores and summary statistics ----------------------------------------------------


def _brier_terms(preds: Tensor, target: Tensor, task: str, input_format: str) -> Tensor:
    """Per-sample (multiclass) or per-label Brier terms, float64."""
    if task == "multiclass":
        probs = _class_probs(preds, input_format).to(torch.float64)
        p_t = probs.gather(1, target.long()[:, None])[:, 0]
        return (probs * probs).sum(dim=1) - 2 * p_t + 1
    probs = _binary_probs(preds, input_format).to(torch.float64)
    return (probs - target.to(torch.float64)).square().reshape(-1)


def nll_terms(preds: Tensor, target: Tensor, task: str, input_format: str) -> Tensor:
    """Per-sample (multiclass) or per-label negative log-likelihoods, float64, flattened.

    Logits: :func:`lightning_losses.functional.evaluation.nll_terms` in float64 (the one home
    of the formula); probabilities: ``-log p_t``, or ``-(y log p + (1-y) log(1-p))`` per label.
    """
    if input_format == "logits":
        return FE.nll_terms(preds, target, task, dtype=torch.float64).reshape(-1)
    if task == "multiclass":
        return -torch.log(preds.gather(1, target.long()[:, None])[:, 0].to(torch.float64))
    labels = target.to(torch.float64).reshape(-1)
    p = preds.to(torch.float64).reshape(-1)
    return -(torch.xlogy(labels, p) + torch.xlogy(1 - labels, 1 - p))


def _proper_terms(
    preds: Tensor, target: Tensor, task: str, input_format: str
) -> tuple[Tensor, Tensor]:
    """Brier and NLL terms from one float64 (log-)softmax pass (see the two functions above).

    Multiclass logits: the Brier score's probabilities are those of the one log-softmax of
    :func:`lightning_losses.functional.evaluation.log_softmax_nll`, whose NLL terms these are.
    """
    if task == "multiclass" and input_format == "logits":
        log_probs, nll = FE.log_softmax_nll(preds, target, dtype=torch.float64)
        probs = log_probs.exp()
        return (probs * probs).sum(dim=1) - 2 * torch.exp(-nll) + 1, nll
    return _brier_terms(preds, target, task, input_format), nll_terms(
        preds, target, task, input_format
    )


def _top_label_terms(
    preds: Tensor, target: Tensor, task: str, input_format: str
) -> tuple[Tensor, Tensor]:
    """Per-decision top-label confidence and correctness (float64), for accuracy and confidence.

    Multiclass: one walk over the rows (:func:`_multiclass_top_label`), whose ``correct`` is the
    hit of :func:`lightning_losses.functional.evaluation.correct_terms` (``argmax == target``,
    ties included). Binary and multi-label: the decision ``p > 0.5`` (logits: the home's hit
    ``x > 0`` against ``y > 0.5``) and its confidence ``max(p, 1 - p)``.
    """
    if task == "multiclass":
        top = _multiclass_top_label(preds, target, input_format)
        return top.confidence.to(torch.float64), top.correct.to(torch.float64)
    labels = target.reshape(-1)
    if input_format == "logits":
        x = preds.reshape(-1).to(torch.float64)
        confidence = torch.sigmoid(x.abs())
        correct = FE.correct_terms(x, labels, task)
    else:
        p = preds.reshape(-1).to(torch.float64)
        confidence = torch.maximum(p, 1 - p)
        correct = (p > 0.5) == (labels > 0.5)
    return confidence, correct.to(torch.float64)


def _accuracy_terms(preds: Tensor, target: Tensor, task: str, input_format: str) -> Tensor:
    """Per-decision top-label correctness, float64 (logits: the home's hits, flattened)."""
    if input_format == "logits":
        return FE.correct_terms(preds, target, task).reshape(-1).to(torch.float64)
    return _top_label_terms(preds, target, task, input_format)[1]


def _confidence_terms(preds: Tensor, target: Tensor, task: str, input_format: str) -> Tensor:
    """Per-decision top-label confidence, float64."""
    return _top_label_terms(preds, target, task, input_format)[0]


def _mean(terms: Tensor) -> Tensor:
    return terms.sum() / terms.numel() if terms.numel() else terms.new_tensor(float("nan"))


def brier_score(
    preds: Tensor,
    target: Tensor,
    *,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Brier score: mean squared distance between the probability vector and the one-hot target.

    Multiclass: ``mean_i sum_c (p_ic - 1[y_i = c])^2`` (in [0, 2]); binary: ``mean_i (p_i -
    y_i)^2`` (in [0, 1], like scikit-learn's ``brier_score_loss``); multi-label: the binary
    score over all ``N * K`` labels. Source: Brier, "Verification of forecasts expressed in
    terms of probability", Monthly Weather Review 1950.

    ``ignore_index`` drops samples (multi-label: labels) as in :func:`calibration_error`.

    Example:
        >>> brier_score(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        tensor(0.4000, dtype=torch.float64)
        >>> brier_score(torch.tensor([0.2, 0.6]), torch.tensor([0, 0]))
        tensor(0.2000, dtype=torch.float64)
    """
    preds, target, task = _prepare(
        preds, target, task, input_format, validate_args, ignore_index=ignore_index
    )
    return _mean(_brier_terms(preds, target, task, input_format))


def negative_log_likelihood(
    preds: Tensor,
    target: Tensor,
    *,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Mean negative log-likelihood of the targets, in float64.

    Multiclass: ``mean_i -log p_{i, y_i}``, from ``log_softmax`` of logits or ``log p`` of
    probabilities (``inf`` where ``p_y = 0``); binary and multi-label: binary cross-entropy
    ``-(y log p + (1-y) log(1-p))`` averaged over all labels (``xlogy``, so ``0 log 0 = 0``;
    from logits via ``binary_cross_entropy_with_logits``). ``ignore_index`` drops samples
    (multi-label: labels) as in :func:`calibration_error`: the token-level NLL of a padded
    sequence batch.

    Example:
        >>> preds = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
        >>> negative_log_likelihood(preds, torch.tensor([0, 0]))
        tensor(0.3993, dtype=torch.float64)
        >>> negative_log_likelihood(preds.log(), torch.tensor([0, 0]), input_format="logits")
        tensor(0.3993, dtype=torch.float64)
        >>> negative_log_likelihood(preds, torch.tensor([0, -100]), ignore_index=-100)
        tensor(0.6931, dtype=torch.float64)
    """
    preds, target, task = _prepare(
        preds, target, task, input_format, validate_args, ignore_index=ignore_index
    )
    return _mean(nll_terms(preds, target, task, input_format))


def accuracy(
    preds: Tensor,
    target: Tensor,
    *,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Top-label accuracy: ``mean_i 1[argmax_c p_ic = y_i]``.

    Binary and multi-label (per label, pooled): the decision is ``p > 0.5`` (logit ``> 0``).
    ``ignore_index`` drops samples (multi-label: labels) as in :func:`calibration_error`.

    Example:
        >>> accuracy(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        tensor(0.5000, dtype=torch.float64)
    """
    preds, target, task = _prepare(
        preds, target, task, input_format, validate_args, ignore_index=ignore_index
    )
    return _mean(_accuracy_terms(preds, target, task, input_format))


def mean_confidence(
    preds: Tensor,
    target: Tensor,
    *,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Mean top-label confidence: ``mean_i max_c p_ic`` (``max(p, 1-p)`` for binary labels).

    Compared with :func:`accuracy`, it says whether a model is over- (``confidence >
    accuracy``) or under-confident on average. ``target`` is only checked, not used, except
    that with ``ignore_index`` it says which samples (multi-label: labels) are left out.

    Example:
        >>> mean_confidence(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        tensor(0.7000, dtype=torch.float64)
    """
    preds, target, task = _prepare(
        preds, target, task, input_format, validate_args, ignore_index=ignore_index
    )
    return _mean(_confidence_terms(preds, target, task, input_format))
