"""The crash-safe spool: locked, fsynced JSON lines of what a dead server missed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.constants import SPOOL_KINDS

#: The longest spool line read, in bytes without its newline (1 MiB): a longer line is refused
#: unread (the logger's records are a few hundred bytes; a params record at most ~600 kB).
MAX_LINE_BYTES = 1 << 20
#: Bytes read at a time when skipping an over-long line or copying lines between files.
_CHUNK = 1 << 16

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
        start: its byte offset in the file.
        size: the bytes it takes in the file, its newline included (``raw`` is empty for a
            line longer than :data:`MAX_LINE_BYTES` read by :func:`iter_spool`).
    """

    number: int
    raw: bytes
    ended: bool
    record: dict[str, Any] | None
    problem: str | None
    start: int = 0
    size: int = 0


def _too_long(length: int) -> str:
    """The problem of a line of ``length`` bytes over :data:`MAX_LINE_BYTES`."""
    return f"longer than {MAX_LINE_BYTES} bytes ({length} bytes): not read"


def _parse_line(raw: bytes, ended: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The record of one spool line, or ``(None, what is wrong with it)``."""
    if len(raw) > MAX_LINE_BYTES:
        return None, _too_long(len(raw))
    if not ended:
        return None, "cut off: no newline at its end (a write interrupted by a kill?)"
    record, problem = _decode_json(raw)
    if problem is None:
        problem = _record_problem(record)
    return (None, problem) if problem is not None else (record, None)


def _decode_json(raw: bytes) -> tuple[Any, str | None]:
    """The JSON value of a line, or ``(None, why it cannot be read)``."""
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as error:
        return None, f"not UTF-8 text (byte {error.start + 1} is not)"
    except json.JSONDecodeError as error:
        return None, f"not a JSON record ({error.msg} at column {error.colno})"
    except RecursionError:
        return None, "not a spool record (JSON nested too deeply)"
    except ValueError as error:  # e.g. an integer longer than Python converts
        return None, f"not a spool record ({' '.join(str(error).split())[:200]})"


def _record_problem(record: Any) -> str | None:
    """What makes a JSON value not a spool record (``None``: it is one)."""
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return "not a spool record (a JSON object with 'kind' and a string 'run_id')"
    if not record["run_id"]:
        return "not a spool record (its 'run_id' is empty)"
    if record.get("kind") not in SPOOL_KINDS:
        return f"unknown record kind {record.get('kind')!r:.100}"
    if not isinstance(record.get("tracking_uri", ""), (str, type(None))):
        return "not a spool record (its 'tracking_uri' is not a string)"
    return None


def read_spool(data: bytes) -> list[SpoolLine]:
    r"""The non-blank lines of a spool, each with its record or what is wrong with it.

    Example:
        >>> data = b'{"kind": "tags", "run_id": "r", "tags": {}}\nnot json\n{"kind": "met'
        >>> [(line.number, line.problem is None) for line in read_spool(data)]
        [(1, True), (2, False), (3, False)]
    """
    pieces = data.split(b"\n")
    last_ended = pieces[-1] == b""
    if last_ended:
        pieces.pop()
    lines = []
    start = 0
    for number, raw in enumerate(pieces, start=1):
        ended = number < len(pieces) or last_ended
        size = len(raw) + ended
        if raw.strip():
            record, problem = _parse_line(raw, ended)
            lines.append(SpoolLine(number, raw, ended, record, problem, start, size))
        start += size
    return lines


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def iter_spool(
    handle: IO[bytes], limit: int | None = None, digest: _Digest | None = None
) -> Iterator[SpoolLine]:
    r"""The non-blank lines of an open spool file, read one at a time from its start.

    Memory stays bounded whatever the file holds: a line longer than :data:`MAX_LINE_BYTES`
    is skipped unread (its ``raw`` is empty, its ``problem`` says how long it is).

    Args:
        handle: the spool, opened in binary mode.
        limit: read no further than this many bytes (``None``: to the end).
        digest: a hash (``hashlib.sha256()``) that every byte read is fed to.

    Example:
        >>> import io
        >>> data = b'{"kind": "tags", "run_id": "r", "tags": {}}\n\xff\n'
        >>> [(line.number, line.problem) for line in iter_spool(io.BytesIO(data))]
        [(1, None), (2, 'not UTF-8 text (byte 1 is not)')]
    """
    handle.seek(0)
    offset = number = 0

    def read(most: int) -> bytes:
        if limit is not None:
            most = min(most, limit - offset)
        piece = handle.readline(most) if most > 0 else b""
        if digest is not None:
            digest.update(piece)
        return piece

    while piece := read(MAX_LINE_BYTES + 1):
        number += 1
        start, length = offset, len(piece)
        offset += len(piece)
        ended = piece.endswith(b"\n")
        while not ended and length > MAX_LINE_BYTES and (more := read(_CHUNK)):
            offset += len(more)  # an over-long line: skipped to its end, not kept
            length += len(more)
            ended = more.endswith(b"\n")
        content = length - ended
        if content > MAX_LINE_BYTES:
            yield SpoolLine(number, b"", ended, None, _too_long(content), start, length)
        elif piece.strip():
            raw = piece[:content]
            record, problem = _parse_line(raw, ended)
            yield SpoolLine(number, raw, ended, record, problem, start, length)


def copy_bytes(source: IO[bytes], target: IO[bytes], start: int, size: int) -> None:
    """Copy ``size`` bytes of ``source`` from offset ``start`` to ``target``, a chunk at a time."""
    source.seek(start)
    while size > 0:
        chunk = source.read(min(size, _CHUNK))
        if not chunk:
            raise OSError(f"{getattr(source, 'name', 'the spool')} ended before byte {start}")
        target.write(chunk)
        size -= len(chunk)
        start += len(chunk)


def _join(lines: Iterable[SpoolLine]) -> bytes:
    """Spool lines back as bytes, each with its newline if it had one."""
    return b"".join(line.raw + (b"\n" if line.ended else b"") for line in lines)
