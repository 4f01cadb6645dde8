"""Per-task negative log-likelihood and hits of logits: the one home of these formulas.

Whatever loss trained a model, its NLL is that of the probabilities its logits define, and its
accuracy that of its decisions. Four tasks, told by the caller (never guessed from values):

- ``"multiclass"``: logits ``[N, C]`` (or dense ``[N, C, *]``), class indices ``[N]``
  (``[N, *]``): ``nll = -log softmax(x)_t``, hit ``argmax_c x_c == t`` (the first column
  holding the maximum, as :func:`torch.argmax` picks it);
- ``"nm"``: ``n`` tasks of ``m`` classes, logits ``[N, n, m]``, class indices ``[N, n]``: each
  task is a multiclass prediction (terms ``[N * n]`` for the NLL, ``[N, n]`` for the hits);
- ``"binary"``: logits ``[N]``, labels ``[N]``; ``"multilabel"``: logits ``[N, K]``, labels
  ``[N, K]``: ``nll = -(y log s + (1 - y) log(1 - s))`` with ``s = sigmoid(x)`` (soft ``y``
  allowed), hit ``(x > 0) == (y > 0.5)``, per label.

Every other place that reports an NLL or an accuracy of logits calls these functions:
``ClassifierModule``'s logged ``nll`` and ``acc``, the calibration metrics' NLL and accuracy
(:mod:`lightning_losses.calibration.functional`, which add ``ignore_index`` and probability
inputs), ``SplitCurves`` and the reproduction runner. Pure maths: tensors in, tensors out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.functional.checks import check_choice

__all__ = [
    "TASKS",
    "correct_terms",
    "log_softmax_nll",
    "nll_terms",
    "task_accuracy",
    "task_nll",
]

TASKS = ("multiclass", "binary", "multilabel", "nm")


def log_softmax_nll(
    logits: Tensor, target: Tensor, *, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Multiclass log-probabilities and each row's NLL, from one log-softmax in ``dtype``.

    ``nll_i = -log_softmax(x_i)[t_i]``: the terms of :func:`torch.nn.functional.cross_entropy`
    with ``reduction="none"``, to the bit (a target equal to -100, its default
    ``ignore_index``, gives a 0 term; any other target outside ``[0, C)`` raises). Callers that
    need the probabilities too (the Brier score) take them from ``log_probs``: one pass.

    Args:
        logits: ``[N, C]`` (or ``[N, C, *]``) logits, class dimension 1.
        target: ``[N]`` (``[N, *]``) class indices (any integer dtype).
        dtype: the dtype of the computation: ``torch.float32`` (also for half-precision
            logits) or ``torch.float64``.

    Returns:
        ``(log_probs, nll)``: ``[N, C]`` and ``[N]``, both in ``dtype``.

    Example:
        >>> log_probs, nll = log_softmax_nll(torch.tensor([[0.0, 0.0], [2.0, 0.0]]),
        ...                                  torch.tensor([0, 1]), dtype=torch.float64)
        >>> nll
        tensor([0.6931, 2.1269], dtype=torch.float64)
    """
    log_probs = torch.log_softmax(logits.to(dtype), dim=1)
    return log_probs, F.nll_loss(log_probs, target.long(), reduction="none")


def nll_terms(
    logits: Tensor, target: Tensor, task: str, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Per-term negative log-likelihoods: one per sample, per task (``nm``) or per label.

    Softmax cross-entropy for ``multiclass`` (:func:`log_softmax_nll`) and ``nm`` (flattened
    to ``[N * n]`` tasks); sigmoid binary cross-entropy for ``binary`` and ``multilabel`` (the
    shape of ``logits``), computed in ``dtype``.

    Args:
        logits: see the module doc for the shapes of each task.
        target: class indices (``multiclass``, ``nm``) or labels in [0, 1].
        task: ``"multiclass"``, ``"binary"``, ``"multilabel"`` or ``"nm"``.
        dtype: ``torch.float32`` (what ``ClassifierModule`` logs) or ``torch.float64`` (the
            calibration metrics).

    Raises:
        ValueError: an unknown ``task``.

    Example:
        >>> nll_terms(torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([0, 1]), "multiclass")
        tensor([0.6931, 2.1269])
        >>> nll_terms(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]), "binary")
        tensor([0.6931, 2.1269])
    """
    check_choice("task", task, TASKS)
    if task == "multiclass":
        return log_softmax_nll(logits, target, dtype=dtype)[1]
    if task == "nm":
        return log_softmax_nll(logits.flatten(0, 1), target.flatten(), dtype=dtype)[1]
    return F.binary_cross_entropy_with_logits(logits.to(dtype), target.to(dtype), reduction="none")


def correct_terms(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Per-term hits (bool): top-1 per sample, per task (``nm``), ``x > 0`` per label otherwise.

    ``multiclass``: ``argmax_c x_c == t`` (``[N]``); ``nm``: the same per task (``[N, n]``);
    ``binary`` and ``multilabel``: the decision ``x > 0`` against the label ``y > 0.5`` (the
    shape of ``logits``).

    Args:
        logits: see the module doc for the shapes of each task.
        target: class indices (``multiclass``, ``nm``) or labels in [0, 1].
        task: ``"multiclass"``, ``"binary"``, ``"multilabel"`` or ``"nm"``.

    Raises:
        ValueError: an unknown ``task``.

    Example:
        >>> correct_terms(torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.tensor([1, 1]),
        ...               "multiclass")
        tensor([ True, False])
        >>> correct_terms(torch.tensor([[0.5, -1.0]]), torch.tensor([[1.0, 1.0]]), "multilabel")
        tensor([[ True, False]])
    """
    check_choice("task", task, TASKS)
    if task == "multiclass":
        return logits.argmax(dim=1) == target
    if task == "nm":
        return logits.argmax(dim=2) == target
    return (logits > 0) == (target > 0.5)


def task_nll(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Mean negative log-likelihood (float32) of the model's probabilities, whatever the loss.

    The mean of :func:`nll_terms`: softmax cross-entropy for ``multiclass`` and ``nm``
    (averaged over tasks), sigmoid binary cross-entropy for ``binary`` and ``multilabel``
    (averaged over labels).

    Example:
        >>> task_nll(torch.tensor([[[0.0, 0.0], [2.0, 0.0]]]), torch.tensor([[0, 1]]), "nm")
        tensor(1.4100)
    """
    return nll_terms(logits, target, task).mean()


def task_accuracy(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Accuracy (float32): the mean of :func:`correct_terms`.

    Top-1 (``multiclass``), per task (``nm``), per label with ``x > 0`` otherwise.

    Example:
        >>> task_accuracy(torch.tensor([1.5, -0.5, 0.2]), torch.tensor([1, 1, 0]), "binary")
        tensor(0.3333)
    """
    return correct_terms(logits, target, task).float().mean()
