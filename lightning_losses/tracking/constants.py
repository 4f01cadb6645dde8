"""Names shared by the tracking modules: default store and experiment, file names, tag keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "lightning-losses"
#: Default root of the local run folders (``<save_dir>/<experiment id>/<run id>/``).
DEFAULT_SAVE_DIR = "mlflow_runs"
SPOOL_NAME = "tracking-spool.jsonl"
#: Suffix of the journal of replayed spool lines (``tracking-spool.jsonl.synced``).
SYNCED_SUFFIX = ".synced"
CHECKPOINT_KEY = "tracking"
#: Prefix of the resume-marker tags: ``resume.1``, ``resume.2``, ... (JSON of :class:`Resume`).
RESUME_TAG = "resume."
#: Tags naming the host and process that log a run (to tell a killed run from a live one).
HOST_TAG = "tracking.host"
PID_TAG = "tracking.pid"
#: The tag of a run that ended FAILED: one line naming the cause (``the training loss became
#: nan at step 12, epoch 0: ...``, ``non-finite weight ... under trainer.precision=16-true``).
FAILURE_TAG = "lightning_losses.failure"
#: The kinds of spool records.
SPOOL_KINDS = ("metrics", "params", "tags", "artifact", "terminate")
