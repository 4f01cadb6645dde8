"""Calibration callbacks: metrics and reliability diagrams every validation, temperature scaling."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

STAGES = ("val", "test")


def calibration_inputs(outputs: Any, pl_module: pl.LightningModule) -> tuple[Tensor, Tensor]:
    """``(logits, target)`` from a ``validation_step`` output, reshaped for the metrics.

    ``[N, n, m]`` logits of n-by-m tasks become ``[N * n, m]`` with ``[N * n]`` targets (each task
    is a multiclass prediction); everything else is passed as it is.
    """
    if not isinstance(outputs, Mapping) or "logits" not in outputs or "target" not in outputs:
        got = type(outputs).__name__
        if isinstance(outputs, Mapping):
            got = f"a dict with keys {sorted(outputs)}"
        raise ValueError(
            f"the calibration callbacks need {type(pl_module).__name__}.validation_step (and "
            "test_step) to return a dict with 'logits' and 'target' (LossMixin."
            f"validation_output(logits, target) builds it); got {got}"
        )
    logits, target = outputs["logits"].detach(), outputs["target"].detach()
    if logits.dim() == 3 and target.dim() == 2:
        logits, target = logits.flatten(0, 1), target.flatten()
    return logits, target


def _draw(bins: tuple[Tensor, ...], path: Path, title: str, artifact_loggers: list[Any]) -> None:
    from lightning_losses.calibration.diagram import reliability_diagram

    path.parent.mkdir(parents=True, exist_ok=True)
    reliability_diagram(*bins, path=path, title=title)
    for log_file in artifact_loggers:
        log_file(str(path), artifact_path="calibration")


class CalibrationMonitor(Callback):
    """Log calibration metrics each validation (and test) epoch, and save reliability diagrams.

    Works with any LightningModule whose ``validation_step`` returns ``{"logits": ...,
    "target": ...}`` (:meth:`lightning_losses.LossMixin.validation_output`). Per stage it logs,
    through ``pl_module.log`` so that every logger gets them: ``<stage>/ece``, ``<stage>/mce``,
    ``<stage>/rmsce`` (equal-width bins), ``<stage>/brier``, ``<stage>/nll``,
    ``<stage>/accuracy``, ``<stage>/confidence``, and optionally ``<stage>/adaptive_ece`` and
    ``<stage>/classwise_ece``. The metrics are torchmetrics ``Metric`` s: under DDP they reduce
    their per-bin sums across processes, so the logged values are those of the whole
    validation set.

    The reliability diagram, drawn from the metric's own bins, is saved as
    ``<log_dir>/calibration/<stage>_epoch=<E>.png`` and, when the logger is MLflow's, logged as
    an artifact under ``calibration/``: for the last validation epoch at the end of training
    (``final_diagram``), after each test, and every ``diagram_every_n_epochs`` validation
    epochs if asked. Drawing happens in a background thread; the end of training and of test
    wait for the pending diagrams, so they are logged before the logger closes the run.

    Every metric comes from one :class:`~lightning_losses.calibration.CalibrationSummary`, one
    pass per validation batch.

    Args:
        n_bins: equal-width bins.
        input_format: what ``logits`` holds: ``"logits"`` or ``"probs"``.
        diagram_every_n_epochs: also save a diagram every so many validation epochs (0: only
            the final one). A diagram costs about 90 ms of matplotlib.
        final_diagram: save the diagram of the last validation epoch when training ends.
        adaptive: also log the adaptive (equal-mass) ECE (keeps the confidences: O(N)).
        classwise: also log the classwise ECE (its classes are read from the first batch).

    Example:
        >>> monitor = CalibrationMonitor(n_bins=10, diagram_every_n_epochs=5)
        >>> monitor.n_bins, monitor.input_format, monitor.final_diagram
        (10, 'logits', True)
    """

    def __init__(
        self,
        n_bins: int = 15,
        input_format: str = "logits",
        diagram_every_n_epochs: int = 0,
        final_diagram: bool = True,
        adaptive: bool = False,
        classwise: bool = False,
    ) -> None:
        from lightning_losses.calibration import functional as CF

        CF.check_n_bins(n_bins)
        CF.check_choice("input_format", input_format, CF.INPUT_FORMATS)
        if diagram_every_n_epochs < 0:
            raise ValueError(f"diagram_every_n_epochs must be >= 0; got {diagram_every_n_epochs}")
        self.n_bins = n_bins
        self.input_format = input_format
        self.diagram_every_n_epochs = diagram_every_n_epochs
        self.final_diagram = final_diagram
        self.adaptive = adaptive
        self.classwise = classwise
        self._metrics: dict[str, dict[str, Any]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.last_diagram: Path | None = None
        # (epoch, bins, drawn) of the last validation epoch, for the final diagram.
        self._last_val: tuple[int, tuple[Tensor, ...], bool] | None = None

    def _build(self) -> dict[str, Any]:
        from lightning_losses.calibration import metrics as CM

        # The model's own outputs: no value checks on the hot path (shapes are still checked).
        options = {"input_format": self.input_format, "validate_args": False}
        # One metric, one pass per batch, for the seven equal-width and proper-score numbers.
        built: dict[str, Any] = {"summary": CM.CalibrationSummary(n_bins=self.n_bins, **options)}
        if self.adaptive:
            built["adaptive_ece"] = CM.AdaptiveCalibrationError(n_bins=self.n_bins, **options)
        return built

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for name in STAGES:
            metrics = self._metrics.setdefault(name, self._build())
            for metric in metrics.values():
                metric.to(pl_module.device)

    def _update(self, stage: str, outputs: Any, pl_module: pl.LightningModule) -> None:
        logits, target = calibration_inputs(outputs, pl_module)
        metrics = self._metrics[stage]
        if self.classwise and "classwise_ece" not in metrics and logits.dim() == 2:
            from lightning_losses.calibration.metrics import ClasswiseCalibrationError

            metrics["classwise_ece"] = ClasswiseCalibrationError(
                num_classes=logits.shape[1],
                n_bins=self.n_bins,
                input_format=self.input_format,
                validate_args=False,
            ).to(pl_module.device)
        for metric in metrics.values():
            metric.update(logits, target)

    def _finish(self, stage: str, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = self._metrics[stage]
        summary = metrics["summary"]
        if not int(summary.count.sum()) and not trainer.world_size > 1:
            return  # nothing was validated (e.g. limit_val_batches=0)
        values, bins = summary.compute_with_bins()  # one sync under DDP
        values.update({name: m.compute() for name, m in metrics.items() if name != "summary"})
        pl_module.log_dict(
            {f"{stage}/{name}": value.float() for name, value in values.items()}, sync_dist=False
        )
        epoch = trainer.current_epoch
        every = self.diagram_every_n_epochs
        due = stage == "test" or (every > 0 and (epoch + 1) % every == 0)
        if due and trainer.is_global_zero:
            self._save_diagram(trainer, stage, epoch, bins)
        if stage == "val":
            self._last_val = (epoch, bins, due)
        for metric in metrics.values():
            metric.reset()

    def _save_diagram(
        self, trainer: pl.Trainer, stage: str, epoch: int, bins: tuple[Tensor, ...]
    ) -> None:
        """Draw and save (and log to MLflow) in a background thread: training goes on."""
        run_dir = getattr(trainer.logger, "local_run_dir", None)  # TrackingLogger's run folder
        folder = Path(run_dir or trainer.log_dir or trainer.default_root_dir) / "calibration"
        path = folder / f"{stage}_epoch={epoch:03d}.png"
        artifact_loggers = []
        for logger in trainer.loggers:
            log_file = getattr(logger, "log_file", None)  # TrackingLogger: spools on failure
            if callable(log_file):
                artifact_loggers.append(log_file)
                continue
            run_id = getattr(logger, "run_id", None)
            log_artifact = getattr(getattr(logger, "experiment", None), "log_artifact", None)
            if run_id is not None and callable(log_artifact):  # a plain MLFlowLogger
                artifact_loggers.append(functools.partial(log_artifact, run_id))
        bins = tuple(b.detach().cpu() for b in bins)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagram")
        self._pending.append(
            self._executor.submit(_draw, bins, path, f"{stage}, epoch {epoch}", artifact_loggers)
        )
        self.last_diagram = path

    def wait(self) -> None:
        """Block until every diagram submitted so far is written (errors are raised here)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        last, self._last_val = self._last_val, None
        if self.final_diagram and last is not None and not last[2] and trainer.is_global_zero:
            self._save_diagram(trainer, "val", last[0], last[1])
        self.wait()  # before the logger closes the run

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.wait()

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.wait()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.wait()

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self._update("val", outputs, pl_module)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._finish("val", trainer, pl_module)

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update("test", outputs, pl_module)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish("test", trainer, pl_module)


class TemperatureScalingCallback(Callback):
    """At the end of fit, fit a temperature on the last validation epoch's logits and log it.

    Logs ``calibration/temperature`` and the validation ECE and NLL before and after scaling
    (``calibration/val_ece_before``, ``..._after``, ``calibration/val_nll_before``, ``..._after``)
    to every logger, and keeps them in :attr:`report`. Under DDP the logits of all processes
    are gathered first. Multiclass ``[N, C]`` and binary ``[N]`` logits (n-by-m tasks are
    flattened to multiclass); multi-label outputs are skipped with a warning.

    With ``apply_to_model=True`` and a model that has a ``temperature`` attribute (such as
    :class:`lightning_losses.models.ClassifierModule`), that attribute is multiplied by the
    fitted value, so later predictions are calibrated.

    Args:
        n_bins: bins of the reported ECE.
        max_iter: LBFGS iterations of the fit.
        apply_to_model: scale ``pl_module.temperature`` by the fitted temperature.
    """

    def __init__(self, n_bins: int = 15, max_iter: int = 100, apply_to_model: bool = False):
        self.n_bins = n_bins
        self.max_iter = max_iter
        self.apply_to_model = apply_to_model
        self._logits: list[Tensor] = []
        self._targets: list[Tensor] = []
        self.report: dict[str, float] = {}

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        self._logits, self._targets = [], []

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking:
            return
        logits, target = calibration_inputs(outputs, pl_module)
        self._logits.append(logits.float())
        self._targets.append(target)

    def _gathered(self, trainer: pl.Trainer) -> tuple[Tensor, Tensor]:
        logits, target = torch.cat(self._logits), torch.cat(self._targets)
        if trainer.world_size > 1:
            logits = trainer.strategy.all_gather(logits).flatten(0, 1)
            target = trainer.strategy.all_gather(target).flatten(0, 1)
        return logits, target

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from lightning_losses.calibration.scaling import TemperatureScaler

        if not self._logits:
            rank_zero_warn("TemperatureScalingCallback: no validation outputs to fit on")
            return
        logits, target = self._gathered(trainer)
        if logits.dim() == 2 and target.dim() == 2:
            rank_zero_warn("TemperatureScalingCallback: multi-label outputs are not scaled")
            return
        scaler = TemperatureScaler(max_iter=self.max_iter).fit(logits, target)
        report = scaler.report(logits, target, n_bins=self.n_bins)
        self.report = {key: float(value) for key, value in report.items()}
        if self.apply_to_model and hasattr(pl_module, "temperature"):
            pl_module.temperature = pl_module.temperature * self.report["temperature"]
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


__all__: Sequence[str] = ("CalibrationMonitor", "TemperatureScalingCallback", "calibration_inputs")
