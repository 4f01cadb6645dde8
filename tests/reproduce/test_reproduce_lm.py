"""Claim 9 (TaiLr on the tiny language model): its verdict rule, and a shrunk claim end to end.

The shrunk claim fits the shipped ``configs/lm/lm_ce.yaml`` and ``lm_tailr.yaml`` with a narrow
model on a small vocabulary for a few steps, through ``reproduce``'s own pipeline (the language
model's CLI, MLflow, the post-fit metrics, the scoring under cross-entropy's model and the
report); every stored number is recomputed here from the run's checkpoint with plain float64
formulas.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from lightning_losses.reproduce.claims import CLAIMS
from lightning_losses.reproduce.lm_claim import (
    CLAIM_9,
    NLL_MARGIN,
    TOKEN_ECE_MARGIN,
    lm_conditions,
    lm_verdicts,
)
from lightning_losses.reproduce.spec import SUPPORTED, Stats, Variant, load_experiment, verdict

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
    assert names == ["ce", "tailr", "gamma_annealed", "focal_3", "label_smoothing"]
    for variant in experiment.variants:
        assert variant.program == "lm"
        assert variant.config.startswith("configs/lm/")
        assert (ROOT / variant.config).is_file()
        assert "--data.init_args.test_fraction=0.1" in variant.overrides
    tailr = (ROOT / "configs/lm/lm_tailr.yaml").read_text()
    assert "gamma: 1.0e-7" in tailr
    assert "threshold: 0.2" in tailr


def test_unknown_program_is_named(tmp_path):
    path = tmp_path / "claim.yaml"
    path.write_text("program: rnn\nvariants:\n  - {name: a, config: x.yaml}\n")
    with pytest.raises(ValueError, match="program must be one of classifier, lm; got 'rnn'"):
        load_experiment(path)


def test_the_verdict_is_tailrs_four_questions_over_the_paired_seeds():
    seeds = 6
    ce = {
        "rep/test_ece": (0.050, 0.052, 0.049, 0.051, 0.050, 0.053),
        "rep/ts_test_ece": (0.020, 0.021, 0.019, 0.020, 0.022, 0.021),
        "rep/test_nll": (5.00, 5.10, 4.90, 5.05, 4.95, 5.02),
        "rep/rep4_greedy": (0.40, 0.42, 0.38, 0.41, 0.39, 0.40),
    }
    better = {
        "rep/test_ece": tuple(v - 0.04 + 0.001 * i for i, v in enumerate(ce["rep/test_ece"])),
        "rep/ts_test_ece": ce["rep/ts_test_ece"],
        "rep/test_nll": tuple(v + 0.01 for v in ce["rep/test_nll"]),
        "rep/rep4_greedy": tuple(v - 0.1 for v in ce["rep/rep4_greedy"]),
    }
    table = _table(ce=ce, tailr=better)
    conditions = lm_conditions(table)
    assert [c.outcome for c in conditions] == ["holds"] * 4
    assert verdict(conditions) == SUPPORTED
    # The NLL margin decides (b): a tailr 0.2 nats worse on every seed fails it.
    worse = dict(better, **{"rep/test_nll": tuple(v + 0.2 for v in ce["rep/test_nll"])})
    b = lm_verdicts(_table(ce=ce, tailr=worse), "tailr")["b"]
    assert b.outcome == "fails"
    assert b.margin == NLL_MARGIN
    # (d) against CE + TS: tailr's ECE at CE's scaled ECE +- 0.001 is equivalent, not better.
    tied = dict(better, **{"rep/test_ece": tuple(v + 0.0005 for v in ce["rep/ts_test_ece"])})
    d = lm_verdicts(_table(ce=ce, tailr=tied), "tailr")["d"]
    assert d.decision is not None
    assert d.decision.verdict == "equivalent"
    assert d.outcome == "fails"
    assert d.margin == TOKEN_ECE_MARGIN
    assert len(ce["rep/test_ece"]) == seeds


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


def _plain_nll(model, windows) -> tuple[float, int]:
    """Mean -log softmax(logits)[target] over every window, in float64, and the token count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for index in range(len(windows)):
            tokens, target = windows[index]
            logits = model.logits(tokens[None])[0].double()
            total -= logits.log_softmax(-1).gather(1, target[:, None]).sum().item()
            count += target.numel()
    return total / count, count


def _plain_share(model, prompts, continuation, threshold=1e-3) -> float:
    """Share of continuation tokens below ``threshold`` under ``model``, one context at a time."""
    context_length = model.position_embedding.num_embeddings
    below = total = 0
    with torch.no_grad():
        for prompt, tokens in zip(prompts, continuation, strict=True):
            for k, token in enumerate(tokens):
                context = torch.tensor((prompt + tokens[:k])[-context_length:])
                probs = model.logits(context[None])[0, -1].double().softmax(-1)
                below += bool(probs[token] < threshold)
                total += 1
    return below / total


@pytest.mark.slow
def test_shrunk_claim9_end_to_end(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from lightning_losses.lm import PydocTopicsDataModule, TinyLanguageModel
    from lightning_losses.reproduce.language_model import CONTINUATIONS_ARTIFACT
    from lightning_losses.reproduce.pipeline import reproduce_claim
    from lightning_losses.reproduce.reference_scores import REFERENCE_TAG, score_under_reference
    from lightning_losses.reproduce.report import write_report
    from lightning_losses.reproduce.runner import read_json

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    arms = (
        Variant("ce", "configs/lm/lm_ce.yaml", SHRUNK, epochs=1, label="ce", program="lm"),
        Variant("tailr", "configs/lm/lm_tailr.yaml", SHRUNK, epochs=1, label="t", program="lm"),
    )
    claim = dataclasses.replace(CLAIM_9, fixed_variants=arms)
    out = tmp_path / "reports"
    out.mkdir()
    result = reproduce_claim(claim, seeds=2, scale=1.0, tracking_uri=uri, out=out)
    assert not result.failures
    report = write_report([result], out, ["shrunk"]).read_text()
    assert "## Claim 9" in report
    for (variant, seed), run_id in result.runs.items():
        assert re.search(rf"\| {variant} \| {seed} \| `{run_id}` \|", report)
    assert "| tailr | " in report
    assert "(e) fewer sampled tokens with p_CE < 1e-3" in report
    for name in ("claim9_reliability_ce.png", "claim9_reliability_tailr.png"):
        assert name in result.figures
        assert (out / name).is_file()

    client = MlflowClient(uri)
    ce_run = result.runs[("ce", 1)]
    tailr_run = result.runs[("tailr", 1)]
    metrics = client.get_run(tailr_run).data.metrics
    # The test perplexity is that of a plain float64 NLL over every test window of the
    # checkpoint's model (float32 logits: 1e-5 relative).
    last = next(tmp_path.rglob(f"{tailr_run}/**/last.ckpt"))
    model = TinyLanguageModel.load_from_checkpoint(last, weights_only=True).eval()
    datamodule = PydocTopicsDataModule(
        context_length=32, max_vocab_size=300, test_fraction=0.1, seed=1
    )
    nll, count = _plain_nll(model, datamodule.dataset("test"))
    assert count == len(datamodule.dataset("test")) * 32
    assert metrics["rep/test_nll"] == pytest.approx(nll, rel=1e-5)
    assert metrics["rep/test_ppl"] == pytest.approx(math.exp(nll), rel=1e-5)
    for decoding in ("greedy", "sampled"):
        for n in (2, 4):
            assert 0.0 <= metrics[f"rep/rep{n}_{decoding}"] <= 1.0
    # TaiLr's continuations scored under cross-entropy's model of the same seed.
    texts = read_json(client, tailr_run, CONTINUATIONS_ARTIFACT, tmp_path)
    assert texts is not None
    ce_last = next(tmp_path.rglob(f"{ce_run}/**/last.ckpt"))
    ce_model = TinyLanguageModel.load_from_checkpoint(ce_last, weights_only=True).eval()
    for decoding in ("greedy", "sampled"):
        expected = _plain_share(ce_model, texts["prompts"], texts[decoding])
        assert metrics[f"rep/ce_lowprob_{decoding}"] == pytest.approx(expected, abs=1e-12)
    assert client.get_run(tailr_run).data.tags[REFERENCE_TAG] == ce_run
    # A second pass reuses every run and scores nothing again.
    assert score_under_reference(result.runs, uri, out) == 0
