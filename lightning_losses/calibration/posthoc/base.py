r"""The interface every post-hoc calibrator of logits shares, and the input checks of ``fit``.

A post-hoc calibrator is fitted on held-out logits ``[N, C]`` and their class labels, after
training, and maps logits to calibrated log-probabilities:

.. math::

    \text{fit}(z, y) \to g, \qquad g(z) = \log \hat p(\cdot \mid z) \in \mathbb{R}^{N \times C},
    \quad \sum_c \exp g(z)_c = 1 .

Every calibrator here is a :class:`torch.nn.Module` whose keyword-only constructor takes its
hyper-parameters, whose :meth:`PostHocCalibrator.fit` returns the calibrator itself, and whose
``forward`` returns log-probabilities in the dtype of the logits (computed in float64). Before
``fit`` (or after a fit that could not help) it is the identity: ``log_softmax(z)``.

The fitted state lives in ``params`` (a dict of float64 tensors whose shapes depend on the
data: the number of classes, the number of bins) and is saved as the module's *extra state*,
so :meth:`~torch.nn.Module.state_dict` / :meth:`~torch.nn.Module.load_state_dict` round-trip a
fitted calibrator into a fresh one built with the same hyper-parameters.

A method that cannot help on the data it is given (fewer samples than parameters, a single
class in the labels) does not fail silently: ``fit`` warns with a
:class:`~lightning_losses.warning.LightningLossesWarning` naming the method and the reason,
stays the identity, and keeps the reason in :attr:`PostHocCalibrator.fallback`. A fit whose
map runs to a bound (a temperature driven to 0 by validation labels that the logits separate,
or to infinity by labels they do not predict) warns likewise, saying what the map then does,
and keeps the reason in :attr:`PostHocCalibrator.bound`; the fitted map is kept.

Binary tasks: one logit per sample ``[N]`` is read as the two-class logits ``[0, z]`` (whose
softmax is ``(1 - sigmoid(z), sigmoid(z))``), so ``forward`` returns ``[N, 2]``.

Example:
    >>> import torch
    >>> identity = IdentityCalibrator().fit(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    >>> identity(torch.tensor([[0.0, 0.0]])).exp()
    tensor([[0.5000, 0.5000]])
"""

from __future__ import annotations

import abc
import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

from lightning_losses.functional.checks import check_ignore_index
from lightning_losses.warning import LightningLossesWarning

__all__ = [
    "IdentityCalibrator",
    "PostHocCalibrator",
    "as_class_logits",
    "check_fit_inputs",
    "fit_threads",
]

Self = TypeVar("Self", bound="PostHocCalibrator")

#: Below this many logits a fit runs on one thread: the iterative fits evaluate small tensors
#: hundreds of times, and on a busy machine torch's worker threads then cost more than the
#: work (measured: 23 ms per objective evaluation on [359, 10] with 2 threads under load,
#: 0.22 ms with one).
SINGLE_THREAD_BELOW = 1 << 20


@contextlib.contextmanager
def fit_threads(numel: int) -> Iterator[None]:
    """Run a fit on one torch thread if it has fewer than :data:`SINGLE_THREAD_BELOW` logits."""
    before = torch.get_num_threads()
    if numel >= SINGLE_THREAD_BELOW or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def as_class_logits(logits: Tensor, *, owner: str = "calibrator") -> Tensor:
    """``[N, C]`` logits as they are; one binary logit per sample ``[N]`` as ``[[0, z]]``.

    Raises:
        TypeError: not a floating-point tensor.
        ValueError: any other shape, or ``C < 2``.

    Example:
        >>> as_class_logits(torch.tensor([1.5, -2.0]))
        tensor([[ 0.0000,  1.5000],
                [ 0.0000, -2.0000]])
    """
    if not isinstance(logits, Tensor):
        raise TypeError(f"{owner}: logits must be a torch.Tensor; got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"{owner}: logits must be floating point; got dtype {logits.dtype}")
    if logits.dim() == 1:
        return torch.stack([torch.zeros_like(logits), logits], dim=1)
    if logits.dim() != 2 or logits.shape[1] < 2:
        raise ValueError(
            f"{owner}: logits must be [N, C] with C >= 2 classes, or [N] binary logits; got "
            f"shape {tuple(logits.shape)}"
        )
    return logits


def check_fit_inputs(
    logits: Tensor, target: Tensor, *, owner: str, ignore_index: int | None = None
) -> tuple[Tensor, Tensor]:
    """Validate held-out logits and labels; return float64 ``[N, C]`` logits and int64 labels.

    Rows whose label equals ``ignore_index`` are dropped first. Everything is detached.

    Args:
        logits: ``[N, C]`` logits or ``[N]`` binary logits.
        target: integer class labels ``[N]`` in ``[0, C)`` (0/1 for binary logits).
        owner: the calibrator's name, for the messages.
        ignore_index: the label of rows to leave out (``None``: keep all).

    Raises:
        TypeError: non-tensor inputs, integer logits, non-integer labels.
        ValueError: mismatched shapes, no sample left, NaN or infinite logits, labels out of
            range.

    Example:
        >>> z, y = check_fit_inputs(torch.zeros(3, 2), torch.tensor([0, 1, -1]), owner="demo",
        ...                         ignore_index=-1)
        >>> z.shape, z.dtype, y.tolist()
        (torch.Size([2, 2]), torch.float64, [0, 1])
        >>> check_fit_inputs(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]), owner="demo")
        Traceback (most recent call last):
        ...
        ValueError: demo.fit: logits contain NaN or infinite values; calibrate finite logits
    """
    z = as_class_logits(logits, owner=f"{owner}.fit")
    if not isinstance(target, Tensor):
        raise TypeError(f"{owner}.fit: target must be a torch.Tensor; got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            f"{owner}.fit: target must hold integer class labels [N]; got dtype {target.dtype}"
        )
    if tuple(target.shape) != (z.shape[0],):
        raise ValueError(
            f"{owner}.fit: target must be [N] = [{z.shape[0]}] class labels; got shape "
            f"{tuple(target.shape)}"
        )
    z, y = z.detach(), target.detach().long()
    if ignore_index is not None:
        check_ignore_index(ignore_index)
        keep = y != ignore_index
        z, y = z[keep], y[keep]
    if z.shape[0] == 0:
        raise ValueError(f"{owner}.fit: no samples to fit on (every label ignored, or none given)")
    z = z.to(torch.float64)
    if not bool(torch.isfinite(z).all()):
        raise ValueError(
            f"{owner}.fit: logits contain NaN or infinite values; calibrate finite logits"
        )
    if int(y.min()) < 0 or int(y.max()) >= z.shape[1]:
        extra = "" if ignore_index is None else f" or equal ignore_index={ignore_index}"
        raise ValueError(
            f"{owner}.fit: target labels must lie in [0, {z.shape[1] - 1}] (C={z.shape[1]} "
            f"classes){extra}; found {int(y.min())}..{int(y.max())}"
        )
    return z, y


class PostHocCalibrator(nn.Module, abc.ABC):
    """Base of the post-hoc calibrators: ``fit(logits, target)``, ``forward(logits)``.

    Subclasses set :attr:`method` (the name the registry and the logs use) and implement
    :meth:`_fit` (float64 logits ``[N, C]`` and int64 labels to the fitted ``params``),
    :meth:`_log_probs` (float64 logits to float64 log-probabilities with those ``params``) and
    :meth:`min_samples` (the fewest samples the fit needs for ``C`` classes, usually the number
    of parameters). ``fit`` checks the inputs, falls back to the identity with a warning where
    the method cannot help, and otherwise stores what ``_fit`` returns.
    """

    #: The method's name (``"vector"``, ``"isotonic"``...), as ``PostHocCalibration`` logs it.
    method: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.params: dict[str, Tensor] = {}
        self.fallback: str = ""
        #: Why the last fit's map ran to a bound of its fit ("" if it did not; see
        #: :meth:`bound_reason`). Not saved in the ``state_dict``.
        self.bound: str = ""

    @property
    def fitted(self) -> bool:
        """Whether ``fit`` has run (and either fitted parameters or fell back to the identity)."""
        return bool(self.params) or bool(self.fallback)

    @property
    def name(self) -> str:
        """The class name, as the messages name the calibrator."""
        return type(self).__name__

    def min_samples(self, num_classes: int) -> int:
        """The fewest samples a fit on ``num_classes`` classes needs (default: 2)."""
        return 2

    def check_classes(self, num_classes: int) -> None:
        """Raise ``ValueError`` if the method does not apply to ``num_classes`` (default: all)."""

    @abc.abstractmethod
    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        """The fitted parameters from float64 logits ``[N, C]`` and int64 labels ``[N]``.

        The base adds ``num_classes`` itself; the tensors are stored as float64 on the CPU.
        """

    @abc.abstractmethod
    def _log_probs(self, logits: Tensor) -> Tensor:
        """Float64 log-probabilities ``[N, C]`` of float64 logits, with :attr:`params`."""

    def bound_reason(self, logits: Tensor, target: Tensor) -> str:
        """Why the fitted map ran to a bound of its fit, and what it then does ("" if it did not).

        Called by :meth:`fit` with the float64 logits ``[N, C]`` and labels it fitted on, after
        :attr:`params` are set. The methods that fit a scale of the logits (temperature, vector,
        matrix, Dirichlet, ensemble temperature) override it; the others have no bound.
        """
        return ""

    def note_bound(self, logits: Tensor, target: Tensor, *, stacklevel: int) -> None:
        """Set :attr:`bound` from :meth:`bound_reason` and warn when there is one."""
        self.bound = self.bound_reason(logits, target)
        if self.bound:
            warnings.warn(
                f"{self.name} ({self.method}): {self.bound}",
                LightningLossesWarning,
                stacklevel=stacklevel + 1,
            )

    def cannot_help(self, logits: Tensor, target: Tensor) -> str:
        """Why a fit on these inputs cannot help ("" if it can): too few samples, one class."""
        n, num_classes = logits.shape
        need = self.min_samples(num_classes)
        if n < need:
            return f"{n} samples are fewer than the {need} it needs for {num_classes} classes"
        if int(torch.unique(target).numel()) < 2:
            return f"every label is class {int(target[0])}: one class cannot be calibrated"
        return ""

    def fit(self: Self, logits: Tensor, target: Tensor, *, ignore_index: int | None = None) -> Self:
        """Fit on held-out ``logits`` ``[N, C]`` (or ``[N]`` binary) and labels ``[N]``.

        Returns:
            The calibrator itself, fitted (or the identity, with a warning, if it cannot help;
            fitted, with a warning, if its map ran to a bound: :meth:`bound_reason`).
        """
        z, y = check_fit_inputs(logits, target, owner=self.name, ignore_index=ignore_index)
        self.check_classes(z.shape[1])
        reason = self.cannot_help(z, y)
        self.params, self.fallback, self.bound = {}, "", ""
        if reason:
            self.fallback = reason
            warnings.warn(
                f"{self.name} ({self.method}) falls back to the identity: {reason}",
                LightningLossesWarning,
                stacklevel=2,
            )
            return self
        with torch.enable_grad(), fit_threads(z.numel()):
            params = self._fit(z, y)
        params["num_classes"] = torch.tensor(z.shape[1])
        self.params = {key: value.detach().to(torch.float64).cpu() for key, value in params.items()}
        self.note_bound(z, y, stacklevel=2)
        return self

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated log-probabilities ``[N, C]`` (``[N, 2]`` for ``[N]`` binary logits).

        Computed in float64 and returned in the dtype of ``logits``. Before ``fit``, or after a
        fit that fell back, this is ``log_softmax(logits)``.
        """
        z = as_class_logits(logits, owner=self.name)
        z64 = z.detach().to(torch.float64) if not z.requires_grad else z.to(torch.float64)
        if not self.params:
            out = torch.log_softmax(z64, dim=1)
        else:
            self.check_classes(z.shape[1])
            expected = self.num_classes
            if expected is not None and expected != z.shape[1]:
                raise ValueError(
                    f"{self.name}: fitted on {expected} classes, given logits with {z.shape[1]}"
                )
            out = self._log_probs(z64)
        return out.to(logits.dtype)

    @property
    def num_classes(self) -> int | None:
        """The number of classes of the fit (``None`` before it or for the identity)."""
        classes = self.params.get("num_classes")
        return None if classes is None else int(classes)

    def probabilities(self, logits: Tensor) -> Tensor:
        """Calibrated probabilities ``exp(forward(logits))``."""
        return self(logits).exp()

    def param(self, key: str, like: Tensor) -> Tensor:
        """The fitted parameter ``key`` on the device of ``like`` (float64)."""
        return self.params[key].to(device=like.device, dtype=torch.float64)

    def get_extra_state(self) -> dict[str, Any]:
        """The fitted parameters and the fallback reason, saved in the ``state_dict``."""
        return {"params": dict(self.params), "fallback": self.fallback}

    def set_extra_state(self, state: Any) -> None:
        """Restore what :meth:`get_extra_state` saved."""
        self.params = {key: value.to(torch.float64) for key, value in state["params"].items()}
        self.fallback = str(state["fallback"])

    def extra_repr(self) -> str:
        """Whether it is fitted, shown in the module's ``repr``."""
        if self.fallback:
            return "identity (fell back)"
        return "fitted" if self.params else "not fitted"


class IdentityCalibrator(PostHocCalibrator):
    """No calibration: ``log_softmax(z)``. The baseline every choice of method is scored against.

    Example:
        >>> IdentityCalibrator()(torch.tensor([[0.0, 0.0]])).exp()
        tensor([[0.5000, 0.5000]])
    """

    method: ClassVar[str] = "none"

    def min_samples(self, num_classes: int) -> int:
        """The identity fits nothing: one sample will do."""
        return 1

    def cannot_help(self, logits: Tensor, target: Tensor) -> str:
        """Nothing to fit, nothing to warn about."""
        return ""

    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        return {}

    def _log_probs(self, logits: Tensor) -> Tensor:
        return torch.log_softmax(logits, dim=1)
