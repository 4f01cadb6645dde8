"""A byte-level BPE tokenizer trained here on the embedded corpus, and its DataModule.

A Hugging Face model needs a subword tokenizer, and downloading one is not an option (the
project trains on ``pydoc_data.topics``, part of the standard library). :class:`BPETokenizer`
trains a byte-level BPE (the GPT-2 scheme: every byte is a symbol, so nothing is unknown) with
the ``tokenizers`` library on the training topics, deterministically, and caches the result as
a ``tokenizer.json`` keyed by the texts and the settings. :class:`PydocTopicsBPEDataModule` is
:class:`~lightning_losses.lm.data.PydocTopicsDataModule` with that tokenizer.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lightning_losses.integrations.huggingface._imports import require
from lightning_losses.lm.data import PydocTopicsDataModule

__all__ = ["BPETokenizer", "PydocTopicsBPEDataModule", "default_tokenizer_cache"]

#: Special tokens, in id order: unknown (never produced by a byte-level BPE) and end of text.
SPECIAL_TOKENS = ("<unk>", "<eos>")


def default_tokenizer_cache() -> Path:
    """Where trained tokenizers are cached: ``$LIGHTNING_LOSSES_CACHE/tokenizers``, else
    ``$XDG_CACHE_HOME/lightning-losses/tokenizers``, else ``~/.cache/lightning-losses/tokenizers``.
    """  # noqa: D205
    explicit = os.environ.get("LIGHTNING_LOSSES_CACHE")
    if explicit:
        return Path(explicit).expanduser() / "tokenizers"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return root / "lightning-losses" / "tokenizers"


class BPETokenizer:
    """A byte-level BPE tokenizer with :class:`~lightning_losses.lm.data.WordTokenizer`'s interface.

    ``encode(text, eos=False)`` gives the ids (with ``<eos>``, id 1, when asked), ``decode``
    the text back (byte-level: ``decode(encode(text)) == text``), ``len()`` the vocabulary
    size. :meth:`fit` trains it; :meth:`to_transformers` wraps it as a
    ``PreTrainedTokenizerFast`` for ``save_pretrained``.

    Args:
        tokenizer: a trained ``tokenizers.Tokenizer``.

    Example:
        >>> tokenizer = BPETokenizer.fit(["the cat sat on the mat"] * 3, max_size=300,
        ...                              cache_dir=None)
        >>> len(tokenizer) <= 300, tokenizer.eos_id  # at most 300: as many merges as pairs seen
        (True, 1)
        >>> ids = tokenizer.encode("the cat", eos=True)
        >>> tokenizer.decode(ids[:-1]), ids[-1]
        ('the cat', 1)
    """

    unk_token, eos_token = SPECIAL_TOKENS

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def fit(
        cls,
        texts: Iterable[str],
        max_size: int = 4096,
        min_count: int = 2,
        *,
        cache_dir: str | Path | None = "default",
    ) -> BPETokenizer:
        """Train on ``texts``: at most ``max_size`` tokens, merging pairs seen ``min_count`` times.

        Deterministic for the same texts and settings. With a ``cache_dir`` (the default:
        :func:`default_tokenizer_cache`) the trained tokenizer is saved there as
        ``bpe-<hash>.json``, the hash of the texts, the settings and the ``tokenizers``
        version, and read back next time; ``None`` trains without the cache.
        """
        if max_size < 258:
            raise ValueError(
                f"max_size must be at least 258 (256 bytes and 2 special tokens); got {max_size}"
            )
        texts = list(texts)
        tokenizers = require("tokenizers")
        digest = hashlib.sha256()
        digest.update(f"{max_size}|{min_count}|{tokenizers.__version__}".encode())
        for text in texts:
            digest.update(hashlib.sha256(text.encode()).digest())
        folder = default_tokenizer_cache() if cache_dir == "default" else cache_dir
        path = Path(folder) / f"bpe-{digest.hexdigest()[:16]}.json" if folder else None
        if path is not None and path.is_file():
            return cls(tokenizers.Tokenizer.from_file(str(path)))
        tokenizer = cls._train(tokenizers, texts, max_size, min_count)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            tokenizer.save(str(partial))
            partial.replace(path)  # atomic: a concurrent reader sees all of it or nothing
        return cls(tokenizer)

    @staticmethod
    def _train(tokenizers: Any, texts: Sequence[str], max_size: int, min_count: int) -> Any:
        byte_level = tokenizers.pre_tokenizers.ByteLevel
        tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=SPECIAL_TOKENS[0]))
        tokenizer.pre_tokenizer = byte_level(add_prefix_space=False)
        tokenizer.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=max_size,
            min_frequency=min_count,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=byte_level.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer, length=len(texts))
        return tokenizer

    @property
    def unk_id(self) -> int:
        """The id of ``<unk>`` (0)."""
        return int(self.tokenizer.token_to_id(self.unk_token))

    @property
    def eos_id(self) -> int:
        """The id of ``<eos>`` (1)."""
        return int(self.tokenizer.token_to_id(self.eos_token))

    def __len__(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, text: str, *, eos: bool = False) -> list[int]:
        """Token ids of ``text``, with ``<eos>`` at the end if asked."""
        ids = list(self.tokenizer.encode(text).ids)
        return [*ids, self.eos_id] if eos else ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (special tokens left out)."""
        return str(self.tokenizer.decode([int(i) for i in ids]))

    def to_transformers(self) -> Any:
        """This tokenizer as a ``transformers.PreTrainedTokenizerFast`` (``save_pretrained``)."""
        transformers = require("transformers")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=self.tokenizer,
            unk_token=self.unk_token,
            eos_token=self.eos_token,
            bos_token=self.eos_token,
        )


class PydocTopicsBPEDataModule(PydocTopicsDataModule):
    """:class:`~lightning_losses.lm.data.PydocTopicsDataModule` tokenised by :class:`BPETokenizer`.

    The same topics, splits, windows and loaders; the tokenizer is a byte-level BPE of at most
    ``max_vocab_size`` tokens trained on the training topics (cached, see
    :meth:`BPETokenizer.fit`), so a Hugging Face model trains on the embedded corpus with
    nothing downloaded. Arguments: those of ``PydocTopicsDataModule`` (``min_count``: the
    fewest occurrences of a merged pair, default 2), and ``tokenizer_cache`` (a folder,
    ``"default"``, or ``None`` for no cache).

    Example:
        >>> dm = PydocTopicsBPEDataModule(context_length=64, max_vocab_size=1024)
        >>> dm.vocab_size, type(dm.tokenizer).__name__
        (1024, 'BPETokenizer')
    """

    def __init__(
        self,
        context_length: int = 32,
        batch_size: int = 32,
        max_vocab_size: int = 4096,
        min_count: int = 2,
        val_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
        test_fraction: float = 0.0,
        tokenizer_cache: str | None = "default",
    ) -> None:
        self.tokenizer_cache = tokenizer_cache
        super().__init__(
            context_length=context_length,
            batch_size=batch_size,
            max_vocab_size=max_vocab_size,
            min_count=min_count,
            val_fraction=val_fraction,
            seed=seed,
            num_workers=num_workers,
            test_fraction=test_fraction,
        )

    def fit_tokenizer(self, texts: list[str], max_vocab_size: int, min_count: int) -> Any:
        """A :class:`BPETokenizer` of the training topics (cached)."""
        return BPETokenizer.fit(texts, max_vocab_size, min_count, cache_dir=self.tokenizer_cache)
