"""MLflow tracking: the CLI's default logger, a spool for a server that goes away, and its replay.

- :class:`TrackingLogger` is Lightning's ``MLFlowLogger`` with the project's defaults (a local
  SQLite store, ``sqlite:///mlflow.db``, unless ``tracking_uri`` or ``MLFLOW_TRACKING_URI`` says
  otherwise), a start-up check that fails within seconds when an HTTP server cannot be reached,
  run-local folders for checkpoints and diagrams, and a spool: whatever cannot be sent while
  the server is down (metrics with their steps, params, tags, artifacts, the run's end) is
  appended to ``tracking-spool.jsonl`` beside the run's checkpoints, training goes on, and a
  warning says where the spool is.
- :func:`sync_tracking` (``lightning-losses sync-tracking PATH``) replays a spool into the
  server once it is back.
- :class:`TrackingConfigCallback` (the CLI's ``SaveConfigCallback``) logs the resolved config as
  an artifact and as flattened params, tags each run (loss, dataset, config), and writes the
  run id into every checkpoint so that ``fit --ckpt_path`` continues the same run.

Only rank 0 talks to MLflow (Lightning's ``rank_zero_only``): one run per fit under DDP.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "lightning-losses"
SPOOL_NAME = "tracking-spool.jsonl"
CHECKPOINT_KEY = "tracking"


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.

    A relative SQLite path is made absolute (MLflow caches stores by URI, so a relative one
    would follow the first working directory, not the current one).

    Example:
        >>> resolve_tracking_uri("http://127.0.0.1:5000")
        'http://127.0.0.1:5000'
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def fail_fast_http() -> None:
    """Make MLflow's HTTP client give up in seconds, not minutes (unless the user chose).

    MLflow retries a failed request with back-off for minutes by default; with a spool behind
    it there is nothing to gain from waiting. Variables already set are left alone.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def check_reachable(tracking_uri: str, timeout: float = 5.0) -> None:
    """Raise ``ConnectionError`` naming the URI if an HTTP tracking server does not answer.

    Local stores (``sqlite:``, ``file:``, paths) need no check.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return
    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status >= 500:
                raise OSError(f"HTTP {response.status}")
    except (OSError, urllib.error.URLError) as error:
        raise ConnectionError(
            f"the MLflow tracking server at {tracking_uri} cannot be reached ({error}). Start "
            "it, or choose another store with trainer.logger.init_args.tracking_uri or "
            f"MLFLOW_TRACKING_URI (the default is the local {DEFAULT_TRACKING_URI})."
        ) from None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings and lists to dotted keys with string values.

    Example:
        >>> flatten({"model": {"criterion": {"init_args": {"gamma": 2.0}}}, "xs": [1, {"a": 2}]})
        {'model.criterion.init_args.gamma': '2.0', 'xs.0': '1', 'xs.1.a': '2'}
    """
    flat: dict[str, str] = {}
    items = config.items() if isinstance(config, Mapping) else enumerate(config)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and value):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = str(value)
    return flat


class TrackingLogger(MLFlowLogger):
    """Lightning's ``MLFlowLogger`` that never loses what it could not send.

    Args:
        experiment_name: MLflow experiment (created if missing).
        run_name: name of the run.
        tracking_uri: ``sqlite:///...``, ``http://host:port``, ...; default
            ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db`` in the working directory.
        tags: extra run tags.
        save_dir: local folder for run files: ``<save_dir>/<experiment id>/<run id>/`` holds
            the checkpoints, the reliability diagrams and, if the server fails, the spool.
        log_model: log the best checkpoint as an artifact at the end of fit.
        run_id: continue this run (the CLI fills it in from a checkpoint on resume).
        connect_timeout: seconds to wait for an HTTP server at start-up.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> logger = TrackingLogger(tracking_uri=f"sqlite:///{folder}/mlflow.db", save_dir=folder)
        >>> logger.experiment.get_experiment(logger.experiment_id).name
        'lightning-losses'
    """

    def __init__(
        self,
        experiment_name: str = DEFAULT_EXPERIMENT,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str = "mlflow_runs",
        log_model: bool = True,
        run_id: str | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        uri = resolve_tracking_uri(tracking_uri)
        fail_fast_http()
        check_reachable(uri, connect_timeout)
        # With a local store, artifacts of new experiments go beside the run folders (MLflow
        # would otherwise pick ./mlruns); a server decides for itself.
        local_store = not uri.startswith(("http://", "https://"))
        artifacts = (Path(save_dir) / "artifacts").resolve().as_uri() if local_store else None
        super().__init__(
            experiment_name=experiment_name,
            run_name=run_name,
            tracking_uri=uri,
            tags=tags,
            save_dir=save_dir,
            log_model=False,
            run_id=run_id,
            artifact_location=artifacts,
        )
        self._local_dir = save_dir
        self._log_best_checkpoint = log_model
        self._spool_path: Path | None = None
        self.spooled = 0

    # --- where files go -------------------------------------------------------------------

    @property
    def save_dir(self) -> str:
        """Local root of the run folders (Lightning puts checkpoints under it)."""
        return self._local_dir

    @property
    def local_run_dir(self) -> Path:
        """``<save_dir>/<experiment id>/<run id>``: checkpoints, diagrams, spool."""
        return Path(self._local_dir) / str(self.name) / str(self.version)

    @property
    def log_dir(self) -> str:
        return str(self.local_run_dir)

    @property
    def spool_path(self) -> Path:
        return self.local_run_dir / SPOOL_NAME

    # --- the spool ------------------------------------------------------------------------

    def _spool(self, record: dict[str, Any], error: BaseException) -> None:
        path = self.spool_path
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {**record, "run_id": self._run_id, "tracking_uri": self._tracking_uri}
        with path.open("a") as spool:
            spool.write(json.dumps(record) + "\n")
        if self.spooled == 0:
            rank_zero_warn(
                f"MLflow tracking at {self._tracking_uri} failed ({type(error).__name__}: "
                f"{error}). Training goes on; what cannot be sent is kept in {path}. Replay it "
                f"with `lightning-losses sync-tracking {path}` once the server is back."
            )
        self.spooled += 1

    # --- logging, each call falling back to the spool ----------------------------------------

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        try:
            super().log_metrics(metrics, step)
        except Exception as error:
            values = {k: float(v) for k, v in metrics.items() if not isinstance(v, str)}
            record = {"kind": "metrics", "metrics": values, "step": step or 0}
            self._spool({**record, "timestamp": int(time.time() * 1000)}, error)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        try:
            super().log_hyperparams(params)
        except Exception as error:
            flat = flatten(params if isinstance(params, Mapping) else vars(params))
            self._spool({"kind": "params", "params": flat}, error)

    @rank_zero_only
    def log_params(self, params: Mapping[str, str]) -> None:
        """Log already-flat params (values cut to MLflow's 6,000 characters)."""
        from mlflow.entities import Param

        try:
            # A resumed run keeps the params it has (MLflow refuses to change a param's value).
            existing = self.experiment.get_run(self.run_id).data.params
            items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing]
            for start in range(0, len(items), 100):
                self.experiment.log_batch(self.run_id, params=items[start : start + 100])
        except Exception as error:
            self._spool({"kind": "params", "params": dict(params)}, error)

    @rank_zero_only
    def set_tags(self, tags: Mapping[str, str]) -> None:
        try:
            for key, value in tags.items():
                self.experiment.set_tag(self.run_id, key, str(value))
        except Exception as error:
            self._spool({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}}, error)

    @rank_zero_only
    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Log a local file as an artifact of the run (spooled by path if the server fails)."""
        try:
            self.experiment.log_artifact(self.run_id, str(path), artifact_path=artifact_path)
        except Exception as error:
            record = {"kind": "artifact", "path": str(Path(path).resolve())}
            self._spool({**record, "artifact_path": artifact_path}, error)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._checkpoint_callback = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if not self._initialized:
            return
        callback = self._checkpoint_callback
        best = getattr(callback, "best_model_path", "") if callback is not None else ""
        if self._log_best_checkpoint and best and Path(best).exists():
            self.log_file(best, artifact_path="checkpoints")
        mlflow_status = "FINISHED" if status in ("success", "finished") else "FAILED"
        try:
            self.experiment.set_terminated(self.run_id, mlflow_status)
        except Exception as error:
            self._spool({"kind": "terminate", "status": mlflow_status}, error)
        if self.spooled:
            rank_zero_warn(
                f"{self.spooled} tracking calls could not reach {self._tracking_uri}; they are "
                f"in {self.spool_path}: `lightning-losses sync-tracking {self.spool_path}`"
            )


class TrackingConfigCallback(SaveConfigCallback):
    """The CLI's config callback: config file, params and tags to MLflow; run id in checkpoints.

    With a :class:`TrackingLogger` it logs ``config.yaml`` as an artifact, the flattened config
    as params, and tags ``loss`` (the criterion class), ``dataset`` (the DataModule class) and
    ``config`` (the config file's name). With any logger it writes the config file to the log
    directory, as LightningCLI's own callback does.
    """

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        loggers = [logger for logger in trainer.loggers if hasattr(logger, "log_file")]
        if not loggers:
            return
        config = self.parser.dump(self.config, skip_none=False, format="yaml")
        as_dict = self.parser.dump(self.config, skip_none=False, format="json")
        flat = flatten(json.loads(as_dict))
        flat.pop("config", None)
        criterion = type(getattr(pl_module, "criterion", None)).__name__
        datamodule = getattr(trainer, "datamodule", None)
        config_files = [str(p) for p in (self.config.get("config") or []) if p]
        tags = {"loss": criterion, "dataset": type(datamodule).__name__}
        if config_files:
            tags["config"] = Path(config_files[-1]).stem
        for logger in loggers:
            path = logger.local_run_dir / "config.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(config)
            logger.log_file(path)
            logger.log_params(flat)
            logger.set_tags(tags)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger._run_id is not None:
                checkpoint[CHECKPOINT_KEY] = {
                    "run_id": str(logger._run_id),
                    "experiment_id": str(logger._experiment_id),
                    "tracking_uri": str(logger._tracking_uri),
                }


def run_id_from_checkpoint(path: str | Path) -> str | None:
    """The MLflow run id a checkpoint was saved under (``None`` if it has none)."""
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return (checkpoint.get(CHECKPOINT_KEY) or {}).get("run_id")


# --- replay -------------------------------------------------------------------------------


def sync_tracking(path: str | Path, tracking_uri: str | None = None) -> dict[str, int]:
    """Replay a spool file into MLflow; returns the number of records replayed per kind.

    Each record carries its run id and tracking URI (``tracking_uri`` overrides the latter).
    When every record went through, the file is renamed to ``<name>.synced``; otherwise the
    records that failed are written back and an error says how many.
    """
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    fail_fast_http()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spool file {path} does not exist")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    clients: dict[str, Any] = {}
    done: dict[str, int] = {}
    failed: list[dict[str, Any]] = []
    for record in records:
        uri = tracking_uri or record.get("tracking_uri") or resolve_tracking_uri()
        client = clients.setdefault(uri, MlflowClient(uri))
        run_id, kind = record["run_id"], record["kind"]
        try:
            if kind == "metrics":
                metrics = [
                    Metric(k, v, record["timestamp"], record["step"])
                    for k, v in record["metrics"].items()
                ]
                client.log_batch(run_id, metrics=metrics)
            elif kind == "params":
                existing = client.get_run(run_id).data.params
                params = [
                    Param(k, v[:6000]) for k, v in record["params"].items() if k not in existing
                ]
                for start in range(0, len(params), 100):
                    client.log_batch(run_id, params=params[start : start + 100])
            elif kind == "tags":
                for key, value in record["tags"].items():
                    client.set_tag(run_id, key, value)
            elif kind == "artifact":
                client.log_artifact(run_id, record["path"], artifact_path=record["artifact_path"])
            elif kind == "terminate":
                client.set_terminated(run_id, record["status"])
            else:
                raise ValueError(f"unknown spool record kind {kind!r}")
        except Exception as error:
            failed.append({**record, "error": f"{type(error).__name__}: {error}"})
            continue
        done[kind] = done.get(kind, 0) + 1
    if failed:
        path.write_text("".join(json.dumps(r) + "\n" for r in failed))
        raise RuntimeError(
            f"{len(failed)} of {len(records)} spooled records could not be replayed (first: "
            f"{failed[0]['error']}); they remain in {path}"
        )
    path.rename(path.with_name(path.name + ".synced"))
    return done


def sync_main(argv: list[str] | None = None) -> int:
    """``lightning-losses sync-tracking PATH [PATH ...] [--tracking-uri URI]``."""
    parser = argparse.ArgumentParser(
        prog="lightning-losses sync-tracking",
        description="Replay tracking calls kept while the MLflow server was unreachable.",
    )
    parser.add_argument("paths", nargs="+", help="spool files (tracking-spool.jsonl) or folders")
    parser.add_argument("--tracking-uri", default=None, help="override the recorded URI")
    args = parser.parse_args(argv)
    status = 0
    for given in args.paths:
        root = Path(given)
        spools = sorted(root.rglob(SPOOL_NAME)) if root.is_dir() else [root]
        for spool in spools:
            try:
                done = sync_tracking(spool, args.tracking_uri)
            except (OSError, RuntimeError, ValueError) as error:
                print(f"{spool}: {error}", file=sys.stderr)
                status = 1
                continue
            summary = ", ".join(f"{n} {kind}" for kind, n in sorted(done.items()))
            print(f"{spool}: replayed {summary or 'nothing'}")
    return status
