"""kb.search: the whole pipeline (arms, filters, RRF, cap, fallbacks, errors) in one call."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, add_edge, function_calls, raises_sqlstate, vec

COLUMNS = [
    "rank",
    "chunk_id",
    "document_id",
    "source",
    "title",
    "section",
    "content",
    "score",
    "similarity",
    "vector_rank",
    "lexical_rank",
    "graph_rank",
    "fused_rank",
]


def search(
    conn: psycopg.Connection[Any], text: str | None, embedding: list[float] | None = None, **kw: Any
) -> list[dict[str, Any]]:
    args = "".join(f", {name} => %({name})s" for name in kw)
    cur = conn.execute(
        f"select * from kb.search(%(t)s, %(e)s::vector{args})",
        {"t": text, "e": None if embedding is None else vec(embedding), **kw},
    )
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.fixture
def kb(conn: psycopg.Connection[Any]) -> dict[str, int]:
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    a = add_doc(conn, "a.md", groups=["team"], category="faq")
    b = add_doc(conn, "b.md", groups=["team"])
    c = add_doc(conn, "c.md", groups=["secret"])
    n = {
        "a": a,
        "b": b,
        "c": c,
        "a1": add_chunk(conn, a, "renew your parking permit online", [1, 0, 0]),
        "a2": add_chunk(conn, a, "parking permit fees and renewal", [0.9, 0.1, 0]),
        "b1": add_chunk(conn, b, "permit office opening hours", [0, 1, 0]),
        "c1": add_chunk(conn, c, "renew permit secret procedure", [0, 0, 1]),
        "g1": add_chunk(conn, b, "unrelated bicycle storage", [0, 1, 0.1]),
    }
    add_edge(conn, n["a1"], n["g1"], 0.9)
    return n


def test_psql_call_by_hand_returns_the_documented_columns(conn, kb):
    cur = conn.execute("select * from kb.search('renew permit', match_count => 5)")
    assert cur.description is not None
    assert [d.name for d in cur.description] == COLUMNS
    rows = cur.fetchall()
    assert [r[1] for r in rows] == [kb["a1"], kb["a2"], kb["c1"], kb["b1"]]


def test_hybrid_rrf_of_vector_and_lexical(conn, kb):
    rows = search(conn, "renew permit", [1, 0, 0])
    # vector: a1, a2 (b1, c1, g1 under the 0.30 floor); lexical: a1, a2, c1 tie (same dl and
    # tf, ties by id), then b1
    assert [r["chunk_id"] for r in rows] == [kb["a1"], kb["a2"], kb["c1"], kb["b1"]]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert [(r["vector_rank"], r["lexical_rank"], r["graph_rank"]) for r in rows] == [
        (1, 1, None),
        (2, 2, None),
        (None, 3, None),
        (None, 4, None),
    ]
    assert [r["score"] for r in rows] == pytest.approx([2 / 61, 2 / 62, 1 / 63, 1 / 64], abs=1e-12)
    assert rows[0]["similarity"] == pytest.approx(1.0)
    assert rows[3]["similarity"] == pytest.approx(0.0)
    first = rows[0]
    assert (first["source"], first["title"], first["document_id"]) == ("a.md", "A.MD", kb["a"])
    assert first["content"] == "renew your parking permit online"


def test_weights_shift_the_order(conn, kb):
    rows = search(conn, "renew permit", [1, 0, 0], vector_weight=0, lexical_weight=2)
    assert [r["chunk_id"] for r in rows][:2] == [kb["a1"], kb["a2"]]
    assert rows[0]["score"] == pytest.approx(2 / 61, abs=1e-12)


def test_filters_apply_to_every_arm(conn, kb):
    # c1 is a lexical-only match in group "secret": it must not appear for "team"
    rows = search(conn, "renew permit", [0, 0, 1], groups=["team"], min_similarity=-1)
    assert kb["c1"] not in [r["chunk_id"] for r in rows]
    assert {r["document_id"] for r in rows} <= {kb["a"], kb["b"]}
    rows = search(conn, "renew permit", [1, 0, 0], category="faq")
    assert [r["chunk_id"] for r in rows] == [kb["a1"], kb["a2"]]
    rows = search(conn, "bicycle", [1, 0, 0], groups=["secret"], use_graph=True)
    assert rows == []


def test_a_selective_filter_is_read_once_for_both_arms(conn, kb):
    # the cache path of the lexical arm, as on a large knowledge base; a filter keeping 4 of 5
    # chunks is under the vector arm's exact-path crossover. The lexical arm masks its cached
    # sums with the filters' stored bitmaps (kb.lexical_filter_masks); without
    # them (a cache from before revision 0019) the exact path hands the filtered rows' ids to
    # the lexical arm, whose mask is built from them: either way one estimate of the filter
    # (the vector arm's) instead of one per arm, and the same rankings
    conn.execute("select kb.refresh_lexical_index()")
    conn.execute("select set_config('kb.lexical_exhaustive_limit', '0', true)")
    before = function_calls(conn, "_filtered_rows_estimate")
    rows = search(conn, "permit renewal office", [0, 1, 0], groups=["team"], rerank_pool=10)
    assert function_calls(conn, "_filtered_rows_estimate") - before == 1
    lexical = conn.execute(
        "select chunk_id from kb.search_lexical('permit renewal office', 10, groups => '{team}')"
    ).fetchall()
    ranked = sorted((r["lexical_rank"], r["chunk_id"]) for r in rows if r["lexical_rank"])
    assert [cid for _, cid in ranked] == [r[0] for r in lexical] == [kb["b1"], kb["a1"], kb["a2"]]
    vector = conn.execute(
        "select chunk_id from kb.search_vector('[0,1,0]', 10, groups => '{team}')"
    ).fetchall()
    ranked = sorted((r["vector_rank"], r["chunk_id"]) for r in rows if r["vector_rank"])
    assert [cid for _, cid in ranked] == [r[0] for r in vector] == [kb["b1"], kb["g1"]]
    conn.execute("update kb.lexical_state set filter_masks = false")
    before = function_calls(conn, "_filtered_rows_estimate")
    again = search(conn, "permit renewal office", [0, 1, 0], groups=["team"], rerank_pool=10)
    assert function_calls(conn, "_filtered_rows_estimate") - before == 1
    assert again == rows


def test_null_embedding_runs_lexical_only(conn, kb):
    rows = search(conn, "renew permit")
    assert [r["chunk_id"] for r in rows] == [kb["a1"], kb["a2"], kb["c1"], kb["b1"]]
    assert all(r["vector_rank"] is None and r["similarity"] is None for r in rows)
    assert [r["score"] for r in rows] == pytest.approx([1 / 61, 1 / 62, 1 / 63, 1 / 64])


def test_no_lexical_hits_rank_by_similarity(conn, kb):
    # score keeps one meaning (issue 42): the fused score, here RRF over the vector arm alone,
    # whose order it keeps; the similarity stands beside it
    rows = search(conn, "xyzzy", [1, 0.2, 0])
    assert [r["chunk_id"] for r in rows] == [kb["a2"], kb["a1"]]
    assert [r["score"] for r in rows] == pytest.approx([1 / 61, 1 / 62], abs=1e-12)
    assert [r["similarity"] for r in rows] == pytest.approx(
        [(0.9 + 0.02) / ((0.81 + 0.01) ** 0.5 * 1.04**0.5), 1 / 1.04**0.5], abs=1e-6
    )
    assert search(conn, "xyzzy", [1, 0.2, 0], vector_weight=2)[0]["score"] == pytest.approx(
        2 / 61, abs=1e-12
    )
    blank_text = search(conn, "  ", [1, 0.2, 0])
    assert [r["chunk_id"] for r in blank_text] == [kb["a2"], kb["a1"]]
    no_lexical = search(conn, "renew permit", [1, 0.2, 0], use_lexical=False)
    assert [r["lexical_rank"] for r in no_lexical] == [None, None]


def test_lexical_failure_degrades_to_vector_with_notice(conn, kb):
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("alter view kb.lexeme_stats rename to lexeme_stats_broken")
    rows = search(conn, "renew permit", [1, 0, 0])
    assert [r["chunk_id"] for r in rows] == [kb["a1"], kb["a2"]]
    assert [r["score"] for r in rows] == pytest.approx([1 / 61, 1 / 62], abs=1e-12)
    assert rows[0]["similarity"] == pytest.approx(1.0)
    assert any("lexical arm failed" in n for n in notices)


def test_graph_arm_adds_neighbours_of_vector_hits(conn, kb):
    rows = search(conn, "renew permit", [1, 0, 0], use_graph=True)
    by_id = {r["chunk_id"]: r for r in rows}
    assert by_id[kb["g1"]]["graph_rank"] == 1
    assert by_id[kb["g1"]]["score"] == pytest.approx(1 / 61, abs=1e-12)
    assert [r["chunk_id"] for r in rows][:3] == [kb["a1"], kb["a2"], kb["g1"]]
    # without an embedding the lexical hits seed the walk
    lexical_seeded = search(conn, "renew permit", use_graph=True)
    assert kb["g1"] in [r["chunk_id"] for r in lexical_seeded]
    assert kb["g1"] not in [r["chunk_id"] for r in search(conn, "renew permit", [1, 0, 0])]


def test_cap_moves_fourth_chunk_of_a_document_behind_others_and_keeps_it(conn, kb):
    d = add_doc(conn, "d.md")
    e = add_doc(conn, "e.md")
    d_chunks = [add_chunk(conn, d, "quokka") for _ in range(4)]
    e1 = add_chunk(conn, e, "quokka marsupial island")
    rows = search(conn, "quokka", match_count=5)
    assert [r["chunk_id"] for r in rows] == [*d_chunks[:3], e1, d_chunks[3]]
    assert [r["lexical_rank"] for r in rows] == [1, 2, 3, 5, 4]
    uncapped = search(conn, "quokka", match_count=5, max_per_doc=None)
    assert [r["chunk_id"] for r in uncapped] == [*d_chunks, e1]
    assert [r["chunk_id"] for r in search(conn, "quokka", match_count=4)] == [*d_chunks[:3], e1]


def test_match_count_and_pool(conn, kb):
    assert len(search(conn, "renew permit", [1, 0, 0], match_count=1)) == 1
    before = conn.execute("select current_setting('hnsw.ef_search')").fetchone()
    search(conn, "renew permit", [1, 0, 0], match_count=100)
    assert conn.execute("select current_setting('hnsw.ef_search')").fetchone() == before


@pytest.mark.parametrize(
    ("text", "embedding", "kw"),
    [
        ("permit", [1, 0, 0], {"match_count": 0}),
        ("permit", [1, 0, 0], {"match_count": 1001}),
        ("permit", [1, 0, 0], {"vector_weight": -1}),
        ("permit", [1, 0, 0], {"lexical_weight": -0.5}),
        ("permit", [1, 0, 0], {"graph_weight": -1}),
        ("permit", [1, 0, 0], {"fetch_multiplier": 0}),
        ("permit", [1, 0, 0], {"rrf_k": -1}),
        ("permit", [1, 0, 0], {"max_per_doc": 0}),
        ("permit", [1, 0, 0], {"min_similarity": 2}),
        ("permit", [1, 0, 0], {"use_graph": True, "graph_max_depth": 0}),
        ("", None, {}),
        ("   ", None, {}),
        (None, None, {}),
    ],
)
def test_bad_input_raises_22023_with_hint(conn, kb, text, embedding, kw):
    with raises_sqlstate(conn, "22023") as info:
        search(conn, text, embedding, **kw)
    assert info.value.diag.message_hint


def test_wrong_dimension_raises_kb001_with_hint(conn, kb):
    with raises_sqlstate(conn, "KB001") as info:
        search(conn, "permit", [1, 0])
    assert "embedding space mismatch" in info.value.diag.message_primary
    assert info.value.diag.message_hint


def test_search_runs_in_a_read_only_transaction(conn, kb):
    conn.execute("set transaction read only")
    rows = search(conn, "renew permit", [1, 0, 0], use_graph=True)
    assert rows[0]["chunk_id"] == kb["a1"]


def test_refresh_on_an_empty_knowledge_base(conn):
    row = conn.execute("select * from kb.refresh_lexical_index()").fetchone()
    assert row is not None and (row[1], row[2]) == (0, 0)
    assert conn.execute("select * from kb.search('anything')").fetchall() == []


def test_group_public_names_the_documents_without_groups(conn):
    """Issue 42: documents ingested without a group are public (every reader may read them);
    the filter `groups => '{public}'` keeps them, with those that name the group, on every arm
    and every path of the lexical arm (the exact scan, the cache with and without bitmaps)."""
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    plain = add_doc(conn, "plain.md")
    named = add_doc(conn, "named.md", groups=["public", "residents"])
    staff = add_doc(conn, "staff.md", groups=["staff"])
    p1 = add_chunk(conn, plain, "renew your parking permit", [1, 0, 0])
    n1 = add_chunk(conn, named, "parking permit renewal fees", [0.9, 0.1, 0])
    s1 = add_chunk(conn, staff, "renew the staff parking permit", [0.95, 0, 0.05])
    g1 = add_chunk(conn, plain, "bicycle storage", [0, 1, 0])
    add_edge(conn, s1, g1, 0.9)
    add_edge(conn, p1, g1, 0.9)
    public = {p1, n1}
    rows = search(conn, "renew parking permit", [1, 0, 0], groups=["public"])
    assert {r["chunk_id"] for r in rows} == public
    assert {
        r["chunk_id"] for r in search(conn, "renew parking permit", groups=["public"])
    } == public
    graph = search(conn, "renew parking permit", [1, 0, 0], groups=["public"], use_graph=True)
    assert {r["chunk_id"] for r in graph} == public | {g1}
    assert {r["chunk_id"] for r in search(conn, "renew permit", [1, 0, 0], groups=["staff"])} == {
        s1
    }
    lexical = (
        "select chunk_id from kb.search_lexical('renew parking permit', 10, groups => '{public}')"
    )
    assert {r[0] for r in conn.execute(lexical)} == public
    conn.execute("select kb.refresh_lexical_index()")
    conn.execute("select set_config('kb.lexical_exhaustive_limit', '0', true)")
    assert {r[0] for r in conn.execute(lexical)} == public
    conn.execute("update kb.lexical_state set filter_masks = false")
    assert {r[0] for r in conn.execute(lexical)} == public
    vector = "select chunk_id from kb.search_vector('[1,0,0]', 10, groups => '{public}')"
    assert {r[0] for r in conn.execute(vector)} == public
    listed = conn.execute("select source from kb.list_documents(group_name => 'public')")
    assert [r[0] for r in listed] == ["named.md", "plain.md"]
