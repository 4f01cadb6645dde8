"""``lightning-losses compare --group-by``: configurations over seeds, on a store of seeded runs.

The store is a real SQLite MLflow store in a temporary folder, its runs made with MlflowClient
(real fits of 22 runs would take minutes), each with the params and tags a real
``lightning-losses fit --config configs/digits_*.yaml --seed_everything=S`` logs (the names
copied from such a run) and a metric history of two steps whose last value is the final one.
Four configurations, grouped by ``model.criterion.class_path``, seeds 0-4 each, values drawn
with ``numpy.random.default_rng(20240527)``:

- CrossEntropyLoss: per seed, accuracy about 0.90 with a seed noise of 0.01 (and NLL, ECE,
  Brier, test accuracy with their own noise). The default baseline although not the first group.
- FocalLoss: truly better: CE's value of the same seed + 0.05 accuracy (noise 0.005), - 0.02
  ECE, - 0.1 NLL, - 0.03 Brier, + 0.05 test accuracy.
- AdaFocalLoss: the null: CE's value of the same seed plus a noise of 1e-4, far inside every
  margin, so "equivalent" is the verdict by construction (not a 5% false positive away).
- SoftTruncatedLoss: noisy: CE + N(0.005, 0.02) in accuracy, which 5 seeds cannot decide.

Plus an older run of CE seed 0 with other values (a seed run twice: the latest counts) and a
failed run (not listed). Every expected number is computed here from the drawn values with
numpy and SciPy (Student-t intervals, ``ttest_rel`` / Welch ``ttest_ind`` intervals, TOST by
hand), never from the package.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess

import numpy as np
import pytest
from helpers.paths import SCRIPT
from scipy import stats

from lightning_losses.compare.cli import main

EXPERIMENT = "groups-test"
START_MS = 1_700_000_000_000
SEEDS = range(5)
METRICS = ("val/acc", "val/nll", "val/ece", "val/brier", "test/acc")
HIGHER = {"val/acc", "test/acc"}
MARGINS = {"val/acc": 0.01, "val/nll": 0.02, "val/ece": 0.005, "val/brier": 0.005, "test/acc": 0.01}
CE, FOCAL, NULL, NOISY = "CrossEntropyLoss", "FocalLoss", "AdaFocalLoss", "SoftTruncatedLoss"
CONFIGS = {CE: "digits_ce", FOCAL: "digits_focal", NULL: "digits_adafocal", NOISY: "digits_st"}
GROUP_BY = "model.criterion.class_path"
WIDTH = 100

#: Params of a real fit (`lightning-losses fit --config digits_focal --seed_everything=3`),
#: those that do not depend on the loss; the criterion's are added per group.
FIT_PARAMS = {
    "data.class_path": "lightning_losses.data.digits.DigitsDataModule",
    "data.init_args.batch_size": "64",
    "data.init_args.num_workers": "0",
    "data.init_args.seed": "0",
    "data.init_args.test_fraction": "0.2",
    "data.init_args.val_fraction": "0.2",
    "model.dropout": "0.0",
    "model.head": "linear",
    "model.hidden.0": "128",
    "model.hidden.1": "64",
    "model.input_dim": "64",
    "model.num_classes": "10",
    "model.optimizer.class_path": "torch.optim.Adam",
    "model.optimizer.init_args.lr": "0.003",
    "model.task": "multiclass",
    "model.temperature": "1.0",
    "trainer.accelerator": "cpu",
    "trainer.callbacks.0.class_path": "lightning_losses.callbacks.CalibrationMonitor",
    "trainer.callbacks.0.init_args.n_bins": "15",
    "trainer.callbacks.1.class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
    "trainer.callbacks.1.init_args.monitor": "val/nll",
    "trainer.logger.class_path": "lightning_losses.tracking.TrackingLogger",
    "trainer.logger.init_args.experiment_name": "lightning-losses",
    "trainer.max_epochs": "20",
}


def _criterion_params(loss: str) -> dict[str, str]:
    params = {
        "model.criterion.class_path": f"lightning_losses.{loss}",
        "model.criterion.init_args.ignore_index": "-100",
        "model.criterion.init_args.reduction": "mean",
    }
    if loss == FOCAL:
        params["model.criterion.init_args.gamma"] = "2.0"
    return params


def draw_values() -> dict[str, dict[str, dict[int, float]]]:
    """Final values by group, metric and seed (see the module's docstring)."""
    rng = np.random.default_rng(20240527)
    n = len(SEEDS)
    ce = {
        "val/acc": 0.90 + rng.normal(0, 0.01, n),
        "val/nll": 0.35 + rng.normal(0, 0.02, n),
        "val/ece": 0.04 + rng.normal(0, 0.004, n),
        "val/brier": 0.15 + rng.normal(0, 0.005, n),
    }
    ce["test/acc"] = ce["val/acc"] - 0.01 + rng.normal(0, 0.003, n)
    shift = {"val/acc": 0.05, "val/nll": -0.1, "val/ece": -0.02, "val/brier": -0.03}
    shift["test/acc"] = 0.05
    focal_noise = {"val/acc": 0.005, "val/nll": 0.01, "val/ece": 0.002, "val/brier": 0.003}
    focal_noise["test/acc"] = 0.005
    groups = {
        CE: ce,
        FOCAL: {m: ce[m] + shift[m] + rng.normal(0, focal_noise[m], n) for m in METRICS},
        NULL: {m: ce[m] + rng.normal(0, 1e-4, n) for m in METRICS},
        NOISY: {m: ce[m] + rng.normal(0.005, 0.02, n) for m in METRICS},
    }
    return {
        group: {m: {s: float(v) for s, v in zip(SEEDS, values[m], strict=True)} for m in METRICS}
        for group, values in groups.items()
    }


VALUES = draw_values()


def _log(client, run_id: str, params: dict, final: dict, start: int) -> None:
    """Params, and per metric two steps: a worse first value, then the final one."""
    from mlflow.entities import Metric, Param

    metrics = []
    for key, value in final.items():
        metrics.append(Metric(key, value * 0.5, start + 1000, 0))
        metrics.append(Metric(key, value, start + 2000, 1))
    metrics.append(Metric("epoch", 19.0, start + 2000, 1))
    client.log_batch(run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()])


def _run(client, experiment_id, loss: str, seed: int, final: dict, start: int) -> str:
    config = CONFIGS[loss]
    run_id = client.create_run(
        experiment_id,
        run_name=config,
        start_time=start,
        tags={"loss": loss, "dataset": "DigitsDataModule", "config": config},
    ).info.run_id
    params = {
        **FIT_PARAMS,
        **_criterion_params(loss),
        "seed_everything": str(seed),
        "trainer.logger.init_args.run_name": config,
    }
    _log(client, run_id, params, final, start)
    client.set_terminated(run_id, end_time=start + 3000)
    return run_id


@pytest.fixture(autouse=True)
def _no_http(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """The store: 4 groups x 5 seeds, an older duplicate of CE seed 0, a failed run."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("groups")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(
        EXPERIMENT, artifact_location=(root / "artifacts").as_uri()
    )
    # Seed 0 of CE ran twice: this older run, far off, must not count.
    stale = {metric: 0.5 for metric in METRICS}
    stale_id = _run(client, experiment_id, CE, 0, stale, START_MS)
    ids: dict[tuple[str, int], str] = {}
    start = START_MS + 60_000
    for group, values in VALUES.items():
        for seed in SEEDS:
            final = {metric: values[metric][seed] for metric in METRICS}
            ids[group, seed] = _run(client, experiment_id, group, seed, final, start)
            start += 10_000
    failed = client.create_run(experiment_id, run_name="failed", tags={"loss": "X"})
    client.set_terminated(failed.info.run_id, status="FAILED")
    return {"uri": uri, "root": root, "ids": ids, "stale": stale_id}


def compare(store, tmp_path, capsys, *options: str) -> tuple[int, str, str]:
    """``lightning-losses compare`` in this process: exit code, stdout, stderr."""
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(tmp_path)]
    code = main([*argv, *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_lines(out: str, groups=tuple(VALUES)) -> dict[tuple[str, str], str]:
    """The table's lines by (metric, group): the metric is the heading above them."""
    lines, metric = {}, None
    for line in out.splitlines():
        heading = re.match(r"^((?:val|test)/\w+) \(", line)
        if heading:
            metric = heading.group(1)
        elif metric and line.split(maxsplit=1)[:1] and line.split()[0] in groups:
            lines[metric, line.split()[0]] = line
    return lines


def t_interval(values, level):
    """Mean and its Student-t interval, in plain float64."""
    values = np.asarray(values, dtype=np.float64)
    mean, n = values.mean(), len(values)
    half = stats.t.ppf((1 + level) / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def tost(d: np.ndarray, margin: float, alpha: float) -> bool:
    """Schuirmann's two one-sided tests of paired differences, written plainly."""
    n, mean, se = len(d), d.mean(), d.std(ddof=1) / math.sqrt(len(d))
    p_low = 1 - stats.t.cdf((mean + margin) / se, n - 1)
    p_high = stats.t.cdf((mean - margin) / se, n - 1)
    return max(p_low, p_high) < alpha


def paired(group: str, metric: str, baseline: str = CE) -> np.ndarray:
    return np.array([VALUES[group][metric][s] - VALUES[baseline][metric][s] for s in SEEDS])


def seeds_needed_by_hand(d: np.ndarray, margin: float, level: float = 0.95) -> int:
    """The first seed count at which d's mean and sd would give a verdict (paired t / TOST)."""
    mean, sd = d.mean(), d.std(ddof=1)
    for n in range(len(d) + 1, 1001):
        se = sd / math.sqrt(n)
        if abs(mean) > stats.t.ppf((1 + level) / 2, n - 1) * se:
            return n
        if abs(mean) + stats.t.ppf(level, n - 1) * se < margin:
            return n
    raise AssertionError("undecided up to 1000 seeds")


def test_paired_verdicts_real_difference_null_and_noise(store, tmp_path, capsys):
    code, out, err = compare(store, tmp_path, capsys, "--group-by", GROUP_BY, "--pair-by", "seed")
    assert code == 0, err
    assert all(len(line) <= WIDTH for line in out.splitlines())
    flat = out.replace("\n  ", " ")  # the lines above the table, unwrapped
    assert "; baseline CrossEntropyLoss." in flat  # the CE group, although AdaFocalLoss is first
    assert "95% paired t CI" in out.splitlines()[out.splitlines().index("") + 1]
    lines = table_lines(out)
    assert set(lines) == {(m, g) for m in METRICS for g in VALUES}
    for metric in METRICS:
        assert re.fullmatch(r"CrossEntropyLoss +\d\.\d{4} ± \d\.\d{4} +baseline", lines[metric, CE])
        # A real difference: better on every metric (higher accuracy; lower NLL, ECE, Brier).
        d = paired(FOCAL, metric)
        assert (
            stats.ttest_rel(
                [VALUES[FOCAL][metric][s] for s in SEEDS], [VALUES[CE][metric][s] for s in SEEDS]
            ).pvalue
            < 0.05
        )
        assert lines[metric, FOCAL].endswith("  better"), lines[metric, FOCAL]
        # The null: equivalent within the stated margin, never better or worse.
        assert tost(paired(NULL, metric), MARGINS[metric], 0.05)
        assert lines[metric, NULL].endswith(f"  equivalent (±{MARGINS[metric]:g})")
        assert f"{metric} (" + ("higher" if metric in HIGHER else "lower") in out
        assert f"equivalence margin ±{MARGINS[metric]:g})" in out
    # Noise that 5 seeds cannot decide: undecided, with the seeds that would.
    d = paired(NOISY, "val/acc")
    assert stats.ttest_1samp(d, 0.0).pvalue >= 0.05
    assert not tost(d, 0.01, 0.05)
    k = seeds_needed_by_hand(d, 0.01)
    assert lines["val/acc", NOISY].endswith(f"  undecided (needs ~{k} seeds)")
    # The older run of CE seed 0 does not count, and the output names the run that does.
    latest, older = store["ids"][CE, 0][:8], store["stale"][:8]
    note = f"seed 0 ran 2 times; the latest run counts, digits_ce {latest}, not digits_ce {older}"
    assert note in out.replace("\n  ", " ")
    assert re.search(r"20 runs in 4 groups by model\.criterion\.class_path", out)


@pytest.mark.parametrize("level", [0.95, 0.9])
def test_printed_intervals_are_student_t_of_the_drawn_values(store, tmp_path, capsys, level):
    options = ["--group-by", GROUP_BY, "--pair-by", "seed"]
    if level != 0.95:
        options += ["--level", str(level)]
    code, out, err = compare(store, tmp_path, capsys, *options)
    assert code == 0, err
    header = out.splitlines()[out.splitlines().index("") + 1]
    assert f"mean ± {level:.0%} t CI" in header
    assert f"diff ± {level:.0%} paired t CI" in header
    lines = table_lines(out)
    rows = list(csv.DictReader((tmp_path / "groups.csv").open(encoding="utf-8")))
    by_key = {(row["metric"], row["group"]): row for row in rows}
    for (metric, group), line in lines.items():
        values = [VALUES[group][metric][s] for s in SEEDS]
        mean, low, high = t_interval(values, level)
        assert line.split()[1:4] == [f"{mean:.4f}", "±", f"{high - mean:.4f}"]
        row = by_key[metric, group]
        assert float(row["mean"]) == pytest.approx(mean, abs=1e-12)
        assert (float(row["low"]), float(row["high"])) == pytest.approx((low, high), abs=1e-12)
        assert json.loads(row["values"]) == pytest.approx(
            {str(s): v for s, v in zip(SEEDS, values, strict=True)}
        )
        if group == CE:
            continue
        reference = stats.ttest_rel(values, [VALUES[CE][metric][s] for s in SEEDS])
        ci = reference.confidence_interval(confidence_level=level)
        difference = paired(group, metric).mean()
        assert line.split()[4:7] == [f"{difference:+.4f}", "±", f"{ci.high - difference:.4f}"]
        assert ci.low == pytest.approx(difference - (ci.high - difference), abs=1e-12)
        assert float(row["difference"]) == pytest.approx(difference, abs=1e-12)
        assert (float(row["difference_low"]), float(row["difference_high"])) == pytest.approx(
            (ci.low, ci.high), abs=1e-12
        )


def test_unpaired_is_welch_and_baseline_option(store, tmp_path, capsys):
    code, out, err = compare(store, tmp_path, capsys, "--group-by", "loss", "--baseline", FOCAL)
    assert code == 0, err
    assert "95% Welch t CI" in out
    assert "; baseline FocalLoss." in out.replace("\n  ", " ")
    lines = table_lines(out)
    assert lines["val/acc", CE].endswith("  worse")  # 0.05 below FocalLoss
    assert lines["val/ece", CE].endswith("  worse")  # 0.02 above: worse, lower is better
    rows = list(csv.DictReader((tmp_path / "groups.csv").open(encoding="utf-8")))
    for row in rows:
        if row["group"] == FOCAL:
            assert row["verdict"] == "baseline"
            continue
        a = [VALUES[row["group"]][row["metric"]][s] for s in SEEDS]
        b = [VALUES[FOCAL][row["metric"]][s] for s in SEEDS]
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        assert (float(row["difference_low"]), float(row["difference_high"])) == pytest.approx(
            (ci.low, ci.high), abs=1e-10
        )
        assert row["method"] == "Welch t"


def test_margins_are_options(store, tmp_path, capsys):
    """A margin of 0 never declares equivalence; one per metric overrides its quantity's."""
    options = ["--group-by", "config", "--pair-by", "seed", "--margin", "acc=0"]
    code, out, err = compare(store, tmp_path, capsys, *options, "--margin", "test/acc=0.02")
    assert code == 0, err
    lines = table_lines(out, groups=tuple(CONFIGS.values()))
    # The drawn null shows no difference at 5%, and a margin of 0 cannot declare equivalence.
    assert stats.ttest_1samp(paired(NULL, "val/acc"), 0.0).pvalue >= 0.05
    assert "equivalent" not in lines["val/acc", "digits_adafocal"]
    assert "undecided (needs" in lines["val/acc", "digits_adafocal"]
    assert lines["test/acc", "digits_adafocal"].endswith("equivalent (±0.02)")
    assert "val/acc (higher is better; equivalence margin ±0)" in out


def test_baseline_by_value_left_out_runs_and_group_order(store, tmp_path, capsys):
    from lightning_losses.compare.decide import decide
    from lightning_losses.compare.groups import RunRecord, compare_groups, verdict_text

    # The full class path names a class_path group too.
    options = ["--group-by", GROUP_BY, "--baseline", "lightning_losses.FocalLoss"]
    code, out, err = compare(store, tmp_path, capsys, *options)
    assert code == 0, err
    assert "; baseline FocalLoss." in out.replace("\n  ", " ")
    # Only the focal runs have a gamma: the others are left out, and a note says so.
    code, out, err = compare(store, tmp_path, capsys, "--group-by", "gamma")
    assert code == 0, err
    flat = out.replace("\n  ", " ")
    assert "5 runs in 1 group by model.criterion.init_args.gamma" in flat
    assert "left out 16 run(s) without model.criterion.init_args.gamma" in flat
    # Numbers in ascending order of value (not as text), and "2" names the group "2.0".
    records = [
        RunRecord(
            f"{gamma}-{seed}",
            "run",
            seed,
            {"g": gamma, "seed_everything": str(seed)},
            {},
            {"val/acc": 0.9 + 0.001 * seed},
        )
        for gamma in ("2.0", "10.0", "0.5")
        for seed in range(3)
    ]
    result = compare_groups(records, "g", pair_by="seed", baseline="2")
    assert list(result.groups) == ["0.5", "2.0", "10.0"]
    assert result.baseline == "2.0"
    assert compare_groups(records, "g").baseline == "0.5"  # no cross-entropy group: the first
    one_seed = compare_groups([r for r in records if r.start_time == 0], "g", pair_by="seed")
    verdicts = {row.group: verdict_text(row.decision) for row in one_seed.rows if row.decision}
    assert verdicts == dict.fromkeys(["2.0", "10.0"], "undecided (needs at least 2 seeds)")
    # A mean difference far below its noise: more seeds than are looked at.
    hopeless = decide([0.001, -0.001, 0.0005, -0.0004], margin=0.0)
    assert verdict_text(hopeless) == "undecided (needs over 1000 seeds)"


def test_pairing_uses_the_seeds_the_groups_share(store, tmp_path, capsys):
    """FocalLoss without seed 4: paired on seeds 0-3, and a note says what was dropped."""
    ids = [run_id for (group, seed), run_id in store["ids"].items() if (group, seed) != (FOCAL, 4)]
    options = ["--group-by", GROUP_BY, "--pair-by", "seed", "--runs", *ids]
    code, out, err = compare(store, tmp_path, capsys, *options)
    assert code == 0, err
    flat = out.replace("\n  ", " ")
    note = "FocalLoss: paired on the 4 seed(s) it shares with the baseline (0-3); dropped 1: 4 of"
    assert note in flat
    assert "AdaFocalLoss: paired" not in flat  # the groups that hold every seed drop none
    rows = {
        (row["metric"], row["group"]): row
        for row in csv.DictReader((tmp_path / "groups.csv").open(encoding="utf-8"))
    }
    for metric in METRICS:
        shared = range(4)
        reference = stats.ttest_rel(
            [VALUES[FOCAL][metric][s] for s in shared], [VALUES[CE][metric][s] for s in shared]
        ).confidence_interval(0.95)
        row = rows[metric, FOCAL]
        assert (float(row["difference_low"]), float(row["difference_high"])) == pytest.approx(
            (reference.low, reference.high), abs=1e-12
        )
        assert row["n"] == "4"
    # Unpaired, the same runs compare: Welch's interval takes unequal groups.
    code, out, err = compare(store, tmp_path, capsys, *options[:2], "--runs", *ids)
    assert code == 0, err
    assert "paired on" not in out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--group-by", "model.criterion.clas_path"], "did you mean 'model.criterion.class_path'"),
        (["--group-by", "lossy"], "--group-by: no param or run field 'lossy'"),
        (["--group-by", "class_path"], "--group-by 'class_path' names several params"),
        (["--group-by", "loss", "--baseline", "Focal"], "--baseline: no group named 'Focal'"),
        (["--group-by", "loss", "--level", "1.5"], "--level must be a number in (0, 1)"),
        (["--group-by", "loss", "--level", "0"], "--level must be a number in (0, 1)"),
        (["--group-by", "loss", "--level", "high"], "--level must be a number in (0, 1)"),
        (["--group-by", "loss", "--margin", "acc"], "--margin expects METRIC=VALUE"),
        (["--group-by", "loss", "--margin", "accuracy=0.1"], "--margin expects METRIC=VALUE"),
        (["--group-by", "loss", "--margin", "acc=x"], "--margin acc= needs a number >= 0"),
        (["--group-by", "loss", "--margin", "ece=-1"], "--margin ece= needs a number >= 0"),
        (["--pair-by", "seed"], "--pair-by needs --group-by PARAM"),
        (["--group-by", "loss", "--where", "gamma"], "--where expects KEY=VALUE"),
        (["--group-by", "loss", "--where", "gama=2"], "--where: no param or tag 'gama'"),
        (["--where", "class_path=x"], "--where 'class_path' names several params"),
        (["--config", "digits_cee"], "--config digits_cee: no run was fitted from it; configs"),
        (["--baseline", "FocalLoss"], "--baseline needs --group-by PARAM"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(store, tmp_path, capsys, options, message):
    code, out, err = compare(store, tmp_path, capsys, *options)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("lightning-losses compare: error: ")
    assert message in err


def test_where_and_config_pick_the_runs(store, tmp_path, capsys):
    """--where on a param (its last parts, the same number) and --config on the config tag."""
    options = ["--group-by", "config", "--pair-by", "seed", "--baseline", "digits_focal"]
    code, out, err = compare(store, tmp_path, capsys, *options, "--where", "gamma=2")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "groups.csv").open(encoding="utf-8")))
    assert {row["group"] for row in rows} == {"digits_focal"}  # only the focal runs have gamma 2
    assert {row["seeds"] for row in rows} == {"0 1 2 3 4"}
    options = ["--group-by", GROUP_BY, "--pair-by", "seed", "--config", "digits_ce", "digits_st"]
    code, out, err = compare(store, tmp_path, capsys, *options)
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "groups.csv").open(encoding="utf-8")))
    assert {row["group"] for row in rows} == {CE, NOISY}
    d = paired(NOISY, "val/acc")
    k = seeds_needed_by_hand(d, 0.01)
    assert table_lines(out)["val/acc", NOISY].endswith(f"  undecided (needs ~{k} seeds)")
    # Tags and run fields too: the loss, the dataset tag, the status.
    where = ["--where", "loss=FocalLoss", "--where", "dataset=DigitsDataModule"]
    code, out, err = compare(store, tmp_path, capsys, *where, "--where", "status=FINISHED")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "comparison.csv").open(encoding="utf-8")))
    assert sorted(row["run_id"] for row in rows) == sorted(store["ids"][FOCAL, s] for s in SEEDS)
    # A filter that no run passes: exit 1, naming the filter.
    code, out, err = compare(store, tmp_path, capsys, "--where", "gamma=3")
    assert code == 1
    assert err.strip() == (
        f"no finished or running runs in experiment '{EXPERIMENT}' match --where gamma=3; "
        "skipped 1 run for their status (1 FAILED): --status any lists every run"
    )


def test_baseline_did_you_mean(store, tmp_path, capsys):
    code, _, err = compare(store, tmp_path, capsys, "--group-by", "loss", "--baseline", "FocalLos")
    assert code == 2
    assert "did you mean 'FocalLoss'?" in err
    assert "groups: AdaFocalLoss, CrossEntropyLoss, FocalLoss, SoftTruncatedLoss" in err


@pytest.mark.parametrize(
    ("width", "fitted", "wrapped"),
    [
        (100, "", False),
        (80, "left out the groups' means (in the CSV)", False),
        (64, "each group's name on its own line; left out the groups' means (in the CSV)", True),
    ],
)
def test_narrow_table_keeps_group_names_whole(store, width, fitted, wrapped):
    """Group names are never cut: the means are left out, then names go on lines of their own."""
    from lightning_losses.compare import groups

    records = groups.collect_records(EXPERIMENT, tracking_uri=store["uri"])
    result = groups.compare_groups(records, GROUP_BY, pair_by="seed")
    text = groups.format_groups(result, width=width)
    assert all(len(line) <= width for line in text.splitlines())
    flat = text.replace("\n  ", " ")
    assert (f"to fit {width} columns: {fitted} (--wide" in flat) == bool(fitted)
    table = text.split("\n\n")[1]
    assert "..." not in table
    lines = table.splitlines()
    for group in VALUES:  # every name whole, on its own line when wrapped
        named = [line for line in lines if line.split() and line.split()[0] == group]
        assert len(named) == len(METRICS)
        assert all((line == group) == wrapped for line in named)
    assert ("mean ± 95% t CI" in table) == (not fitted)
    wide = groups.format_groups(result)
    assert "CrossEntropyLoss" in wide
    assert "to fit" not in wide


@pytest.mark.slow
def test_console_script_end_to_end(store, tmp_path):
    """The installed ``lightning-losses compare`` on the store, as a user runs it."""
    command = [str(SCRIPT), "compare", "--experiment", EXPERIMENT, "--tracking-uri", store["uri"]]
    command += ["--group-by", GROUP_BY, "--pair-by", "seed", "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    found = table_lines(done.stdout)
    assert found["val/acc", FOCAL].endswith("  better")
    assert found["val/acc", NULL].endswith("  equivalent (±0.01)")
    assert lines[-1] == f"wrote {tmp_path / 'out' / 'groups.csv'}"
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["groups.csv"]
