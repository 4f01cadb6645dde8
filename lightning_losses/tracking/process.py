"""Host and process tags that tell a run left RUNNING by a killed process from a live one."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.constants import HOST_TAG, PID_TAG

# --- the process that logs a run ------------------------------------------------------------


def process_tags() -> dict[str, str]:
    """Tags naming this host and process: set when a run starts or resumes."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def _recorded_pid(tags: Mapping[str, str]) -> int | None:
    """The process id a run's tags record, if that process ran on this (POSIX) host."""
    pid = tags.get(PID_TAG, "")
    if os.name != "posix" or tags.get(HOST_TAG) != socket.gethostname() or not pid.isdigit():
        return None
    return int(pid)


def _process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (signal 0 probes without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_is_gone(tags: Mapping[str, str]) -> bool:
    """Whether the process a run's tags name (``tracking.host``, ``tracking.pid``) has ended.

    ``False`` when it is alive, ran on another host, or the run has no such tags: only a
    process known to be gone makes a ``RUNNING`` run a killed one.
    """
    pid = _recorded_pid(tags)
    return pid is not None and not _process_exists(pid)
