"""kb.expand_graph: depth, fan-out, cycles, min score, both edge directions, filters."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, add_edge, raises_sqlstate


def expand(conn: psycopg.Connection[Any], seeds: list[int], **kw: Any) -> list[Any]:
    args = "".join(f", {name} => %({name})s" for name in kw)
    return conn.execute(
        "select rank, chunk_id, document_id, score, depth, via_chunk_id"
        f" from kb.expand_graph(%(s)s::bigint[]{args})",
        {"s": seeds, **kw},
    ).fetchall()


@pytest.fixture
def graph(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """a -> b (0.9), b -> c (0.8), c -> a (0.9, a cycle), d -> a (0.6, incoming), a -> e (0.4),
    b -> f (0.7); f sits in another group."""
    doc = add_doc(conn, "g", groups=["team"])
    other = add_doc(conn, "other", groups=["secret"])
    n = {name: add_chunk(conn, doc, name) for name in "abcde"}
    n["f"] = add_chunk(conn, other, "f")
    add_edge(conn, n["a"], n["b"], 0.9)
    add_edge(conn, n["b"], n["c"], 0.8)
    add_edge(conn, n["c"], n["a"], 0.9)
    add_edge(conn, n["d"], n["a"], 0.6)
    add_edge(conn, n["a"], n["e"], 0.4)
    add_edge(conn, n["b"], n["f"], 0.7)
    return n


def test_one_hop_both_directions_min_score(conn, graph):
    rows = expand(conn, [graph["a"]])
    # b (out 0.9), c (in: c -> a 0.9), d (in 0.6); e (0.4) is under the 0.5 floor
    assert [r[1] for r in rows] == [*sorted([graph["b"], graph["c"]]), graph["d"]]
    assert [r[3] for r in rows] == pytest.approx([0.9, 0.9, 0.6])
    assert {r[4] for r in rows} == {1}
    assert {r[5] for r in rows} == {graph["a"]}
    assert [r[0] for r in rows] == [1, 2, 3]


def test_max_returned_and_min_score(conn, graph):
    assert len(expand(conn, [graph["a"]], max_returned=2)) == 2
    assert expand(conn, [graph["a"]], max_returned=0) == []
    low = expand(conn, [graph["a"]], min_score=0.3, max_returned=4)
    assert [r[1] for r in low][2:] == [graph["d"], graph["e"]]
    assert [r[3] for r in low] == pytest.approx([0.9, 0.9, 0.6, 0.4])
    everything = expand(conn, [graph["a"]], min_score=0.0, max_returned=10)
    assert {r[1] for r in everything} == {graph[x] for x in "bcde"}


def test_two_hops_cycle_safe_and_best_path(conn, graph):
    rows = expand(conn, [graph["a"]], max_depth=2, max_returned=10)
    found = {r[1]: r for r in rows}
    # f is reached a -> b -> f (0.9 * 0.7 = 0.63) at depth 2 via b
    assert found[graph["f"]][3] == pytest.approx(0.63)
    assert (found[graph["f"]][4], found[graph["f"]][5]) == (2, graph["b"])
    # c keeps its best path: directly (0.9) rather than a -> b -> c (0.72)
    assert found[graph["c"]][4] == 1
    # the seed is never returned, and each chunk once despite the cycle
    assert graph["a"] not in found
    assert len(rows) == len(found)


def test_filters_apply_to_returned_chunks(conn, graph):
    rows = expand(conn, [graph["a"]], max_depth=2, max_returned=10, groups=["team"])
    assert graph["f"] not in [r[1] for r in rows]
    assert expand(conn, [graph["a"]], groups=["nobody"]) == []


def test_no_seeds(conn, graph):
    assert expand(conn, []) == []


def test_graph_errors(conn, graph):
    for kw in ({"max_depth": 0}, {"max_depth": 6}, {"max_returned": -1}, {"min_score": 1.5}):
        with raises_sqlstate(conn, "22023"):
            expand(conn, [graph["a"]], **kw)


def test_fan_out_is_bounded_per_chunk_and_direction(conn):
    doc = add_doc(conn, "hub")
    hub = add_chunk(conn, doc, "hub")
    spokes = [add_chunk(conn, doc, f"spoke {i}") for i in range(40)]
    for i, spoke in enumerate(spokes):
        add_edge(conn, hub, spoke, 0.99 - i * 0.01)
    rows = expand(conn, [hub], max_returned=100)
    assert [r[1] for r in rows] == spokes[:32]  # the 32 heaviest edges
