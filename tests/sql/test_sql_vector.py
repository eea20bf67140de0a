"""kb.search_vector: cosine top-k with filters inside the HNSW scan, on hand-built vectors."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, ids, raises_sqlstate, vec


def vector_search(
    conn: psycopg.Connection[Any], embedding: Any, k: int = 8, **kw: Any
) -> list[Any]:
    args = "".join(f", {name} => %({name})s" for name in kw)
    return conn.execute(
        "select rank, chunk_id, document_id, score, similarity"
        f" from kb.search_vector(%(e)s::vector, %(k)s{args})",
        {"e": embedding if embedding is None else vec(embedding), "k": k, **kw},
    ).fetchall()


@pytest.fixture
def space3(conn: psycopg.Connection[Any]) -> None:
    conn.execute("select kb.set_embedding_space('test-model', 3)")


def test_ranked_by_cosine_with_similarity_floor(conn, space3):
    doc = add_doc(conn, "v")
    a = add_chunk(conn, doc, "a", [1, 0, 0])
    b = add_chunk(conn, doc, "b", [1, 1, 0])  # cos 0.7071
    c = add_chunk(conn, doc, "c", [1, 0, 1.5])  # cos 0.5547
    add_chunk(conn, doc, "d", [0, 1, 0])  # cos 0: under the floor
    add_chunk(conn, doc, "no vector")
    rows = vector_search(conn, [2, 0, 0])
    assert ids(rows) == [a, b, c]
    assert [r[0] for r in rows] == [1, 2, 3]
    assert rows[1][3] == pytest.approx(1 / 2**0.5, abs=1e-6)
    assert rows[1][3] == rows[1][4]
    assert ids(vector_search(conn, [2, 0, 0], min_similarity=0.6)) == [a, b]
    assert ids(vector_search(conn, [2, 0, 0], k=1)) == [a]
    assert len(vector_search(conn, [2, 0, 0], min_similarity=-1)) == 4


def test_null_embedding_returns_nothing(conn, space3):
    add_chunk(conn, add_doc(conn, "v"), "a", [1, 0, 0])
    assert vector_search(conn, None) == []


def test_a_tie_at_the_cut_goes_to_the_lower_id(conn, space3):
    # a duplicated text's vectors tie at the cut of a top 2: the lower id is kept, whichever of
    # the two the scan meets first (LIMIT kept the first met; one server and a cluster differed)
    doc = add_doc(conn, "v")
    a = add_chunk(conn, doc, "a", [1, 0, 0])
    low = add_chunk(conn, doc, "b", [1, 1, 0])
    high = add_chunk(conn, doc, "c", [1, 1, 0])
    # the lower id's row rewritten: a sequential scan now meets the higher id first
    conn.execute("update kb.chunks set section = 'moved' where id = %s", (low,))
    conn.execute("select set_config('enable_indexscan', 'off', true)")
    assert ids(vector_search(conn, [1, 0, 0], k=2)) == [a, low]
    assert ids(vector_search(conn, [1, 0, 0], k=3)) == [a, low, high]


def test_errors(conn, space3):
    with raises_sqlstate(conn, "KB001") as wrong_dim:
        vector_search(conn, [1, 0])
    assert wrong_dim.value.diag.message_hint
    for k in (0, 1001):
        with raises_sqlstate(conn, "22023"):
            vector_search(conn, [1, 0, 0], k=k)
    with raises_sqlstate(conn, "22023"):
        vector_search(conn, [1, 0, 0], min_similarity=1.5)


def test_no_embedding_space_is_an_error(conn):
    with raises_sqlstate(conn, "KB002") as info:
        vector_search(conn, [1, 0, 0])
    assert info.value.diag.message_hint


@pytest.fixture
def random_corpus(conn: psycopg.Connection[Any]) -> tuple[np.ndarray, list[int], set[int]]:
    """4,000 random 8-d vectors; 1% of them (40) in group 'rare'."""
    conn.execute("select kb.set_embedding_space('test-model', 8, 'vector')")
    rng = random.Random(11)
    common = add_doc(conn, "common", groups=["common"])
    rare = add_doc(conn, "rare", groups=["rare"])
    vectors = np.array([[rng.gauss(0, 1) for _ in range(8)] for _ in range(4000)])
    chunk_ids: list[int] = []
    rare_ids: set[int] = set()
    with conn.cursor() as cur:
        for i, v in enumerate(vectors):
            doc = rare if i % 100 == 0 else common
            cid = add_chunk(conn, doc, f"chunk {i}", list(v))
            chunk_ids.append(cid)
            if doc == rare:
                rare_ids.add(cid)
        cur.execute("analyze kb.chunks")
    return vectors, chunk_ids, rare_ids


def brute_force(
    vectors: np.ndarray, chunk_ids: list[int], query: np.ndarray, keep: set[int] | None, k: int
) -> list[int]:
    sims = vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    order = np.argsort(-sims)
    out = [chunk_ids[i] for i in order if keep is None or chunk_ids[i] in keep]
    return out[:k]


@pytest.mark.parametrize("path", ["exact", "hnsw"])
def test_selective_filter_still_fills_top_k(conn, random_corpus, path):
    vectors, chunk_ids, rare_ids = random_corpus
    # 40 matching rows: under the crossover the exact path runs; 0 forces the HNSW scan
    conn.execute(
        "select set_config('kb.vector_exact_limit', %s, true)", ("0" if path == "hnsw" else "",)
    )
    if path == "hnsw":  # leave the planner no way around the index: filtering inside the scan
        conn.execute("select set_config('enable_seqscan', 'off', true)")
        conn.execute("select set_config('enable_bitmapscan', 'off', true)")
        plan = conn.execute(
            "explain select id from kb_data.chunks where groups && '{rare}' and embedding is not null"
            " order by embedding::vector(8) <=> %s::vector(8) limit 10",
            (vec([1.0] * 8),),
        ).fetchall()
        assert "chunks_embedding_hnsw" in " ".join(r[0] for r in plan)
    rng = np.random.default_rng(5)
    for _ in range(5):
        query = rng.normal(size=8)
        rows = vector_search(conn, list(query), k=10, groups=["rare"], min_similarity=-1)
        expected = brute_force(vectors, chunk_ids, query, rare_ids, 10)
        assert len(rows) == 10
        assert set(ids(rows)) <= rare_ids
        if path == "exact":
            assert ids(rows) == expected
        else:  # approximate index: a full top-k, nearly all of the true one
            assert len(set(ids(rows)) & set(expected)) >= 9


def test_exact_path_ranks_by_the_best_similarity_to_several_embeddings(conn, random_corpus):
    # the filtered rows are read once and each ranked by its nearest query embedding
    vectors, chunk_ids, rare_ids = random_corpus
    rng = np.random.default_rng(8)
    queries = [rng.normal(size=8) for _ in range(3)]
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    best = np.max([unit @ (q / np.linalg.norm(q)) for q in queries], axis=0)
    expected = [chunk_ids[i] for i in np.argsort(-best) if chunk_ids[i] in rare_ids][:10]
    rows = conn.execute(
        "select chunk_id, similarity from kb.search_vector(%s::vector, 10, groups => '{rare}',"
        " min_similarity => -1, extra_embeddings => %s::vector[])",
        (vec(queries[0]), [vec(q) for q in queries[1:]]),
    ).fetchall()
    assert [r[0] for r in rows] == expected
    assert [r[1] for r in rows] == pytest.approx(
        sorted(best[[chunk_ids.index(c) for c in expected]], reverse=True), abs=1e-6
    )


def test_pool_larger_than_default_ef_search_is_not_truncated(conn, random_corpus):
    vectors, chunk_ids, _ = random_corpus
    before = conn.execute("select current_setting('hnsw.ef_search')").fetchone()
    query = np.ones(8)
    rows = vector_search(conn, list(query), k=80, min_similarity=-1)
    assert len(rows) == 80
    expected = brute_force(vectors, chunk_ids, query, None, 80)
    assert len(set(ids(rows)) & set(expected)) >= 76
    # the function's knobs do not leak into the session
    assert conn.execute("select current_setting('hnsw.ef_search')").fetchone() == before


def test_another_model_is_refused_with_kb001(conn, space3):
    with raises_sqlstate(conn, "KB001") as info:
        conn.execute("select kb.set_embedding_space('other-model', 3)")
    assert "kbpg reembed" in info.value.diag.message_hint
    conn.execute("select kb.set_embedding_space('test-model', 3)")  # the same space: no-op


def hnsw_scans(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "select pg_stat_get_xact_numscans('kb_data.chunks_embedding_hnsw'::regclass)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_scan_short_of_the_floor_scans_once_more(conn, random_corpus):
    # a search stranded in the wrong region of the graph comes back with its pool under the
    # similarity floor: without a filter, the arm scans again at ef_search 1000; a pool filled
    # above the floor, or a filter (which may explain the shortfall), scans once
    vectors, chunk_ids, _ = random_corpus
    conn.execute("select set_config('enable_seqscan', 'off', true)")
    conn.execute("select set_config('enable_bitmapscan', 'off', true)")
    conn.execute("select set_config('kb.vector_exact_limit', '0', true)")
    query = np.random.default_rng(3).normal(size=8)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ (query / np.linalg.norm(query))

    def scans(**kw: Any) -> tuple[list[int], int]:
        before = hnsw_scans(conn)
        rows = vector_search(conn, list(query), k=10, **kw)
        return ids(rows), hnsw_scans(conn) - before

    found, n = scans()
    assert len(found) == 10 and n == 1
    floor = float(np.sort(sims)[-4])  # 4 chunks at or above it
    found, n = scans(min_similarity=floor - 1e-6)
    assert n == 2
    assert found == [chunk_ids[i] for i in np.argsort(-sims)[:4]]
    found, n = scans(min_similarity=floor - 1e-6, groups=["common", "rare"])
    assert n == 1
    assert len(found) <= 4
