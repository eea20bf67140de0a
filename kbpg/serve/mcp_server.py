"""`kbpg mcp`: the knowledge base as Model Context Protocol tools over stdio, for agents."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from kbpg import __version__
from kbpg.errors import KbpgError
from kbpg.search.request import OPTIONS, SearchRequest

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase
    from kbpg.config import Settings
    from kbpg.models.embedders import Embedder

log = logging.getLogger("kbpg.mcp")

INSTRUCTIONS = (
    "kbpg is a knowledge base of documents cut into chunks. Call search_knowledge_base with "
    "the user's question in natural language to get the best chunks as a numbered context "
    "block with its sources; cite chunks by their [number]. list_documents shows what the "
    "knowledge base holds; get_document returns one document's chunks in reading order."
)
_READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def _described(name: str) -> str:
    """A SearchRequest field's help text, so the tools say what the CLI says."""
    return OPTIONS[name].help


class KnowledgeBaseTools:
    """What the tools do, over one KnowledgeBase.

    The embedding model loads once, when the server starts; the database is opened on the
    first call that needs it and again after it was unreachable, so a database that is down
    gives tool errors, never a dead server.
    """

    def __init__(self, settings: Settings, embedder: Embedder) -> None:
        self.settings = settings
        self.embedder = embedder
        self._kb: KnowledgeBase | None = None
        self._lock = threading.Lock()

    def knowledge_base(self) -> KnowledgeBase:
        from kbpg.app import KnowledgeBase

        with self._lock:
            if self._kb is None:
                self._kb = KnowledgeBase(settings=self.settings, embedder=self.embedder)
            return self._kb

    def close(self) -> None:
        with self._lock:
            if self._kb is not None:
                self._kb.close()
                self._kb = None

    def search(self, request: SearchRequest) -> CallToolResult:
        with _tool_errors():
            result = self.knowledge_base().search(request)
        payload = result.to_json()
        text = result.context or "No chunk of the knowledge base matches this question."
        for warning in result.warnings:
            text += f"\nWarning: {warning}"
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=payload
        )

    def documents(self, group: str | None) -> CallToolResult:
        from kbpg.store.catalog import list_documents

        with _tool_errors():
            rows = [d.as_dict() for d in list_documents(self.knowledge_base().db, group=group)]
        return _json_result({"documents": rows})

    def document(self, source: str) -> CallToolResult:
        from kbpg.store.catalog import document_chunks

        with _tool_errors():
            document = document_chunks(self.knowledge_base().db, source)
        return _json_result(document.as_dict())


def _json_result(payload: dict[str, Any]) -> CallToolResult:
    text = json.dumps(payload, ensure_ascii=False, indent=1, default=str)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=payload)


@contextmanager
def _tool_errors() -> Iterator[None]:
    """kbpg's errors as the model reads them: what went wrong and what to do, no traceback."""
    try:
        yield
    except KbpgError as exc:
        raise ToolError(exc.message + (f" (hint: {exc.hint})" if exc.hint else "")) from exc


def create_server(tools: KnowledgeBaseTools) -> MCPServer[Any]:
    """The MCP server with kbpg's three tools over `tools`."""
    server: MCPServer[Any] = MCPServer(
        "kbpg", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )

    @server.tool(
        name="search_knowledge_base",
        title="Search the knowledge base",
        annotations=_READ_ONLY,
        description=(
            "Find the passages of the knowledge base that answer a question. Returns an "
            "LLM-ready context block: numbered chunks ([1], [2], ...) with their document and "
            "section, then the sources they come from; the structured result also lists each "
            "chunk with its score and rank per retrieval arm. Use it before answering any "
            "question about the documents; ask in plain language (not keywords or SQL)."
        ),
    )
    def search_knowledge_base(
        query: Annotated[str, Field(description=_described("query"))],
        top: Annotated[int | None, Field(description=_described("top") + " Default 8.")] = None,
        groups: Annotated[list[str] | None, Field(description=_described("groups"))] = None,
        category: Annotated[str | None, Field(description=_described("category"))] = None,
        labels: Annotated[list[str] | None, Field(description=_described("labels"))] = None,
    ) -> CallToolResult:
        with _tool_errors():
            request = SearchRequest(
                query,
                top=top,
                groups=None if groups is None else tuple(groups),
                category=category,
                labels=None if labels is None else tuple(labels),
            )
        return tools.search(request)

    @server.tool(
        name="list_documents",
        title="List the documents",
        annotations=_READ_ONLY,
        description=(
            "List the documents in the knowledge base: source (its id or path), title, "
            "category, groups, labels and number of chunks. Use it to see what the knowledge "
            "base covers, or to find a source for get_document."
        ),
    )
    def list_documents(
        group: Annotated[str | None, Field(description="Only documents in this group.")] = None,
    ) -> CallToolResult:
        return tools.documents(group)

    @server.tool(
        name="get_document",
        title="Read one document",
        annotations=_READ_ONLY,
        description=(
            "Return every chunk of one document in reading order (section and text), by its "
            "source as search_knowledge_base or list_documents show it. Use it when a search "
            "hit needs its surrounding text."
        ),
    )
    def get_document(
        source: Annotated[str, Field(description="The document's source.")],
    ) -> CallToolResult:
        return tools.document(source)

    return server


def serve(settings: Settings, embedder_name: str | None = None) -> None:
    """Load the model, then answer MCP requests on stdin/stdout until the client closes."""
    from kbpg.models.embedders import get_embedder

    embedder = get_embedder(settings, embedder_name)
    load = getattr(embedder, "load", None)
    if callable(load):
        load()
    tools = KnowledgeBaseTools(settings, embedder)
    try:
        create_server(tools).run("stdio")
    finally:
        tools.close()
