"""HFCausalLM trained: the shipped config from the command line, DDP, exact resume, schedules."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers.ddp import spawn_gloo
from helpers.preloaded import run_preloaded

transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from lightning_losses.callbacks import GammaAnnealing, LastCheckpoint  # noqa: E402
from lightning_losses.integrations.huggingface import (  # noqa: E402
    HFCausalLM,
    PydocTopicsBPEDataModule,
)
from lightning_losses.losses import LinearTargetLoss  # noqa: E402

LLAMA = {
    "class_path": "transformers.LlamaConfig",
    "init_args": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 8,
    },
}
QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--data.init_args.max_vocab_size=400",
    "--data.init_args.context_length=16",
]


@pytest.fixture(autouse=True)
def _own_store_and_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("LIGHTNING_LOSSES_VERBOSE", raising=False)
    monkeypatch.setenv("LIGHTNING_LOSSES_CACHE", str(tmp_path / "cache"))


def data(tmp_path, **kwargs):
    options = dict(context_length=8, batch_size=8, max_vocab_size=300, seed=0)
    return PydocTopicsBPEDataModule(**{**options, **kwargs}, tokenizer_cache=str(tmp_path))


def module(dm, criterion):
    torch.manual_seed(0)
    return HFCausalLM(LLAMA, criterion, vocab_size=dm.vocab_size, context_length=dm.context_length)


def trainer(folder, epochs, callbacks=(), **options):
    return L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        limit_train_batches=3,
        limit_val_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
        callbacks=[LastCheckpoint(str(folder)), *callbacks],
        **options,
    )


class GammaSeen(L.Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.values.append(pl_module.criterion.gamma)  # after GammaAnnealing set it


# Resuming writes into the folder of the checkpoint it resumes from, as `fit --ckpt_path` does.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
def test_resume_from_last_ckpt_is_exact_and_gamma_annealing_moves_tailrs_gamma(tmp_path):
    dm = data(tmp_path)
    # TaiLr's threshold b = 0.2, gamma annealed from 0 (lm_gamma_ce_annealed's setting)
    tailr = LinearTargetLoss("gamma_ce", gamma=0.0, threshold=0.2)

    def annealing():
        return GammaAnnealing(start=0.0, end=0.6, begin=0, until=5)  # steps: resumable

    straight_seen = GammaSeen()
    straight = module(dm, copy.deepcopy(tailr))
    trainer(tmp_path / "a", 2, [annealing(), straight_seen]).fit(straight, datamodule=dm)
    # 6 steps: gamma = 0.6 * step / 5, set before each step (its schedule's end at the last)
    assert straight_seen.values == pytest.approx([0.6 * s / 5 for s in range(6)], abs=1e-12)

    first = module(dm, copy.deepcopy(tailr))
    trainer(tmp_path / "b", 1, [annealing()]).fit(first, datamodule=dm)
    resumed_seen = GammaSeen()
    resumed = module(dm, copy.deepcopy(tailr))
    trainer(tmp_path / "b", 2, [annealing(), resumed_seen]).fit(
        resumed, datamodule=dm, ckpt_path=str(tmp_path / "b" / "last.ckpt")
    )
    assert resumed_seen.values == pytest.approx(straight_seen.values[3:], abs=1e-12)
    expected = straight.state_dict()
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)


# --- two gloo processes ----------------------------------------------------------------------


def _ddp_worker(rank: int, folder: str) -> None:
    import os

    os.environ.update({"LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": "2"})
    dm = data(Path(folder))
    model = module(dm, "focal")
    fit = trainer(Path(folder) / f"rank{rank}", 1, strategy="ddp", devices=2)
    fit.fit(model, datamodule=dm)
    metrics = {k: float(v) for k, v in fit.callback_metrics.items() if k.startswith("val/")}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"metrics": metrics, "state": state}, Path(folder) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_gloo_processes_log_the_token_metrics_of_all_validation_tokens(tmp_path):
    dm = data(tmp_path)  # the tokenizer trained once, then read from the cache by each rank
    spawn_gloo(_ddp_worker, str(tmp_path))
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    assert results[0]["metrics"] == results[1]["metrics"]  # synced: the same numbers
    model = module(dm, "focal")
    model.load_state_dict(results[0]["state"])
    # The reference: the full logits of the validation windows both processes read (2 batches
    # of 8 per process: windows 0..31), in one process.
    windows = dm.dataset("val")
    tokens = torch.stack([windows[i][0] for i in range(32)])
    target = torch.stack([windows[i][1] for i in range(32)])
    with torch.no_grad():
        logits = model.logits(tokens).double().reshape(-1, dm.vocab_size)
    nll = F.cross_entropy(logits, target.reshape(-1))
    accuracy = (logits.argmax(-1) == target.reshape(-1)).double().mean()
    logged = results[0]["metrics"]
    assert logged["val/nll"] == pytest.approx(nll.item(), rel=1e-5)
    assert logged["val/acc"] == pytest.approx(accuracy.item(), abs=1e-7)
    assert logged["val/ece_low"] <= logged["val/ece"] <= logged["val/ece_high"]


# --- the shipped config from the command line ------------------------------------------------


@pytest.mark.slow
def test_a_shipped_hf_config_fits_from_the_command_line(tmp_path):
    from mlflow.tracking import MlflowClient

    done = run_preloaded(  # a process of its own, forked from a warm interpreter
        ["lm", "fit", "--config", "hf_llama_tiny_tailr", *QUICK],
        cwd=tmp_path,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""  # quiet: no warning, no bar, no model summary
    lines = done.stdout.splitlines()
    assert len(lines) == 6, lines
    assert lines[0].startswith(
        "lightning-losses lm fit: criterion LinearTargetLoss(loss='gamma_ce'"
    )
    run_id = re.search(r"MLflow run ([0-9a-f]{32}) ", done.stdout).group(1)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["config"] == "hf_llama_tiny_tailr"
    assert float(re.search(r"perplexity (\d+\.\d+)", done.stdout).group(1)) == pytest.approx(
        run.data.metrics["val/ppl"], abs=0.006
    )
    # The SavePretrained callback's export: model and tokenizer load with from_pretrained.
    checkpoints = Path(re.search(r"  checkpoints: (\S+)", done.stdout).group(1))
    assert (checkpoints / "last.ckpt").is_file()
    files = sorted(p.name for p in checkpoints.iterdir())
    assert files == ["best-epoch=0-step=2.ckpt", "last.ckpt"]
    exported = checkpoints.parent / "pretrained"  # beside the checkpoints
    model = transformers.AutoModelForCausalLM.from_pretrained(exported)
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 128
    assert model.config.vocab_size == len(tokenizer) == 400
    trained = HFCausalLM.load_from_checkpoint(checkpoints / "last.ckpt", weights_only=True)
    ids = torch.tensor([tokenizer("def f(x): return x")["input_ids"]])
    torch.testing.assert_close(model(ids).logits, trained.logits(ids), rtol=0, atol=0)
