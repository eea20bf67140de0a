"""kbpg's writers (ingest, delete, reembed, recontextualize): one write lock, staged COPY."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from kbpg.errors import Busy
from kbpg.ingest.prepare import PreparedDocument, entities_of
from kbpg.ingest.sources import printable
from kbpg.store import db as kdb
from kbpg.store import queries
from kbpg.store.copyformat import binary_text_array, binary_vectors, text_array, use_encoded
from kbpg.store.sessions import Connection, Database, Principal

_log = logging.getLogger("kbpg.ingest")

# Serialises kbpg writers (ingest, delete, reembed) on one database.
WRITE_LOCK_KEY = 0x6B627067  # "kbpg"
# Reading order is a weaker relation than an explicit link (kbpg.entities.WEIGHT_LINK).
WEIGHT_NEXT = 0.8


@contextlib.contextmanager
def copy_rows(cur: Any, copy_sql: str, staged: bool) -> Iterator[Any]:
    """COPY rows in; `staged` (row-level security applies): through a temporary table."""
    if not staged:
        with cur.copy(copy_sql) as copy:
            yield copy
        return
    create, copy_stage, insert, drop = queries.staged_copy(copy_sql)
    cur.execute(create)
    with cur.copy(copy_stage) as copy:
        yield copy
    cur.execute(insert)
    cur.execute(drop)


def copy_chunk_rows(
    copy: Any, parts: list[tuple[PreparedDocument, int, int]], vectors: np.ndarray[Any, Any]
) -> None:
    """Rows for COPY_CHUNKS: chunks `start:stop` of each part, `vectors` row by row (vectors and
    filter arrays encoded in bulk, kbpg.copyformat)."""
    use_encoded(copy, ("vector", "text[]"))
    copy.set_types(queries.CHUNK_TYPES)
    encoding = copy.connection.info.encoding
    encoded = binary_vectors(vectors)
    row = 0
    for p, start, stop in parts:
        d = p.document
        groups = binary_text_array(sorted(set(d.groups)), encoding)
        labels = binary_text_array(sorted(set(d.labels)), encoding)
        for i in range(start, stop):
            chunk = p.chunks[i]
            copy.write_row(
                (
                    p.chunk_ids[i],
                    p.document_id,
                    chunk.ordinal,
                    chunk.section,
                    chunk.content,
                    groups,
                    d.category,
                    labels,
                    encoded[row],
                    p.contexts[i] if p.contexts else None,
                    p.context_keys[i] if p.context_keys else None,
                )
            )
            row += 1


def write_documents(conn: Connection, prepared: list[PreparedDocument], staged: bool) -> None:
    """The documents' rows: changed ones updated (their old chunks deleted), new ones added with
    the ids taken for them (kbpg.batching)."""
    updated = [p for p in prepared if not p.is_new]
    new = [p for p in prepared if p.is_new]
    if updated:
        # cascades to the chunks' edges, links and entities
        conn.execute(queries.DELETE_CHUNKS_OF, ([p.document_id for p in updated],))
        with conn.cursor() as cur:
            cur.executemany(
                queries.UPDATE_DOCUMENT,
                [
                    (
                        p.document.title,
                        p.document.category,
                        list(p.document.groups),
                        list(p.document.labels),
                        Jsonb(dict(p.document.metadata)),
                        p.digest,
                        p.document_id,
                    )
                    for p in updated
                ],
            )
    if new:
        encoding = conn.info.encoding
        with conn.cursor() as cur, copy_rows(cur, queries.COPY_DOCUMENTS, staged) as copy:
            for p in new:
                d = p.document
                copy.write_row(
                    (
                        p.document_id,
                        d.source,
                        d.title,
                        d.category,
                        text_array(d.groups, encoding),
                        text_array(d.labels, encoding),
                        Jsonb(dict(d.metadata)) if d.metadata else "{}",
                        p.digest,
                    )
                )


def write_relations(
    conn: Connection, parts: list[tuple[PreparedDocument, int, int]], staged: bool
) -> int:
    """The `next` edges of chunks `start:stop` of each part (from the chunk before `start` too),
    and their links and entities; returns the number of edges. A COPY with no rows is skipped."""
    edges = [
        (src, dst, "next", WEIGHT_NEXT, p.document_id)
        for p, start, stop in parts
        for src, dst in itertools.pairwise(p.chunk_ids[max(start - 1, 0) : stop])
    ]
    links = [
        (p.chunk_ids[ordinal], target, fragment, p.document_id)
        for p, start, stop in parts
        for ordinal, target, fragment in p.links
        if start <= ordinal < stop
    ]
    entities = [
        (entity, p.chunk_ids[ordinal], p.document_id)
        for p, start, stop in parts
        for ordinal, entity in entities_of(p, start, stop)
    ]
    with conn.cursor() as cur:
        if edges:
            with copy_rows(cur, queries.COPY_EDGES, staged) as copy:
                for edge in edges:
                    copy.write_row(edge)
        for copy_sql, rows in ((queries.COPY_LINKS, links), (queries.COPY_ENTITIES, entities)):
            if rows:
                with cur.copy(copy_sql) as copy:
                    for found in rows:
                        copy.write_row(found)
    return len(edges)


@contextlib.contextmanager
def writer(db: Database, principal: Principal | None = None) -> Iterator[Connection]:
    """A connection holding kbpg's write lock until the block ends (or the session dies).

    The lock is taken outside any transaction, so that a second writer waits for the whole
    job, not for kbpg's lock_timeout. Work on the connection goes through db.transaction().
    """
    with db.connection(write=True) as conn:
        with db.transaction(conn, principal, write=True):
            kdb.require_schema(conn)
        _wait_for_write_lock(conn, db.settings.write_lock_wait_ms)
        try:
            yield conn
        finally:
            _release_write_lock(conn)


def _release_write_lock(conn: Connection) -> None:
    """Unlock, or close a connection left mid-transaction: the server then drops the lock
    (a pooled connection must never go back to the pool still holding it)."""
    if conn.closed:
        return
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            raise psycopg.InterfaceError("connection left inside a transaction")
        conn.execute(queries.WRITE_UNLOCK, (WRITE_LOCK_KEY,))
    except psycopg.Error:
        conn.close()


def lock_transaction(conn: Connection, wait_ms: int) -> None:
    """Take kbpg's write lock for the open transaction only: a writer that works batch by batch
    (kbpg sync) then interleaves with an ingest job between its batches. Waits up to `wait_ms`
    for the holder (Busy after that); the transaction's own lock_timeout applies again after."""
    row = conn.execute(queries.WRITE_XACT_TRY_LOCK, (WRITE_LOCK_KEY,)).fetchone()
    if row is not None and row[0]:
        return
    _log.info("waiting up to %.0f s for kbpg's write lock", wait_ms / 1000)
    try:
        saved = conn.execute(queries.LOCK_TIMEOUT).fetchone()
        conn.execute(queries.WRITE_LOCK_WAIT, (f"{max(wait_ms, 1)}ms",))
        conn.execute(queries.WRITE_XACT_LOCK, (WRITE_LOCK_KEY,))
        conn.execute(queries.SET_LOCAL, ("lock_timeout", saved[0] if saved else "0"))
    except psycopg.errors.LockNotAvailable:
        raise Busy(
            f"another kbpg writer held kbpg's write lock for {wait_ms / 1000:g} s",
            hint="let it finish, or wait longer with --lock-wait (KBPG_WRITE_LOCK_WAIT)",
        ) from None


def _wait_for_write_lock(conn: Connection, wait_ms: int) -> None:
    """Take the write lock; while another writer holds it say so (on stderr through logging)
    and give up after `wait_ms` (KBPG_WRITE_LOCK_WAIT, `kbpg ingest --lock-wait`)."""
    row = conn.execute(queries.WRITE_TRY_LOCK, (WRITE_LOCK_KEY,)).fetchone()
    if row is not None and row[0]:
        return
    holder = conn.execute(queries.WRITE_LOCK_HOLDER, (WRITE_LOCK_KEY,)).fetchone()
    who = "another kbpg writer"
    if holder is not None:
        pid, app, since = holder
        who += f" (PostgreSQL backend pid {pid}"
        who += f", application {printable(app)!r}" if app else ""
        who += f", connected since {since:%Y-%m-%d %H:%M:%S %Z}" if since else ""
        who += ")"
    waited = f"{wait_ms / 1000:g} s"
    busy = Busy(
        f"{who} holds kbpg's write lock; gave up after waiting {waited}",
        hint="let it finish, or wait longer with --lock-wait (KBPG_WRITE_LOCK_WAIT), e.g. 10min",
    )
    if wait_ms <= 0:
        raise busy
    _log.warning("waiting up to %s for the write lock held by %s", waited, who)
    try:
        with conn.transaction():
            conn.execute(queries.WRITE_LOCK_WAIT, (f"{wait_ms}ms",))
            conn.execute(queries.WRITE_LOCK, (WRITE_LOCK_KEY,))
    except psycopg.errors.LockNotAvailable:
        raise busy from None
