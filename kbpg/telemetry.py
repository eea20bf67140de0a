"""Events kbpg reports as it works, for whoever subscribes (`kbpg serve`: Prometheus metrics).

The layers below the faces call `telemetry.report.<event>(...)`; with no subscriber that is a
loop over an empty tuple. Events live here at the base, not metric objects, so that only the
process that serves metrics imports the metrics library (kbpg.serve.metrics), not every CLI
command, and no lower layer learns of Prometheus or of the faces above it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kbpg.telemetry")

# search stages timed (seconds): the query embedding, the SQL (kb.search and, when reranking,
# the cap and cut), the reranker's call, the chat model's paraphrases
STAGES = ("embed", "sql", "rerank", "expand")


class Observer:
    """The events kbpg reports; each method does nothing here. Subclass and `subscribe()`.

    Methods are called on the thread doing the work and must be quick and never raise (an
    exception is logged and dropped: telemetry never fails a search or an ingest).
    """

    def search_stage(self, stage: str, seconds: float) -> None:
        """One stage of a search took `seconds` (stage: one of STAGES)."""

    def query_batch(self, size: int) -> None:
        """One query-embedding model call embedded `size` concurrent searches' queries together
        (kbpg.models.querybatch: 1 when a search found the model idle)."""

    def stage_outcome(self, stage: str, status: str) -> None:
        """An optional stage (rerank, expand) was applied, skipped, or failed (a fallback: the
        search went on with the plain result)."""

    def model_error(self, client: str, reason: str) -> None:
        """A call to a model server failed after its retries (client: embedder, reranker, chat;
        reason: unreachable, refused, bad_answer)."""

    def model_retry(self, client: str) -> None:
        """A model call is retried after a failed attempt."""

    def read_routed(self, database: str) -> None:
        """A read ran on `database`: `primary` or a read replica (its URL, password hidden)."""

    def replica_skipped(self, replica: str, reason: str) -> None:
        """A read replica was left out (reason: down, behind, busy) for a while."""

    def pool_exhausted(self, database: str) -> None:
        """A call found every pooled connection busy past the pool timeout (Busy)."""

    def ingest_running(self, delta: int) -> None:
        """An ingest run started (+1) or ended (-1)."""

    def ingest_documents(self, outcome: str, count: int) -> None:
        """Documents an ingest run committed or skipped (outcome: added, updated, unchanged,
        removed, failed)."""

    def ingest_chunks(self, count: int) -> None:
        """Chunks an ingest run committed."""


_lock = threading.Lock()
_observers: tuple[Observer, ...] = ()


def subscribe(observer: Observer) -> None:
    """Send every event from now on to `observer` too."""
    global _observers
    with _lock:
        if observer not in _observers:
            _observers = (*_observers, observer)


def unsubscribe(observer: Observer) -> None:
    global _observers
    with _lock:
        _observers = tuple(o for o in _observers if o is not observer)


def _broadcast(name: str) -> Callable[..., None]:
    def send(self: Observer, *args: Any) -> None:
        for observer in _observers:
            try:
                getattr(observer, name)(*args)
            except Exception:  # a broken subscriber must not fail the work it observes
                log.exception("telemetry subscriber %r failed on %s", observer, name)

    send.__name__ = name
    return send


class _Everyone(Observer):
    """Forwards each event to every subscriber."""


for _name in [n for n in vars(Observer) if not n.startswith("_")]:
    setattr(_Everyone, _name, _broadcast(_name))

report: Observer = _Everyone()
