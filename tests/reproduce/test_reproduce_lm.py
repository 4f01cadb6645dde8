"""Claim 9 (TaiLr on two language models): its verdict rule, and a shrunk claim end to end.

The shrunk claim fits the shipped ``configs/lm/lm_ce.yaml``, ``lm_tailr.yaml``,
``hf_llama_tiny_ce.yaml`` and ``hf_llama_tiny_tailr.yaml`` with narrow models on small
vocabularies for a few steps, through ``reproduce``'s own pipeline (the language model's CLI,
MLflow, the post-fit metrics, the scoring under each model's cross-entropy run and the report);
the stored numbers are recomputed here from the runs' checkpoints with plain float64 formulas
and plain decoding loops.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch

from lightning_losses.reproduce.claims import CLAIMS
from lightning_losses.reproduce.lm_claim import (
    CLAIM_9,
    LLAMA,
    MODELS,
    NLL_MARGIN,
    REFERENCES,
    TOKEN_ECE_MARGIN,
    TRANSFORMER,
    lm_conditions,
    lm_markdown,
    lm_verdicts,
)
from lightning_losses.reproduce.spec import (
    MIXED,
    SUPPORTED,
    Stats,
    Variant,
    load_experiment,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]


def _table(**columns: dict[str, tuple[float, ...]]) -> dict[str, dict[str, Stats]]:
    """``{variant: {metric: Stats(values)}}`` from per-seed values (means are not used)."""
    return {
        variant: {key: Stats(0.0, 0.0, len(values), values) for key, values in metrics.items()}
        for variant, metrics in columns.items()
    }


def test_claim9_is_registered_with_the_lm_program_and_its_arms():
    assert CLAIMS[9] is CLAIM_9
    experiment = load_experiment(CLAIM_9.experiment_file)
    assert experiment.min_seeds >= 5
    names = [v.name for v in experiment.variants]
    transformer = ["ce", "tailr", "gamma_annealed", "focal_3", "label_smoothing"]
    assert names == [*transformer, "hf_ce", "hf_tailr", "hf_focal_3"]
    assert names == [name for model in MODELS for name in model.variants]
    for variant in experiment.variants:
        assert variant.program == "lm"
        assert variant.config.startswith("configs/lm/")
        assert (ROOT / variant.config).is_file()
        assert "--data.init_args.test_fraction=0.1" in variant.overrides
    for config in ("lm_tailr", "hf_llama_tiny_tailr"):
        tailr = (ROOT / f"configs/lm/{config}.yaml").read_text()
        assert "gamma: 1.0e-7" in tailr
        assert "threshold: 0.2" in tailr


def test_each_variant_is_scored_under_the_cross_entropy_of_its_own_model():
    """The Llama arms read a BPE tokenizer's ids: their reference is hf_ce, on the same data."""
    experiment = load_experiment(CLAIM_9.experiment_file)
    configs = {v.name: (ROOT / v.config).read_text() for v in experiment.variants}
    assert set(REFERENCES) == set(configs)
    for name, reference in REFERENCES.items():
        model = next(m for m in MODELS if name in m.variants)
        assert reference == model.reference
        same = ("HFCausalLM" in configs[name], "BPEDataModule" in configs[name])
        assert same == ("HFCausalLM" in configs[reference], "BPEDataModule" in configs[reference])
    assert "HFCausalLM" in configs[LLAMA.tailr]
    assert "TinyLanguageModel" in configs[TRANSFORMER.tailr]
    columns = [key for key, _ in CLAIM_9.metrics]
    assert "rep/ce_lowprob_sampled" in columns
    assert "rep/hf_ce_lowprob_sampled" in columns


def test_unknown_program_is_named(tmp_path):
    path = tmp_path / "claim.yaml"
    path.write_text("program: rnn\nvariants:\n  - {name: a, config: x.yaml}\n")
    with pytest.raises(ValueError, match="program must be one of classifier, lm; got 'rnn'"):
        load_experiment(path)


CE = {
    "rep/test_ece": (0.050, 0.052, 0.049, 0.051, 0.050, 0.053),
    "rep/ts_test_ece": (0.020, 0.021, 0.019, 0.020, 0.022, 0.021),
    "rep/test_nll": (5.00, 5.10, 4.90, 5.05, 4.95, 5.02),
    "rep/rep4_greedy": (0.40, 0.42, 0.38, 0.41, 0.39, 0.40),
}
#: Better than CE on (a)-(c), tied with CE + TS within the margin in (d)'s favour.
BETTER = {
    "rep/test_ece": tuple(v - 0.04 + 0.001 * i for i, v in enumerate(CE["rep/test_ece"])),
    "rep/ts_test_ece": CE["rep/ts_test_ece"],
    "rep/test_nll": tuple(v + 0.01 for v in CE["rep/test_nll"]),
    "rep/rep4_greedy": tuple(v - 0.1 for v in CE["rep/rep4_greedy"]),
}


def _shifted(columns, offsets):
    return {key: tuple(v + offsets[key] for v in values) for key, values in columns.items()}


def test_the_verdict_is_tailrs_four_questions_over_the_paired_seeds():
    # The Llama's cross-entropy is far from the Transformer's and its TaiLr far from both:
    # each TaiLr is compared with its own model's CE (a wrong pairing flips every condition).
    offsets = {"rep/test_ece": 0.3, "rep/ts_test_ece": 0.3, "rep/test_nll": 2.0}
    offsets["rep/rep4_greedy"] = 0.3
    table = _table(
        ce=CE, tailr=BETTER, hf_ce=_shifted(CE, offsets), hf_tailr=_shifted(BETTER, offsets)
    )
    conditions = lm_conditions(table)
    assert [c.outcome for c in conditions] == ["holds"] * 8
    assert verdict(conditions) == SUPPORTED
    assert [c.text.split("(")[1].split(")")[0] for c in conditions] == ["tailr"] * 4 + [
        "hf_tailr"
    ] * 4
    # The Llama's TaiLr worse than its CE on every question: (a)-(d) fail there, mixed claim.
    worse = {key: tuple(v + 0.1 for v in values) for key, values in _shifted(CE, offsets).items()}
    table = _table(ce=CE, tailr=BETTER, hf_ce=_shifted(CE, offsets), hf_tailr=worse)
    conditions = lm_conditions(table)
    assert [c.outcome for c in conditions] == ["holds"] * 4 + ["fails"] * 4
    assert verdict(conditions) == MIXED
    for condition, metric, right in zip(
        conditions[4:],
        ("rep/test_ece", "rep/test_nll", "rep/rep4_greedy", "rep/test_ece"),
        ("rep/test_ece", "rep/test_nll", "rep/rep4_greedy", "rep/ts_test_ece"),
        strict=True,
    ):
        hf_ce = _shifted(CE, offsets)[right]
        expected = statistics.mean(a - b for a, b in zip(worse[metric], hf_ce, strict=True))
        assert condition.decision.difference == pytest.approx(expected, abs=1e-12)
    # The NLL margin decides (b): a tailr 0.2 nats worse on every seed fails it.
    worse = dict(BETTER, **{"rep/test_nll": tuple(v + 0.2 for v in CE["rep/test_nll"])})
    b = lm_verdicts(_table(ce=CE, tailr=worse), "tailr", "ce")["b"]
    assert b.outcome == "fails"
    assert b.margin == NLL_MARGIN
    # (d) against CE + TS: tailr's ECE at CE's scaled ECE +- 0.001 is equivalent, not better.
    tied = dict(BETTER, **{"rep/test_ece": tuple(v + 0.0005 for v in CE["rep/ts_test_ece"])})
    d = lm_verdicts(_table(ce=CE, tailr=tied), "tailr", "ce")["d"]
    assert d.decision is not None
    assert d.decision.verdict == "equivalent"
    assert d.outcome == "fails"
    assert d.margin == TOKEN_ECE_MARGIN


def test_e_reads_the_share_under_the_reference_it_is_given():
    ce = {"rep/hf_ce_lowprob_sampled": (0.30, 0.32, 0.31), "rep/ce_lowprob_sampled": (0.0,) * 3}
    tailr = {"rep/hf_ce_lowprob_sampled": (0.20, 0.21, 0.22), "rep/ce_lowprob_sampled": (1.0,) * 3}
    e = lm_verdicts(_table(hf_ce=ce, hf_tailr=tailr), "hf_tailr", "hf_ce")["e"]
    assert e.outcome == "holds"
    assert e.difference == pytest.approx(statistics.mean((-0.10, -0.11, -0.09)), abs=1e-12)
    assert "p_hf_ce < 1e-3" in e.text


def test_the_markdown_has_a_table_per_model_with_its_own_reference():
    table = _table(ce=CE, tailr=BETTER, hf_ce=CE, hf_tailr=BETTER, hf_focal_3=BETTER)
    text = "\n".join(lm_markdown(table))
    assert (
        "On the tiny Transformer (`configs/lm/lm_*.yaml`), against its cross-entropy `ce`" in text
    )
    assert "against its cross-entropy `hf_ce`" in text
    assert "(a) token ECE below hf_ce's" in text
    for name in ("tailr", "hf_tailr", "hf_focal_3"):
        assert f"\n| {name} | yes (" in text
    assert "| here: ce | here: tailr | here: hf_ce | here: hf_tailr |" in text
    # The Transformer's runs only: no Llama table, no Llama columns.
    text = "\n".join(lm_markdown(_table(ce=CE, tailr=BETTER)))
    assert "hf_ce" not in text


def test_missing_variants_leave_the_verdict_missing_not_supported():
    conditions = lm_conditions(_table(ce={"rep/test_ece": (0.05, 0.06)}))
    assert {c.outcome for c in conditions} == {"missing"}


def test_completion_is_decided_by_the_program_of_the_run():
    """A language-model run is never "completed" by the classifier's post-hoc arms."""
    from lightning_losses.reproduce.runner import ADDED_POST_FIT, needs_completion
    from lightning_losses.reproduce.spec import PROGRAMS

    assert set(ADDED_POST_FIT) == set(PROGRAMS)
    stored = {"rep/temperature": 1.3, "rep/test_ece": 0.1}
    assert needs_completion(stored, "classifier")
    assert not needs_completion(stored, "lm")
    assert not needs_completion({**stored, "rep/ph_best_test_ece": 0.01}, "classifier")


# --- the shrunk claim end to end ----------------------------------------------------------------

SHRUNK = (
    "--data.init_args.test_fraction=0.1",
    "--data.init_args.max_vocab_size=300",
    "--model.init_args.d_model=16",
    "--model.init_args.n_layers=1",
    "--trainer.limit_train_batches=6",
    "--trainer.limit_val_batches=4",
)
TINY_LLAMA = {
    "class_path": "transformers.LlamaConfig",
    "init_args": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "tie_word_embeddings": True,
        # Wide initial weights: peaked next-token distributions after a few steps, so that
        # some generated tokens fall below p = 1e-3 under the reference (not all shares 0).
        "initializer_range": 0.2,
    },
}
SHRUNK_LLAMA = (
    "--data.init_args.test_fraction=0.1",
    "--data.init_args.max_vocab_size=300",
    f"--model.init_args.config={json.dumps(TINY_LLAMA)}",
    "--trainer.limit_train_batches=6",
    "--trainer.limit_val_batches=4",
)


def _plain_nll(logits_of, windows, temperature=1.0) -> tuple[float, int]:
    """Mean -log softmax(logits / T)[target] over every window, in float64, and the count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for index in range(len(windows)):
            tokens, target = windows[index]
            logits = logits_of(tokens[None])[0].double() / temperature
            total -= logits.log_softmax(-1).gather(1, target[:, None]).sum().item()
            count += target.numel()
    return total / count, count


def _plain_share(logits_of, context_length, prompts, continuation, threshold=1e-3) -> float:
    """Share of continuation tokens below ``threshold`` under a model, one context at a time."""
    below = total = 0
    with torch.no_grad():
        for prompt, tokens in zip(prompts, continuation, strict=True):
            for k, token in enumerate(tokens):
                context = torch.tensor((prompt + tokens[:k])[-context_length:])
                probs = logits_of(context[None])[0, -1].double().softmax(-1)
                below += bool(probs[token] < threshold)
                total += 1
    return below / total


def _is_greedy(logits_of, context_length, prompt, continuation, tolerance=1e-4) -> bool:
    """Whether each continuation token is the argmax of the model given what came before."""
    with torch.no_grad():
        for k, token in enumerate(continuation):
            context = torch.tensor((prompt + continuation[:k])[-context_length:])
            logits = logits_of(context[None])[0, -1]
            if logits[token] < logits.max() - tolerance:  # ties within float noise pass
                return False
    return True


def _checkpoint(folder, run_id) -> Path:
    return next(folder.rglob(f"{run_id}/**/last.ckpt"))


def _check_report(report: str, result) -> None:
    """Every run listed; a verdict table per model, each against its own reference."""
    assert "## Claim 9" in report
    for (variant, seed), run_id in result.runs.items():
        assert re.search(rf"\| {variant} \| {seed} \| `{run_id}` \|", report)
    assert "| tailr | " in report
    assert "| hf_tailr | " in report
    assert "(e) fewer sampled tokens with p_CE < 1e-3 (p under `ce`'s model)" in report
    assert "(e) fewer sampled tokens with p_CE < 1e-3 (p under `hf_ce`'s model)" in report
    assert "ECE(hf_tailr) < ECE(hf_ce + TS)" in report


def _check_transformer_run(folder, client, runs) -> None:
    """The tiny Transformer's TaiLr: test NLL and its share under ce, from the checkpoints."""
    from lightning_losses.lm import PydocTopicsDataModule, TinyLanguageModel
    from lightning_losses.reproduce.language_model import CONTINUATIONS_ARTIFACT
    from lightning_losses.reproduce.reference_scores import REFERENCE_TAG
    from lightning_losses.reproduce.runner import read_json

    ce_run, tailr_run = runs[("ce", 1)], runs[("tailr", 1)]
    metrics = client.get_run(tailr_run).data.metrics
    # The test perplexity is that of a plain float64 NLL over every test window of the
    # checkpoint's model (float32 logits: 1e-5 relative).
    model = TinyLanguageModel.load_from_checkpoint(
        _checkpoint(folder, tailr_run), weights_only=True
    ).eval()
    datamodule = PydocTopicsDataModule(
        context_length=32, max_vocab_size=300, test_fraction=0.1, seed=1
    )
    nll, count = _plain_nll(model.logits, datamodule.dataset("test"))
    assert count == len(datamodule.dataset("test")) * 32
    assert metrics["rep/test_nll"] == pytest.approx(nll, rel=1e-5)
    assert metrics["rep/test_ppl"] == pytest.approx(math.exp(nll), rel=1e-5)
    for decoding in ("greedy", "sampled"):
        for n in (2, 4):
            assert 0.0 <= metrics[f"rep/rep{n}_{decoding}"] <= 1.0
    # TaiLr's continuations scored under cross-entropy's model of the same seed.
    texts = read_json(client, tailr_run, CONTINUATIONS_ARTIFACT, folder)
    assert texts is not None
    ce_model = TinyLanguageModel.load_from_checkpoint(
        _checkpoint(folder, ce_run), weights_only=True
    ).eval()
    for decoding in ("greedy", "sampled"):
        expected = _plain_share(ce_model.logits, 32, texts["prompts"], texts[decoding])
        assert metrics[f"rep/ce_lowprob_{decoding}"] == pytest.approx(expected, abs=1e-12)
    assert client.get_run(tailr_run).data.tags[REFERENCE_TAG] == ce_run


def _llama_logits(folder, run_id):
    """The transformers model's own logits of a fitted HFCausalLM run (``ids -> logits``)."""
    from lightning_losses.integrations.huggingface import HFCausalLM

    module = HFCausalLM.load_from_checkpoint(_checkpoint(folder, run_id), weights_only=True).eval()
    assert type(module.model).__name__ == "LlamaForCausalLM"

    def logits(ids):
        return module.model(input_ids=ids).logits

    return logits


def _check_llama_run(folder, client, runs) -> None:
    """The Llama's TaiLr: held-out NLL, temperature scaling, generation and its share."""
    from lightning_losses.integrations.huggingface import PydocTopicsBPEDataModule
    from lightning_losses.reproduce.language_model import CONTINUATIONS_ARTIFACT
    from lightning_losses.reproduce.reference_scores import REFERENCE_TAG
    from lightning_losses.reproduce.runner import read_json

    hf_ce_run, hf_tailr_run = runs[("hf_ce", 1)], runs[("hf_tailr", 1)]
    metrics = client.get_run(hf_tailr_run).data.metrics
    llama = _llama_logits(folder, hf_tailr_run)
    bpe = PydocTopicsBPEDataModule(context_length=32, max_vocab_size=300, test_fraction=0.1, seed=1)
    nll, count = _plain_nll(llama, bpe.dataset("test"))
    assert count == len(bpe.dataset("test")) * 32
    assert metrics["rep/test_nll"] == pytest.approx(nll, rel=1e-5)
    # Temperature scaling: the test NLL at the stored temperature, which minimises the
    # validation NLL (no better value 2% either side).
    temperature = metrics["rep/ts_temperature"]
    scaled, _ = _plain_nll(llama, bpe.dataset("test"), temperature)
    assert metrics["rep/ts_test_nll"] == pytest.approx(scaled, rel=1e-5)
    val_nll = [_plain_nll(llama, bpe.dataset("val"), temperature * f)[0] for f in (1, 0.98, 1.02)]
    assert val_nll[0] <= min(val_nll[1:]) + 1e-9
    # Generation: prompts spread over the test stream, greedy continuations by argmax,
    # each model reading its last 32 tokens.
    texts = read_json(client, hf_tailr_run, CONTINUATIONS_ARTIFACT, folder)
    assert texts is not None
    ids = bpe.dataset("test").ids.tolist()
    assert texts["prompts"][0] == ids[:16]
    assert texts["prompts"][-1] == ids[-16:]
    for prompt, greedy in list(zip(texts["prompts"], texts["greedy"], strict=True))[:4]:
        assert len(greedy) == 32
        assert _is_greedy(llama, 32, prompt, greedy)
    # Scored under the Llama's cross-entropy model of the same seed, under its name.
    reference = _llama_logits(folder, hf_ce_run)
    for decoding in ("greedy", "sampled"):
        expected = _plain_share(reference, 32, texts["prompts"], texts[decoding])
        assert metrics[f"rep/hf_ce_lowprob_{decoding}"] == pytest.approx(expected, abs=1e-12)
    assert metrics["rep/hf_ce_lowprob_sampled"] > 0.0
    assert client.get_run(hf_tailr_run).data.tags[REFERENCE_TAG] == hf_ce_run


def _check_scoring(client, runs, uri, out) -> None:
    """Each run has the share under its own model's reference only; a pass scores once."""
    from lightning_losses.reproduce.reference_scores import score_under_reference

    for (variant, _), run_id in runs.items():
        keys = set(client.get_run(run_id).data.metrics)
        own, other = ("hf_ce", "ce") if variant.startswith("hf_") else ("ce", "hf_ce")
        assert f"rep/{own}_lowprob_sampled" in keys
        assert f"rep/{other}_lowprob_sampled" not in keys, (variant, run_id)
    # A second pass reuses every run and scores nothing again.
    assert score_under_reference(runs, uri, out, REFERENCES) == 0
    # The Llama's text cannot be scored under the Transformer's model: other tokens.
    with pytest.raises(ValueError, match=r"data settings differ \(class_path: .*BPE"):
        score_under_reference(runs, uri, out, {"hf_tailr": "ce"})


@pytest.mark.slow
def test_shrunk_claim9_end_to_end(tmp_path, monkeypatch):
    """Both models' arms through reproduce's pipeline, checked from their checkpoints."""
    pytest.importorskip("transformers", reason="the [hf] extra is not installed")
    from mlflow.tracking import MlflowClient

    from lightning_losses.reproduce.pipeline import reproduce_claim
    from lightning_losses.reproduce.report import write_report

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTNING_LOSSES_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    llama = dict(overrides=SHRUNK_LLAMA, epochs=1, program="lm")
    arms = (
        Variant("ce", "configs/lm/lm_ce.yaml", SHRUNK, epochs=1, label="ce", program="lm"),
        Variant("tailr", "configs/lm/lm_tailr.yaml", SHRUNK, epochs=1, label="t", program="lm"),
        Variant("hf_ce", "configs/lm/hf_llama_tiny_ce.yaml", label="hf ce", **llama),
        Variant("hf_tailr", "configs/lm/hf_llama_tiny_tailr.yaml", label="hf t", **llama),
    )
    claim = dataclasses.replace(CLAIM_9, fixed_variants=arms)
    out = tmp_path / "reports"
    out.mkdir()
    result = reproduce_claim(claim, seeds=2, scale=1.0, tracking_uri=uri, out=out)
    assert not result.failures
    _check_report(write_report([result], out, ["shrunk"]).read_text(), result)
    for name in ("claim9_reliability_ce.png", "claim9_reliability_hf_tailr.png"):
        assert name in result.figures
        assert (out / name).is_file()
    client = MlflowClient(uri)
    _check_transformer_run(tmp_path, client, result.runs)
    _check_llama_run(tmp_path, client, result.runs)
    _check_scoring(client, result.runs, uri, out)
