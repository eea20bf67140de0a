"""Table sources: application tables whose rows kbpg keeps as documents, over kb.*_table_source."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from kbpg.errors import NotFound, PermissionDenied
from kbpg.store import db as kdb
from kbpg.store import queries
from kbpg.store.sessions import Connection, Database, Principal


@dataclass(frozen=True)
class TableSource:
    """One source as kb.list_table_sources() reports it."""

    name: str
    table: str
    key_columns: list[str]
    text_column: str
    title_column: str | None
    groups_column: str | None
    category_column: str | None
    labels_column: str | None
    metadata_columns: list[str]
    notify: bool
    version: int
    created_at: datetime
    altered_at: datetime
    queued: int
    claimed: int
    errors: int
    oldest_queued_at: datetime | None
    backfill_state: str
    backfill_enqueued: int
    backfill_total: int | None
    backfill_done_at: datetime | None
    documents: int

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name, value in data.items():
            if isinstance(value, datetime):
                data[name] = value.isoformat()
        return data


@dataclass(frozen=True)
class SourceChange:
    """What adding or altering a source did: its table, key and the triggers now on the table;
    `warnings`: what the worker will lack (a grant, rows hidden by row-level security)."""

    name: str
    table: str
    key_columns: list[str]
    triggers: list[str]
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SourceRemoval:
    name: str
    documents_deleted: int
    triggers_left: list[str]
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextlib.contextmanager
def _as_writer(conn: Connection) -> Iterator[None]:
    """A role without kbpg's writer role fails on kbpg's tables before any check of the source:
    say which role it needs (a refusal of kbpg's own names its grant already)."""
    hint = (
        "table sources are kbpg's writer role's to define: grant kbpg_writer (or the writer "
        f"role kb.access_setup named) to {conn.info.user};"
    )
    try:
        yield
    except PermissionDenied as exc:  # reading kbpg's schema version (kbpg.store.db)
        raise PermissionDenied(exc.message, hint=hint) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        if exc.diag.message_hint:
            raise
        raise PermissionDenied(exc.diag.message_primary or str(exc), hint=hint) from None


@contextlib.contextmanager
def _warnings(conn: Connection) -> Iterator[list[str]]:
    """The WARNINGs the statements in the block raise, each with its hint."""
    found: list[str] = []

    def keep(diag: Any) -> None:
        if diag.severity_nonlocalized == "WARNING" and diag.message_primary:
            hint = f" (hint: {diag.message_hint})" if diag.message_hint else ""
            found.append(diag.message_primary + hint)

    conn.add_notice_handler(keep)
    try:
        yield found
    finally:
        conn.remove_notice_handler(keep)


@dataclass(frozen=True)
class SourceError:
    """A row that could not be ingested, parked until its next try."""

    source: str
    key: list[str]
    document: str
    error: str
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime
    retry_at: datetime

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("first_failed_at", "last_failed_at", "retry_at"):
            data[name] = data[name].isoformat()
        return data


def _metadata(columns: Sequence[str] | None) -> list[str] | None:
    return None if columns is None else [c.strip() for c in columns if c.strip()]


def add(
    db: Database,
    name: str,
    table: str,
    *,
    text: str,
    id: str | None = None,
    title: str | None = None,
    groups: str | None = None,
    category: str | None = None,
    labels: str | None = None,
    metadata: Sequence[str] = (),
    notify: bool = True,
    principal: Principal | None = None,
) -> SourceChange:
    """Define a source (kb.add_table_source): columns checked, triggers created on `table`."""
    params = {
        "name": name,
        "table": table,
        "id": id,
        "text": text,
        "title": title,
        "groups": groups,
        "category": category,
        "labels": labels,
        "metadata": _metadata(metadata) or [],
        "notify": notify,
    }
    with db.session(principal, write=True) as conn, _warnings(conn) as warned, _as_writer(conn):
        kdb.require_schema(conn)
        row = conn.execute(queries.SOURCE_ADD, params).fetchone()
    assert row is not None
    return SourceChange(row[0], row[1], list(row[2]), list(row[3]), warned)


def alter(
    db: Database,
    name: str,
    *,
    text: str | None = None,
    title: str | None = None,
    groups: str | None = None,
    category: str | None = None,
    labels: str | None = None,
    metadata: Sequence[str] | None = None,
    notify: bool | None = None,
    principal: Principal | None = None,
) -> SourceChange:
    """Change a source's columns (None keeps one, "" clears an optional one); every row is read
    again by the next sync."""
    params = {
        "name": name,
        "text": text,
        "title": title,
        "groups": groups,
        "category": category,
        "labels": labels,
        "metadata": _metadata(metadata),
        "notify": notify,
    }
    with db.session(principal, write=True) as conn, _warnings(conn) as warned, _as_writer(conn):
        kdb.require_schema(conn)
        row = conn.execute(queries.SOURCE_ALTER, params).fetchone()
    assert row is not None
    return SourceChange(row[0], row[1], list(row[2]), list(row[3]), warned)


def remove(
    db: Database, name: str, *, drop_documents: bool = False, principal: Principal | None = None
) -> SourceRemoval:
    """Drop a source's triggers, queue and parked rows (and, asked to, its documents)."""
    with db.session(principal, write=True) as conn, _warnings(conn) as warned, _as_writer(conn):
        kdb.require_schema(conn)
        row = conn.execute(queries.SOURCE_REMOVE, {"name": name, "drop": drop_documents}).fetchone()
    assert row is not None
    return SourceRemoval(row[0], int(row[1]), list(row[2]), warned)


def resync(db: Database, name: str, *, principal: Principal | None = None) -> None:
    """Have the next sync read every row again and delete the documents of rows that are gone."""
    with db.session(principal, write=True) as conn:
        kdb.require_schema(conn)
        conn.execute(queries.SOURCE_RESYNC, {"name": name})


def list_sources(
    db: Database, name: str | None = None, *, principal: Principal | None = None
) -> list[TableSource]:
    """Every source (or the one named), with its queue, parked rows, backfill and documents."""
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(queries.SOURCE_LIST, {"name": name}).fetchall()
    return [
        TableSource(
            name=r[0],
            table=r[1],
            key_columns=list(r[2]),
            text_column=r[3],
            title_column=r[4],
            groups_column=r[5],
            category_column=r[6],
            labels_column=r[7],
            metadata_columns=list(r[8]),
            notify=bool(r[9]),
            version=int(r[10]),
            created_at=r[11],
            altered_at=r[12],
            queued=int(r[13]),
            claimed=int(r[14]),
            errors=int(r[15]),
            oldest_queued_at=r[16],
            backfill_state=r[17],
            backfill_enqueued=int(r[18]),
            backfill_total=None if r[19] is None else int(r[19]),
            backfill_done_at=r[20],
            documents=int(r[21]),
        )
        for r in rows
    ]


def show(db: Database, name: str, *, principal: Principal | None = None) -> TableSource:
    found = list_sources(db, name, principal=principal)
    if not found:
        raise NotFound(f'no table source named "{name}"', hint="kbpg sources list shows them")
    return found[0]


def errors(
    db: Database, name: str | None = None, *, principal: Principal | None = None
) -> list[SourceError]:
    """The parked rows (of one source): why, how often, when they are tried again."""
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(queries.SOURCE_ERRORS, {"name": name}).fetchall()
    return [SourceError(r[0], list(r[1]), r[2], r[3], int(r[4]), r[5], r[6], r[7]) for r in rows]


def retry(db: Database, name: str | None = None, *, principal: Principal | None = None) -> int:
    """Queue every parked row (of one source) for a try now; how many."""
    with db.session(principal, write=True) as conn:
        kdb.require_schema(conn)
        row = conn.execute(queries.SOURCE_RETRY, {"name": name}).fetchone()
    return int(row[0]) if row else 0
