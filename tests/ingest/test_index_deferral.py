"""The HNSW index is dropped for a bulk build only for loads that write enough chunks, and never
in a way that makes searches queue behind a lock it cannot get."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbpg.app import KnowledgeBase
from kbpg.ingest.run import ingest_paths
from kbpg.store import db as kdb
from tests.ingest.test_ingest import kb as kb  # the fixture
from tests.ingest.test_ingest import rows

INDEX_OID = "select 'kb_data.chunks_embedding_hnsw'::regclass::oid"


def small_folder(root: Path, n: int, word: str = "parking") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        # ~900 bytes: one chunk each, and about one chunk in the size estimate
        (root / f"{word}{i}.md").write_text(
            f"# {word.title()} {i}\n\n" + f"The {word} rule number {i} says this. " * 24 + "\n"
        )
    return root


def test_a_no_op_reingest_keeps_the_index(db_url: str, kb: KnowledgeBase, tmp_path: Path) -> None:
    """Unchanged files, and a refused file as large as the knowledge base several times over,
    write nothing: the index that serves searches stays (it was dropped and rebuilt)."""
    root = small_folder(tmp_path / "kb", 3)
    ingest_paths(kb.db, kb.models, [root])
    before = rows(db_url, INDEX_OID)
    (root / "huge.txt").write_text("too large to ingest " * 2000)  # 40 kB: ~40 chunks estimated
    summary = ingest_paths(kb.db, kb.models, [root], max_file_bytes=10_000)
    assert (summary.added, summary.unchanged, summary.failed) == (0, 3, 1)
    assert rows(db_url, INDEX_OID) == before
    summary = ingest_paths(kb.db, kb.models, [root], max_file_bytes=10_000)
    assert rows(db_url, INDEX_OID) == before


def test_a_load_that_doubles_the_knowledge_base_builds_the_index_in_bulk(
    db_url: str, kb: KnowledgeBase, tmp_path: Path
) -> None:
    ingest_paths(kb.db, kb.models, [small_folder(tmp_path / "a", 3)])
    before = rows(db_url, INDEX_OID)
    summary = ingest_paths(kb.db, kb.models, [small_folder(tmp_path / "b", 12, "library")])
    assert summary.added == 12 and summary.warnings == []
    after = rows(db_url, INDEX_OID)
    assert after and after != before  # dropped, then built once after the rows
    # a small addition is indexed row by row: the index stays
    ingest_paths(kb.db, kb.models, [small_folder(tmp_path / "c", 2, "bicycle")])
    assert rows(db_url, INDEX_OID) == after


def test_an_idle_reader_transaction_keeps_the_index_and_the_load_goes_on(
    db_url: str, kb: KnowledgeBase, tmp_path: Path
) -> None:
    """DROP INDEX waits for every transaction that read kb.chunks and makes every search that
    starts meanwhile queue behind it: a reader's idle transaction made searches wait 8.4 s and
    the ingest fail after KBPG_LOCK_TIMEOUT with a bare "canceling statement due to lock
    timeout". Now the drop waits half a second, the load goes on with the index, and the summary
    says which session held the table."""
    ingest_paths(kb.db, kb.models, [small_folder(tmp_path / "a", 3)])
    before = rows(db_url, INDEX_OID)
    with kdb.connect(db_url) as idle:
        idle.execute("set application_name = 'idle-reader'")
        idle.execute("select * from kb.search('parking rule')").fetchall()  # left open
        pid = idle.info.backend_pid
        summary = ingest_paths(kb.db, kb.models, [small_folder(tmp_path / "b", 12, "library")])
        assert summary.added == 12
        (warning,) = summary.warnings
        assert warning.startswith("kept the vector index")
        assert f"pid {pid} (" in warning and "idle-reader" in warning
        assert "pg_terminate_backend" in warning
    assert rows(db_url, INDEX_OID) == before
    with kb.db.session() as conn:
        hits = conn.execute("select source from kb.search('library rule 7')").fetchall()
    assert hits and hits[0][0].endswith("library7.md")


@pytest.mark.parametrize("estimate", [None, 2])
def test_an_estimate_that_does_not_double_keeps_the_index(
    db_url: str, estimate: int | None
) -> None:
    """ingest_documents gives no estimate: a knowledge base with chunks keeps its index."""
    from kbpg.store import indexing

    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("select kb.set_embedding_space('m', 3)")
        conn.execute(
            "insert into kb.documents (source, content_hash) values ('d', 'h');"
            "insert into kb.chunks (document_id, ordinal, content, embedding)"
            " select (select id from kb.documents), g, 'c', '[1,2,3]' from generate_series(0, 9) g"
        )
        deferral = indexing.IndexDeferral.start(conn, conn.transaction, estimate)
        deferral.before_write(100)
        assert not deferral.dropped and indexing.index_present(conn)
        deferral = indexing.IndexDeferral.start(conn, conn.transaction, 100)
        deferral.before_write(0)  # nothing written: nothing dropped
        assert not deferral.dropped
        deferral.before_write(5)  # 5 of the 10 there: not doubled yet
        assert not deferral.dropped
        deferral.before_write(5)
        assert deferral.dropped and not indexing.index_present(conn)
