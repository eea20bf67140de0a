"""kbpg.integrations.langchain: the real langchain-core retriever over a real database."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pydantic
import pytest
from langchain_core.runnables import ConfigurableField, RunnableLambda

from kbpg.app import KnowledgeBase
from kbpg.errors import InvalidInput
from kbpg.integrations.langchain import KbpgRetriever
from kbpg.models.embedders import Embedder
from kbpg.search.request import OPTIONS
from tests.integrations.conftest import relative
from tests.search_kb import kb_url  # noqa: F401 - fixture

QUESTION = "how do I renew a parking permit"


@pytest.fixture(scope="module")
def knowledge_base(kb_url: str, embedder: Embedder) -> Iterator[KnowledgeBase]:  # noqa: F811
    with KnowledgeBase(kb_url, embedder) as kb:
        yield kb


def test_invoke_returns_ranked_documents(knowledge_base: KnowledgeBase) -> None:
    retriever = KbpgRetriever(knowledge_base=knowledge_base, top=3)
    assert retriever.top == 3  # type: ignore[attr-defined]
    docs = retriever.invoke(QUESTION)
    assert len(docs) == 3
    first = docs[0]
    assert first.page_content.startswith("Residents renew a residential parking permit")
    meta = first.metadata
    assert meta["source"] == "city/parking/permits.md"
    assert meta["title"] == "Parking permits"
    assert meta["section"] == "Parking permits > Renewing a permit"
    assert meta["rank"] == 1 and meta["fused_rank"] == 1
    assert meta["vector_rank"] == 1 and meta["lexical_rank"] == 1
    assert meta["score"] > 0 and 0 < meta["similarity"] <= 1
    assert [d.metadata["rank"] for d in docs] == [1, 2, 3]
    # the same ranking as kbpg's own search; the Document id is the chunk id
    direct = knowledge_base.search(QUESTION, top=3)
    assert [d.metadata["chunk_id"] for d in docs] == [c.chunk_id for c in direct.chunks]
    assert [d.id for d in docs] == [str(c.chunk_id) for c in direct.chunks]


def test_every_search_option_is_a_constructor_field() -> None:
    # generated from SearchRequest's declaration: a new option needs no change here
    options = [name for name in OPTIONS if name != "query"]
    fields = KbpgRetriever.model_fields
    assert [name for name in fields if name in OPTIONS] == options
    assert fields["top"].description == OPTIONS["top"].help
    assert all(fields[name].default is None for name in options)


def test_constructor_options_narrow_and_calls_override(knowledge_base: KnowledgeBase) -> None:
    retriever = KbpgRetriever(knowledge_base=knowledge_base, category="library")
    docs = retriever.invoke(QUESTION)
    assert docs and {d.metadata["source"] for d in docs} == {"city/library/cards.md"}
    wider = retriever.invoke(QUESTION, category="parking", top=2)
    assert len(wider) == 2
    assert wider[0].metadata["source"] == "city/parking/permits.md"
    assert all(d.metadata["source"].startswith("city/parking/") for d in wider)
    # None puts an option back to kbpg's default for the call: every category
    everywhere = retriever.invoke(QUESTION, category=None, top=8, verbose=True)
    assert {d.metadata["source"] for d in everywhere} > {"city/library/cards.md"}
    lists = KbpgRetriever(knowledge_base=knowledge_base, groups=["staff"], labels=["confidential"])
    assert lists.groups == ("staff",)  # type: ignore[attr-defined]
    assert [d.metadata["source"] for d in lists.invoke(QUESTION)] == ["staff/payroll.md"]


def test_configurable_fields_set_options_inside_a_chain(knowledge_base: KnowledgeBase) -> None:
    # LangChain's way to choose a retriever's settings per call of a whole chain
    retriever = KbpgRetriever(knowledge_base=knowledge_base, top=5).configurable_fields(
        top=ConfigurableField(id="top"), category=ConfigurableField(id="category")
    )
    chain = retriever | RunnableLambda(lambda docs: [d.metadata["source"] for d in docs])
    assert len(chain.invoke(QUESTION)) == 5
    assert (
        chain.invoke(QUESTION, config={"configurable": {"top": 2}})
        == ["city/parking/permits.md"] * 2
    )
    only_library = chain.invoke(QUESTION, config={"configurable": {"category": "library"}})
    assert only_library and set(only_library) == {"city/library/cards.md"}


def test_async_invoke(knowledge_base: KnowledgeBase) -> None:
    retriever = KbpgRetriever(knowledge_base=knowledge_base, top=1)
    docs = asyncio.run(retriever.ainvoke(QUESTION))
    assert [d.metadata["section"] for d in docs] == ["Parking permits > Renewing a permit"]
    two = asyncio.run(retriever.ainvoke(QUESTION, top=2, category="parking"))
    assert [d.id for d in two] == [
        str(c.chunk_id) for c in knowledge_base.search(QUESTION, top=2, category="parking")
    ]


def test_bad_options_and_queries_are_errors(knowledge_base: KnowledgeBase) -> None:
    with pytest.raises(pydantic.ValidationError, match="top must be between 1 and 1000, not 0"):
        KbpgRetriever(knowledge_base=knowledge_base, top=0)
    with pytest.raises(pydantic.ValidationError, match="top must be an integer, not True"):
        KbpgRetriever(knowledge_base=knowledge_base, top=True)
    with pytest.raises(pydantic.ValidationError, match=r"unknown keyword 'topk'.*top, groups"):
        KbpgRetriever(knowledge_base=knowledge_base, topk=3)
    with pytest.raises(pydantic.ValidationError, match="unknown keyword 'search_options'"):
        KbpgRetriever(knowledge_base=knowledge_base, search_options={"top": 3})
    with pytest.raises(pydantic.ValidationError, match="unknown keyword 'query'"):
        KbpgRetriever(knowledge_base=knowledge_base, query="parking")
    retriever = KbpgRetriever(knowledge_base=knowledge_base)
    with pytest.raises(InvalidInput, match="unknown search option 'topk'") as unknown:
        retriever.invoke(QUESTION, topk=3)
    assert unknown.value.hint is not None and "top, groups" in unknown.value.hint
    with pytest.raises(InvalidInput, match="groups must be a list of strings, not str"):
        retriever.invoke(QUESTION, groups="staff")
    with pytest.raises(InvalidInput, match="the query must not be empty"):
        retriever.invoke("  ")
    with pytest.raises(InvalidInput, match="the query must not be empty"):
        asyncio.run(retriever.ainvoke(""))


def test_from_url_and_from_env_are_one_call(
    samples_kb: KnowledgeBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    retriever = KbpgRetriever.from_url(samples_kb.url, top=2)
    try:
        docs = retriever.invoke(QUESTION)
        assert [relative(d.metadata["source"]) for d in docs] == ["parking/renew-permit.md"] * 2
    finally:
        retriever.knowledge_base.close()
    monkeypatch.setenv("KBPG_DATABASE_URL", samples_kb.url)
    retriever = KbpgRetriever.from_env(category="libraries", top=1)
    try:
        docs = retriever.invoke("library card")
        assert [relative(d.metadata["source"]) for d in docs] == ["libraries/library-card.md"]
    finally:
        retriever.knowledge_base.close()
    with pytest.raises(pydantic.ValidationError, match="unknown keyword 'k'"):
        KbpgRetriever.from_env(k=3)
