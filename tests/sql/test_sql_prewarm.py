"""kb.prewarm: kbpg's relations into memory after a start, most used first, within a budget."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, raises_sqlstate


@pytest.fixture
def small_kb(conn: psycopg.Connection[Any]) -> None:
    """A few chunks with embeddings (an HNSW index) and a BM25 impact cache."""
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    doc = add_doc(conn, "d")
    for i in range(50):
        add_chunk(conn, doc, f"permit parking renewal number {i}", [1, i / 50, 0.5])
    conn.execute("select kb.refresh_lexical_index()")


def available(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "select exists (select 1 from pg_available_extensions where name = 'pg_prewarm')"
    ).fetchone()
    return bool(row and row[0])


def test_without_pg_prewarm_it_says_what_to_install(conn, small_kb):
    with raises_sqlstate(conn, "55000") as info:
        conn.execute("select * from kb.prewarm()")
    hint = info.value.diag.message_hint or ""
    assert ("CREATE EXTENSION pg_prewarm" if available(conn) else "contrib") in hint


def test_the_index_and_cache_first_the_chunks_last(conn, small_kb):
    if not available(conn):
        pytest.skip("this server has no pg_prewarm")
    conn.execute("create extension pg_prewarm")  # rolled back with the test's transaction
    rows = conn.execute("select relation, mode, bytes from kb.prewarm()").fetchall()
    names = [r[0] for r in rows]
    assert names[0] == "kb_data.chunks_embedding_hnsw"
    assert {r[1] for r in rows} == {"buffer"}  # a few pages: all fit in shared buffers
    cache = [i for i, n in enumerate(names) if n.startswith("kb_data.lexical_blocks")]
    # the cache before other indexes
    assert cache and max(cache) < names.index("kb_data.chunks_pkey")
    assert names[-1] in ("kb_data.chunks", "kb_data.documents") or names[-1].startswith("pg_toast.")
    assert names.index("kb_data.chunks") > names.index(
        "kb_data.documents"
    )  # the biggest table last
    assert all(r[2] > 0 for r in rows)


def test_what_does_not_fit_the_budget_goes_to_the_os_cache(conn, small_kb):
    if not available(conn):
        pytest.skip("this server has no pg_prewarm")
    conn.execute("create extension pg_prewarm")
    # a budget of exactly the HNSW index's pages: it alone goes into shared buffers
    row = conn.execute(
        "select pg_relation_size('kb_data.chunks_embedding_hnsw')::float8"
        " / pg_size_bytes(current_setting('shared_buffers'))"
    ).fetchone()
    assert row is not None
    rows = conn.execute("select relation, mode from kb.prewarm(%s)", (row[0],)).fetchall()
    assert rows[0] == ("kb_data.chunks_embedding_hnsw", "buffer")
    assert {mode for _, mode in rows[1:]} == {"read"}
    assert {mode for _, mode in conn.execute("select relation, mode from kb.prewarm(0)")} == {
        "read"
    }
    for share in (-0.1, 1.5, None):
        with raises_sqlstate(conn, "22023"):
            conn.execute("select * from kb.prewarm(%s)", (share,))
