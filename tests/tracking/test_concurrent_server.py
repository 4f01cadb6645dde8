"""Four fits started at once against one new experiment of a real `mlflow server` (issue 24, 5).

The SQLite lock (``store_lock``) covers local stores only: on a server, two fits that both find
the experiment missing both create it, and the server refuses the second with
``RESOURCE_ALREADY_EXISTS``. The logger then takes the experiment the other fit created.

The fits reach the server through a small forwarding proxy that holds the first ``FITS``
experiment look-ups until all of them have arrived, so the four fits really do ask at once
(without it, four processes importing Lightning on a loaded machine rarely overlap). The proxy
only delays requests; every answer is the real server's.
"""

from __future__ import annotations

import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.console import console_env
from helpers.paths import CONFIGS, SCRIPT
from helpers.server import Server

pytestmark = pytest.mark.slow

TINY = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
FITS = 4
LOOKUP = "/api/2.0/mlflow/experiments/get-by-name"


class HoldLookups(BaseHTTPRequestHandler):
    """Forward every request to ``server.target``; the first look-ups wait for each other."""

    server: ThreadingHTTPServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _forward(self) -> None:
        if self.path.startswith(LOOKUP) and self.server.held < FITS:  # type: ignore[attr-defined]
            self.server.held += 1  # type: ignore[attr-defined]
            try:
                self.server.barrier.wait()  # type: ignore[attr-defined]
            except threading.BrokenBarrierError:
                pass
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {
            key: value
            for key, value in self.headers.items()
            if key.lower() not in ("host", "connection", "content-length")
        }
        request = urllib.request.Request(
            self.server.target + self.path,  # type: ignore[attr-defined]
            data=body,
            headers=headers,
            method=self.command,
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                status, reply, payload = response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            status, reply, payload = error.code, error.headers, error.read()
        self.send_response(status)
        for key, value in reply.items():
            if key.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward


@pytest.fixture
def proxied_server(tmp_path) -> Iterator[str]:
    """A real `mlflow server` behind the look-up-holding proxy; yields the proxy's URI."""
    srv = Server(tmp_path / "server")
    srv.root.mkdir()
    srv.start()
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), HoldLookups)
    proxy.daemon_threads = True
    proxy.target = srv.uri  # type: ignore[attr-defined]
    proxy.held = 0  # type: ignore[attr-defined]
    proxy.barrier = threading.Barrier(FITS, timeout=240)  # type: ignore[attr-defined]
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", srv.uri
    finally:
        proxy.shutdown()
        proxy.server_close()
        srv.stop()


def test_four_fits_at_once_share_one_new_experiment(proxied_server, tmp_path):
    proxy_uri, server_uri = proxied_server
    env = console_env(
        OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", MLFLOW_HTTP_REQUEST_TIMEOUT="300"
    )
    # The shipped config without the reliability diagram drawn at the end (matplotlib's import
    # and drawing, four times on a small machine, are not what is tested here).
    text = (CONFIGS / "digits_ce.yaml").read_text()
    marker = "diagram_every_n_epochs: 0"
    assert marker in text
    config = tmp_path / "digits_ce.yaml"
    config.write_text(text.replace(marker, f"{marker}\n        final_diagram: false", 1))
    command = [
        str(SCRIPT),
        "fit",
        "--config",
        str(config),
        f"--trainer.logger.init_args.tracking_uri={proxy_uri}",
        "--trainer.logger.init_args.experiment_name=together",
        *TINY,
    ]
    processes = []
    for index in range(FITS):
        folder = tmp_path / f"fit{index}"
        folder.mkdir()
        processes.append(
            subprocess.Popen(
                command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outputs = [p.communicate(timeout=500)[0].decode(errors="replace") for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(server_uri)
    named = [e for e in client.search_experiments() if e.name == "together"]
    assert len(named) == 1
    runs = client.search_runs([named[0].experiment_id])
    assert len(runs) == FITS
    assert {run.info.status for run in runs} == {"FINISHED"}
    assert all("val/nll" in run.data.metrics for run in runs)
