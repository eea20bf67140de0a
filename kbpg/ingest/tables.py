"""kbpg sync: the rows of application tables (table sources) kept as documents.

The triggers of sql/090 queue the keys of changed rows; a worker claims a batch of them, reads
the rows as they are now and writes their documents through the ingest pipeline
(DocumentWriter): a row is the document `table:<source>/<key>`, replaced when it changes,
deleted when the row is gone or its text is empty. Rows that existed before the source are
queued a page at a time (the backfill, resumable). A row that cannot be ingested is parked with
its error (kb.source_errors) and retried with backoff; a model server that is down leaves the
claimed rows queued. Several workers share the queue; one that dies leaves its claims to the
next (its session's advisory lock is gone with it).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kbpg.errors import Busy, IngestError, KbpgError, ModelError, NotFound
from kbpg.ingest.document import Document, LoadFailure
from kbpg.ingest.limits import (
    DEFAULT_MAX_FILE_BYTES,
    check_name,
    check_not_binary,
    clean_text,
    human_bytes,
    json_metadata,
)
from kbpg.ingest.run import DocumentWriter, IngestSummary
from kbpg.models.clients import ModelClients
from kbpg.models.embedders import Embedder
from kbpg.store import db as kdb
from kbpg.store import queries
from kbpg.store.sessions import Connection, Database, Principal

_log = logging.getLogger("kbpg.sync")

__all__ = ["SyncProgress", "SyncSummary", "sync"]

# Rows claimed and written a batch at a time (one claim, one read, one embedding call, one
# write transaction); the backfill queues as many rows at a time, only when the queue runs dry,
# so that live changes never wait behind a table's worth of backfill. Under a steady write load
# a batch holds what was queued since the last one; 256 is for backfills and catching up: MiniLM
# embedded 512 NPL abstracts in 92 s in calls of 64 and 70 s in calls of 256 (texts sorted by
# length inside a call pad less), and each batch has its round trips and statement triggers.
BATCH_ROWS = 256
# A backfill (or a queue of its rows) goes this many batches at a time: 1,024 rows by default,
# as an ingest embeds and writes 1,024 records together. Live changes queued meanwhile wait for
# one such batch at most.
BACKFILL_BATCHES = 4
# With NOTIFY the worker wakes at an application's commit; it polls this often regardless.
POLL_S = 5.0
# The derived edges and the lexical cache are refreshed when the worker is idle, at most this
# often (the lexical arm is exact without them; a refresh waits for writers and blocks them, and
# rebuilds every cache block that holds an updated or deleted chunk).
REFRESH_EVERY_S = 300.0
RECLAIM_EVERY_S = 30.0
# A model server that is down: wait this long before trying again, doubling up to the cap.
MODEL_BACKOFF_S = (5.0, 60.0)
# A source whose table cannot be read (dropped, a column renamed, no SELECT): skipped this long.
SOURCE_BACKOFF_S = 60.0
# SQLSTATEs that make one source unreadable, not the worker: insufficient privilege (or a
# row-level security policy), undefined table, column or function, a key that no longer casts.
# KB010: kbpg's own, its table was dropped (the message names it, the hint what to run).
_SOURCE_STATES = {"42501", "42P01", "42703", "42883", "42704", "22P02", "42804", "KB010"}


@dataclass(frozen=True)
class Backfill:
    """Where a source's backfill stands in this run."""

    source: str
    queued: int  # rows queued so far (pages), this backfill
    total: int  # rows the table held when it started
    done: bool


@dataclass(frozen=True)
class SyncProgress:
    """Sent after each batch: rows processed in this run, and each backfill under way."""

    rows: int
    elapsed_s: float
    backfills: tuple[Backfill, ...] = ()
    backfill_rows: int = 0  # of `rows`, those the backfill queued
    backfill_s: float = 0.0  # time spent on them
    failures: tuple[LoadFailure, ...] = ()

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def eta_s(self, backfill: Backfill) -> float | None:
        """Seconds until `backfill` is through at this run's backfill rate (None: unknown)."""
        if backfill.done:
            return 0.0
        if not self.backfill_rows or self.backfill_s <= 0:
            return None
        left = max(backfill.total - backfill.queued, 0) + BATCH_ROWS * BACKFILL_BATCHES
        return left / (self.backfill_rows / self.backfill_s)


@dataclass
class SyncSummary:
    """What a sync run did. `rows` counts the claimed rows (each once, whatever became of it;
    those handed back too)."""

    rows: int = 0
    batches: int = 0  # claims processed (each read, embedded and written together)
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    empty: int = 0  # rows whose text is NULL or blank: no document
    failed: int = 0  # parked in kb.source_errors
    released: int = 0  # handed back to the queue untouched (a model down, a stop)
    backfill_rows: int = 0
    chunks: int = 0
    edges: int = 0
    embed_s: float = 0.0
    database_s: float = 0.0
    total_s: float = 0.0
    failures: list[LoadFailure] = field(default_factory=list)
    # sources skipped because their table could not be read: name -> reason (with its hint)
    unreadable: dict[str, str] = field(default_factory=dict)
    backfills: dict[str, Backfill] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "batches": self.batches,
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "deleted": self.deleted,
            "empty": self.empty,
            "failed": self.failed,
            "released": self.released,
            "backfill_rows": self.backfill_rows,
            "chunks": self.chunks,
            "edges": self.edges,
            "seconds": {
                "total": round(self.total_s, 3),
                "embedding": round(self.embed_s, 3),
                "database": round(self.database_s, 3),
            },
            "failures": [{"where": f.where, "reason": f.reason} for f in self.failures],
            "unreadable": dict(self.unreadable),
            "backfills": {
                name: {"queued": b.queued, "total": b.total, "done": b.done}
                for name, b in self.backfills.items()
            },
        }


ProgressCallback = Callable[[SyncProgress], None]


@dataclass(frozen=True)
class _Source:
    id: int
    name: str
    backfill_state: str
    dropped: bool = False  # its table is gone


@dataclass(frozen=True)
class _Claim:
    source_id: int
    key: tuple[str, ...]
    op: str


class _ModelDown(Exception):
    """The model server failed (not refused an input): the batch goes back to the queue."""

    def __init__(self, error: ModelError) -> None:
        super().__init__(error.message)
        self.error = error


class _Unreadable(Exception):
    """A source's table could not be read: its claims go back to the queue, the source waits."""

    def __init__(self, source: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.source, self.message, self.hint = source, message, hint


def _keys(keys: Sequence[tuple[str, ...]]) -> Jsonb:
    return Jsonb([list(k) for k in keys])


def _unreadable_hint(state: str, source: str, table: str, role: str) -> str:
    if state == "42501":
        return (
            f"the worker needs SELECT on {table} and must see every row: grant select on {table} "
            f"to {role}; (with row-level security on the table: run the worker as its owner or "
            "as a role with BYPASSRLS)"
        )
    if state == "42P01":
        return f"its table is gone: kbpg sources remove {source}"
    return f"a column it reads is gone or changed type: kbpg sources alter {source} (or remove it)"


def _list(
    values: Sequence[str | None] | None, what: str, where: str, refuse_empty: bool
) -> list[str]:
    out: list[str] = []
    for value in values or ():
        if value is None or not value.strip():
            if refuse_empty:
                raise IngestError(f"{where}: {what} holds an empty value (NULL or blank)")
            continue
        out.append(check_name(value, f"{what} value", where))
    return out


def document_of(row: Sequence[Any], max_text_bytes: int) -> Document | None:
    """The Document of a row read by kb._source_rows (key, document, present, body, title,
    groups, category, labels, metadata); None when the text is NULL or blank. IngestError when
    the row cannot be a document: text over the size limit or binary, an empty group name."""
    _, source, _, body, title, groups, category, labels, metadata = row
    if body is None or not body.strip():
        return None
    size = len(body.encode("utf-8", "surrogatepass"))
    if size > max_text_bytes:
        raise IngestError(
            f"{source}: text is {human_bytes(size)}, over the {human_bytes(max_text_bytes)} limit"
            " (raise it with --max-text-size or KBPG_MAX_FILE_BYTES)"
        )
    check_not_binary(body, source)
    category = (category or "").strip() or None
    return Document(
        source=source,
        title=clean_text((title or "").strip()),
        text=clean_text(body),
        # a group decides who reads the document: a blank one is refused, not dropped
        groups=_list(groups, "groups", source, refuse_empty=True),
        category=check_name(category, "category", source) if category else None,
        labels=_list(labels, "labels", source, refuse_empty=False),
        metadata=json_metadata(metadata or {}, source),
    )


class _Worker:
    """One worker session: its claims, its connections, its summary."""

    def __init__(
        self,
        db: Database,
        conn: Connection,
        writer: DocumentWriter,
        principal: Principal | None,
        names: Sequence[str],
        batch_rows: int,
        max_text_bytes: int,
        progress: ProgressCallback | None,
        stop: threading.Event,
    ) -> None:
        self.db = db
        self.conn = conn
        self.writer = writer
        self.principal = principal
        self.names = list(dict.fromkeys(names))
        self.batch_rows = batch_rows
        self.max_text_bytes = max_text_bytes
        self.progress = progress
        self.stop = stop
        self.summary = SyncSummary()
        self.started = time.perf_counter()
        self.token = 0
        self.sources: dict[int, _Source] = {}
        self.skipped_until: dict[int, float] = {}
        self.last_reclaim = 0.0
        self.last_refresh = time.monotonic()
        self.last_index_check = float("-inf")
        self.index_deferred = False  # by this worker, for its backfill: built when it is through
        self.backfill_s = 0.0
        self._pending_failures: list[LoadFailure] = []

    # -- session --------------------------------------------------------------------------------

    def begin(self) -> None:
        """Take a worker lock of this session's own, listen for changes."""
        while True:
            token = secrets.randbelow(2**31 - 2) + 1
            row = self.conn.execute(queries.SYNC_LOCK, (queries.SYNC_LOCK_CLASS, token)).fetchone()
            if row is not None and row[0]:
                self.token = token
                break
        self.conn.execute(queries.SYNC_LISTEN)

    def end(self) -> None:
        """Hand back whatever this worker still holds; unlock; stop listening. A connection that
        cannot is closed (the server then drops the lock, and the claims go to the next worker)."""
        if self.conn.closed:
            return
        try:
            if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raise psycopg.InterfaceError("connection left inside a transaction")
            with self.transaction():
                row = self.conn.execute(queries.SYNC_RELEASE, (self.token, None)).fetchone()
            self.summary.released += int(row[0]) if row else 0
            self.conn.execute(queries.SYNC_UNLISTEN)
            self.conn.execute(queries.SYNC_UNLOCK, (queries.SYNC_LOCK_CLASS, self.token))
        except psycopg.Error:
            self.conn.close()

    def transaction(self) -> contextlib.AbstractContextManager[Connection]:
        return self.db.transaction(self.conn, self.principal, write=True)

    # -- sources --------------------------------------------------------------------------------

    def load_sources(self) -> None:
        """The sources this worker serves, as they are now (in the caller's transaction)."""
        rows = self.conn.execute(queries.SYNC_SOURCES).fetchall()
        known = {str(r[1]): _Source(int(r[0]), str(r[1]), str(r[2]), bool(r[4])) for r in rows}
        missing = [n for n in self.names if n not in known]
        if missing:
            raise NotFound(
                f"no table source named {', '.join(repr(n) for n in missing)}",
                hint="kbpg sources list shows them; kbpg sources add defines one",
            )
        chosen = [known[n] for n in self.names] if self.names else list(known.values())
        self.sources = {s.id: s for s in chosen}

    def active_ids(self) -> list[int]:
        now = time.monotonic()
        return [i for i in self.sources if self.skipped_until.get(i, 0.0) <= now]

    # -- one round ------------------------------------------------------------------------------

    def round(self) -> int:
        """Reclaim, requeue due retries, claim a batch (after a backfill page when the queue ran
        dry) and process it; the number of rows claimed."""
        if time.monotonic() - self.last_reclaim >= RECLAIM_EVERY_S:
            self.reclaim()
        # the sources, due retries and the claim in one short transaction: a round under a
        # steady write load holds a few rows, and each transaction is round trips of its own
        claims: list[_Claim] = []
        with self.transaction():
            self.load_sources()
            ids = self.active_ids()
            if ids:
                self.conn.execute(queries.SYNC_REQUEUE_ERRORS, (ids,))
                claims = self._claim(ids, self.batch_rows)
        for source_id in [i for i in ids if self.sources[i].dropped]:
            self.check_table(self.sources[source_id])
        if not ids:
            return 0
        if len(claims) < self.batch_rows and self.backfill(ids):
            claims += self.claim(ids, self.batch_rows * BACKFILL_BATCHES - len(claims))
        if claims:
            self.process(claims)
        elif self.index_deferred or time.monotonic() - self.last_index_check >= RECLAIM_EVERY_S:
            self.ensure_index()
        return len(claims)

    def check_table(self, source: _Source) -> None:
        """A source whose table was dropped is skipped, reported with what to run (its queued
        rows, if any, wait: they are read again once the table is back)."""
        try:
            with self.reading(source), self.transaction():
                self.conn.execute(queries.SYNC_CHECK_TABLE, (source.id,))
        except _Unreadable as exc:
            self.skip(source.id, exc)

    def reclaim(self) -> int:
        """Claims of workers that are gone, back in the queue; how many."""
        with self.transaction():
            row = self.conn.execute(queries.SYNC_RECLAIM, (self.token,)).fetchone()
        self.last_reclaim = time.monotonic()
        return int(row[0]) if row else 0

    def claim(self, ids: list[int], limit: int) -> list[_Claim]:
        with self.transaction():
            return self._claim(ids, limit)

    def _claim(self, ids: list[int], limit: int) -> list[_Claim]:
        rows = self.conn.execute(queries.SYNC_CLAIM, (self.token, ids, limit)).fetchall()
        return [_Claim(int(r[0]), tuple(r[1]), str(r[2])) for r in rows]

    def backfill(self, ids: list[int]) -> bool:
        """Queue a page of every unfinished backfill; whether any row was queued."""
        queued = False
        for source_id in ids:
            source = self.sources[source_id]
            known = self.summary.backfills.get(source.name)
            if source.backfill_state == "done" and (known is None or known.done):
                continue
            try:
                with self.reading(source), self.transaction():
                    page = self.batch_rows * BACKFILL_BATCHES
                    row = self.conn.execute(
                        queries.SYNC_BACKFILL, (source_id, page, self.token)
                    ).fetchone()
            except _Unreadable as exc:
                self.skip(source_id, exc)
                continue
            if row is None:  # another worker is paging it, or it is done
                continue
            enqueued, state, total, done = row
            self.summary.backfills[source.name] = Backfill(
                source.name, int(done), int(total or 0), state == "done"
            )
            queued = queued or enqueued > 0
            if enqueued and done == enqueued and total and total > enqueued:
                # the first page of a backfill: into an empty knowledge base (or one it at least
                # doubles) the vector index is built once at the end, as an ingest does
                self.index_deferred = self.writer.defer_index(int(total)) or self.index_deferred
        return queued

    # -- processing -----------------------------------------------------------------------------

    def process(self, claims: list[_Claim]) -> None:
        by_source: dict[int, list[_Claim]] = {}
        for claim in claims:
            by_source.setdefault(claim.source_id, []).append(claim)
        started = time.perf_counter()
        backfilled = sum(c.op == "B" for c in claims)
        try:
            for source_id, entries in by_source.items():
                source = self.sources.get(source_id)
                if source is None:  # removed meanwhile (its claims went with it)
                    continue
                try:
                    self.process_source(source, entries)
                except _Unreadable as exc:
                    self.release(source_id, [c.key for c in entries])
                    self.skip(source_id, exc)
        except BaseException:
            # whatever is still claimed goes back (a model down, a stop, a lost connection: then
            # the next worker reclaims it)
            with contextlib.suppress(psycopg.Error), self.transaction():
                row = self.conn.execute(queries.SYNC_RELEASE, (self.token, None)).fetchone()
                self.summary.released += int(row[0]) if row else 0
            raise
        self.summary.rows += sum(1 for c in claims if c.key)  # not the truncate/resync marks
        self.summary.batches += 1
        self.summary.backfill_rows += backfilled
        if backfilled:
            self.backfill_s += (time.perf_counter() - started) * backfilled / len(claims)
        self.report()

    def release(self, source_id: int, keys: Sequence[tuple[str, ...]]) -> None:
        with self.transaction():
            row = self.conn.execute(
                queries.SYNC_RELEASE, (self.token, Jsonb([[source_id, list(k)] for k in keys]))
            ).fetchone()
        self.summary.released += int(row[0]) if row else 0

    def read_rows(self, source: _Source, keys: list[tuple[str, ...]]) -> list[Any]:
        with self.reading(source), self.transaction():
            return self.conn.execute(queries.SYNC_ROWS, (source.id, _keys(keys))).fetchall()

    @contextlib.contextmanager
    def reading(self, source: _Source) -> Iterator[None]:
        """An error of the source's table (not of the worker) as _Unreadable."""
        try:
            yield
        except psycopg.Error as exc:
            if exc.sqlstate not in _SOURCE_STATES:
                raise
            table, role = self._table_of(source)
            message = exc.diag.message_primary or str(exc)
            # kbpg's own refusals say what to run (a dropped table: re-create it and resync)
            hint = exc.diag.message_hint or _unreadable_hint(
                exc.sqlstate or "", source.name, table, role
            )
            raise _Unreadable(source.name, message, hint) from None

    def skip(self, source_id: int, exc: _Unreadable) -> None:
        """A source whose table cannot be read waits SOURCE_BACKOFF_S; the others go on."""
        self.skipped_until[source_id] = time.monotonic() + SOURCE_BACKOFF_S
        self.summary.unreadable[exc.source] = f"{exc.message} (hint: {exc.hint})"
        _log.warning("source %s skipped for %.0f s: %s", exc.source, SOURCE_BACKOFF_S, exc.message)

    def _table_of(self, source: _Source) -> tuple[str, str]:
        """The source's table and the role that should be able to read it, for a hint."""
        with contextlib.suppress(psycopg.Error), self.transaction():
            row = self.conn.execute(queries.SYNC_SOURCE_TABLE, (source.id,)).fetchone()
            if row is not None:
                return str(row[0]), str(row[1])
        return "its table", "the worker's role"

    def process_source(self, source: _Source, entries: list[_Claim]) -> None:
        """Read the claimed rows, write or delete their documents, settle the claims: written,
        unchanged and deleted ones leave the queue, failed ones are parked."""
        keyed = [c.key for c in entries if c.key]
        markers = [c.key for c in entries if not c.key]  # TRUNCATE or resync: rows that are gone
        where: dict[tuple[str, ...], str] = {}  # key -> its document source
        failed: dict[tuple[str, ...], str] = {}
        gone: list[tuple[str, ...]] = []
        batch: list[Document] = []
        for row in self.read_rows(source, keyed) if keyed else []:
            key, present = tuple(row[0]), bool(row[2])
            where[key] = str(row[1])
            try:
                document = document_of(row, self.max_text_bytes) if present else None
            except IngestError as exc:
                failed[key] = exc.message.removeprefix(f"{row[1]}: ")
                continue
            if document is None:  # the row is gone, or its text is NULL or blank
                gone.append(key)
                self.summary.empty += present
            else:
                batch.append(document)
        orphans: list[str] = []
        if markers:
            with self.transaction():
                orphans = [str(r[0]) for r in self.conn.execute(queries.SYNC_ORPHANS, (source.id,))]
        key_of = {name: key for key, name in where.items()}
        for name, why in self.write(batch).items():
            failed[key_of[name]] = why
        deleted = self.writer.delete([where[k] for k in gone] + orphans)
        self.summary.deleted += len(deleted)
        done = [k for k in keyed if k not in failed] + markers
        failures = [LoadFailure(where[k], why) for k, why in failed.items()]
        self.summary.failed += len(failures)
        self.summary.failures += failures
        self._pending_failures += failures
        with self.transaction():
            self.conn.execute(
                queries.SYNC_SETTLE,
                (
                    self.token,
                    source.id,
                    _keys(done),
                    Jsonb([{"key": list(k), "error": why} for k, why in failed.items()]),
                ),
            )

    def write(self, batch: list[Document]) -> dict[str, str]:
        """Write the documents; the failures by source. A model that refuses an input fails
        that document alone (each is then written on its own); a model that is down raises."""
        if not batch:
            return {}
        try:
            return self._write(batch)
        except ModelError as exc:
            if not exc.refused:
                raise _ModelDown(exc) from exc
        failures: dict[str, str] = {}
        for document in batch:
            try:
                failures.update(self._write([document]))
            except ModelError as exc:
                if not exc.refused:
                    raise _ModelDown(exc) from exc
                failures[document.source] = f"the model refused it: {exc.message}"
        return failures

    def _write(self, batch: list[Document]) -> dict[str, str]:
        done: IngestSummary = self.writer.write(batch)
        s = self.summary
        s.added += done.added
        s.updated += done.updated
        s.unchanged += done.unchanged
        s.chunks += done.chunks
        s.edges += done.edges
        s.embed_s += done.embed_s
        s.database_s += done.database_s
        return {f.where: f.reason for f in done.failures}

    # -- idle work ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Derived edges and the lexical cache, when something changed since the last time."""
        self.last_refresh = time.monotonic()
        if not self.writer.changed:
            return
        t0 = time.perf_counter()
        self.summary.edges += self.writer.refresh()
        self.summary.database_s += time.perf_counter() - t0

    def ensure_index(self) -> None:
        """A vector index deferred for a backfill is built when the queue runs dry: at once when
        this worker deferred it, else (a worker that died did) at the next check, every
        RECLAIM_EVERY_S while idle."""
        t0 = time.perf_counter()
        self.last_index_check = time.monotonic()
        if self.writer.ensure_index():
            self.summary.database_s += time.perf_counter() - t0
        self.index_deferred = False

    def has_work(self) -> bool:
        """Whether this worker's sources have claimable rows, due retries or a backfill left."""
        ids = self.active_ids()
        if not ids:
            return False
        with self.transaction():
            row = self.conn.execute(queries.SYNC_QUEUED, {"ids": ids}).fetchone()
        return bool(row and row[0])

    def wait(self, seconds: float) -> None:
        """Until a change is notified, `seconds` pass or the worker is asked to stop."""
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in self.conn.notifies(timeout=min(left, 0.5), stop_after=1):
                return

    def drain_notifications(self) -> None:
        for _ in self.conn.notifies(timeout=0):
            pass

    def report(self) -> None:
        self.summary.total_s = time.perf_counter() - self.started
        if self.progress is not None:
            self.progress(
                SyncProgress(
                    rows=self.summary.rows,
                    elapsed_s=self.summary.total_s,
                    backfills=tuple(self.summary.backfills.values()),
                    backfill_rows=self.summary.backfill_rows,
                    backfill_s=self.backfill_s,
                    failures=tuple(self._pending_failures),
                )
            )
        self._pending_failures = []


def _sleep(stop: threading.Event, seconds: float) -> None:
    stop.wait(seconds)


@contextlib.contextmanager
def _worker_session(
    db: Database,
    models: ModelClients,
    *,
    principal: Principal | None,
    names: Sequence[str],
    batch_rows: int,
    max_text_bytes: int,
    progress: ProgressCallback | None,
    stop: threading.Event,
    embedder: Embedder | None,
    contextual: bool | None,
) -> Iterator[_Worker]:
    with (
        db.connection(write=True) as conn,
        contextlib.closing(kdb.connect(db.url, autocommit=True)) as reader,
    ):
        with db.transaction(conn, principal, write=True):
            kdb.require_schema(conn)
        writer = DocumentWriter(
            db, models, conn, reader, embedder=embedder, principal=principal, contextual=contextual
        )
        worker = _Worker(
            db, conn, writer, principal, names, batch_rows, max_text_bytes, progress, stop
        )
        worker.begin()
        try:
            yield worker
        finally:
            worker.end()


def sync(
    db: Database,
    models: ModelClients,
    sources: Sequence[str] = (),
    *,
    watch: bool = False,
    principal: Principal | None = None,
    batch_rows: int = BATCH_ROWS,
    poll_s: float = POLL_S,
    refresh_every_s: float = REFRESH_EVERY_S,
    max_text_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    embedder: Embedder | None = None,
    contextual: bool | None = None,
) -> SyncSummary:
    """Bring the documents of table sources (all, or those named) up to date with their rows.

    Without `watch`: until nothing is left to claim (backfills included), then the derived edges
    and the lexical cache are refreshed. With `watch`: forever, waiting on NOTIFY (polling every
    `poll_s`), until `stop` is set, which lets the batch in hand finish. A model server that is
    down hands the batch back to the queue: `watch` waits and tries again, otherwise ModelError
    is raised (the rows stay queued).
    """
    if batch_rows < 1:
        raise KbpgError("the batch size must be at least 1 row")
    halt = stop or threading.Event()
    with _worker_session(
        db,
        models,
        principal=principal,
        names=sources,
        batch_rows=batch_rows,
        max_text_bytes=max_text_bytes,
        progress=progress,
        stop=halt,
        embedder=embedder,
        contextual=contextual,
    ) as worker:
        backoff = MODEL_BACKOFF_S[0]
        while not halt.is_set():
            worker.drain_notifications()
            try:
                claimed = worker.round()
            except (_ModelDown, Busy) as exc:
                # the rows went back to the queue: wait for the model (or the other writer)
                error = exc.error if isinstance(exc, _ModelDown) else exc
                if not watch:
                    raise error from None
                _log.warning(
                    "%s; the rows stay queued, trying again in %.0f s", error.message, backoff
                )
                _sleep(halt, backoff)
                backoff = min(backoff * 2, MODEL_BACKOFF_S[1])
                continue
            backoff = MODEL_BACKOFF_S[0]
            if claimed:
                continue
            if not watch:
                if worker.reclaim() or worker.has_work():
                    _sleep(halt, 0.2)  # a backfill page or rows another worker left
                    continue
                break  # the rest (if any) is claimed by live workers
            if time.monotonic() - worker.last_refresh >= refresh_every_s:
                worker.refresh()
            worker.wait(poll_s)
        worker.refresh()
        worker.report()
    return worker.summary
