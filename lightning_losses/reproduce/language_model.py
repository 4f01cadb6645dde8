"""Claim 9's runs: the tiny language model, fitted by its CLI and measured on held-out text.

A variant of an experiment file with ``program: lm`` is fitted by
``python -m lightning_losses.lm fit`` (:func:`run_fit`) and scored by
:func:`post_fit_metrics` on the test topics of its
:class:`~lightning_losses.lm.PydocTopicsDataModule` (``test_fraction > 0``):

- token metrics of :func:`~lightning_losses.lm.evaluation.token_metrics` (perplexity, top-label
  ECE of 15 bins, its debiased value and 95% bootstrap interval), on the validation and test
  tokens;
- temperature scaling fitted on the validation tokens
  (:func:`~lightning_losses.calibration.posthoc.temperature.fit_temperature`), and the test
  metrics of the scaled logits;
- greedy and sampled continuations of :data:`PROMPTS` held-out prompts and their repetition
  rates (seq-rep-2 and seq-rep-4 of Welleck et al., "Neural text generation with unlikelihood
  training", ICLR 2020), stored as an artifact, so that :func:`reference_metrics` can score
  them under another run's model (claim 9: the cross-entropy run of the same model and seed).

The runs may be of any next-token model the ``lm`` program fits: the package's
:class:`~lightning_losses.lm.TinyLanguageModel` or a Hugging Face model in
:class:`~lightning_losses.integrations.huggingface.HFCausalLM` (both have ``logits`` and
``context_length``), with its DataModule's own tokenizer.
"""

from __future__ import annotations

from typing import Any

# torch and the bins are imported where used: claim 9's module reads the constants below, and
# `lightning-losses reproduce --help` must not import torch.

#: Held-out prompts per run, their length in tokens and the length of each continuation.
PROMPTS = 32
PROMPT_LENGTH = 16
CONTINUATION_LENGTH = 32
#: The n of the repetition rates.
REPETITION_NS = (2, 4)
#: A continuation token the reference model gives less than this is "unsupported".
LOW_PROBABILITY = 1e-3
#: Artifact holding the prompts and both continuations (token ids).
CONTINUATIONS_ARTIFACT = "reproduce/continuations.json"
#: How each continuation is decoded.
DECODINGS = ("greedy", "sampled")


def low_probability_key(reference: str, decoding: str) -> str:
    """The post-fit metric of the share of a run's ``decoding`` tokens unlikely under ``reference``.

    Named by the reference variant, so that shares under different models (claim 9: one
    cross-entropy reference per model and tokenizer) are never mixed in one column.

    Example:
        >>> low_probability_key("hf_ce", "sampled")
        'hf_ce_lowprob_sampled'
    """
    return f"{reference}_lowprob_{decoding}"


def run_fit(args: list[str]) -> Any:
    """Fit as ``python -m lightning_losses.lm fit ARGS`` would; returns the finished CLI."""
    from lightning_losses.lm.cli import main

    return main(["fit", *args])


def split_metrics(model: Any, datamodule: Any, split: str) -> tuple[dict[str, float], Any, Any]:
    """:func:`~lightning_losses.lm.evaluation.token_metrics` of one split, and its logits."""
    from lightning_losses.lm.evaluation import held_out_logits, token_metrics

    logits, target = held_out_logits(model, datamodule.dataset(split))
    return token_metrics(logits, target), logits, target


def continuations(model: Any, datamodule: Any) -> dict[str, list[list[int]]]:
    """Prompts from the test tokens, and their greedy and sampled continuations (token ids).

    Sampling draws from a generator seeded with the DataModule's seed, so a run's continuations
    are reproducible from its checkpoint.
    """
    import torch

    from lightning_losses.lm.evaluation import evaluation_prompts, generate

    prompts = evaluation_prompts(
        datamodule.dataset("test").ids, count=PROMPTS, length=PROMPT_LENGTH
    )
    generator = torch.Generator().manual_seed(int(datamodule.seed))
    greedy = generate(model, prompts, steps=CONTINUATION_LENGTH, greedy=True)
    sampled = generate(model, prompts, steps=CONTINUATION_LENGTH, greedy=False, generator=generator)
    return {"prompts": prompts.tolist(), "greedy": greedy.tolist(), "sampled": sampled.tolist()}


def post_fit_metrics(
    model: Any, datamodule: Any
) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """Held-out metrics of a fitted language model, its reliability bins and continuations.

    Keys: ``test_<m>`` and ``val_<m>`` for ``m`` in ``nll, ppl, acc, ece, ece_debiased, ece_low,
    ece_high``; ``ts_temperature`` (fitted on the validation tokens) and ``ts_test_<m>``;
    ``rep<n>_<decoding>`` (``rep2_greedy``, ``rep4_sampled``...). Artifacts: the test tokens'
    reliability bins before and after temperature scaling, and the continuations.
    """
    from lightning_losses.calibration.posthoc.temperature import fit_temperature
    from lightning_losses.lm.evaluation import repetition_rate, token_metrics
    from lightning_losses.reproduce.bins import (
        BINS_ARTIFACT,
        SCALED_BINS_ARTIFACT,
        reliability_bins,
    )

    metrics: dict[str, float] = {}
    val, val_logits, val_target = split_metrics(model, datamodule, "val")
    test, test_logits, test_target = split_metrics(model, datamodule, "test")
    metrics.update({f"val_{key}": value for key, value in val.items()})
    metrics.update({f"test_{key}": value for key, value in test.items()})
    temperature = fit_temperature(val_logits, val_target)
    scaled = test_logits / temperature
    metrics["ts_temperature"] = temperature
    metrics.update({f"ts_test_{k}": v for k, v in token_metrics(scaled, test_target).items()})
    texts = continuations(model, datamodule)
    for decoding in DECODINGS:
        for n in REPETITION_NS:
            metrics[f"rep{n}_{decoding}"] = repetition_rate(texts[decoding], n)
    artifacts = {
        BINS_ARTIFACT: reliability_bins(test_logits, test_target),
        SCALED_BINS_ARTIFACT: reliability_bins(scaled, test_target),
        CONTINUATIONS_ARTIFACT: texts,
    }
    return metrics, artifacts, {}


def reference_metrics(
    reference: Any, texts: dict[str, list[list[int]]], name: str
) -> dict[str, float]:
    """The share of each decoding's continuation tokens that ``reference`` finds unlikely.

    ``<name>_lowprob_<decoding>`` (:func:`low_probability_key`, ``name`` the reference's
    variant): the fraction of the continuation tokens to which the reference model gives a
    probability below :data:`LOW_PROBABILITY`, given the prompt and the earlier continuation
    tokens (:func:`~lightning_losses.lm.evaluation.continuation_probabilities`). The texts
    must be token ids of the reference's own tokenizer.
    """
    import torch

    from lightning_losses.lm.evaluation import continuation_probabilities, low_probability_share

    prompts = torch.tensor(texts["prompts"])
    return {
        low_probability_key(name, decoding): low_probability_share(
            continuation_probabilities(reference, prompts, torch.tensor(texts[decoding])),
            LOW_PROBABILITY,
        )
        for decoding in DECODINGS
    }
