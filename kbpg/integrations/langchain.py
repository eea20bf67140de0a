"""A LangChain retriever over kbpg: `pip install 'kbpg[langchain]'`."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

from kbpg.app import KnowledgeBase, Principal
from kbpg.errors import InvalidInput
from kbpg.search.request import SearchRequest
from kbpg.search.results import Chunk

__all__ = ["KbpgRetriever", "chunk_document"]


def chunk_document(chunk: Chunk) -> Document:
    """A ranked chunk as a LangChain Document: its text, and where and why it was found."""
    return Document(
        page_content=chunk.content,
        metadata={
            "source": chunk.source,
            "title": chunk.document,
            "section": chunk.section,
            "rank": chunk.rank,
            "score": chunk.score,
            "similarity": chunk.similarity,
            "vector_rank": chunk.vector_rank,
            "lexical_rank": chunk.lexical_rank,
            "graph_rank": chunk.graph_rank,
            "rerank_score": chunk.rerank_score,
            "chunk_id": chunk.chunk_id,
            "document_id": chunk.document_id,
        },
    )


class KbpgRetriever(BaseRetriever):
    """kbpg's hybrid search (vector + BM25 + graph, fused in SQL) as a LangChain retriever.

    `search_options` are SearchRequest's fields (top, groups, category, labels, graph,
    rerank, ...), checked when the retriever is built; keyword arguments of `invoke` override
    them for one call. `principal` runs every search as that database role (row-level
    security decides what it may read). The knowledge base is the caller's: close it when done.

        kb = KnowledgeBase.from_env()
        retriever = KbpgRetriever(knowledge_base=kb, search_options={"top": 4})
        docs = retriever.invoke("how do I renew a parking permit")
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    knowledge_base: KnowledgeBase
    search_options: dict[str, Any] = Field(default_factory=dict)
    principal: Principal | None = None

    @field_validator("search_options")
    @classmethod
    def _known_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        if "query" in options:
            raise ValueError("the query is what invoke() is given, not a search option")
        try:
            SearchRequest("options check", **options)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        except TypeError as exc:  # an option SearchRequest does not have
            raise ValueError(str(exc)) from None
        return options

    @classmethod
    def from_env(cls, **search_options: Any) -> KbpgRetriever:
        """A retriever on KBPG_DATABASE_URL (or the embedded server), the model loaded now."""
        return cls(knowledge_base=KnowledgeBase.from_env(), search_options=search_options)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **overrides: Any
    ) -> list[Document]:
        request = SearchRequest(query, **{**self.search_options, **overrides})
        result = self.knowledge_base.search(request, principal=self.principal)
        for warning in result.warnings:
            run_manager.on_text(f"kbpg: {warning}\n")
        return [chunk_document(chunk) for chunk in result.chunks]
