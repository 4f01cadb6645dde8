"""Words of Python's own documentation (``pydoc_data.topics``) as next-token windows."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lightning_losses.data.samplers import ResumableDataLoader, UnpaddedDistributedSampler
from lightning_losses.functional.checks import check_fraction

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
        """The id of the unknown-word token (the first id)."""
        return self._ids[self.unk_token]

    @property
    def eos_id(self) -> int:
        """The id of the end-of-sentence token."""
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


class TopicSplit(NamedTuple):
    """Sorted topic names of the training, validation and test splits."""

    train: list[str]
    val: list[str]
    test: list[str]


def split_topics(
    names: Iterable[str], val_fraction: float, seed: int, *, test_fraction: float = 0.0
) -> TopicSplit:
    """Sorted train, validation and test topic names: a seeded permutation of the sorted names.

    The first ``round(val_fraction * n)`` names of the permutation (at least one) are the
    validation split, the next ``round(test_fraction * n)`` the test split (none when
    ``test_fraction`` is 0), the rest the training split; so a test split leaves the validation
    split of the same seed as it was and takes its topics from the training split.

    Example:
        >>> split_topics(["d", "a", "c", "b"], 0.25, seed=0)
        TopicSplit(train=['a', 'b', 'd'], val=['c'], test=[])
        >>> split_topics(["d", "a", "c", "b"], 0.25, seed=0, test_fraction=0.25)
        TopicSplit(train=['b', 'd'], val=['c'], test=['a'])
    """
    check_fraction("val_fraction", val_fraction)
    if test_fraction != 0:
        check_fraction("test_fraction", test_fraction)
    ordered = sorted(names)
    n_val = max(1, round(val_fraction * len(ordered)))
    n_test = max(1, round(test_fraction * len(ordered))) if test_fraction else 0
    if n_val + n_test >= len(ordered):
        raise ValueError(
            f"cannot split {len(ordered)} topics with val_fraction={val_fraction} and "
            f"test_fraction={test_fraction}: no training topic would be left"
        )
    order = np.random.default_rng(seed).permutation(len(ordered))
    val = sorted(ordered[i] for i in order[:n_val])
    test = sorted(ordered[i] for i in order[n_val : n_val + n_test])
    train = sorted(ordered[i] for i in order[n_val + n_test :])
    return TopicSplit(train, val, test)


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
    validation split (fixed for a seed) and ``test_fraction`` of them a held-out test split
    (none by default; :func:`split_topics`). The tokenizer is fitted on the training topics only;
    each topic is encoded with a final ``<eos>`` and the topics of a split are concatenated in
    name order, then cut into :class:`TokenWindows`. Everything is built in ``__init__`` so that
    a CLI can link :attr:`vocab_size` and :attr:`context_length` into the model.

    Args:
        context_length: tokens per window.
        batch_size: windows per batch.
        max_vocab_size: at most this many tokens, ``<unk>`` and ``<eos>`` included.
        min_count: a token enters the vocabulary if seen this often in training.
        val_fraction: fraction of the topics held out for validation.
        test_fraction: fraction of the topics held out for testing (0: no test split).
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
        test_fraction: float = 0.0,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers
        topics = load_topics()
        split = split_topics(topics, val_fraction, seed, test_fraction=test_fraction)
        self.train_topics, self.val_topics, self.test_topics = split
        self.tokenizer = self.fit_tokenizer(
            [topics[name] for name in self.train_topics], max_vocab_size, min_count
        )
        self._ids = {
            split: torch.tensor(
                [i for name in names for i in self.tokenizer.encode(topics[name], eos=True)]
            )
            for split, names in (
                ("train", self.train_topics),
                ("val", self.val_topics),
                ("test", self.test_topics),
            )
            if names
        }

    def fit_tokenizer(self, texts: list[str], max_vocab_size: int, min_count: int) -> Any:
        """The tokenizer of the training texts: a :class:`WordTokenizer` (subclasses may differ).

        Whatever it returns must have ``encode(text, eos=True) -> list[int]`` and ``len()``
        (the vocabulary size), as :class:`WordTokenizer`.
        """
        return WordTokenizer.fit(texts, max_vocab_size, min_count)

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary, special tokens included."""
        return len(self.tokenizer)

    def dataset(self, split: str) -> TokenWindows:
        """The windows of ``"train"``, ``"val"`` or ``"test"`` (with a ``test_fraction``)."""
        if split not in self._ids:
            hint = " (the test split needs test_fraction > 0)" if split == "test" else ""
            raise ValueError(f"split must be one of {', '.join(self._ids)}; got {split!r}{hint}")
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
        """In order; under DDP each window is validated by exactly one process (no padding)."""
        return self._ordered_loader("val")

    def test_dataloader(self) -> DataLoader:
        """The test split's windows, as :meth:`val_dataloader` (needs ``test_fraction > 0``)."""
        return self._ordered_loader("test")

    def _ordered_loader(self, split: str) -> DataLoader:
        dataset = self.dataset(split)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=UnpaddedDistributedSampler(dataset),
            num_workers=self.num_workers,
        )
