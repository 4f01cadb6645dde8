"""``lightning-losses lm``: the language model through the main command.

Configs by name from any folder, quiet output ending with perplexity and token ECE, the
commands' help, and ``fit`` refusing the language model's configs in one line.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
from pathlib import Path

import pytest
from helpers.paths import CONFIGS, ROOT, SCRIPT

from lightning_losses.cli.commands import lightning_epilog
from lightning_losses.cli.config_files import language_model_args
from lightning_losses.cli.console import console_main
from lightning_losses.lm.cli import console_main as lm_console_main
from lightning_losses.lm.cli import main

LM_CE = CONFIGS / "lm" / "lm_ce.yaml"
#: One epoch of a few batches over a small vocabulary: a few seconds.
QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--data.init_args.max_vocab_size=500",
    "--data.init_args.test_fraction=0.1",
]
#: ``perplexity 598.89 (val/ppl)`` of the closing lines.
PERPLEXITY = re.compile(r"perplexity (\d+\.\d+) \(val/ppl\)")


@pytest.fixture(autouse=True)
def _no_tracking_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("LIGHTNING_LOSSES_VERBOSE", raising=False)


# --- configs by name, and each command's own ---------------------------------------------


@pytest.mark.parametrize(
    "value", ["lm_ce", "lm/lm_ce", "lm_ce.yaml", "configs/lm/lm_ce.yaml", str(LM_CE)]
)
def test_lm_configs_are_found_by_name_from_any_folder(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = language_model_args(["fit", "--config", value, "--trainer.max_epochs=1"])
    assert args[:2] == ["fit", "--config"]
    assert Path(args[2]).samefile(LM_CE)
    assert args[3:] == ["--trainer.max_epochs=1"]


def test_lm_fit_without_config_runs_lm_ce():
    args = language_model_args(["fit", "--trainer.max_epochs=1"])
    assert Path(args[2]).samefile(LM_CE)


def test_fit_help_lists_only_the_configs_fit_runs():
    listed = lightning_epilog().split("): ", 1)[1].split(" (the language model", 1)[0]
    # The reference: the YAML files directly in configs/ (not configs/lm, configs/experiments).
    assert listed.split(", ") == sorted(path.stem for path in CONFIGS.glob("*.yaml"))
    assert "`lightning-losses lm fit --help`" in lightning_epilog()


@pytest.mark.parametrize("value", ["lm_ce", "lm/lm_ce", "configs/lm/lm_ce.yaml", str(LM_CE)])
def test_fit_refuses_a_language_model_config_in_one_line(value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert console_main(["fit", "--config", value, "--trainer.max_epochs=1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    suggested = "lm_ce" if not Path(value).is_file() else value
    assert captured.err.splitlines() == [
        f"lightning-losses fit: error: --config {value} is a language-model config: run "
        f"`lightning-losses lm fit --config {suggested}`"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_lm_refuses_a_classifier_config_and_a_misspelled_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert console_main(["lm", "fit", "--config", "digits_ce"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "lightning-losses lm fit: error: --config digits_ce is a classifier config: run "
        "`lightning-losses fit --config digits_ce` (language-model configs: hf_llama_tiny_ce, "
        "hf_llama_tiny_focal, hf_llama_tiny_tailr, lm_ce, "
    )
    assert console_main(["lm", "fit", "--config", "lm_cee"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "--config lm_cee: no such file" in err[0]
    assert "did you mean lm_ce?" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_lm_help_and_a_missing_or_unknown_subcommand(capsys):
    # The same answers from `lightning-losses lm` and `python -m lightning_losses.lm`.
    for entry in (lambda args: console_main(["lm", *args]), lm_console_main):
        assert entry(["--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: lightning-losses lm ")
        assert "lm_ce, lm_focal" in out
        assert entry([]) == 2
        assert "a command is required: fit, validate, test" in capsys.readouterr().err
        with pytest.raises(SystemExit) as stop:
            entry(["fitt"])
        assert stop.value.code == 2
        assert "invalid choice: 'fitt'" in capsys.readouterr().err
    # `python -m lightning_losses.lm fit ...` reaches the same checks as `lightning-losses lm fit`.
    with pytest.raises(SystemExit) as stop:
        lm_console_main(["fit", "--config", "lm_cee"])
    assert stop.value.code == 2
    from_module = capsys.readouterr().err
    assert console_main(["lm", "fit", "--config", "lm_cee"]) == 2
    assert capsys.readouterr().err == from_module


@pytest.mark.slow
def test_lm_fit_help_names_the_command_and_the_lm_configs(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", "lm_tailr", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lightning-losses lm fit [-h] [-c CONFIG]")
    flat = " ".join(out.split())
    assert "lm_gamma_ce_annealed, lm_label_smoothing, lm_tailr." in flat
    assert "digits_ce" not in out
    # The defaults shown are the config's (lm_tailr's criterion, not lm_ce's).
    assert "{'loss': 'gamma_ce', 'gamma': 1e-07, 'threshold': 0.2," in flat


# --- one fit through the installed script, from a folder that is not the repository --------


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """``lightning-losses lm fit --config lm_ce`` (one epoch) run in an empty folder."""
    folder = tmp_path_factory.mktemp("lm_fit")
    assert not (folder / "configs").exists()
    assert folder != ROOT
    done = subprocess.run(
        [str(SCRIPT), "lm", "fit", "--config", "lm_ce", *QUICK],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return folder, done


@pytest.mark.slow
def test_lm_fit_is_quiet_and_ends_with_perplexity(fitted):
    _, done = fitted
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) <= 15, lines
    assert len(lines) == 6, lines  # criterion, run, values, diagram, checkpoints, viewer
    assert done.stderr == ""  # no warning, no progress bar, no Lightning tip
    assert all(line.startswith(("lightning-losses lm fit: ", "  ")) for line in lines), lines
    assert not any("Total params" in line or "Epoch 0" in line for line in lines)
    assert any(PERPLEXITY.search(line) for line in lines[-4:]), lines[-4:]


@pytest.mark.slow
def test_lm_fit_prints_the_perplexity_and_ece_its_run_records(fitted):
    from mlflow.tracking import MlflowClient

    folder, done = fitted
    out = done.stdout
    run_id = re.search(r"MLflow run ([0-9a-f]{32}) ", out).group(1)
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["config"] == "lm_ce"
    assert client.get_experiment(run.info.experiment_id).name == "lightning-losses-lm"
    stored = run.data.metrics
    printed = float(PERPLEXITY.search(out).group(1))
    # The store's NLL, exponentiated here: the perplexity printed to its 2 decimals.
    assert abs(printed - math.exp(stored["val/nll"])) <= 0.005 + 1e-6 * printed
    ece = float(re.search(r"token ECE (\d\.\d{4})", out).group(1))
    assert ece == pytest.approx(stored["val/ece"], abs=5e-5)
    low, high = map(float, re.search(r"95% interval (\S+) to (\S+)\)", out).groups())
    assert low <= ece <= high


@pytest.mark.slow
def test_lm_fit_writes_the_token_diagram_and_names_the_checkpoint_folder(fitted):
    from mlflow.tracking import MlflowClient

    folder, done = fitted
    out = done.stdout
    diagram = Path(re.search(r"reliability diagram: (\S+)", out).group(1))
    assert diagram.name == "val_tokens_epoch=000.png"
    assert diagram.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoints = Path(re.search(r"  checkpoints: (\S+)", out).group(1))
    assert (checkpoints / "last.ckpt").is_file()
    assert checkpoints.is_relative_to(folder)
    run_id = re.search(r"MLflow run ([0-9a-f]{32}) ", out).group(1)
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    logged = {a.path for a in client.list_artifacts(run_id, "calibration")}
    assert logged == {"calibration/val_tokens_epoch=000.png"}


@pytest.mark.slow
@pytest.mark.parametrize(("command", "split"), [("validate", "val"), ("test", "test")])
def test_lm_validate_and_test_score_the_checkpoint_as_held_out_token_metrics_do(
    command, split, fitted, monkeypatch, capsys
):
    from lightning_losses.lm.evaluation import held_out_logits, token_metrics

    folder, done = fitted
    monkeypatch.chdir(folder)
    checkpoint = re.search(r"  checkpoints: (\S+)", done.stdout).group(1) + "/last.ckpt"
    cli = main([command, "--config", "lm/lm_ce", "--ckpt_path", checkpoint, *QUICK[3:]])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"lightning-losses lm {command}: {split}/acc ")
    metrics = cli.trainer.callback_metrics
    assert f"{split}/ppl {float(metrics[f'{split}/ppl']):.4g}" in lines[0]
    # The reference: the full [tokens, vocabulary] logits of the split, in one pass.
    logits, target = held_out_logits(cli.model, cli.datamodule.dataset(split))
    expected = token_metrics(logits, target)
    for name in ("ppl", "nll", "acc", "ece"):
        logged = float(metrics[f"{split}/{name}"])
        assert logged == pytest.approx(float(expected[name]), rel=1e-4, abs=1e-6), name


@pytest.mark.slow
def test_lm_test_without_a_test_split_is_one_line(fitted, monkeypatch, capsys):
    folder, done = fitted
    monkeypatch.chdir(folder)
    checkpoint = re.search(r"  checkpoints: (\S+)", done.stdout).group(1) + "/last.ckpt"
    with pytest.raises(SystemExit) as stop:
        main(["test", "--ckpt_path", checkpoint])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "lightning-losses lm test: error: the data has no test split "
        "(--data.init_args.test_fraction is 0): test a checkpoint fitted with "
        "--data.init_args.test_fraction=F, giving the same F (the topics held out, and so "
        "the vocabulary, follow it)"
    ]


@pytest.mark.slow
def test_lm_fit_verbose_shows_lightning_output(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    # (limit_val_batches=1 would parse as the float 1.0: every batch)
    quick = [*QUICK[:3], "--data.init_args.max_vocab_size=300"]
    with caplog.at_level(logging.INFO):
        cli = main(["fit", "--verbose", *quick, "--trainer.enable_progress_bar=false"])
    # Lightning's model summary and "fit stopped" (its handler is the terminal, pytest's here).
    assert "Total params" in caplog.text
    assert "`Trainer.fit` stopped" in caplog.text
    # The diagram holds the last validation epoch's tokens: its ECE is the logged val/ece.
    from lightning_losses.calibration.functional import calibration_error_from_bins

    epoch, bins = cli.model.last_val_bins
    assert epoch == 0
    batch = cli.datamodule.batch_size
    assert len(cli.datamodule.dataset("val")) > 2 * batch
    assert int(bins[0].sum()) == 2 * batch * cli.model.context_length  # 2 batches of windows
    ece = float(calibration_error_from_bins(*bins))
    assert ece == pytest.approx(float(cli.trainer.callback_metrics["val/ece"]), rel=1e-5)


@pytest.mark.parametrize("command", ["validate", "test"])
def test_lm_evaluation_without_a_checkpoint_names_the_lm_command(
    command, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([command, "--data.init_args.test_fraction=0.1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"lightning-losses lm {command}: error: --ckpt_path is required: ")
    with pytest.raises(SystemExit) as stop:
        main([command, "--ckpt_path", "runs/last.ckpt"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"lightning-losses lm {command}: error: --ckpt_path runs/last.ckpt: no such file "
        "(checkpoints are saved under mlflow_runs/<experiment id>/<run id>/checkpoints/)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_lm_fit_a_value_the_model_rejects_is_one_line_naming_lm(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--model.init_args.dropout=-1", "--data.init_args.max_vocab_size=300"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("lightning-losses lm fit: error: ")
    assert "dropout probability has to be between 0 and 1, but got -1.0" in err[0]
