"""The language-model example: tokenizer, windows, data module, a tiny fit with GammaAnnealing."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lightning_losses import LinearTargetLoss
from lightning_losses.callbacks import GammaAnnealing
from lightning_losses.functional.linear import linear_prediction_statistics
from lightning_losses.lm.cli import main
from lightning_losses.lm.data import (
    PydocTopicsDataModule,
    TokenWindows,
    WordTokenizer,
    load_topics,
    split_topics,
)
from lightning_losses.lm.model import TinyLanguageModel, TokenCalibration

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "lm"


@pytest.fixture(scope="module")
def datamodule() -> PydocTopicsDataModule:
    return PydocTopicsDataModule(context_length=16, batch_size=8, max_vocab_size=2000)


# --- tokenizer ----------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_unknown_words():
    tokenizer = WordTokenizer.fit(["Hello, World! hello again: x = y + 1;"])
    text = "hello world, again!"
    assert tokenizer.decode(tokenizer.encode(text)) == "hello world , again !"
    assert tokenizer.decode(tokenizer.encode(text)) == " ".join(tokenizer.tokenize(text))
    ids = tokenizer.encode("Hello unseen-word")
    assert ids[1] == tokenizer.unk_id
    assert ids[0] != tokenizer.unk_id
    assert tokenizer.decode(ids) == "hello <unk> <unk> <unk>"  # "-" unseen too
    assert tokenizer.encode("hi", eos=True)[-1] == tokenizer.eos_id


def test_tokenizer_splits_words_and_punctuation_runs():
    assert WordTokenizer.tokenize("Don't  use ------ x__y(2)") == [
        "don", "'", "t", "use", "------", "x__y", "(", "2", ")",
    ]  # fmt: skip


def test_tokenizer_vocabulary_is_ranked_and_capped():
    tokenizer = WordTokenizer.fit(["b b b a a c c d"], max_size=4)
    assert tokenizer.vocabulary == ["<unk>", "<eos>", "b", "a"]  # ties: alphabetical
    assert len(tokenizer) == 4
    assert WordTokenizer.fit(["a a b"], min_count=2).vocabulary == ["<unk>", "<eos>", "a"]
    with pytest.raises(ValueError, match="max_size"):
        WordTokenizer.fit(["a"], max_size=2)


# --- data ---------------------------------------------------------------------------------------


def test_windows_are_next_token_pairs():
    windows = TokenWindows(torch.arange(23), context_length=5)
    assert len(windows) == 4
    x, y = windows[3]
    assert x.tolist() == [15, 16, 17, 18, 19]
    assert y.tolist() == [16, 17, 18, 19, 20]
    with pytest.raises(IndexError):
        windows[4]
    assert len(TokenWindows(torch.arange(3), context_length=5)) == 0


def test_split_is_by_sorted_topic_and_seeded():
    names = list(load_topics())
    train, val, test = split_topics(names, 0.1, seed=0)
    assert test == []
    assert sorted(train + val) == sorted(names)
    assert not set(train) & set(val)
    assert train == sorted(train)
    assert len(val) == round(0.1 * len(names))
    assert split_topics(reversed(names), 0.1, seed=0) == (train, val, [])
    assert split_topics(names, 0.1, seed=1) != (train, val, [])


def test_test_split_keeps_the_validation_split_and_takes_from_training():
    names = list(load_topics())
    train, val, _ = split_topics(names, 0.1, seed=3)
    train2, val2, test2 = split_topics(names, 0.1, seed=3, test_fraction=0.1)
    assert val2 == val
    assert len(test2) == round(0.1 * len(names))
    assert sorted(train2 + test2) == train
    assert not set(test2) & set(val2)
    with pytest.raises(ValueError, match="test_fraction"):
        split_topics(names, 0.1, seed=0, test_fraction=1.5)
    with pytest.raises(ValueError, match="no training topic would be left"):
        split_topics(["a", "b", "c"], 0.5, seed=0, test_fraction=0.5)


def test_datamodule_test_split():
    datamodule = PydocTopicsDataModule(context_length=16, test_fraction=0.1, seed=2)
    plain = PydocTopicsDataModule(context_length=16, seed=2)
    assert datamodule.val_topics == plain.val_topics
    assert set(datamodule.test_topics) <= set(plain.train_topics)
    tokenizer = datamodule.tokenizer
    expected = [
        i
        for name in datamodule.test_topics
        for i in tokenizer.encode(load_topics()[name], eos=True)
    ]
    windows = datamodule.dataset("test")
    assert len(windows) == (len(expected) - 1) // 16
    x, y = next(iter(datamodule.test_dataloader()))
    assert x[0].tolist() == expected[:16]
    assert y[0].tolist() == expected[1:17]
    with pytest.raises(ValueError, match="test split needs test_fraction > 0"):
        plain.dataset("test")


def test_datamodule(datamodule):
    assert 1000 < datamodule.vocab_size <= 2000
    val_text = " ".join(load_topics()[name] for name in datamodule.val_topics)
    fitted = WordTokenizer.fit(load_topics()[name] for name in datamodule.train_topics)
    assert fitted.vocabulary[: datamodule.vocab_size] == datamodule.tokenizer.vocabulary
    assert datamodule.tokenizer.unk_id in datamodule.tokenizer.encode(val_text)  # unseen words
    x, y = next(iter(datamodule.train_dataloader()))
    assert x.shape == y.shape == (8, 16)
    assert x.dtype == torch.long
    assert int(x.max()) < datamodule.vocab_size
    assert len(datamodule.dataset("val")) > 10


# --- model and metrics --------------------------------------------------------------------------


def test_criterion_on_hidden_states_equals_plain_logits():
    torch.manual_seed(0)
    model = TinyLanguageModel("focal", vocab_size=40, context_length=6, d_model=16, n_heads=2)
    tokens, target = torch.randint(0, 40, (3, 6)), torch.randint(0, 40, (3, 6))
    _, _, loss = model._loss((tokens, target))
    logits = model.logits(tokens)
    from lightning_losses.functional import focal_loss

    torch.testing.assert_close(loss, focal_loss(logits.flatten(0, 1), target.flatten()))


def test_model_is_causal():
    torch.manual_seed(0)
    model = TinyLanguageModel(vocab_size=30, context_length=5, d_model=16, n_heads=2).eval()
    tokens = torch.randint(0, 30, (2, 5))
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 30
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :-1], model(changed)[:, :-1])


def test_token_calibration_matches_plain_logits():
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(50, 8), torch.randn(30, 8), torch.randn(30)
    target = torch.randint(0, 30, (50,))
    target[::7] = -100
    metric = TokenCalibration(n_bins=15)
    metric.update(*linear_prediction_statistics(hidden, weight, target, bias=bias, chunk_size=8))
    result = metric.compute()
    logits = (hidden @ weight.T + bias)[target != -100]
    kept = target[target != -100]
    nll = F.cross_entropy(logits.double(), kept)
    probabilities = logits.double().softmax(1)
    confidence, prediction = probabilities.max(1)
    correct = (prediction == kept).double()
    bins = torch.clamp(torch.ceil(confidence * 15).long() - 1, 0, 14)
    ece = sum(abs(confidence[bins == b].sum() - correct[bins == b].sum()) for b in range(15)) / len(
        kept
    )
    torch.testing.assert_close(result["nll"], nll, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result["ppl"], nll.exp(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result["acc"], correct.mean())
    torch.testing.assert_close(result["ece"], ece, rtol=1e-6, atol=1e-6)


def test_criterion_forms():
    assert TinyLanguageModel(vocab_size=10, d_model=8, n_heads=2).criterion.loss == "ce"
    model = TinyLanguageModel(
        {"class_path": "lightning_losses.LinearTargetLoss", "init_args": {"loss": "gamma_ce"}},
        vocab_size=10,
        d_model=8,
        n_heads=2,
    )
    assert isinstance(model.criterion, LinearTargetLoss)
    assert model.criterion.gamma == 0.5
    criterion = LinearTargetLoss("focal", gamma=1.0)
    model = TinyLanguageModel(criterion, vocab_size=10, d_model=8, n_heads=2)
    assert model.criterion is criterion
    assert model.hparams["criterion"]["init_args"]["gamma"] == 1.0  # plain, for checkpoints


def test_tiny_fit_with_gamma_annealing_logs_perplexity_and_ece(datamodule, tmp_path):
    torch.manual_seed(0)
    model = TinyLanguageModel(
        LinearTargetLoss("gamma_ce", gamma=0.0),
        vocab_size=datamodule.vocab_size,
        context_length=datamodule.context_length,
        d_model=32,
        n_heads=2,
    )
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=6,
        limit_val_batches=3,
        callbacks=[GammaAnnealing(start=0.0, end=0.5)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule)
    metrics = trainer.callback_metrics
    assert model.criterion.gamma == 0.5  # set before the last step: the schedule's end
    ppl, nll, ece = (float(metrics[f"val/{name}"]) for name in ("ppl", "nll", "ece"))
    assert math.isclose(ppl, math.exp(nll), rel_tol=1e-5)
    assert ppl > 1.0
    assert ppl < 2 * datamodule.vocab_size  # better than twice uniform guessing
    assert ece >= 0.0
    assert ece <= 1.0
    assert "criterion/gamma" in metrics
    assert "val/acc" in metrics
    path = tmp_path / "lm.ckpt"
    trainer.save_checkpoint(path)
    torch.load(path, weights_only=True)  # hyper-parameters are plain values
    restored = TinyLanguageModel.load_from_checkpoint(path)
    assert restored.criterion.loss == "gamma_ce"
    torch.testing.assert_close(restored.output_bias, model.output_bias)


@pytest.mark.parametrize("name", sorted(path.stem for path in CONFIGS.glob("lm_*.yaml")))
@pytest.mark.slow
def test_configs_parse(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(["--config", str(CONFIGS / f"{name}.yaml")], run=False)
    assert isinstance(cli.model, TinyLanguageModel)
    assert isinstance(cli.model.criterion, LinearTargetLoss)
    assert cli.model.token_embedding.num_embeddings == cli.datamodule.vocab_size
    if "gamma" in name:
        assert any(isinstance(c, GammaAnnealing) for c in cli.trainer.callbacks)
    expected = dict(CRITERIA.get(name, {})) or None
    if expected is not None:  # the hyper-parameters the config's header states
        criterion = cli.model.criterion
        assert criterion.loss == expected.pop("loss")
        for key, value in expected.items():
            assert getattr(criterion, key) == value, key


#: What each claim-9 config's header says its criterion is.
CRITERIA = {
    "lm_ce": {"loss": "ce"},
    "lm_tailr": {"loss": "gamma_ce", "gamma": 1e-7, "threshold": 0.2},
    "lm_focal": {"loss": "focal", "gamma": 3.0},
    "lm_label_smoothing": {"loss": "ce", "label_smoothing": 0.1},
    "hf_llama_tiny_ce": {"loss": "ce"},
    "hf_llama_tiny_tailr": {"loss": "gamma_ce", "gamma": 1e-7, "threshold": 0.2},
    "hf_llama_tiny_focal": {"loss": "focal", "gamma": 3.0},
}


@pytest.mark.parametrize("name", sorted(path.stem for path in CONFIGS.glob("hf_llama_tiny_*.yaml")))
@pytest.mark.slow
def test_claim9_llama_configs_parse_as_their_headers_say(name, tmp_path, monkeypatch):
    """Claim 9's Llama arms: claim 9's width and the criterion their header names."""
    pytest.importorskip("transformers", reason="the [hf] extra is not installed")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTNING_LOSSES_CACHE", str(tmp_path / "cache"))
    small = "--data.init_args.max_vocab_size=300"  # a quick tokenizer: the criterion is checked
    cli = main(["--config", str(CONFIGS / f"{name}.yaml"), small], run=False)
    config = cli.model.model.config
    assert type(cli.model.model).__name__ == "LlamaForCausalLM"
    assert (config.hidden_size, config.num_hidden_layers) == (128, 2)  # lm_*'s d_model, n_layers
    assert config.vocab_size == cli.datamodule.vocab_size
    expected = dict(CRITERIA[name])
    assert cli.model.criterion.loss == expected.pop("loss")
    for key, value in expected.items():
        assert getattr(cli.model.criterion, key) == value, key


@pytest.mark.slow
def test_config_fit_is_tracked_in_mlflow(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cli = main(
        [
            "fit",
            "--config",
            str(CONFIGS / "lm_gamma_ce_annealed.yaml"),
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=3",
            "--trainer.limit_val_batches=2",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false",
            "--data.init_args.max_vocab_size=500",
        ]
    )
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(cli.trainer.logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["config"] == "lm_gamma_ce_annealed"
    assert run.data.params["model.init_args.criterion.init_args.loss"] == "gamma_ce"
    ppl = run.data.metrics["val/ppl"]
    assert ppl == pytest.approx(float(cli.trainer.callback_metrics["val/ppl"]), rel=1e-6)
    assert "criterion/gamma" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "config.yaml" in artifacts


def test_the_base_model_needs_its_output_head():
    """TokenLanguageModel is abstract: a subclass without output_head() cannot be built."""
    from lightning_losses.lm.model import TokenLanguageModel

    with pytest.raises(TypeError, match="abstract method output_head"):
        TokenLanguageModel()
    assert "output_head" not in TinyLanguageModel.__abstractmethods__
