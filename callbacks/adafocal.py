"""``AdaFocalUpdate``: after each validation epoch, AdaFocal's per-bin gammas follow calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_losses.callbacks.artifacts import artifact_loggers, diagram_title, figure_folder
from lightning_losses.callbacks.criterion import DEFAULT_ATTRIBUTE, attribute_name, module_criterion
from lightning_losses.callbacks.gather import all_gather_uneven
from lightning_losses.callbacks.outputs import OutputAdapter, OutputsSpec, calibration_inputs
from lightning_losses.functional.adafocal import adafocal_update, check_adafocal_update
from lightning_losses.functional.checks import check_int
from lightning_losses.loss_ranges import CALLBACK_COUNTS
from lightning_losses.warning import LightningLossesWarning


def adafocal_criterion(pl_module: pl.LightningModule, attribute: str = DEFAULT_ATTRIBUTE) -> Any:
    """``pl_module.<attribute>`` if it holds AdaFocal bins.

    Raises:
        ValueError: the module has no such attribute (the message names it).
        TypeError: the loss there is not an AdaFocalLoss (the message names it).
    """
    criterion = module_criterion(pl_module, attribute, "AdaFocalUpdate")
    edges, gammas = getattr(criterion, "edges", None), getattr(criterion, "gammas", None)
    if not (
        isinstance(edges, Tensor)
        and isinstance(gammas, Tensor)
        and callable(getattr(criterion, "set_bins", None))
    ):
        raise TypeError(
            f"AdaFocalUpdate needs {type(pl_module).__name__}.{attribute} to be an AdaFocalLoss "
            f"(a loss with per-bin edges, gammas and set_bins); got {type(criterion).__name__}. "
            "Use lightning_losses.AdaFocalLoss() (--model.criterion=adafocal on the command line)"
        )
    return criterion


def confidence_gaps(bins: tuple[Tensor, Tensor, Tensor]) -> list[float]:
    """Each bin's mean confidence minus its accuracy, 0 for an empty bin.

    ``bins`` is ``(count, conf_sum, correct_sum)``, as the binned statistics return them.
    """
    count, conf_sum, correct_sum = bins
    gaps = []
    for n, conf, correct in zip(
        count.tolist(), conf_sum.tolist(), correct_sum.tolist(), strict=True
    ):
        gaps.append(conf / n - correct / n if n > 0 else 0.0)
    return gaps


class AdaFocalUpdate(Callback):
    """Update :class:`~lightning_losses.AdaFocalLoss`'s per-bin gammas after each validation epoch.

    AdaFocal (Ghosh, Schaaf, Gormley, "AdaFocal: Calibration-aware Adaptive Focal Loss",
    NeurIPS 2022) closes the loop between calibration and the loss. After every validation
    epoch of ``fit`` (not the sanity check), this callback

    1. takes each validation sample's top-label confidence ``max softmax`` (in float64) and
       correctness, from the ``{"logits", "target"}`` dict ``validation_step`` returns (or
       what ``outputs`` reads), as ``CalibrationMonitor`` reads it; targets equal to the
       criterion's ``ignore_index`` are left out;
    2. splits them into ``num_bins`` equal-mass bins (the edges interpolate the sorted
       confidences, :func:`~lightning_losses.calibration.functional.equal_mass_edges`) and
       computes each bin's gap ``E_k = mean confidence - accuracy``;
    3. moves each bin's gamma by the paper's rule
       (:func:`~lightning_losses.functional.adafocal_update`): ``g * exp(lambda E)`` for a
       focal bin, ``g * exp(-lambda E)`` for an inverse-focal one, switching sides at
       ``|g| < switch_point``, clipped to ``[gamma_min, gamma_max]``;
    4. stores the new edges and gammas in the criterion (``set_bins``): from the next
       training step on, a sample's gamma is that of the bin its target probability falls in;
    5. logs ``adafocal/gamma_<k>`` per bin to every logger, at step = the epoch.

    The state lives in the criterion's buffers, so it is in every checkpoint and a resumed
    fit continues with the gammas it had; this callback keeps nothing between epochs. Under
    DDP the confidences of all processes are gathered before binning, and the sums run in
    sorted order, so every process computes the same gammas as one process would.

    With ``final_diagram`` (and every ``diagram_every_n_epochs`` epochs if asked) it saves
    ``calibration/adafocal_epoch=<E>.png`` (reliability of the equal-mass bins above, each
    bin's gamma below) beside the calibration diagrams, and logs it to MLflow.

    Works in any LightningModule with a ``criterion`` attribute (or the one ``attribute``
    names) that is an ``AdaFocalLoss``
    and a ``validation_step`` that returns ``{"logits": ..., "target": ...}`` (or another output
    that ``outputs`` reads, see :mod:`lightning_losses.callbacks.outputs`); both are checked
    before any training step (the criterion at setup, the output on the first sanity-check
    batch).

    Args:
        lambda_: the paper's ``lambda`` (step size of the update), ``> 0``.
        switch_point: ``|gamma|`` below which a bin switches between focal and inverse focal.
        gamma_min: lower clip of every gamma.
        gamma_max: upper clip of every gamma (``> gamma_min``).
        diagram_every_n_epochs: also draw the diagram every so many validation epochs (0:
            only the final one).
        final_diagram: draw the diagram of the last update when training ends.
        outputs: how to read the logits and targets from what ``validation_step`` returns, as
            ``CalibrationMonitor``'s ``outputs`` (``None``: the ``{"logits", "target"}`` dict).
        attribute: the LightningModule's attribute that holds the loss (``"loss_fn"`` for a
            module that computes ``self.loss_fn(logits, target)``).

    Example:
        >>> from lightning_losses.callbacks import AdaFocalUpdate
        >>> AdaFocalUpdate()
        AdaFocalUpdate(lambda_=1.0, switch_point=0.2, gamma_min=-20.0, gamma_max=20.0)
    """

    def __init__(
        self,
        lambda_: float = 1.0,
        switch_point: float = 0.2,
        gamma_min: float = -20.0,
        gamma_max: float = 20.0,
        diagram_every_n_epochs: int = 0,
        final_diagram: bool = True,
        outputs: OutputsSpec = None,
        attribute: str = DEFAULT_ATTRIBUTE,
    ) -> None:
        check_adafocal_update(lambda_, switch_point, gamma_min, gamma_max)
        self.attribute = attribute_name(attribute, "AdaFocalUpdate")
        self._read = OutputAdapter(outputs, owner="AdaFocalUpdate")
        self.outputs = outputs
        diagram_every_n_epochs = check_int(
            "diagram_every_n_epochs",
            diagram_every_n_epochs,
            **CALLBACK_COUNTS["AdaFocalUpdate"]["diagram_every_n_epochs"],
        )
        self.lambda_ = float(lambda_)
        self.switch_point = float(switch_point)
        self.gamma_min = float(gamma_min)
        self.gamma_max = float(gamma_max)
        self.diagram_every_n_epochs = diagram_every_n_epochs
        self.final_diagram = final_diagram
        self._confidence: list[Tensor] = []
        self._correct: list[Tensor] = []
        self._checked = False
        self.updates = 0  # updates made in this fit
        self.last_diagram: Path | None = None
        self._last: tuple[int, tuple[Tensor, ...], bool] | None = None  # epoch, bins, drawn

    def __repr__(self) -> str:
        return (
            f"AdaFocalUpdate(lambda_={self.lambda_}, switch_point={self.switch_point}, "
            f"gamma_min={self.gamma_min}, gamma_max={self.gamma_max})"
        )

    def describe(self) -> str:
        """One line for the fit summary.

        Example:
            >>> AdaFocalUpdate().describe().split(" (")  # doctest: +NORMALIZE_WHITESPACE
            ['AdaFocalUpdate: per-bin gammas from each validation epoch',
             'lambda_=1.0, switch_point=0.2, gamma in [-20.0, 20.0])']
        """
        return (
            f"AdaFocalUpdate: per-bin gammas from each validation epoch (lambda_={self.lambda_}, "
            f"switch_point={self.switch_point}, gamma in [{self.gamma_min}, {self.gamma_max}])"
        )

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            criterion = adafocal_criterion(pl_module, self.attribute)
            criterion.check_hyperparameters()
            self.updates = 0

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._confidence, self._correct = [], []

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
        if trainer.state.fn != "fit":
            return
        # checked on the sanity batch
        logits, target = calibration_inputs(outputs, pl_module, self._read)
        if trainer.sanity_checking:
            return
        if logits.dim() > 2:  # [N, C, *]: one prediction per position
            logits = logits.movedim(1, -1).reshape(-1, logits.shape[1])
            target = target.reshape(-1)
        criterion = getattr(pl_module, self.attribute, None)
        keep = target != getattr(criterion, "ignore_index", -100)
        # float64 row by row: the confidences do not depend on how the rows are batched.
        log_confidence, prediction = torch.log_softmax(logits[keep].double(), dim=1).max(dim=1)
        confidence = log_confidence.exp()
        correct = (prediction == target[keep]).double()
        self._confidence.append(confidence)
        self._correct.append(correct)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        from lightning_losses.calibration.functional import edge_binned_statistics, equal_mass_edges

        device = pl_module.device
        empty = torch.zeros(0, dtype=torch.float64, device=device)
        confidence = (
            torch.cat([c.to(device) for c in self._confidence]) if self._confidence else empty
        )
        correct = torch.cat([c.to(device) for c in self._correct]) if self._correct else empty
        self._confidence, self._correct = [], []
        confidence = all_gather_uneven(trainer.strategy, confidence)
        correct = all_gather_uneven(trainer.strategy, correct)
        if confidence.numel() == 0:
            rank_zero_warn(
                "AdaFocalUpdate: the validation epoch had no samples; gammas unchanged",
                category=LightningLossesWarning,
            )
            return
        criterion = adafocal_criterion(pl_module, self.attribute)
        edges = equal_mass_edges(confidence, criterion.gammas.numel())
        bins = edge_binned_statistics(confidence, correct, edges)
        gammas = adafocal_update(
            criterion.gammas.tolist(),
            confidence_gaps(bins),
            lambda_=self.lambda_,
            switch_point=self.switch_point,
            gamma_min=self.gamma_min,
            gamma_max=self.gamma_max,
        )
        criterion.set_bins(edges, gammas)
        self.updates += 1
        epoch = trainer.current_epoch
        metrics = {f"adafocal/gamma_{k:02d}": value for k, value in enumerate(gammas)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=epoch)
        every = self.diagram_every_n_epochs
        due = every > 0 and (epoch + 1) % every == 0
        diagram_bins = (edges.cpu(), *(b.cpu() for b in bins), torch.tensor(gammas))
        if due and trainer.is_global_zero:
            self._draw(trainer, epoch, diagram_bins)
        self._last = (epoch, diagram_bins, due)

    def _draw(self, trainer: pl.Trainer, epoch: int, bins: tuple[Tensor, ...]) -> None:
        from lightning_losses.calibration.diagram import gamma_diagram

        path = figure_folder(trainer) / f"adafocal_epoch={epoch:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        what = f"AdaFocal bins after validation, epoch {epoch}"
        title = diagram_title(trainer, what, attribute=self.attribute)  # the run, its loss, what
        gamma_diagram(*bins, path=path, title=title)
        for log_file in artifact_loggers(trainer):
            log_file(str(path), artifact_path="calibration")
        self.last_diagram = path

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        last, self._last = self._last, None
        if self.updates == 0:
            rank_zero_warn(
                "AdaFocalUpdate made no update in this fit (no validation epoch ran): the "
                "criterion trained as focal loss with its initial gammas",
                category=LightningLossesWarning,
            )
        if self.final_diagram and last is not None and not last[2] and trainer.is_global_zero:
            self._draw(trainer, last[0], last[1])
