"""Like with like, in memory: what sets runs apart, the verdict rules' order, the store's path.

The records are built by hand with the params a real fit logs (the names copied from
``lightning-losses fit`` runs of the shipped configs); every expected grouping is written out
here, and every interval and test computed with SciPy.
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
from scipy import stats

from lightning_losses.compare import alike
from lightning_losses.compare.cli import main
from lightning_losses.compare.decide import decide
from lightning_losses.compare.groups import RunRecord, compare_groups, format_groups

#: What a digits config logs besides its criterion and head (a real fit's params, trimmed).
COMMON = {
    "data.class_path": "lightning_losses.data.DigitsDataModule",
    "data.init_args.batch_size": "64",
    "model.hidden.0": "128",
    "model.num_classes": "10",
    "model.task": "multiclass",
    "model.head": "linear",
    "model.optimizer.init_args.lr": "0.003",
    "trainer.max_epochs": "20",
    "trainer.enable_progress_bar": "True",
    "trainer.callbacks.0.class_path": "lightning_losses.callbacks.CalibrationMonitor",
    "trainer.callbacks.0.init_args.n_bins": "15",
    "trainer.callbacks.0.init_args.diagram_every_n_epochs": "0",
    "trainer.callbacks.1.class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
    "trainer.callbacks.1.init_args.monitor": "val/nll",
}
CE = {"model.criterion.class_path": "lightning_losses.CrossEntropyLoss"}
FOCAL = {"model.criterion.class_path": "lightning_losses.FocalLoss"}
BINARY = {
    "model.criterion.class_path": "lightning_losses.BinaryFocalLoss",
    "data.class_path": "lightning_losses.data.RareDigitDataModule",
    "model.num_classes": "1",
    "model.task": "binary",
}


def record(name: str, seed: int, params: dict, acc: float, config: str) -> RunRecord:
    return RunRecord(
        run_id=f"{name}-{seed}".ljust(32, "0"),
        run_name=config,
        start_time=seed,
        params={
            **COMMON,
            **params,
            "seed_everything": str(seed),
            "trainer.logger.init_args.run_name": config,
        },
        tags={"config": config, "loss": params["model.criterion.class_path"].rsplit(".", 1)[1]},
        metrics={"val/acc": acc},
        status="FINISHED",
    )


def mixed_store() -> list[RunRecord]:
    """A demo-like store: CE (linear head, 3 seeds; cosine head, 1), focal gamma 1 and 2, binary."""
    runs = []
    for seed in range(3):
        runs.append(record("ce", seed, CE, 0.90 + 0.01 * seed, "digits_ce"))
        gamma2 = {**FOCAL, "model.criterion.init_args.gamma": "2.0"}
        runs.append(record("f2", seed, gamma2, 0.92 + 0.01 * seed, "digits_focal"))
        gamma1 = {**FOCAL, "model.criterion.init_args.gamma": "1.0"}
        runs.append(record("f1", seed, gamma1, 0.80 + 0.011 * seed, "digits_focal"))
    runs.append(record("nf", 0, {**CE, "model.head": "normface"}, 0.5, "digits_normface"))
    runs.append(record("bin", 0, BINARY, 0.99, "rare_digit_binary_focal"))
    return runs


def test_canonical_keeps_what_changes_a_result_and_keys_callbacks_by_class():
    params = {
        **COMMON,
        "seed_everything": "4",
        "trainer.logger.init_args.run_name": "x",
        "trainer.log_every_n_steps": "5",
    }
    # One more callback in front (a schedule) shifts the others' indices, not their params.
    shifted = {k: v for k, v in params.items() if not k.startswith("trainer.callbacks.")}
    shifted.update(
        {
            "trainer.callbacks.0.class_path": "lightning_losses.callbacks.GammaAnnealing",
            "trainer.callbacks.0.init_args.end": "1.0",
            "trainer.callbacks.1.class_path": "lightning_losses.callbacks.CalibrationMonitor",
            "trainer.callbacks.1.init_args.n_bins": "15",
            "trainer.callbacks.1.init_args.diagram_every_n_epochs": "5",
            "trainer.callbacks.2.class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        }
    )
    plain, annealed = alike.canonical(params), alike.canonical(shifted)
    assert plain == {
        "data.class_path": "lightning_losses.data.DigitsDataModule",
        "data.init_args.batch_size": "64",
        "model.head": "linear",
        "model.hidden.0": "128",
        "model.num_classes": "10",
        "model.optimizer.init_args.lr": "0.003",
        "model.task": "multiclass",
        "trainer.callbacks.CalibrationMonitor.class_path": (
            "lightning_losses.callbacks.CalibrationMonitor"
        ),
        "trainer.callbacks.CalibrationMonitor.init_args.n_bins": "15",
        "trainer.max_epochs": "20",
    }
    assert alike.differing([plain, annealed]) == [
        "trainer.callbacks.GammaAnnealing.class_path",
        "trainer.callbacks.GammaAnnealing.init_args.end",
    ]
    varies = alike.treatment("model.criterion.class_path")
    assert all(varies(key) for key in alike.differing([plain, annealed]))  # the loss's schedule
    assert not varies("model.head")
    assert not varies(alike.TASK_PARAM)


def test_runs_that_differ_in_more_than_the_seed_are_never_pooled():
    runs = mixed_store()
    # The default baseline, cross-entropy, is two groups: one line says what differs and how
    # to keep one.
    with pytest.raises(ValueError, match="the baseline CrossEntropyLoss is ambiguous") as error:
        compare_groups(runs, "loss", pair_by="seed")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the baseline CrossEntropyLoss is ambiguous: 2 groups")
    assert "(model.head linear: digits_ce; normface: digits_normface)" in message
    assert "keep one with --where model.head=linear" in message
    # Keeping one: gamma 1 and gamma 2 apart, the cosine head and the binary task left out.
    kept = alike.matches(runs, RunRecord.fields, where=alike.parse_where(["model.head=linear"]))
    result = compare_groups(kept, "loss", pair_by="seed")
    assert result.groups == {
        "CrossEntropyLoss": [0, 1, 2],
        "FocalLoss (gamma=1)": [0, 1, 2],
        "FocalLoss (gamma=2)": [0, 1, 2],
    }
    [note] = result.notes
    assert note.startswith(
        "not compared with the baseline CrossEntropyLoss: BinaryFocalLoss "
        "[rare_digit_binary_focal], 1 run(s) that differ from it in task=binary, "
        "data.class_path=RareDigitDataModule"
    )
    assert note.endswith("compare such runs apart: --where model.task=binary")
    rows = {row.group: row for row in result.rows}
    assert rows["FocalLoss (gamma=2)"].values == pytest.approx({0: 0.92, 1: 0.93, 2: 0.94})
    assert rows["FocalLoss (gamma=1)"].values == pytest.approx({0: 0.80, 1: 0.811, 2: 0.822})
    differences = [0.80 - 0.90, 0.811 - 0.91, 0.822 - 0.92]
    reference = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    decision = rows["FocalLoss (gamma=1)"].decision
    assert (decision.low, decision.high) == pytest.approx((reference.low, reference.high))
    assert decision.verdict == "worse"
    # Named by its whole label, the cosine-head group is the baseline, and nothing else compares.
    alone = compare_groups(runs, "loss", baseline="CrossEntropyLoss (head=normface)")
    assert list(alone.groups) == ["CrossEntropyLoss (head=normface)"]
    assert len(alone.notes) == 4  # CE (linear head), both focal groups, the binary task
    assert all(note.startswith("not compared with the baseline") for note in alone.notes)
    text = format_groups(alone, width=100)
    assert "0.5000 (one seed)" in text  # no ± inf
    assert "inf" not in text


def test_the_verdict_rules_are_stated_and_applied_in_one_order():
    """-0.0070 ± 0.0026, inside ±0.01: equivalent first, and 'worse beyond noise' said too."""
    z = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    sd = 0.0026 * math.sqrt(5) / stats.t.ppf(0.975, 4)  # a 95% half width of 0.0026
    differences = -0.0070 + sd * z / z.std(ddof=1)
    interval = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    assert interval.high < 0  # beyond noise: the interval excludes 0
    assert interval.high - differences.mean() == pytest.approx(0.0026)
    n, se = len(differences), differences.std(ddof=1) / math.sqrt(len(differences))
    p_low = 1 - stats.t.cdf((differences.mean() + 0.01) / se, n - 1)
    p_high = stats.t.cdf((differences.mean() - 0.01) / se, n - 1)
    assert max(p_low, p_high) < 0.05  # and equivalent within 0.01 by TOST at alpha 0.05
    decision = decide(list(differences), margin=0.01)
    assert (decision.verdict, decision.different, decision.equivalent) == (
        "equivalent",
        True,
        True,
    )
    # The same in the table, from runs whose accuracies differ by exactly these amounts.
    runs = [record("ce", s, CE, 0.9, "digits_ce") for s in range(5)]
    runs += [record("f", s, FOCAL, 0.9 + d, "digits_focal") for s, d in enumerate(differences)]
    text = format_groups(compare_groups(runs, "loss", pair_by="seed"))
    line = next(line for line in text.splitlines() if line.startswith("FocalLoss"))
    assert line.endswith("-0.0070 ± 0.0026  equivalent (±0.01), worse beyond noise")
    rules = " ".join(text.split("\n\n")[0].split())
    first = rules.index("(1) equivalent (±margin) when two one-sided t-tests at alpha 0.05")
    second = rules.index("(2) better or worse when the diff's 95% interval excludes 0")
    third = rules.index("(3) else undecided")
    assert rules.index("the first rule that holds") < first < second < third


@pytest.mark.parametrize("form", ["path", "file"])
def test_a_folder_as_tracking_uri_is_one_line_naming_the_store(tmp_path, form):
    uri = str(tmp_path) if form == "path" else tmp_path.as_uri()
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["--tracking-uri", uri, "--out", str(tmp_path / "out")])
    assert code == 2
    assert stdout.getvalue() == ""
    [line] = stderr.getvalue().splitlines()
    assert line.startswith(f"lightning-losses compare: error: no MLflow store here: {uri!r}")
    assert f"--tracking-uri sqlite:///{tmp_path / 'mlflow.db'}" in line
    assert not (tmp_path / "out").exists()
    # A folder that holds the store: the message names it as the URI to pass.
    (tmp_path / "mlflow.db").write_bytes(b"")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert main(["--tracking-uri", uri, "--group-by", "loss"]) == 2
    assert (
        stderr.getvalue()
        .strip()
        .endswith(f"the store there is --tracking-uri sqlite:///{tmp_path / 'mlflow.db'}")
    )


def test_pairing_without_a_shared_seed_or_a_seed_gives_no_verdict_and_says_why():
    runs = [record("ce", s, CE, 0.9 + 0.01 * s, "digits_ce") for s in range(3)]
    runs += [record("f", s, FOCAL, 0.95, "digits_focal") for s in (5, 6)]
    unseeded = record("f", 7, FOCAL, 0.5, "digits_focal")
    runs.append(
        RunRecord(
            **{
                **vars(unseeded),
                "params": {k: v for k, v in unseeded.params.items() if k != "seed_everything"},
            }
        )
    )
    result = compare_groups(runs, "loss", pair_by="seed")
    rows = {row.group: row for row in result.rows}
    assert rows["FocalLoss"].decision is None
    assert rows["FocalLoss"].note == "no seed shared with the baseline"
    assert result.notes == [
        f"FocalLoss: 1 run(s) without a seed_everything param cannot be paired: digits_focal "
        f"{unseeded.run_id[:8]}",
        "FocalLoss: paired on the 0 seed(s) it shares with the baseline; dropped 5: 5, 6 of its "
        "own and 0-2 of the baseline's",
    ]


def test_the_figure_plots_one_task_and_its_title_names_it():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lightning_losses.compare.figure import draw_scatter, split_tasks

    rows = [
        {
            "run_id": "a" * 32,
            "run_name": "digits_ce",
            "task": "multiclass",
            "val/acc": 0.9,
            "val/ece": 0.05,
        },
        {
            "run_id": "b" * 32,
            "run_name": "digits_focal",
            "task": "multiclass",
            "val/acc": 0.91,
            "val/ece": 0.03,
        },
        {
            "run_id": "c" * 32,
            "run_name": "rare_digit_binary_focal",
            "task": "binary",
            "val/acc": 0.99,
            "val/ece": 0.4,
        },
    ]
    fig = Figure(figsize=(6, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    texts = draw_scatter(ax, rows)
    assert sorted(text.get_text() for text in texts) == ["digits_ce", "digits_focal"]
    assert [tuple(xy) for xy in ax.collections[0].get_offsets()] + [
        tuple(xy) for xy in ax.collections[1].get_offsets()
    ] == [(0.9, 0.05), (0.91, 0.03)]
    assert len(ax.collections) == 2
    assert ax.get_title().startswith("multiclass runs: accuracy vs calibration")
    assert split_tasks(rows)[1] == (
        "the figure plots the multiclass runs; left out 1 binary run (rare_digit_binary_focal): "
        "--where model.task=binary plots them"
    )


def test_outputs_go_beside_the_store_or_where_out_says(tmp_path, monkeypatch):
    from pathlib import Path

    from lightning_losses.compare.cli import output_folder

    monkeypatch.chdir(tmp_path)
    store = tmp_path / "runs" / "mlflow.db"
    assert output_folder(None, f"sqlite:///{store}") == tmp_path / "runs" / "comparison"
    assert output_folder(None, "http://127.0.0.1:5000") == tmp_path / "comparison"  # a server
    assert output_folder("elsewhere", f"sqlite:///{store}") == Path("elsewhere")
