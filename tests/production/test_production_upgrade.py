"""Released schema frozen: 0.1.0's revisions never change, and a populated 0.1.0 database
upgrades to head with the same catalog, data and search results as a fresh head database."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kbpg.store import db as kdb
from tests.helpers import clean_env, run_kbpg
from tests.release_fixtures import (
    FROZEN_REVISIONS,
    FROZEN_SQL,
    REPO,
    V0_1_0,
    build_v0_1_0_schema,
    catalog_differences,
    catalog_snapshot,
    data_snapshot,
    load_rows,
    v0_1_0_rows,
)

QUERIES = [
    "how do I renew a parking permit",
    "bulky item collection",
    "library card for children",
    "report a missed bin",
    "council tax discount",
]
SEARCHES = {
    "hybrid": "select * from kb.search(query_text => %(q)s, query_embedding => %(e)s,"
    " match_count => 10)",
    "hybrid+graph": "select * from kb.search(query_text => %(q)s, query_embedding => %(e)s,"
    " match_count => 10, use_graph => true)",
    "lexical (psql, no embedding)": "select * from kb.search(%(q)s, match_count => 10)",
    "vector arm": "select * from kb.search_vector(query_embedding => %(e)s, match_count => 10)",
    "lexical arm": "select * from kb.search_lexical(query_text => %(q)s, match_count => 10)",
}

NEW_DOCUMENT = """# Street parties

Residents may close a quiet residential street for a street party once a year. Apply to
the council's events team at least six weeks before the date; there is no fee.
"""


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(round(v, 9) if isinstance(v, float) else v for v in row) for row in rows]


def _search_results(url: str, embeddings: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    results = {}
    with kdb.connect(url) as conn:
        for query, embedding in embeddings.items():
            for name, statement in SEARCHES.items():
                rows = conn.execute(statement, {"q": query, "e": embedding}).fetchall()
                results[f"{name}: {query}"] = _rounded(rows)
    return results


def test_released_revisions_are_frozen() -> None:
    """0001-0003 shipped in 0.1.0: editing one would fork every database already at it."""
    versions = REPO / "migrations" / "versions"
    for filename, digest in FROZEN_REVISIONS.items():
        actual = hashlib.sha256((versions / filename).read_bytes()).hexdigest()
        assert actual == digest, f"{filename} was released in 0.1.0: add a new revision instead"


def test_frozen_copy_of_0_1_0_sql_is_intact() -> None:
    files = sorted(p.name for p in (V0_1_0 / "sql").iterdir())
    assert files == sorted(FROZEN_SQL)
    for filename, digest in FROZEN_SQL.items():
        actual = hashlib.sha256((V0_1_0 / "sql" / filename).read_bytes()).hexdigest()
        assert actual == digest, f"tests/fixtures/v0_1_0/sql/{filename} is 0.1.0's, as released"


@pytest.fixture(scope="module")
def query_embeddings(embedder: Any) -> dict[str, np.ndarray[Any, Any]]:
    vectors = embedder.embed_documents(QUERIES)  # the query path may add a prefix; either is fine
    return {q: vectors[i] for i, q in enumerate(QUERIES)}


def test_populated_0_1_0_database_upgrades_like_a_fresh_one(
    new_database: Callable[..., str],
    query_embeddings: dict[str, np.ndarray[Any, Any]],
    tmp_path: Path,
) -> None:
    rows = v0_1_0_rows()
    old_url = new_database(migrated=False)
    with kdb.connect(old_url) as conn:
        build_v0_1_0_schema(conn)
        load_rows(conn, rows)
        conn.commit()
        assert kdb.schema_status(conn).current == "0003"
        released = catalog_snapshot(conn)
    released_functions = {row[0] for row in released["functions"]}
    assert any(sig.startswith("kb.search(text,vector,") for sig in released_functions)
    assert "kb.bm25_rank" in {sig.split("(")[0] for sig in released_functions}

    kdb.upgrade(old_url)
    with kdb.connect(old_url) as conn:
        # an upgrade keeps the HNSW index as it was built (rebuilding one takes minutes to hours
        # on a large knowledge base); `kbpg index` rebuilds it with today's parameters
        index = conn.execute(
            "select indexdef from pg_indexes where indexname = 'chunks_embedding_hnsw'"
        ).fetchone()
        assert index is not None and "ef_construction='64'" in index[0]
        conn.execute("select kb.set_embedding_layout(layout) from kb.embedding_space")
        conn.commit()
    fresh_url = new_database()
    with kdb.connect(fresh_url) as conn:
        load_rows(conn, rows)
        conn.commit()

    with kdb.connect(old_url) as old, kdb.connect(fresh_url) as fresh:
        assert kdb.schema_status(old).at_head
        assert catalog_differences(catalog_snapshot(old), catalog_snapshot(fresh)) == []
        old_data, fresh_data = data_snapshot(old), data_snapshot(fresh)
        assert len(old_data["chunks"]) == len(rows["chunks"]) == 103
        assert old_data == fresh_data
    before = _search_results(old_url, query_embeddings)
    assert before == _search_results(fresh_url, query_embeddings)
    assert all(before[f"hybrid: {q}"] for q in QUERIES)

    # both take new writes from today's ingest alike (identity sequences, embedding space)
    (tmp_path / "street-parties.md").write_text(NEW_DOCUMENT)
    for url in (old_url, fresh_url):
        result = run_kbpg(
            "ingest",
            str(tmp_path / "street-parties.md"),
            env=clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(tmp_path / "home")),
        )
        assert result.returncode == 0, result.stderr
    after = _search_results(old_url, {"street party": query_embeddings[QUERIES[0]]})
    assert after == _search_results(fresh_url, {"street party": query_embeddings[QUERIES[0]]})
    top_lexical = after["lexical (psql, no embedding): street party"][0]
    assert top_lexical[3] == str(tmp_path / "street-parties.md")
