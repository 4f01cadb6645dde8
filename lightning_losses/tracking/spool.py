"""The crash-safe spool: locked, fsynced JSON lines of what a dead server missed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.constants import SPOOL_KINDS

# --- the spool file: one JSON record per newline-ended line ---------------------------------


def _lock(handle: IO[bytes]) -> None:
    """Hold an exclusive ``flock`` on an open file until it is closed (no lock off POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)


def _is_current(handle: IO[bytes], path: Path) -> bool:
    """Whether ``handle`` is still the file at ``path`` (not removed or replaced meanwhile)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle.fileno())
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)


@contextmanager
def _locked(path: Path, mode: str) -> Iterator[IO[bytes]]:
    """``path`` opened in binary ``mode`` under an exclusive lock.

    Opens again when the file was removed or replaced while waiting for the lock, so that a
    writer never appends to a spool that a replay has just removed.
    """
    while True:
        handle = path.open(mode)
        try:
            _lock(handle)
            if _is_current(handle, path):
                yield handle
                return
        finally:
            handle.close()


def _rewrite(handle: IO[bytes], data: bytes) -> None:
    """Replace the content of an open, locked file and push it to disk."""
    handle.seek(0)
    handle.write(data)
    handle.truncate()
    handle.flush()
    os.fsync(handle.fileno())


def append_spool_record(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one record to a spool as one JSON line, flushed and fsynced, under a lock.

    A line counts only with its newline. If the file ends in a fragment (a write cut by a
    kill), a newline is written first, so the fragment stays one damaged line and the record
    starts a line of its own.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(dict(record)).encode() + b"\n"
    with _locked(path, "a+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                line = b"\n" + line
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class SpoolLine:
    """One line of a spool file.

    Attributes:
        number: its line number, from 1.
        raw: its bytes, without the newline.
        ended: whether the newline was there (only the file's last line can lack it).
        record: the record it holds, or ``None`` when it is damaged.
        problem: what is wrong with a damaged line, else ``None``.
    """

    number: int
    raw: bytes
    ended: bool
    record: dict[str, Any] | None
    problem: str | None


def _parse_line(raw: bytes, ended: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The record of one spool line, or ``(None, what is wrong with it)``."""
    if not ended:
        return None, "cut off: no newline at its end (a write interrupted by a kill?)"
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as error:
        return None, f"not a JSON record ({error.msg} at column {error.colno})"
    if not isinstance(record, dict) or not record.get("run_id"):
        return None, "not a spool record (a JSON object with 'kind' and 'run_id')"
    if record.get("kind") not in SPOOL_KINDS:
        return None, f"unknown record kind {record.get('kind')!r}"
    return record, None


def read_spool(data: bytes) -> list[SpoolLine]:
    """The non-blank lines of a spool, each with its record or what is wrong with it.

    Example:
        >>> data = b'{"kind": "tags", "run_id": "r", "tags": {}}\\nnot json\\n{"kind": "met'
        >>> [(line.number, line.problem is None) for line in read_spool(data)]
        [(1, True), (2, False), (3, False)]
    """
    pieces = data.split(b"\n")
    last_ended = pieces[-1] == b""
    if last_ended:
        pieces.pop()
    lines = []
    for number, raw in enumerate(pieces, start=1):
        if not raw.strip():
            continue
        ended = number < len(pieces) or last_ended
        record, problem = _parse_line(raw, ended)
        lines.append(SpoolLine(number, raw, ended, record, problem))
    return lines


def _join(lines: Iterable[SpoolLine]) -> bytes:
    """Spool lines back as bytes, each with its newline if it had one."""
    return b"".join(line.raw + (b"\n" if line.ended else b"") for line in lines)
