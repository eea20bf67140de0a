"""Hand-built knowledge bases for the SQL retrieval tests (documents, chunks, edges)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb


def vec(values: Sequence[float]) -> str:
    """A pgvector literal."""
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


def add_doc(
    conn: psycopg.Connection[Any],
    source: str,
    *,
    groups: Sequence[str] = (),
    category: str | None = None,
    labels: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
) -> int:
    row = conn.execute(
        "insert into kb.documents (source, title, category, groups, labels, metadata, content_hash)"
        " values (%s, %s, %s, %s, %s, %s, 'h') returning id",
        (source, source.upper(), category, list(groups), list(labels), Jsonb(metadata or {})),
    ).fetchone()
    assert row is not None
    return int(row[0])


def add_chunk(
    conn: psycopg.Connection[Any],
    doc: int,
    content: str,
    embedding: Sequence[float] | None = None,
    *,
    section: str = "",
) -> int:
    """A chunk carrying its document's filter columns, as ingest writes it."""
    row = conn.execute(
        "insert into kb.chunks (document_id, ordinal, section, content, groups, category, labels,"
        " embedding)"
        " select d.id, (select count(*) from kb.chunks c where c.document_id = d.id), %s, %s,"
        " d.groups, d.category, d.labels, %s::vector from kb.documents d where d.id = %s"
        " returning id",
        (section, content, None if embedding is None else vec(embedding), doc),
    ).fetchone()
    assert row is not None
    return int(row[0])


def add_edge(
    conn: psycopg.Connection[Any], src: int, dst: int, weight: float, relation: str = "link"
) -> None:
    conn.execute(
        "insert into kb.edges (src_chunk_id, dst_chunk_id, relation, weight) values (%s, %s, %s, %s)",
        (src, dst, relation, weight),
    )


def function_calls(conn: psycopg.Connection[Any], name: str) -> int:
    """Calls of kb.`name` so far in this transaction (counting them from now on, if not yet)."""
    conn.execute("set local track_functions = 'pl'")
    row = conn.execute(
        "select coalesce(sum(calls), 0) from pg_stat_xact_user_functions"
        " where schemaname = 'kb' and funcname = %s",
        (name,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def ids(rows: Sequence[Sequence[Any]], column: int = 1) -> list[int]:
    return [int(r[column]) for r in rows]


@contextlib.contextmanager
def raises_sqlstate(conn: psycopg.Connection[Any], sqlstate: str) -> Iterator[Any]:
    """Expect the block to fail with `sqlstate` (inside a savepoint, so the test goes on)."""
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        yield info
    assert info.value.sqlstate == sqlstate, info.value
