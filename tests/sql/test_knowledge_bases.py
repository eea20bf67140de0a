"""Two knowledge bases in one database (issue 39, revisions 0028-0029): each has its own
documents, BM25 statistics and impact cache; writing one leaves the other's bit-identical.

The second knowledge base is made with kb._create_knowledge_base and selected with the setting
kbpg.kb_id, as every entry point will select it from its `kb` argument."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pytest

from tests.sql.test_sql_lexical import bm25_statistics, counted_statistics
from tests.sqldata import add_chunk, add_doc, raises_sqlstate, vec

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


def index_definitions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute(
        "select indexname, indexdef from pg_indexes"
        " where schemaname = 'kb_data' and indexname like 'chunks_embedding_hnsw%'"
    ).fetchall()
    return {str(name): str(definition) for name, definition in rows}


def vector_ranked(conn: psycopg.Connection[Any], query: Any, k: int = 5) -> list[int]:
    rows = conn.execute(
        "select chunk_id from kb.search_vector(%s::vector, %s, min_similarity => -1) order by rank",
        (vec(query), k),
    ).fetchall()
    return [int(r[0]) for r in rows]


def index_scans(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute(
        "select pg_stat_get_xact_numscans(to_regclass('kb_data.' || %s))", (name,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def exact_top(vectors: np.ndarray, chunk_ids: list[int], query: np.ndarray, k: int) -> list[int]:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ (query / np.linalg.norm(query))
    return [chunk_ids[i] for i in np.argsort(-sims, kind="stable")[:k]]


def random_chunks(
    conn: psycopg.Connection[Any], dimension: int, seed: int
) -> tuple[np.ndarray, list[int]]:
    vectors = np.random.default_rng(seed).normal(size=(60, dimension))
    doc = add_doc(conn, "vectors.md")
    return vectors, [add_chunk(conn, doc, f"chunk {i}", list(v)) for i, v in enumerate(vectors)]


def test_each_knowledge_base_has_its_own_vector_index_in_its_own_dimension(db_url: str) -> None:
    """Default's HNSW covers the table while default is alone; the second knowledge base
    limits it to default's rows (same layout and parameters). The second one searches exactly
    without an index while small, and with a partial index of its own, in its own dimension,
    once it has one; each search scans its own index and finds its exact top 5."""
    with psycopg.connect(db_url) as conn:
        conn.execute("select kb.set_embedding_space('model-3', 3)")
        default_vectors, default_ids = random_chunks(conn, 3, seed=1)
        conn.execute(
            "alter index kb_data.chunks_embedding_hnsw set (ef_construction = 40)"
        )  # a parameter an operator chose: kept by the rebuild
        alone = index_definitions(conn)
        assert list(alone) == ["chunks_embedding_hnsw"]
        assert "WHERE" not in alone["chunks_embedding_hnsw"]

        (other,) = conn.execute("select kb._create_knowledge_base('other')").fetchone() or (0,)
        shared = index_definitions(conn)
        assert shared == {
            "chunks_embedding_hnsw": alone["chunks_embedding_hnsw"] + " WHERE (kb_id = 1)"
        }
        use(conn, other)
        conn.execute("select kb.set_embedding_space('model-5', 5, 'vector')")
        other_vectors, other_ids = random_chunks(conn, 5, seed=2)
        own = f"chunks_embedding_hnsw_{other}"
        # 60 chunks: no index of its own (kb._wants_vector_index, from 2,000), the exact path
        query = np.array([0.3, -1.0, 0.2, 0.5, 0.1])
        assert own not in index_definitions(conn)
        assert vector_ranked(conn, query) == exact_top(other_vectors, other_ids, query, 5)
        conn.execute("select kb.set_embedding_layout('vector')")  # one at any size, when asked
        assert index_definitions(conn)[own] == (
            f"CREATE INDEX {own} ON kb_data.chunks USING hnsw (((embedding)::vector(5))"
            f" vector_cosine_ops) WITH (m='16', ef_construction='128') WHERE (kb_id = {other})"
        )
        conn.commit()

        conn.execute("select set_config('kb.vector_exact_limit', '0', true)")  # the HNSW path
        conn.execute("select set_config('enable_seqscan', 'off', true)")
        assert vector_ranked(conn, query) == exact_top(other_vectors, other_ids, query, 5)
        assert (index_scans(conn, own), index_scans(conn, "chunks_embedding_hnsw")) == (1, 0)
        with raises_sqlstate(conn, "KB001"):
            vector_ranked(conn, query[:3])
        use(conn, 1)
        conn.execute("select set_config('kb.vector_exact_limit', '0', true)")
        conn.execute("select set_config('enable_seqscan', 'off', true)")
        assert vector_ranked(conn, query[:3]) == exact_top(
            default_vectors, default_ids, query[:3], 5
        )
        assert (index_scans(conn, own), index_scans(conn, "chunks_embedding_hnsw")) == (1, 1)
        conn.rollback()

        # another layout, or another model, in one knowledge base leaves the other's index be
        default_index = conn.execute(
            "select 'kb_data.chunks_embedding_hnsw'::regclass::oid"
        ).fetchone()
        use(conn, other)
        conn.execute("select kb.set_embedding_layout('halfvec')")
        assert "halfvec(5)" in index_definitions(conn)[own]
        # another model: its vectors first, then (committed) its index
        conn.execute("select kb.reset_embedding_space('model-4', 4)")
        assert own not in index_definitions(conn)
        conn.execute("update kb.chunks set embedding = '[1,2,3,4]'")
        conn.commit()
        conn.execute("select kb.set_embedding_layout('halfvec')")
        assert "halfvec(4)" in index_definitions(conn)[own]
        assert (
            conn.execute("select 'kb_data.chunks_embedding_hnsw'::regclass::oid").fetchone()
            == default_index
        )
        use(conn, 1)
        assert conn.execute(
            "select count(*) from kb.chunks where embedding is not null"
        ).fetchone() == (len(default_ids),)
        assert index_definitions(conn)["chunks_embedding_hnsw"] == shared["chunks_embedding_hnsw"]


def test_a_small_knowledge_base_reads_its_rows_through_its_index_and_default_never_does(
    db_url: str,
) -> None:
    """Revision 0032's partial index on (kb_id, id): the statements of a knowledge base without
    an HNSW (its exact vector path, its BM25 scoring) find its rows through it, and give its
    exact ranking; default's never use it, not even with sequential scans off (before it, a
    small knowledge base read the whole shared table per search: 570 ms beside 200k chunks)."""
    with psycopg.connect(db_url) as conn:
        conn.execute("select kb.set_embedding_space('model-3', 3)")
        default_vectors, default_ids = random_chunks(conn, 3, seed=1)
        (other,) = conn.execute("select kb._create_knowledge_base('other')").fetchone() or (0,)
        use(conn, other)
        conn.execute("select kb.set_embedding_space('model-5', 5, 'vector')")
        other_vectors, other_ids = random_chunks(conn, 5, seed=2)
        conn.commit()
        lexical = "select chunk_id from kb.search_lexical('chunk 7', 3) order by rank"

        conn.execute("select set_config('enable_seqscan', 'off', true)")
        query = np.array([0.3, -1.0, 0.2, 0.5, 0.1])
        assert vector_ranked(conn, query) == exact_top(other_vectors, other_ids, query, 5)
        after_vector = index_scans(conn, "chunks_kb_id_id")
        assert after_vector >= 1
        assert conn.execute(lexical).fetchall()[0][0] == other_ids[7]
        assert index_scans(conn, "chunks_kb_id_id") > after_vector
        conn.rollback()

        use(conn, 1)
        conn.execute("select set_config('enable_seqscan', 'off', true)")
        before = index_scans(conn, "chunks_kb_id_id")  # the counts stay until they are flushed
        assert vector_ranked(conn, query[:3]) == exact_top(
            default_vectors, default_ids, query[:3], 5
        )
        assert conn.execute(lexical).fetchall()[0][0] == default_ids[7]
        assert index_scans(conn, "chunks_kb_id_id") == before
        conn.rollback()


def test_a_dropped_knowledge_base_leaves_no_row_and_default_keeps_its_index_usable(
    db_url: str,
) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("select kb.set_embedding_space('model-3', 3)")
        default_vectors, default_ids = random_chunks(conn, 3, seed=1)
        made = conn.execute(
            "select kb.create_knowledge_base('gone', 'russian', 'model-5', 5)"
        ).fetchone()
        assert made is not None
        use(conn, made[0])
        assert conn.execute("select name from kb.language").fetchone() == ("russian",)
        random_chunks(conn, 5, seed=2)
        conn.execute("select * from kb.refresh_lexical_index()")
        conn.commit()
        use(conn, 1)
        assert conn.execute("select * from kb.drop_knowledge_base('gone')").fetchone() == (1, 60)
        conn.commit()
        tables = conn.execute(
            "select c.relname from pg_class c join pg_attribute a on a.attrelid = c.oid"
            " where c.relnamespace = 'kb_data'::regnamespace and c.relkind = 'r'"
            " and a.attname = 'kb_id'"
        ).fetchall()
        assert len(tables) > 20
        left = {
            name: conn.execute(
                f"select count(*) from kb_data.{name} where kb_id = %s", (made[0],)
            ).fetchone()
            for (name,) in tables
        }
        assert set(left.values()) == {(0,)}
        assert conn.execute(
            "select count(*) from kb_data.knowledge_bases where name = 'gone'"
        ).fetchone() == (0,)
        # default's index stays limited to its rows, and its statements keep naming default
        assert "WHERE (kb_id = 1)" in index_definitions(conn)["chunks_embedding_hnsw"]
        assert conn.execute("select kb._chunks_relation()").fetchone() == (
            "(select * from kb_data.chunks where kb_id operator(pg_catalog.=) 1)",
        )
        conn.execute("select set_config('kb.vector_exact_limit', '0', true)")
        conn.execute("select set_config('enable_seqscan', 'off', true)")
        query = np.array([0.3, -1.0, 0.2])
        assert vector_ranked(conn, query) == exact_top(default_vectors, default_ids, query, 5)
        assert index_scans(conn, "chunks_embedding_hnsw") == 1
