"""Calibration metrics and reliability diagrams every validation epoch: ``CalibrationMonitor``.

Post-hoc calibration (and ``TemperatureScalingCallback``) is in :mod:`.posthoc`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from lightning_losses.callbacks.artifacts import (
    artifact_loggers,
    diagram_task,
    diagram_title,
    figure_folder,
)
from lightning_losses.callbacks.gather import all_gather_uneven
from lightning_losses.callbacks.outputs import OutputAdapter, OutputsSpec, calibration_inputs
from lightning_losses.functional.checks import check_flag, sum_tolerances

if TYPE_CHECKING:
    from lightning_losses.calibration.functional import InputFormat

STAGES = ("val", "test")
#: Names under which a module may log a quantity the monitor computes (the monitor then leaves
#: it to the module): ClassifierModule logs its accuracy as ``<stage>/acc``.
ALIASES = {"accuracy": ("accuracy", "acc")}
#: What a diagram is drawn from: the equal-width bins, and the smooth ECE's grid (or None).
DiagramState = tuple[tuple[Tensor, ...], tuple[Tensor, Tensor] | None]


def _draw(
    state: DiagramState,
    paths: tuple[Path, Path],
    title: str,
    loggers: list[Any],
    level: float | None = None,
    task: str = "multiclass",
) -> None:
    """The binned diagram at ``paths[0]`` and, with a grid, the smoothed one at ``paths[1]``.

    ``level``: draw each bin's Wilson interval of its accuracy at that level; ``task``: what
    the bins hold, for the axes (binary: ``P(positive)``).
    """
    from lightning_losses.calibration.diagram import reliability_diagram

    bins, grid = state
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    reliability_diagram(*bins, path=paths[0], title=title, level=level, task=task)
    written = [paths[0]]
    if grid is not None:
        from lightning_losses.calibration.smooth_diagram import smooth_reliability_diagram

        smooth_reliability_diagram(*grid, path=paths[1], title=title, task=task)
        written.append(paths[1])
    for path in written:
        for log_file in loggers:
            log_file(str(path), artifact_path="calibration")


class CalibrationMonitor(Callback):
    """Log calibration metrics each validation (and test) epoch, and save reliability diagrams.

    Works with any LightningModule whose ``validation_step`` returns ``{"logits": ...,
    "target": ...}`` (:meth:`lightning_losses.LossMixin.validation_output`), or any other output
    that ``outputs`` reads (a key mapping or a callable, see
    :mod:`lightning_losses.callbacks.outputs`). Per stage it logs,
    through ``pl_module.log`` so that every logger gets them: ``<stage>/ece``, ``<stage>/mce``,
    ``<stage>/rmsce`` (equal-width bins), ``<stage>/brier``, ``<stage>/nll``,
    ``<stage>/accuracy``, ``<stage>/confidence``, and optionally ``<stage>/adaptive_ece``,
    ``<stage>/classwise_ece`` and ``<stage>/smooth_ece`` (the smooth ECE of Błasiok and
    Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing", ICLR 2024).
    The metrics are torchmetrics ``Metric`` s: under DDP they reduce their per-bin sums
    across processes, so the logged values are those of the whole validation set.

    The reliability diagram, drawn from the metric's own bins, is saved as
    ``<log_dir>/calibration/<stage>_epoch=<E>.png`` and, when the logger is MLflow's, logged as
    an artifact under ``calibration/``. ``E`` is the epoch the model's weights are from: the
    current epoch during fit; for ``validate`` / ``test`` the epoch of the checkpoint loaded
    (``ckpt_path``), else the last epoch trained by this trainer; a model never trained is
    ``<stage>_untrained.png``. With ``smooth=True`` the smoothed reliability diagram is saved
    beside it as ``<stage>_smooth_epoch=<E>.png`` (``<stage>_smooth_untrained.png``), from the
    summary's own grid. Diagrams are drawn for the last validation epoch at the end of
    training (``final_diagram``), after each test, and every ``diagram_every_n_epochs``
    validation epochs if asked. Drawing happens in a background thread; the end of training and
    of test wait for the pending diagrams, so they are logged before the logger closes the run.

    Every metric comes from one :class:`~lightning_losses.calibration.CalibrationSummary`, one
    pass per validation batch. Its NLL and accuracy are by-products of that pass, not a second
    evaluation: for multiclass logits the NLL terms come out of the float64 log-softmax that
    the Brier score needs (:func:`~lightning_losses.functional.evaluation.log_softmax_nll`,
    the one home of the formula that the module's own ``val/nll`` uses too) and the accuracy
    is the top-label hit that the ECE bins need; binary and multi-label logits add one
    elementwise binary cross-entropy over the labels
    (:func:`~lightning_losses.functional.evaluation.nll_terms`). So the monitor always
    computes them, also when the module logs them itself (it then only leaves the names to the
    module, see below), and never reads the module's values instead: a plain LightningModule
    need not log them, :class:`~lightning_losses.lightning.classifier.ClassifierModule` logs
    float32 terms, and the bootstrap intervals of ``nll`` and ``accuracy`` need the float64
    per-sample terms.

    Error bars: with ``debiased=True`` it also logs ``<stage>/ece_debiased`` and
    ``<stage>/rmsce_debiased`` (the debiased ECE and l2 calibration error of Kumar, Liang and
    Ma, "Verified Uncertainty Calibration", NeurIPS 2019). With ``intervals=True`` it logs
    ``<stage>/<name>_low`` and ``<stage>/<name>_high`` at ``level`` for ``ece``, ``nll``,
    ``brier``, ``accuracy`` and, with ``smooth=True``, ``smooth_ece`` (also when the module logs
    the value itself), from ``n_bootstrap`` Poisson-bootstrap replicates whose weights depend
    only on ``(seed, sample position)``; the reliability diagram then draws each bin's Wilson
    interval of its accuracy at ``level``. Sample positions are counted per process in loader
    order (``rank + world_size * k`` for the ``k``-th sample of a process): the dataset
    position under :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler` and
    Lightning's default unshuffled evaluation sampler, so the intervals are then the same on
    any number of processes (see :class:`~lightning_losses.calibration.CalibrationSummary`).

    Names the module logs itself are the module's: the monitor never logs a key that something
    else logs for the stage. :class:`~lightning_losses.lightning.classifier.ClassifierModule`
    logs its own ``val/nll`` (what the example configs' ``ModelCheckpoint`` monitors), so with
    it the monitor leaves ``val/nll`` alone, and ``val/accuracy`` too since the module logs it
    as ``val/acc``; it logs the five others. It recognises those keys as the
    keys of ``trainer.callback_metrics`` it did not log itself: the ones logged in
    ``validation_step`` / ``test_step`` as its epoch ends, and the ones logged in the module's
    own epoch-end hooks (which run after the callbacks') at the end of each evaluation, the
    sanity check included, so from the next epoch on.

    With ``input_format="probs"`` the first batch of each validation (sanity check included,
    so before any training step) and test epoch is checked: values in [0, 1] and, for
    multiclass ``[N, C]``, rows that sum to 1 (within the calibration functions' tolerance:
    1e-3 for float32 and float64, 3.9e-3 for float16 and 0.031 for bfloat16 values, also when
    cast to a wider dtype; see :func:`~lightning_losses.functional.checks.sum_tolerances`);
    otherwise a ``ValueError`` says what was seen (a model that returns logits would silently
    give a wrong ECE). The first batch's multiclass targets are checked too: each in ``[0, C)``
    or equal to ``ignore_index``; a padding value such as -100 without ``ignore_index`` is a
    ``ValueError`` that names the criterion's ``ignore_index`` when the module has one.

    ``ignore_index`` (default ``None``: every target counts) drops the samples whose target
    equals it before every metric, as torchmetrics does: set it to the criterion's
    ``ignore_index`` (-100 for the losses here) for padded sequences, whose ``[B, L, C]``
    logits and ``[B, L]`` targets are flattened to tokens (see :func:`calibration_inputs`), and
    the logged numbers are token-level over the real tokens. It is not read from the module
    (the monitor works with any LightningModule); the first-batch check above catches a
    forgotten one. A stage whose targets are all ignored logs nothing, like an empty one.

    Args:
        n_bins: equal-width bins.
        input_format: what ``logits`` holds: ``"logits"`` or ``"probs"``.
        diagram_every_n_epochs: also save a diagram every so many validation epochs (0: only
            the final one). A diagram costs about 90 ms of matplotlib.
        final_diagram: save the diagram of the last validation epoch when training ends.
        adaptive: also log the adaptive (equal-mass) ECE (keeps the confidences: O(N)).
        classwise: also log the classwise ECE (its classes are read from the first batch).
        ignore_index: target value whose samples are left out (``None``: none), an int.
        smooth: also log the smooth ECE and save the smoothed reliability diagram (a grid of
            16,385 float64 pairs per stage, summed across processes; the automatic bandwidth
            search costs a few milliseconds per epoch).
        outputs: how to read the logits and targets from what ``validation_step`` (and
            ``test_step``) returns: ``None`` for the ``{"logits", "target"}`` dict, a mapping
            such as ``{"logits": "y_hat", "target": "y"}`` (dict keys) or ``{"logits": 0,
            "target": 1}`` (tuple positions), a callable ``outputs -> (logits, target)`` or
            its import path (see :mod:`lightning_losses.callbacks.outputs`).
        intervals: also log bootstrap intervals (``<name>_low``, ``<name>_high``) and draw
            per-bin Wilson intervals in the diagram.
        debiased: also log ``ece_debiased`` and ``rmsce_debiased``.
        level: confidence level of the intervals, in (0, 1).
        n_bootstrap: bootstrap replicates (at least 2).
        seed: the replicates' seed (an int in ``[0, 2**63)``).

    Example:
        >>> monitor = CalibrationMonitor(n_bins=10, diagram_every_n_epochs=5)
        >>> monitor.n_bins, monitor.input_format, monitor.final_diagram
        (10, 'logits', True)
        >>> CalibrationMonitor(ignore_index=-100).ignore_index  # padded token targets
        -100
        >>> CalibrationMonitor(outputs={"logits": "y_hat", "target": "y"}).outputs
        {'logits': 'y_hat', 'target': 'y'}
    """

    def __init__(
        self,
        n_bins: int = 15,
        input_format: str = "logits",
        diagram_every_n_epochs: int = 0,
        final_diagram: bool = True,
        adaptive: bool = False,
        classwise: bool = False,
        ignore_index: int | None = None,
        smooth: bool = False,
        outputs: OutputsSpec = None,
        intervals: bool = False,
        debiased: bool = False,
        level: float = 0.95,
        n_bootstrap: int = 200,
        seed: int = 0,
    ) -> None:
        from lightning_losses.calibration import bootstrap as BS
        from lightning_losses.calibration import functional as CF

        self._read = OutputAdapter(outputs, owner="CalibrationMonitor")
        self.outputs = outputs
        CF.check_n_bins(n_bins)
        CF.check_choice("input_format", input_format, CF.INPUT_FORMATS)
        if ignore_index is not None:
            CF.check_ignore_index(ignore_index)
        if diagram_every_n_epochs < 0:
            raise ValueError(f"diagram_every_n_epochs must be >= 0; got {diagram_every_n_epochs}")
        check_flag("smooth", smooth)
        check_flag("intervals", intervals)
        check_flag("debiased", debiased)
        self.intervals = intervals
        self.debiased = debiased
        self.level = BS.check_level(level)
        self.n_bootstrap = BS.check_n_bootstrap(n_bootstrap)
        self.seed = BS.check_seed(seed)
        self.n_bins = n_bins
        self.input_format = cast("InputFormat", input_format)  # one of them: checked above
        self.diagram_every_n_epochs = diagram_every_n_epochs
        self.final_diagram = final_diagram
        self.adaptive = adaptive
        self.classwise = classwise
        self.ignore_index = ignore_index
        self.smooth = smooth
        self._metrics: dict[str, dict[str, Any]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.last_diagram: Path | None = None
        self.last_smooth_diagram: Path | None = None
        # (epoch, (bins, grid), drawn) of the last validation epoch, for the final diagram.
        self._last_val: tuple[int, DiagramState, bool] | None = None
        self._checked: set[str] = set()  # stages whose inputs were checked this epoch
        self._own_keys: set[str] = set()  # keys this monitor has logged
        self._other_keys: set[str] = set()  # keys the module (or anyone else) logs
        self._checkpoint_epoch: int | None = None  # epoch of the checkpoint loaded, if any
        self._task = "multiclass"  # what the bins hold (from the first batch): the axes

    def _build(self) -> dict[str, Any]:
        from lightning_losses.calibration import metrics as CM

        # The model's own outputs: no value checks on the hot path (shapes are still checked).
        # One metric, one pass per batch, for the seven equal-width and proper-score numbers.
        summary = CM.CalibrationSummary(
            n_bins=self.n_bins,
            smooth=self.smooth,
            intervals=self.intervals,
            debiased=self.debiased,
            level=self.level,
            n_bootstrap=self.n_bootstrap,
            seed=self.seed,
            input_format=self.input_format,
            validate_args=False,
            ignore_index=self.ignore_index,
        )
        built: dict[str, Any] = {"summary": summary}
        if self.adaptive:
            built["adaptive_ece"] = CM.AdaptiveCalibrationError(
                n_bins=self.n_bins,
                input_format=self.input_format,
                validate_args=False,
                ignore_index=self.ignore_index,
            )
        return built

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._checkpoint_epoch = None  # set by on_load_checkpoint, which runs after setup
        for name in STAGES:
            metrics = self._metrics.setdefault(name, self._build())
            for metric in metrics.values():
                metric.to(pl_module.device)

    def _update(
        self, stage: str, outputs: Any, pl_module: pl.LightningModule, *, accumulate: bool = True
    ) -> None:
        logits, target = calibration_inputs(outputs, pl_module, self._read)
        if stage not in self._checked:
            self._task = diagram_task(logits, target)  # for the diagrams' axes
            self._check_targets(stage, logits, target, pl_module)
            self._check_probabilities(stage, logits, target)
            self._checked.add(stage)
        if not accumulate:
            return
        metrics = self._metrics[stage]
        if self.classwise and "classwise_ece" not in metrics and logits.dim() == 2:
            from lightning_losses.calibration.metrics import ClasswiseCalibrationError

            metrics["classwise_ece"] = ClasswiseCalibrationError(
                num_classes=logits.shape[1],
                n_bins=self.n_bins,
                input_format=self.input_format,
                validate_args=False,
                ignore_index=self.ignore_index,
            ).to(pl_module.device)
        for metric in metrics.values():
            metric.update(logits, target)

    def _check_targets(
        self, stage: str, logits: Tensor, target: Tensor, pl_module: pl.LightningModule
    ) -> None:
        """Multiclass targets in ``[0, C)`` or equal to ``ignore_index`` (first batch only)."""
        if not (logits.dim() == 2 and target.dim() == 1) or target.numel() == 0:
            return
        if target.is_floating_point() or target.dtype == torch.bool:
            return  # the metrics raise their own TypeError
        num_classes = logits.shape[1]
        bad = (target < 0) | (target >= num_classes)
        if self.ignore_index is not None:
            bad &= target != self.ignore_index
        if not bool(bad.any()):
            return
        value = int(target[bad][0])
        if self.ignore_index is None:
            criterion = getattr(pl_module, "criterion", None)
            own = getattr(criterion, "ignore_index", None)
            hint = (
                f"; padding? the module's criterion ignores {own}: pass "
                f"CalibrationMonitor(ignore_index={own})"
                if own is not None and own == value
                else "; padding? pass CalibrationMonitor(ignore_index=<that value>)"
            )
        else:
            hint = f" and differ from ignore_index={self.ignore_index}"
        raise ValueError(
            f"CalibrationMonitor: the first {stage} batch has the target {value}, but targets "
            f"must lie in [0, {num_classes - 1}] for C={num_classes} classes{hint}"
        )

    def _check_probabilities(self, stage: str, probs: Tensor, target: Tensor) -> None:
        """With ``input_format="probs"``: values in [0, 1], multiclass rows summing to 1."""
        if self.input_format != "probs" or probs.numel() == 0:
            return
        if self.ignore_index is not None and target.shape == probs.shape[: target.dim()]:
            keep = target != self.ignore_index  # rows (multiclass, binary) or entries
            probs, target = probs[keep], target[keep]
            if probs.numel() == 0:
                return
        dtype, probs = probs.dtype, probs.float()
        low, high = (float(v) for v in torch.aminmax(probs))
        if math.isnan(low) or math.isnan(high):
            seen = "NaN values"
        elif low < 0.0 or high > 1.0:
            seen = f"values outside [0, 1]: min {low:.4g}, max {high:.4g}"
        elif probs.dim() == 2 and target.dim() == 1:  # multiclass [N, C]
            sums = probs.sum(dim=1)
            tolerances = sum_tolerances(sums, dtype, values=probs)  # None: all within 1e-3
            if tolerances is None or bool(((sums - 1.0).abs() <= tolerances).all()):
                return
            seen = f"rows that do not sum to 1: sums from {float(sums.min()):.4g} to "
            seen += f"{float(sums.max()):.4g}"
        else:
            return
        raise ValueError(
            f'CalibrationMonitor(input_format="probs") needs probabilities, but the first {stage} '
            f"batch has {seen}; the model returns logits? use input_format='logits'"
        )

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        epoch = checkpoint.get("epoch")
        self._checkpoint_epoch = None if epoch is None else int(epoch)

    def _model_epoch(self, trainer: pl.Trainer) -> int | None:
        """The epoch the model's weights are from; ``None`` for a model never trained."""
        if trainer.training or trainer.state.fn == "fit":
            return trainer.current_epoch
        if self._checkpoint_epoch is not None:
            return self._checkpoint_epoch
        return trainer.current_epoch - 1 if trainer.current_epoch > 0 else None

    def _keys_of_others(self, trainer: pl.Trainer) -> set[str]:
        """Keys logged by anyone but this monitor (the module's), remembered across epochs."""
        self._other_keys.update(set(trainer.callback_metrics) - self._own_keys)
        return self._other_keys

    def _finish(self, stage: str, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = self._metrics[stage]
        summary = metrics["summary"]
        if not int(summary.count.sum()) and not trainer.world_size > 1:
            return  # nothing was validated (e.g. limit_val_batches=0)
        values, bins, grid = summary.compute_with_state()  # one sync under DDP
        values.update({name: m.compute() for name, m in metrics.items() if name != "summary"})
        taken = self._keys_of_others(trainer)
        logged = {
            f"{stage}/{name}": value.float()
            for name, value in values.items()
            if not {f"{stage}/{alias}" for alias in ALIASES.get(name, (name,))} & taken
        }
        self._own_keys.update(logged)
        # Values of synchronized metrics, the same on every process: max is exact, and
        # Lightning does not warn about an unsynchronized epoch metric.
        pl_module.log_dict(logged, sync_dist=True, reduce_fx="max")
        epoch = trainer.current_epoch
        every = self.diagram_every_n_epochs
        due = stage == "test" or (every > 0 and (epoch + 1) % every == 0)
        if due and trainer.is_global_zero:
            self._save_diagram(trainer, stage, self._model_epoch(trainer), (bins, grid))
        if stage == "val":
            self._last_val = (epoch, (bins, grid), due)
        for metric in metrics.values():
            metric.reset()

    def _save_diagram(
        self, trainer: pl.Trainer, stage: str, epoch: int | None, state: DiagramState
    ) -> None:
        """Draw and save (and log to MLflow) in a background thread: training goes on."""
        suffix = "untrained" if epoch is None else f"epoch={epoch:03d}"
        folder = figure_folder(trainer)
        paths = (folder / f"{stage}_{suffix}.png", folder / f"{stage}_smooth_{suffix}.png")
        what = f"{stage}, untrained model" if epoch is None else f"{stage}, epoch {epoch}"
        title = diagram_title(trainer, what)  # the run, its loss, then what
        loggers = artifact_loggers(trainer)
        bins, grid = state
        bins = tuple(b.detach().cpu() for b in bins)
        grid = None if grid is None else (grid[0].detach().cpu(), grid[1].detach().cpu())
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagram")
        level = self.level if self.intervals else None
        self._pending.append(
            self._executor.submit(_draw, (bins, grid), paths, title, loggers, level, self._task)
        )
        self.last_diagram = paths[0]
        self.last_smooth_diagram = paths[1] if grid is not None else None

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
        self._keys_of_others(trainer)
        self.wait()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.wait()

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._checked.discard("val")

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
        # Sanity-check batches are checked (before any training step) but not accumulated.
        self._update("val", outputs, pl_module, accumulate=not trainer.sanity_checking)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._finish("val", trainer, pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keys_of_others(trainer)  # also what the module logged in its epoch-end hook

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._checked.discard("test")

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


__all__: Sequence[str] = (
    "CalibrationMonitor",
    "all_gather_uneven",
    "calibration_inputs",
)
