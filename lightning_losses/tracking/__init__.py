"""MLflow tracking: the CLI's default logger, a crash-safe spool, its replay, and history readers.

- :class:`TrackingLogger` is Lightning's ``MLFlowLogger`` with the project's defaults (a local
  SQLite store, ``sqlite:///mlflow.db``, unless ``tracking_uri`` or ``MLFLOW_TRACKING_URI`` says
  otherwise), a start-up check that fails within seconds when an HTTP server cannot be reached,
  run-local folders for checkpoints and diagrams, and a spool: whatever cannot be sent while
  the server is down (metrics with their steps, params, tags, artifacts, the run's end) is
  appended to ``tracking-spool.jsonl`` beside the run's checkpoints, training goes on, and a
  warning says where the spool is. Each spool line is one JSON record ended by a newline,
  flushed and fsynced; a (metric, step) is spooled at most once.
- Resume: ``fit --ckpt_path`` continues the checkpoint's run (the CLI passes ``run_id`` and
  ``resume_step``). The logger records a *resume marker*, the tag ``resume.<k>`` (``k`` = 1,
  2, ...) holding ``{"step": s, "time_ms": t, "previous_status": ...}``: ``s`` is the
  checkpoint's global step, ``t`` the time the resumed fit started. MLflow keeps every logged
  value, so the abandoned attempt's values at steps ``>= s`` (logged before ``t``) stay in
  the raw history beside the resumed fit's; :func:`metric_history` and :func:`final_metrics`
  drop them and give one value per step (``compare`` and ``reproduce`` read runs this way).
- :func:`sync_tracking` (``lightning-losses sync-tracking PATH``) replays a spool into the
  server once it is back: every valid line, without writing a (metric, step) twice; damaged
  lines are named by number and kept; a run left ``RUNNING`` by a killed process is marked
  ``KILLED``.
- :class:`TrackingConfigCallback` (the CLI's ``SaveConfigCallback``) logs the resolved config as
  an artifact and as flattened params, tags each run (loss, dataset, config), and writes the
  run id and tracking URI into every checkpoint so that ``fit --ckpt_path`` continues the
  same run in the same store.

Only rank 0 talks to MLflow (Lightning's ``rank_zero_only``): one run per fit under DDP. Before
the Trainer exists, only global rank 0 (as the launcher's variables say: :func:`global_rank_zero`)
builds an MLflow client, so no other process or node creates or opens the store.


Modules: ``constants`` (names), ``uri`` (resolution, reachability, printable forms), ``store``
(the SQLite file and its lock), ``params`` (flattened configs), ``history`` (resume markers,
histories), ``process`` (host/pid tags), ``spool`` (the spool file), ``logger``
(:class:`TrackingLogger`), ``config`` (:class:`TrackingConfigCallback`, checkpoint keys),
``summary`` (what a fit prints), ``replay`` (``sync-tracking``), ``async_log`` (the background
sender that takes metrics off the training path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_losses._lazy import lazy_exports
from lightning_losses.tracking.async_log import BackgroundSender
from lightning_losses.tracking.constants import (
    CHECKPOINT_KEY,
    DEFAULT_EXPERIMENT,
    DEFAULT_SAVE_DIR,
    DEFAULT_TRACKING_URI,
    FAILURE_TAG,
    HOST_TAG,
    PID_TAG,
    RESUME_TAG,
    SPOOL_KINDS,
    SPOOL_NAME,
    SYNCED_SUFFIX,
)
from lightning_losses.tracking.history import (
    Resume,
    cut_history,
    final_metrics,
    metric_history,
    resume_markers,
)
from lightning_losses.tracking.params import flatten
from lightning_losses.tracking.process import process_is_gone, process_tags
from lightning_losses.tracking.replay import SpoolReplayError, sync_tracking
from lightning_losses.tracking.spool import SpoolLine, append_spool_record, read_spool
from lightning_losses.tracking.store import (
    NOT_RANK_ZERO_URI,
    RANK_VARIABLES,
    client_uri,
    global_rank_zero,
    now_ms,
    sqlite_file,
    store_lock,
)
from lightning_losses.tracking.summary import (
    SUMMARY_METRICS,
    describe_fit,
    describe_run,
    final_values,
    last_diagram,
)
from lightning_losses.tracking.uri import (
    REDACTED,
    check_reachable,
    check_store,
    fail_fast_http,
    has_redactions,
    is_secret_parameter,
    keep_secrets_off_stdout,
    redact_text,
    redact_uri,
    resolve_tracking_uri,
    same_store,
    view_command,
    without_password,
    without_redacted,
)

if TYPE_CHECKING:  # loaded on first use (below): these two import Lightning
    from lightning_losses.tracking.config import (
        TrackingConfigCallback,
        checkpoint_tracking,
        run_folder_root,
        run_id_from_checkpoint,
    )
    from lightning_losses.tracking.logger import TrackingLogger

#: The names whose modules import Lightning, loaded when first read, so that ``compare`` and
#: ``sync-tracking`` (which read stores and spools) start without it.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "TrackingConfigCallback",
            "checkpoint_tracking",
            "run_folder_root",
            "run_id_from_checkpoint",
        ),
        "config",
    ),
    "TrackingLogger": "logger",
}

__all__ = [
    "CHECKPOINT_KEY",
    "DEFAULT_EXPERIMENT",
    "DEFAULT_SAVE_DIR",
    "DEFAULT_TRACKING_URI",
    "FAILURE_TAG",
    "HOST_TAG",
    "NOT_RANK_ZERO_URI",
    "PID_TAG",
    "RANK_VARIABLES",
    "REDACTED",
    "RESUME_TAG",
    "SPOOL_KINDS",
    "SPOOL_NAME",
    "SUMMARY_METRICS",
    "SYNCED_SUFFIX",
    "BackgroundSender",
    "Resume",
    "SpoolLine",
    "SpoolReplayError",
    "TrackingConfigCallback",
    "TrackingLogger",
    "append_spool_record",
    "check_reachable",
    "check_store",
    "checkpoint_tracking",
    "client_uri",
    "cut_history",
    "describe_fit",
    "describe_run",
    "fail_fast_http",
    "final_metrics",
    "final_values",
    "flatten",
    "global_rank_zero",
    "has_redactions",
    "is_secret_parameter",
    "keep_secrets_off_stdout",
    "last_diagram",
    "metric_history",
    "now_ms",
    "process_is_gone",
    "process_tags",
    "read_spool",
    "redact_text",
    "redact_uri",
    "resolve_tracking_uri",
    "resume_markers",
    "run_folder_root",
    "run_id_from_checkpoint",
    "same_store",
    "sqlite_file",
    "store_lock",
    "sync_tracking",
    "view_command",
    "without_password",
    "without_redacted",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
