"""Ingest into a real database with the real model: idempotence, atomicity, edges, BM25 stats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kbpg.app import KnowledgeBase
from kbpg.errors import EmbeddingSpaceMismatch
from kbpg.ingest.chunking import chunk_sections
from kbpg.ingest.loaders import iter_file
from kbpg.ingest.maintenance import delete_documents, reembed
from kbpg.ingest.run import MAX_ENTITY_DOCUMENTS, Document, ingest_documents, ingest_paths
from kbpg.models.embedders import Embedder, OpenAIEmbedder
from kbpg.store import db as kdb
from tests.embedding_server import EmbeddingServer
from tests.helpers import KBPG, run_kbpg
from tests.ingest.test_ingest_loaders import long_text, make_pdf


@pytest.fixture
def kb(db_url: str, embedder: Embedder) -> Iterator[KnowledgeBase]:
    """The application object on this test's database, with the session's model."""
    with KnowledgeBase(db_url, embedder, pool_size=1) as knowledge_base:
        yield knowledge_base


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_kb(root: Path) -> dict[str, Path]:
    """A small knowledge base in every format, with links and shared entities."""
    files = {
        "permits": write(
            root / "parking" / "permits.md",
            "---\ntitle: Parking permits\ncategory: permits\ngroups: [residents]\n"
            "labels: [parking]\n---\n# Parking permits\n\nApply with form PRK-204 at the "
            "Parking Services Office. Renewals are described in "
            "[renewing](renew.md#renew-online).\n\n## Fees\n\nThe fee is 60 a year.\n",
        ),
        "renew": write(
            root / "parking" / "renew.md",
            "# Renewing a permit\n\nPermits PRK-204 expire after a year.\n\n"
            "## Renew online\n\nUse the Resident Portal.\n\n## Renew by post\n\n"
            + long_text(500)
            + "\n",
        ),
        "library": write(
            root / "library.html",
            "<html><head><title>Library cards</title></head><body><h1>Library cards</h1>"
            "<p>Join for free. Lost your permit? See <a href='parking/permits.md'>permits</a>."
            "</p></body></html>",
        ),
        "hours": write(root / "opening_hours.txt", "Open 9 to 5 on weekdays.\n"),
        "guide": make_pdf(
            root / "guide.pdf",
            ["Bulky items are collected on Saturdays.", "Fridges cost 20 each."],
            title="Bulky items",
        ),
        "corpus": write(
            root / "records.jsonl",
            json.dumps({"id": "rec-1", "title": "Council meetings", "text": "Monthly meetings."})
            + "\n"
            + json.dumps({"id": "rec-2", "title": "Records", "text": "Ask for FOI-2026-0815."})
            + "\n",
        ),
    }
    return files


def rows(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with kdb.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table ingest writes, with its xmin (changes on any rewrite)."""
    queries = {
        "documents": "select xmin::text, id, updated_at from kb_data.documents order by id",
        "chunks": "select xmin::text, id from kb_data.chunks order by id",
        "edges": "select xmin::text, src_chunk_id, dst_chunk_id, relation from kb_data.edges "
        "order by 2, 3, 4",
        "links": "select xmin::text, chunk_id, target_source from kb_data.chunk_links order by 2, 3",
        "entities": "select xmin::text, entity, chunk_id from kb_data.chunk_entities order by 2, 3",
        "lexemes": "select xmin::text, lexeme, doc_freq from kb_data.lexeme_stats order by 2",
        "corpus": "select xmin::text, chunk_count, total_tokens from kb_data.corpus_stats",
        "space": "select xmin::text, model from kb_data.embedding_space",
    }
    return {name: rows(url, sql) for name, sql in queries.items()}


def chunk_counts(url: str) -> dict[str, int]:
    return dict(
        rows(
            url,
            "select d.source, count(c.id) from kb.documents d "
            "left join kb.chunks c on c.document_id = d.id group by d.source",
        )
    )


def expected_chunk_counts(paths: list[Path], embedder: Embedder) -> dict[str, int]:
    counts = {}
    for path in paths:
        for doc in iter_file(path):
            assert isinstance(doc, Document)
            counts[doc.source] = len(chunk_sections(doc.section_list(), embedder))
    return counts


def assert_bm25_stats_exact(url: str) -> None:
    corpus = rows(url, "select chunk_count, total_tokens from kb.corpus_stats")
    recount = rows(url, "select count(*), coalesce(sum(token_count), 0) from kb.chunks")
    assert corpus == recount
    stored = rows(url, "select lexeme, doc_freq from kb.lexeme_stats order by 1")
    recomputed = rows(
        url,
        "select l, count(*)::integer from kb.chunks, unnest(tsvector_to_array(tsv)) l "
        "group by l order by 1",
    )
    assert stored == recomputed


# -- ingest and idempotence -------------------------------------------------------------------


def test_ingest_every_format_with_filters(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    files = make_kb(tmp_path / "kb")
    summary = ingest_paths(
        kb.db,
        kb.models,
        [tmp_path / "kb"],
        embedder,
        recursive=True,
        groups=["staff"],
        category="general",
        labels=["handbook"],
    )
    assert (summary.added, summary.updated, summary.failed) == (7, 0, 0)
    assert summary.chunks == rows(db_url, "select count(*) from kb.chunks")[0][0]
    assert summary.embed_s > 0 and summary.database_s > 0
    docs = {
        r[0]: r[1:]
        for r in rows(db_url, "select source, title, category, groups, labels from kb.documents")
    }
    permits = str(files["permits"].resolve())
    assert docs[permits] == (
        "Parking permits",
        "permits",
        ["residents", "staff"],
        ["parking", "handbook"],
    )
    assert docs[str(files["hours"].resolve())][:2] == ("opening hours", "general")
    assert docs["rec-2"] == ("Records", "general", ["staff"], ["handbook"])
    assert docs[str(files["guide"].resolve())][0] == "Bulky items"
    # filter columns are copied to every chunk; sections carry the heading path
    chunk_rows = rows(
        db_url,
        "select c.section, c.groups, c.category, c.labels, vector_dims(c.embedding) "
        "from kb.chunks c join kb.documents d on d.id = c.document_id where d.source = %s "
        "order by c.ordinal",
        (permits,),
    )
    assert [r[0] for r in chunk_rows] == ["Parking permits", "Parking permits > Fees"]
    assert all(
        r[1:] == (["residents", "staff"], "permits", ["handbook", "parking"], 384)
        for r in chunk_rows
    )
    sections = [r[0] for r in rows(db_url, "select section from kb.chunks order by id")]
    assert "Bulky items > page 2" in sections
    assert "Renewing a permit > Renew by post" in sections
    assert rows(db_url, "select model, dimension from kb.embedding_space") == [
        ("all-MiniLM-L6-v2", 384)
    ]
    assert_bm25_stats_exact(db_url)
    # ingest refreshed the lexical arm's impact cache up to the last chunk
    assert rows(db_url, "select watermark from kb.lexical_state") == rows(
        db_url, "select max(id) from kb.chunks"
    )


def test_reingest_unchanged_writes_nothing(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    make_kb(tmp_path / "kb")
    first = ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    before = snapshot(db_url)
    again = ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True, prune=True)
    assert (again.added, again.updated, again.unchanged, again.removed) == (0, 0, first.added, 0)
    assert again.chunks == 0 and again.embed_s < 0.05
    assert snapshot(db_url) == before


def test_changed_document_is_replaced_others_untouched(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    files = make_kb(tmp_path / "kb")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    before = snapshot(db_url)
    renew = str(files["renew"].resolve())
    (old_id,) = rows(db_url, "select id from kb.documents where source = %s", (renew,))[0]
    old_chunks = {
        r[0] for r in rows(db_url, "select id from kb.chunks where document_id = %s", (old_id,))
    }
    files["renew"].write_text(
        "# Renewing a permit\n\n## Renew online\n\nNow only online, via the app.\n"
    )
    summary = ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    assert (summary.added, summary.updated, summary.unchanged) == (0, 1, 6)
    after = rows(
        db_url,
        "select c.id, c.ordinal, c.section, c.content from kb.chunks c where c.document_id = %s "
        "order by c.ordinal",
        (old_id,),
    )
    assert [(r[1], r[2], r[3]) for r in after] == [
        (0, "Renewing a permit > Renew online", "Now only online, via the app.")
    ]
    assert not old_chunks & {r[0] for r in after}
    # the other documents' chunks were not rewritten
    untouched = {r for r in before["chunks"] if r[1] not in old_chunks}
    assert untouched <= set(snapshot(db_url)["chunks"])
    # the incoming link from permits.md now points at the new chunk (fragment renew-online)
    link = rows(
        db_url,
        "select e.dst_chunk_id from kb.edges e join kb.chunks s on s.id = e.src_chunk_id "
        "join kb.documents d on d.id = s.document_id where e.relation = 'link' and d.source = %s",
        (str(files["permits"].resolve()),),
    )
    assert link == [(after[0][0],)]
    assert_bm25_stats_exact(db_url)


def test_prune_removes_documents_whose_files_are_gone(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    files = make_kb(tmp_path / "kb")
    other = write(tmp_path / "elsewhere" / "keep.md", "# Keep\n\nOutside the pruned path.\n")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb", other], embedder, recursive=True)
    files["hours"].unlink()
    files["guide"].unlink()
    summary = ingest_paths(
        kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True, prune=True
    )
    assert summary.removed == 2
    sources = {r[0] for r in rows(db_url, "select source from kb.documents")}
    assert str(files["hours"].resolve()) not in sources
    assert str(other.resolve()) in sources
    assert {"rec-1", "rec-2"} <= sources
    assert_bm25_stats_exact(db_url)


def test_ingest_documents_bulk_api_with_prune(
    db_url: str, kb: KnowledgeBase, embedder: Embedder
) -> None:
    docs = [
        Document(source=f"doc-{i}", title=f"Title {i}", text=f"Text number {i}.") for i in range(30)
    ]
    summary = ingest_documents(kb.db, kb.models, docs, embedder)
    assert (summary.added, summary.chunks) == (30, 30)
    progress: list[Any] = []
    summary = ingest_documents(
        kb.db,
        kb.models,
        [*docs[:10], Document("doc-0", "dup", "dup"), Document("new", "", "fresh text")],
        embedder,
        prune=True,
        progress=progress.append,
    )
    assert (summary.added, summary.unchanged, summary.removed, summary.failed) == (1, 10, 20, 1)
    assert "duplicate source" in summary.failures[0].reason
    assert progress and progress[-1].documents == 11
    assert rows(db_url, "select count(*) from kb.documents") == [(11,)]
    assert rows(
        db_url,
        "select section from kb.chunks c join kb.documents d on d.id = c.document_id where d.source = 'new'",
    ) == [("",)]


# -- edges ------------------------------------------------------------------------------------


def test_edges_of_each_kind(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    files = make_kb(tmp_path / "kb")
    # `future.md` is linked before it exists; the edge appears once it is ingested
    write(tmp_path / "kb" / "intro.md", "# Intro\n\nStart with [the future](future.md).\n")
    # an entity in more than MAX_ENTITY_DOCUMENTS documents is too common to link anything
    for i in range(MAX_ENTITY_DOCUMENTS + 1):
        write(tmp_path / "kb" / "common" / f"c{i}.md", f"# Common {i}\n\nForm XYZ-999 is used.\n")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)

    edges = rows(
        db_url,
        "select e.relation, e.weight, s.document_id, s.ordinal, sd.source, s.section, "
        "d.document_id, d.ordinal, dd.source, d.section "
        "from kb.edges e join kb.chunks s on s.id = e.src_chunk_id "
        "join kb.chunks d on d.id = e.dst_chunk_id "
        "join kb.documents sd on sd.id = s.document_id join kb.documents dd on dd.id = d.document_id",
    )
    assert all(0 <= e[1] <= 1 for e in edges)
    nexts = [e for e in edges if e[0] == "next"]
    assert all(e[2] == e[6] and e[7] == e[3] + 1 for e in nexts)
    expected_next = rows(
        db_url,
        "select coalesce(sum(n - 1), 0) from (select count(*) n from kb.chunks group by document_id) x",
    )[0][0]
    assert len(nexts) == expected_next > 0

    src = lambda key: str(files[key].resolve())  # noqa: E731
    links = {(e[4], e[5], e[8], e[9]) for e in edges if e[0] == "link"}
    assert links == {
        (src("permits"), "Parking permits", src("renew"), "Renewing a permit > Renew online"),
        (src("library"), "Library cards", src("permits"), "Parking permits"),
    }
    entities = {(e[4], e[8]) for e in edges if e[0] == "entity"}
    assert (src("permits"), src("renew")) in entities or (src("renew"), src("permits")) in entities
    assert not any("common" in a or "common" in b for a, b in entities)

    write(tmp_path / "kb" / "future.md", "# Future\n\nNow it exists.\n")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    future_links = rows(
        db_url,
        "select count(*) from kb.edges e join kb.chunks d on d.id = e.dst_chunk_id "
        "join kb.documents dd on dd.id = d.document_id where e.relation = 'link' and dd.source = %s",
        (str((tmp_path / "kb" / "future.md").resolve()),),
    )
    assert future_links == [(1,)]


def test_bm25_stats_exact_after_ingests_updates_and_deletes(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    files = make_kb(tmp_path / "kb")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    assert_bm25_stats_exact(db_url)
    files["renew"].write_text("# Renewing\n\nShorter text now, renewal renewal renewal.\n")
    files["hours"].write_text("Open 10 to 4.\n\nClosed on holidays and weekends.\n")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    assert_bm25_stats_exact(db_url)
    deleted, missing = delete_documents(kb.db, [str(files["permits"]), "rec-1", "nope"])
    assert deleted == [str(files["permits"].resolve()), "rec-1"] and missing == ["nope"]
    assert_bm25_stats_exact(db_url)
    files["guide"].unlink()
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True, prune=True)
    assert_bm25_stats_exact(db_url)
    # the two deleted documents still have their files: the last run added them back
    assert rows(db_url, "select count(*) from kb.documents") == [(6,)]


# -- embedding spaces -------------------------------------------------------------------------


def test_wrong_model_is_refused_with_reembed_hint(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder, cli_env: dict[str, str]
) -> None:
    make_kb(tmp_path / "kb")
    with kdb.connect(db_url) as conn:
        conn.execute("select kb.set_embedding_space('other-model', 768)")
        conn.commit()
    with pytest.raises(EmbeddingSpaceMismatch) as info:
        ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    assert "kbpg reembed" in (info.value.hint or "")
    result = run_kbpg("ingest", str(tmp_path / "kb"), "--recursive", env=cli_env)
    assert result.returncode == 1
    assert "Error: embedding space mismatch" in result.stderr
    assert "Hint:" in result.stderr and "kbpg reembed" in result.stderr
    assert "Traceback" not in result.stderr
    assert rows(db_url, "select count(*) from kb.documents") == [(0,)]


def test_reembed_switches_the_space_and_rebuilds_every_vector(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    make_kb(tmp_path / "kb")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    old = dict(rows(db_url, "select id, embedding from kb.chunks"))
    with EmbeddingServer(embedder, model="minilm-over-http") as server:  # type: ignore[arg-type]
        other = OpenAIEmbedder(server.base_url, "minilm-over-http")
        summary = reembed(kb.db, other)
    assert summary.chunks == len(old)
    assert rows(db_url, "select model, dimension from kb.embedding_space") == [
        ("minilm-over-http", 384)
    ]
    new = dict(rows(db_url, "select id, embedding from kb.chunks"))
    assert new.keys() == old.keys()
    for chunk_id, vector in new.items():
        assert np.dot(vector.to_numpy(), old[chunk_id].to_numpy()) > 0.999
    assert rows(
        db_url, "select count(*) from pg_indexes where indexname = 'chunks_embedding_hnsw'"
    ) == [(1,)]
    with pytest.raises(EmbeddingSpaceMismatch):
        ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    assert_bm25_stats_exact(db_url)


def test_reembed_into_another_dimension_builds_its_index_after_the_vectors(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    """A model of another dimension (MiniLM's first 128 of 384, as a Matryoshka server's
    `dimensions` answers): the old vectors' row versions, still visible to the re-embed's own
    transaction, must not reach an index on 128 dimensions (revision 0028 left the column
    untyped), so the index is built once the new vectors are committed."""
    make_kb(tmp_path / "kb")
    ingest_paths(kb.db, kb.models, [tmp_path / "kb"], embedder, recursive=True)
    old = dict(rows(db_url, "select id, embedding from kb.chunks"))
    with EmbeddingServer(embedder, model="minilm-128", dimensions=128) as server:  # type: ignore[arg-type]
        summary = reembed(kb.db, OpenAIEmbedder(server.base_url, "minilm-128"))
    assert summary.chunks == len(old)
    assert rows(
        db_url, "select model, dimension, layout, indexed from kb.get_embedding_space()"
    ) == [("minilm-128", 128, "halfvec", True)]
    [(definition,)] = rows(
        db_url, "select indexdef from pg_indexes where indexname = 'chunks_embedding_hnsw'"
    )
    assert "halfvec(128)" in definition
    new = dict(rows(db_url, "select id, embedding from kb.chunks"))
    for chunk_id, vector in new.items():
        shortened = old[chunk_id].to_numpy()[:128]
        assert np.dot(vector.to_numpy(), shortened / np.linalg.norm(shortened)) > 0.999
    # each vector finds its own chunk first, through the new index
    some = sorted(new)[:3]
    for chunk_id in some:
        found = rows(
            db_url,
            "select chunk_id from kb.search_vector("
            f"(select embedding from kb.chunks where id = {chunk_id}), 1)",
        )
        assert found == [(chunk_id,)]


# -- interrupted ingest -----------------------------------------------------------------------


def test_killed_ingest_leaves_no_half_document(
    db_url: str, kb: KnowledgeBase, tmp_path: Path, embedder: Embedder, cli_env: dict[str, str]
) -> None:
    root = tmp_path / "many"
    paths = [
        write(root / f"doc{i:03d}.md", f"# Document {i}\n\n{long_text(30 + (i % 5) * 110)}\n")
        for i in range(48)
    ]
    expected = expected_chunk_counts(paths, embedder)
    assert len(set(expected.values())) > 3  # documents of different lengths
    proc = subprocess.Popen(
        [KBPG, "ingest", str(root), "--batch-size", "3"],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if rows(db_url, "select count(*) from kb.documents")[0][0] >= 9:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "ingest finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    present = chunk_counts(db_url)
    assert 9 <= len(present) < len(paths)
    for source, count in present.items():
        assert count == expected[source], f"{source} has {count} of {expected[source]} chunks"
    ordinals = rows(
        db_url,
        "select document_id, array_agg(ordinal order by ordinal), count(*) filter (where embedding is null) "
        "from kb.chunks group by document_id",
    )
    assert all(o == list(range(len(o))) and missing == 0 for _, o, missing in ordinals)
    assert_bm25_stats_exact(db_url)
    # the next run completes the job and keeps what was already there
    summary = ingest_paths(kb.db, kb.models, [root], embedder)
    assert (summary.added, summary.unchanged, summary.updated) == (
        len(paths) - len(present),
        len(present),
        0,
    )
    assert chunk_counts(db_url) == expected


# -- command line -----------------------------------------------------------------------------


def test_cli_ingest_reports_broken_file_and_exits_1(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    make_kb(tmp_path / "kb")
    (tmp_path / "kb" / "broken.pdf").write_bytes(b"%PDF-1.4\nnot a pdf at all")
    result = run_kbpg(
        "ingest", str(tmp_path / "kb"), "-r", "--group", "public", "--json", env=cli_env
    )
    assert result.returncode == 1, result.stderr
    broken = str(tmp_path / "kb" / "broken.pdf")
    assert f"skipped {broken}: cannot read PDF" in result.stderr
    assert "added 7, updated 0, unchanged 0, removed 0, skipped 0, failed 1" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["added"] == 7 and summary["failures"][0]["where"] == broken

    listed = run_kbpg("documents", "list", "--group", "residents", "--json", env=cli_env)
    assert listed.returncode == 0
    (doc,) = json.loads(listed.stdout)
    assert doc["title"] == "Parking permits" and doc["groups"] == ["residents", "public"]
    assert (
        json.loads(run_kbpg("documents", "list", "--group", "x", "--json", env=cli_env).stdout)
        == []
    )
    table = run_kbpg("documents", "list", env=cli_env).stdout.splitlines()
    assert table[0].split("\t") == ["source", "title", "category", "groups", "chunks"]
    assert len(table) == 8

    stats = json.loads(run_kbpg("stats", "--json", env=cli_env).stdout)
    assert stats["documents"] == 7
    assert stats["embedding_space"] == {
        "model": "all-MiniLM-L6-v2",
        "dimension": 384,
        "layout": "halfvec",
        "indexed": True,
    }
    assert set(stats["edges"]) == {"next", "link", "entity"}
    assert stats["indexes"]["chunks_embedding_hnsw"] > 0
    text = run_kbpg("stats", env=cli_env)
    assert text.returncode == 0
    assert "embedding space: all-MiniLM-L6-v2 (384-d, halfvec index)" in text.stdout

    deleted = run_kbpg("documents", "delete", "rec-1", "missing-doc", env=cli_env)
    assert deleted.returncode == 1
    assert "deleted rec-1" in deleted.stdout
    assert "Error: no such document: missing-doc" in deleted.stderr

    # same files, same --group: nothing to do (without it the groups change: "updated 2")
    again = run_kbpg("ingest", str(tmp_path / "kb" / "parking"), "--group", "public", env=cli_env)
    assert again.returncode == 0
    assert "unchanged 2" in again.stderr


def test_discover_recursive_and_glob(tmp_path: Path) -> None:
    from kbpg.ingest.sources import discover

    write(tmp_path / "a.md", "a")
    write(tmp_path / "b.txt", "b")
    write(tmp_path / "notes.xyz", "skipped: unsupported")
    write(tmp_path / ".git" / "c.md", "hidden directories are skipped")
    write(tmp_path / "sub" / "d.md", "d")
    assert [p.name for p in discover([tmp_path])] == ["a.md", "b.txt"]
    assert [p.name for p in discover([tmp_path], recursive=True)] == ["a.md", "b.txt", "d.md"]
    assert [p.name for p in discover([tmp_path], recursive=True, glob="*.md")] == ["a.md", "d.md"]
    assert [p.name for p in discover([tmp_path], recursive=True, glob="sub/*")] == ["d.md"]
    (missing,) = discover([tmp_path / "nope"])
    assert missing.reason == "no such file or directory"


def test_cli_reembed_with_the_http_provider(
    tmp_path: Path, cli_env: dict[str, str], db_url: str, embedder: Embedder
) -> None:
    make_kb(tmp_path / "kb")
    assert run_kbpg("ingest", str(tmp_path / "kb"), "-r", env=cli_env).returncode == 0
    with EmbeddingServer(embedder, model="minilm-over-http") as server:  # type: ignore[arg-type]
        env = dict(
            cli_env, KBPG_OPENAI_BASE_URL=server.base_url, KBPG_OPENAI_MODEL="minilm-over-http"
        )
        refused = run_kbpg("ingest", str(tmp_path / "kb"), "-r", "--embedder", "openai", env=env)
        assert refused.returncode == 1
        assert "Hint: use the all-MiniLM-L6-v2 embedder, or run `kbpg reembed`" in refused.stderr
        result = run_kbpg("reembed", "--embedder", "openai", env=env)
        assert result.returncode == 0, result.stderr
        assert "re-embedded" in result.stderr and "minilm-over-http (384-d)" in result.stderr
        again = run_kbpg("ingest", str(tmp_path / "kb"), "-r", "--embedder", "openai", env=env)
        assert again.returncode == 0, again.stderr
        assert "unchanged 7" in again.stderr
    assert rows(db_url, "select model from kb.embedding_space") == [("minilm-over-http",)]
    assert rows(db_url, "select count(*) from kb.chunks where embedding is null") == [(0,)]
