"""A callback for ``benchmarks/cli_startup.py``: print the time of the first training batch, exit.

``lightning-losses fit ... --trainer.callbacks+=first_batch.FirstBatch`` (with this folder on
``PYTHONPATH``) prints ``FIRST_BATCH <time.time()>`` when the first training batch starts and
ends the process at once (``os._exit``), so that the parent measures process start to first
step and nothing after it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from lightning.pytorch.callbacks import Callback

#: The line's prefix, parsed by the benchmark.
MARK = "FIRST_BATCH"


class FirstBatch(Callback):
    """Print ``FIRST_BATCH <wall-clock seconds>`` at the first training batch, then exit."""

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Print the mark and the time, then end the process at once."""
        print(f"\n{MARK} {time.time():.6f}", flush=True)  # after the progress bar's line
        sys.stderr.flush()
        os._exit(0)
