"""A tiny language model on the English documentation that ships with Python.

TaiLr's gamma-CE
(Su Jianlin, "A simple remedy for the overconfidence of cross-entropy")
was made for text generation, where the output layer has a
vocabulary of thousands of words. This module is the smallest complete example of that setting:

- :class:`WordTokenizer`: lowercased words and punctuation, split by one regular expression
  (a run of one punctuation character is one token), with ``<unk>`` and ``<eos>``;
- :class:`TokenWindows`: next-token windows of fixed length over a stream of token ids;
- :class:`PydocTopicsDataModule`: ``pydoc_data.topics`` (79 topics, ~465 K characters, part of
  the standard library: nothing is downloaded) split by topic into train and validation; the
  vocabulary is built from the training topics only;
- :class:`TinyLanguageModel`: a causal Transformer (``LossMixin``) whose criterion is a
  :class:`~lightning_losses.LinearTargetLoss` called on the final hidden states and the tied
  output embedding, so the ``[tokens, vocabulary]`` logits are never built in training and
  ``criterion.gamma`` can be annealed by :class:`~lightning_losses.callbacks.GammaAnnealing`;
- :class:`TokenCalibration`: validation perplexity (``exp`` of the mean token NLL, plain
  cross-entropy whatever the training loss) and the top-label ECE of the tokens, from per-bin
  float64 sums;
- :func:`main`: ``python -m lightning_losses.lm fit --config configs/lm/lm_ce.yaml``.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics import Metric

from .cli import TrackingCLI
from .data import ResumableDataLoader, UnpaddedDistributedSampler
from .functional.linear import linear_prediction_statistics
from .losses import LinearTargetLoss
from .mixins import LossMixin, _import_class, describe_criterion
from .models import MeanOfTerms, OptimizerFactory, _is_plain
from .tracking import TrackingConfigCallback

__all__ = [
    "LanguageModelCLI",
    "PydocTopicsDataModule",
    "TinyLanguageModel",
    "TokenCalibration",
    "TokenWindows",
    "WordTokenizer",
    "console_main",
    "load_topics",
    "main",
    "split_topics",
]

#: A word (letters, digits, underscores) or a run of one punctuation character.
TOKEN_PATTERN = re.compile(r"[a-z0-9_]+|([^\sa-z0-9_])\1*")


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------


class WordTokenizer:
    """Lowercased words and punctuation, mapped to ids by a fixed vocabulary.

    ``tokenize`` lowercases the text and splits it with :data:`TOKEN_PATTERN`; ``encode`` maps
    each token to its id, or to ``<unk>`` (id 0) when the vocabulary lacks it. ``<eos>`` (id 1)
    marks the end of a document. ``decode`` joins the tokens with spaces, so
    ``decode(encode(text)) == " ".join(tokenize(text))`` when every token is known.

    Args:
        vocabulary: the tokens, ids in order; ``<unk>`` and ``<eos>`` are put first if missing.

    Example:
        >>> tokenizer = WordTokenizer.fit(["The cat sat.", "the dog"], max_size=6)
        >>> tokenizer.vocabulary
        ['<unk>', '<eos>', 'the', '.', 'cat', 'dog']
        >>> tokenizer.encode("The bird sat.")
        [2, 0, 0, 3]
        >>> tokenizer.decode(tokenizer.encode("The cat."))
        'the cat .'
    """

    unk_token = "<unk>"
    eos_token = "<eos>"

    def __init__(self, vocabulary: Sequence[str]) -> None:
        specials = [self.unk_token, self.eos_token]
        tokens = specials + [token for token in vocabulary if token not in specials]
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocabulary must not repeat a token")
        self.vocabulary: list[str] = tokens
        self._ids = {token: index for index, token in enumerate(tokens)}

    @property
    def unk_id(self) -> int:
        return self._ids[self.unk_token]

    @property
    def eos_id(self) -> int:
        return self._ids[self.eos_token]

    def __len__(self) -> int:
        return len(self.vocabulary)

    @staticmethod
    def tokenize(text: str) -> list[str]:
        """Lowercased words and punctuation runs, in order."""
        return [match.group(0) for match in TOKEN_PATTERN.finditer(text.lower())]

    @classmethod
    def fit(cls, texts: Iterable[str], max_size: int = 4096, min_count: int = 1) -> WordTokenizer:
        """The ``max_size - 2`` most frequent tokens of ``texts`` seen ``min_count`` times.

        Ties in frequency are broken alphabetically, so the vocabulary depends only on the
        texts.
        """
        if max_size < 3:
            raise ValueError(f"max_size must be at least 3 (two special tokens); got {max_size}")
        counts: collections.Counter[str] = collections.Counter()
        for text in texts:
            counts.update(cls.tokenize(text))
        ranked = sorted((token for token in counts if counts[token] >= min_count),
                        key=lambda token: (-counts[token], token))  # fmt: skip
        return cls(ranked[: max_size - 2])

    def encode(self, text: str, *, eos: bool = False) -> list[int]:
        """Token ids of ``text`` (``<unk>`` for unknown tokens), with ``<eos>`` if asked."""
        unk = self.unk_id
        ids = [self._ids.get(token, unk) for token in self.tokenize(text)]
        return [*ids, self.eos_id] if eos else ids

    def decode(self, ids: Iterable[int]) -> str:
        """The tokens of ``ids`` joined by spaces."""
        return " ".join(self.vocabulary[int(index)] for index in ids)


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def load_topics() -> dict[str, str]:
    """``pydoc_data.topics.topics``: topic name -> English documentation text."""
    from pydoc_data.topics import topics

    return dict(topics)


def split_topics(
    names: Iterable[str], val_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """Sorted train and validation topic names: a seeded permutation of the sorted names.

    Example:
        >>> split_topics(["d", "a", "c", "b"], 0.25, seed=0)
        (['a', 'b', 'd'], ['c'])
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    ordered = sorted(names)
    n_val = max(1, round(val_fraction * len(ordered)))
    if n_val >= len(ordered):
        raise ValueError(f"cannot split {len(ordered)} topics with val_fraction={val_fraction}")
    order = np.random.default_rng(seed).permutation(len(ordered))
    val = sorted(ordered[i] for i in order[:n_val])
    train = sorted(ordered[i] for i in order[n_val:])
    return train, val


class TokenWindows(Dataset):
    """Non-overlapping next-token windows: item ``i`` is ``(ids[s:s+L], ids[s+1:s+L+1])``.

    ``s = i * L`` with ``L = context_length``; a final piece shorter than a window is dropped.

    Example:
        >>> windows = TokenWindows(torch.arange(10), context_length=4)
        >>> len(windows), windows[1]
        (2, (tensor([4, 5, 6, 7]), tensor([5, 6, 7, 8])))
    """

    def __init__(self, ids: Tensor, context_length: int) -> None:
        if context_length < 1:
            raise ValueError(f"context_length must be >= 1; got {context_length}")
        self.ids = torch.as_tensor(ids, dtype=torch.long)
        self.context_length = context_length

    def __len__(self) -> int:
        return max(0, (self.ids.numel() - 1) // self.context_length)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range for {len(self)} windows")
        start = index * self.context_length
        window = self.ids[start : start + self.context_length + 1]
        return window[:-1], window[1:]


class PydocTopicsDataModule(L.LightningDataModule):
    """Next-token prediction on ``pydoc_data.topics``, split by topic.

    The topic names are sorted and permuted with ``seed``; ``val_fraction`` of them are the
    validation split (fixed for a seed). The tokenizer is fitted on the training topics only;
    each topic is encoded with a final ``<eos>`` and the topics of a split are concatenated in
    name order, then cut into :class:`TokenWindows`. Everything is built in ``__init__`` so that
    a CLI can link :attr:`vocab_size` and :attr:`context_length` into the model.

    Args:
        context_length: tokens per window.
        batch_size: windows per batch.
        max_vocab_size: at most this many tokens, ``<unk>`` and ``<eos>`` included.
        min_count: a token enters the vocabulary if seen this often in training.
        val_fraction: fraction of the topics held out for validation.
        seed: chooses the split and the training order.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = PydocTopicsDataModule(context_length=32)
        >>> dm.vocab_size > 2000, len(dm.val_topics)
        (True, 8)
        >>> x, y = dm.dataset("train")[0]
        >>> x.shape, bool((x[1:] == y[:-1]).all())
        (torch.Size([32]), True)
    """

    def __init__(
        self,
        context_length: int = 32,
        batch_size: int = 32,
        max_vocab_size: int = 4096,
        min_count: int = 1,
        val_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers
        topics = load_topics()
        self.train_topics, self.val_topics = split_topics(topics, val_fraction, seed)
        self.tokenizer = WordTokenizer.fit(
            (topics[name] for name in self.train_topics), max_vocab_size, min_count
        )
        self._ids = {
            split: torch.tensor(
                [i for name in names for i in self.tokenizer.encode(topics[name], eos=True)]
            )
            for split, names in (("train", self.train_topics), ("val", self.val_topics))
        }

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary, special tokens included."""
        return len(self.tokenizer)

    def dataset(self, split: str) -> TokenWindows:
        """The windows of ``"train"`` or ``"val"``."""
        if split not in self._ids:
            raise ValueError(f"split must be 'train' or 'val'; got {split!r}")
        return TokenWindows(self._ids[split], self.context_length)

    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled by ``(seed, epoch)``; resumable mid-epoch from a Lightning checkpoint."""
        return ResumableDataLoader(
            self.dataset("train"),
            batch_size=self.batch_size,
            seed=self.seed,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        # Under DDP each window is validated by exactly one process (no padding, no repeats).
        dataset = self.dataset("val")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=UnpaddedDistributedSampler(dataset),
            num_workers=self.num_workers,
        )


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------


class TokenCalibration(Metric):
    """Token NLL, accuracy and top-label ECE from per-token statistics, as float64 sums.

    ``update(log_p, confidence, correct)`` takes what
    :func:`~lightning_losses.functional.linear.linear_prediction_statistics` returns. State:
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
        from .calibration.functional import binned_statistics

        count, confidence_sum, correct_sum = binned_statistics(
            confidence, correct.to(confidence.dtype), self.n_bins
        )
        self.bin_count += count
        self.bin_confidence += confidence_sum
        self.bin_correct += correct_sum
        self.nll_sum -= log_p.to(torch.float64).sum()
        self.tokens += log_p.numel()

    def compute(self) -> dict[str, Tensor]:
        from .calibration.functional import calibration_error_from_bins

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
        plain = criterion is None or _is_plain(criterion)
        self.hparams["criterion"] = criterion if plain else describe_criterion(criterion)
        if not _is_plain(self.hparams.get("optimizer")):
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
        tokens, target = batch
        if self._attached_to_trainer():
            self.log_criterion_hyperparameters()
        _, loss = self._loss(tokens, target)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
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
        results = self.val_calibration.compute()
        for name, value in results.items():
            self.log(f"val/{name}", value.float(), prog_bar=name == "ppl")
        self.val_calibration.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        factory = self.optimizer_factory
        if factory is None:
            return torch.optim.Adam(self.parameters(), lr=3e-3)
        if isinstance(factory, dict):  # a class_path mapping restored from a checkpoint
            cls = _import_class(factory["class_path"])
            return cls(self.parameters(), **dict(factory.get("init_args") or {}))
        return factory(self.parameters())


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


class LanguageModelCLI(TrackingCLI):
    """LightningCLI that links the DataModule's vocabulary and context length into the model.

    Like ``lightning-losses fit``, it records the config in MLflow (``TrackingConfigCallback``)
    and continues a checkpoint's MLflow run on ``fit --ckpt_path``.
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in ("vocab_size", "context_length"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")


def main(args: list[str] | None = None, run: bool = True, **cli_kwargs: Any) -> LightningCLI:
    """``python -m lightning_losses.lm fit --config configs/lm/lm_ce.yaml`` (or ``validate``).

    A LightningCLI with ``subclass_mode_model=True`` and ``subclass_mode_data=True`` over
    :class:`TinyLanguageModel` and :class:`PydocTopicsDataModule` (or subclasses); returns it.
    """
    kwargs: dict[str, Any] = {
        "subclass_mode_model": True,
        "subclass_mode_data": True,
        "seed_everything_default": 0,
        "save_config_kwargs": {"overwrite": True},
        "save_config_callback": TrackingConfigCallback,
        "auto_configure_optimizers": False,
    }
    kwargs.update(cli_kwargs)
    return LanguageModelCLI(TinyLanguageModel, PydocTopicsDataModule, args=args, run=run, **kwargs)


def console_main() -> int:
    """Console-script entry point: :func:`main` on the command line, exit status 0."""
    main()
    return 0


if __name__ == "__main__":  # pragma: no cover
    # ``python -m`` runs this file as ``__main__``: use the classes of the importable module,
    # which the configs name (``lightning_losses.lm.TinyLanguageModel``).
    from lightning_losses.lm import main as _main

    _main()
