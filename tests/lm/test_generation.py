"""Generation statistics on hand-made sequences and hand-made models with closed-form outputs.

- :func:`repetition_rate` is seq-rep-n of Welleck, Kulikov, Roller, Dinan, Cho and Weston,
  "Neural Text Generation with Unlikelihood Training" (ICLR 2020): per sequence ``1 - |unique
  n-grams| / |n-grams|``, averaged; the expected values are counted by hand.
- :func:`generate` and :func:`continuation_probabilities` run on real ``nn.Module`` s with fixed
  logits: a bigram table (the next token depends on the last token only, so greedy paths and
  probabilities are read off the table) and a model that looks only at the first token it is
  shown (so the sliding window is visible in the output).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from lightning_losses.lm.evaluation import (
    continuation_probabilities,
    evaluation_prompts,
    generate,
    low_probability_share,
    repetition_rate,
)
from lightning_losses.lm.model import TinyLanguageModel

#: A transition matrix over 4 tokens: the greedy path from 0 is 0 -> 1 -> 2 -> 3 -> 0 -> ...
TRANSITIONS = torch.tensor(
    [
        [0.1, 0.6, 0.2, 0.1],
        [0.05, 0.15, 0.7, 0.1],
        [0.2, 0.1, 0.1, 0.6],
        [0.5, 0.3, 0.1, 0.1],
    ],
    dtype=torch.float64,
)


class Bigram(nn.Module):
    """Next-token logits ``log P[last token]``, from a fixed transition matrix."""

    def __init__(self, transitions: Tensor, context_length: int) -> None:
        super().__init__()
        self.register_buffer("log_transitions", transitions.log())
        self.context_length = context_length

    def logits(self, tokens: Tensor) -> Tensor:
        if tokens.shape[1] > self.context_length:
            raise ValueError("longer than the context")  # as a position embedding would fail
        return self.log_transitions[tokens]


class FirstVisible(nn.Module):
    """Every position's logits favour ``first visible token + 1`` (mod V) by ``margin``."""

    def __init__(self, vocab: int, context_length: int, margin: float = 2.0) -> None:
        super().__init__()
        self.vocab, self.context_length, self.margin = vocab, context_length, margin

    def logits(self, tokens: Tensor) -> Tensor:
        if tokens.shape[1] > self.context_length:
            raise ValueError("longer than the context")
        favourite = (tokens[:, :1] + 1) % self.vocab  # [P, 1]
        logits = torch.zeros(*tokens.shape, self.vocab, dtype=torch.float64)
        logits.scatter_(2, favourite.expand_as(tokens)[..., None], self.margin)
        return logits


# --- repetition and low-probability shares ---------------------------------------------------


def test_repetition_rate_on_hand_made_sequences():
    assert repetition_rate([[1, 2, 1, 2, 1]], 2) == pytest.approx(1 - 2 / 4)
    assert repetition_rate([[1, 2, 3, 4, 5, 6]], 2) == 0.0  # all distinct
    assert repetition_rate([[1, 2, 3, 4, 5, 6]], 1) == 0.0
    for length, n in [(6, 1), (6, 2), (6, 4), (9, 3)]:
        constant = [[7] * length]
        assert repetition_rate(constant, n) == pytest.approx(1 - 1 / (length - n + 1))
    # the mean over sequences; a sequence shorter than n has no n-gram and is skipped
    assert repetition_rate([[1, 1, 2], [3, 4, 5], [9]], 2) == pytest.approx((0 + 0) / 2)
    assert repetition_rate([[1, 1, 1], [3, 4, 3, 4], [9]], 2) == pytest.approx(
        ((1 - 1 / 2) + (1 - 2 / 3)) / 2
    )
    # 4-grams of a period-3 sequence of 9 tokens: 6 of them, 3 distinct
    assert repetition_rate([[1, 2, 3] * 3], 4) == pytest.approx(1 - 3 / 6)
    # a [P, S] tensor is read as P sequences
    rows = [[1, 2, 1, 2, 1], [5, 5, 5, 5, 5]]
    assert repetition_rate(torch.tensor(rows), 2) == pytest.approx((0.5 + (1 - 1 / 4)) / 2)
    assert repetition_rate(torch.tensor(rows), 2) == repetition_rate(rows, 2)


def test_repetition_rate_errors_name_the_argument():
    with pytest.raises(ValueError, match="at least one sequence of n=3"):
        repetition_rate([[1, 2], [3]], 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        repetition_rate([[1, 2]], 0)
    with pytest.raises(ValueError, match=r"sequences must be an integer tensor \[P, S\]"):
        repetition_rate(torch.tensor([1, 2, 3]), 1)
    with pytest.raises(TypeError, match="sequences must be"):
        repetition_rate([1, 2, 3], 1)


def test_low_probability_share_on_hand_made_probabilities():
    probabilities = torch.tensor([[0.5, 1e-4, 1e-3], [0.0, 0.2, 0.999]], dtype=torch.float64)
    assert low_probability_share(probabilities) == pytest.approx(2 / 6)  # 1e-3 is not below
    assert low_probability_share(probabilities, threshold=0.3) == pytest.approx(4 / 6)
    assert low_probability_share(probabilities, threshold=1.0) == 1.0
    assert low_probability_share(torch.tensor([0.9, 0.8]), threshold=1e-9) == 0.0
    with pytest.raises(ValueError, match="threshold must lie in"):
        low_probability_share(probabilities, threshold=0.0)
    with pytest.raises(ValueError, match="probabilities must lie in"):
        low_probability_share(torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="probabilities must lie in"):
        low_probability_share(torch.tensor([0.5, float("nan")]))
    with pytest.raises(ValueError, match="probabilities must hold at least one"):
        low_probability_share(torch.tensor([]))
    with pytest.raises(TypeError, match="probabilities must be a floating-point tensor"):
        low_probability_share(torch.tensor([0, 1]))


def test_evaluation_prompts_are_evenly_spaced_slices():
    ids = torch.arange(100)
    prompts = evaluation_prompts(ids, count=4, length=10)
    assert prompts.tolist() == [list(range(s, s + 10)) for s in (0, 30, 60, 90)]
    assert evaluation_prompts(ids, count=1, length=5).tolist() == [[0, 1, 2, 3, 4]]
    assert torch.equal(evaluation_prompts(ids, count=4, length=10), prompts)  # deterministic
    with pytest.raises(ValueError, match=r"length must be in \[1, 100\]"):
        evaluation_prompts(ids, count=2, length=101)
    with pytest.raises(ValueError, match="count must be >= 1"):
        evaluation_prompts(ids, count=0, length=3)
    with pytest.raises(ValueError, match=r"ids must be an integer tensor of shape \[N\]"):
        evaluation_prompts(ids.reshape(10, 10), count=2, length=3)


# --- generation on a bigram table -----------------------------------------------------------


def test_greedy_bigram_path_and_its_probabilities():
    model = Bigram(TRANSITIONS, context_length=3).train()
    prompts = torch.tensor([[2, 2, 0], [1, 3, 2]])
    greedy = generate(model, prompts, steps=6, greedy=True)
    assert greedy.tolist() == [[1, 2, 3, 0, 1, 2], [3, 0, 1, 2, 3, 0]]
    assert model.training  # the mode is restored
    probabilities = continuation_probabilities(model, prompts, greedy)
    expected = [
        [TRANSITIONS[a, b].item() for a, b in zip([row[-1], *path[:-1]], path, strict=True)]
        for row, path in zip(prompts.tolist(), greedy.tolist(), strict=True)
    ]
    torch.testing.assert_close(probabilities, torch.tensor(expected, dtype=torch.float64))
    # any continuation: the table's entry for each consecutive pair
    other = torch.tensor([[0, 0, 3], [3, 0, 2]])  # after 0 and after 2
    torch.testing.assert_close(
        continuation_probabilities(model, prompts, other),
        torch.tensor([[0.1, 0.1, 0.1], [0.6, 0.5, 0.2]], dtype=torch.float64),
    )
    assert generate(model, prompts, steps=0, greedy=True).shape == (2, 0)
    assert continuation_probabilities(model, prompts, other[:, :0]).shape == (2, 0)


def test_sampling_is_reproducible_and_follows_the_bigram_probabilities():
    model = Bigram(TRANSITIONS, context_length=2)
    prompts = torch.zeros(20_000, 1, dtype=torch.long)
    first = generate(
        model, prompts, steps=2, greedy=False, generator=torch.Generator().manual_seed(0)
    )
    again = generate(
        model, prompts, steps=2, greedy=False, generator=torch.Generator().manual_seed(0)
    )
    other = generate(
        model, prompts, steps=2, greedy=False, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    n = prompts.shape[0]
    for step, expected in enumerate([TRANSITIONS[0], (TRANSITIONS @ TRANSITIONS)[0]]):
        frequencies = torch.bincount(first[:, step], minlength=4).double() / n
        bound = 5 * torch.sqrt(expected * (1 - expected) / n)  # five standard errors
        assert bool(((frequencies - expected).abs() < bound).all()), (step, frequencies)


# --- the sliding window ----------------------------------------------------------------------


def test_the_context_is_cropped_to_the_model_length():
    model = FirstVisible(vocab=10, context_length=2)
    prompts = torch.tensor([[0, 1, 2]])
    # visible [1, 2] -> 2; [2, 2] -> 3; [2, 3] -> 3; [3, 3] -> 4; [3, 4] -> 4; [4, 4] -> 5
    greedy = generate(model, prompts, steps=6, greedy=True)
    assert greedy.tolist() == [[2, 3, 3, 4, 4, 5]]
    # with the whole history visible the first token would stay 0 and every token be 1
    wide = FirstVisible(vocab=10, context_length=100)
    assert generate(wide, prompts, steps=6, greedy=True).tolist() == [[1] * 6]
    top = math.exp(2.0) / (math.exp(2.0) + 9)
    rest = 1 / (math.exp(2.0) + 9)
    torch.testing.assert_close(
        continuation_probabilities(model, prompts, greedy),
        torch.full((1, 6), top, dtype=torch.float64),
    )
    # 1 is the favourite only while 0 is the first visible token: never with this window
    torch.testing.assert_close(
        continuation_probabilities(model, prompts, torch.ones(1, 6, dtype=torch.long)),
        torch.full((1, 6), rest, dtype=torch.float64),
    )
    torch.testing.assert_close(
        continuation_probabilities(wide, prompts, torch.ones(1, 6, dtype=torch.long)),
        torch.full((1, 6), top, dtype=torch.float64),
    )


def test_the_language_model_generates_past_its_context_length():
    torch.manual_seed(0)
    model = TinyLanguageModel(vocab_size=30, context_length=4, d_model=16, n_heads=2)
    assert model.context_length == 4
    prompts = torch.randint(0, 30, (3, 6))
    greedy = generate(model, prompts, steps=5, greedy=True)
    probabilities = continuation_probabilities(model, prompts, greedy)
    tokens = torch.cat([prompts, greedy], dim=1)
    with torch.no_grad():
        for step in range(5):
            context = tokens[:, prompts.shape[1] + step - 4 : prompts.shape[1] + step]
            distribution = model.eval().logits(context)[:, -1].double().softmax(-1)
            assert greedy[:, step].tolist() == distribution.argmax(-1).tolist()
            torch.testing.assert_close(probabilities[:, step], distribution.max(-1).values)


def test_generation_errors_name_the_argument():
    model = Bigram(TRANSITIONS, context_length=2)
    prompts = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(TypeError, match="prompts must be an integer tensor"):
        generate(model, prompts.double(), steps=1, greedy=True)
    with pytest.raises(ValueError, match=r"prompts must be an integer tensor of shape \[P, T\]"):
        generate(model, torch.zeros(3, dtype=torch.long), steps=1, greedy=True)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        generate(model, prompts, steps=-1, greedy=True)
    with pytest.raises(TypeError, match="greedy must be True or False"):
        generate(model, prompts, steps=1, greedy=1)
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator"):
        generate(model, prompts, steps=1, greedy=False, generator=0)
    with pytest.raises(TypeError, match=r"model\.context_length must be an int"):
        generate(nn.Linear(2, 2), prompts, steps=1, greedy=True)
    with pytest.raises(ValueError, match=r"continuations must have one row per prompt \(2\)"):
        continuation_probabilities(model, prompts, torch.zeros(3, 2, dtype=torch.long))
