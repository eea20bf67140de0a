"""Issue 40: the frameworks' own filter objects through the adapters — a langchain-postgres
PGVector filter dict unchanged, LlamaIndex's MetadataFilters translated — on samples/kb (the
parking pages carry an `updated:` date in their front matter)."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from kbpg.app import KnowledgeBase
from kbpg.errors import InvalidInput
from kbpg.integrations.langchain import KbpgRetriever as LangChainRetriever
from kbpg.integrations.llamaindex import KbpgRetriever as LlamaIndexRetriever
from kbpg.integrations.llamaindex import metadata_filter
from tests.integrations.conftest import relative

QUESTION = "parking permit"
SINCE_2025 = {"parking/renew-permit.md", "parking/residential-permits.md"}


def kbpg_ids(kb: KnowledgeBase, filter_: dict[str, Any]) -> list[int]:
    return [c.chunk_id for c in kb.search(QUESTION, top=20, filter=filter_).chunks]


def test_a_langchain_postgres_filter_works_unchanged(samples_kb: KnowledgeBase) -> None:
    # as PGVector's users write it: {"field": {"$op": value}}, $and / $or over such objects
    pgvector_filter = {
        "$and": [{"updated": {"$gte": "2025-01-01"}}, {"format": {"$in": ["markdown"]}}]
    }
    retriever = LangChainRetriever(knowledge_base=samples_kb, top=20)
    docs = retriever.invoke(QUESTION, filter=pgvector_filter)
    assert {relative(d.metadata["source"]) for d in docs} == SINCE_2025
    assert [d.metadata["chunk_id"] for d in docs] == kbpg_ids(samples_kb, pgvector_filter)
    # a constructor filter, overridden per call
    narrowed = LangChainRetriever(
        knowledge_base=samples_kb, top=20, filter={"updated": {"$lt": "2024-01-01"}}
    )
    assert {relative(d.metadata["source"]) for d in narrowed.invoke(QUESTION)} == {
        "parking/accessible-parking.md"
    }
    with pytest.raises(InvalidInput, match=r"unknown operator \$after at filter.updated"):
        retriever.invoke(QUESTION, filter={"updated": {"$after": "2025-01-01"}})


def test_llamaindex_metadata_filters_are_translated(samples_kb: KnowledgeBase) -> None:
    filters = MetadataFilters(
        filters=[
            MetadataFilter(key="updated", value="2024-01-01", operator=FilterOperator.GTE),
            MetadataFilters(
                filters=[
                    MetadataFilter(key="updated", value="2025-01-20", operator=FilterOperator.EQ),
                    MetadataFilter(key="updated", value="2024-09-01", operator=FilterOperator.EQ),
                ],
                condition=FilterCondition.OR,
            ),
        ],
        condition=FilterCondition.AND,
    )
    translated = metadata_filter(filters)
    assert translated == {
        "$and": [
            {"updated": {"$gte": "2024-01-01"}},
            {"$or": [{"updated": {"$eq": "2025-01-20"}}, {"updated": {"$eq": "2024-09-01"}}]},
        ]
    }
    retriever = LlamaIndexRetriever(samples_kb, top=20, filters=filters)
    nodes = retriever.retrieve(QUESTION)
    assert {relative(n.node.metadata["source"]) for n in nodes} == {
        "parking/renew-permit.md",
        "parking/visitor-permits.md",
    }
    assert [int(n.node.node_id) for n in nodes] == kbpg_ids(samples_kb, translated)
    with pytest.raises(InvalidInput, match="either filters"):
        LlamaIndexRetriever(samples_kb, filters=filters, filter={"updated": "x"})


@pytest.mark.parametrize(
    ("operator", "value", "expected"),
    [
        (FilterOperator.NE, "a", {"k": {"$ne": "a"}}),
        (FilterOperator.GT, 1, {"k": {"$gt": 1}}),
        (FilterOperator.LT, 1, {"k": {"$lt": 1}}),
        (FilterOperator.LTE, 1, {"k": {"$lte": 1}}),
        (FilterOperator.IN, ["a", "b"], {"k": {"$in": ["a", "b"]}}),
        (FilterOperator.NIN, ["a"], {"k": {"$nin": ["a"]}}),
        (FilterOperator.ANY, ["a", "b"], {"k": {"$in": ["a", "b"]}}),
        (FilterOperator.ALL, ["a", "b"], {"$and": [{"k": {"$eq": "a"}}, {"k": {"$eq": "b"}}]}),
        (FilterOperator.CONTAINS, "a", {"k": {"$eq": "a"}}),
        (FilterOperator.TEXT_MATCH, "50%_off", {"k": {"$like": "%50\\%\\_off%"}}),
        (FilterOperator.TEXT_MATCH_INSENSITIVE, "Ann", {"k": {"$ilike": "%Ann%"}}),
        (FilterOperator.IS_EMPTY, None, {"k": {"$exists": False}}),
    ],
)
def test_each_llamaindex_operator_has_its_kbpg_form(
    operator: FilterOperator, value: Any, expected: dict[str, Any]
) -> None:
    one = MetadataFilters(filters=[MetadataFilter(key="k", value=value, operator=operator)])
    assert metadata_filter(one) == {"$and": [expected]}
    negated = MetadataFilters(
        filters=[MetadataFilter(key="k", value=value, operator=operator)],
        condition=FilterCondition.NOT,
    )
    assert metadata_filter(negated) == {"$not": {"$and": [expected]}}
