"""Start-up time of the ``lightning-losses`` console script: ``--help``, errors and ``fit``.

Each command runs ``--runs`` times in a fresh process (round robin, so that a busy spell of the
machine falls on every command alike); the table gives the median and the fastest wall time,
and their ratios to three baselines measured in the same run: ``python -c pass`` (the
interpreter), ``python -c "import torch"`` and ``python -c "import lightning"``.

- ``--help``, ``--version`` and two start-up errors (exit status 2): process start to exit.
- ``fit``: process start to the first training batch (``lightning-losses fit --config CONFIG``
  with the callback of ``benchmarks/first_batch.py`` appended, which prints the time of the
  first batch and ends the process). The fits share one working folder whose MLflow store
  (``sqlite:///mlflow.db``) is created before the timed runs, as in a project folder used
  before; ``--fresh-store`` gives each fit a new folder (store creation included).

Usage::

    python benchmarks/cli_startup.py              # 5 runs each
    python benchmarks/cli_startup.py --runs 3 --config configs/digits_focal.yaml
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


def console_script() -> list[str]:
    """The installed ``lightning-losses`` script.

    Else ``python -m lightning_losses.cli.console``.
    """
    script = Path(PYTHON).with_name("lightning-losses")
    return [str(script)] if script.is_file() else [PYTHON, "-m", "lightning_losses.cli.console"]


@dataclass
class Case:
    """One command to time: its label, its argument vector and how to read its time."""

    label: str
    argv: list[str]
    first_batch: bool = False  # time to the FIRST_BATCH line instead of to exit
    status: int = 0  # the exit status it must end with (2: a start-up error)
    seconds: list[float] = field(default_factory=list)


def run_once(case: Case, cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of one run of ``case`` (to exit, or to the first training batch)."""
    launched = time.time()
    started = time.perf_counter()
    done = subprocess.run(case.argv, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != case.status:
        raise RuntimeError(f"{case.label} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    if not case.first_batch:
        return elapsed
    # The mark may share a line with the progress bar, which ends no line.
    mark = re.search(r"FIRST_BATCH (\d+\.\d+)", done.stdout)
    if mark is None:
        raise RuntimeError(f"{case.label} printed no FIRST_BATCH line:\n{done.stderr[-3000:]}")
    return float(mark.group(1)) - launched


def create_store(folder: Path, env: dict[str, str]) -> None:
    """Create the MLflow SQLite store of ``folder`` (its schema) before the timed fits."""
    code = "from mlflow.tracking import MlflowClient; MlflowClient('sqlite:///mlflow.db')"
    subprocess.run([PYTHON, "-c", code + ".search_experiments()"], cwd=folder, env=env, check=True)


def cases(config: str) -> list[Case]:
    """The baselines, the ``--help`` commands, ``--version``, two start-up errors and ``fit``.

    The unknown loss is refused before Lightning is imported; the misspelled key is found by
    LightningCLI's parser, so it costs the import of Lightning.
    """
    script = console_script()
    return [
        Case("`python -c pass`", [PYTHON, "-c", "pass"]),
        Case('`python -c "import torch"`', [PYTHON, "-c", "import torch"]),
        Case('`python -c "import lightning"`', [PYTHON, "-c", "import lightning"]),
        Case("`lightning-losses --help`", [*script, "--help"]),
        Case("`lightning-losses compare --help`", [*script, "compare", "--help"]),
        Case("`lightning-losses sync-tracking --help`", [*script, "sync-tracking", "--help"]),
        Case("`lightning-losses reproduce --help`", [*script, "reproduce", "--help"]),
        Case("`lightning-losses --version`", [*script, "--version"]),
        Case(
            "`lightning-losses fit --model.criterion=focall` (error: unknown loss)",
            [*script, "fit", "--model.criterion=focall"],
            status=2,
        ),
        Case(
            "`lightning-losses fit --trainer.max_epoch=2` (error: misspelled key)",
            [*script, "fit", "--trainer.max_epoch=2"],
            status=2,
        ),
        Case("`lightning-losses fit --help`", [*script, "fit", "--help"]),
        Case(
            f"`lightning-losses fit --config {config}` to the first batch",
            [
                *script,
                "fit",
                "--config",
                str((ROOT / config).resolve()),
                "--trainer.callbacks+=first_batch.FirstBatch",
            ],
            first_batch=True,
        ),
    ]


def table(timed: list[Case]) -> str:
    """Markdown table: median and fastest seconds, and the median's ratio to each baseline."""
    python, torch, lightning = (statistics.median(c.seconds) for c in timed[:3])
    lines = [
        "| command | median s | fastest s | × `python -c pass` | × `import torch` "
        "| × `import lightning` |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in timed:
        median = statistics.median(case.seconds)
        lines.append(
            f"| {case.label} | {median:.2f} | {min(case.seconds):.2f} | {median / python:.1f} "
            f"| {median / torch:.2f} | {median / lightning:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Time every case ``--runs`` times, print progress to stderr and the table to stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (median)")
    parser.add_argument("--config", default="configs/digits_ce.yaml", help="config of the fit")
    parser.add_argument("--no-fit", action="store_true", help="time the --help commands only")
    parser.add_argument(
        "--fresh-store", action="store_true", help="each fit in a new folder (new MLflow store)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env.pop("MLFLOW_TRACKING_URI", None)
    todo = cases(args.config)[: -1 if args.no_fit else None]
    total = args.runs * len(todo)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp:
        shared = Path(tmp)
        if not args.no_fit and not args.fresh_store:
            create_store(shared, env)
        k = 0
        for _ in range(args.runs):
            for case in todo:
                folder = shared
                if case.first_batch and args.fresh_store:
                    folder = Path(tempfile.mkdtemp(dir=tmp))
                case.seconds.append(run_once(case, folder, env))
                k += 1
                elapsed = time.perf_counter() - started
                eta = elapsed / k * (total - k)
                print(
                    f"[{k}/{total}] {case.label}: {case.seconds[-1]:.2f} s  ETA {eta:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"{args.runs} run(s) each, median and fastest wall time; {os.cpu_count()} CPU(s), "
        f"load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end.\n"
    )
    print(table(todo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
