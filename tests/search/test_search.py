"""The Python search API: Retriever over kb.search, typed results, the context block."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from kbpg import Retriever
from kbpg.config import Settings
from kbpg.errors import EmbeddingSpaceMismatch, InvalidInput, SchemaNotMigrated
from kbpg.models.embedders import Embedder
from kbpg.search.results import Chunk, SearchResult, Source, build_context
from kbpg.store import db as kdb
from tests.search_kb import (  # noqa: F401 - fixtures
    HOSTILE_QUERIES,
    kb_url,
    set_foreign_space,
)


def settings_for(url: str) -> Settings:
    return dataclasses.replace(Settings.from_env(), database_url=url)


@pytest.fixture(scope="module")
def retriever(kb_url: str, embedder: Embedder) -> Iterator[Retriever]:  # noqa: F811
    with Retriever(kb_url, embedder, settings=settings_for(kb_url), pool_size=4) as r:
        yield r


def test_search_returns_typed_ranked_chunks(retriever: Retriever) -> None:
    result = retriever.search("how do I renew a parking permit", top=3)
    assert isinstance(result, SearchResult)
    assert [c.rank for c in result.chunks] == [1, 2, 3]
    first = result.chunks[0]
    assert isinstance(first, Chunk)
    assert first.section == "Parking permits > Renewing a permit"
    assert first.document == "Parking permits"
    assert first.source == "city/parking/permits.md"
    assert first.vector_rank == 1
    assert first.lexical_rank is not None
    assert first.similarity is not None and first.similarity > 0.5
    scores = [c.score for c in result.chunks]
    assert scores == sorted(scores, reverse=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.score = 1.0  # type: ignore[misc]
    assert result.timings.embed_ms > 0 and result.timings.sql_ms > 0


def test_default_top_is_the_settings_default(kb_url: str, embedder: Embedder) -> None:  # noqa: F811
    settings = settings_for(kb_url)
    assert settings.default_max_chunks == 8
    with Retriever(kb_url, embedder, settings=settings, pool_size=1) as r:
        assert len(r.search("parking permit fine renew", min_similarity=0.0)) == 8
        small = dataclasses.replace(settings, default_max_chunks=2)
    with Retriever(kb_url, embedder, settings=small, pool_size=1) as r:
        assert len(r.search("parking permit fine renew")) == 2


def test_filters_apply(retriever: Retriever) -> None:
    staff = retriever.search("parking permit", groups=["staff"], min_similarity=0.0)
    assert staff.chunks and {c.source for c in staff} == {"staff/payroll.md"}
    waste = retriever.search("parking permit", category="waste", min_similarity=0.0)
    assert waste.chunks and {c.source for c in waste} == {"city/waste/collection.md"}
    howto = retriever.search("renew", labels=["howto"], min_similarity=0.0, top=20)
    assert howto.chunks
    assert {c.source for c in howto} <= {"city/parking/permits.md", "city/library/cards.md"}
    none = retriever.search("parking permit", groups=["nobody"], min_similarity=0.0)
    assert none.chunks == () and none.context == "" and none.sources == ()


def test_no_lexical_arm(retriever: Retriever) -> None:
    result = retriever.search("renew parking permit", lexical=False)
    assert result.chunks
    assert all(c.lexical_rank is None for c in result)


def test_graph_arm_runs(retriever: Retriever) -> None:
    assert retriever.search("renew parking permit", graph=True).chunks


def test_zero_hits_is_an_empty_result(retriever: Retriever) -> None:
    result = retriever.search("qwxzv zzkj", min_similarity=0.99)
    assert len(result) == 0
    assert result.context == ""
    assert result.to_json() == {
        "context": "",
        "sources": [],
        "chunks": [],
        "stages": [],
        "facets": [],
    }


def test_context_block_numbers_chunks_and_lists_sources_once(retriever: Retriever) -> None:
    result = retriever.search("parking permit", top=5, min_similarity=0.0)
    context = result.context
    assert context == build_context(result.chunks)
    for chunk in result.chunks:
        assert f"[{chunk.rank}] " in context
        assert chunk.content in context
    body, _, sources = context.rpartition("\n\nSources:\n")
    assert body
    lines = sources.strip().splitlines()
    assert len(lines) == len({c.source for c in result}) == len(result.sources)
    for source, line in zip(result.sources, lines, strict=True):
        assert isinstance(source, Source)
        assert line.startswith(f"- {source.document}: {source.source} [")
    permits = next(s for s in result.sources if s.source == "city/parking/permits.md")
    assert list(permits.ranks) == [c.rank for c in result if c.source == permits.source]


def test_context_block_format() -> None:
    chunk = Chunk(
        rank=1, chunk_id=7, document_id=3, document="Parking permits",
        source="city/parking/permits.md", section="Parking permits > Renewing",
        content="Renew online.\n", score=0.03, similarity=0.8,
        vector_rank=1, lexical_rank=2, graph_rank=None,
    )  # fmt: skip
    other = dataclasses.replace(chunk, rank=2, chunk_id=8, section="", content="Fees.")
    assert build_context([chunk, other]) == (
        "[1] Parking permits > Renewing\nRenew online.\n\n"
        "[2] Parking permits\nFees.\n\n"
        "Sources:\n- Parking permits: city/parking/permits.md [1, 2]\n"
    )
    assert build_context([]) == ""


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=range(len(HOSTILE_QUERIES)))
def test_queries_are_data(retriever: Retriever, query: str) -> None:
    result = retriever.search(query, top=3)
    assert len(result) <= 3
    with retriever.connection() as conn:
        row = conn.execute("select count(*) from kb.chunks").fetchone()
    assert row is not None and row[0] == 11


def test_non_latin_query_finds_non_latin_chunk(retriever: Retriever) -> None:
    result = retriever.search("図書館カード", top=3)
    assert any(c.section == "図書館カード" for c in result)


@pytest.mark.parametrize("query", ["", "   ", "\t\n", "a\x00b", "caf\udce9 permit"])
def test_unsearchable_query_is_invalid(retriever: Retriever, query: str) -> None:
    with pytest.raises(InvalidInput):
        retriever.search(query)


@pytest.mark.parametrize("top", [0, -1])
def test_top_must_be_positive(retriever: Retriever, top: int) -> None:
    with pytest.raises(InvalidInput):
        retriever.search("permit", top=top)


def test_empty_knowledge_base_has_no_hits(db_url: str, embedder: Embedder) -> None:
    with Retriever(db_url, embedder, settings=settings_for(db_url), pool_size=1) as r:
        assert r.search("renew parking permit").chunks == ()


def test_other_model_is_refused(db_url: str, embedder: Embedder) -> None:
    set_foreign_space(db_url, "text-embedding-3-small", 1536)
    retriever = Retriever(db_url, embedder, settings=settings_for(db_url), pool_size=1)
    with retriever, pytest.raises(EmbeddingSpaceMismatch) as info:
        retriever.search("renew parking permit")
    assert "text-embedding-3-small" in info.value.message
    assert info.value.hint and "kbpg reembed" in info.value.hint


def test_unmigrated_database(new_database: Callable[..., str], embedder: Embedder) -> None:
    url = new_database(migrated=False)
    with Retriever(url, embedder, settings=settings_for(url), pool_size=1) as r:
        with pytest.raises(SchemaNotMigrated) as info:
            r.search("renew parking permit")
        assert info.value.hint == "run `kbpg db upgrade`"
        report = r.health()
    assert report["ok"] is False
    assert report["primary"] == {
        "database": "primary",
        "status": "unmigrated",
        "detail": f"kbpg schema at none, this kbpg needs {kdb.head_revision()}",
        "schema": None,
    }


def test_health(retriever: Retriever) -> None:
    report = retriever.health()
    assert report == {
        "ok": True,
        "model": "all-MiniLM-L6-v2",
        "primary": {"database": "primary", "status": "ok", "schema": kdb.head_revision()},
        "replicas": [],
    }


def test_retriever_from_env_and_close(kb_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("KBPG_DATABASE_URL", kb_url)
    with Retriever.from_env(pool_size=2) as r:
        assert r.search("renew parking permit", top=8).chunks
        model = r.embedder
    with Retriever.from_env(pool_size=1) as again:
        assert again.embedder is model  # the model loads once per process
    with kdb.connect(kb_url) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_import_kbpg_is_cheap() -> None:
    code = (
        "import sys, kbpg\n"
        "assert 'kbpg.search.run' not in sys.modules and 'kbpg.app' not in sys.modules\n"
        "assert 'onnxruntime' not in sys.modules and 'psycopg' not in sys.modules\n"
        "from kbpg import Retriever\n"
        "assert Retriever.__module__ == 'kbpg.app'\n"
        "assert 'onnxruntime' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
