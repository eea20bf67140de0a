"""Vector index layouts (vector, halfvec, binary + exact re-rank): limits, defaults, rebuilds, plans."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import psycopg
import pytest

from tests.sqldata import add_doc, ids, raises_sqlstate, vec

DIM = 64


def executed_plans(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> str:
    """The plans of every statement `sql` ran, functions' inner statements included.

    auto_explain logs them; client_min_messages = log sends the log lines to this client as
    notices. Everything is SET LOCAL (or altered), inside the test's transaction.
    """
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    # the reader API keeps its statements' messages inside (a reader's debug_print_plan would
    # see plans made from every row's statistics): let them out, in this transaction only
    for (function,) in conn.execute(
        "select oid::regprocedure::text from pg_proc"
        " where pronamespace = 'kb'::regnamespace and prosecdef"
    ).fetchall():
        conn.execute(f"alter function {function} reset client_min_messages")
    conn.execute("load 'auto_explain'")
    for name, value in (
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_nested_statements", "on"),
        ("client_min_messages", "log"),
    ):
        conn.execute("select set_config(%s, %s, true)", (name, value))
    conn.execute(sql, params).fetchall()
    conn.execute("select set_config('client_min_messages', 'notice', true)")
    return "\n".join(notices)


def index_definition(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(
        "select indexdef from pg_indexes where indexname = 'chunks_embedding_hnsw'"
    ).fetchone()
    assert row is not None
    return str(row[0])


def layout(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("select layout from kb.embedding_space").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    ("dimension", "expected", "expression"),
    [
        (384, "halfvec", "(embedding)::halfvec(384)) halfvec_cosine_ops"),
        (3072, "halfvec", "(embedding)::halfvec(3072)) halfvec_cosine_ops"),
        (4096, "binary", "(binary_quantize(embedding))::bit(4096)) bit_hamming_ops"),
    ],
)
def test_new_space_gets_the_default_layout_for_its_dimension(conn, dimension, expected, expression):
    conn.execute("select kb.set_embedding_space('m', %s)", (dimension,))
    assert layout(conn) == expected
    assert expression in index_definition(conn)
    assert conn.execute("select kb.default_vector_layout(%s)", (dimension,)).fetchone() == (
        expected,
    )


def test_layout_limits_are_refused_with_hints(conn):
    cases = [
        ("select kb.set_embedding_space('m', 2001, 'vector')", "at most 2,000", "halfvec"),
        ("select kb.set_embedding_space('m', 4001, 'halfvec')", "at most 4,000", "binary"),
        ("select kb.set_embedding_space('m', 16001)", "out of range", "16,000"),
        ("select kb.set_embedding_space('m', 8, 'pq')", "unknown vector index layout", "halfvec"),
    ]
    for sql, message, hint in cases:
        with raises_sqlstate(conn, "22023") as info:
            conn.execute(sql)
        assert message in info.value.diag.message_primary
        assert hint in info.value.diag.message_hint
    with raises_sqlstate(conn, "KB002"):
        conn.execute("select kb.set_embedding_layout('binary')")
    conn.execute("select kb.set_embedding_space('m', 3000)")
    with raises_sqlstate(conn, "22023"):
        conn.execute("select kb.set_embedding_layout('vector')")
    assert layout(conn) == "halfvec"  # a refused change leaves the index as it was
    assert "halfvec_cosine_ops" in index_definition(conn)


@pytest.fixture
def corpus(conn: psycopg.Connection[Any]) -> tuple[np.ndarray, list[int]]:
    """2,000 random 64-d vectors in 20 documents, space created with the vector layout."""
    conn.execute("select kb.set_embedding_space('m', %s, 'vector')", (DIM,))
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(2000, DIM))
    docs = [add_doc(conn, f"d{i}", groups=["rare" if i == 0 else "common"]) for i in range(20)]
    with (
        conn.cursor() as cur,
        cur.copy(
            "copy kb_data.chunks (document_id, ordinal, content, groups, embedding) from stdin"
        ) as copy,
    ):
        for i, v in enumerate(vectors):
            doc = docs[i % 20]
            copy.write_row(
                (doc, i // 20, f"chunk {i}", ["rare" if i % 20 == 0 else "common"], vec(v))
            )
    chunk_ids = [r[0] for r in conn.execute("select id from kb.chunks order by id")]
    conn.execute("analyze kb.chunks")
    return vectors, chunk_ids


def exact(
    vectors: np.ndarray, chunk_ids: list[int], query: np.ndarray, k: int
) -> list[tuple[int, float]]:
    sims = vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    order = np.argsort(-sims)[:k]
    return [(chunk_ids[i], float(sims[i])) for i in order]


@pytest.mark.parametrize("chosen", ["vector", "halfvec", "binary"])
def test_every_layout_uses_its_index_and_returns_exact_similarities(conn, corpus, chosen):
    vectors, chunk_ids = corpus
    conn.execute("select kb.set_embedding_layout(%s)", (chosen,))
    assert layout(conn) == chosen
    conn.execute("select set_config('enable_seqscan', 'off', true)")
    query = np.random.default_rng(9).normal(size=DIM)
    sql = "select chunk_id, similarity from kb.search_vector(%s::vector, 10, min_similarity => -1)"
    plans = executed_plans(conn, sql, (vec(query),))
    assert "Index Scan using chunks_embedding_hnsw" in plans
    # the index scan's order: the layout's expression and operator (names qualified or not)
    order_by = {
        "vector": r"Order By: \(\(embedding\)::\w+\.vector\(64\) OPERATOR\(\w+\.<=>\)",
        "halfvec": r"Order By: \(\(embedding\)::\w+\.halfvec\(64\) OPERATOR\(\w+\.<=>\)",
        "binary": r"Order By: \(\(\w+\.binary_quantize\(embedding\)\)::bit\(64\) OPERATOR\(\w+\.<~>\)",
    }
    assert re.search(order_by[chosen], plans), plans[:2000]
    rows = conn.execute(sql, (vec(query),)).fetchall()
    truth = exact(vectors, chunk_ids, query, 10)
    # each returned similarity is the exact cosine (the index only picks the candidates)
    sims = {cid: sim for cid, sim in exact(vectors, chunk_ids, query, 2000)}
    for cid, sim in rows:
        assert sim == pytest.approx(sims[cid], abs=1e-5)
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    found = {r[0] for r in rows}
    # 64 sign bits are a coarse guide (test_binary_rerank_factor_widens_the_candidates)
    assert len(found & {cid for cid, _ in truth}) >= (9 if chosen != "binary" else 5)


def test_binary_rerank_factor_widens_the_candidates(conn, corpus):
    vectors, chunk_ids = corpus
    conn.execute("select kb.set_embedding_layout('binary')")
    rng = np.random.default_rng(4)
    queries = rng.normal(size=(10, DIM))

    def overlap(factor: int) -> int:
        conn.execute("select set_config('kb.vector_rerank_factor', %s, true)", (str(factor),))
        total = 0
        for q in queries:
            rows = conn.execute(
                "select chunk_id from kb.search_vector(%s::vector, 10, min_similarity => -1)",
                (vec(q),),
            ).fetchall()
            total += len({r[0] for r in rows} & {c for c, _ in exact(vectors, chunk_ids, q, 10)})
        return total

    # 64 sign bits are a coarse guide: 1 candidate a slot finds few of the true top 10
    assert overlap(1) < overlap(20)
    assert overlap(20) >= 75


def test_binary_reranks_16_times_the_pool_by_default(conn, corpus):
    """At 200k chunks of 4,096-d 8x the pool recalled .935 of the true top 32, 16x 1.000
    (docs/scaling.md section 1)."""
    conn.execute("select kb.set_embedding_layout('binary')")
    queries = [vec(q) for q in np.random.default_rng(8).normal(size=(10, DIM))]

    def results(factor: str) -> list[list[int]]:
        conn.execute("select set_config('kb.vector_rerank_factor', %s, true)", (factor,))
        return [
            ids(conn.execute("select * from kb.search_vector(%s::vector, 10)", (q,)).fetchall())
            for q in queries
        ]

    assert results("") == results("16") != results("8")  # "": the default


def test_relayout_keeps_filters_and_extra_embeddings(conn, corpus):
    vectors, chunk_ids = corpus
    rng = np.random.default_rng(6)
    q, extra = rng.normal(size=DIM), rng.normal(size=DIM)
    sql = (
        "select chunk_id from kb.search_vector(%s::vector, 5, groups => %s, min_similarity => -1,"
        " extra_embeddings => array[%s::vector])"
    )
    results = {}
    for chosen in ("vector", "halfvec", "binary"):
        conn.execute("select kb.set_embedding_layout(%s)", (chosen,))
        results[chosen] = [r[0] for r in conn.execute(sql, (vec(q), ["rare"], vec(extra)))]
    # 100 rare chunks: under the exact-path crossover, so every layout is exact here
    rare = [cid for i, cid in enumerate(chunk_ids) if i % 20 == 0]
    keep = np.array([i % 20 == 0 for i in range(len(chunk_ids))])
    best = np.maximum(
        vectors[keep] @ q / (np.linalg.norm(vectors[keep], axis=1) * np.linalg.norm(q)),
        vectors[keep] @ extra / (np.linalg.norm(vectors[keep], axis=1) * np.linalg.norm(extra)),
    )
    expected = [rare[i] for i in np.argsort(-best)[:5]]
    assert results == {"vector": expected, "halfvec": expected, "binary": expected}
    assert conn.execute(
        "select count(*) from pg_indexes where schemaname = 'kb_data'"
        " and indexname like 'chunks_embedding_hnsw%%'"
    ).fetchone() == (1,)
