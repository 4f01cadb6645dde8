"""Secrets in tracking URIs (#24, item 1): never stored, logged or printed; given again on resume.

A real ``mlflow server`` (SQLite backend, local artifacts) runs behind a small reverse proxy
that asks for HTTP basic authentication, as nginx does in front of a shared server; the fits
give ``http://alice:S3cretPw@127.0.0.1:PORT`` once as the option, once in
``MLFLOW_TRACKING_URI``. Every file under the test's folders (checkpoints as bytes, the config,
the artifacts, the spool, the server's SQLite file) and all output are then searched for the
password.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.paths import CONFIGS
from helpers.server import free_port

from lightning_losses.cli.fit import main, recorded_store
from lightning_losses.tracking import (
    check_reachable,
    checkpoint_tracking,
    metric_history,
    read_spool,
    redact_text,
    redact_uri,
    same_store,
    view_command,
    without_redacted,
)

PASSWORD = "S3cretPw"
CONFIG = CONFIGS / "digits_focal.yaml"
TINY = [
    f"--config={CONFIG}",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
OPTION = "--trainer.logger.init_args.tracking_uri"

pytestmark = pytest.mark.usefixtures("isolated_tracking")


# --- a basic-auth reverse proxy in front of the real server -----------------------------------


class ProxyHandler(BaseHTTPRequestHandler):
    """One request to the ``AuthProxy`` set as ``proxy`` (by ``AuthProxy._handler``)."""

    proxy: AuthProxy

    def log_message(self, *args: object) -> None:
        pass

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                if key.lower() not in ("server", "date"):
                    self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _forward(self) -> None:
        body = self._body()
        given = self.headers.get("Authorization")
        bearer = self.proxy.token and given == f"Bearer {self.proxy.token}"
        if self.proxy.require_auth and given != self.proxy.expected and not bearer:
            self._reply(401, [("WWW-Authenticate", 'Basic realm="mlflow"')], b"")
            return
        if self.proxy.fail_metrics and "log-batch" in self.path and body:
            if json.loads(body).get("metrics"):
                self._reply(503, [], b"down")
                return
        skip = {"authorization", "host", "content-length", "connection"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        headers.pop("Transfer-Encoding", None)
        request = urllib.request.Request(
            self.proxy.target + self.path, data=body, method=self.command, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, answer, data = response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            status, answer, data = error.code, error.headers, error.read()
        self._reply(status, list(answer.items()), data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward


class AuthProxy:
    """Forwards every request to ``target`` if it carries ``user:password`` as basic auth.

    ``require_auth = False`` lets every request through (a server without authentication);
    ``fail_metrics = True`` answers 503 to a ``log-batch`` that carries metrics (a server
    failing mid-fit, so that the fit spools them).
    """

    def __init__(self, target: str, user: str, password: str) -> None:
        self.target = target
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.require_auth = True
        self.token: str | None = None  # also accept "Bearer <token>"
        self.fail_metrics = False
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def uri(self, userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (ProxyHandler,), {"proxy": self})


@pytest.fixture
def proxy(mlflow_server):
    front = AuthProxy(mlflow_server.uri, "alice", PASSWORD)
    yield front
    front.close()


def files_holding(secret: str, *roots: Path) -> list[Path]:
    """Every file under ``roots`` whose bytes contain ``secret`` (checkpoints, DBs, ...)."""
    needle = secret.encode()
    found = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and needle in path.read_bytes():
                found.append(path)
    return found


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


# --- the redaction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "postgresql+psycopg2://u:p@h/db",
            "postgresql+psycopg2://u:***@h/db",
        ),
        ("http://alice:S3cretPw@127.0.0.1:5000", "http://alice:***@127.0.0.1:5000"),
        ("https://alice:p%40ss@host:8443/mlflow/", "https://alice:***@host:8443/mlflow/"),
        ("http://h:5000/x?token=abc&x=1", "http://h:5000/x?token=***&x=1"),
        (
            "https://h/a?X-Amz-Signature=ab&Access_Token=cd&API_KEY=ef&sig=gh&x=1",
            "https://h/a?X-Amz-Signature=***&Access_Token=***&API_KEY=***&sig=***&x=1",
        ),
        (
            "https://h/?key=a&X-Goog-Credential=b&client_secret=c&signature=d&v=2",
            "https://h/?key=***&X-Goog-Credential=***&client_secret=***&signature=***&v=2",
        ),
        (
            "mysql://m:pw@db:3306/mlflow?password=pw2&charset=utf8",
            "mysql://m:***@db:3306/mlflow?password=***&charset=utf8",
        ),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("https://host/mlflow?sslmode=require", "https://host/mlflow?sslmode=require"),
        ("sqlite:////tmp/runs/mlflow.db", "sqlite:////tmp/runs/mlflow.db"),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
        ("file:///tmp/mlruns", "file:///tmp/mlruns"),
        ("/tmp/mlruns", "/tmp/mlruns"),
        ("databricks", "databricks"),
    ],
)
def test_redact_uri_against_hand_written_forms(uri, expected):
    assert redact_uri(uri) == expected
    assert redact_uri(expected) == expected  # a redacted URI stays as it is


def test_redacted_forms_compare_and_strip():
    stored = "http://alice:***@127.0.0.1:5000/?token=***&x=1"
    assert without_redacted(stored) == "http://127.0.0.1:5000/?x=1"
    assert without_redacted("mysql://m:***@db/mlflow") == "mysql://m@db/mlflow"
    assert same_store(stored, "http://alice:S3cretPw@127.0.0.1:5000/?token=t&x=1")
    assert same_store("http://127.0.0.1:5000", "http://bob:pw@127.0.0.1:5000")
    assert not same_store("http://127.0.0.1:5000", "http://127.0.0.1:5001")
    assert view_command("http://alice:S3cretPw@127.0.0.1:5000") == "open http://127.0.0.1:5000"
    message = f"API request to http://alice:{PASSWORD}@h:1/api failed; {PASSWORD} again"
    assert redact_text(message, f"http://alice:{PASSWORD}@h:1") == (
        "API request to http://alice:***@h:1/api failed; *** again"
    )


# --- the reachability check -------------------------------------------------------------------


@pytest.mark.slow
def test_reachability_check_with_user_info_reaches_the_server(mlflow_server, proxy):
    check_reachable(f"http://alice:{PASSWORD}@127.0.0.1:{mlflow_server.port}", timeout=5)
    check_reachable(proxy.uri(f"alice:{PASSWORD}@"), timeout=5)  # the proxy checks the header
    with pytest.raises(ConnectionError, match="refused the credentials") as refused:
        check_reachable(proxy.uri("alice:wrong-pw@"), timeout=5)
    assert "wrong-pw" not in str(refused.value)
    port = free_port()  # nothing listens there
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}") as unreachable:
        check_reachable(f"http://alice:{PASSWORD}@127.0.0.1:{port}", timeout=5)
    assert PASSWORD not in str(unreachable.value)
    assert f"alice:***@127.0.0.1:{port}" in str(unreachable.value)


@pytest.mark.slow
def test_mlflow_credential_variables_serve_the_check_and_the_resume(proxy, monkeypatch):
    stored = proxy.uri("alice:***@")  # as a checkpoint records it
    with pytest.raises(ConnectionError, match="refused the credentials"):
        check_reachable(proxy.uri(), timeout=5)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    check_reachable(proxy.uri(), timeout=5)
    assert recorded_store(stored, "last.ckpt", timeout=5) == proxy.uri()
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    proxy.token = "tok-4f1b"
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", proxy.token)
    check_reachable(proxy.uri(), timeout=5)
    assert recorded_store(f"{proxy.uri()}?token=***", "last.ckpt", timeout=5) == proxy.uri()


@pytest.mark.parametrize("wrong", ["unreachable", "refused"])
@pytest.mark.slow
def test_a_server_that_stops_the_fit_is_one_line_without_the_password(proxy, wrong, capfd):
    port = free_port() if wrong == "unreachable" else proxy.port
    secret = PASSWORD if wrong == "unreachable" else "Wr0ngPw"
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *TINY, f"{OPTION}=http://alice:{secret}@127.0.0.1:{port}"])
    assert stopped.value.code == 2
    [line] = capfd.readouterr().err.strip().splitlines()
    source = OPTION.removeprefix("--")
    assert line.startswith(f"lightning-losses fit: error: {source}: the MLflow tracking server")
    assert f"http://alice:***@127.0.0.1:{port}" in line
    assert secret not in line


# --- fits: nothing written holds the password; a resume takes it again -------------------------


@pytest.mark.slow
def test_password_in_the_option_is_written_nowhere_and_resume_continues(
    mlflow_server, proxy, tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false")  # MLflow's own print
    uri = proxy.uri(f"alice:{PASSWORD}@")
    redacted = proxy.uri("alice:***@")
    proxy.fail_metrics = True  # the fit's metrics go to the spool
    with pytest.warns(UserWarning, match="tracking-spool") as warned:
        first = main(["fit", *TINY, f"{OPTION}={uri}"])
    proxy.fail_metrics = False
    assert not [w for w in warned if PASSWORD in str(w.message)]
    logger = first.trainer.logger
    run_id = logger.run_id
    spool = read_spool(logger.spool_path.read_bytes())
    assert spool
    assert {line.record["tracking_uri"] for line in spool} == {redacted}
    last = Path(first.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    assert checkpoint_tracking(last)["tracking_uri"] == redacted
    run = client(uri).get_run(run_id)
    assert run.data.params["trainer.logger.init_args.tracking_uri"] == redacted
    config = (logger.local_run_dir / "config.yaml").read_text()
    assert f"tracking_uri: {redacted}" in config

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the credentials again, from the variable
    second = main(["fit", *TINY, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert second.trainer.logger.run_id == run_id
    run = client(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert "resume.1" in run.data.tags, (run.data.tags, second.trainer.logger.spooled)
    [acc] = [m.step for m in metric_history(client(uri), run_id, "val/acc")]
    assert acc == 2 * second.trainer.num_training_batches - 1  # epoch 2, logged by the resume

    out = capfd.readouterr()
    assert PASSWORD not in out.out + out.err
    assert f"in {redacted}" in out.out
    assert f"to see it: open {proxy.uri()}" in out.out
    assert files_holding(PASSWORD, tmp_path, mlflow_server.root) == []


@pytest.mark.slow
def test_password_in_the_environment_is_written_nowhere_and_a_resume_asks_for_it(
    mlflow_server, proxy, tmp_path, monkeypatch, capfd
):
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
    uri = proxy.uri(f"alice:{PASSWORD}@")
    redacted = proxy.uri("alice:***@")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    first = main(["fit", *TINY])
    run_id = first.trainer.logger.run_id
    last = Path(first.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    assert checkpoint_tracking(last)["tracking_uri"] == redacted
    assert client(uri).get_run(run_id).info.status == "FINISHED"

    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # no credentials: the proxy refuses
    capfd.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *TINY, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert stopped.value.code == 2
    [line] = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"lightning-losses fit: error: {last} records its MLflow store as")
    assert redacted in line
    assert "MLFLOW_TRACKING_URI" in line
    assert OPTION in line
    assert client(uri).get_run(run_id).info.status == "FINISHED"  # the run is left as it was

    proxy.require_auth = False  # a server that needs none: the redacted URI works as it is
    second = main(["fit", *TINY, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert second.trainer.logger.run_id == run_id
    assert "resume.1" in client(uri).get_run(run_id).data.tags

    out = capfd.readouterr()
    assert PASSWORD not in out.out + out.err
    assert files_holding(PASSWORD, tmp_path, mlflow_server.root) == []


@pytest.mark.slow
def test_a_redacted_database_uri_that_does_not_answer_stops_with_one_line(capfd):
    stored = f"postgresql+psycopg2://mlflow:***@127.0.0.1:{free_port()}/mlflow?password=***"
    with pytest.raises(SystemExit) as stopped:
        recorded_store(stored, "runs/last.ckpt", timeout=2, command="fit")
    assert stopped.value.code == 2
    [line] = capfd.readouterr().err.strip().splitlines()
    assert line.startswith("lightning-losses fit: error: runs/last.ckpt records")
    assert stored in line
    assert "MLFLOW_TRACKING_URI" in line
    assert OPTION in line
