"""A background sender: what the training loop logs is queued and sent by a worker thread."""

from __future__ import annotations

import atexit
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from lightning_losses.warning import LightningLossesRuntimeWarning

Item = TypeVar("Item")

#: The most items sent in one call (MLflow's ``log_batch`` takes at most 1,000 metrics).
MAX_BATCH = 1000

#: Seconds an idle worker waits for more before it ends (the next submit starts another).
IDLE_SECONDS = 5.0

#: The senders alive in this process, flushed at interpreter exit (:func:`_flush_all`).
_LIVE: weakref.WeakSet[BackgroundSender[Any]] = weakref.WeakSet()


class BackgroundSender(Generic[Item]):
    """A queue and one daemon worker thread that sends its items in batches, in order.

    :meth:`submit` only appends to the queue (the caller never waits for the store). The
    worker takes everything queued, up to ``max_batch`` items, and calls ``send(batch)``; when
    that raises, it calls ``fallback(batch, error)`` with the same batch, so every item is
    either sent or handed to the fallback, once, in the order submitted. :meth:`flush` waits
    until the queue is empty and no batch is in flight; :meth:`close` flushes and stops the
    worker (which also ends after ``IDLE_SECONDS`` without work; the next :meth:`submit`
    starts another). Every sender still alive is flushed at interpreter exit (``atexit``), and
    a pickled or forked copy starts its own worker with an empty queue.

    Args:
        send: sends one batch (a list of items); raises if the store refused it.
        fallback: takes a batch ``send`` failed on, and the error (the spool, for MLflow).
        max_batch: the most items per ``send``.
        name: the worker thread's name.

    Example:
        >>> sent, failed = [], []
        >>> sender = BackgroundSender(sent.extend, lambda batch, error: failed.extend(batch))
        >>> for value in range(5):
        ...     sender.submit([value])
        >>> sender.flush()
        True
        >>> sent, failed, sender.pending
        ([0, 1, 2, 3, 4], [], 0)
        >>> sender.close()
        True
    """

    def __init__(
        self,
        send: Callable[[list[Item]], Any],
        fallback: Callable[[list[Item], BaseException], Any],
        *,
        max_batch: int = MAX_BATCH,
        name: str = "lightning-losses-sender",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1; got {max_batch}")
        self._send, self._fallback = send, fallback
        self.max_batch, self.name = max_batch, name
        self._start_fresh()
        _LIVE.add(self)

    def _start_fresh(self) -> None:
        """An empty queue, no worker yet (started by the first :meth:`submit`)."""
        self._condition = threading.Condition()
        self._queue: list[Item] = []
        self._in_flight = 0
        self._closing = False
        self._worker: threading.Thread | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_condition", "_queue", "_in_flight", "_closing", "_worker", "_pid"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_fresh()
        _LIVE.add(self)

    @property
    def pending(self) -> int:
        """Items queued or in flight (neither sent nor handed to the fallback yet)."""
        with self._condition:
            return len(self._queue) + self._in_flight

    def submit(self, items: Iterable[Item]) -> None:
        """Queue ``items`` to be sent after everything submitted before them."""
        items = list(items)
        if not items:
            return
        if self._pid != os.getpid():  # a forked child: the parent's worker is not here
            self._start_fresh()
        with self._condition:
            if self._closing:
                self._closing = False  # submitted after close: serve it again
            self._queue.extend(items)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._worker.start()
            self._condition.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every item submitted so far is sent or handed to the fallback.

        Args:
            timeout: seconds to wait at most; ``None`` waits as long as it takes.

        Returns:
            Whether the queue is empty (``False``: the timeout passed first).
        """
        if self._pid != os.getpid():
            return True
        with self._condition:
            self._condition.notify_all()
            return self._condition.wait_for(
                lambda: not self._queue and not self._in_flight, timeout=timeout
            )

    def close(self, timeout: float | None = None) -> bool:
        """:meth:`flush`, then let the worker end (a later :meth:`submit` starts another)."""
        done = self.flush(timeout)
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        return done

    def _run(self) -> None:
        """The worker: send batches; end once the queue is empty and closed or idle a while."""
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._queue or self._closing, IDLE_SECONDS)
                if not self._queue:
                    self._worker = None
                    return
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                self._in_flight = len(batch)
            try:
                try:
                    self._send(batch)
                except Exception as error:
                    self._fallback(batch, error)
            except Exception as error:  # the fallback failed too: say so, keep serving
                warnings.warn(
                    f"{self.name}: {len(batch)} items could be neither sent nor kept "
                    f"({type(error).__name__}: {error})",
                    LightningLossesRuntimeWarning,
                    stacklevel=1,
                )
            finally:
                with self._condition:
                    self._in_flight = 0
                    self._condition.notify_all()


@atexit.register
def _flush_all() -> None:
    """Send what every live sender still holds before the interpreter exits."""
    for sender in list(_LIVE):
        sender.close()
