"""Two knowledge bases in one database (issue 39, revisions 0028-0029): each has its own
documents, BM25 statistics and impact cache; writing one leaves the other's bit-identical.

The second knowledge base is made with kb._create_knowledge_base and selected with the setting
kbpg.kb_id, as every entry point will select it from its `kb` argument."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sql.test_sql_lexical import bm25_statistics, counted_statistics
from tests.sqldata import add_chunk, add_doc, raises_sqlstate

DEFAULT_TEXTS = ["solar wind and the ionosphere", "radio waves in the ionosphere", "tides"]
OTHER_TEXTS = ["solar panels on roofs", "solar panels and radio", "ionosphere of Jupiter"]
LEXICAL = "select chunk_id, score from kb.search_lexical('solar ionosphere', 10) order by rank"


def use(conn: psycopg.Connection[Any], kb_id: int) -> None:
    conn.execute("select set_config('kbpg.kb_id', %s, false)", (str(kb_id),))


def state(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """What a write into another knowledge base must not change: statistics, ranked results,
    the impact cache."""
    blocks = conn.execute(
        "select lexeme, block_no, groups, impacts::text from kb.lexical_blocks order by 1, 2, 3"
    ).fetchall()
    return bm25_statistics(conn), conn.execute(LEXICAL).fetchall(), blocks


def fill(conn: psycopg.Connection[Any], texts: list[str]) -> list[int]:
    doc = add_doc(conn, "manual.md")  # the same source in both: unique per knowledge base
    return [add_chunk(conn, doc, text) for text in texts]


@pytest.fixture
def two(db_url: str) -> Any:
    with psycopg.connect(db_url) as conn:
        default_ids = fill(conn, DEFAULT_TEXTS)
        conn.execute("select * from kb.refresh_lexical_index()")
        (other,) = conn.execute("select kb._create_knowledge_base('other')").fetchone() or (0,)
        conn.commit()
        yield conn, default_ids, other


def test_writing_one_leaves_the_others_statistics_and_results_identical(two: Any) -> None:
    conn, default_ids, other = two
    before = state(conn)
    assert [r[0] for r in before[1]] == [default_ids[0], default_ids[1]]

    use(conn, other)
    other_ids = fill(conn, OTHER_TEXTS)
    conn.execute("select * from kb.refresh_lexical_index()")
    conn.commit()
    assert bm25_statistics(conn) == counted_statistics(conn)
    assert bm25_statistics(conn)[0][0] == 3
    ranked = [r[0] for r in conn.execute(LEXICAL).fetchall()]
    assert sorted(ranked) == sorted(other_ids) and set(ranked).isdisjoint(default_ids)

    use(conn, 1)
    assert state(conn) == before  # bit-identical: statistics, scores, the cache
    conn.execute("delete from kb.documents")  # default's only
    conn.commit()
    assert bm25_statistics(conn) == ((0, 0), {})
    use(conn, other)
    assert sorted(r[0] for r in conn.execute(LEXICAL).fetchall()) == sorted(ranked)
    assert bm25_statistics(conn) == counted_statistics(conn)


def test_a_name_is_taken_once(two: Any) -> None:
    conn, _, _ = two
    with raises_sqlstate(conn, "42710"):
        conn.execute("select kb._create_knowledge_base('other')")
