"""`lightning-losses sync-tracking` does not obey what a crafted spool asks (issue #24, item 2).

Each spool here is written by hand, line by line, in the folder of a real run of a real SQLite
store; what reached the store is read back with a plain ``MlflowClient``, what was uploaded by
walking the artifact folder on disk, and whether a request was sent by a real HTTP listener
that records every request it gets.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from lightning_losses.cli.sync import sync_main
from lightning_losses.tracking import SPOOL_NAME, SpoolReplayError, read_spool, sync_tracking
from lightning_losses.tracking.replay import store_key
from lightning_losses.tracking.spool import MAX_LINE_BYTES, iter_spool

T0 = 1_700_000_000_000  # timestamps of the records, in ms

pytestmark = pytest.mark.usefixtures("isolated_tracking")


class Recorder(http.server.ThreadingHTTPServer):
    """An HTTP listener on 127.0.0.1 that answers 404 to everything and keeps each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self) -> None:
                recorder.requests.append((self.path, dict(self.headers)))
                body = b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "recorder"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A new MLflow SQLite store, made once (its tables take seconds to create)."""
    path = tmp_path_factory.mktemp("template") / "store.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def run(tmp_path, empty_store) -> tuple[str, MlflowClient, str, Path]:
    """A RUNNING run of a SQLite store and its run folder: (uri, client, run id, folder)."""
    shutil.copyfile(empty_store, tmp_path / "store.db")
    uri = f"sqlite:///{tmp_path}/store.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("safety", artifact_location=(tmp_path / "a").as_uri())
    run_id = client.create_run(experiment).info.run_id
    folder = tmp_path / "runs" / experiment / run_id
    folder.mkdir(parents=True)
    return uri, client, run_id, folder


def line(kind: str, run_id: str, uri: str, **fields: object) -> bytes:
    """One spool line as the logger writes it (without the newline)."""
    record = {"timestamp": T0, "kind": kind, **fields, "run_id": run_id, "tracking_uri": uri}
    return json.dumps(record).encode()


def metrics(run_id: str, uri: str, step: int, value: float) -> bytes:
    return line("metrics", run_id, uri, metrics={"a": value}, step=step)


def uploaded(tmp_path: Path) -> set[str]:
    """Every file under the experiment's artifact folder, relative to it."""
    root = tmp_path / "a"
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def history(client: MlflowClient, run_id: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "a"))


@pytest.mark.slow
def test_crafted_lines_are_refused_by_number_kept_and_the_others_replayed(
    run, tmp_path, recorder, capsys
):
    uri, client, run_id, folder = run
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the store")
    (folder / "link.txt").symlink_to(secret)
    (folder / "ok.txt").write_text("a diagram")
    lines = [
        metrics(run_id, uri, 0, 0.5),  # 1: replayed
        line("artifact", run_id, uri, path="/etc/hostname"),  # 2: a system file
        line("artifact", run_id, uri, path="../../../secret.txt"),  # 3: out by ..
        line("artifact", run_id, uri, path=str(folder / "link.txt")),  # 4: out by a link
        line("artifact", run_id, uri, path=str(folder / "ok.txt"), artifact_path="calibration"),
        line("artifact", run_id, uri, path=str(folder / "ok.txt"), artifact_path="../../x"),
        metrics(run_id, f"sqlite:///{tmp_path}/evil.db", 5, 9.0),  # 7: another store
        metrics(run_id, recorder.uri, 6, 9.0),  # 8: another store, a server
        line("tags", "another-run", uri, tags={"k": "v"}),  # 9: another run
        b"x" * (2 * 1024 * 1024),  # 10: 2 MiB
        b'{"kind": "tags", "run_id": "\xff\xfe", "tags": {}}',  # 11: not UTF-8
        metrics(run_id, uri, 1, 0.25),  # 12: replayed
    ]
    spool = folder / SPOOL_NAME
    spool.write_bytes(b"".join(raw + b"\n" for raw in lines))

    assert sync_main([str(tmp_path / "runs")]) != 0  # the command's exit status
    stderr = capsys.readouterr().err
    reasons = {
        2: "outside the run's folder",
        3: "outside the run's folder",
        4: "outside the run's folder",
        6: "not a plain relative folder",
        7: "names the store",
        8: "names the store",
        9: "belongs to run 'another-run'",
        10: f"longer than {MAX_LINE_BYTES} bytes ({len(lines[9])} bytes)",
        11: "not UTF-8",
    }
    errors = [text for text in stderr.splitlines() if ": line " in text]
    assert len(errors) == len(reasons)  # one stderr line each
    for number, reason in reasons.items():
        [text] = [t for t in errors if f"{spool}: line {number}: " in t]
        assert reason in text, (number, text)
    assert history(client, run_id) == [(0, 0.5), (1, 0.25)]
    assert uploaded(tmp_path) == {f"{run_id}/artifacts/calibration/ok.txt"}
    assert not (tmp_path / "evil.db").exists()
    assert recorder.requests == []
    refused = [lines[n - 1] for n in sorted(reasons)]
    assert spool.read_bytes() == b"".join(raw + b"\n" for raw in refused)  # kept, as they were
    journal = spool.with_name(SPOOL_NAME + ".synced").read_bytes()
    assert journal == b"".join(lines[n - 1] + b"\n" for n in (1, 5, 12))


@pytest.mark.slow
def test_a_spool_of_a_store_nobody_named_is_not_replayed(run, tmp_path, recorder, capsys):
    uri, client, run_id, folder = run
    evil = tmp_path / "elsewhere" / "evil.db"
    text = metrics(run_id, f"sqlite:///{evil}", 0, 0.5) + b"\n"
    spool = folder / SPOOL_NAME
    spool.write_bytes(text)
    other = tmp_path / "runs" / "0" / "other"
    other.mkdir(parents=True)
    (other / SPOOL_NAME).write_bytes(metrics(run_id, recorder.uri, 0, 0.5) + b"\n")

    assert sync_main([str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert f"its store, sqlite:///{evil}, is not an existing" in err
    assert f"its store, {recorder.uri}, is neither --tracking-uri" in err
    assert err.count("name it with --tracking-uri URI") == 2  # one line each
    assert not evil.parent.exists()
    assert recorder.requests == []
    assert spool.read_bytes() == text
    assert (other / SPOOL_NAME).is_file()
    assert history(client, run_id) == []

    # Named by the user, the store is the one the spool is replayed into.
    assert sync_main([str(spool), "--tracking-uri", uri]) == 0
    assert history(client, run_id) == [(0, 0.5)]
    assert not spool.exists()
    assert not evil.parent.exists()


@pytest.mark.slow
def test_the_default_store_is_recognised_without_its_user_info(run, recorder, monkeypatch):
    _, _, run_id, folder = run
    spool = folder / SPOOL_NAME
    spool.write_bytes(metrics(run_id, recorder.uri, 0, 0.5) + b"\n")  # stored without secrets
    host = recorder.uri.removeprefix("http://")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:S3cret@{host}/")
    with pytest.raises(SpoolReplayError, match="line 1: replay failed"):  # the recorder answers 404
        sync_tracking(spool)
    assert recorder.requests, "the default store was not contacted"
    credentials = base64.b64encode(b"alice:S3cret").decode()
    assert {headers.get("Authorization") for _, headers in recorder.requests} == {
        f"Basic {credentials}"  # from the environment, not from the spool
    }


def test_store_keys_drop_user_info_query_and_trailing_slash(tmp_path):
    assert store_key("http://u:p@Host.example:5000/?token=t") == "http://host.example:5000"
    assert store_key("https://host.example/mlflow/") == "https://host.example/mlflow"
    assert (
        store_key("postgresql+psycopg2://mlflow:pw@db:5432/mlflow?sslmode=require")
        == "postgresql+psycopg2://db:5432/mlflow"
    )
    assert store_key("sqlite:///store.db") == f"sqlite:///{tmp_path.resolve()}/store.db"
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "d")
    assert store_key(f"sqlite:///{tmp_path}/l/../d/x.db") == store_key(
        f"sqlite:///{tmp_path}/d/x.db"
    )
    assert store_key("http://a:5000") != store_key("http://a:5001")


def test_over_long_lines_are_refused_unread():
    big = b"[" * (MAX_LINE_BYTES + 1)
    data = b'{"kind": "tags", "run_id": "r", "tags": {}}\n' + big + b"\n" + big  # last: no \n
    lines = list(iter_spool(io.BytesIO(data)))
    assert [(x.number, x.record is not None, x.raw) for x in lines[1:]] == [
        (2, False, b""),
        (3, False, b""),
    ]
    assert lines[1].problem == f"longer than {MAX_LINE_BYTES} bytes ({len(big)} bytes): not read"
    assert (lines[2].start, lines[2].size) == (len(data) - len(big), len(big))
    deep = b"[" * 100_000 + b"]" * 100_000  # under the cap, but nested past Python's recursion
    [nested] = read_spool(deep + b"\n")
    assert nested.record is None
    assert "nested too deeply" in nested.problem


@pytest.mark.slow
def test_spool_permissions_kept_symlinked_spool_or_journal_refused(run, tmp_path):
    uri, client, run_id, folder = run
    spool = folder / SPOOL_NAME
    spool.write_bytes(b"damaged\n" + metrics(run_id, uri, 0, 0.5) + b"\n")
    spool.chmod(0o600)
    with pytest.raises(SpoolReplayError, match="line 1: not a JSON record"):
        sync_tracking(spool)
    assert spool.read_bytes() == b"damaged\n"
    assert (spool.stat().st_mode & 0o777) == 0o600
    assert history(client, run_id) == [(0, 0.5)]

    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"")
    link = tmp_path / "runs" / "linked" / SPOOL_NAME
    link.parent.mkdir()
    link.symlink_to(spool)
    with pytest.raises(SpoolReplayError, match="is a symbolic link"):
        sync_tracking(link)

    spool.write_bytes(metrics(run_id, uri, 1, 0.25) + b"\n")
    spool.with_name(SPOOL_NAME + ".synced").unlink()
    spool.with_name(SPOOL_NAME + ".synced").symlink_to(outside)
    with pytest.raises(OSError, match=re.escape(SPOOL_NAME + ".synced")):
        sync_tracking(spool)
    assert outside.read_bytes() == b""  # nothing written through the link
    assert spool.is_file()  # the line stays to be replayed again (written once: skipped then)
