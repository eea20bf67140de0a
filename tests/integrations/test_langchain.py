"""kbpg.integrations.langchain: the real langchain-core retriever over a real database."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pydantic
import pytest

from kbpg.app import KnowledgeBase
from kbpg.errors import InvalidInput
from kbpg.integrations.langchain import KbpgRetriever
from kbpg.models.embedders import Embedder
from tests.search_kb import kb_url  # noqa: F401 - fixture

QUESTION = "how do I renew a parking permit"


@pytest.fixture(scope="module")
def knowledge_base(kb_url: str, embedder: Embedder) -> Iterator[KnowledgeBase]:  # noqa: F811
    with KnowledgeBase(kb_url, embedder) as kb:
        yield kb


def test_invoke_returns_ranked_documents(knowledge_base: KnowledgeBase) -> None:
    retriever = KbpgRetriever(knowledge_base=knowledge_base, search_options={"top": 3})
    docs = retriever.invoke(QUESTION)
    assert len(docs) == 3
    first = docs[0]
    assert first.page_content.startswith("Residents renew a residential parking permit")
    meta = first.metadata
    assert meta["source"] == "city/parking/permits.md"
    assert meta["title"] == "Parking permits"
    assert meta["section"] == "Parking permits > Renewing a permit"
    assert meta["rank"] == 1
    assert meta["vector_rank"] == 1 and meta["lexical_rank"] == 1
    assert meta["score"] > 0 and 0 < meta["similarity"] <= 1
    assert [d.metadata["rank"] for d in docs] == [1, 2, 3]
    # the same ranking as kbpg's own search
    direct = knowledge_base.search(QUESTION, top=3)
    assert [d.metadata["chunk_id"] for d in docs] == [c.chunk_id for c in direct.chunks]


def test_options_narrow_and_calls_override(knowledge_base: KnowledgeBase) -> None:
    retriever = KbpgRetriever(knowledge_base=knowledge_base, search_options={"category": "library"})
    docs = retriever.invoke(QUESTION)
    assert docs and {d.metadata["source"] for d in docs} == {"city/library/cards.md"}
    wider = retriever.invoke(QUESTION, category="parking", top=2)
    assert len(wider) == 2
    assert wider[0].metadata["source"] == "city/parking/permits.md"
    assert all(d.metadata["source"].startswith("city/parking/") for d in wider)


def test_async_invoke(knowledge_base: KnowledgeBase) -> None:
    retriever = KbpgRetriever(knowledge_base=knowledge_base, search_options={"top": 1})
    docs = asyncio.run(retriever.ainvoke(QUESTION))
    assert [d.metadata["section"] for d in docs] == ["Parking permits > Renewing a permit"]


def test_bad_options_and_queries_raise_kbpg_errors(knowledge_base: KnowledgeBase) -> None:
    with pytest.raises(pydantic.ValidationError, match="top must be"):
        KbpgRetriever(knowledge_base=knowledge_base, search_options={"top": 0})
    with pytest.raises(pydantic.ValidationError, match="unexpected keyword"):
        KbpgRetriever(knowledge_base=knowledge_base, search_options={"topk": 3})
    retriever = KbpgRetriever(knowledge_base=knowledge_base)
    with pytest.raises(InvalidInput, match="the query must not be empty"):
        retriever.invoke("  ")
