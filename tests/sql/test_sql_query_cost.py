"""The documented bound on what one query may cost: query text, scored and excluded lexemes,
graph walks linear in what they read (issue 14). Timing lives in benchmarks/bench_query_cost.py."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, add_edge, ids, raises_sqlstate


def distinct_words(n: int, rng: random.Random) -> list[str]:
    """n distinct made-up words that the english stemmer keeps distinct."""
    letters = "bcdfghjklmnpqrstvwxz"
    words: set[str] = set()
    while len(words) < n:
        words.add("q" + "".join(rng.choice(letters) for _ in range(7)))
    return sorted(words)


def test_a_64_kb_query_of_distinct_words_is_parsed_once(conn):
    words = distinct_words(7300, random.Random(1))
    text = " ".join(words)
    assert 64_000 <= len(text) <= 66_000
    row = conn.execute("select terms, excluded from kb._query_terms(%s)", (text,)).fetchone()
    assert row is not None and len(row[0]) == len(words) and row[1] == []
    doc = add_doc(conn, "cost")
    hit = add_chunk(conn, doc, f"{words[10]} {words[20]} and some ordinary text")
    add_chunk(conn, doc, "ordinary text only")
    # through every arm's entry point: the words the corpus lacks cost nothing more
    assert ids(conn.execute("select * from kb.search_lexical(%s, 5)", (text,)).fetchall()) == [hit]
    rows = conn.execute("select chunk_id from kb.search(%s)", (text,)).fetchall()
    assert rows == [(hit,)]


def test_query_text_over_the_limit_is_kb003_with_a_hint(conn):
    text = "permit " * 14_286  # 100,002 characters
    for sql in (
        "select * from kb.search_lexical(%s)",
        "select * from kb._query_terms(%s)",
    ):
        with raises_sqlstate(conn, "KB003") as info:
            conn.execute(sql, (text,))
        assert "100000" in info.value.diag.message_primary
        assert info.value.diag.message_hint
    # exactly at the limit is fine
    assert conn.execute("select * from kb.search_lexical(%s)", ("x" * 100_000,)).fetchall() == []


def test_kb_search_reports_an_over_limit_query_instead_of_dropping_the_arm(conn):
    """kb.search fails soft on a broken lexical arm, but a query over the bound is the
    caller's error: it must not come back as a silent vector-only result."""
    with raises_sqlstate(conn, "KB003"):
        conn.execute("select * from kb.search(%s)", ("permit " * 14_286,))


def test_only_the_64_rarest_terms_score(conn):
    doc = add_doc(conn, "rare")
    words = distinct_words(65, random.Random(2))
    # words[i] occurs in i + 1 chunks of filler, so words[64] is the most frequent
    for i, word in enumerate(words):
        for _ in range(i + 1):
            add_chunk(conn, doc, f"{word} filler")
    common_only = add_chunk(conn, doc, f"{words[64]} {words[64]} {words[64]}")
    rare_only = add_chunk(conn, doc, f"{words[0]} {words[0]}")
    query = " ".join(words)
    hits = ids(conn.execute("select * from kb.search_lexical(%s, 1000)", (query,)).fetchall())
    assert rare_only in hits
    assert common_only not in hits  # the 65th lexeme by df is not scored
    # the same word alone is scored as usual
    alone = conn.execute("select * from kb.search_lexical(%s, 1000)", (words[64],)).fetchall()
    assert common_only in ids(alone)


def test_more_than_64_excluded_words_is_kb003(conn):
    doc = add_doc(conn, "ex")
    words = distinct_words(70, random.Random(3))
    target = add_chunk(conn, doc, "permit office")
    add_chunk(conn, doc, " ".join(words))
    excluding = "permit " + " ".join(f"-{w}" for w in words)
    with raises_sqlstate(conn, "KB003") as info:
        conn.execute("select * from kb.search_lexical(%s)", (excluding,))
    assert "64" in info.value.diag.message_hint
    # words the corpus lacks exclude nothing and do not count
    lacking = "permit " + " ".join(f"-{w}x" for w in words)
    assert ids(conn.execute("select * from kb.search_lexical(%s)", (lacking,)).fetchall()) == [
        target
    ]


# -- graph: linear in what it reads, identical to following every path --------------------------

V0_1_0_GRAPH = Path(__file__).parent.parent / "fixtures" / "v0_1_0" / "sql" / "050-expand-graph.sql"


def create_0_1_0_walk(conn: psycopg.Connection[Any]) -> None:
    """0.1.0's kb.expand_graph (every simple path, each chunk's best) as pg_temp.expand_graph."""
    text = V0_1_0_GRAPH.read_text().replace("kb.expand_graph(", "pg_temp.expand_graph(")
    conn.execute(text.replace("kb.chunk_matches_filters(", "kb._chunk_matches_filters("))


def walk(conn: psycopg.Connection[Any], seeds: list[int], depth: int, min_score: float) -> list:
    return [
        (r[1], r[3], r[4], r[5])
        for r in conn.execute(
            "select * from kb.expand_graph(%s::bigint[], %s, 1000, %s)", (seeds, depth, min_score)
        )
    ]


def assert_same_walk(actual: list, expected: list) -> None:
    assert [(a[0], a[2], a[3]) for a in actual] == [(e[0], e[2], e[3]) for e in expected]
    assert [a[1] for a in actual] == pytest.approx([e[1] for e in expected], abs=1e-12)


def test_walk_equals_0_1_0s_every_path_walk_on_a_random_graph(conn):
    create_0_1_0_walk(conn)
    rng = random.Random(4)
    doc = add_doc(conn, "graph")
    nodes = [add_chunk(conn, doc, f"node {i}") for i in range(24)]
    pairs = {tuple(rng.sample(nodes, 2)) for _ in range(90)}
    for src, dst in pairs:
        # coarse weights make ties, so the tie rules (fewer hops, then smaller via) are tested
        add_edge(conn, src, dst, rng.choice([0.5, 0.6, 0.75, 0.8, 0.9, 1.0]))
    for depth in (1, 2, 3, 4):
        for seeds in ([nodes[0]], [nodes[3], nodes[17]], nodes[5:9]):
            for min_score in (0.0, 0.3):
                expected = conn.execute(
                    "select chunk_id, score, depth, via_chunk_id"
                    " from pg_temp.expand_graph(%s::bigint[], %s, 1000, %s)",
                    (seeds, depth, min_score),
                ).fetchall()
                assert_same_walk(walk(conn, seeds, depth, min_score), expected)


def best_paths(
    edges: dict[tuple[int, int], float], seeds: list[int], depth: int
) -> dict[int, tuple[float, int, int]]:
    """Best path score into each chunk within depth hops (32 heaviest edges per direction),
    ties to fewer hops then the smaller via: a hop-bounded Bellman-Ford in Python."""
    out: dict[int, list[tuple[int, float]]] = {}
    inc: dict[int, list[tuple[int, float]]] = {}
    for (src, dst), w in edges.items():
        out.setdefault(src, []).append((dst, w))
        inc.setdefault(dst, []).append((src, w))
    neighbours = {
        node: sorted(out.get(node, []), key=lambda e: -e[1])[:32]
        + sorted(inc.get(node, []), key=lambda e: -e[1])[:32]
        for node in set(out) | set(inc)
    }
    best: dict[int, tuple[float, int, int]] = {s: (1.0, 0, 0) for s in seeds}
    frontier = dict.fromkeys(seeds, 1.0)
    for hop in range(1, depth + 1):
        found: dict[int, tuple[float, int]] = {}
        for node, score in frontier.items():
            for nxt, w in neighbours.get(node, []):
                cand = (score * w, -node)
                if nxt not in found or cand > (found[nxt][0], -found[nxt][1]):
                    found[nxt] = (score * w, node)
        frontier = {}
        for nxt, (score, via) in found.items():
            if nxt not in best or score > best[nxt][0]:
                best[nxt] = (score, hop, via)
                frontier[nxt] = score
    return {n: b for n, b in best.items() if n not in seeds}


def test_depth_five_walk_on_a_70_chunk_clique(conn):
    rng = random.Random(5)
    doc = add_doc(conn, "clique")
    nodes = [add_chunk(conn, doc, f"member {i}") for i in range(70)]
    edges: dict[tuple[int, int], float] = {}
    for i, src in enumerate(nodes):
        for dst in nodes[i + 1 :]:
            edges[(src, dst)] = rng.uniform(0.55, 1.0)
            add_edge(conn, src, dst, edges[(src, dst)])
    # real weights are float4: compare with what the table holds
    edges = {
        (s, d): w
        for s, d, w in conn.execute(
            "select src_chunk_id, dst_chunk_id, weight::float8 from kb.edges"
        )
    }
    expected = sorted(
        ((n, *b) for n, b in best_paths(edges, [nodes[0]], 5).items()),
        key=lambda r: (-r[1], r[2], r[0]),
    )
    actual = walk(conn, [nodes[0]], 5, 0.0)
    assert len(actual) == 69
    assert_same_walk(actual, expected)
    top = conn.execute(
        "select chunk_id, depth from kb.expand_graph(%s::bigint[], 5, 3, 0.5)", ([nodes[0]],)
    ).fetchall()
    assert [r[0] for r in top] == [r[0] for r in expected[:3]]


def test_work_multipliers_over_their_bound_are_kb003_with_a_hint(conn):
    """Seeds of a graph walk, extra embeddings, names in a filter list: each multiplies what a
    query reads (100,000 seeds took 23.9 s, 1,000 extra embeddings a minute)."""
    conn.execute("select kb.set_embedding_space('cost-model', 3)")
    doc = add_doc(conn, "cost")
    hit = add_chunk(conn, doc, "parking permit", [1, 0, 0])
    seeds = list(range(1, 1002))
    names = [f"g{i}" for i in range(1001)]
    for sql, params in (
        ("select * from kb.expand_graph(%s::bigint[])", (seeds,)),
        (
            "select * from kb.search('permit', '[1,0,0]', extra_embeddings => %s::vector[])",
            (["[1,0,0]"] * 9,),
        ),
        ("select * from kb.search_lexical('permit', groups => %s)", (names,)),
        ("select * from kb.search_vector('[1,0,0]', labels => %s)", (names,)),
        ("select * from kb.expand_graph(array[1]::bigint[], groups => %s)", (names,)),
    ):
        with raises_sqlstate(conn, "KB003") as info:
            conn.execute(sql, params)
        assert info.value.diag.message_hint, sql
    # at the bound they run
    assert conn.execute("select count(*) from kb.expand_graph(%s::bigint[])", (seeds[:1000],))
    rows = conn.execute(
        "select chunk_id from kb.search('permit', '[1,0,0]', extra_embeddings => %s::vector[])",
        (["[1,0,0]"] * 8,),
    ).fetchall()
    assert rows == [(hit,)]


def test_a_graph_walk_expands_at_most_its_budget_best_first(conn):
    """S -> A1..A5 (weights .9 .. .5) -> B1..B5: with a budget of 3 chunks expanded, S and the
    two best A's are; B3..B5 are never reached. The budget is 1,000 (a reader cannot raise it)."""
    doc = add_doc(conn, "walk")
    s = add_chunk(conn, doc, "start")
    a = [add_chunk(conn, doc, f"a{i}") for i in range(5)]
    b = [add_chunk(conn, doc, f"b{i}") for i in range(5)]
    for i in range(5):
        add_edge(conn, s, a[i], 0.9 - i / 10)
        add_edge(conn, a[i], b[i], 1.0)

    def walked() -> set[int]:
        return set(
            ids(
                conn.execute(
                    "select * from kb.expand_graph(array[%s]::bigint[], 2, 20, 0)", (s,)
                ).fetchall()
            )
        )

    assert walked() == set(a) | set(b)
    conn.execute("set local kb.graph_walk_budget = 3")
    assert walked() == set(a) | {b[0], b[1]}


def test_a_readers_walk_is_the_owners_over_the_chunks_it_may_read(conn):
    """Visibility is checked per hop for the far ends the walk has not reached (not per edge):
    the walk of a reader of group a equals the owner's walk once the chunks of group b are
    deleted, fan-out included (chunks with over 32 edges a direction, hidden ones among the
    heaviest), from seeds hidden ones among them, at every depth."""
    rng = random.Random(6)
    docs = {g: add_doc(conn, g, groups=[g]) for g in ("a", "b")}
    public = add_doc(conn, "public")
    nodes = [
        add_chunk(conn, rng.choice([docs["a"], docs["a"], docs["b"], public]), f"n{i}")
        for i in range(80)
    ]
    hubs = nodes[:4]
    pairs = {tuple(rng.sample(nodes, 2)) for _ in range(700)}
    pairs |= {(h, n) for h in hubs for n in rng.sample(nodes, 45) if n != h}
    pairs |= {(n, h) for h in hubs for n in rng.sample(nodes, 45) if n != h}
    for src, dst in pairs:
        add_edge(conn, src, dst, rng.choice([0.55, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95, 1.0]))
    seeds = [hubs[0], hubs[1], nodes[10], nodes[11], nodes[12]]
    sql = (
        "select chunk_id, score, depth, via_chunk_id from kb._expand_graph(%s::bigint[], %s,"
        " 1000, %s, null, null, null, %s)"
    )
    cases = [(depth, min_score) for depth in (1, 2, 3, 5) for min_score in (0.0, 0.5)]
    as_reader = [conn.execute(sql, (seeds, d, m, ["a"])).fetchall() for d, m in cases]
    assert all(as_reader) and any(len(r) > 32 for r in as_reader)
    conn.execute("delete from kb.chunks where groups = '{b}'")
    as_owner = [conn.execute(sql, (seeds, d, m, None)).fetchall() for d, m in cases]
    for reader, owner in zip(as_reader, as_owner, strict=True):
        assert_same_walk(reader, owner)
