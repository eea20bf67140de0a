"""Working ahead: a generator run on a thread of its own, its items handed over in order."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.1
# Leaving on an exception (Ctrl-C included) waits this long for the item being made (a batch
# being embedded), then leaves the daemon thread to stop at its next item.
_GRACE_S = 10.0
# While the thread works ahead, a thread waiting for the GIL (the writer, back from each round
# trip to PostgreSQL) waits up to the switch interval for it: CPython's 5 ms default was
# paid a dozen times a batch. The interval is lowered while an Ahead runs, then restored.
SWITCH_S = 0.0002


class _SwitchInterval:
    """The lowered interval, held while any Ahead runs (ingests on several threads of one process
    included): lowered by the first to enter, restored by the last to leave."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 0.0

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, SWITCH_S))
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                sys.setswitchinterval(self._saved)


_SWITCH = _SwitchInterval()


class _Done:
    pass


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Ahead(Generic[T]):
    """Iterates `items` on a thread, at most `depth` items ahead of the consumer.

    Ingest prepares the next batch (parsing, entities, the model) while PostgreSQL writes this
    one: the two then use both cores. What `items` raises is raised to the consumer, in order.
    Leaving the block stops the thread at its next item and closes `items` there; it waits
    for that (on an exception at most _GRACE_S, so that Ctrl-C is not held up by a batch).
    """

    def __init__(self, items: Iterator[T], depth: int = 2, name: str = "kbpg-ahead") -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self._items = items
        self._queue: queue.Queue[T | _Done | _Raised] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)

    def _put(self, item: T | _Done | _Raised) -> bool:
        """Hand over an item; False when the consumer has gone."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
            self._put(_Done())
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Raised(exc))
        finally:
            close = getattr(self._items, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> Ahead[T]:
        _SWITCH.acquire()
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._queue.get()
            if isinstance(item, _Done):
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._stop.set()
        try:
            self._thread.join(timeout=None if exc_type is None else _GRACE_S)
        finally:
            _SWITCH.release()
