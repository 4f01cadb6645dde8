"""Prediction sets with a coverage guarantee inside the Trainer: split conformal thresholds.

:class:`ConformalPrediction` keeps the validation logits and targets of every validation epoch
(not the sanity check), gathers them exactly across DDP processes (uneven shares:
:func:`~lightning_losses.callbacks.gather.all_gather_uneven`), and fits one split conformal
threshold per score and miscoverage level on a seeded part of them
(:mod:`lightning_losses.calibration.conformal`). The thresholds are in every checkpoint;
``test`` logs coverage, mean set size, SSCV and the class-conditional coverage gap per score and
level; ``predict`` returns the sets.

The split: the sample at loader position ``p`` (``rank + world_size * k`` for a process's
``k``-th sample, :func:`~lightning_losses.callbacks.gather.sample_positions`: the dataset
position under :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler`) is a
conformal calibration sample when ``U_p < fraction``, ``U = torch.rand(P, generator=
torch.Generator().manual_seed(seed))``: the same samples on any number of processes, in every
epoch. With a :class:`~lightning_losses.callbacks.PostHocCalibration` among the callbacks
(before this one), the calibrator is fitted on the other samples only and the scores are taken
on its calibrated probabilities: fitting both on the same samples would void the guarantee.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_losses.calibration import conformal as CP
from lightning_losses.calibration.conformal._inputs import METHODS
from lightning_losses.callbacks.gather import all_gather_uneven, sample_positions
from lightning_losses.callbacks.outputs import OutputAdapter, OutputsSpec, calibration_inputs
from lightning_losses.callbacks.posthoc import PostHocCalibration
from lightning_losses.functional.checks import (
    check_choice,
    check_flag,
    check_fraction,
    check_int,
    check_levels,
)
from lightning_losses.warning import LightningLossesWarning

#: Probabilities per block of the test's statistics (see ``on_test_epoch_end``).
BLOCK_ELEMENTS = 1 << 20

__all__ = ["ConformalPrediction"]


class ConformalPrediction(Callback):
    """Fit split conformal thresholds on a seeded part of each validation epoch's outputs.

    For each score in ``methods`` and each level in ``alpha``, the threshold is the
    ``ceil((n + 1)(1 - alpha))``-th smallest score of the ``n`` calibration samples
    (:func:`~lightning_losses.calibration.conformal.conformal_threshold`); a test sample's set
    ``{y : s(x, y) <= q}`` then holds its label with probability at least ``1 - alpha`` when it
    is exchangeable with them. Logged each fit: ``conformal/n`` and
    ``conformal/q_<method>_<alpha>``. ``test`` measures ``coverage``, ``size``, ``empty``,
    ``singleton``, ``sscv`` and ``coverage_gap`` of every score and level (all in
    :attr:`test_report`) and logs those of ``measures`` (all but the empty and singleton
    rates by default) as ``test/conformal_<method>_<alpha>_<measure>``.
    ``predict`` returns ``{"probs": [N, C], "sets": {"<method>_<alpha>": [N, C] bool}}``.

    Args:
        alpha: the miscoverage levels.
        methods: the scores, among ``"lac"``, ``"aps"``, ``"raps"``, ``"saps"``, ``"top_k"``.
        fraction: the share of the validation samples held out for the thresholds.
        seed: the seed of the split (and of the draws when randomised).
        randomized: randomised scores; the draws, like the split, depend on the sample's
            position only.
        k_reg: RAPS's rank from which the penalty applies.
        lam: RAPS's penalty per rank.
        weight: SAPS's weight per rank.
        ignore_index: targets to skip.
        measures: the measures logged through Lightning, among
            :data:`~lightning_losses.calibration.conformal.MEASURES`; by default coverage, size,
            SSCV and the class coverage gap (each logged key costs Lightning about 0.6 ms of the
            test's end). All six are in :attr:`test_report`.
        outputs: how to read logits and targets from the step outputs (as the other callbacks).

    Example:
        >>> ConformalPrediction(alpha=[0.1, 0.05], methods=["lac", "aps"]).names
        ['lac_0.1', 'lac_0.05', 'aps_0.1', 'aps_0.05']
    """

    def __init__(
        self,
        *,
        alpha: float | Sequence[float] = 0.1,
        methods: Sequence[str] = ("lac", "aps", "raps", "saps"),
        fraction: float = 0.5,
        seed: int = 0,
        randomized: bool = False,
        k_reg: int = 1,
        lam: float = 0.01,
        weight: float = 0.2,
        ignore_index: int | None = None,
        measures: Sequence[str] = ("coverage", "size", "sscv", "coverage_gap"),
        outputs: OutputsSpec = None,
    ) -> None:
        self.alpha, _ = check_levels(alpha)
        if isinstance(measures, str):
            measures = [measures]
        for measure in measures:
            check_choice("measures", measure, CP.MEASURES)
        #: The measures logged at ``test`` (all of them are in :attr:`test_report`).
        self.measures = tuple(str(m) for m in measures)
        if isinstance(methods, str):
            methods = [methods]
        for m in methods:
            check_choice("method", m, METHODS)
        self.methods = tuple(str(m) for m in methods)
        if not self.methods:
            raise ValueError("methods must name at least one score")
        self.fraction = check_fraction("fraction", fraction)
        self.seed = check_int("seed", seed, low=0)
        check_flag("randomized", randomized)
        self.randomized = randomized
        self.options: dict[str, Any] = {"k_reg": k_reg, "lam": lam, "weight": weight}
        CP.conformal_scores(torch.ones(1, 1), torch.zeros(1, dtype=torch.long), **self.options)
        self.ignore_index = ignore_index
        self.outputs = outputs
        self._read = OutputAdapter(outputs, owner=type(self).__name__)
        #: ``{method: [A] thresholds}`` of the latest fit (or checkpoint); empty before.
        self.thresholds: dict[str, Tensor] = {}
        #: ``{"epoch", "global_step", "n"}`` of the latest fit.
        self.fitted_at: dict[str, int] = {}
        #: Whether the thresholds were fitted on PostHocCalibration's probabilities.
        self.calibrated = False
        #: The latest test's measures (every one of ``MEASURES``), by logged name.
        self.test_report: dict[str, float] = {}
        self._buffers: dict[str, tuple[list[Tensor], list[Tensor]]] = {}
        self._posthoc: PostHocCalibration | None = None
        self._undo_predict: Any = None

    @property
    def names(self) -> list[str]:
        """``<method>_<alpha>`` for every score and level, in logging order."""
        return [f"{m}_{a:g}" for m in self.methods for a in self.alpha]

    # --- the split -------------------------------------------------------------------------

    def _uniform(self, positions: Tensor, offset: int) -> Tensor:
        """``U_p`` for every position: one seeded stream, indexed by position."""
        generator = torch.Generator().manual_seed(self.seed + offset)
        size = int(positions.max()) + 1 if positions.numel() else 0
        return torch.rand(size, generator=generator, dtype=torch.float64)[positions]

    def in_calibration_part(self, positions: Tensor) -> Tensor:
        """Whether the samples at ``positions`` calibrate the thresholds (not the calibrator).

        Example:
            >>> part = ConformalPrediction(seed=0).in_calibration_part(torch.arange(1000))
            >>> 0.45 < part.double().mean().item() < 0.55
            True
        """
        return self._uniform(positions, 0) < self.fraction

    # --- checkpoints -----------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """The thresholds, levels, scores and when they were fitted (empty before a fit)."""
        if not self.thresholds:
            return {}
        return {
            "alpha": list(self.alpha),
            "thresholds": {m: q.tolist() for m, q in self.thresholds.items()},
            "options": dict(self.options),
            "calibrated": self.calibrated,
            **self.fitted_at,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the saved thresholds."""
        if not state_dict:
            return
        self.alpha = [float(a) for a in state_dict["alpha"]]
        self.thresholds = {
            m: torch.tensor(q, dtype=torch.float64) for m, q in state_dict["thresholds"].items()
        }
        self.calibrated = bool(state_dict.get("calibrated", False))
        self.fitted_at = {
            k: int(state_dict[k]) for k in ("epoch", "global_step", "n") if k in state_dict
        }

    # --- collecting ------------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        callbacks = list(getattr(trainer, "callbacks", []))
        posthoc = [c for c in callbacks if isinstance(c, PostHocCalibration)]
        self._posthoc = posthoc[0] if posthoc else None
        if self._posthoc is not None:
            if callbacks.index(self._posthoc) > callbacks.index(self):
                raise ValueError(
                    "ConformalPrediction must come after PostHocCalibration in the trainer's "
                    "callbacks (it scores the calibrator's probabilities of the same epoch)"
                )
            self._posthoc.exclude = self.in_calibration_part
        if stage == "fit":
            self.thresholds, self.fitted_at = {}, {}

    def _keep(self, stage: str, outputs: Any, pl_module: pl.LightningModule) -> None:
        logits, target = calibration_inputs(outputs, pl_module, self._read)
        if logits.dim() != 2 or target.dim() != 1:
            raise ValueError(
                f"ConformalPrediction needs [N, C] logits and [N] class indices; got "
                f"{list(logits.shape)} and {list(target.shape)}"
            )
        buffer = self._buffers.setdefault(stage, ([], []))
        buffer[0].append(logits.detach())  # float64 block by block when they are scored
        buffer[1].append(target.detach().long())

    def _gathered(self, trainer: pl.Trainer, stage: str) -> tuple[Tensor, Tensor, Tensor] | None:
        """All processes' logits, targets and positions of ``stage`` (``None``: none)."""
        logits_list, targets = self._buffers.pop(stage, ([], []))
        strategy = trainer.strategy
        local = sum(len(t) for t in targets)
        if trainer.world_size > 1:
            gathered = strategy.all_gather(torch.tensor(local, device=strategy.root_device))
            counts = [int(c) for c in gathered.flatten().tolist()]
        else:
            counts = [local]
        if not sum(counts):
            return None
        logits = torch.cat(logits_list) if logits_list else torch.zeros(0, 1, dtype=torch.float64)
        target = torch.cat(targets) if targets else torch.zeros(0, dtype=torch.long)
        logits = all_gather_uneven(strategy, logits.to(strategy.root_device)).cpu()
        target = all_gather_uneven(strategy, target.to(strategy.root_device)).cpu()
        return logits, target, sample_positions(counts)

    def _current_calibrator(self) -> Any:
        """PostHocCalibration's calibrator when it was fitted for these weights, else ``None``.

        Its ``state_dict`` is empty while the weights are newer than its fit (an epoch that
        ``every_n_epochs`` skips): the thresholds are then fitted on the softmax.
        """
        posthoc = self._posthoc
        if posthoc is None or posthoc.calibrator is None or not posthoc.state_dict():
            return None
        return posthoc.calibrator

    def _probs(self, logits: Tensor) -> Tensor:
        """The calibrator's probabilities when the thresholds were fitted on them, else softmax."""
        calibrator = self._posthoc.calibrator if self.calibrated and self._posthoc else None
        if calibrator is None:
            return torch.softmax(logits, dim=1, dtype=torch.float64)  # of logits.double()
        with torch.no_grad():
            return calibrator(logits.double()).double().exp()

    def _scores_options(self, positions: Tensor, offset: int) -> dict[str, Any]:
        noise = self._uniform(positions, offset) if self.randomized else None
        return {"randomized": False, "noise": noise, **self.options}

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._buffers.pop("val", None)

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
            self._keep("val", outputs, pl_module)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        gathered = self._gathered(trainer, "val")
        if gathered is None:
            return
        logits, target, positions = gathered
        part = self.in_calibration_part(positions)
        self.calibrated = self._current_calibrator() is not None
        if self.ignore_index is not None:
            part &= target != self.ignore_index
        probs = self._probs(logits[part])
        labels, where = target[part], positions[part]
        thresholds = {}
        for method in self.methods:
            scores = CP.conformal_scores(
                probs, labels, method=method, **self._scores_options(where, 1)
            )
            try:
                thresholds[method] = CP.conformal_threshold(scores, self.alpha).reshape(-1)
            except ValueError as error:
                raise ValueError(
                    f"ConformalPrediction(fraction={self.fraction}) at epoch "
                    f"{trainer.current_epoch}: {error}"
                ) from error
        self.thresholds = thresholds
        n = int(part.sum())
        self.fitted_at = {
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "n": n,
        }
        pl_module.log("conformal/n", float(n), on_epoch=True, sync_dist=False)
        for method, q in thresholds.items():
            for a, value in zip(self.alpha, q.tolist(), strict=True):
                pl_module.log(f"conformal/q_{method}_{a:g}", value, on_epoch=True)

    # --- test and predict ------------------------------------------------------------------

    def _ready(self, stage: str) -> bool:
        if not self.thresholds:
            reason = "fit first, or pass the ckpt_path of a checkpoint saved with this callback"
        elif self.calibrated and (self._posthoc is None or self._posthoc.calibrator is None):
            reason = (
                "the thresholds were fitted on PostHocCalibration's probabilities and no "
                "calibrator is restored: run with PostHocCalibration and the same checkpoint"
            )
        else:
            return True
        rank_zero_warn(
            f"ConformalPrediction: no sets to {stage} ({reason})", category=LightningLossesWarning
        )
        return False

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._buffers.pop("test", None)

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
        self._keep("test", outputs, pl_module)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        gathered = self._gathered(trainer, "test")
        if gathered is None or not self._ready("test"):
            return
        logits, target, positions = gathered
        # each method's sets at each level as sums (one sort for every method, no [N, C] sets),
        # a block of rows at a time: no [N, C] float64 copy of all the logits or probabilities.
        # Blocks of 2^20 probabilities (8 MiB of float64, two of the statistics' chunks): at
        # [100,000, 100] blocks of 2^18 took ~10% longer (each call's set-up), of 2^22 faulted
        # in the pages of every block's softmax anew (3x the softmax's time)
        levels = {method: q.tolist() for method, q in self.thresholds.items()}
        options = self._scores_options(positions, 2)
        noise = options.pop("noise")
        rows = max(1, BLOCK_ELEMENTS // max(1, logits.shape[1]))
        blocks = [
            CP.set_statistics_by_method(
                self._probs(logits[start : start + rows]),
                target[start : start + rows],
                levels,
                ignore_index=self.ignore_index,
                noise=None if noise is None else noise[start : start + rows],
                **options,
            )
            for start in range(0, len(target), rows)
        ]
        statistics = {
            method: [CP.summed_statistics(b[method][k] for b in blocks) for k in range(len(q))]
            for method, q in levels.items()
        }
        report, logged = {}, []
        for method in self.thresholds:
            for a, stats in zip(self.alpha, statistics[method], strict=True):
                for measure, value in CP.all_measures(stats, alpha=a).items():
                    key = f"test/conformal_{method}_{a:g}_{measure}"
                    report[key] = float(value)
                    if measure in self.measures:
                        logged.append(key)
        self.test_report = report
        for key in logged:
            pl_module.log(key, report[key], on_epoch=True, sync_dist=False)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._ready("predict"):
            return
        original = pl_module.predict_step
        # ClassifierModule's predict_step, and any wrapped by PostHocCalibration, give
        # probabilities; a plain module's default gives logits
        gives_probs = callable(getattr(pl_module, "set_calibrator", None)) or (
            self._posthoc is not None and self._posthoc.calibrator is not None
        )
        if gives_probs and not self.calibrated and self._posthoc is not None:
            rank_zero_warn(
                "ConformalPrediction: the thresholds were fitted on the softmax, the module "
                "predicts calibrated probabilities: the sets have no guarantee",
                category=LightningLossesWarning,
            )

        def predict_step(*args: Any, **kwargs: Any) -> dict[str, Any]:
            output = original(*args, **kwargs)
            probs = output if gives_probs else torch.softmax(output, dim=1)
            sets = {}
            for method, q in self.thresholds.items():
                for a, threshold in zip(self.alpha, q.tolist(), strict=True):
                    sets[f"{method}_{a:g}"] = CP.prediction_sets(
                        probs, threshold, method=method, randomized=self.randomized, **self.options
                    )
            return {"probs": probs, "sets": sets}

        pl_module.predict_step = predict_step  # type: ignore[method-assign]
        self._undo_predict = lambda: pl_module.__dict__.pop("predict_step", None)

    def _restore_predict(self) -> None:
        undo, self._undo_predict = self._undo_predict, None
        if undo is not None:
            undo()

    @override
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_predict()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_predict()
        if self._posthoc is not None and self._posthoc.exclude == self.in_calibration_part:
            self._posthoc.exclude = None
