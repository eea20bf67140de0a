"""kb.search for the optional stages: the fused pool for a reranker, several query embeddings."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sql.test_sql_search import search
from tests.sqldata import add_chunk, add_doc, raises_sqlstate, vec


@pytest.fixture
def many(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Doc `big` has 5 chunks matching "permit" best; 25 one-chunk docs match it too."""
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    big = add_doc(conn, "big.md")
    big_chunks = [add_chunk(conn, big, "permit permit", [1, 0, 0]) for _ in range(5)]
    small = []
    for i in range(25):
        doc = add_doc(conn, f"small{i:02}.md")
        small.append(add_chunk(conn, doc, f"permit office number {i} of the city", [0, 1, 0]))
    return {"big": big, "big_chunks": big_chunks, "small": small}


def test_plain_search_reports_the_fused_rank_before_the_cap(conn, many):
    rows = search(conn, "permit", match_count=5)
    assert [r["chunk_id"] for r in rows] == [*many["big_chunks"][:3], *many["small"][:2]]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    # the big doc's 4th and 5th chunks (fused 4, 5) went to the tail: smalls moved up
    assert [r["fused_rank"] for r in rows] == [1, 2, 3, 6, 7]


def test_rerank_pool_is_uncut_uncapped_and_in_fused_order(conn, many):
    rows = search(conn, "permit", match_count=5, rerank_pool=20)
    # the lexical arm fetched max(20, 5) = 20 candidates; nothing capped, nothing cut
    assert len(rows) == 20
    assert [r["chunk_id"] for r in rows[:5]] == many["big_chunks"]
    assert [r["rank"] for r in rows] == list(range(1, 21))
    assert [r["fused_rank"] for r in rows] == list(range(1, 21))
    assert [r["lexical_rank"] for r in rows] == list(range(1, 21))
    # a pool smaller than match_count widens to match_count
    assert len(search(conn, "permit", match_count=12, rerank_pool=3)) == 12


def test_rerank_pool_then_cap_per_document_gives_the_plain_answer(conn, many):
    pool = search(conn, "permit", match_count=5, rerank_pool=20)
    capped = conn.execute(
        "select chunk_id from kb.cap_per_document(%s, %s) where rank <= 5 order by rank",
        ([r["chunk_id"] for r in pool], [r["document_id"] for r in pool]),
    ).fetchall()
    plain = search(conn, "permit", match_count=5)
    assert [c[0] for c in capped] == [r["chunk_id"] for r in plain]


def test_rerank_pool_bounds(conn, many):
    for bad in (0, 1001):
        with raises_sqlstate(conn, "22023") as info:
            search(conn, "permit", rerank_pool=bad)
        assert "rerank_pool must be between 1 and 1000" in str(info.value)


@pytest.fixture
def space(conn: psycopg.Connection[Any]) -> dict[str, int]:
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    doc = add_doc(conn, "d.md")
    return {
        "x": add_chunk(conn, doc, "alpha", [1, 0, 0]),
        "xy": add_chunk(conn, doc, "beta", [0.8, 0.6, 0]),
        "y": add_chunk(conn, doc, "gamma", [0, 1, 0]),
        "z": add_chunk(conn, doc, "delta", [0, 0, 1]),
    }


def vector_arm(conn: psycopg.Connection[Any], query: list[float], extras: list[list[float]]):
    return conn.execute(
        "select chunk_id, similarity from kb.search_vector(%s::vector, 10, "
        "extra_embeddings => %s::vector[])",
        (vec(query), [vec(e) for e in extras] or None),
    ).fetchall()


def test_vector_arm_unions_embeddings_by_best_similarity(conn, space):
    alone = vector_arm(conn, [1, 0, 0], [])
    assert [r[0] for r in alone] == [space["x"], space["xy"]]
    both = vector_arm(conn, [1, 0, 0], [[0, 1, 0]])
    # y: 1.0 to the extra; x: 1.0 to the query; xy: max(.8, .6) = .8; z under the floor
    assert [r[0] for r in both] == [space["x"], space["y"], space["xy"]]
    assert [r[1] for r in both] == pytest.approx([1.0, 1.0, 0.8])
    # the same embedding twice changes nothing
    assert vector_arm(conn, [1, 0, 0], [[1, 0, 0]]) == alone


def test_search_with_extra_embeddings_through_psql(conn, space):
    rows = conn.execute(
        "select chunk_id, vector_rank, similarity from kb.search(null, %s::vector, "
        "extra_embeddings => array[%s::vector], match_count => 3)",
        (vec([0, 0, 1]), vec([0, 1, 0])),
    ).fetchall()
    assert [r[0] for r in rows] == [space["y"], space["z"], space["xy"]]
    assert [r[1] for r in rows] == [1, 2, 3]
    assert [r[2] for r in rows] == pytest.approx([1.0, 1.0, 0.6])


def test_extra_embedding_errors(conn, space):
    one = [vec([1, 0, 0])]
    cases = [
        ("select * from kb.search_vector(null, 5, extra_embeddings => array[%s::vector])", "22023"),
        (
            "select * from kb.search_vector(%s::vector, 5, extra_embeddings => array[null::vector])",
            "22023",
        ),
        (
            "select * from kb.search('alpha', %s::vector, extra_embeddings => array['[1,0]'::vector])",
            "KB001",
        ),
    ]
    for statement, sqlstate in cases:
        with raises_sqlstate(conn, sqlstate):
            conn.execute(statement, one)


def test_context_words_are_found_by_bm25_and_stats_stay_exact(conn):
    doc = add_doc(conn, "ctx.md")
    target = add_chunk(conn, doc, "the fee is payable at the front desk")
    add_chunk(conn, doc, "opening hours of the front desk")

    def lexical(query: str) -> list[int]:
        rows = conn.execute("select chunk_id from kb.search_lexical(%s, 5)", (query,)).fetchall()
        return [r[0] for r in rows]

    def assert_stats_exact() -> None:
        corpus = conn.execute("select chunk_count, total_tokens from kb.corpus_stats").fetchone()
        recount = conn.execute(
            "select count(*), coalesce(sum(token_count), 0) from kb.chunks"
        ).fetchone()
        assert corpus == recount
        stored = conn.execute("select lexeme, doc_freq from kb.lexeme_stats order by 1").fetchall()
        recomputed = conn.execute(
            "select l, count(*)::integer from kb.chunks, unnest(tsvector_to_array(tsv)) l "
            "group by l order by 1"
        ).fetchall()
        assert stored == recomputed

    assert lexical("kayak rental") == []
    conn.execute(
        "update kb.chunks set context = 'Kayak rental price list, section on fees.' where id = %s",
        (target,),
    )
    assert lexical("kayak rental") == [target]
    assert_stats_exact()
    conn.execute("update kb.chunks set context = null where id = %s", (target,))
    assert lexical("kayak") == []
    assert_stats_exact()
