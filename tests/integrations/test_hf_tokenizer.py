"""The BPE tokenizer trained here on pydoc_data, its cache, and its DataModule."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers", reason="the [hf] extra is not installed")

from lightning_losses.integrations.huggingface.tokenizer import (
    BPETokenizer,
    PydocTopicsBPEDataModule,
)
from lightning_losses.lm.data import load_topics


@pytest.fixture(scope="module")
def texts():
    topics = load_topics()
    return [topics[name] for name in sorted(topics)[:20]]


def test_training_is_deterministic_and_the_cache_gives_the_same_tokenizer(texts, tmp_path):
    first = BPETokenizer.fit(texts, 600, cache_dir=None)
    second = BPETokenizer.fit(texts, 600, cache_dir=None)
    assert first.tokenizer.to_str() == second.tokenizer.to_str()
    cached = BPETokenizer.fit(texts, 600, cache_dir=tmp_path)
    (path,) = tmp_path.glob("bpe-*.json")
    assert cached.tokenizer.to_str() == first.tokenizer.to_str()
    path.write_text(path.read_text().replace('"<eos>"', '"<end>"'))  # the cache is read back
    assert BPETokenizer.fit(texts, 600, cache_dir=tmp_path).tokenizer.token_to_id("<end>") == 1
    other = BPETokenizer.fit(texts, 601, cache_dir=tmp_path)  # other settings: another file
    assert len(other) == 601
    assert len(list(tmp_path.glob("bpe-*.json"))) == 2


def test_text_round_trips_and_subwords_are_shorter_than_bytes(texts):
    tokenizer = BPETokenizer.fit(texts, 600, cache_dir=None)
    text = texts[3][:500]
    ids = tokenizer.encode(text, eos=True)
    assert ids[-1] == tokenizer.eos_id == 1
    assert tokenizer.unk_id == 0
    assert tokenizer.decode(ids[:-1]) == text
    assert len(ids) < 0.5 * len(text.encode())  # merges learnt: fewer tokens than bytes
    assert max(ids) < len(tokenizer) == 600
    wrapped = tokenizer.to_transformers()
    assert wrapped(text)["input_ids"] == ids[:-1]
    assert wrapped.eos_token_id == 1


def test_the_datamodule_trains_the_tokenizer_on_the_training_topics_only(tmp_path):
    dm = PydocTopicsBPEDataModule(context_length=16, max_vocab_size=512, tokenizer_cache=tmp_path)
    topics = load_topics()
    reference = BPETokenizer.fit([topics[n] for n in dm.train_topics], 512, cache_dir=None)
    assert dm.tokenizer.tokenizer.to_str() == reference.tokenizer.to_str()
    assert dm.vocab_size == 512
    x, y = dm.dataset("val")[0]
    expected = reference.encode(topics[dm.val_topics[0]], eos=True)[:17]
    assert x.tolist() == expected[:16]
    assert y.tolist() == expected[1:]


def test_a_too_small_vocabulary_is_refused_in_one_line(texts):
    with pytest.raises(ValueError, match=r"^max_size must be at least 258"):
        BPETokenizer.fit(texts, 100, cache_dir=None)
