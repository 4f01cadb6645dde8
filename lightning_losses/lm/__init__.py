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
  float64 sums, with its debiased value and bootstrap interval;
- :mod:`~lightning_losses.lm.evaluation`: held-out token metrics of a trained model, greedy and
  sampled continuations of held-out prompts, their repetition rate and the share of tokens a
  reference model finds improbable;
- :func:`main`: ``lightning-losses lm fit --config lm_ce`` (or ``python -m lightning_losses.lm
  fit ...``).
"""

from __future__ import annotations

from lightning_losses.lm.cli import LanguageModelCLI, console_main, main
from lightning_losses.lm.data import (
    PydocTopicsDataModule,
    TokenWindows,
    WordTokenizer,
    load_topics,
    split_topics,
)
from lightning_losses.lm.evaluation import (
    continuation_probabilities,
    evaluation_prompts,
    generate,
    held_out_logits,
    low_probability_share,
    repetition_rate,
    token_metrics,
)
from lightning_losses.lm.model import TinyLanguageModel, TokenCalibration, TokenLanguageModel

__all__ = [
    "LanguageModelCLI",
    "PydocTopicsDataModule",
    "TinyLanguageModel",
    "TokenCalibration",
    "TokenLanguageModel",
    "TokenWindows",
    "WordTokenizer",
    "console_main",
    "continuation_probabilities",
    "evaluation_prompts",
    "generate",
    "held_out_logits",
    "load_topics",
    "low_probability_share",
    "main",
    "repetition_rate",
    "split_topics",
    "token_metrics",
]
