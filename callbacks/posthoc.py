"""Post-hoc calibration inside the Trainer: fitted on the validation split, kept in checkpoints.

:class:`PostHocCalibration` collects the logits and targets of every validation epoch (not the
sanity check), gathers them exactly across DDP processes (each process may hold a different
number of samples: :func:`~lightning_losses.callbacks.gather.all_gather_uneven`), and chooses
among post-hoc calibrators by cross-validated NLL
(:func:`~lightning_losses.calibration.posthoc.select.select_calibrator`; the identity is always
a candidate, so a method that would worsen the held-out NLL is never chosen). It fits at the end
of every validation epoch, before ``ModelCheckpoint`` saves, so every checkpoint holds the
calibrator fitted on the validation logits of the weights it stores (the callback's
``state_dict``: method, hyper-parameters, the calibrator's own ``state_dict``). ``test`` applies
it and logs raw and calibrated metrics; ``predict`` returns calibrated probabilities.

:class:`~lightning_losses.callbacks.temperature_scaling.TemperatureScalingCallback` is the same
callback with ``methods=("temperature",)``, always applied (no choice), logging its historical
keys.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_losses.callbacks.artifacts import artifact_loggers, diagram_title, figure_folder
from lightning_losses.callbacks.gather import all_gather_uneven, sample_positions
from lightning_losses.callbacks.outputs import (
    OutputAdapter,
    OutputsSpec,
    calibration_inputs,
    describe_output,
)
from lightning_losses.callbacks.posthoc_parts import (
    CALIBRATED,
    DEFAULT_METHODS,
    PREFIX,
    QUANTITIES,
    Bins,
    calibrator_template,
    method_kwargs,
    method_names,
    quiet_fits,
    set_tags,
    split_scores,
    unscored_reason,
)
from lightning_losses.functional.checks import check_flag, check_ignore_index, check_int
from lightning_losses.lightning.classifier import (
    calibrated_probabilities,
    calibrator_from_state,
    posthoc_calibrator,
)
from lightning_losses.loss_ranges import CALLBACK_COUNTS
from lightning_losses.warning import LightningLossesWarning

#: The bounds of the integer arguments (their one home: :mod:`lightning_losses.loss_ranges`).
_COUNTS = CALLBACK_COUNTS["PostHocCalibration"]

if TYPE_CHECKING:
    from lightning_losses.calibration.posthoc.base import PostHocCalibrator
    from lightning_losses.calibration.posthoc.select import Selection

__all__ = ["DEFAULT_METHODS", "PostHocCalibration"]


class PostHocCalibration(Callback):
    """Fit post-hoc calibrators on each validation epoch, keep the best in the checkpoint.

    At the end of every validation epoch (not the sanity check) the validation logits and
    targets of all processes are gathered, every method in ``methods`` (and the identity) is
    scored by its NLL on ``folds`` held-out folds of them, and the best is refitted on all of
    them (:func:`~lightning_losses.calibration.posthoc.select.select_calibrator`). This happens
    before ``ModelCheckpoint`` saves, so each checkpoint holds the calibrator fitted on the
    validation logits of its own weights; :meth:`state_dict` saves the method, its
    hyper-parameters and the calibrator's ``state_dict`` (nothing while the weights are newer
    than the last fit). ``fit --ckpt_path`` (resume) and ``test``/``predict`` with
    ``ckpt_path`` restore it, :meth:`calibrator_from_checkpoint` (or
    ``ClassifierModule.load_from_checkpoint``) reads it back from a file; ``validate`` fits
    again.

    Logged each validation epoch, to every logger (through ``pl_module.log``):
    ``val/posthoc_nll``, ``val/posthoc_ece`` (``n_bins`` equal-width bins) and
    ``val/posthoc_smooth_ece`` (the smooth ECE of Błasiok and Nakkiran) of the calibrated
    probabilities, on the split the calibrator was fitted on; the raw values under the names
    :class:`~lightning_losses.callbacks.CalibrationMonitor` uses (``val/nll``, ``val/ece``,
    ``val/smooth_ece``) unless the module or another callback logs that name itself;
    ``posthoc/cv_nll_<method>`` (each candidate's cross-validated NLL, ``none`` for the
    identity; a method that cannot be scored, its NLL infinite or NaN, is never chosen, warns
    once per fit saying which and why, and is logged as NaN in each epoch where it cannot
    be scored, so the latest value of every method is its score at the latest fit);
    ``posthoc/fit_seconds`` (the time the choice and the fit took, the slowest process's); and
    ``posthoc/fallback_<method>`` = 1 for a method that cannot help on these samples (fewer
    samples than it needs, a single class; it then scores as the identity), which is also
    warned once per fit. When the chosen map ran to a bound of its fit (a temperature driven to
    0 or above 1e3, see
    :meth:`~lightning_losses.calibration.posthoc.base.PostHocCalibrator.bound_reason`), that is
    warned once per fit too, saying what the map then does. MLflow runs get the tags
    ``posthoc/method`` (the method chosen, ``none`` for the identity) and ``posthoc/fallbacks``.
    With ``log_diagrams`` the reliability diagrams of the last fit, raw and calibrated, are saved
    when training ends as ``<log_dir>/calibration/posthoc_val_raw_epoch=<E>.png`` and
    ``posthoc_val_calibrated_epoch=<E>.png`` and logged as MLflow artifacts under
    ``calibration/``.

    ``test`` logs ``test/posthoc_<quantity>`` (calibrated) and the raw ``test/<quantity>``
    (unless logged by another), with the diagrams ``posthoc_test_raw_epoch=<E>.png`` and
    ``posthoc_test_calibrated_epoch=<E>.png``. ``predict`` returns calibrated probabilities:
    a module with a ``set_calibrator`` method (``ClassifierModule``) is handed the calibrator
    for the run; any other module's ``predict_step`` must return logits (``[N, C]``, ``[N]``
    binary or ``[N, n, m]``, as LightningModule's default ``self(batch)`` does), which are
    replaced by calibrated probabilities (``[N]`` binary: the positive class's) while predicting.

    Tasks: multiclass ``[N, C]`` logits with ``[N]`` labels, binary ``[N]`` logits with 0/1
    targets (calibrated as the two classes ``[0, z]``), n-by-m tasks (flattened to multiclass).
    Multi-label outputs (``[N, K]`` float targets) are left alone with a warning.

    Args:
        methods: names of :data:`~lightning_losses.calibration.posthoc.CALIBRATION_METHODS`,
            or ``"all"`` (every method that applies to the task: ``beta`` only to binary ones).
        folds: folds of the cross-validated NLL (``>= 2``).
        method_args: keyword arguments per method, e.g. ``{"matrix": {"reg_lambda": 0.01}}``.
        n_bins: equal-width bins of the ECE and the diagrams.
        ignore_index: target value whose samples are left out (padding tokens); ``None``: none.
        outputs: how to read the logits and targets from what ``validation_step`` (and
            ``test_step``) returns, as :class:`~lightning_losses.callbacks.CalibrationMonitor`'s
            ``outputs``.
        log_diagrams: save and log the reliability diagrams before and after calibration.
        every_n_epochs: fit every so many epochs during ``fit`` (and always in the last one
            ``max_epochs`` allows, and in every ``validate``), when fitting ``methods`` each
            epoch costs too much; a checkpoint of an epoch in between holds no calibrator.

    Raises:
        ValueError: an unknown method, hyper-parameters of a method not tried, ``folds < 2``.
        TypeError: hyper-parameters a method does not take.

    Example:
        >>> callback = PostHocCalibration(methods=("temperature", "vector"), folds=3)
        >>> callback.methods, callback.folds, callback.calibrator is None
        (('temperature', 'vector'), 3, True)
        >>> PostHocCalibration(folds=1)
        Traceback (most recent call last):
        ...
        ValueError: folds must be >= 2; got 1
    """

    #: Why multi-label outputs are left alone (the alias names its own hint).
    MULTILABEL: ClassVar[str] = "multi-label outputs are not calibrated ([N, K] float targets)"

    def __init__(
        self,
        *,
        methods: Sequence[str] | str = DEFAULT_METHODS,
        folds: int = 5,
        method_args: Mapping[str, Mapping[str, Any]] | None = None,
        n_bins: int = 15,
        ignore_index: int | None = None,
        outputs: OutputsSpec = None,
        log_diagrams: bool = True,
        every_n_epochs: int = 1,
    ) -> None:
        from lightning_losses.calibration import functional as CF

        name = type(self).__name__
        self._read = OutputAdapter(outputs, owner=name)
        self.outputs = outputs
        self.all_methods = methods == "all"
        self.methods = method_names(methods, name)
        self.folds = check_int("folds", folds, **_COUNTS["folds"])
        CF.check_n_bins(n_bins)
        if ignore_index is not None:
            check_ignore_index(ignore_index)
        check_flag("log_diagrams", log_diagrams)
        self.every_n_epochs = check_int(
            "every_n_epochs", every_n_epochs, **_COUNTS["every_n_epochs"]
        )
        self.method_args = method_kwargs(method_args, self.methods, name)
        self._templates = {
            m: calibrator_template(m, self.method_args.get(m, {}), name) for m in self.methods
        }
        self.n_bins = n_bins
        self.ignore_index = ignore_index
        self.log_diagrams = log_diagrams
        #: The latest choice (method, fitted calibrator, scores); ``None`` before a fit.
        self.selection: Selection | None = None
        #: ``{"epoch", "global_step"}`` of the weights the calibrator was fitted for.
        self.fitted_at: dict[str, int] = {}
        #: The latest validation fit's values: ``<quantity>_before``, ``<quantity>_after``.
        self.report: dict[str, float] = {}
        #: The latest test's values, likewise.
        self.test_report: dict[str, float] = {}
        #: Seconds the last choice and fit took (cross-validation included).
        self.fit_seconds = 0.0
        #: The paths of the diagrams saved last.
        self.last_diagrams: list[Path] = []
        self._kind = ""
        self._applicable: tuple[str, ...] = self.methods
        self._buffers: dict[str, tuple[list[Tensor], list[Tensor]]] = {}
        self._first: set[str] = set()  # stages whose first batch of the epoch was checked
        self._warned: set[str] = set()
        self._saw_samples = False
        self._restored = False
        self._checkpoint_step: int | None = None
        self._val_bins: tuple[int, Bins, Bins] | None = None
        self._own_keys: set[str] = set()
        self._other_keys: set[str] = set()
        self._undo_predict: Callable[[], None] | None = None
        self._trainer: pl.Trainer | None = None  # the trainer of the current run
        self._fitted_by: pl.Trainer | None = None  # the trainer of the last fit
        self._test_calibrator: PostHocCalibrator | None = None
        #: Set by :class:`~lightning_losses.callbacks.ConformalPrediction`: the validation
        #: samples (a bool mask of their positions, see :func:`sample_positions`) the
        #: calibrator must not be fitted on.
        self.exclude: Callable[[Tensor], Tensor] | None = None
        self._counts: list[int] = []

    @property
    def name(self) -> str:
        """The class name, as the messages name the callback."""
        return type(self).__name__

    @property
    def calibrator(self) -> PostHocCalibrator | None:
        """The fitted (or restored) calibrator; ``None`` before a fit."""
        return None if self.selection is None else self.selection.calibrator

    def _current(self, trainer: pl.Trainer | None) -> bool:
        """Whether the calibrator was fitted for the trainer's weights.

        A restored calibrator is that of the checkpoint's weights; another trainer than the one
        that fitted it is taken at its word (its step does not count the fit's training).
        """
        if trainer is None or self._restored or trainer is not self._fitted_by:
            return True
        return self.fitted_at.get("global_step") == trainer.global_step

    @property
    def method(self) -> str | None:
        """The method chosen (``"none"``: the identity); ``None`` before a fit."""
        return None if self.selection is None else self.selection.method

    # --- checkpoints -----------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """The method, its hyper-parameters, the calibrator's ``state_dict`` and the scores.

        Empty before the first fit, and while the weights are newer than the fit (a save
        between validations, or an epoch ``every_n_epochs`` skips): a checkpoint never holds
        a calibrator fitted for other weights.
        """
        trainer = self._trainer
        if self.selection is None or not self._current(trainer):
            return {}
        selection = self.selection
        return {
            "method": selection.method,
            "hparams": dict(self.method_args.get(selection.method, {})),
            "calibrator": selection.calibrator.state_dict(),
            "scores": dict(selection.scores),
            "folds": selection.folds,
            "fallbacks": dict(selection.fallbacks),
            **self.fitted_at,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Rebuild the saved calibrator (whatever ``methods`` this callback tries)."""
        from lightning_losses.calibration.posthoc.select import Selection

        calibrator = calibrator_from_state(state_dict)
        self.selection = Selection(
            state_dict["method"],
            calibrator,
            dict(state_dict.get("scores", {})),
            int(state_dict.get("folds", self.folds)),
            dict(state_dict.get("fallbacks", {})),
        )
        self.fitted_at = {
            k: int(state_dict[k]) for k in ("epoch", "global_step") if k in state_dict
        }
        self._restored = True
        step = self.fitted_at.get("global_step")
        if self._checkpoint_step is not None and step is not None and step != self._checkpoint_step:
            rank_zero_warn(
                f"{self.name}: the checkpoint's calibrator was fitted at step {step}, its weights "
                f"are of step {self._checkpoint_step} (a save between validations): its "
                "calibrated outputs are those of older weights",
                category=LightningLossesWarning,
            )

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.selection, self.fitted_at = None, {}  # a checkpoint without one holds none
        step = checkpoint.get("global_step")
        self._checkpoint_step = None if step is None else int(step)

    @staticmethod
    def calibrator_from_checkpoint(path: str | Path) -> PostHocCalibrator:
        """The fitted calibrator saved in the checkpoint file at ``path``.

        Apply it to logits: ``calibrator(logits).exp()`` are calibrated probabilities.

        Raises:
            ValueError: the checkpoint holds no calibrator (it was saved without this callback,
                or before its first validation epoch).
        """
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        calibrator = posthoc_calibrator(checkpoint)
        if calibrator is None:
            raise ValueError(
                f"{path} holds no post-hoc calibrator: save it with a PostHocCalibration "
                "callback among the trainer's callbacks (after its first validation epoch)"
            )
        return calibrator

    # --- collecting ------------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._restored = False
        self._checkpoint_step = None
        if stage == "fit":  # new weights: no calibrator until the first validation epoch
            self.selection, self.fitted_at, self.report = None, {}, {}
            self._warned, self._saw_samples, self._val_bins = set(), False, None

    def _read_batch(
        self, stage: str, outputs: Any, pl_module: pl.LightningModule, keep: bool
    ) -> None:
        logits, target = calibration_inputs(outputs, pl_module, self._read)
        if stage not in self._first:
            self._kind = self._validate_first_batch(stage, logits, target)
            self._first.add(stage)
        if not keep:
            return
        if self._kind == "binary" and target.is_floating_point():
            target = target.long()  # 0/1 (or ignore_index) as the first batch showed
        logits = logits.detach()
        buffer = self._buffers.setdefault(stage, ([], []))
        buffer[0].append(logits if logits.dtype == torch.float64 else logits.float())
        buffer[1].append(target.detach())

    def _validate_first_batch(self, stage: str, logits: Tensor, target: Tensor) -> str:
        """The task of a stage's first batch (one of :data:`KINDS`); bad targets raise here."""
        where = f"{self.name}: the first {stage} batch"
        if logits.dim() == 2 and target.dim() == 2 and target.shape == logits.shape:
            if target.is_floating_point():
                return "soft" if getattr(self, "soft_labels", False) else "multilabel"
        if not logits.is_floating_point() or not (
            (logits.dim() == 2 and logits.shape[1] >= 2 and target.dim() == 1)
            or (logits.dim() == 1 and target.dim() == 1)
        ):
            raise ValueError(
                f"{where} has logits {list(logits.shape)} ({logits.dtype}) and target "
                f"{list(target.shape)}: it calibrates [N, C] logits (C >= 2) with [N] class "
                "labels, or [N] binary logits with [N] 0/1 targets"
            )
        if not bool(torch.isfinite(logits).all()):
            raise ValueError(f"{where} has NaN or infinite logits: calibrate finite logits")
        binary = logits.dim() == 1
        classes = 2 if binary else logits.shape[1]
        if not binary and (target.is_floating_point() or target.dtype == torch.bool):
            raise ValueError(f"{where} has {target.dtype} targets; give integer class labels")
        known = target.double()
        if self.ignore_index is not None:
            known = known[known != self.ignore_index]
        if known.numel() and (
            bool((known != known.round()).any()) or known.min() < 0 or known.max() >= classes
        ):
            hint = "" if self.ignore_index is None else f" or ignore_index={self.ignore_index}"
            raise ValueError(
                f"{where} has targets from {float(known.min()):g} to {float(known.max()):g}; "
                f"they must be class labels in [0, {classes - 1}]{hint}"
                + ("" if self.ignore_index is not None else " (padding? pass ignore_index)")
            )
        self._applicable = self._methods_for(classes)
        return "binary" if binary else "multiclass"

    def _methods_for(self, classes: int) -> tuple[str, ...]:
        """The methods that apply to ``classes``; a named one that does not is an error."""
        applicable = []
        for method, template in self._templates.items():
            try:
                template.check_classes(classes)
            except ValueError as error:
                if not self.all_methods:
                    raise ValueError(
                        f"{self.name}(methods={list(self.methods)}): {method!r} does not apply "
                        f"to these {classes}-class outputs: {error}"
                    ) from error
                continue
            applicable.append(method)
        return tuple(applicable)

    def _gathered(self, trainer: pl.Trainer, stage: str) -> tuple[Tensor, Tensor] | None:
        """All processes' logits and targets of ``stage``, on the CPU (``None``: there are none)."""
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
        if not all(counts):
            empty = [rank for rank, count in enumerate(counts) if not count]
            raise ValueError(
                f"{self.name}: processes {empty} had no {stage} samples (samples per process: "
                f"{counts}); give every process at least one"
            )
        self._counts = counts
        logits, target = torch.cat(logits_list), torch.cat(targets)
        logits = all_gather_uneven(strategy, logits)
        return logits.cpu(), all_gather_uneven(strategy, target).cpu()

    # --- fitting ---------------------------------------------------------------------------

    def _select(self, logits: Tensor, target: Tensor) -> Selection:
        """The choice by cross-validated NLL (the identity with fewer samples than folds)."""
        from lightning_losses.calibration.posthoc.base import IdentityCalibrator, check_fit_inputs
        from lightning_losses.calibration.posthoc.select import Selection, select_calibrator

        z, y = check_fit_inputs(logits, target, owner=self.name, ignore_index=self.ignore_index)
        candidates = [copy.deepcopy(self._templates[m]) for m in self._applicable]
        fallbacks = {c.method: reason for c in candidates if (reason := c.cannot_help(z, y))}
        if z.shape[0] < self.folds:
            reason = f"{z.shape[0]} samples are fewer than folds={self.folds}"
            fallbacks = {c.method: reason for c in candidates}
            selection = Selection("none", IdentityCalibrator().fit(z, y), {}, self.folds)
        else:
            with quiet_fits():  # fallbacks are warned below, a bound in _report_fit
                selection = select_calibrator(candidates, z, y, folds=self.folds)
        self._warn_fallbacks(fallbacks)
        return dataclasses.replace(selection, fallbacks={**fallbacks, **selection.fallbacks})

    def _warn_fallbacks(self, fallbacks: Mapping[str, str]) -> None:
        """Warn once per fit about each method that falls back to the identity, and why."""
        for method, reason in fallbacks.items():
            if method not in self._warned:
                self._warned.add(method)
                rank_zero_warn(
                    f"{self.name}: {type(self._templates[method]).__name__} ({method}) falls "
                    f"back to the identity: {reason}",
                    category=LightningLossesWarning,
                )

    def _evaluate(
        self, calibrator: PostHocCalibrator, logits: Tensor, target: Tensor
    ) -> tuple[dict, dict, Bins, Bins]:
        """Raw and calibrated scores of ``logits`` (and their diagrams' bins)."""
        from lightning_losses.calibration.posthoc.base import check_fit_inputs

        z, y = check_fit_inputs(logits, target, owner=self.name, ignore_index=self.ignore_index)
        with torch.no_grad():
            raw = torch.log_softmax(z, dim=1)
            calibrated = calibrator(z).to(torch.float64)
        binary = logits.dim() == 1
        before, bins_before = split_scores(raw, y, binary=binary, n_bins=self.n_bins)
        after, bins_after = split_scores(calibrated, y, binary=binary, n_bins=self.n_bins)
        return before, after, bins_before, bins_after

    def _fit(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        gathered = self._gathered(trainer, "val")  # every process takes part in the gathers
        if gathered is None:
            return
        self._saw_samples = True
        if self._kind == "multilabel":
            if "multilabel" not in self._warned:
                self._warned.add("multilabel")
                rank_zero_warn(f"{self.name}: {self.MULTILABEL}", category=LightningLossesWarning)
            return
        logits, target = gathered
        if self.exclude is not None:  # the samples another callback holds out (conformal)
            keep = ~self.exclude(sample_positions(self._counts))
            logits, target = logits[keep], target[keep]
        started = time.perf_counter()
        try:
            self.selection = self._select(logits, target)
        except ValueError as error:
            raise ValueError(
                f"{self.name}(methods={list(self.methods)}) cannot calibrate the validation "
                f"outputs of epoch {trainer.current_epoch}: {error}"
            ) from error
        self.fitted_at = {"epoch": trainer.current_epoch, "global_step": trainer.global_step}
        self._restored, self._fitted_by = False, trainer
        self.fit_seconds = time.perf_counter() - started
        self._report_fit(trainer.current_epoch)
        self._after_fit(trainer, pl_module, logits, target)

    def _report_fit(self, epoch: int) -> None:
        """Warn, once per method and fit, about a method that cannot be scored or a bound."""
        assert self.selection is not None
        for method, score in self.selection.scores.items():
            reason = unscored_reason(score)
            if reason and f"unscored {method}" not in self._warned:
                self._warned.add(f"unscored {method}")
                rank_zero_warn(
                    f"{self.name}: {method} cannot be scored at epoch {epoch}: {reason}. It is "
                    f"not chosen, and {PREFIX}cv_nll_{method} is logged as NaN in every epoch "
                    "where it cannot be scored",
                    category=LightningLossesWarning,
                )
        calibrator = self.selection.calibrator
        if calibrator.bound and f"bound {calibrator.method}" not in self._warned:
            self._warned.add(f"bound {calibrator.method}")
            rank_zero_warn(
                f"{self.name}: the chosen {calibrator.name} ({calibrator.method}) ran to a bound "
                f"of its fit at epoch {epoch}: {calibrator.bound}",
                category=LightningLossesWarning,
            )

    def _after_fit(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, logits: Tensor, target: Tensor
    ) -> None:
        """Log the fit: raw and calibrated scores, the candidates' scores, the fallbacks."""
        assert self.selection is not None
        selection = self.selection
        before, after, bins_before, bins_after = self._evaluate(
            selection.calibrator, logits, target
        )
        self.report = {
            **{f"{q}_before": before[q] for q in QUANTITIES},
            **{f"{q}_after": after[q] for q in QUANTITIES},
        }
        # A score that is not finite is logged as NaN (MLflow keeps NaN; it would store inf as
        # the largest float), never left out: the latest value is always this fit's.
        metrics = {
            f"{PREFIX}cv_nll_{m}": s if math.isfinite(s) else math.nan
            for m, s in selection.scores.items()
        }
        metrics.update({f"{PREFIX}fallback_{m}": 1.0 for m in selection.fallbacks})
        metrics[f"{PREFIX}fit_seconds"] = self.fit_seconds
        self._log_split(trainer, pl_module, "val", before, after, metrics)
        fallbacks = "; ".join(f"{m}: {r}" for m, r in sorted(selection.fallbacks.items()))
        set_tags(
            trainer,
            {f"{PREFIX}method": selection.method, f"{PREFIX}fallbacks": fallbacks or "none"},
        )
        self._val_bins = (trainer.current_epoch, bins_before, bins_after)

    def _log_split(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        stage: str,
        before: Mapping[str, float],
        after: Mapping[str, float],
        extra: Mapping[str, float],
    ) -> None:
        """Log ``<stage>/posthoc_<q>``, the raw ``<stage>/<q>`` nobody else logs, and ``extra``."""
        taken = self._keys_of_others(trainer)
        metrics = {f"{stage}/{CALIBRATED}{q}": after[q] for q in QUANTITIES}
        metrics.update(
            {f"{stage}/{q}": before[q] for q in QUANTITIES if f"{stage}/{q}" not in taken}
        )
        metrics.update(extra)
        self._own_keys.update(metrics)
        # The same values on every process (computed from the gathered outputs): max is exact,
        # and Lightning does not warn about an unsynchronized epoch metric.
        pl_module.log_dict(metrics, sync_dist=True, reduce_fx="max")

    def _keys_of_others(self, trainer: pl.Trainer) -> set[str]:
        """Keys logged by anyone but this callback, remembered across epochs."""
        self._other_keys.update(set(trainer.callback_metrics) - self._own_keys)
        return self._other_keys

    def _draw(self, trainer: pl.Trainer, stage: str, title: str, bins: tuple[Bins, Bins]) -> None:
        """Save the raw and calibrated reliability diagrams and log them as artifacts (rank 0)."""
        if not (self.log_diagrams and trainer.is_global_zero):
            return
        from lightning_losses.calibration.diagram import reliability_diagram

        epoch = self.fitted_at.get("epoch")
        suffix = "untrained" if epoch is None else f"epoch={epoch:03d}"
        folder = figure_folder(trainer)
        folder.mkdir(parents=True, exist_ok=True)
        loggers = artifact_loggers(trainer)
        method = self.method or "none"
        self.last_diagrams = []
        for label, sums, name in (("raw", bins[0], "raw"), ("calibrated", bins[1], method)):
            path = folder / f"posthoc_{stage}_{label}_{suffix}.png"
            reliability_diagram(*sums, path=path, title=diagram_title(trainer, f"{title}, {name}"))
            self.last_diagrams.append(path)
            for log_file in loggers:
                log_file(str(path), artifact_path="calibration")

    # --- hooks -----------------------------------------------------------------------------

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._buffers.pop("val", None)
        self._first.discard("val")

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
        # Checked in the sanity check too (before any training step), kept only after it.
        self._read_batch("val", outputs, pl_module, keep=not trainer.sanity_checking)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._due(trainer):
            self._fit(trainer, pl_module)
        elif self._buffers.pop("val", None) is not None:
            self._saw_samples = True

    def _due(self, trainer: pl.Trainer) -> bool:
        """Fit now? Every ``every_n_epochs`` epochs, the last one, and outside ``fit``."""
        if trainer.state.fn != "fit":
            return True
        epoch, last = trainer.current_epoch, trainer.max_epochs
        final = last is not None and last >= 0 and epoch + 1 >= last
        return final or (epoch + 1) % self.every_n_epochs == 0

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keys_of_others(trainer)  # also what the module logged in its epoch-end hook

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_bins is not None:  # before the logger closes the run
            epoch, before, after = self._val_bins
            self._draw(trainer, "val", f"val, epoch {epoch}", (before, after))

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.selection is not None or self._kind == "multilabel":  # fitted, or said so
            return
        reason = (
            f"no validation epoch was due (every_n_epochs={self.every_n_epochs})"
            if self._saw_samples
            else "no validation outputs to fit on"
        )
        rank_zero_warn(f"{self.name}: {reason}", category=LightningLossesWarning)

    def _applied(self, trainer: pl.Trainer, stage: str) -> PostHocCalibrator | None:
        """The calibrator to apply at ``test``/``predict``; warns when there is none."""
        if trainer.ckpt_path is not None and not self._restored:
            self.selection, self.fitted_at = None, {}  # a checkpoint that holds none
        if self.selection is None:
            rank_zero_warn(
                f"{self.name}: no fitted calibrator to {stage} with (fit first, or pass the "
                "ckpt_path of a checkpoint saved with this callback): outputs are left as they "
                "are",
                category=LightningLossesWarning,
            )
        elif not self._current(trainer):
            rank_zero_warn(
                f"{self.name}: the calibrator was fitted at step "
                f"{self.fitted_at.get('global_step')}, the weights are of step "
                f"{trainer.global_step} (no validation since): outputs are left as they are",
                category=LightningLossesWarning,
            )
            return None
        return self.calibrator

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._test_calibrator = self._applied(trainer, "test")

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._buffers.pop("test", None)
        self._first.discard("test")

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
        self._read_batch("test", outputs, pl_module, keep=True)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        gathered = self._gathered(trainer, "test")  # every process takes part in the gathers
        calibrator = self._test_calibrator
        if gathered is None or calibrator is None or self._kind not in ("multiclass", "binary"):
            return
        before, after, bins_before, bins_after = self._evaluate(calibrator, *gathered)
        self.test_report = {
            **{f"{q}_before": before[q] for q in QUANTITIES},
            **{f"{q}_after": after[q] for q in QUANTITIES},
        }
        self._log_split(trainer, pl_module, "test", before, after, {})
        epoch = self.fitted_at.get("epoch")
        self._draw(trainer, "test", f"test, epoch {epoch}", (bins_before, bins_after))

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keys_of_others(trainer)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        calibrator = self._applied(trainer, "predict")
        if calibrator is None:
            return
        setter = getattr(pl_module, "set_calibrator", None)
        if callable(setter):  # ClassifierModule applies it in its own predict_step
            previous = getattr(pl_module, "calibrator", None)
            setter(calibrator)
            self._undo_predict = lambda: setter(previous)
            return
        original = pl_module.predict_step
        owner, module = self.name, type(pl_module).__name__

        def predict_step(*args: Any, **kwargs: Any) -> Tensor:
            output = original(*args, **kwargs)
            if not isinstance(output, Tensor) or not output.is_floating_point():
                raise ValueError(
                    f"{owner} calibrates the logits {module}.predict_step returns ([N, C], [N] "
                    f"binary or [N, n, m]); it returned {describe_output(output)}"
                )
            return calibrated_probabilities(calibrator, output)

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
        self._restore_predict()  # also after an exception while predicting
