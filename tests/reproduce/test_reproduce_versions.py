"""``reproduce`` ties its runs to the code that made them, and its report to those runs.

The code version (package version + a hash of the package's source and shipped configs) is a
tag of every run and part of the key under which a run is reused: runs of other code are never
reused, ``--fresh`` reuses no run made before the invocation, and the report names the code
version of its runs and lists every per-seed value. Checked on a real SQLite MLflow store.
"""

from __future__ import annotations

import hashlib
import re
import time

import pytest

import lightning_losses
from lightning_losses.reproduce import version
from lightning_losses.reproduce.claims import CLAIMS
from lightning_losses.reproduce.cli import parse_args
from lightning_losses.reproduce.runner import (
    COMPLETE_TAG,
    find_equivalent_run,
    find_run,
    run_tags,
)
from lightning_losses.reproduce.spec import Claim, Variant

TAG = "lightning_losses.code_version"


def test_code_version_is_the_package_version_and_a_hash_of_the_source() -> None:
    found = version.code_version()
    assert re.fullmatch(re.escape(lightning_losses.__version__) + r"\+src\.[0-9a-f]{12}", found)
    assert found.endswith(version.source_hash()[:12])
    assert version.CODE_VERSION_TAG == TAG


def test_the_source_hash_covers_python_files_and_configs_only(tmp_path) -> None:
    root = tmp_path / "pkg"
    files = {
        "__init__.py": b"x = 1\n",
        "sub/mod.py": b"y = 2\n",
        "default_config.yaml": b"a: 1\n",
        "configs/c.yaml": b"b: 2\n",
        "configs/experiments/e.yaml": b"c: 3\n",
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    (root / "notes.txt").write_text("not source")
    (root / "sub" / "__pycache__").mkdir()
    (root / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0compiled")
    # SHA-256 over each file's relative path and bytes, in path order, written out here.
    expected = hashlib.sha256()
    for name in sorted(files):
        expected.update(name.encode() + b"\0" + files[name] + b"\0")
    assert version.source_hash(root) == expected.hexdigest()
    (root / "notes.txt").write_text("edited")
    assert version.source_hash(root) == expected.hexdigest()
    # The verdict and comparison code reads finished runs: editing it re-decides, not retrains.
    for reader in ("compare/decide.py", "reproduce/spec.py", "reproduce/report.py"):
        (root / reader).parent.mkdir(parents=True, exist_ok=True)
        (root / reader).write_bytes(b"rule = 1\n")
    assert version.source_hash(root) == expected.hexdigest()
    (root / "configs" / "experiments" / "e.yaml").write_bytes(b"c: 4\n")
    assert version.source_hash(root) != expected.hexdigest()


def test_the_installed_package_hash_reads_every_module_and_shipped_config() -> None:
    root = version.package_root()
    names = {p.relative_to(root).as_posix() for p in version.source_files()}
    assert {
        "reproduce/runner.py",
        "reproduce/claims.py",
        "lightning/classifier.py",
        "data/mnist1d.py",
        "callbacks/loss_scheduler.py",  # through the link to the top-level callbacks/ folder
        "functional/evaluation.py",
    } <= names
    assert not {"reproduce/spec.py", "reproduce/report.py", "compare/decide.py"} & names
    assert "configs/mnist1d_ce.yaml" in names
    assert "configs/experiments/claim-7-mnist1d-benchmark.yaml" in names


# --- the cache lookup on a real store ------------------------------------------------------------


@pytest.fixture
def claim() -> Claim:
    variant = Variant("v", "configs/digits_ce.yaml", epochs=1)
    return Claim(97, "versions", "t", "a test", fixed_variants=(variant,))


def _complete_run(client, experiment: str, tags: dict[str, str]) -> str:
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id, tags={**tags, COMPLETE_TAG: "1"})
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_runs_of_another_code_version_are_never_reused(tmp_path, monkeypatch, claim) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    variant = claim.variants[0]
    monkeypatch.setattr(version, "code_version", lambda: "0.1.0+src.aaaaaaaaaaaa")
    tags_a = run_tags(claim, variant, 0, 1)
    assert tags_a[TAG] == "0.1.0+src.aaaaaaaaaaaa"
    old = _complete_run(client, claim.experiment, tags_a)
    elsewhere = _complete_run(client, "another-claim", {**tags_a, "claim": "1"})
    assert find_run(client, claim.experiment, tags_a) == old
    assert find_equivalent_run(client, tags_a) in {old, elsewhere}
    # Another code version: the same config, seed and epochs are not enough.
    monkeypatch.setattr(version, "code_version", lambda: "0.1.0+src.bbbbbbbbbbbb")
    tags_b = run_tags(claim, variant, 0, 1)
    assert {k: v for k, v in tags_b.items() if k != TAG} == {
        k: v for k, v in tags_a.items() if k != TAG
    }
    assert find_run(client, claim.experiment, tags_b) is None
    assert find_equivalent_run(client, tags_b) is None
    new = _complete_run(client, claim.experiment, tags_b)
    assert find_run(client, claim.experiment, tags_b) == new
    assert find_equivalent_run(client, tags_b) == new
    # --fresh: only a run started at or after the invocation counts.
    started = client.get_run(new).info.start_time
    assert find_run(client, claim.experiment, tags_b, since_ms=started) == new
    assert find_run(client, claim.experiment, tags_b, since_ms=started + 1) is None
    assert find_equivalent_run(client, tags_b, since_ms=started + 1) is None


def test_fresh_is_an_option_of_the_command_line() -> None:
    assert parse_args(["--claims", "1", "--fresh"]).fresh
    assert not parse_args(["--claims", "1"]).fresh


# --- claim 1 end to end: the report names the code version, --fresh recomputes ----------------


def _appendix_rows(text: str, number: int) -> dict[tuple[str, str], list[str]]:
    part = text.split(f"### Claim {number}: per-seed values")[1].split("###")[0]
    rows = {}
    for line in part.splitlines():
        match = re.match(r"^\| (\S+) \| `([^`]+)` \| (.*) \|$", line)
        if match:
            rows[(match[1], match[2])] = [c.strip() for c in match[3].split("|")]
    return rows


def test_versions_fresh_and_the_appendix_end_to_end(tmp_path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    from lightning_losses.reproduce import reproduce_all, threshold

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    # Claim 1's closed-form numbers and figure are tested in test_reproduce.py; here a cheap
    # stand-in keeps four invocations fast (what matters is which run each one reads).
    computed = []

    def analysis() -> dict[str, float]:
        computed.append(1)
        return {"sigmoid_ce/grid_argmin_b": 0.7 + len(computed) / 1000, "hinge/gd_inside": 0.0}

    monkeypatch.setattr(threshold, "analysis", analysis)
    monkeypatch.setattr(threshold, "figure", lambda path: open(path, "wb").close())

    def invocation(code: str, out: str, fresh: bool = False):
        monkeypatch.setattr(version, "code_version", lambda: code)
        path, (result,) = reproduce_all([1], 1, tmp_path / out, uri, 1.0, fresh=fresh)
        return path.read_text(), result

    first_text, first = invocation("0.1.0+src.aaaaaaaaaaaa", "a")
    (first_id,) = first.runs.values()
    assert client.get_run(first_id).data.tags[TAG] == "0.1.0+src.aaaaaaaaaaaa"
    assert "Code version `0.1.0+src.aaaaaaaaaaaa`" in first_text
    assert "code version of the runs: `0.1.0+src.aaaaaaaaaaaa`" in first_text
    assert "say nothing about noise" not in first_text  # claim 1 is one analysis, not seeds
    # Another code version computes its own run; the report names that version only.
    second_text, second = invocation("0.1.0+src.bbbbbbbbbbbb", "b")
    (second_id,) = second.runs.values()
    assert second_id != first_id
    assert second.reused == 0
    assert client.get_run(second_id).data.tags[TAG] == "0.1.0+src.bbbbbbbbbbbb"
    assert "code version of the runs: `0.1.0+src.bbbbbbbbbbbb`" in second_text
    assert "aaaaaaaaaaaa" not in second_text
    # The same version reuses; --fresh does not.
    _, again = invocation("0.1.0+src.bbbbbbbbbbbb", "c")
    assert list(again.runs.values()) == [second_id]
    assert again.reused == 1
    before = int(time.time() * 1000)
    fresh_text, fresh = invocation("0.1.0+src.bbbbbbbbbbbb", "d", fresh=True)
    (fresh_id,) = fresh.runs.values()
    assert fresh_id not in {first_id, second_id}
    assert fresh.reused == 0
    assert client.get_run(fresh_id).info.start_time >= before
    assert "`--fresh`" in fresh_text
    assert len(computed) == 3  # versions a and b, then b again under --fresh
    # The appendix lists every value of the run, exactly as the store has it.
    stored = client.get_run(fresh_id).data.metrics
    rows = _appendix_rows(fresh_text, 1)
    assert {metric for _, metric in rows} == set(stored)
    for (variant, metric), cells in rows.items():
        assert variant == "analysis"
        assert float(cells[0]) == stored[metric]
    assert CLAIMS[1].experiment in fresh_text
