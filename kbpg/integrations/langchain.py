"""A LangChain retriever over kbpg: `pip install 'kbpg[langchain]'`."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Self

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import BeforeValidator, ConfigDict, Field, create_model, model_validator

from kbpg.app import KnowledgeBase, Principal
from kbpg.errors import InvalidInput
from kbpg.integrations import shared
from kbpg.search.request import OPTIONS, check
from kbpg.search.results import Chunk, SearchResult

__all__ = ["KbpgRetriever", "chunk_document"]


def chunk_document(chunk: Chunk) -> Document:
    """A ranked chunk as a LangChain Document: its text, and where and why it was found."""
    return Document(
        id=str(chunk.chunk_id), page_content=chunk.content, metadata=shared.chunk_metadata(chunk)
    )


def _checked(name: str, value: Any) -> Any:
    try:
        return check(name, value)
    except InvalidInput as exc:  # pydantic reports ValueErrors as a ValidationError
        raise ValueError(exc.message) from None


def _with_search_options(base: type[BaseRetriever]) -> type[BaseRetriever]:
    """`base` with one pydantic field per SearchRequest option (default None: kbpg's default),
    typed and checked as SearchRequest declares it, so `KbpgRetriever(top=3)`, `.top` and
    LangChain's `configurable_fields(top=...)` work."""
    fields: dict[str, Any] = {
        name: (
            Annotated[kind, BeforeValidator(partial(_checked, name))],
            Field(default=None, description=OPTIONS[name].help),
        )
        for name, kind in shared.option_types().items()
    }
    return create_model("KbpgSearchOptions", __base__=base, __module__=__name__, **fields)


# Type checkers see BaseRetriever; at run time the base also has the option fields, generated
# from SearchRequest's one declaration (kbpg.search.request.OPTIONS), never copied by hand.
if TYPE_CHECKING:
    _RetrieverWithOptions = BaseRetriever
else:
    _RetrieverWithOptions = _with_search_options(BaseRetriever)


class KbpgRetriever(_RetrieverWithOptions):
    """kbpg's hybrid search (vector + BM25 + graph, fused in SQL) as a LangChain retriever.

    Every SearchRequest option (top, groups, category, labels, graph, rerank, ...) is a
    constructor keyword, checked when the retriever is built; keyword arguments of `invoke`
    override them for one call (None: back to kbpg's default). An unknown keyword is an error.
    `principal` runs every search as that database role (row-level security decides what it
    may read) and, with its `knowledge_base`, in that knowledge base:
    `principal=Principal(knowledge_base="ru")`.

        retriever = KbpgRetriever.from_env(top=4)               # KBPG_DATABASE_URL or embedded
        retriever = KbpgRetriever.from_url("postgresql://kb@db/kb", top=4)
        retriever = KbpgRetriever(knowledge_base=kb, top=4)     # a KnowledgeBase you hold
        docs = retriever.invoke("how do I renew a parking permit")

    from_env and from_url open a KnowledgeBase (a connection pool and the model): close it with
    `retriever.knowledge_base.close()` when done.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    knowledge_base: KnowledgeBase
    principal: Principal | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keywords(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [name for name in data if name not in cls.model_fields]
            if unknown:
                raise ValueError(
                    f"unknown keyword {unknown[0]!r}: KbpgRetriever takes knowledge_base, "
                    f"principal and the search options {', '.join(shared.SEARCH_OPTIONS)}"
                )
        return data

    @classmethod
    def from_env(cls, *, principal: Principal | None = None, **search_options: Any) -> Self:
        """A retriever on KBPG_DATABASE_URL (or the embedded server), the model loaded now."""
        return shared.opened(
            None, lambda kb: cls(knowledge_base=kb, principal=principal, **search_options)
        )

    @classmethod
    def from_url(
        cls, url: str, *, principal: Principal | None = None, **search_options: Any
    ) -> Self:
        """A retriever on the database at `url` (other settings from KBPG_*), model loaded now."""
        return shared.opened(
            url, lambda kb: cls(knowledge_base=kb, principal=principal, **search_options)
        )

    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        overrides.pop("verbose", None)  # invoke()'s own keyword, passed on by LangChain
        own = {name: getattr(self, name) for name in shared.SEARCH_OPTIONS}
        return shared.search_options(own, overrides)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **overrides: Any
    ) -> list[Document]:
        options = self._options(overrides)
        result = shared.search(self.knowledge_base, query, options, self.principal)
        for warning in result.warnings:
            run_manager.on_text(f"kbpg: {warning}\n")
        return _documents(result)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **overrides: Any
    ) -> list[Document]:
        options = self._options(overrides)
        result = await shared.search_async(self.knowledge_base, query, options, self.principal)
        for warning in result.warnings:
            await run_manager.on_text(f"kbpg: {warning}\n")
        return _documents(result)


def _documents(result: SearchResult) -> list[Document]:
    return [chunk_document(chunk) for chunk in result.chunks]
