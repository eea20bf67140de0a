"""kb.search's diversity: maximal marginal relevance over the fused pool, on hand-built vectors."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, raises_sqlstate, vec


@pytest.fixture
def kb(conn: psycopg.Connection[Any]) -> dict[str, int]:
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    chunks = {}
    for name, embedding in [
        ("a1", [1, 0, 0]),
        ("a2", [0.99, 0.01, 0]),  # a near duplicate of a1
        ("b", [0.7, 0.7, 0]),
        ("c", [0.6, 0, 0.8]),
    ]:
        doc = add_doc(conn, f"{name}.md")
        chunks[name] = add_chunk(conn, doc, f"text of {name}", embedding)
    return chunks


def order(conn: psycopg.Connection[Any], diversity: float) -> list[int]:
    rows = conn.execute(
        "select chunk_id from kb.search('x', %s::vector, use_lexical => false,"
        " diversity => %s) order by rank",
        (vec([1, 0, 0]), diversity),
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_diversity_moves_a_near_duplicate_behind_a_different_chunk(conn, kb):
    similar_first = [kb["a1"], kb["a2"], kb["b"], kb["c"]]
    assert order(conn, 0) == similar_first  # off: the vector order
    # 0.5: after a1, a2 scores 0.5 x 61/62 - 0.5 x 0.99995 < 0; b 0.5 x 61/63 - 0.5 x 0.707
    # = 0.13; c 0.5 x 61/64 - 0.5 x 0.6 = 0.18; then b (0.48 - 0.5 x max(0.707, 0.42)) before
    # a2
    assert order(conn, 0.5) == [kb["a1"], kb["c"], kb["b"], kb["a2"]]
    # all diversity, no relevance: the chunk least like those picked, each time
    assert order(conn, 1)[:2] == [kb["a1"], kb["c"]]
    # the scores stay the fused ones; fused_rank is the order the cap saw
    rows = conn.execute(
        "select chunk_id, score, fused_rank from kb.search('x', %s::vector,"
        " use_lexical => false, diversity => 0.5) order by rank",
        (vec([1, 0, 0]),),
    ).fetchall()
    assert [r[2] for r in rows] == [1, 2, 3, 4]
    assert rows[1][1] == pytest.approx(1 / 64)


@pytest.mark.parametrize("diversity", [-0.1, 1.5, None])
def test_diversity_out_of_range_is_refused(conn, kb, diversity):
    with raises_sqlstate(conn, "22023") as info:
        conn.execute("select * from kb.search('x', diversity => %s)", (diversity,))
    assert "diversity must be between 0 and 1" in info.value.diag.message_primary
