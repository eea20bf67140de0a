"""kbpg.integrations.llamaindex: the real llama-index-core retriever and query engine over
samples/kb in a real database; no language model, no network."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from llama_index.core import Settings, get_response_synthesizer
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import ResponseMode
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode
from pytest_socket import SocketBlockedError, disable_socket, enable_socket

from kbpg.app import KnowledgeBase
from kbpg.errors import InvalidInput
from kbpg.integrations.llamaindex import KbpgRetriever
from tests.integrations.conftest import relative

QUESTION = "how do I renew a parking permit"


@pytest.fixture(autouse=True)
def offline() -> Iterator[None]:
    """No language model and no network: LlamaIndex's models are disabled as LlamaIndex
    allows (None), and Python sockets other than unix ones are refused, so any call to a
    hosted model or a download fails the test (libpq's connections to PostgreSQL are C)."""
    saved = Settings._llm, Settings._embed_model
    Settings.llm = None
    Settings.embed_model = None
    disable_socket(allow_unix_socket=True)
    try:
        yield
    finally:
        enable_socket()
        Settings._llm, Settings._embed_model = saved


def node_ids(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.node_id for n in nodes]


def test_retrieve_returns_kbpg_ranking_as_nodes(samples_kb: KnowledgeBase) -> None:
    with pytest.warns(UserWarning), pytest.raises(SocketBlockedError):  # the guard is on
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    retriever = KbpgRetriever(samples_kb, top=4)
    nodes = retriever.retrieve(QUESTION)
    direct = samples_kb.search(QUESTION, top=4)
    assert node_ids(nodes) == [str(c.chunk_id) for c in direct.chunks]
    assert [n.score for n in nodes] == [c.score for c in direct.chunks]
    first = nodes[0].node
    assert isinstance(first, TextNode)
    assert first.text == direct.chunks[0].content
    assert first.ref_doc_id == direct.chunks[0].source
    meta = first.metadata
    assert relative(meta["source"]) == "parking/renew-permit.md"
    assert meta["title"] == "Renewing a parking permit"
    assert meta["section"] == "Renewing a parking permit"
    assert meta["rank"] == 1 and meta["fused_rank"] == 1
    assert (meta["vector_rank"], meta["lexical_rank"], meta["graph_rank"]) == (2, 1, None)
    assert meta["score"] == nodes[0].score and 0 < meta["similarity"] <= 1
    assert meta["chunk_id"] == direct.chunks[0].chunk_id
    # a language model reads where the chunk comes from, not kbpg's ranks and ids
    for_llm = first.get_content(metadata_mode=MetadataMode.LLM)
    assert "title: Renewing a parking permit" in for_llm
    assert "section: Renewing a parking permit" in for_llm
    assert "rank" not in for_llm and "chunk_id" not in for_llm
    assert for_llm.endswith(first.text)


def test_aretrieve_equals_retrieve(samples_kb: KnowledgeBase) -> None:
    retriever = KbpgRetriever(samples_kb, category="libraries", top=3)
    nodes = asyncio.run(retriever.aretrieve("library card"))
    assert node_ids(nodes) == node_ids(retriever.retrieve("library card"))
    assert node_ids(nodes) == [
        str(c.chunk_id) for c in samples_kb.search("library card", category="libraries", top=3)
    ]
    assert {relative(n.node.metadata["source"]) for n in nodes} == {"libraries/library-card.md"}


def test_query_engine_without_a_language_model(samples_kb: KnowledgeBase) -> None:
    # LlamaIndex's own query engine; the no-text synthesizer returns the sources, no answer
    engine = RetrieverQueryEngine(
        KbpgRetriever(samples_kb, top=5),
        response_synthesizer=get_response_synthesizer(response_mode=ResponseMode.NO_TEXT),
    )
    expected = [str(c.chunk_id) for c in samples_kb.search(QUESTION, top=5).chunks]
    response = engine.query(QUESTION)
    assert node_ids(response.source_nodes) == expected
    assert not response.response
    assert relative(response.source_nodes[0].node.metadata["source"]) == "parking/renew-permit.md"
    later = asyncio.run(engine.aquery(QUESTION))
    assert node_ids(later.source_nodes) == expected


def test_options_are_searchrequests_and_checked(samples_kb: KnowledgeBase) -> None:
    staff = KbpgRetriever(samples_kb, groups=["staff"], top=3).retrieve("reset my password")
    assert staff and all(
        relative(n.node.metadata["source"]).startswith("it-helpdesk/") for n in staff
    )
    lexical_only = KbpgRetriever(samples_kb, top=3, min_similarity=1.0).retrieve(QUESTION)
    assert [n.node.metadata["vector_rank"] for n in lexical_only] == [None] * 3
    with pytest.raises(InvalidInput, match="unknown search option 'similarity_top_k'") as unknown:
        KbpgRetriever(samples_kb, similarity_top_k=3)
    assert unknown.value.hint is not None and "top, groups" in unknown.value.hint
    with pytest.raises(InvalidInput, match="top must be between 1 and 1000, not 0"):
        KbpgRetriever(samples_kb, top=0)
    with pytest.raises(InvalidInput, match="pass the query on its own"):
        KbpgRetriever(samples_kb, query="parking")
    with pytest.raises(InvalidInput, match="the query must not be empty"):
        KbpgRetriever(samples_kb).retrieve(" ")
    with pytest.raises(InvalidInput, match="the query must not be empty"):
        asyncio.run(KbpgRetriever(samples_kb).aretrieve(""))


def test_from_url_and_from_env_are_one_call(
    samples_kb: KnowledgeBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    retriever = KbpgRetriever.from_url(samples_kb.url, top=2)
    try:
        nodes = retriever.retrieve(QUESTION)
        assert [relative(n.node.metadata["source"]) for n in nodes] == [
            "parking/renew-permit.md"
        ] * 2
    finally:
        retriever.knowledge_base.close()
    monkeypatch.setenv("KBPG_DATABASE_URL", samples_kb.url)
    retriever = KbpgRetriever.from_env(top=1)
    try:
        assert node_ids(retriever.retrieve(QUESTION)) == node_ids(nodes[:1])
    finally:
        retriever.knowledge_base.close()
