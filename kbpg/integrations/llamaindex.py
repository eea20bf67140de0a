"""A LlamaIndex retriever over kbpg: `pip install 'kbpg[llamaindex]'`."""

from __future__ import annotations

from typing import Any, Self

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import (
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from kbpg.app import KnowledgeBase, Principal
from kbpg.errors import InvalidInput
from kbpg.integrations import shared
from kbpg.search.results import Chunk, SearchResult

__all__ = ["KbpgRetriever", "chunk_node", "metadata_filter"]

# LlamaIndex's comparison operators as kbpg's filter operators (sql/018)
_OPERATORS = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
    FilterOperator.ANY: "$in",  # an array holding any of the values (a key's array matches by element)
}


def _like_substring(text: Any) -> str:
    escaped = str(text).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _condition(item: MetadataFilter) -> dict[str, Any]:
    key, value, op = item.key, item.value, item.operator
    if op in _OPERATORS:
        return {key: {_OPERATORS[op]: value}}
    if op == FilterOperator.CONTAINS:  # an array holding the value
        return {key: {"$eq": value}}
    if op == FilterOperator.ALL:  # an array holding every value
        values = value if isinstance(value, list) else [value]
        return {"$and": [{key: {"$eq": v}} for v in values]}
    if op == FilterOperator.TEXT_MATCH:
        return {key: {"$like": _like_substring(value)}}
    if op == FilterOperator.TEXT_MATCH_INSENSITIVE:
        return {key: {"$ilike": _like_substring(value)}}
    if op == FilterOperator.IS_EMPTY:
        return {key: {"$exists": False}}
    raise InvalidInput(f"kbpg cannot filter with LlamaIndex's operator {op.value!r}")


def metadata_filter(filters: MetadataFilters) -> dict[str, Any]:
    """LlamaIndex's MetadataFilters as kbpg's filter (kb.search's `filter`): its operators
    mapped one to one (contains and any/all on arrays, text_match as a LIKE substring), its
    and/or/not conditions as $and/$or/$not, nested MetadataFilters too."""
    parts = [
        metadata_filter(item) if isinstance(item, MetadataFilters) else _condition(item)
        for item in filters.filters
    ]
    if filters.condition == FilterCondition.OR:
        return {"$or": parts}
    if filters.condition == FilterCondition.NOT:
        return {"$not": {"$and": parts}}
    return {"$and": parts}


def chunk_node(chunk: Chunk) -> NodeWithScore:
    """A ranked chunk as a LlamaIndex node with kbpg's fused score.

    The node id is the chunk id; the source document (kbpg's `source`) is its SOURCE
    relationship (`node.ref_doc_id`). Metadata says where the chunk comes from and why it was
    found; a language model is shown only source, title and section.
    """
    metadata = shared.chunk_metadata(chunk)
    hidden = [key for key in metadata if key not in shared.LLM_METADATA]
    node = TextNode(
        id_=str(chunk.chunk_id),
        text=chunk.content,
        metadata=metadata,
        excluded_llm_metadata_keys=hidden,
        excluded_embed_metadata_keys=hidden,
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=chunk.source)},
    )
    return NodeWithScore(node=node, score=chunk.score)


class KbpgRetriever(BaseRetriever):
    """kbpg's hybrid search (vector + BM25 + graph, fused in SQL) as a LlamaIndex retriever.

    Every SearchRequest option (top, groups, category, labels, filter, graph, rerank, ...)
    is a keyword, checked when the retriever is built (InvalidInput for an unknown name or a
    bad value); `filters` takes LlamaIndex's MetadataFilters instead of kbpg's `filter`.
    `principal` runs every search as that database role (row-level security decides what it
    may read) and, with its `knowledge_base`, in that knowledge base
    (`principal=Principal(knowledge_base="ru")`). kbpg embeds the query with its own model: an
    embedding in the QueryBundle (another model's) is not used.

        retriever = KbpgRetriever.from_env(top=4)          # KBPG_DATABASE_URL or embedded
        retriever = KbpgRetriever.from_url("postgresql://kb@db/kb", top=4)
        retriever = KbpgRetriever(kb, top=4)               # a KnowledgeBase you hold
        nodes = retriever.retrieve("how do I renew a parking permit")

    from_env and from_url open a KnowledgeBase (a connection pool and the model): close it with
    `retriever.knowledge_base.close()` when done.
    """

    def __init__(
        self,
        knowledge_base: KnowledgeBase,
        *,
        principal: Principal | None = None,
        filters: MetadataFilters | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
        **search_options: Any,
    ) -> None:
        if filters is not None:
            if search_options.get("filter") is not None:
                raise InvalidInput(
                    "pass either filters (LlamaIndex's) or filter (kbpg's), not both"
                )
            search_options["filter"] = metadata_filter(filters)
        self.knowledge_base = knowledge_base
        self.principal = principal
        self.search_options = shared.search_options(search_options)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def from_env(cls, *, principal: Principal | None = None, **search_options: Any) -> Self:
        """A retriever on KBPG_DATABASE_URL (or the embedded server), the model loaded now."""
        return shared.opened(None, lambda kb: cls(kb, principal=principal, **search_options))

    @classmethod
    def from_url(
        cls, url: str, *, principal: Principal | None = None, **search_options: Any
    ) -> Self:
        """A retriever on the database at `url` (other settings from KBPG_*), model loaded now."""
        return shared.opened(url, lambda kb: cls(kb, principal=principal, **search_options))

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = shared.search(
            self.knowledge_base, query_bundle.query_str, self.search_options, self.principal
        )
        return _nodes(result)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = await shared.search_async(
            self.knowledge_base, query_bundle.query_str, self.search_options, self.principal
        )
        return _nodes(result)


def _nodes(result: SearchResult) -> list[NodeWithScore]:
    return [chunk_node(chunk) for chunk in result.chunks]
