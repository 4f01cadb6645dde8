"""The console script's dispatcher: light --help, checkpoint-less evaluations refused, no cycles."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT, SCRIPT

from lightning_losses.cli.commands import COMMANDS
from lightning_losses.cli.console import console_main
from lightning_losses.cli.fit import main, run_fit

PACKAGE = ROOT / "lightning_losses"
HEAVY = ("torch", "lightning", "mlflow", "matplotlib", "netcal", "sklearn")
QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]

# Runs the console script's entry point as the installed script does, then reports its exit
# status and which heavy packages were imported, on the last line of stdout.
PROBE = f"""
import json, sys
sys.argv = ["lightning-losses", *json.loads(sys.argv[1])]
from lightning_losses.cli.console import console_main
try:
    status = console_main()
except SystemExit as stop:
    status = stop.code
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print("\\nPROBE " + json.dumps({{"status": status, "heavy": heavy}}))
"""


def probe(args: list[str]) -> tuple[str, dict]:
    """Help text and ``{"status", "heavy"}`` of ``lightning-losses ARGS`` in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text, _, last = done.stdout.rpartition("\nPROBE ")
    return text, json.loads(last)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_top_level_help_lists_every_command_without_heavy_imports():
    text, result = probe(["--help"])
    assert result == {"status": 0, "heavy": []}
    assert text.startswith("usage: lightning-losses")
    listed = text.split("commands:", 1)[1]
    for command in (
        "fit",
        "validate",
        "test",
        "predict",
        "lm",
        "compare",
        "sync-tracking",
        "reproduce",
    ):
        assert f"\n    {command}" in listed, command


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("compare", "--experiment"),
        ("sync-tracking", "--tracking-uri"),
        ("reproduce", "--epochs-scale"),
        ("lm", "lm_ce"),
    ],
)
def test_command_help_is_light(command, option):
    text, result = probe([command, "--help"])
    assert result == {"status": 0, "heavy": []}
    assert text.startswith(f"usage: lightning-losses {command}")
    assert option in text


@pytest.mark.slow
def test_compare_and_sync_tracking_run_without_lightning(tmp_path):
    """They read stores and spools: Lightning (about 7 s of imports here) is not needed."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("light"))
    client.log_metric(run.info.run_id, "val/acc", 0.5, step=1)
    client.set_terminated(run.info.run_id)
    text, result = probe(["compare", "--experiment", "light", "--tracking-uri", uri])
    assert result["status"] == 0, text
    assert "lightning" not in result["heavy"]
    assert "0.5000" in text  # the run's metric, in the table
    (tmp_path / "empty").mkdir()
    text, result = probe(["sync-tracking", str(tmp_path / "empty")])
    assert result["status"] != 0  # no spool there: said in one line
    assert result["heavy"] == []
    import lightning_losses.tracking as tracking

    assert tracking.TrackingLogger.__module__ == "lightning_losses.tracking.logger"  # on demand


def test_installed_script_answers_help():
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(command in done.stdout for command in COMMANDS)


def test_unknown_or_missing_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        console_main(["fitt"])
    assert stop.value.code == 2
    assert "invalid choice: 'fitt'" in capsys.readouterr().err
    assert console_main([]) == 2
    assert "a command is required: fit, validate" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluation_without_checkpoint_is_refused_before_anything_runs(command, tmp_path, capsys):
    config = str(ROOT / "configs" / "digits_ce.yaml")
    with pytest.raises(SystemExit) as stop:
        console_main([command, "--config", config, *QUICK[2:]])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"lightning-losses {command}: error: --ckpt_path is required: ")
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no run folder, no config file


def test_evaluation_without_checkpoint_is_refused_in_python_too(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["test", *QUICK[2:]])  # the packaged default config
    assert stop.value.code == 2
    assert "--ckpt_path is required" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_run_fit_fits_and_keeps_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [sys.argv[0], "--not-for-the-cli"])
    config = str(ROOT / "configs" / "digits_ce.yaml")
    cli = run_fit(["--config", config, *QUICK])
    assert cli.trainer.state.finished
    assert cli.trainer.global_step == 2
    assert cli.config["fit"]["trainer"]["max_epochs"] == 1
    assert sys.argv[1:] == ["--not-for-the-cli"]
    assert (tmp_path / "mlflow.db").is_file()
    with pytest.raises(TypeError, match="args must be a sequence of strings"):
        run_fit("--config x.yaml")


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (function-level imports included, TYPE_CHECKING not)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for part in node.body
        for inner in ast.walk(part)
    }
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            subs = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(subs if len(subs) == len(node.names) else {base, *subs})
    return (found & modules) - {module}


def test_dispatch_and_reproduce_import_no_module_that_imports_them_back():
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _imports(path, name, set(files)) for name, path in files.items()}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    ours = [
        "lightning_losses.cli.console",
        "lightning_losses.cli.commands",
        "lightning_losses.cli",
        "lightning_losses.tracking",
        "lightning_losses.reproduce.cli",
        "lightning_losses.reproduce.pipeline",
        "lightning_losses.reproduce.runner",
    ]
    for name in ours:
        assert name not in reachable(name), f"{name} imports a module that imports it back"
    assert not [name for name, deps in graph.items() if "lightning_losses.cli.console" in deps]
    assert "lightning_losses.cli.fit" in graph["lightning_losses.reproduce.runner"]
    assert not reachable("lightning_losses.cli") & {n for n in files if ".reproduce" in n}


@pytest.mark.slow
def test_a_preloaded_run_gives_what_the_script_gives_and_times_out_cleanly(tmp_path):
    """The suite's forked runs (helpers/preloaded.py): status, output, folder, time limit."""
    from helpers.preloaded import run_preloaded

    script = subprocess.run(
        [str(SCRIPT), "fit", "--trainer.max_epoch=1"], capture_output=True, text=True, cwd=tmp_path
    )
    forked = run_preloaded(["fit", "--trainer.max_epoch=1"], cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        script.returncode,
        script.stdout,
        script.stderr,
    )
    assert forked.returncode == 2
    with pytest.raises(subprocess.TimeoutExpired):
        run_preloaded(["fit", "--trainer.max_epochs=1000"], cwd=tmp_path, timeout=3)
    again = run_preloaded(["--version"], cwd=tmp_path)  # the server goes on after a kill
    assert again.returncode == 0
    assert again.stdout.startswith("lightning-losses ")
