"""kb.fuse_rrf and kb.cap_per_document: RRF arithmetic, weights, ties, the per-document cap."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sqldata import raises_sqlstate


def fuse(
    conn: psycopg.Connection[Any], v: list[int], lx: list[int], g: list[int], **kw: Any
) -> list[Any]:
    args = "".join(f", {name} => %({name})s" for name in kw)
    return conn.execute(
        "select rank, chunk_id, score, vector_rank, lexical_rank, graph_rank"
        f" from kb.fuse_rrf(%(v)s::bigint[], %(l)s::bigint[], %(g)s::bigint[]{args})",
        {"v": v, "l": lx, "g": g, **kw},
    ).fetchall()


def test_rrf_sums_each_arm_contribution(conn):
    rows = fuse(conn, [10, 20, 30], [30, 40], [50])
    by_id = {r[1]: r for r in rows}
    assert by_id[30][2] == pytest.approx(1 / 63 + 1 / 61, abs=1e-12)  # found by two arms
    assert by_id[10][2] == pytest.approx(1 / 61, abs=1e-12)
    assert by_id[40][2] == pytest.approx(1 / 62, abs=1e-12)
    assert by_id[50][2] == pytest.approx(1 / 61, abs=1e-12)
    assert (by_id[30][3], by_id[30][4], by_id[30][5]) == (3, 1, None)
    # 10, 50 tie at 1/61: the vector hit first; 20 and 40 tie at 1/62: vector first again
    assert [r[1] for r in rows] == [30, 10, 50, 20, 40]
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]


def test_weights_and_k(conn):
    rows = fuse(conn, [1, 2], [2, 1], [], rrf_k=10, vector_weight=2.0, lexical_weight=0.5)
    by_id = {r[1]: r[2] for r in rows}
    assert by_id[1] == pytest.approx(2 / 11 + 0.5 / 12, abs=1e-12)
    assert by_id[2] == pytest.approx(2 / 12 + 0.5 / 11, abs=1e-12)
    assert [r[1] for r in rows] == [1, 2]
    silenced = fuse(conn, [1, 2], [2, 1], [], vector_weight=0)
    assert [r[1] for r in silenced] == [2, 1]


def test_tie_goes_to_better_vector_rank(conn):
    # 7: vector 2 + lexical 1; 8: vector 1 + lexical 2 -> equal sums, 8 has the better vector rank
    rows = fuse(conn, [8, 7], [7, 8], [])
    assert rows[0][2] == pytest.approx(rows[1][2], abs=1e-15)
    assert [r[1] for r in rows] == [8, 7]


def test_empty_lists(conn):
    assert fuse(conn, [], [], []) == []
    assert [r[1] for r in fuse(conn, [], [5, 6], [])] == [5, 6]


def test_fusion_errors(conn):
    with raises_sqlstate(conn, "22023"):
        fuse(conn, [1], [1], [], lexical_weight=-1)
    with raises_sqlstate(conn, "22023"):
        fuse(conn, [1], [1], [], rrf_k=-1)


def cap(
    conn: psycopg.Connection[Any], chunks: list[int], docs: list[int], m: int | None
) -> list[Any]:
    return conn.execute(
        "select rank, chunk_id, document_id, input_rank"
        " from kb.cap_per_document(%s::bigint[], %s::bigint[], %s)",
        (chunks, docs, m),
    ).fetchall()


def test_cap_per_document(conn):
    chunks = [1, 2, 3, 4, 5, 6, 7]
    docs = [100, 100, 100, 100, 200, 100, 300]
    rows = cap(conn, chunks, docs, 3)
    assert [r[1] for r in rows] == [1, 2, 3, 5, 7, 4, 6]  # over-cap 4 and 6 at the tail, in order
    assert [r[0] for r in rows] == list(range(1, 8))
    assert [r[3] for r in rows] == [1, 2, 3, 5, 7, 4, 6]
    assert [r[1] for r in cap(conn, chunks, docs, 1)] == [1, 5, 7, 2, 3, 4, 6]
    assert [r[1] for r in cap(conn, chunks, docs, None)] == chunks
    with raises_sqlstate(conn, "22023"):
        cap(conn, chunks, docs, 0)
    with raises_sqlstate(conn, "22023"):
        cap(conn, chunks, docs[:3], 3)


@pytest.mark.parametrize("bad", ["NaN", "Infinity"])
def test_non_finite_numbers_are_refused_by_every_public_search_function(conn, bad):
    """NaN sorts above every number and Infinity passes ">= 0": both made every score NaN."""
    calls = [
        *(
            f"select * from kb.search('permit', {name} => '{bad}')"
            for name in (
                "vector_weight",
                "lexical_weight",
                "graph_weight",
                "min_similarity",
                "graph_min_score",
            )
        ),
        *(
            f"select * from kb.fuse_rrf('{{1}}', '{{2}}', {name} => '{bad}')"
            for name in ("vector_weight", "lexical_weight", "graph_weight")
        ),
        f"select * from kb.search_vector(array[1,0,0]::vector, min_similarity => '{bad}')",
        f"select * from kb.expand_graph('{{1}}', min_score => '{bad}')",
    ]
    for sql in calls:
        with raises_sqlstate(conn, "22023") as info:
            conn.execute(sql)
        assert info.value.diag.message_hint, sql
        assert bad in info.value.diag.message_primary, sql


def fuse_convex(conn: psycopg.Connection[Any], **kw: Any) -> list[Any]:
    args = ", ".join(f"{name} => %({name})s" for name in kw)
    return conn.execute(
        "select rank, chunk_id, score, vector_rank, lexical_rank, graph_rank"
        f" from kb.fuse_convex({args})",
        kw,
    ).fetchall()


def test_convex_fusion_sums_min_max_normalised_scores(conn):
    rows = fuse_convex(
        conn,
        vector_ids=[1, 2, 3],
        vector_scores=[0.9, 0.5, 0.1],
        lexical_ids=[3, 4],
        lexical_scores=[10.0, 5.0],
        graph_ids=[5],
        graph_scores=[0.7],
        lexical_weight=2.0,
    )
    # vector: 1, .5, 0; lexical (x2): 2, 0; graph (a list of one): 1
    assert [(r[1], r[2]) for r in rows] == [(3, 2.0), (1, 1.0), (5, 1.0), (2, 0.5), (4, 0.0)]
    assert rows[0][3:] == (3, 1, None)


def test_convex_fusion_refuses_scores_that_do_not_match(conn):
    with raises_sqlstate(conn, "22023"):
        fuse_convex(conn, vector_ids=[1, 2], vector_scores=[0.5], lexical_ids=[], lexical_scores=[])


def test_kb_search_fuses_by_scores_with_convex(conn):
    from tests.sqldata import add_chunk, add_doc, vec

    conn.execute("select kb.set_embedding_space('test-model', 3)")
    ids = {}
    for name, text, embedding in [
        ("a", "permit renewal permit renewal permit", [1, 0, 0]),
        ("b", "permit", [0.98, 0.2, 0]),
        ("c", "bicycle storage", [0.5, 0.86, 0]),
    ]:
        ids[name] = add_chunk(conn, add_doc(conn, f"{name}.md"), text, embedding)

    def order(fusion: str) -> list[int]:
        rows = conn.execute(
            "select chunk_id from kb.search('permit renewal', %s::vector, fusion => %s)"
            " order by rank",
            (vec([1, 0, 0]), fusion),
        ).fetchall()
        return [int(r[0]) for r in rows]

    assert order("rrf") == order("convex") == [ids["a"], ids["b"], ids["c"]]
    # a is the best of both arms: 1 + 1; the scores are the normalised sums, not RRF's
    top = conn.execute(
        "select score from kb.search('permit renewal', %s::vector, fusion => 'convex')"
        " order by rank limit 1",
        (vec([1, 0, 0]),),
    ).fetchone()
    assert top == (2.0,)
    with raises_sqlstate(conn, "22023") as info:
        order("linear")
    assert "fusion must be rrf or convex" in info.value.diag.message_primary
