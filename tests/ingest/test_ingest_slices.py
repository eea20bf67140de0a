"""A document of more chunks than one slice: embedded and written a slice at a time, in one
transaction (stored whole or not at all), with the real model and a real database."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kbpg.app import KnowledgeBase
from kbpg.errors import EmbeddingError
from kbpg.ingest import run as ingest
from kbpg.ingest.chunking import chunk_sections
from kbpg.ingest.loaders import iter_file
from kbpg.ingest.run import Document, IngestProgress, ingest_documents, ingest_paths
from kbpg.models.embedders import Embedder, MiniLMEmbedder, OpenAIEmbedder
from kbpg.search.request import SearchRequest
from tests.embedding_server import EmbeddingServer
from tests.ingest.test_ingest import kb as kb  # the fixture
from tests.ingest.test_ingest import rows
from tests.ingest.test_ingest_loaders import long_text

SLICE = 4


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 4 chunks, so a document of a dozen chunks is written in several."""
    monkeypatch.setattr(ingest, "SLICE_CHUNKS", SLICE)


def chunk_count(document: Document, embedder: Embedder) -> int:
    return len(chunk_sections(document.section_list(), embedder))


def test_a_document_larger_than_a_slice_is_stored_whole_and_searchable(
    db_url: str, kb: KnowledgeBase, embedder: Embedder, tmp_path: Path
) -> None:
    big = tmp_path / "handbook.md"
    big.write_text(
        "# Handbook\n\n"
        + long_text(1800)
        + "\n\n## Appendix\n\nThe zebracrossing warden issues form PRK-204; "
        "see [the rules](rules.md#fees).\n"
    )
    (tmp_path / "rules.md").write_text("# Rules\n\n## Fees\n\nForm PRK-204 costs 60.\n")
    expected = {}
    for path in (big, tmp_path / "rules.md"):
        (document,) = iter_file(path)
        assert isinstance(document, Document)
        expected[document.source] = chunk_count(document, embedder)
    n = expected[str(big.resolve())]
    assert n > 3 * SLICE  # several slices, the last one partial or not
    seen: list[int] = []

    summary = ingest_paths(kb.db, kb.models, [tmp_path], progress=lambda p: seen.append(p.chunks))

    assert (summary.added, summary.failed, summary.failures) == (2, 0, [])
    assert summary.chunks == sum(expected.values())
    # progress after every slice of the big document (written after the batch's small ones),
    # not only at its end
    small = expected[str((tmp_path / "rules.md").resolve())]
    assert [c - small for c in seen if small < c < small + n][:3] == [SLICE, 2 * SLICE, 3 * SLICE]
    doc_id = rows(db_url, "select id from kb.documents where source = %s", (str(big.resolve()),))
    (big_id,) = doc_id[0]
    ordinals = rows(
        db_url,
        "select ordinal from kb.chunks where document_id = %s and embedding is not null"
        " order by ordinal",
        (big_id,),
    )
    assert [o for (o,) in ordinals] == list(range(n))
    # reading order is one chain across the slice boundaries
    chain = rows(
        db_url,
        "select s.ordinal, d.ordinal from kb.edges e join kb.chunks s on s.id = e.src_chunk_id "
        "join kb.chunks d on d.id = e.dst_chunk_id where e.relation = 'next' "
        "and s.document_id = %s order by s.ordinal",
        (big_id,),
    )
    assert chain == [(i, i + 1) for i in range(n - 1)]
    # the link and the entity of the last slice point at the last chunk
    assert rows(
        db_url,
        "select c.ordinal, l.fragment from kb.chunk_links l join kb.chunks c on c.id = l.chunk_id"
        " where c.document_id = %s",
        (big_id,),
    ) == [(n - 1, "fees")]
    assert rows(
        db_url,
        "select c.ordinal from kb.chunk_entities e join kb.chunks c on c.id = e.chunk_id"
        " where c.document_id = %s and e.entity = 'PRK-204'",
        (big_id,),
    ) == [(n - 1,)]
    # the last chunk's stored vector is the model's vector of its embedded text
    (last_id, content, stored) = rows(
        db_url,
        "select id, content, embedding::text from kb.chunks"
        " where document_id = %s and ordinal = %s",
        (big_id, n - 1),
    )[0]
    vector = np.array([float(x) for x in stored.strip("[]").split(",")], dtype=np.float32)
    expected_vector = embedder.embed_documents([f"Handbook > Appendix\n{content}"])[0]
    assert float(vector @ expected_vector) > 0.999
    hits = kb.search(SearchRequest(query="zebracrossing warden", top=3))
    assert hits.chunks[0].chunk_id == last_id


def test_a_failure_in_a_later_slice_leaves_the_stored_version_untouched(
    db_url: str, kb: KnowledgeBase, embedder: Embedder
) -> None:
    """The database refuses a chunk of the third slice: the slices already copied roll back,
    the previous version of the document stays as it was, the run goes on."""
    old = Document(source="handbook", title="Handbook", text="Renew the permit online.")
    ingest_documents(kb.db, kb.models, [old])
    before = rows(db_url, "select id, ordinal, content from kb.chunks order by id")
    text = long_text(1500) + "\n\nA last paragraph with a NUL \x00 character."
    new = Document(source="handbook", title="Handbook", text=text)
    n = chunk_count(new, embedder)
    assert n > 3 * SLICE
    seen: list[IngestProgress] = []
    good = Document(source="bins", title="Bins", text="Bins are collected on Mondays.")

    summary = ingest_documents(
        kb.db, kb.models, [new, good], batch_documents=1, progress=seen.append
    )

    assert (summary.added, summary.updated, summary.failed) == (1, 0, 1)
    (failure,) = summary.failures
    assert failure.where == "handbook"
    assert failure.reason.startswith("not stored: ")
    # slices were written before the bad one (the failure is not caught before writing)
    assert max(p.chunks for p in seen) >= 2 * SLICE
    assert summary.chunks == 1
    assert (
        rows(
            db_url,
            "select id, ordinal, content from kb.chunks where document_id = "
            "(select id from kb.documents where source = 'handbook') order by id",
        )
        == before
    )
    assert rows(db_url, "select source from kb.documents order by source") == [
        ("bins",),
        ("handbook",),
    ]
    assert rows(db_url, "select count(*) from kb.chunks") == [(2,)]
    assert rows(db_url, "select count(*) from kb.edges") == [(0,)]


def test_an_embedding_error_in_a_later_slice_stops_the_run_and_stores_nothing_of_it(
    db_url: str, embedder: Embedder
) -> None:
    """The model server fails while the third slice is embedded: the run stops with the error
    and the document's first two slices, already copied, are not stored."""
    assert isinstance(embedder, MiniLMEmbedder)
    with EmbeddingServer(embedder) as server:
        remote = OpenAIEmbedder(server.base_url, server.model, dimension=384, retries=0)
        first = Document(source="first", title="First", text="Bins are collected on Mondays.")
        big = Document(source="big", title="Big", text=long_text(1500))
        assert chunk_count(big, embedder) > 3 * SLICE
        server.script = ["ok", "ok", "ok", "400"]  # first, then big's slices 1-2, then 400
        refused = pytest.raises(EmbeddingError, match="refused the request: HTTP 400")
        with KnowledgeBase(db_url, remote, pool_size=1) as knowledge_base, refused:
            ingest_documents(
                knowledge_base.db, knowledge_base.models, [first, big], batch_documents=1
            )
        assert server.batches[:3] == [1, SLICE, SLICE]
    assert rows(db_url, "select source from kb.documents") == [("first",)]
    assert rows(db_url, "select count(*) from kb.chunks") == [(1,)]


def test_a_long_text_is_hashed_piece_by_piece_to_the_same_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Documents stored before keep their content hash (they are not re-ingested): the digest
    of a text hashed in pieces equals the digest of the whole payload's JSON."""
    from kbpg.ingest import prepare
    from kbpg.ingest.chunking import Link, Section

    text = 'Quotes " and \\ backslashes,\ttabs,\x01controls\nnewlines, é, 漢字, 🚲 and \u2028.' * 9
    document = Document(
        source="s",
        title='T "x"',
        text="",
        metadata={"k": ["v", 1, None]},
        groups=("b", "a"),
        sections=(
            Section(("T",), text, (Link(3, "other.md", "frag"),)),
            Section(("T", "Short"), "short text"),
            Section(("T", "Again"), text[::-1]),
        ),
    )
    whole = prepare.content_hash(document)
    for piece in (1, 7, 64, len(text) - 1):
        monkeypatch.setattr(prepare, "_HASH_PIECE_CHARS", piece)
        assert prepare.content_hash(document) == whole
    monkeypatch.setattr(prepare, "_HASH_PIECE_CHARS", 7)
    changed = Document(**{**document.__dict__, "sections": document.sections[:2]})
    assert prepare.content_hash(changed) != whole


def test_a_slow_model_never_leaves_the_transaction_idle_past_its_timeout(
    db_url: str, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice takes longer to embed than the idle-in-transaction timeout: its chunks are
    embedded and staged a step at a time, so the transaction is never idle that long."""
    import dataclasses

    from kbpg.config import Settings

    assert isinstance(embedder, MiniLMEmbedder)
    monkeypatch.setattr(ingest, "SLICE_CHUNKS", 8)
    monkeypatch.setattr(ingest, "EMBED_STEP", 1)
    settings = dataclasses.replace(Settings.from_env(), idle_in_transaction_timeout_ms=3000)
    big = Document(source="big", title="Big", text=long_text(600))
    n = chunk_count(big, embedder)
    assert n > 8  # more than one slice
    with EmbeddingServer(embedder) as server:
        server.slow_s = 1.0  # a slice of 8 chunks: 8 s of model calls, a step 1 s
        server.script = ["slow"] * n
        remote = OpenAIEmbedder(server.base_url, server.model, dimension=384)
        with KnowledgeBase(db_url, remote, settings=settings, pool_size=1) as knowledge_base:
            summary = ingest_documents(knowledge_base.db, knowledge_base.models, [big])
        assert server.batches == [1] * n
    assert (summary.added, summary.failed, summary.chunks) == (1, 0, n)
    assert rows(db_url, "select count(*) from kb.chunks") == [(n,)]
