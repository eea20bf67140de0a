"""Ingest: documents -> chunks -> vectors -> COPY into kb.*, idempotent, atomic per batch of documents."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from kbpg import telemetry
from kbpg.errors import InvalidInput
from kbpg.ingest.batching import BATCH_DOCUMENTS, BatchPreparer, PreparedBatch
from kbpg.ingest.contextual import ContextTally
from kbpg.ingest.document import Document, LoadFailure
from kbpg.ingest.entities import MAX_ENTITY_DOCUMENTS, refresh_edges
from kbpg.ingest.limits import DEFAULT_MAX_FILE_BYTES
from kbpg.ingest.pipeline import Ahead
from kbpg.ingest.prepare import (
    PreparedDocument,
    embed_texts,
)
from kbpg.ingest.sources import discover, iter_documents
from kbpg.ingest.writer import (
    copy_chunk_rows,
    copy_rows,
    lock_transaction,
    write_documents,
    write_relations,
    writer,
)
from kbpg.models.chat import ChatClient
from kbpg.models.clients import ModelClients
from kbpg.models.embedders import Embedder, model_languages
from kbpg.store import db as kdb
from kbpg.store import indexing, queries
from kbpg.store.sessions import Connection, Database, Principal

_log = logging.getLogger(__name__)

__all__ = [
    "MAX_ENTITY_DOCUMENTS",
    "Document",
    "DocumentWriter",
    "IngestProgress",
    "IngestSummary",
    "LoadFailure",
    "ingest_documents",
    "ingest_paths",
]

# A document of more chunks is embedded and written this many at a time (in its one
# transaction): memory then holds a slice's rows, not the document's (a 50 MB text is 100k
# chunks, 150 MB of float32 384-d vectors). Its chunks are embedded and copied to a stage
# EMBED_STEP at a time, so the transaction waits for the model at most that long between
# statements (1,024 chunks at MiniLM's 6 chunks/s on a busy machine outlived the 5-minute
# idle-in-transaction timeout).
SLICE_CHUNKS = 1024
EMBED_STEP = 64


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestProgress:
    documents: int
    chunks: int
    elapsed_s: float
    failures: tuple[LoadFailure, ...] = ()

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class IngestSummary:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    skipped: int = 0  # documents with no text to index (a warning each; a failure when strict)
    chunks: int = 0
    edges: int = 0
    failures: list[LoadFailure] = field(default_factory=list)
    skips: list[LoadFailure] = field(default_factory=list)
    # what did not go as planned without failing anything (a vector index kept, ...)
    warnings: list[str] = field(default_factory=list)
    contexts: ContextTally = field(default_factory=ContextTally)
    prepare_s: float = 0.0
    embed_s: float = 0.0
    database_s: float = 0.0
    total_s: float = 0.0

    @property
    def documents(self) -> int:
        return self.added + self.updated + self.unchanged

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed)

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "failed": self.failed,
            "skipped": self.skipped,
            "chunks": self.chunks,
            "edges": self.edges,
            "seconds": {
                "total": round(self.total_s, 3),
                "prepare": round(self.prepare_s, 3),
                "embedding": round(self.embed_s, 3),
                "database": round(self.database_s, 3),
            },
            "failures": [{"where": f.where, "reason": f.reason} for f in self.failures],
            "skips": [{"where": f.where, "reason": f.reason} for f in self.skips],
            "warnings": list(self.warnings),
            "contexts": {
                "written": self.contexts.written,
                "missing": self.contexts.missing,
                "model_calls": self.contexts.calls,
            },
        }


ProgressCallback = Callable[[IngestProgress], None]


def _refresh_lexical_index(db: Database, conn: Connection, principal: Principal | None) -> None:
    """Keep the lexical arm's impact cache fresh (speed only: the arm is exact either way)."""
    with db.transaction(conn, principal, write=True):
        conn.execute(queries.REFRESH_LEXICAL_INDEX)


def _register_space(
    db: Database, conn: Connection, principal: Principal | None, embedder: Embedder
) -> None:
    """Record (or check) the embedding space; a different model is refused with a hint."""
    with db.transaction(conn, principal, write=True):
        conn.execute(
            queries.SET_EMBEDDING_SPACE,
            (embedder.model_name, embedder.dimension, model_languages(embedder.model_name)),
        )


# -- writing ----------------------------------------------------------------------------------


# SQLSTATE classes one document's data can cause (data exception, integrity constraint, a
# program limit such as an index row too large); anything else (connection, privileges,
# timeouts, a read-only server, kbpg's own KB states) stops the run.
_DOCUMENT_STATES = ("22", "23", "54")


def _document_error(exc: Exception) -> bool:
    """Whether a failed write can be blamed on a document rather than on the run."""
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state is None:  # refused by psycopg itself while adapting a value (e.g. NUL)
            return isinstance(exc, psycopg.DataError)
        return state[:2] in _DOCUMENT_STATES
    return isinstance(exc, ValueError | TypeError)  # UnicodeEncodeError, JSON dumps, ...


def _reason(exc: Exception) -> str:
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        return exc.diag.message_primary
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


class _Run:
    """One ingest run: batches documents, embeds them together, writes each batch atomically."""

    def __init__(
        self,
        db: Database,
        conn: Connection,
        principal: Principal | None,
        reader: Connection,
        embedder: Embedder,
        progress: ProgressCallback | None,
        batch_documents: int = BATCH_DOCUMENTS,
        chat: ChatClient | None = None,
        write_lock_wait_ms: int | None = None,
    ) -> None:
        self.db = db
        self.conn = conn
        self.principal = principal
        self.embedder = embedder
        self.progress = progress
        # None: the caller holds kbpg's write lock for the whole run (an ingest job); else each
        # write transaction takes it for itself, waiting up to this long (kbpg sync)
        self.write_lock_wait_ms = write_lock_wait_ms
        self.summary = IngestSummary()
        # looks up and prepares the next batches on a second connection while conn writes
        self.preparer = BatchPreparer(
            db,
            reader,
            principal,
            embedder,
            chat,
            self.summary.contexts,
            batch_documents,
            SLICE_CHUNKS,
        )
        self.started = time.perf_counter()
        self._pending_failures: list[LoadFailure] = []
        # the HNSW index dropped for a bulk build once the writes call for it (run() sets it)
        self.deferral: indexing.IndexDeferral | None = None

    def fail(self, failure: LoadFailure) -> None:
        if failure.empty:
            self.summary.skipped += 1
            self.summary.skips.append(failure)
        else:
            self.summary.failed += 1
            self.summary.failures.append(failure)
        self._pending_failures.append(failure)

    def report(self) -> None:
        if self.progress is not None:
            self.progress(
                IngestProgress(
                    documents=self.summary.documents,
                    chunks=self.summary.chunks,
                    elapsed_s=time.perf_counter() - self.started,
                    failures=tuple(self._pending_failures),
                )
            )
        self._pending_failures = []

    def run(self, items: Iterable[Document | LoadFailure]) -> None:
        """Batches are prepared on a thread (kbpg.pipeline) while this one writes the last."""
        with Ahead(self.preparer.batches(items)) as batches:
            for batch in batches:
                self._store(batch)

    def _store(self, batch: PreparedBatch) -> None:
        """Write one prepared batch: its documents in one transaction (or each in its own when a
        document's data fails it), a document of over SLICE_CHUNKS chunks a slice at a time."""
        t0 = time.perf_counter()
        failed, chunks = self.summary.failed, self.summary.chunks
        for failure in batch.failures:
            self.fail(failure)
        self.summary.unchanged += batch.unchanged
        if self.deferral is not None:
            # decided on what is written: unchanged and refused documents drop nothing
            self.deferral.before_write(
                sum(len(p.chunks) for p in batch.whole) + sum(len(p.chunks) for p in batch.sliced)
            )
        written = self._write_batch(batch.whole, batch.vectors) if batch.whole else []
        self.summary.chunks += sum(len(p.chunks) for p in written)
        embed_s = self.summary.embed_s
        for item in batch.sliced:
            if self._write_sliced(item):
                written.append(item)
        sliced_embed_s = self.summary.embed_s - embed_s
        self.summary.prepare_s += batch.prepare_s
        self.summary.embed_s += batch.embed_s
        self.summary.database_s += batch.lookup_s + time.perf_counter() - t0 - sliced_embed_s
        for item in written:
            if item.is_new:
                self.summary.added += 1
            else:
                self.summary.updated += 1
        added = sum(item.is_new for item in written)
        for outcome, count in (
            ("added", added),
            ("updated", len(written) - added),
            ("unchanged", batch.unchanged),
            ("failed", self.summary.failed - failed),
        ):
            if count:
                telemetry.report.ingest_documents(outcome, count)
        telemetry.report.ingest_chunks(self.summary.chunks - chunks)
        self.report()

    def _write_batch(
        self, prepared: list[PreparedDocument], vectors: np.ndarray[Any, Any]
    ) -> list[PreparedDocument]:
        """Documents in one transaction; if some document's data fails it, each document in a
        transaction of its own, so only the bad ones are skipped (with the database's reason)."""
        edges = self.summary.edges
        try:
            with self.transaction():
                self._write(prepared, vectors)
            return prepared
        except Exception as exc:
            if not _document_error(exc):
                raise
            self.summary.edges = edges
        written: list[PreparedDocument] = []
        row = 0
        for item in prepared:
            rows = slice(row, row + len(item.chunks))
            row = rows.stop
            if self._write_alone(item, functools.partial(self._write, [item], vectors[rows])):
                written.append(item)
        return written

    def _write_sliced(self, item: PreparedDocument) -> bool:
        """A document of more than SLICE_CHUNKS chunks: embedded and written a slice at a time,
        all in one transaction (it is stored whole or not at all), so memory holds one slice's
        vectors and rows, not the document's. Its model calls run inside that transaction,
        EMBED_STEP chunks between statements (within KBPG_IDLE_IN_TRANSACTION_TIMEOUT)."""
        chunks = self.summary.chunks

        def write() -> None:
            staged = self._staged()
            write_documents(self.conn, [item], staged)
            # The slices go to a temporary stage and into kb.chunks in one statement, so the
            # BM25 statistics trigger runs once, not once a slice (which doubled the write time)
            create, copy_stage, insert, drop = queries.staged_copy(queries.COPY_CHUNKS)
            self.conn.execute(create)
            n = len(item.chunks)
            slices = [(start, min(start + SLICE_CHUNKS, n)) for start in range(0, n, SLICE_CHUNKS)]
            for start, stop in slices:
                # a COPY every EMBED_STEP chunks: the transaction never waits idle for the model
                # longer than that takes (KBPG_IDLE_IN_TRANSACTION_TIMEOUT would end it)
                for step in range(start, stop, EMBED_STEP):
                    end = min(step + EMBED_STEP, stop)
                    t0 = time.perf_counter()
                    texts = embed_texts(item, self.embedder, step, end)
                    vectors = self.embedder.embed_documents(texts)
                    del texts
                    self.summary.embed_s += time.perf_counter() - t0
                    with self.conn.cursor() as cur, cur.copy(copy_stage) as copy:
                        copy_chunk_rows(copy, [(item, step, end)], vectors)
                self.summary.chunks += stop - start
                self.report()
            self.conn.execute(insert)
            self.conn.execute(drop)
            for start, stop in slices:
                self.summary.edges += write_relations(self.conn, [(item, start, stop)], staged)

        if self._write_alone(item, write):
            return True
        self.summary.chunks = chunks
        return False

    def _write_alone(self, item: PreparedDocument, write: Callable[[], None]) -> bool:
        """`write` (one document) in a transaction of its own; when the document's data fails
        it, the document is reported as not stored and the run goes on."""
        edges = self.summary.edges
        try:
            with self.transaction():
                write()
        except Exception as exc:
            if not _document_error(exc):
                raise
            self.summary.edges = edges
            self.fail(LoadFailure(item.document.where, f"not stored: {_reason(exc)}"))
            return False
        return True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.db.transaction(self.conn, self.principal, write=True) as conn:
            if self.write_lock_wait_ms is not None:
                lock_transaction(conn, self.write_lock_wait_ms)
            yield conn

    def _staged(self) -> bool:
        """Whether row-level security applies to this writer (COPY then goes through a stage)."""
        return bool((self.conn.execute(queries.ROW_SECURITY_ACTIVE).fetchone() or (False,))[0])

    def _write(self, prepared: list[PreparedDocument], vectors: np.ndarray[Any, Any]) -> None:
        staged = self._staged()
        write_documents(self.conn, prepared, staged)
        self._write_chunks([(p, 0, len(p.chunks)) for p in prepared], vectors, staged)

    def _write_chunks(
        self,
        parts: list[tuple[PreparedDocument, int, int]],
        vectors: np.ndarray[Any, Any],
        staged: bool,
    ) -> None:
        """Chunks `start:stop` of each (document, start, stop), `vectors` row by row in that
        order, then their edges, links and entities."""
        with self.conn.cursor() as cur, copy_rows(cur, queries.COPY_CHUNKS, staged) as copy:
            copy_chunk_rows(copy, parts, vectors)
        self.summary.edges += write_relations(self.conn, parts, staged)

    def delete(self, document_ids: Sequence[int]) -> int:
        if not document_ids:
            return 0
        with self.transaction():
            removed = self.conn.execute(
                queries.DELETE_DOCUMENTS_BY_ID, (list(document_ids),)
            ).rowcount
        self.summary.removed += removed
        if removed:
            telemetry.report.ingest_documents("removed", removed)
        return removed

    def finish(self) -> IngestSummary:
        """Derived edges and the lexical cache, then the totals."""
        t0 = time.perf_counter()
        with self.transaction():
            added, _ = refresh_edges(self.conn)
        if self.summary.changed:
            _refresh_lexical_index(self.db, self.conn, self.principal)
        self.summary.edges += added
        self.summary.database_s += time.perf_counter() - t0
        self.summary.total_s = time.perf_counter() - self.started
        self.report()
        return self.summary


def _ingest(
    db: Database,
    models: ModelClients,
    items: Iterable[Document | LoadFailure],
    embedder: Embedder | None,
    principal: Principal | None,
    progress: ProgressCallback | None,
    batch_documents: int,
    prunable: Callable[[str], bool] | None,
    expected_chunks: int | None = None,
    index_progress: indexing.ProgressCallback | None = None,
    contextual: bool | None = None,
) -> IngestSummary:
    """One ingest run under the write lock; documents not seen for which `prunable` holds go.

    A load into an empty knowledge base (or one its writes at least double, when
    `expected_chunks` says so too) builds the HNSW index once after the rows are in
    (indexing.IndexDeferral: decided on the chunks written), reporting its progress.
    `contextual` (default KBPG_CONTEXTUAL): a chat model writes each chunk's context.
    """
    model = embedder or models.document_embedder()
    wanted = models.settings.contextual if contextual is None else contextual
    chat = models.chat() if wanted else None
    telemetry.report.ingest_running(1)
    try:
        with writer(db, principal) as conn, contextlib.closing(kdb.connect(db.url)) as reader:
            reader.autocommit = True
            _register_space(db, conn, principal, model)
            run = _Run(db, conn, principal, reader, model, progress, batch_documents, chat)
            run.deferral = indexing.IndexDeferral.start(conn, run.transaction, expected_chunks)
            run.run(items)
            if run.deferral.kept is not None:
                run.summary.warnings.append(run.deferral.kept)
            if prunable is not None:
                with run.transaction():
                    known = conn.execute(queries.ALL_DOCUMENTS).fetchall()
                run.delete(
                    [
                        int(i)
                        for i, source in known
                        if source not in run.preparer.seen and prunable(source)
                    ]
                )
            t0 = time.perf_counter()
            indexing.ensure_index(conn, db.url, index_progress, run.transaction)
            run.summary.database_s += time.perf_counter() - t0
            return run.finish()
    finally:
        telemetry.report.ingest_running(-1)


class DocumentWriter:
    """Documents written through the ingest pipeline (chunks, vectors, BM25 statistics, edges,
    groups) on connections the caller holds, one batch at a time and without kbpg's write lock
    for the whole job: each write transaction takes the lock for itself (waiting up to
    KBPG_WRITE_LOCK_WAIT), so an ingest job and sync workers take turns batch by batch.

    `conn` writes; `reader` (autocommit) looks up what is stored. The caller refreshes the
    derived edges and the lexical cache (`refresh()`) when it pauses, as an ingest does at its end.
    """

    def __init__(
        self,
        db: Database,
        models: ModelClients,
        conn: Connection,
        reader: Connection,
        *,
        embedder: Embedder | None = None,
        principal: Principal | None = None,
        contextual: bool | None = None,
    ) -> None:
        self.db = db
        self.conn = conn
        self.reader = reader
        self.principal = principal
        self.embedder = embedder or models.document_embedder()
        wanted = models.settings.contextual if contextual is None else contextual
        self.chat = models.chat() if wanted else None
        self.changed = False  # since the last refresh()
        self._space_registered = False

    def _run(self) -> _Run:
        if not self._space_registered:
            _register_space(self.db, self.conn, self.principal, self.embedder)
            self._space_registered = True
        return _Run(
            self.db,
            self.conn,
            self.principal,
            self.reader,
            self.embedder,
            None,
            chat=self.chat,
            write_lock_wait_ms=self.db.settings.write_lock_wait_ms,
        )

    def write(self, documents: Sequence[Document]) -> IngestSummary:
        """Write these documents (new ones added, changed ones replaced, unchanged skipped), a
        batch a transaction; a document whose data fails is in the summary's failures (where =
        its source). A model that fails raises (ModelError), leaving what was written."""
        run = self._run()
        run.run(documents)
        run.summary.total_s = time.perf_counter() - run.started
        self.changed = self.changed or run.summary.changed
        return run.summary

    def delete(self, sources: Sequence[str]) -> list[str]:
        """Delete the documents of these sources (those that exist); the deleted sources."""
        if not sources:
            return []
        run = self._run()
        with run.transaction():
            rows = self.conn.execute(queries.DELETE_DOCUMENT_BY_SOURCE, (list(sources),)).fetchall()
        self.changed = self.changed or bool(rows)
        return [str(r[0]) for r in rows]

    def defer_index(self, incoming_chunks: int) -> bool:
        """Drop the HNSW index before a load into an empty knowledge base (or one the load at
        least doubles), as an ingest does; True when it was dropped (ensure_index builds it)."""
        return indexing.defer_index(self.conn, self._run().transaction, incoming_chunks)

    def ensure_index(self, progress: indexing.ProgressCallback | None = None) -> bool:
        """Build the HNSW index if it is missing (a deferred load), under kbpg's write lock
        (taken only when there is one to build)."""
        with self.db.transaction(self.conn, self.principal, write=True):
            if indexing.index_present(self.conn):
                return False
            if self.conn.execute(queries.HAS_EMBEDDING_SPACE).fetchone() is None:
                return False
        return indexing.ensure_index(self.conn, self.db.url, progress, self._run().transaction)

    def refresh(self) -> int:
        """Derived edges and the lexical cache brought up to date after changes; edges added."""
        if not self.changed:
            return 0
        run = self._run()
        with run.transaction():
            added, _ = refresh_edges(self.conn)
            self.conn.execute(queries.REFRESH_LEXICAL_INDEX)
        self.changed = False
        return added


def ingest_documents(
    db: Database,
    models: ModelClients,
    documents: Iterable[Document | LoadFailure],
    embedder: Embedder | None = None,
    *,
    principal: Principal | None = None,
    prune: bool = False,
    progress: ProgressCallback | None = None,
    batch_documents: int = BATCH_DOCUMENTS,
    index_progress: indexing.ProgressCallback | None = None,
    contextual: bool | None = None,
) -> IngestSummary:
    """Ingest documents keyed by source: new ones added, changed ones replaced, unchanged skipped.

    Documents are embedded (with `embedder`, default the knowledge base's) in batches across
    documents and written with COPY, one transaction per batch of whole documents. With
    `prune`, documents not in `documents` are removed (the knowledge base becomes exactly
    this collection).
    """
    return _ingest(
        db,
        models,
        documents,
        embedder,
        principal,
        progress,
        batch_documents,
        (lambda source: True) if prune else None,
        index_progress=index_progress,
        contextual=contextual,
    )


def ingest_paths(
    db: Database,
    models: ModelClients,
    paths: Sequence[str | os.PathLike[str]],
    embedder: Embedder | None = None,
    *,
    principal: Principal | None = None,
    recursive: bool = False,
    glob: str | None = None,
    groups: Sequence[str] = (),
    category: str | None = None,
    labels: Sequence[str] = (),
    prune: bool = False,
    progress: ProgressCallback | None = None,
    batch_documents: int = BATCH_DOCUMENTS,
    index_progress: indexing.ProgressCallback | None = None,
    contextual: bool | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    follow_symlinks: bool = False,
) -> IngestSummary:
    """Ingest files and directories. With `prune`, documents whose files under these paths are
    gone are removed (JSONL records are keyed by their ids and never pruned by path).
    Files over `max_file_bytes` (JSONL: lines) and symlinks leaving `paths` (unless
    `follow_symlinks`) are reported as failures; see kbpg.sources."""
    roots = [Path(p).expanduser() for p in paths]
    if not roots:
        raise InvalidInput("nothing to ingest", hint="give files or directories")

    items = iter_documents(
        roots,
        recursive=recursive,
        glob=glob,
        groups=groups,
        category=category,
        labels=labels,
        max_file_bytes=max_file_bytes,
        follow_symlinks=follow_symlinks,
    )
    scopes = [str(r.resolve()) for r in roots if r.exists()]

    def vanished(source: str) -> bool:
        inside = any(source == s or source.startswith(s.rstrip("/") + "/") for s in scopes)
        return inside and not Path(source).exists()

    return _ingest(
        db,
        models,
        items,
        embedder,
        principal,
        progress,
        batch_documents,
        vanished if prune else None,
        expected_chunks=_expected_chunks(roots, recursive, glob),
        index_progress=index_progress,
        contextual=contextual,
    )


def _expected_chunks(roots: Sequence[Path], recursive: bool, glob: str | None) -> int:
    """A rough count of the chunks under `roots` (a chunk holds ~1 kB of text; JSONL records
    with embeddings hold more bytes a chunk, so this errs towards a deferred index build)."""
    size = 0
    for found in discover(roots, recursive=recursive, glob=glob):
        if isinstance(found, Path):
            with contextlib.suppress(OSError):
                size += found.stat().st_size
    return size // 1000
