"""What every framework adapter does alike: the search options it takes, the search it runs
(sync, or async in a worker thread) and the metadata it reports for each chunk."""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any, TypeVar

from kbpg.app import Cancellation, KnowledgeBase, Principal
from kbpg.errors import KbpgError
from kbpg.search.request import OPTIONS, SearchRequest, check_options
from kbpg.search.results import Chunk, SearchResult

__all__ = [
    "LLM_METADATA",
    "SEARCH_OPTIONS",
    "chunk_metadata",
    "opened",
    "option_types",
    "search",
    "search_async",
    "search_options",
]

T = TypeVar("T")

# SearchRequest's options other than the query, in declaration order (top, groups, ...)
SEARCH_OPTIONS: tuple[str, ...] = tuple(name for name in OPTIONS if name != "query")

# the metadata that tells a language model where a chunk comes from; the rest (ranks, scores,
# ids) says why it was found, for programs
LLM_METADATA: tuple[str, ...] = ("source", "title", "section")


def option_types() -> dict[str, Any]:
    """Each search option's Python type, as SearchRequest declares it (`top`: int | None)."""
    hints = typing.get_type_hints(SearchRequest)
    return {name: hints[name] for name in SEARCH_OPTIONS}


def search_options(
    options: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`options` with `overrides` on top, checked by SearchRequest's rules; None means kbpg's
    default. An unknown name or a bad value raises InvalidInput."""
    return check_options({**options, **(overrides or {})})


def opened(url: str | None, build: Callable[[KnowledgeBase], T]) -> T:
    """`build` applied to a knowledge base opened on `url` (None: KBPG_DATABASE_URL, else the
    embedded server), the model loaded now; the knowledge base is closed if `build` fails."""
    knowledge_base = KnowledgeBase.from_env(url=url)
    try:
        return build(knowledge_base)
    except BaseException:
        knowledge_base.close()
        raise


def search(
    knowledge_base: KnowledgeBase,
    query: str,
    options: Mapping[str, Any],
    principal: Principal | None,
) -> SearchResult:
    """kbpg's search for `query` with checked options, as `principal`."""
    request = SearchRequest(query, **options)
    return knowledge_base.search(request, principal=principal)


async def search_async(
    knowledge_base: KnowledgeBase,
    query: str,
    options: Mapping[str, Any],
    principal: Principal | None,
) -> SearchResult:
    """`search` in a worker thread (kbpg's pool is synchronous), so the event loop runs on; when
    the awaiting task is cancelled, the search's SQL statement is cancelled too."""
    request = SearchRequest(query, **options)  # bad input fails here, not in the thread
    cancel = Cancellation()
    work = asyncio.ensure_future(
        asyncio.to_thread(knowledge_base.search, request, principal=principal, cancel=cancel)
    )
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        cancel.cancel()
        with suppress(KbpgError):  # the statement ends with query_canceled; nobody listens
            await work  # the connection is back in the pool before the cancellation goes on
        raise


def chunk_metadata(chunk: Chunk) -> dict[str, Any]:
    """Where a ranked chunk comes from and why it was found, as framework metadata."""
    return {
        "source": chunk.source,
        "title": chunk.document,
        "section": chunk.section,
        "rank": chunk.rank,
        "score": chunk.score,
        "similarity": chunk.similarity,
        "vector_rank": chunk.vector_rank,
        "lexical_rank": chunk.lexical_rank,
        "graph_rank": chunk.graph_rank,
        "fused_rank": chunk.fused_rank,
        "rerank_score": chunk.rerank_score,
        "chunk_id": chunk.chunk_id,
        "document_id": chunk.document_id,
    }
