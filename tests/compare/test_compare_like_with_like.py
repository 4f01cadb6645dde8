"""``compare`` compares like with like, on a store of real fits (issue 36).

The store holds what a new user's store holds after the demo and the README's seeds: real
``lightning-losses fit`` runs (in this process, through the CLI layer's
:func:`~lightning_losses.cli.fit.run_fit`, as ``scripts/demo.py`` runs them), each one cheap
(1 epoch of 2 batches): a demo-like set at the configs' seed 0 (``digits_ce``,
``digits_normface``, a cross-entropy run with a cosine head, ``digits_focal`` at gamma 2 and,
overridden, at gamma 1, and the binary task ``rare_digit_binary_focal``), plus seeds 1-3 of
``digits_ce`` and ``digits_focal``.

The README's across-seeds command must then either give the verdicts that the same command
gives on the runs of those two configs alone, or exit with one line naming the filter to use;
and the cosine-head run, the gamma 1 and gamma 2 runs and the binary run are never pooled.
Every expected number is read from the store with MlflowClient and computed with SciPy.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import warnings

import pytest
from helpers.paths import ROOT
from scipy import stats

from lightning_losses.compare.cli import main

EXPERIMENT = "lightning-losses"
README = ["--group-by", "model.criterion.class_path", "--pair-by", "seed"]
CHEAP = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
#: (name, config, extra options): the demo-like set (seed 0, the configs' own), then the seeds.
FITS = [
    ("ce", "digits_ce", []),
    ("normface", "digits_normface", []),
    ("focal2", "digits_focal", []),
    ("focal1", "digits_focal", ["--model.criterion.init_args.gamma=1.0"]),
    ("binary", "rare_digit_binary_focal", []),
    *(
        (f"{name}{seed}", config, [f"--seed_everything={seed}"])
        for seed in (1, 2, 3)
        for name, config in (("ce", "digits_ce"), ("focal2", "digits_focal"))
    ),
]
METRICS = ("val/acc", "val/nll", "val/ece", "val/brier")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """The store of the 11 real fits: its URI, folder, and each fit's run id by name."""
    from lightning_losses.cli.fit import run_fit
    from lightning_losses.cli.quiet import fit_output_aside

    root = tmp_path_factory.mktemp("like")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    logger = [
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--trainer.logger.init_args.save_dir={root / 'mlflow_runs'}",
    ]
    ids = {}
    here = os.getcwd()
    os.chdir(root)  # anything a fit writes beside it lands here
    try:
        for name, config, extra in FITS:
            path = str(ROOT / "configs" / f"{config}.yaml")
            with warnings.catch_warnings(), fit_output_aside():
                warnings.simplefilter("ignore")  # the fits' own warnings are other tests' job
                cli = run_fit(["--config", path, *CHEAP, *logger, *extra])
            ids[name] = cli.trainer.logger.run_id
    finally:
        os.chdir(here)
    return {"uri": uri, "root": root, "ids": ids}


def compare(store, *options: str, out=None) -> tuple[int, str, str]:
    """``lightning-losses compare`` in this process on the store: exit code, stdout, stderr."""
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--diagrams", "0"]
    if out is not None:
        argv += ["--out", str(out)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*argv, *options])
    return code, stdout.getvalue(), stderr.getvalue()


def groups_csv(path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return {(row["metric"], row["group"]): row for row in csv.DictReader(handle)}


def final(store, name: str) -> dict[str, float]:
    """The run's last logged value of each metric, read from MLflow's histories."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store["uri"])
    run_id = store["ids"][name]
    values = {}
    for metric in METRICS:
        history = client.get_metric_history(run_id, metric)
        values[metric] = max(history, key=lambda m: (m.step, m.timestamp)).value
    return values


@pytest.mark.slow
def test_the_readme_command_after_the_demo_names_the_filter_and_the_filter_decides(store, tmp_path):
    # The README's command: two cross-entropy groups (linear and cosine head) could be the
    # baseline; one line names what they differ in and the filter that keeps one.
    code, out, err = compare(store, *README, out=tmp_path / "a")
    assert code == 2
    assert out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("lightning-losses compare: error: the baseline CrossEntropyLoss is")
    assert "differ in head" in line
    assert "digits_normface" in line
    keep = re.search(r"keep one with (--where \S+)", line).group(1)
    assert keep == "--where model.head=linear"

    # With that filter: the groups of the six seeded runs' configs, gamma 1 apart from gamma 2,
    # the binary run left out (another task), the cosine head filtered out.
    code, out, err = compare(store, *README, *keep.split(), out=tmp_path / "b")
    assert code == 0, err
    flat = out.replace("\n  ", " ")
    found = groups_csv(tmp_path / "b" / "groups.csv")
    labels = sorted({group for _, group in found})
    assert labels == ["CrossEntropyLoss", "FocalLoss (gamma=1)", "FocalLoss (gamma=2)"]
    assert "not compared with the baseline CrossEntropyLoss: BinaryFocalLoss" in flat
    assert "task=binary" in flat
    assert "--where model.task=binary" in flat
    assert "digits_normface" not in flat
    # gamma 1 ran at seed 0 only: paired on that seed, no interval, and it says so.
    assert "FocalLoss (gamma=1): paired on the 1 seed(s) it shares with the baseline (0)" in flat
    assert "± inf" not in out
    assert "(one seed)" in out

    # The same command on the runs of those two configs alone (digits_ce, and digits_focal at
    # its own gamma): the same verdicts and numbers.
    alone = [store["ids"][n] for n in store["ids"] if n.startswith(("ce", "focal2"))]
    assert len(alone) == 8
    code, out, err = compare(store, *README, "--runs", *alone, out=tmp_path / "c")
    assert code == 0, err
    restricted = groups_csv(tmp_path / "c" / "groups.csv")
    for (metric, group), row in restricted.items():
        label = "FocalLoss (gamma=2)" if group == "FocalLoss" else group
        assert row["verdict"] == found[metric, label]["verdict"], (metric, group)
        assert row["difference"] == found[metric, label]["difference"]

    # The filter by config that the README names: the same groups, verdicts and numbers.
    configs = ["--config", "digits_ce", "digits_focal"]
    code, out, err = compare(store, *README, *configs, out=tmp_path / "d")
    assert code == 0, err
    assert groups_csv(tmp_path / "d" / "groups.csv") == found

    # Independently: FocalLoss (gamma=2) against CE, paired over seeds 0-3, from the store.
    for metric in METRICS:
        focal = [final(store, f"focal2{s}" if s else "focal2")[metric] for s in range(4)]
        ce = [final(store, f"ce{s}" if s else "ce")[metric] for s in range(4)]
        row = found[metric, "FocalLoss (gamma=2)"]
        assert row["seeds"] == "0 1 2 3"
        reference = stats.ttest_rel(focal, ce).confidence_interval(0.95)
        assert float(row["difference_low"]) == pytest.approx(reference.low, abs=1e-9)
        assert float(row["difference_high"]) == pytest.approx(reference.high, abs=1e-9)


@pytest.mark.slow
def test_a_mixed_store_never_pools_the_cosine_head_the_gammas_or_the_binary_task(store, tmp_path):
    baseline = ["--baseline", "CrossEntropyLoss (head=linear)"]
    code, out, err = compare(store, "--group-by", "loss", *baseline, out=tmp_path)
    assert code == 0, err
    flat = out.replace("\n  ", " ")
    found = groups_csv(tmp_path / "groups.csv")
    seeds = {group: row["seeds"] for (metric, group), row in found.items() if metric == "val/acc"}
    assert seeds == {
        "CrossEntropyLoss (head=linear)": "0 1 2 3",
        "FocalLoss (gamma=1)": "0",
        "FocalLoss (gamma=2)": "0 1 2 3",
    }
    # The cosine head is a CE run of another model: its own group, not compared, and named.
    assert "CrossEntropyLoss (head=normface) [digits_normface], 1 run(s)" in flat
    assert "BinaryFocalLoss [rare_digit_binary_focal], 1 run(s) that differ from it in " in flat
    # Every group's values are its own runs' (seed -> value), read back from the store.
    acc = {name: final(store, name)["val/acc"] for name in store["ids"]}
    row = found["val/acc", "FocalLoss (gamma=1)"]
    assert float(row["mean"]) == pytest.approx(acc["focal1"], abs=1e-12)
    row = found["val/acc", "CrossEntropyLoss (head=linear)"]
    expected = [acc["ce"], acc["ce1"], acc["ce2"], acc["ce3"]]
    assert float(row["mean"]) == pytest.approx(sum(expected) / 4, abs=1e-12)
    # A one-seed group shows its value, not an infinite interval, and gets no verdict.
    line = next(ln for ln in out.splitlines() if ln.startswith("FocalLoss (gamma=1)"))
    assert "(one seed)" in line
    assert "undecided (needs at least 2 seeds)" in line
    assert "inf" not in out


@pytest.mark.slow
def test_the_listing_filters_shows_tasks_and_writes_beside_the_store(store, tmp_path):
    code, out, err = compare(store)  # no --out: beside the store
    assert code == 0, err
    written = [line.removeprefix("wrote ") for line in out.splitlines() if line.startswith("wrote")]
    assert written == [
        str(store["root"] / "comparison" / "comparison.csv"),
        str(store["root"] / "comparison" / "comparison.png"),
    ]
    table = out.split("\n\n")[0].splitlines()
    assert "task" in table[0].split()
    binary = [line for line in table[2:] if line.split()[0] == "rare_digit_binary_focal"]
    assert len(binary) == 1
    assert " binary " in binary[0]
    figure = "the figure plots the multiclass runs; left out 1 binary run (rare_digit_binary_focal)"
    assert figure in out.replace("\n  ", " ")
    # --config and --where pick runs by the config they were fitted from and by a param.
    code, out, err = compare(store, "--config", "configs/digits_focal.yaml", out=tmp_path)
    assert code == 0, err
    body = out.split("\n\n")[0].splitlines()[2:]
    assert len(body) == 5  # seeds 0-3 at gamma 2, seed 0 at gamma 1
    assert {line.split()[0] for line in body} == {"digits_focal"}
    code, out, err = compare(store, "--config", "digits_focal", "--where", "gamma=1", out=tmp_path)
    assert code == 0, err
    [line] = out.split("\n\n")[0].splitlines()[2:]
    assert line.split()[1] == store["ids"]["focal1"][:8]
