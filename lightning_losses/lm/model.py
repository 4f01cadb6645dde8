"""The tiny causal Transformer and its token calibration metric."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_losses.functional.linear import linear_prediction_statistics
from lightning_losses.lightning.backbone_spec import is_plain
from lightning_losses.lightning.class_path import instantiate
from lightning_losses.lightning.classifier import OptimizerFactory
from lightning_losses.lightning.evaluation import MeanOfTerms
from lightning_losses.lightning.mixin import LossMixin, describe_criterion
from lightning_losses.losses import LinearTargetLoss

# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------


class TokenCalibration(Metric):
    """Token NLL, accuracy and top-label ECE from per-token statistics, as float64 sums.

    ``update(log_p, confidence, correct)`` takes what
    :func:`~lightning_losses.functional.linear.linear_prediction_statistics` returns: chunk by
    chunk, without the ``[N, V]`` logits, the terms that
    :func:`~lightning_losses.functional.evaluation.nll_terms` (``-log_p``) and
    :func:`~lightning_losses.functional.evaluation.correct_terms` (``correct``) give on the full
    logits, so ``nll`` and ``acc`` are those of the one home of the formulas. State:
    the token count, the sum of ``-log p_t``, and per equal-width bin ``(k/B, (k+1)/B]`` the
    count, confidence sum and correct sum (:func:`lightning_losses.calibration.functional.binned_statistics`);
    DDP sums them. ``compute()`` gives ``{"nll", "ppl", "acc", "ece"}`` with ``ppl = exp(nll)``
    and ``ece = sum_b |conf_sum_b - correct_sum_b| / count``.

    Example:
        >>> metric = TokenCalibration(n_bins=2)
        >>> metric.update(torch.log(torch.tensor([0.5, 0.25])), torch.tensor([0.9, 0.3]),
        ...               torch.tensor([True, False]))
        >>> {k: round(v.item(), 4) for k, v in metric.compute().items()}
        {'nll': 1.0397, 'ppl': 2.8284, 'acc': 0.5, 'ece': 0.2}
    """  # noqa: E501

    full_state_update = False
    bin_count: Tensor  # states, added by the constructor
    bin_confidence: Tensor
    bin_correct: Tensor
    nll_sum: Tensor
    tokens: Tensor

    def __init__(self, n_bins: int = 15, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_bins = n_bins
        zeros = torch.zeros(n_bins, dtype=torch.float64)
        for name in ("bin_count", "bin_confidence", "bin_correct"):
            self.add_state(name, default=zeros.clone(), dist_reduce_fx="sum")
        scalar = torch.zeros((), dtype=torch.float64)
        self.add_state("nll_sum", default=scalar.clone(), dist_reduce_fx="sum")
        self.add_state("tokens", default=scalar.clone(), dist_reduce_fx="sum")

    def update(self, log_p: Tensor, confidence: Tensor, correct: Tensor) -> None:
        """Add a batch's tokens: ``-log_p`` to the NLL sum, each pair to its bin."""
        from lightning_losses.calibration.functional import binned_statistics

        count, confidence_sum, correct_sum = binned_statistics(
            confidence, correct.to(confidence.dtype), self.n_bins
        )
        self.bin_count += count
        self.bin_confidence += confidence_sum
        self.bin_correct += correct_sum
        self.nll_sum -= log_p.to(torch.float64).sum()
        self.tokens += log_p.numel()

    def compute(self) -> dict[str, Tensor]:
        """``{"nll", "ppl", "acc", "ece"}`` over every token seen (synced across processes)."""
        from lightning_losses.calibration.functional import calibration_error_from_bins

        tokens = self.tokens.clamp_min(1.0)
        nll = self.nll_sum / tokens
        return {
            "nll": nll,
            "ppl": torch.exp(nll),
            "acc": self.bin_correct.sum() / tokens,
            "ece": calibration_error_from_bins(
                self.bin_count, self.bin_confidence, self.bin_correct
            ),
        }


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


class TinyLanguageModel(LossMixin, L.LightningModule):
    """A causal Transformer language model trained through a chunked linear-head loss.

    Token and learned position embeddings, ``n_layers`` pre-norm Transformer encoder layers
    with a causal mask, a final LayerNorm; the output layer is the token embedding (tied) plus
    a bias. Training calls ``self.criterion(hidden, self.token_embedding.weight, target,
    self.output_bias)``: a :class:`~lightning_losses.LinearTargetLoss`, so the logits are built
    a chunk of tokens at a time and its hyper-parameters (``criterion.gamma``) can be scheduled.

    Logged: ``train/loss``, ``criterion/<hyper-parameter>``, ``val/loss`` (the criterion),
    and from :class:`TokenCalibration` ``val/nll``, ``val/ppl``, ``val/acc``, ``val/ece``
    (token-level, plain cross-entropy semantics whatever the training loss). The
    ``[tokens, vocabulary]`` logits never leave the criterion, so ``validation_step`` returns
    nothing for ``CalibrationMonitor``, and ``LossSwitch`` must be given ``LinearTargetLoss``
    specifications (``class_path`` mappings), not names of the logits losses.

    Args:
        criterion: a :class:`~lightning_losses.LinearTargetLoss` (in YAML a ``class_path`` /
            ``init_args`` mapping), or a loss name of its family (``"gamma_ce"``...).
        vocab_size: output classes (linked from the DataModule by :func:`main`).
        context_length: longest sequence (linked from the DataModule).
        d_model: width of the model.
        n_heads: attention heads.
        n_layers: Transformer layers.
        dropout: dropout in the layers.
        n_bins: bins of the validation ECE.
        optimizer: a factory ``params -> Optimizer`` (default Adam, lr 3e-3).

    Example:
        >>> model = TinyLanguageModel("gamma_ce", vocab_size=50, context_length=8, d_model=16)
        >>> tokens = torch.randint(0, 50, (2, 8))
        >>> model(tokens).shape, model.logits(tokens).shape
        (torch.Size([2, 8, 16]), torch.Size([2, 8, 50]))
        >>> model.criterion
        LinearTargetLoss(loss='gamma_ce', gamma=0.5, threshold=0.0, reduction='mean')
    """

    def __init__(
        self,
        criterion: LinearTargetLoss | str | None = None,
        vocab_size: int = 4096,
        context_length: int = 32,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 1,
        dropout: float = 0.0,
        n_bins: int = 15,
        optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["criterion"])
        # Checkpoints must load with torch.load(weights_only=True): keep hparams plain.
        plain = criterion is None or is_plain(criterion)
        self.hparams["criterion"] = criterion if plain else describe_criterion(criterion)
        if not is_plain(self.hparams.get("optimizer")):
            self.hparams.pop("optimizer")
        self.optimizer_factory = optimizer
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(context_length, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.token_embedding.weight, std=d_model**-0.5)
        nn.init.normal_(self.position_embedding.weight, std=0.02)
        if criterion is None or isinstance(criterion, str):
            criterion = LinearTargetLoss(criterion or "ce")
        self.set_criterion(criterion)
        self.val_calibration = TokenCalibration(n_bins)
        self.val_loss = MeanOfTerms()

    def forward(self, tokens: Tensor) -> Tensor:
        """Final hidden states ``[B, L, d_model]`` of token ids ``[B, L]``."""
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        return self.norm(self.layers(x, mask=mask, is_causal=True))

    def logits(self, tokens: Tensor) -> Tensor:
        """Full ``[B, L, V]`` next-token logits (for generation and small inputs)."""
        return self(tokens) @ self.token_embedding.weight.T + self.output_bias

    def _loss(self, tokens: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self(tokens)
        loss = self.criterion(hidden, self.token_embedding.weight, target, self.output_bias)
        return hidden, loss

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        """The batch's loss; logs ``train/loss`` and the scheduled criterion values."""
        tokens, target = batch
        if self._attached_to_trainer():
            self.log_criterion_hyperparameters()
        _, loss = self._loss(tokens, target)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        """Accumulate ``val/loss`` and the token statistics of :class:`TokenCalibration`."""
        tokens, target = batch
        hidden, loss = self._loss(tokens, target)
        # A sum-state mean: exact under DDP whatever each process holds.
        self.val_loss.update(loss, weight=target.numel())
        self.log("val/loss", self.val_loss, on_epoch=True, prog_bar=True)
        statistics = linear_prediction_statistics(
            hidden,
            self.token_embedding.weight,
            target,
            bias=self.output_bias,
            ignore_index=getattr(self.criterion, "ignore_index", -100),
        )
        self.val_calibration.update(*statistics)

    def on_validation_epoch_end(self) -> None:
        """Log ``val/nll``, ``val/ppl``, ``val/acc`` and ``val/ece`` of the epoch's tokens."""
        results = self.val_calibration.compute()
        for name, value in results.items():
            self.log(f"val/{name}", value.float(), prog_bar=name == "ppl")
        self.val_calibration.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The optimizer ``optimizer`` makes (a factory or a ``class_path`` mapping), else Adam."""
        factory = self.optimizer_factory
        if factory is None:
            return torch.optim.Adam(self.parameters(), lr=3e-3)
        if isinstance(factory, dict):  # a class_path mapping restored from a checkpoint
            return instantiate(factory, self.parameters(), argument="optimizer")
        return factory(self.parameters())
