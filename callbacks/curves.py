"""``SplitCurves``: a held-out split's NLL, accuracy and ECE logged during training, as curves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from lightning_losses.functional.checks import check_choice, check_int
from lightning_losses.functional.evaluation import correct_terms, nll_terms
from lightning_losses.loss_ranges import CALLBACK_COUNTS

#: Splits whose DataModule loader the callback can read.
SPLITS = ("train", "val", "test")


class SplitCurves(Callback):
    """Log a split's NLL, accuracy and ECE every few epochs: the curves of over-fitting.

    After every ``every_n_epochs``-th validation epoch (and the last one of ``max_epochs``),
    the model in eval mode runs over the DataModule's ``<split>_dataloader()`` and the callback
    logs, at the current global step,

    - ``curve/<split>_nll``: ``-(1/N) sum_i log p_i[y_i]`` (softmax for ``[N, C]`` logits,
      sigmoid for ``[N]`` binary logits),
    - ``curve/<split>_acc``: top-1 accuracy (``logit > 0`` for binary),
    - ``curve/<split>_ece``: ECE with ``n_bins`` equal-width bins, as ``CalibrationMonitor``
      computes it (top label for multiclass, positive class for binary).

    This is how a test NLL that rises while the training NLL goes to zero is drawn (Mukhoti et
    al., "Calibrating Deep Neural Networks using Focal Loss", NeurIPS 2020, Figure 1). The
    values only go to the loggers: nothing trains, stops or selects checkpoints on them, so a
    test split may be watched without leaking into the model.

    Under DDP every process evaluates its own share of the split and the sums (NLL, correct
    count, per-bin confidence and correctness, sample count) are added across processes
    before dividing, so the values are those of the whole split, exactly, provided the loader
    gives each sample to one process (the package's DataModules use
    :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler`).

    Args:
        split: ``"test"``, ``"val"`` or ``"train"``: the DataModule loader to evaluate.
        every_n_epochs: evaluate after every n-th training epoch (``>= 1``).
        n_bins: equal-width bins of the ECE (``>= 1``).

    Raises:
        ValueError: at setup, when the trainer has no DataModule with ``<split>_dataloader``;
            at construction, for a bad argument. Each message names the argument.

    Example:
        >>> from lightning_losses.callbacks import SplitCurves
        >>> SplitCurves("test", every_n_epochs=5)
        SplitCurves(split='test', every_n_epochs=5, n_bins=15)
    """

    def __init__(self, split: str = "test", every_n_epochs: int = 5, n_bins: int = 15) -> None:
        check_choice("split", split, SPLITS)
        self.split = split
        counts = CALLBACK_COUNTS["SplitCurves"]
        every = counts["every_n_epochs"]
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, **every)
        self.n_bins = check_int("n_bins", n_bins, **counts["n_bins"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(split={self.split!r}, every_n_epochs={self.every_n_epochs}, "
            f"n_bins={self.n_bins})"
        )

    def _loader(self, trainer: pl.Trainer) -> Any:
        datamodule = getattr(trainer, "datamodule", None)
        method = getattr(datamodule, f"{self.split}_dataloader", None)
        if datamodule is None or not callable(method):
            raise ValueError(
                f"SplitCurves(split={self.split!r}) reads the DataModule's "
                f"{self.split}_dataloader(); this trainer has "
                + ("no DataModule" if datamodule is None else f"a {type(datamodule).__name__} ")
                + ("" if datamodule is None else f"without {self.split}_dataloader")
                + ": fit with datamodule=... or choose another split"
            )
        return method()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._loader(trainer)  # fail before the first step, not after the first epoch

    def _due(self, trainer: pl.Trainer) -> bool:
        epoch = trainer.current_epoch + 1
        return epoch % self.every_n_epochs == 0 or epoch == trainer.max_epochs

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self._due(trainer):
            return
        sums = self._sums(trainer, pl_module)
        sums = trainer.strategy.reduce(sums, reduce_op="sum")
        values = curve_values(sums, self.n_bins)
        metrics = {f"curve/{self.split}_{name}": value for name, value in values.items()}
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    @torch.no_grad()
    def _sums(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tensor:
        from lightning_losses.calibration.functional import binned_statistics

        was_training = pl_module.training
        pl_module.eval()
        sums = torch.zeros(3 + 2 * self.n_bins, dtype=torch.float64, device=pl_module.device)
        try:
            for batch in self._loader(trainer):
                x, target = batch[0].to(pl_module.device), batch[1].to(pl_module.device)
                logits = pl_module(x)
                nll, hit, confidence, correct = curve_terms(logits, target)
                _, conf_sum, correct_sum = binned_statistics(confidence, correct, self.n_bins)
                sums[0] += nll.sum(dtype=torch.float64)
                sums[1] += hit.sum()
                sums[2] += target.shape[0]
                sums[3:] += torch.cat([conf_sum, correct_sum]).to(sums.device)
        finally:
            pl_module.train(was_training)
        return sums


def curve_terms(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample NLL, hit (top-1, or ``logit > 0`` for binary), confidence and correctness.

    All float64. NLL and hit are the float64 terms of
    :func:`~lightning_losses.functional.evaluation.nll_terms` and
    :func:`~lightning_losses.functional.evaluation.correct_terms` (``multiclass`` for ``[N,
    C]``, ``binary`` for ``[N]``). Confidence and correctness are those of
    :func:`~lightning_losses.calibration.functional.confidence_and_correct` (top label for
    ``[N, C]``; the positive class for ``[N]``, as ``CalibrationMonitor``'s ``val/ece``), so
    the ECE curve's last value equals the monitor's ECE of the same split and epoch.

    Example:
        >>> nll, hit, confidence, correct = curve_terms(
        ...     torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.tensor([1, 1])
        ... )
        >>> nll.round(decimals=4).tolist(), hit.tolist()
        ([0.3133, 2.1269], [1.0, 0.0])
    """
    from lightning_losses.calibration.functional import confidence_and_correct

    if logits.ndim not in (1, 2):
        raise ValueError(
            f"SplitCurves needs [N, C] (multiclass) or [N] (binary) logits; got "
            f"{tuple(logits.shape)}"
        )
    z = logits.detach().to(torch.float64)
    task = "multiclass" if z.ndim == 2 else "binary"
    nll = nll_terms(z, target, task, dtype=torch.float64)
    hit = correct_terms(z, target, task)
    confidence, correct = confidence_and_correct(z, target, input_format="logits")
    return nll, hit.to(torch.float64), confidence, correct.to(torch.float64)


def curve_values(sums: Sequence[float] | Tensor, n_bins: int) -> dict[str, float]:
    """NLL, accuracy and ECE from the sums ``[nll, correct, n, conf_sum[B], correct_sum[B]]``.

    ``ECE = sum_b |conf_sum_b - correct_sum_b| / n``, which is ``sum_b (n_b / n) |mean
    confidence_b - accuracy_b|``.

    Example:
        >>> curve_values([1.0, 1.0, 2.0, 0.25, 0.75, 0.0, 1.0], n_bins=2)
        {'nll': 0.5, 'acc': 0.5, 'ece': 0.25}
    """
    s = torch.as_tensor(sums, dtype=torch.float64).cpu()
    n = float(s[2])
    conf_sum, correct_sum = s[3:].view(2, n_bins)
    return {
        "nll": float(s[0]) / n,
        "acc": float(s[1]) / n,
        "ece": float((conf_sum - correct_sum).abs().sum()) / n,
    }
