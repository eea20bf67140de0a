"""The vector index: its layout, (re)builds sized to the machine, and build progress from a second connection."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from kbpg.store import db as kdb
from kbpg.store import queries

LAYOUTS = ("vector", "halfvec", "binary")
POLL_S = 2.0
_GIB = 2**30
# bytes of HNSW graph per chunk besides the element itself (m = 16: up to 32 neighbour tids at
# layer 0, ~6 bytes each, plus pgvector's per-element header), with a 30% margin
_GRAPH_BYTES = 400
_MARGIN = 1.3


@dataclass(frozen=True)
class IndexProgress:
    """One sample of pg_stat_progress_create_index for the build."""

    layout: str
    phase: str
    tuples_done: int
    tuples_total: int
    elapsed_s: float
    # a partitioned kb.chunks: one index per partition, built one after the other
    partitions_done: int = 0
    partitions_total: int = 0

    def describe(self) -> str:
        done = f"{self.tuples_done:,}"
        if self.tuples_total:
            share = min(100.0, 100.0 * self.tuples_done / self.tuples_total)
            done += f"/{self.tuples_total:,} ({share:.0f}%)"
        if self.partitions_total:
            building = min(self.partitions_done + 1, self.partitions_total)
            done = f"partition {building} of {self.partitions_total}, {done}"
        return f"building the {self.layout} index: {self.phase} {done}, {self.elapsed_s:.0f} s"


ProgressCallback = Callable[[IndexProgress], None]


def _element_bytes(layout: str, dimension: int) -> int:
    return {"vector": 4 * dimension, "halfvec": 2 * dimension, "binary": dimension // 8}[layout] + 8


def _local_server(conn: psycopg.Connection[Any]) -> bool:
    host = conn.info.host
    return host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * _GIB


def build_settings(
    conn: psycopg.Connection[Any], layout: str | None = None, chunks: int | None = None
) -> dict[str, str]:
    """maintenance_work_mem and parallel workers for an HNSW build of this knowledge base.

    The graph is built fastest when it fits in maintenance_work_mem (pgvector says so in a
    notice otherwise and goes on slowly): the estimate is the index's size with a margin, capped
    at a quarter of this machine's memory. Only for a server on this machine (unix socket or
    localhost): a remote server's memory is not ours to size, its own settings stay.
    """
    if not _local_server(conn):
        return {}
    row = conn.execute(queries.INDEX_BUILD_INPUTS).fetchone()
    if row is None:
        return {}
    space_layout, dimension, chunk_count, current = row
    n = chunks if chunks is not None else int(chunk_count)
    wanted = int(
        n * (_element_bytes(layout or space_layout, int(dimension)) + _GRAPH_BYTES) * _MARGIN
    )
    memory = max(int(current), min(wanted, _memory_bytes() // 4))
    workers = max(0, min(7, (os.cpu_count() or 1) - 1))
    return {
        "maintenance_work_mem": f"{memory // 2**20}MB",
        "max_parallel_maintenance_workers": str(workers),
    }


class _Poller(threading.Thread):
    """Reads the build's row of pg_stat_progress_create_index every POLL_S seconds."""

    def __init__(
        self, url: str, pid: int, layout: str, total: int, callback: ProgressCallback
    ) -> None:
        super().__init__(daemon=True, name="kbpg-index-progress")
        self.url, self.pid, self.layout, self.total = url, pid, layout, total
        self.callback = callback
        self.started = time.perf_counter()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                while not self.stop.wait(POLL_S):
                    row = conn.execute(queries.INDEX_PROGRESS, (self.pid,)).fetchone()
                    if row is not None:
                        phase, done, total, partitions_done, partitions_total = row
                        # the table's chunk count stands in for an unreported total, except
                        # with partitions, whose counts start again with each partition
                        fallback = 0 if partitions_total else self.total
                        self.callback(
                            IndexProgress(
                                self.layout,
                                str(phase),
                                int(done or 0),
                                int(total or 0) or fallback,
                                time.perf_counter() - self.started,
                                int(partitions_done or 0),
                                int(partitions_total or 0),
                            )
                        )
        except psycopg.Error:
            return  # progress is a courtesy: the build goes on without it


Begin = Callable[[], contextlib.AbstractContextManager[Any]]


def set_layout(
    conn: psycopg.Connection[Any],
    url: str,
    layout: str | None = None,
    progress: ProgressCallback | None = None,
    begin: Begin | None = None,
) -> tuple[str, float]:
    """(Re)build the HNSW index in `layout` (default: the space's own); returns (layout, seconds).

    `conn` is an autocommit connection; the build runs in one transaction on it (`begin`, by
    default conn.transaction) with its settings sized by build_settings, while a second
    connection to `url` reports progress.
    """
    with kdb.translate_errors():
        row = conn.execute(queries.SPACE_LAYOUT_AND_CHUNKS).fetchone()
        chosen = layout or (str(row[0]) if row is not None else "vector")
        settings = build_settings(conn, chosen)
        poller = None
        if progress is not None:
            total = int(row[1]) if row is not None else 0
            poller = _Poller(url, conn.info.backend_pid, chosen, total, progress)
        started = time.perf_counter()
        try:
            with (begin or conn.transaction)():
                for name, value in settings.items():
                    conn.execute(queries.SET_LOCAL, (name, value))
                if poller is not None:
                    poller.start()
                conn.execute(queries.SET_EMBEDDING_LAYOUT, (chosen,))
        finally:
            if poller is not None:
                poller.stop.set()
                poller.join(timeout=POLL_S * 2)
    return chosen, time.perf_counter() - started


def index_present(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(queries.VECTOR_INDEX_PRESENT).fetchone()
    return row == (True,)


def may_rebuild_index(conn: psycopg.Connection[Any]) -> bool:
    """Whether this role may drop and build the HNSW index (it has kb.chunks' owner's rights)."""
    row = conn.execute(queries.MAY_REBUILD_VECTOR_INDEX).fetchone()
    return row == (True,)


# How long dropping the vector index may wait for kb.chunks: DROP INDEX takes the table's
# ACCESS EXCLUSIVE lock, and every search that starts while it waits queues behind it; searches
# hold their locks for milliseconds, so only a long holder (an idle transaction) makes it wait
# this long, and the load then goes on with the index kept.
DROP_LOCK_WAIT = "500ms"


@dataclass
class IndexDeferral:
    """Whether a load builds the HNSW index in bulk after its rows, decided on the chunks it
    actually writes (not on the files it finds: an unchanged folder, or one refused 200 MB file,
    writes nothing and keeps its index).

    Building the graph once after the rows are in is far faster than inserting every row into
    it (COPY into an indexed table pays an HNSW insert per row); searches meanwhile run exact
    scans. So the index is dropped before the first write into an empty knowledge base, and in
    one that already holds chunks once the chunks written reach as many as it held (it has
    doubled; `estimate` of the load's chunks, when given, must also say so: a role's estimate of
    a folder). A role that does not own kb.chunks (a writer under access control) may neither
    drop nor build the index: it loads with the index kept. `kept` says why a drop that was
    due did not happen (another session held kb.chunks).
    """

    conn: psycopg.Connection[Any]
    begin: Begin
    estimate: int | None = None
    existing: int = 0
    eligible: bool = False
    written: int = 0
    dropped: bool = False
    kept: str | None = None

    @classmethod
    def start(
        cls, conn: psycopg.Connection[Any], begin: Begin, estimate: int | None
    ) -> IndexDeferral:
        deferral = cls(conn, begin, estimate)
        with begin():
            row = conn.execute(queries.SPACE_LAYOUT_AND_CHUNKS).fetchone()
            if row is not None and index_present(conn) and may_rebuild_index(conn):
                deferral.existing = int(row[1])
                deferral.eligible = deferral.existing == 0 or (
                    estimate is not None and estimate > deferral.existing
                )
        return deferral

    def before_write(self, chunks: int) -> None:
        """Called with the chunks about to be written (nothing is dropped for none)."""
        if chunks <= 0:
            return
        self.written += chunks
        if not self.eligible or self.dropped or self.kept is not None:
            return
        if self.existing == 0 or self.written >= self.existing:
            self._drop()

    def _drop(self) -> None:
        try:
            with self.begin():
                self.conn.execute(queries.SET_LOCAL, ("lock_timeout", DROP_LOCK_WAIT))
                if index_present(self.conn):
                    self.conn.execute(queries.DROP_VECTOR_INDEX)
            self.dropped = True
        except psycopg.errors.LockNotAvailable:
            self.kept = (
                f"kept the vector index (rows are indexed as they load, which is slower): "
                f"kb.chunks stayed locked for {DROP_LOCK_WAIT} by {lock_holders(self.conn)}; "
                "rerun the ingest when they are done for a bulk build, or end them with "
                "select pg_terminate_backend(<pid>)"
            )


def lock_holders(conn: psycopg.Connection[Any]) -> str:
    """Who holds a lock on kb.chunks (other than this session), for a message."""
    with conn.transaction():
        rows = conn.execute(queries.CHUNKS_LOCK_HOLDERS).fetchall()
    if not rows:
        return "another session (gone since)"
    return ", ".join(
        f"pid {pid} ({user or '?'}"
        + (f", {app}" if app else "")
        + (f", {state}" if state else "")
        + (f" since {since:%H:%M:%S}" if since is not None else "")
        + ")"
        for pid, user, app, state, since in rows
    )


def defer_index(conn: psycopg.Connection[Any], begin: Begin, incoming_chunks: int | None) -> bool:
    """Drop the HNSW index now when a load of `incoming_chunks` (an estimate; None: unknown)
    into this knowledge base should build it in bulk (see IndexDeferral: an ingest decides on
    the chunks it writes instead); True when the caller must rebuild it (ensure_index)."""
    deferral = IndexDeferral.start(conn, begin, incoming_chunks)
    deferral.before_write(max(1, deferral.existing))
    return deferral.dropped


def ensure_index(
    conn: psycopg.Connection[Any],
    url: str,
    progress: ProgressCallback | None = None,
    begin: Begin | None = None,
) -> bool:
    """Build the HNSW index when the space has none (a deferred or interrupted load, or a
    knowledge base grown to kb._wants_vector_index's size) and this role may (it owns
    kb.chunks: see defer_index); True if built."""
    with (begin or conn.transaction)():
        missing = (
            not index_present(conn)
            and conn.execute(queries.HAS_EMBEDDING_SPACE).fetchone() is not None
            and conn.execute(queries.WANTS_VECTOR_INDEX).fetchone() == (True,)
            and may_rebuild_index(conn)
        )
    if missing:
        set_layout(conn, url, None, progress, begin)
    return missing
