"""The tiny causal Transformer and its token calibration metric."""

from __future__ import annotations

import abc
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_losses.calibration import bootstrap as BS
from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.debiased import debiased_calibration_error_from_bins
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
    """Token NLL, accuracy and top-label ECE (plain, debiased, 95% interval) from float64 sums.

    ``update(log_p, confidence, correct, index)`` takes what
    :func:`~lightning_losses.functional.linear.linear_prediction_statistics` returns: chunk by
    chunk, without the ``[N, V]`` logits, the terms that
    :func:`~lightning_losses.functional.evaluation.nll_terms` (``-log_p``) and
    :func:`~lightning_losses.functional.evaluation.correct_terms` (``correct``) give on the full
    logits, so ``nll`` and ``acc`` are those of the one home of the formulas. State:
    the token count, the sum of ``-log p_t``, and per equal-width bin ``(k/B, (k+1)/B]`` the
    count, confidence sum and correct sum (:func:`lightning_losses.calibration.functional.binned_statistics`),
    plus the per-group bin sums of :mod:`lightning_losses.calibration.bootstrap`
    (``[n_groups, n_bins, 3]``, each token hashed into a group from its position ``index``);
    DDP sums them all.

    ``compute()`` gives ``nll``, ``ppl = exp(nll)``, ``acc``, ``ece = sum_b |conf_sum_b -
    correct_sum_b| / count``, ``ece_debiased`` (the l1 debiased ECE of Kumar, Liang and Ma,
    "Verified Uncertainty Calibration", from the same bins: what
    :class:`~lightning_losses.calibration.CalibrationSummary` calls ``ece_debiased``) and
    ``ece_low``, ``ece_high``: the interval at ``level`` that
    :func:`~lightning_losses.calibration.calibration_error_interval` gives for the same tokens
    at the same positions, e.g. the token logits of the windows concatenated in order with
    the default positions ``0 .. N-1``. The interval is the same over any batching and any
    number of processes as long as every token keeps its position: see
    :meth:`window_positions`, which :class:`TinyLanguageModel` uses.

    Args:
        n_bins: equal-width bins of the ECE.
        level: confidence level of the interval, in (0, 1).
        n_bootstrap: bootstrap replicates (at least 2).
        seed: the replicates' seed.
        n_groups: groups the tokens are hashed into (the bootstrap's units).
        kwargs: passed to ``torchmetrics.Metric``.

    Example:
        >>> metric = TokenCalibration(n_bins=2)
        >>> metric.update(torch.log(torch.tensor([0.5, 0.25])), torch.tensor([0.9, 0.3]),
        ...               torch.tensor([True, False]))
        >>> values = metric.compute()
        >>> {k: round(values[k].item(), 4) for k in ("nll", "ppl", "acc", "ece")}
        {'nll': 1.0397, 'ppl': 2.8284, 'acc': 0.5, 'ece': 0.2}
        >>> sorted(values)
        ['acc', 'ece', 'ece_debiased', 'ece_high', 'ece_low', 'nll', 'ppl']
    """  # noqa: E501

    # ``forward`` must not restart the default token positions: it updates the full state first.
    full_state_update = True
    bin_count: Tensor  # states, added by the constructor
    bin_confidence: Tensor
    bin_correct: Tensor
    nll_sum: Tensor
    tokens: Tensor
    windows_seen: Tensor
    boot_bins: Tensor
    boot_seen: Tensor

    def __init__(
        self,
        n_bins: int = 15,
        *,
        level: float = 0.95,
        n_bootstrap: int = BS.DEFAULT_N_BOOTSTRAP,
        seed: int = 0,
        n_groups: int = BS.DEFAULT_N_GROUPS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.n_bins = CF.check_n_bins(n_bins)
        self.level = BS.check_level(level)
        self.n_bootstrap = BS.check_n_bootstrap(n_bootstrap)
        self.seed = BS.check_seed(seed)
        self.n_groups = BS.check_n_groups(n_groups)
        zeros = torch.zeros(n_bins, dtype=torch.float64)
        for name in ("bin_count", "bin_confidence", "bin_correct"):
            self.add_state(name, default=zeros.clone(), dist_reduce_fx="sum")
        scalar = torch.zeros((), dtype=torch.float64)
        self.add_state("nll_sum", default=scalar.clone(), dist_reduce_fx="sum")
        self.add_state("tokens", default=scalar.clone(), dist_reduce_fx="sum")
        counter = torch.zeros((), dtype=torch.int64)
        self.add_state("windows_seen", default=counter, dist_reduce_fx="sum")
        BS.add_states(self, n_bins=self.n_bins, n_groups=self.n_groups)

    def window_positions(self, target: Tensor, ignore_index: int = -100) -> Tensor:
        """Stream positions of the kept tokens of the next batch of windows ``[B, L]``.

        Windows are counted per process in loader order since the last ``reset``: this
        process's ``k``-th window is window ``w = rank + world_size * k`` of the data set, the
        order in which :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler`
        deals an unshuffled data set to the processes (one process: ``w = k``). Token ``o`` of
        window ``w`` is at ``w * L + o``: its row among the token logits of all windows
        concatenated in order (:func:`~lightning_losses.lm.evaluation.held_out_logits`), and,
        for :class:`~lightning_losses.lm.data.TokenWindows`, its input's index in the id stream.
        So the positions depend neither on the batch size nor on the number of processes.

        Args:
            target: ``[B, L]`` next-token targets of the batch's windows.
            ignore_index: target value of tokens left out (their positions are dropped).

        Returns:
            int64 ``[kept]`` positions, in the row-major order of ``target`` without the ignored
            tokens: the order of :func:`~lightning_losses.functional.linear.linear_prediction_statistics`.

        Example:
            >>> metric = TokenCalibration()
            >>> metric.window_positions(torch.tensor([[5, 6, 7], [8, -100, 9]]))
            tensor([0, 1, 2, 3, 5])
            >>> metric.window_positions(torch.tensor([[1, 2, 3]]))  # the third window
            tensor([6, 7, 8])
        """  # noqa: E501
        if not isinstance(target, Tensor) or target.dim() != 2:
            shape = list(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(f"target must be a [B, L] tensor of windows' targets; got {shape}")
        rows, length = target.shape
        rank, world = BS._process_rank(self)
        device = target.device
        local = torch.arange(rows, dtype=torch.int64, device=device) + self.windows_seen
        window = local * world + rank
        offsets = torch.arange(length, dtype=torch.int64, device=device)
        positions = window[:, None] * length + offsets[None, :]
        self.windows_seen += rows
        return positions[target != ignore_index]

    def update(
        self, log_p: Tensor, confidence: Tensor, correct: Tensor, index: Tensor | None = None
    ) -> None:
        """Add a batch's tokens: ``-log_p`` to the NLL sum, each pair to its bin and group.

        Args:
            log_p: ``[n]`` log-probabilities of the target tokens.
            confidence: ``[n]`` top-label confidences.
            correct: ``[n]`` whether the top label is the target.
            index: int ``[n]``, the tokens' positions (see :meth:`window_positions`); ``None``:
                token ``i`` of this call is at ``rank + world_size * (tokens seen before +
                i)``, right for one process reading every token in order, not for windows
                split between processes.
        """
        count, confidence_sum, correct_sum = CF.binned_statistics(
            confidence, correct.to(confidence.dtype), self.n_bins
        )
        self.bin_count += count
        self.bin_confidence += confidence_sum
        self.bin_correct += correct_sum
        self.nll_sum -= log_p.to(torch.float64).sum()
        self.tokens += log_p.numel()
        groups = BS.decision_groups(
            self, log_p.reshape(-1), index, None, seed=self.seed, n_groups=self.n_groups
        )
        BS.add_batch(self, groups, confidence, correct, n_bins=self.n_bins)

    def compute(self) -> dict[str, Tensor]:
        """``nll``, ``ppl``, ``acc``, ``ece``, ``ece_debiased``, ``ece_low``, ``ece_high``.

        Over every token seen (synced across processes); float64 scalars.
        """
        tokens = self.tokens.clamp_min(1.0)
        nll = self.nll_sum / tokens
        bins = (self.bin_count, self.bin_confidence, self.bin_correct)
        interval = BS.interval_values(
            self, bins, level=self.level, n_bootstrap=self.n_bootstrap, seed=self.seed
        )
        return {
            "nll": nll,
            "ppl": torch.exp(nll),
            "acc": self.bin_correct.sum() / tokens,
            "ece": CF.calibration_error_from_bins(*bins),
            "ece_debiased": debiased_calibration_error_from_bins(*bins, "l1"),
            "ece_low": interval["ece_low"],
            "ece_high": interval["ece_high"],
        }


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


class TokenLanguageModel(LossMixin, L.LightningModule, abc.ABC):
    """What every next-token model of the package shares: training through a chunked head, token metrics.

    A subclass builds its network, calls :meth:`setup_language_model` in ``__init__``, and
    gives :meth:`next_token_hidden` (final hidden states and targets of a batch) and
    :meth:`output_head` (output weight and bias). Training calls ``self.criterion(hidden,
    weight, target, bias)``, a :class:`~lightning_losses.LinearTargetLoss`, so the ``[tokens,
    vocabulary]`` logits are never built and the criterion's hyper-parameters can be scheduled;
    validation and test log the criterion's mean and :class:`TokenCalibration`'s token
    metrics (from :func:`~lightning_losses.functional.linear.linear_prediction_statistics`,
    chunk by chunk). :class:`TinyLanguageModel` and the Hugging Face integration's
    ``HFCausalLM`` are its subclasses; ``lightning-losses lm fit`` trains any of them.
    """  # noqa: E501

    def setup_language_model(
        self,
        criterion: LinearTargetLoss | str | None,
        n_bins: int,
        optimizer: OptimizerFactory | None,
    ) -> None:
        """Criterion (a ``LinearTargetLoss``, a loss name, ``None``: ``ce``), metrics, optimizer.

        Call after ``save_hyperparameters``: the hyper-parameters ``criterion`` and
        ``optimizer`` are made plain (checkpoints load with ``weights_only=True``).
        """
        plain = criterion is None or is_plain(criterion)
        self.hparams["criterion"] = criterion if plain else describe_criterion(criterion)
        if not is_plain(self.hparams.get("optimizer")):
            self.hparams.pop("optimizer")
        self.optimizer_factory = optimizer
        if criterion is None or isinstance(criterion, str):
            criterion = LinearTargetLoss(criterion or "ce")
        self.set_criterion(criterion)
        self.val_calibration = TokenCalibration(n_bins)
        self.val_loss = MeanOfTerms()
        self.test_calibration = TokenCalibration(n_bins)
        self.test_loss = MeanOfTerms()
        #: ``(epoch, (count, confidence sum, correct sum))`` of the last validation epoch.
        self.last_val_bins: tuple[int, tuple[Tensor, Tensor, Tensor]] | None = None

    @abc.abstractmethod
    def output_head(self) -> tuple[Tensor, Tensor | None]:
        """``(weight [V, H], bias [V] or None)`` of the output layer (each model defines it)."""

    def next_token_hidden(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``(hidden [B, L, H], target [B, L])`` of a batch ``(tokens, target)`` of windows."""
        tokens, target = batch
        return self(tokens), target

    def _loss(self, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        hidden, target = self.next_token_hidden(batch)
        weight, bias = self.output_head()
        loss = self.criterion(hidden, weight, target, bias)
        return hidden, target, loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The batch's loss; logs ``train/loss`` and the scheduled criterion values."""
        if self._attached_to_trainer():
            self.log_criterion_hyperparameters()
        _, _, loss = self._loss(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def _evaluation_step(self, batch: Any, stage: str) -> None:
        """Accumulate ``<stage>/loss`` and the token statistics of :class:`TokenCalibration`."""
        hidden, target, loss = self._loss(batch)
        mean_loss, calibration = self._evaluation_metrics(stage)
        # A sum-state mean: exact under DDP whatever each process holds.
        mean_loss.update(loss, weight=target.numel())
        self.log(f"{stage}/loss", mean_loss, on_epoch=True, prog_bar=True)
        ignore_index = getattr(self.criterion, "ignore_index", -100)
        weight, bias = self.output_head()
        statistics = linear_prediction_statistics(
            hidden, weight, target, bias=bias, ignore_index=ignore_index
        )
        # Positions from the windows' order (not batch_idx): the interval is batching-free.
        index = calibration.window_positions(target, ignore_index)
        calibration.update(*statistics, index=index)

    def _evaluation_metrics(self, stage: str) -> tuple[MeanOfTerms, TokenCalibration]:
        if stage == "test":
            return self.test_loss, self.test_calibration
        return self.val_loss, self.val_calibration

    def _log_token_metrics(self, stage: str) -> None:
        """Log ``<stage>/<name>`` of :class:`TokenCalibration`'s values, then reset it."""
        calibration = self._evaluation_metrics(stage)[1]
        results = calibration.compute()
        for name, value in results.items():
            self.log(f"{stage}/{name}", value.float(), prog_bar=name == "ppl")
        if stage == "val" and not (self._attached_to_trainer() and self.trainer.sanity_checking):
            with calibration.sync_context():  # the bins of every process's tokens
                bins = (
                    calibration.bin_count.clone(),
                    calibration.bin_confidence.clone(),
                    calibration.bin_correct.clone(),
                )
            epoch = self.trainer.current_epoch if self._attached_to_trainer() else 0
            self.last_val_bins = (epoch, bins)
        calibration.reset()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """Accumulate ``val/loss`` and the token statistics of :class:`TokenCalibration`."""
        self._evaluation_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        """Log ``val/<name>`` of :class:`TokenCalibration`'s values over the epoch's tokens."""
        self._log_token_metrics("val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """Accumulate ``test/loss`` and the test split's token statistics."""
        self._evaluation_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        """Log ``test/<name>``: perplexity, token ECE... over the test split's tokens."""
        self._log_token_metrics("test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The optimizer ``optimizer`` makes (a factory or a ``class_path`` mapping), else Adam."""
        factory = self.optimizer_factory
        if factory is None:
            return torch.optim.Adam(self.parameters(), lr=3e-3)
        if isinstance(factory, dict):  # a class_path mapping restored from a checkpoint
            return instantiate(factory, self.parameters(), argument="optimizer")
        return factory(self.parameters())


class TinyLanguageModel(TokenLanguageModel):
    """A causal Transformer language model trained through a chunked linear-head loss.

    Token and learned position embeddings, ``n_layers`` pre-norm Transformer encoder layers
    with a causal mask, a final LayerNorm; the output layer is the token embedding (tied) plus
    a bias. Training calls ``self.criterion(hidden, self.token_embedding.weight, target,
    self.output_bias)``: a :class:`~lightning_losses.LinearTargetLoss`, so the logits are built
    a chunk of tokens at a time and its hyper-parameters (``criterion.gamma``) can be scheduled.

    Logged: ``train/loss``, ``criterion/<hyper-parameter>``, ``val/loss`` (the criterion),
    and from :class:`TokenCalibration` ``val/nll``, ``val/ppl``, ``val/acc``, ``val/ece``,
    ``val/ece_debiased``, ``val/ece_low`` and ``val/ece_high`` (token-level, plain
    cross-entropy semantics whatever the training loss; the interval hashes each token by its
    position in the validation windows, :meth:`TokenCalibration.window_positions`); the same
    under ``test/`` by ``trainer.test``. After each validation epoch (not the sanity check)
    :attr:`last_val_bins` holds its per-bin token sums ``(count, confidence, correct)``,
    summed over processes, for a reliability diagram. The
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
        # Checkpoints must load with torch.load(weights_only=True): hparams made plain there.
        self.setup_language_model(criterion, n_bins, optimizer)

    @property
    def context_length(self) -> int:
        """The longest sequence the model reads (its number of position embeddings)."""
        return self.position_embedding.num_embeddings

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

    def output_head(self) -> tuple[Tensor, Tensor | None]:
        """The tied output layer: ``(token_embedding.weight, output_bias)``."""
        return self.token_embedding.weight, self.output_bias
