"""kbpg on a kb_data.chunks (kb.chunks: a view of it) partitioned by tenant, built as
docs/scaling.md section 4 describes (benchmarks/partitioned_chunks.py): `kbpg stats`, the BM25
statistics after a detach, and the vector index build's progress."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from kbpg.store import db as kdb
from kbpg.store import indexing
from tests.helpers import run_kbpg
from tests.sql.test_sql_lexical import bm25_statistics, counted_statistics
from tests.sqldata import add_chunk, add_doc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from partitioned_chunks import partition_chunks

TENANTS = ["t00", "t01"]


def partitioned(db_url: str) -> psycopg.Connection[Any]:
    """A knowledge base whose kb.chunks is partitioned by category, two tenants of 3 chunks."""
    conn = kdb.connect(db_url)
    partition_chunks(conn, db_url, TENANTS, build=False)
    for tenant in TENANTS:
        doc = add_doc(conn, f"{tenant}-doc", category=tenant, groups=[tenant])
        for text in ("solar wind and the ionosphere", "radio waves", f"{tenant} only words"):
            add_chunk(conn, doc, text)
    conn.commit()
    return conn


def test_stats_counts_a_partitioned_table_as_one(db_url, cli_env):
    with partitioned(db_url) as conn:
        row = conn.execute(
            "select sum(pg_total_relation_size(relid))::bigint"
            " from pg_partition_tree('kb_data.chunks') where isleaf"
        ).fetchone()
        assert row is not None
        leaves = row[0]
    result = run_kbpg("stats", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["chunks"] == 6
    assert stats["tables"]["chunks"] == leaves > 0
    assert not any(name.startswith("chunks_t0") for name in stats["tables"])
    assert stats["indexes"]["chunks_pkey"] > 0
    assert not any(name.startswith("chunks_t0") for name in stats["indexes"])


def test_recount_repairs_the_statistics_after_a_detach(db_url):
    with partitioned(db_url) as conn:
        before = counted_statistics(conn)
        assert bm25_statistics(conn) == before
        conn.execute("alter table kb_data.chunks detach partition kb_data.chunks_t01")
        # a detach fires no delete trigger: the statistics still count t01's chunks
        assert bm25_statistics(conn) == before
        assert counted_statistics(conn)[0] == (3, before[0][1] // 2)
        conn.execute("select kb.recount_bm25_statistics()")
        assert bm25_statistics(conn) == counted_statistics(conn)
        assert "t01" not in bm25_statistics(conn)[1]


def test_index_progress_counts_partitions(db_url, monkeypatch):
    monkeypatch.setattr(indexing, "POLL_S", 0.2)
    rng = np.random.default_rng(5)
    with kdb.connect(db_url) as conn:
        conn.execute("select kb.set_embedding_space('m', 256, 'vector')")
        conn.commit()
        partition_chunks(conn, db_url, TENANTS, build=False)
        for tenant in TENANTS:
            doc = add_doc(conn, f"{tenant}-doc", category=tenant)
            with conn.cursor().copy(
                "copy kb_data.chunks (document_id, ordinal, content, category, embedding) from stdin"
            ) as copy:
                for i, v in enumerate(rng.normal(size=(3000, 256))):
                    copy.write_row((doc, i, "c", tenant, "[" + ",".join(map(str, v)) + "]"))
        conn.commit()
        conn.autocommit = True
        events: list[indexing.IndexProgress] = []
        layout, _ = indexing.set_layout(conn, db_url, "halfvec", events.append)
        assert layout == "halfvec"
    building = [e for e in events if e.partitions_total]
    assert building, "no progress seen during the build"
    assert {e.partitions_total for e in building} == {2}
    # a partition's count is not shown against the whole table's 6,000 chunks
    assert all(e.tuples_total in (0, 3000) and e.tuples_done <= 3000 for e in building)
    assert re.search(r": .* partition [12] of 2, [0-9,]+", building[-1].describe())


def test_language_change_on_a_partitioned_table(db_url):
    """kb.set_language re-creates the trigger on the parent: every partition analyses in the
    new language, the old chunks are re-analysed, the statistics stay exact."""
    with partitioned(db_url) as conn:
        conn.execute("select kb.set_language('german')")
        conn.commit()
        triggers = conn.execute(
            "select tgrelid::regclass::text, pg_get_triggerdef(oid) from pg_trigger"
            " where tgname = 'chunks_text_search' order by 1"
        ).fetchall()
        assert [t[0] for t in triggers] == [
            "kb_data.chunks",
            "kb_data.chunks_t00",
            "kb_data.chunks_t01",
        ]
        assert all("_chunks_text_search_language('german')" in t[1] for t in triggers)
        doc = add_doc(conn, "t00-de", category="t00", groups=["t00"])
        add_chunk(conn, doc, "Die Häuser am Fluss")
        conn.commit()
        row = conn.execute(
            "select count(*) from kb.chunks where tsv is distinct from"
            " setweight(kb.text_tsvector(section), 'A') || setweight(kb.text_tsvector(content), 'B')"
            " || setweight(kb.text_tsvector(coalesce(context, '')), 'C')"
        ).fetchone()
        assert row == (0,)
        assert "haus" in bm25_statistics(conn)[1]
        assert bm25_statistics(conn) == counted_statistics(conn)
