"""Temperature scaling inside the Trainer: :class:`PostHocCalibration` with one method.

Fitted at every validation epoch on the gathered validation logits, saved in each checkpoint,
applied at ``test`` and ``predict`` (or, with ``apply_to_model=True``, folded into the model's
own ``temperature``); logs the historical ``calibration/*`` keys.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
from torch import Tensor
from typing_extensions import override

from lightning_losses.callbacks.outputs import OutputsSpec
from lightning_losses.callbacks.posthoc import PostHocCalibration
from lightning_losses.callbacks.posthoc_parts import quiet_fits
from lightning_losses.functional.checks import check_flag, check_ignore_index

if TYPE_CHECKING:
    from lightning_losses.calibration.posthoc.base import PostHocCalibrator
    from lightning_losses.calibration.posthoc.select import Selection

__all__ = ["TemperatureScalingCallback"]


def _scale_temperature(module: Any, factor: float) -> None:
    """Multiply ``module.temperature`` (any module's divisor of its logits) by ``factor``."""
    module.temperature = module.temperature * factor


class TemperatureScalingCallback(PostHocCalibration):
    """Temperature scaling fitted on each validation epoch: ``PostHocCalibration`` of one method.

    The temperature is fitted (not chosen against the identity) on the gathered validation
    logits of every validation epoch, saved in the checkpoint like any
    :class:`PostHocCalibration`'s calibrator, and applied at ``test`` and ``predict``. Logs
    ``calibration/temperature`` and the validation ECE and NLL before and after scaling
    (``calibration/val_ece_before``, ``..._after``, ``calibration/val_nll_before``, ``..._after``)
    to every logger, and keeps them in :attr:`report`. Under DDP the logits of all processes
    are gathered first (processes may hold different numbers of samples, as with
    :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler`), so the fit is that of
    one process over the whole validation set. Multiclass ``[N, C]`` and binary ``[N]`` logits
    (n-by-m tasks are flattened to multiclass); ``[N, C]`` float targets are multi-label
    outputs, skipped with a warning, unless ``soft_labels=True`` says they are soft labels (each
    row a distribution over the classes: annotator votes, mixup or distillation targets), which
    the fit then takes as :meth:`TemperatureScaler.fit
    <lightning_losses.calibration.posthoc.temperature.TemperatureScaler.fit>` does.

    With ``apply_to_model=True`` the model's ``temperature`` attribute (such as that of
    :class:`lightning_losses.lightning.classifier.ClassifierModule`) is multiplied by the
    fitted value when fit ends, so later predictions are calibrated by the model itself (the
    callback then leaves ``test`` and ``predict`` outputs alone); a model without one is an
    error at set-up, before any training step.

    Args:
        n_bins: bins of the reported ECE.
        max_iter: LBFGS iterations of the fit.
        apply_to_model: scale ``pl_module.temperature`` by the fitted temperature.
        ignore_index: leave out the samples whose target equals it (padding tokens), in the
            fit and in the report; ``None`` keeps all.
        soft_labels: ``[N, C]`` float targets are soft labels (rows summing to 1), not
            multi-label ones; cannot be combined with ``ignore_index``.
        outputs: how to read the logits and targets from what ``validation_step`` returns, as
            :class:`~lightning_losses.callbacks.CalibrationMonitor`'s ``outputs`` (``None``: the
            ``{"logits", "target"}`` dict).

    Example:
        >>> TemperatureScalingCallback(soft_labels=True).soft_labels
        True
    """

    MULTILABEL: ClassVar[str] = (
        "multi-label outputs are not scaled (pass soft_labels=True if the [N, C] targets are "
        "soft labels)"
    )

    def __init__(
        self,
        n_bins: int = 15,
        max_iter: int = 100,
        apply_to_model: bool = False,
        ignore_index: int | None = None,
        soft_labels: bool = False,
        outputs: OutputsSpec = None,
    ) -> None:
        if ignore_index is not None:
            check_ignore_index(ignore_index)
        check_flag("soft_labels", soft_labels)
        check_flag("apply_to_model", apply_to_model)
        if soft_labels and ignore_index is not None:
            raise ValueError(
                "ignore_index applies to integer class labels; with soft_labels=True leave it "
                f"None and drop the rows of soft labels instead (got ignore_index={ignore_index})"
            )
        super().__init__(
            methods=("temperature",),
            method_args={"temperature": {"max_iter": max_iter}},
            n_bins=n_bins,
            ignore_index=ignore_index,
            outputs=outputs,
            log_diagrams=False,
        )
        self.max_iter = max_iter
        self.apply_to_model = apply_to_model
        self.soft_labels = soft_labels

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.apply_to_model and not hasattr(pl_module, "temperature"):
            raise ValueError(
                f"TemperatureScalingCallback(apply_to_model=True) scales "
                f"{type(pl_module).__name__}.temperature, which it does not have: give the "
                "module a `temperature` that divides its logits (ClassifierModule has one), "
                "or use apply_to_model=False to fit and log the temperature only"
            )
        super().setup(trainer, pl_module, stage)

    def _select(self, logits: Tensor, target: Tensor) -> Selection:
        """The temperature fitted on all samples (integer or soft labels), never the identity."""
        from lightning_losses.calibration.posthoc.select import Selection

        scaler = copy.deepcopy(self._templates["temperature"])
        with quiet_fits():  # a fallback or a bound is warned once per fit by the callback
            scaler.fit(logits, target, ignore_index=self.ignore_index)
        fallbacks = {"temperature": scaler.fallback} if scaler.fallback else {}
        self._warn_fallbacks(fallbacks)
        return Selection("temperature", scaler, {}, 0, fallbacks)

    def _after_fit(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, logits: Tensor, target: Tensor
    ) -> None:
        """Log the historical keys, from the scaler's own report."""
        scaler: Any = self.calibrator
        report = scaler.report(logits, target, n_bins=self.n_bins, ignore_index=self.ignore_index)
        self.report = {key: float(value) for key, value in report.items()}
        metrics = {
            "calibration/temperature": self.report["temperature"],
            "calibration/val_ece_before": self.report["ece_before"],
            "calibration/val_ece_after": self.report["ece_after"],
            "calibration/val_nll_before": self.report["nll_before"],
            "calibration/val_nll_after": self.report["nll_after"],
        }
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_end(trainer, pl_module)
        if self.apply_to_model and "temperature" in self.report:
            _scale_temperature(pl_module, self.report["temperature"])

    def _applied(self, trainer: pl.Trainer, stage: str) -> PostHocCalibrator | None:
        """``None`` with ``apply_to_model``: the model divides by the temperature itself."""
        if self.apply_to_model:
            return None
        return super()._applied(trainer, stage)
