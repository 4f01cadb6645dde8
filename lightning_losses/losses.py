"""Thin ``nn.Module`` wrappers over :mod:`lightning_losses.functional`.

Each module stores its hyper-parameters as plain attributes under the names the function uses,
and its ``forward(logits, target)`` calls the function with their current values. A schedule can
therefore change ``criterion.gamma`` between two steps and the next call uses the new value.
Per-class tensors (``weight``, ``alpha``) are buffers, so they follow ``.to(device)`` and are
saved in the state dict.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_losses import functional as LF
from lightning_losses.functional.adafocal import check_adafocal_bins
from lightning_losses.functional.binary import (
    check_binary_focal,
    check_binary_ignore_index,
    check_pos_weight_values,
)
from lightning_losses.functional.calibration_penalties import dca_loss, mdca_loss, mmce_loss
from lightning_losses.functional.checks import (
    check_choice,
    check_dca,
    check_dual_focal,
    check_flag,
    check_int,
    check_loss_options,
    check_mbls,
    check_mdca,
    check_mmce,
    check_range,
    check_real,
)
from lightning_losses.functional.dual_focal import dual_focal_loss
from lightning_losses.functional.exact import check_exact, check_exact_options
from lightning_losses.functional.linear import LINEAR_TARGET_LOSSES, check_chunk_size, resolve_loss
from lightning_losses.functional.margin import mbls_loss
from lightning_losses.functional.multilabel import check_nm
from lightning_losses.functional.target_probability import (
    check_adaptive_focal,
    check_cross_entropy,
    check_focal,
    check_gamma_ce,
    check_hard_truncated,
    check_no_label_smoothing,
    check_poly1,
    poly1_loss,
)
from lightning_losses.functional.truncation import check_soft_truncated
from lightning_losses.kernels.availability import BACKENDS


def _no_hyperparameters() -> None:
    """The check of a loss without scalar hyper-parameters."""


def _is_zero(value: object) -> bool:
    """Whether ``value`` is a number equal to 0 (the representations omit such smoothing)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


class FunctionalLoss(nn.Module):
    """Base of the loss modules: ``forward`` calls ``function`` with the current attributes.

    Subclasses set ``function``, ``check`` (the function's own check of its scalar
    hyper-parameters, called with them by name), ``hyperparameter_names`` (the scalar
    hyper-parameters a schedule may change and a logger may record) and ``option_names``
    (everything else passed through: ``reduction``, ``ignore_index``, per-class tensors,
    ``validate_args``).

    The losses of ``[N, C]`` logits (cross-entropy and the family, AdaFocal, MbLS, dual focal,
    MDCA, DCA, MMCE, soft truncation) also take ``backend`` (``"auto"``, ``"triton"`` or
    ``"torch"``), a plain attribute like the others (``criterion.backend``), passed to the
    function at each call and checked by :meth:`check_hyperparameters`: ``"triton"`` runs the
    fused Triton kernels of :mod:`lightning_losses.kernels` (see the function's docstring and
    ``docs/kernels.md``).

    Every constructor ends with :meth:`check_hyperparameters` (arranged by
    ``__init_subclass__``, once the constructor of the object's own class returns), so a value
    out of range fails where the loss is built, not at its first call.
    """

    function: ClassVar[Callable[..., Tensor]]
    check: ClassVar[Callable[..., None]] = staticmethod(_no_hyperparameters)
    hyperparameter_names: ClassVar[tuple[str, ...]] = ()
    option_names: ClassVar[tuple[str, ...]] = ("reduction", "validate_args")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: FunctionalLoss, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if type(self) is cls:
                self.check_hyperparameters()

        # mypy types neither assigning a method nor the functools.wraps wrapper of an unbound
        # constructor; the wrapper takes and passes the constructor's arguments unchanged.
        cls.__init__ = __init__  # type: ignore[method-assign,assignment]

    def _set_class_vector(self, name: str, value: Tensor | Sequence[float] | None) -> None:
        tensor = None if value is None else torch.as_tensor(value, dtype=torch.float32)
        self.register_buffer(name, tensor)

    def hyperparameters(self) -> dict[str, Any]:
        """The current scalar hyper-parameters, by name (e.g. ``{"gamma": 0.5}``)."""
        return {name: getattr(self, name) for name in self.hyperparameter_names}

    def options(self) -> dict[str, Any]:
        """The current options passed to ``function`` besides the hyper-parameters, by name."""
        return {name: getattr(self, name) for name in self.option_names}

    def check_hyperparameters(self) -> None:
        """Check the current hyper-parameters and options as a call of the loss would.

        The scalar hyper-parameters go through the loss function's own check (``check``);
        ``reduction``, ``ignore_index``, ``validate_args`` and the per-class ``weight`` or
        ``alpha`` (1-D; finite and ``>= 0`` when ``validate_args``) through the options'
        check. Runs at the end of every constructor; a schedule that assigns an attribute may
        call it to fail early. The forward call checks the scalars again (it costs nothing).

        Raises:
            ValueError: a value out of range; the message names the attribute and the range.
            TypeError: a value of the wrong type (e.g. ``ignore_index=1.5``).

        Example:
            >>> criterion = FocalLoss(gamma=2.0)
            >>> criterion.gamma = -1.0
            >>> criterion.check_hyperparameters()
            Traceback (most recent call last):
            ...
            ValueError: gamma must lie in [0, inf); got -1.0
        """
        type(self).check(**self.hyperparameters())
        check_loss_options(self.options())
        if "backend" in type(self).option_names:
            check_choice("backend", self.backend, BACKENDS)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """The loss of ``logits`` for ``target``, with the current hyper-parameters."""
        cls = type(self)
        # the values hyperparameters() and options() give, read in one pass: the buffers
        # (weight, alpha) straight from their dict, not through nn.Module.__getattr__
        buffers = self._buffers
        arguments = {
            name: buffers[name] if name in buffers else getattr(self, name)
            for name in cls.hyperparameter_names + cls.option_names
        }
        return cls.function(logits, target, **arguments)

    def extra_repr(self) -> str:
        """The hyper-parameters and ``reduction``, for ``repr``."""
        shown = {**self.hyperparameters(), "reduction": self.reduction}
        return ", ".join(f"{name}={value!r}" for name, value in shown.items())


_INDEX_OPTIONS = ("weight", "ignore_index", "reduction", "validate_args", "backend")
_ALPHA_OPTIONS = ("alpha", "ignore_index", "reduction", "validate_args", "backend")


def _index_loss_init(
    self: CrossEntropyLoss,
    *,
    label_smoothing: float = 0.0,
    weight: Sequence[float] | Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
    backend: str = "auto",
) -> None:
    """The options of a loss of class-index targets (the constructor of its subclasses).

    ``label_smoothing`` becomes an attribute where the class lists it in
    ``hyperparameter_names`` (cross-entropy, gamma cross-entropy); elsewhere only 0 is
    accepted (:func:`~lightning_losses.functional.target_probability.check_no_label_smoothing`).
    """
    FunctionalLoss.__init__(self)
    if "label_smoothing" in type(self).hyperparameter_names:
        self.label_smoothing = label_smoothing
    else:
        check_no_label_smoothing(type(self).__name__, label_smoothing)
    self._set_class_vector("weight", weight)
    self.ignore_index = ignore_index
    self.reduction = reduction
    self.validate_args = validate_args
    self.backend = backend


class CrossEntropyLoss(FunctionalLoss):
    """Cross-entropy, the baseline (:func:`~lightning_losses.functional.cross_entropy`).

    ``label_smoothing`` (``eps`` in ``[0, 1)``) has the meaning it has in
    :class:`torch.nn.CrossEntropyLoss`: the loss against ``(1 - eps) onehot(t) + eps / C``,
    class weights included. It is a hyper-parameter like ``gamma`` of the other losses: an
    attribute read at each call, checked by :meth:`check_hyperparameters` and open to a
    schedule (which :class:`~lightning_losses.lightning.mixin.LossMixin` logs as
    ``criterion/label_smoothing``).

    The subclasses that compute another loss of the family (``function`` other than
    cross-entropy: :class:`SoftAccuracyLoss`, :class:`HardTruncatedLoss`...) share
    ``weight``, ``ignore_index``, ``reduction`` and ``validate_args`` but not
    ``label_smoothing``, which their functions do not define: unless they declare their own
    constructor, hyper-parameters and check, they get those without it, and their
    constructor accepts ``label_smoothing=0`` only (anything else is a ``TypeError`` that
    names the losses taking it). :class:`GammaCrossEntropyLoss` declares it (TaiLr's form).

    Example:
        >>> CrossEntropyLoss()(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.2395)
        >>> loss = CrossEntropyLoss(label_smoothing=0.1)
        >>> loss.label_smoothing = 0.3
        >>> loss(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.6395)
    """

    function = staticmethod(LF.cross_entropy)
    check: ClassVar[Callable[..., None]] = staticmethod(check_cross_entropy)
    hyperparameter_names: ClassVar[tuple[str, ...]] = ("label_smoothing",)
    option_names = _INDEX_OPTIONS

    # Set by the constructor (_index_loss_init); ``label_smoothing`` only where listed in
    # ``hyperparameter_names``, ``weight`` a buffer.
    label_smoothing: float
    weight: Tensor | None
    ignore_index: int
    reduction: str
    validate_args: bool
    backend: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if cls.function is not LF.cross_entropy:  # another loss: no label_smoothing
            if "hyperparameter_names" not in cls.__dict__:
                cls.hyperparameter_names = ()
            if "check" not in cls.__dict__:
                cls.check = staticmethod(_no_hyperparameters)
            if "__init__" not in cls.__dict__:
                # a function of the right signature becomes the constructor (mypy does not
                # type assigning a method)
                cls.__init__ = _index_loss_init  # type: ignore[method-assign]
        super().__init_subclass__(**kwargs)  # wraps the constructor in the check

    def __init__(
        self,
        *,
        label_smoothing: float = 0.0,
        weight: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        _index_loss_init(
            self,
            label_smoothing=label_smoothing,
            weight=weight,
            ignore_index=ignore_index,
            reduction=reduction,
            validate_args=validate_args,
            backend=backend,
        )


class GammaCrossEntropyLoss(CrossEntropyLoss):
    """TaiLr's gamma cross-entropy (:func:`~lightning_losses.functional.gamma_cross_entropy`).

    ``gamma``, ``threshold`` and ``label_smoothing`` are attributes: anneal ``gamma`` from 0
    (cross-entropy) towards 1 (expected error) with
    :class:`lightning_losses.callbacks.GammaAnnealing`; ``label_smoothing`` (``eps`` in
    ``[0, 1)``) is TaiLr's: ``(1 - eps) * gamma_ce + eps / C * sum_c (-log p_c)``, open to a
    schedule like ``gamma`` (then logged as ``criterion/label_smoothing``). The representation
    shows it only when it is not 0.

    Example:
        >>> loss = GammaCrossEntropyLoss(gamma=0.0)
        >>> loss.gamma = 1.0
        >>> loss(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))  # 1 - p_t
        tensor(0.2130)
        >>> loss.label_smoothing = 0.3
        >>> loss
        GammaCrossEntropyLoss(gamma=1.0, threshold=0.0, label_smoothing=0.3, reduction='mean')
    """

    function = staticmethod(LF.gamma_cross_entropy)
    check = staticmethod(check_gamma_ce)
    hyperparameter_names = ("gamma", "threshold", "label_smoothing")

    def __init__(
        self,
        *,
        gamma: float = 0.5,
        threshold: float = 0.0,
        label_smoothing: float = 0.0,
        weight: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__(
            label_smoothing=label_smoothing,
            weight=weight,
            ignore_index=ignore_index,
            reduction=reduction,
            validate_args=validate_args,
            backend=backend,
        )
        self.gamma = gamma
        self.threshold = threshold

    def extra_repr(self) -> str:
        """The hyper-parameters and ``reduction``, for ``repr``."""
        shown = {**self.hyperparameters(), "reduction": self.reduction}
        if _is_zero(shown["label_smoothing"]):
            del shown["label_smoothing"]  # as before label smoothing existed here
        return ", ".join(f"{name}={value!r}" for name, value in shown.items())


class SoftAccuracyLoss(CrossEntropyLoss):
    """Expected error ``1 - p_t`` (:func:`~lightning_losses.functional.soft_accuracy_loss`).

    Example:
        >>> SoftAccuracyLoss()(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.2130)
    """

    function = staticmethod(LF.soft_accuracy_loss)


class HardTruncatedLoss(CrossEntropyLoss):
    """Cross-entropy cut to zero above ``margin`` (:func:`~lightning_losses.functional.hard_truncated_loss`).

    Example:
        >>> HardTruncatedLoss(margin=0.9)(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.2395)
    """  # noqa: E501

    function = staticmethod(LF.hard_truncated_loss)
    check = staticmethod(check_hard_truncated)
    hyperparameter_names = ("margin",)

    def __init__(
        self,
        *,
        margin: float = 0.5,
        label_smoothing: float = 0.0,
        weight: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__(
            label_smoothing=label_smoothing,
            weight=weight,
            ignore_index=ignore_index,
            reduction=reduction,
            validate_args=validate_args,
            backend=backend,
        )
        self.margin = margin


class SoftTruncatedLoss(CrossEntropyLoss):
    """Soft truncation ``-softmax(-k x)_t log p_t`` (:func:`~lightning_losses.functional.soft_truncated_loss`).

    Example:
        >>> SoftTruncatedLoss(k=1.0)(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.0152)
    """  # noqa: E501

    function = staticmethod(LF.soft_truncated_loss)
    check = staticmethod(check_soft_truncated)
    hyperparameter_names = ("k",)

    def __init__(
        self,
        *,
        k: float = 1.0,
        label_smoothing: float = 0.0,
        weight: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__(
            label_smoothing=label_smoothing,
            weight=weight,
            ignore_index=ignore_index,
            reduction=reduction,
            validate_args=validate_args,
            backend=backend,
        )
        self.k = k


class Poly1Loss(CrossEntropyLoss):
    """Poly-1 ``-log p_t + epsilon (1 - p_t)`` (:func:`~lightning_losses.functional.target_probability.poly1_loss`).

    ``epsilon`` (``>= -1``, default 1) is a plain attribute, open to a schedule like ``gamma``
    (:class:`~lightning_losses.callbacks.LossScheduler` over ``"epsilon"``); ``weight``,
    ``ignore_index`` and ``reduction`` have the meaning they have in
    :class:`CrossEntropyLoss`, and ``epsilon = 0`` is cross-entropy.

    Example:
        >>> loss = Poly1Loss(epsilon=1.0)
        >>> loss(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.4526)
        >>> loss.epsilon = 0.0
        >>> loss(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.2395)
    """  # noqa: E501

    function = staticmethod(poly1_loss)
    check = staticmethod(check_poly1)
    hyperparameter_names = ("epsilon",)

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        label_smoothing: float = 0.0,
        weight: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__(
            label_smoothing=label_smoothing,
            weight=weight,
            ignore_index=ignore_index,
            reduction=reduction,
            validate_args=validate_args,
            backend=backend,
        )
        self.epsilon = epsilon


class FocalLoss(FunctionalLoss):
    """Focal loss ``-alpha_t (1-p_t)^gamma log p_t`` (:func:`~lightning_losses.functional.focal_loss`).

    Example:
        >>> FocalLoss(gamma=2.0)(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.0109)
    """  # noqa: E501

    function = staticmethod(LF.focal_loss)
    check = staticmethod(check_focal)
    hyperparameter_names = ("gamma",)
    option_names = _ALPHA_OPTIONS

    def __init__(
        self,
        *,
        gamma: float = 2.0,
        label_smoothing: float = 0.0,
        alpha: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_no_label_smoothing(type(self).__name__, label_smoothing)
        self.gamma = gamma
        self._set_class_vector("alpha", alpha)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args
        self.backend = backend


class AdaptiveFocalLoss(FunctionalLoss):
    """Focal loss with ``gamma`` picked per sample from ``p_t`` (FLSD-53 by default).

    See :func:`~lightning_losses.functional.adaptive_focal_loss`.

    Example:
        >>> AdaptiveFocalLoss()(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
        tensor(0.0023)
    """

    function = staticmethod(LF.adaptive_focal_loss)
    check = staticmethod(check_adaptive_focal)
    hyperparameter_names = ("thresholds", "gammas")
    option_names = _ALPHA_OPTIONS

    def __init__(
        self,
        *,
        thresholds: Sequence[float] = (0.2,),
        gammas: Sequence[float] = (5.0, 3.0),
        label_smoothing: float = 0.0,
        alpha: Sequence[float] | Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_no_label_smoothing(type(self).__name__, label_smoothing)
        self.thresholds = tuple(thresholds)
        self.gammas = tuple(gammas)
        self._set_class_vector("alpha", alpha)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args
        self.backend = backend


class AdaFocalLoss(FunctionalLoss):
    """AdaFocal (:func:`~lightning_losses.functional.adafocal_loss`): one gamma per confidence bin.

    The bins are state, not hyper-parameters: ``edges`` (``[num_bins + 1]``) and ``gammas``
    (``[num_bins]``) are float64 buffers, so they follow the model between devices, stay
    float64 under a module-wide dtype cast (``.half()``, ``precision="16-true"``) and are saved
    in checkpoints: a resumed fit goes on with the gammas it had. They start as equal-width
    bins ``k / num_bins`` with ``gamma_initial`` each; :class:`~lightning_losses.callbacks.
    AdaFocalUpdate` replaces them after every validation epoch (equal-mass bins of the
    validation confidences, gammas by the paper's rule). Without that callback the loss is
    focal loss with ``gamma = gamma_initial``.

    Source: Ghosh, Schaaf, Gormley, "AdaFocal: Calibration-aware Adaptive Focal Loss"
    (NeurIPS 2022); the defaults are the paper's (15 bins, initial gamma 1).

    Args:
        num_bins: number of confidence bins, ``>= 1``.
        gamma_initial: every bin's gamma before the first update (any finite real; negative is
            inverse focal).
        label_smoothing: only 0 is accepted (AdaFocal has no label smoothing).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        validate_args: check targets, logits and the bins at each call.

    Example:
        >>> criterion = AdaFocalLoss(num_bins=15, gamma_initial=1.0)
        >>> criterion(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))  # focal, gamma 1
        tensor(0.0510)
        >>> criterion.edges.shape, criterion.gammas.dtype
        (torch.Size([16]), torch.float64)
    """

    function = staticmethod(LF.adafocal_loss)
    option_names = ("edges", "gammas", "ignore_index", "reduction", "validate_args", "backend")
    edges: Tensor
    gammas: Tensor

    def __init__(
        self,
        *,
        num_bins: int = 15,
        gamma_initial: float = 1.0,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_no_label_smoothing(type(self).__name__, label_smoothing)
        num_bins = check_int("num_bins", num_bins, low=1)
        check_range("gamma_initial", gamma_initial)
        self.num_bins = num_bins
        self.gamma_initial = float(gamma_initial)
        # The reference's initial bins: lower edge k * (1 / B), in float64.
        edges = [k * (1.0 / num_bins) for k in range(num_bins)] + [1.0]
        self.register_buffer("edges", torch.tensor(edges, dtype=torch.float64))
        self.register_buffer(
            "gammas", torch.full((num_bins,), self.gamma_initial, dtype=torch.float64)
        )
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args
        self.backend = backend

    def check_hyperparameters(self) -> None:
        """As :meth:`FunctionalLoss.check_hyperparameters`, and the bins."""
        super().check_hyperparameters()
        check_adafocal_bins(self.edges, self.gammas, validate_args=self.validate_args)

    def set_bins(self, edges: Tensor | Sequence[float], gammas: Tensor | Sequence[float]) -> None:
        """Replace the bins in place (their device and float64 dtype are kept)."""
        edges = torch.as_tensor(edges, dtype=torch.float64)
        gammas = torch.as_tensor(gammas, dtype=torch.float64)
        check_adafocal_bins(edges, gammas)
        if gammas.shape != self.gammas.shape:
            raise ValueError(
                f"gammas must hold num_bins={self.num_bins} values; got {gammas.numel()}"
            )
        self.edges.copy_(edges)
        self.gammas.copy_(gammas)

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> AdaFocalLoss:
        # Move the bins with the module, but never round them: a dtype cast of the whole model
        # (.half(), Lightning's "16-true") would otherwise change which bin a sample falls in.
        saved = {"edges": self.edges, "gammas": self.gammas}
        super()._apply(fn, *args, **kwargs)
        moved = {"edges": self.edges, "gammas": self.gammas}
        for name, value in saved.items():
            self._buffers[name] = value.to(moved[name].device)
        return self

    def extra_repr(self) -> str:
        """The bins and their gammas, for ``repr``."""
        return f"num_bins={self.num_bins}, gammas={[round(g, 4) for g in self.gammas.tolist()]}"


_BINARY_OPTIONS = ("pos_weight", "ignore_index", "reduction", "validate_args")


class MbLSLoss(FunctionalLoss):
    """Margin-based label smoothing (:func:`~lightning_losses.functional.margin.mbls_loss`).

    ``-log p_t + alpha / C * sum_k max(0, max_j x_j - x_k - margin)``. ``margin`` and
    ``alpha`` (both ``>= 0``; defaults 10 and 0.1, the authors') are plain attributes, open
    to a schedule (:class:`~lightning_losses.callbacks.LossScheduler` over ``"alpha"`` or
    ``"margin"``); ``alpha = 0`` is cross-entropy.

    Source: Liu, Ben Ayed, Galdran and Dolz, "The devil is in the margins: margin-based label
    smoothing for network calibration" (CVPR 2022).

    Example:
        >>> loss = MbLSLoss(margin=10.0, alpha=0.1)
        >>> loss(torch.tensor([[12.0, 0.0, 1.0]]), torch.tensor([0]))
        tensor(0.1000)
        >>> loss.alpha = 0.3  # e.g. set by a schedule: CE (2e-5) + 0.3 * (0 + 2 + 1) / 3
        >>> loss(torch.tensor([[12.0, 0.0, 1.0]]), torch.tensor([0]))
        tensor(0.3000)
    """

    function = staticmethod(mbls_loss)
    check = staticmethod(check_mbls)
    hyperparameter_names = ("margin", "alpha")
    option_names = ("ignore_index", "reduction", "validate_args", "backend")

    def __init__(
        self,
        *,
        margin: float = 10.0,
        alpha: float = 0.1,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.margin = margin
        self.alpha = alpha
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args
        self.backend = backend


class DualFocalLoss(FunctionalLoss):
    """Dual focal loss ``-(1 - p_t + p_j)^gamma log p_t`` (:func:`~lightning_losses.functional.dual_focal.dual_focal_loss`).

    ``p_j`` is the largest probability strictly below ``p_t`` (0 if none). ``gamma``
    (``>= 0``, default 1) is a plain attribute, open to a schedule like focal loss's.

    Source: Tao, Dong and Xu, "Dual Focal Loss for Calibration" (ICML 2023).

    Example:
        >>> DualFocalLoss(gamma=2.0)(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([0]))
        tensor(0.1369)
    """  # noqa: E501

    function = staticmethod(dual_focal_loss)
    check = staticmethod(check_dual_focal)
    hyperparameter_names = ("gamma",)
    option_names = ("ignore_index", "reduction", "validate_args", "backend")

    def __init__(
        self,
        *,
        gamma: float = 1.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.gamma = gamma
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args
        self.backend = backend


class _BinaryLoss(FunctionalLoss):
    """Base of the binary (sigmoid) losses: their options and the check of them.

    ``pos_weight`` (the weight of the positive term, broadcast against the target; one per
    class for ``[N, C]`` targets) is a buffer, like ``alpha`` of :class:`FocalLoss`: it follows
    ``.to(device)`` and dtype casts and is saved in the state dict (only when it is set, so a
    checkpoint saved before this option existed loads into a loss without it).
    ``ignore_index`` is a plain attribute: an integer outside ``[0, 1]`` or ``None``.
    """

    option_names = _BINARY_OPTIONS
    pos_weight: Tensor | None

    def _set_binary_options(
        self,
        pos_weight: Sequence[float] | Tensor | None,
        ignore_index: int | None,
        reduction: str,
        validate_args: bool,
    ) -> None:
        self._set_class_vector("pos_weight", pos_weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args

    def check_hyperparameters(self) -> None:
        """As :meth:`FunctionalLoss.check_hyperparameters`; ``ignore_index`` may be ``None``.

        ``pos_weight`` must be a floating-point tensor (finite and ``>= 0`` when
        ``validate_args``); its shape is checked against the target at each call.
        """
        type(self).check(**self.hyperparameters())
        check_loss_options({"reduction": self.reduction, "validate_args": self.validate_args})
        check_binary_ignore_index(self.ignore_index)
        check_pos_weight_values(self.pos_weight, validate_args=self.validate_args)


class BinaryFocalLoss(_BinaryLoss):
    """Sigmoid focal loss (:func:`~lightning_losses.functional.binary_focal_loss`).

    Args:
        gamma: focusing parameter, ``>= 0`` (an attribute a schedule may change).
        alpha: weight of the positive term in ``[0, 1]`` (the negative gets ``1 - alpha``), or
            ``None``.
        pos_weight: weights ``>= 0`` of the positive term, broadcast against the target (for
            ``[N, C]`` targets one per class); a buffer, saved in the state dict.
        ignore_index: target value left out of the loss (outside ``[0, 1]``), or ``None``.
        reduction: ``"none"``, ``"mean"`` (over the elements not ignored) or ``"sum"``.
        validate_args: check targets, logits and ``pos_weight`` at each call.

    Example:
        >>> BinaryFocalLoss(gamma=2.0)(torch.tensor([2.0]), torch.tensor([1.0]))
        tensor(0.0018)
        >>> criterion = BinaryFocalLoss(gamma=0.0, pos_weight=[1.0, 3.0])
        >>> criterion(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]))  # 2 log 2
        tensor(1.3863)
    """

    function = staticmethod(LF.binary_focal_loss)
    check = staticmethod(check_binary_focal)
    hyperparameter_names = ("gamma", "alpha")

    def __init__(
        self,
        *,
        gamma: float = 2.0,
        alpha: float | None = None,
        pos_weight: Sequence[float] | Tensor | None = None,
        ignore_index: int | None = -100,
        reduction: str = "mean",
        validate_args: bool = True,
    ) -> None:
        super().__init__()
        self.gamma = gamma
        self.alpha = alpha
        self._set_binary_options(pos_weight, ignore_index, reduction, validate_args)


class BinarySoftTruncatedLoss(_BinaryLoss):
    """Sigmoid soft truncation (:func:`~lightning_losses.functional.binary_soft_truncated_loss`).

    ``pos_weight`` (a buffer) and ``ignore_index`` as in :class:`BinaryFocalLoss`.

    Example:
        >>> BinarySoftTruncatedLoss(k=1.0)(torch.tensor([2.0]), torch.tensor([1.0]))
        tensor(0.0151)
        >>> BinarySoftTruncatedLoss(k=1.0)(torch.tensor([2.0, 0.0]), torch.tensor([1.0, -100.0]))
        tensor(0.0151)
    """

    function = staticmethod(LF.binary_soft_truncated_loss)
    check = staticmethod(check_soft_truncated)
    hyperparameter_names = ("k",)

    def __init__(
        self,
        *,
        k: float = 1.0,
        pos_weight: Sequence[float] | Tensor | None = None,
        ignore_index: int | None = -100,
        reduction: str = "mean",
        validate_args: bool = True,
    ) -> None:
        super().__init__()
        self.k = k
        self._set_binary_options(pos_weight, ignore_index, reduction, validate_args)


class BinaryHardTruncatedLoss(_BinaryLoss):
    """Sigmoid hard truncation (:func:`~lightning_losses.functional.binary_hard_truncated_loss`).

    ``pos_weight`` (a buffer) and ``ignore_index`` as in :class:`BinaryFocalLoss`.

    Example:
        >>> BinaryHardTruncatedLoss(margin=0.5)(torch.tensor([-1.0]), torch.tensor([1.0]))
        tensor(1.3133)
    """

    function = staticmethod(LF.binary_hard_truncated_loss)
    check = staticmethod(check_hard_truncated)
    hyperparameter_names = ("margin",)

    def __init__(
        self,
        *,
        margin: float = 0.5,
        pos_weight: Sequence[float] | Tensor | None = None,
        ignore_index: int | None = -100,
        reduction: str = "mean",
        validate_args: bool = True,
    ) -> None:
        super().__init__()
        self.margin = margin
        self._set_binary_options(pos_weight, ignore_index, reduction, validate_args)


class EXACTLoss(FunctionalLoss):
    """EXACT, the noisy-argmax accuracy (:func:`~lightning_losses.functional.exact_loss`).

    ``sigma`` is a float attribute (schedulable); for the paper's per-sample scale network,
    call :func:`~lightning_losses.functional.exact_loss` with a tensor ``sigma``.

    Example:
        >>> EXACTLoss(sigma=1.0)(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
        tensor(0.2398)
    """

    function = staticmethod(LF.exact_loss)
    check = staticmethod(check_exact)
    hyperparameter_names = ("sigma",)
    option_names = ("log", "n_nodes", "ignore_index", "reduction", "validate_args")

    def __init__(
        self,
        *,
        sigma: float = 1.0,
        log: bool = False,
        n_nodes: int = 32,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        validate_args: bool = True,
    ) -> None:
        super().__init__()
        check_no_label_smoothing(type(self).__name__, label_smoothing)
        self.sigma = sigma
        self.log = log
        self.n_nodes = n_nodes
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args

    def check_hyperparameters(self) -> None:
        """As :meth:`FunctionalLoss.check_hyperparameters`, and ``log`` and ``n_nodes``."""
        super().check_hyperparameters()
        check_exact_options(log=self.log, n_nodes=self.n_nodes)


class MultilabelCategoricalCrossEntropyLoss(FunctionalLoss):
    """Multi-label softmax cross-entropy (:func:`~lightning_losses.functional.multilabel_categorical_crossentropy`).

    Example:
        >>> loss = MultilabelCategoricalCrossEntropyLoss()
        >>> loss(torch.tensor([[3.0, -2.0, 0.5]]), torch.tensor([[1.0, 0.0, 1.0]]))
        tensor(0.6315)
    """  # noqa: E501

    function = staticmethod(LF.multilabel_categorical_crossentropy)
    option_names = ("ignore_index", "reduction", "validate_args")

    def __init__(
        self, *, ignore_index: int = -100, reduction: str = "mean", validate_args: bool = True
    ) -> None:
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.validate_args = validate_args


class NMCategoricalCrossEntropyLoss(FunctionalLoss):
    """Cross-entropy for n tasks of m classes (:func:`~lightning_losses.functional.nm_categorical_crossentropy`).

    Example:
        >>> loss = NMCategoricalCrossEntropyLoss(variant="pairwise")
        >>> loss(torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]), torch.tensor([[0, 1]]))
        tensor(0.7910)
    """  # noqa: E501

    function = staticmethod(LF.nm_categorical_crossentropy)
    option_names = ("variant", "reduction", "validate_args")

    def __init__(
        self, *, variant: str = "pairwise", reduction: str = "mean", validate_args: bool = True
    ) -> None:
        super().__init__()
        self.variant = variant
        self.reduction = reduction
        self.validate_args = validate_args

    def check_hyperparameters(self) -> None:
        """As :meth:`FunctionalLoss.check_hyperparameters`, and ``variant``."""
        super().check_hyperparameters()
        check_nm(self.variant)


class _BatchPenaltyLoss(FunctionalLoss):
    """Base of the losses with a batch-level calibration penalty (MDCA, DCA, MMCE): options.

    ``global_batch`` is an option, not a hyper-parameter: ``False`` (the authors' form) takes
    the penalty of each rank's own batch, ``True`` that of the batch of all ranks of the default
    process group (:mod:`lightning_losses.functional.global_batch`). ``label_smoothing`` is
    accepted as 0 only, so that a config may keep the key.
    """

    option_names = ("ignore_index", "reduction", "global_batch", "validate_args", "backend")

    ignore_index: int
    reduction: str
    global_batch: bool
    validate_args: bool
    backend: str

    def _set_options(
        self,
        label_smoothing: float,
        ignore_index: int,
        reduction: str,
        global_batch: bool,
        validate_args: bool,
        backend: str,
    ) -> None:
        check_no_label_smoothing(type(self).__name__, label_smoothing)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.global_batch = global_batch
        self.validate_args = validate_args
        self.backend = backend

    def check_hyperparameters(self) -> None:
        """As :meth:`FunctionalLoss.check_hyperparameters`, and ``global_batch``."""
        super().check_hyperparameters()
        check_flag("global_batch", self.global_batch)


class MDCALoss(_BatchPenaltyLoss):
    """Cross-entropy (or focal) plus ``beta`` times MDCA (:func:`~lightning_losses.functional.calibration_penalties.mdca_loss`).

    ``beta`` (``>= 0``, default 1) and ``gamma`` (``>= 0``, default 0: cross-entropy; ``> 0``:
    focal loss as the base, the authors' "FL+MDCA") are plain attributes, open to a schedule
    (:class:`~lightning_losses.callbacks.LossScheduler` over ``"beta"``).

    Example:
        >>> loss = MDCALoss(beta=1.0)
        >>> loss(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 0]))
        tensor(0.7196)
        >>> loss.beta = 0.0  # cross-entropy alone
        >>> loss(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 0]))
        tensor(0.4100)
    """  # noqa: E501

    function = staticmethod(mdca_loss)
    check = staticmethod(check_mdca)
    hyperparameter_names = ("beta", "gamma")

    def __init__(
        self,
        *,
        beta: float = 1.0,
        gamma: float = 0.0,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        global_batch: bool = False,
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.beta = beta
        self.gamma = gamma
        self._set_options(
            label_smoothing, ignore_index, reduction, global_batch, validate_args, backend
        )


class DCALoss(_BatchPenaltyLoss):
    """Cross-entropy plus ``beta`` times DCA (:func:`~lightning_losses.functional.calibration_penalties.dca_loss`).

    ``beta`` (``>= 0``, default 10, the authors') is a plain attribute, open to a schedule.

    Example:
        >>> loss = DCALoss(beta=1.0)
        >>> loss(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        tensor(1.0260)
    """  # noqa: E501

    function = staticmethod(dca_loss)
    check = staticmethod(check_dca)
    hyperparameter_names = ("beta",)

    def __init__(
        self,
        *,
        beta: float = 10.0,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        global_batch: bool = False,
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.beta = beta
        self._set_options(
            label_smoothing, ignore_index, reduction, global_batch, validate_args, backend
        )


class MMCELoss(_BatchPenaltyLoss):
    """Cross-entropy plus ``lambda_`` times MMCE_m squared (:func:`~lightning_losses.functional.calibration_penalties.mmce_loss`).

    ``lambda_`` (``>= 0``, default 1) is a plain attribute, open to a schedule.

    Example:
        >>> loss = MMCELoss(lambda_=1.0)
        >>> loss(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 1]))
        tensor(0.4646)
    """  # noqa: E501

    function = staticmethod(mmce_loss)
    check = staticmethod(check_mmce)
    hyperparameter_names = ("lambda_",)

    def __init__(
        self,
        *,
        lambda_: float = 1.0,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        global_batch: bool = False,
        validate_args: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.lambda_ = lambda_
        self._set_options(
            label_smoothing, ignore_index, reduction, global_batch, validate_args, backend
        )


class LinearTargetLoss(nn.Module):
    """A target-probability loss over a linear head, chunk by chunk (:func:`~lightning_losses.functional.linear_target_loss`).

    For language models: ``forward(hidden, weight, target, bias=None)`` takes the final hidden
    states ``[N, H]`` or ``[B, L, H]`` and the output weight ``[V, H]`` (e.g. a tied embedding)
    instead of logits, so the ``[N, V]`` logits are never built. ``loss(hidden @ weight.T +
    bias)`` is ``phi(log p_t)`` of the family member named by ``loss``. Its hyper-parameters
    are plain attributes, and only those of ``loss`` exist: :class:`~lightning_losses.callbacks.GammaAnnealing`
    sets ``criterion.gamma`` of a ``"gamma_ce"`` criterion.

    Args:
        loss: ``ce``, ``gamma_ce``, ``soft_accuracy``, ``focal``, ``adaptive_focal``,
            ``hard_truncated`` or ``poly1``.
        gamma: ``gamma_ce`` (default 0.5) or ``focal`` (default 2).
        threshold: ``gamma_ce`` (default 0).
        thresholds: ``adaptive_focal`` (default ``(0.2,)``).
        gammas: ``adaptive_focal`` (default ``(5, 3)``).
        margin: ``hard_truncated`` (default 0.5).
        epsilon: ``poly1`` (default 1).
        label_smoothing: ``ce`` and ``gamma_ce`` (default 0): ``eps`` in ``[0, 1)``, the
            loss ``(1 - eps) * w_t * phi(log p_t) + eps / V * sum_c w_c (-log p_c)`` of
            :func:`~lightning_losses.functional.cross_entropy` and
            :func:`~lightning_losses.functional.gamma_cross_entropy` (TaiLr's form), still
            chunked. The other losses accept only 0. Shown in the representation when not 0.
        class_weight: optional ``[V]`` weight per class (a buffer, saved in the state dict);
            ``"mean"`` divides by the sum of the weights of the counted rows, as
            :func:`torch.nn.functional.cross_entropy` does.
        chunk_size: rows per chunk; ``None`` chooses one from the shapes.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        half_matmul: multiply half-precision inputs in half precision (faster, less exact).
        z_loss: coefficient ``z >= 0`` of PaLM's z-loss, ``z lse^2`` added per token (default 0).
        backend: ``"auto"``, ``"triton"`` (the Triton kernels of
            :mod:`lightning_losses.kernels.linear_head`) or ``"torch"``; see
            :func:`~lightning_losses.functional.linear_target_loss`.
        validate_args: check target values (one device synchronisation).

    ``forward(..., token_weight=u)`` weighs token ``i``'s loss by ``u_i`` (finite, ``>= 0``,
    the shape of ``target``); ``"mean"`` then divides by ``sum_i u_i c_{t_i}`` over the
    non-ignored tokens (``c`` the class weights, 1 without them).

    Raises:
        ValueError: unknown ``loss``, a hyper-parameter ``loss`` does not take, or a value out
            of range.

    Example:
        >>> criterion = LinearTargetLoss("gamma_ce", gamma=0.0)
        >>> hidden, weight = torch.eye(2), torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
        >>> criterion(hidden, weight, torch.tensor([0, 2]))  # cross-entropy at gamma = 0
        tensor(0.6691)
        >>> criterion.gamma = 1.0  # the expected error 1 - p_t
        >>> criterion(hidden, weight, torch.tensor([0, 2]))
        tensor(0.4398)
    """  # noqa: E501

    class_weight: Tensor | None  # a buffer

    def __init__(
        self,
        loss: str = "gamma_ce",
        *,
        gamma: float | None = None,
        threshold: float | None = None,
        thresholds: Sequence[float] | None = None,
        gammas: Sequence[float] | None = None,
        margin: float | None = None,
        epsilon: float | None = None,
        label_smoothing: float | None = None,
        class_weight: Sequence[float] | Tensor | None = None,
        chunk_size: int | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        half_matmul: bool = False,
        z_loss: float = 0.0,
        backend: str = "auto",
        validate_args: bool = True,
    ) -> None:
        super().__init__()
        given = {
            "gamma": gamma,
            "threshold": threshold,
            "thresholds": thresholds,
            "gammas": gammas,
            "margin": margin,
            "epsilon": epsilon,
            "label_smoothing": label_smoothing,
        }
        _, resolved = resolve_loss(loss, {k: v for k, v in given.items() if v is not None})
        self.loss = loss
        for name, value in resolved.items():
            setattr(self, name, value)
        weights = (
            None if class_weight is None else torch.as_tensor(class_weight, dtype=torch.float32)
        )
        self.register_buffer("class_weight", weights)
        self.chunk_size = chunk_size
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.half_matmul = half_matmul
        self.z_loss = z_loss
        self.backend = backend
        self.validate_args = validate_args
        self.check_hyperparameters()

    def hyperparameters(self) -> dict[str, Any]:
        """The current hyper-parameters of ``loss``, by name (e.g. ``{"gamma": 0.5, ...}``)."""
        return {name: getattr(self, name) for name in LINEAR_TARGET_LOSSES.get(self.loss, {})}

    def check_hyperparameters(self) -> None:
        """Check the current ``loss``, its hyper-parameters and the options as a call would.

        The hyper-parameters go through the checks of the plain-logits loss of the same name;
        ``class_weight`` must be 1-D (and finite and ``>= 0`` when ``validate_args``). Runs at
        the end of the constructor; a schedule that assigns an attribute may call it.

        Raises:
            ValueError: unknown ``loss`` or a value out of range, naming the attribute.
            TypeError: a value of the wrong type.
        """
        resolve_loss(self.loss, self.hyperparameters())
        check_loss_options(
            {
                "reduction": self.reduction,
                "ignore_index": self.ignore_index,
                "validate_args": self.validate_args,
                "class_weight": self.class_weight,
            }
        )
        check_chunk_size(self.chunk_size)
        check_flag("half_matmul", self.half_matmul)
        check_real("z_loss", self.z_loss, low=0.0)
        check_choice("backend", self.backend, ("auto", "triton", "torch"))

    def forward(
        self,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        bias: Tensor | None = None,
        token_weight: Tensor | None = None,
    ) -> Tensor:
        """The loss of the head ``hidden @ weight.T + bias`` for ``target``, chunk by chunk."""
        return LF.linear_target_loss(
            hidden,
            weight,
            target,
            loss=self.loss,
            bias=bias,
            class_weight=self.class_weight,
            chunk_size=self.chunk_size,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            half_matmul=self.half_matmul,
            token_weight=token_weight,
            z_loss=self.z_loss,
            backend=self.backend,
            validate_args=self.validate_args,
            **self.hyperparameters(),
        )

    def extra_repr(self) -> str:
        """The loss, its hyper-parameters and ``reduction``, for ``repr``."""
        shown = {"loss": self.loss, **self.hyperparameters(), "reduction": self.reduction}
        if _is_zero(shown.get("label_smoothing")):
            del shown["label_smoothing"]
        if not _is_zero(self.z_loss):
            shown["z_loss"] = self.z_loss
        return ", ".join(f"{name}={value!r}" for name, value in shown.items())
