"""`kbpg mcp`: the knowledge base as Model Context Protocol tools over stdio, for agents."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from kbpg import __version__
from kbpg.errors import InvalidInput, KbpgError
from kbpg.search.request import OPTIONS, SearchRequest
from kbpg.store.sessions import Principal

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase
    from kbpg.config import Settings

log = logging.getLogger("kbpg.mcp")

INSTRUCTIONS = (
    "kbpg is a knowledge base of documents cut into chunks. Call search_knowledge_base with "
    "the user's question in natural language to get the best chunks as a numbered context "
    "block with its sources; cite chunks by their [number]. list_documents shows what the "
    "knowledge base holds; get_document returns one document's chunks in reading order. "
    "A database may hold several knowledge bases: list_knowledge_bases names those this "
    "server may read; pass one's name as kb to the other tools."
)
# list_documents answers a page at a time: 275 documents unpaged were 138 KB of an agent's context
LIST_LIMIT = 50
KB_ARGUMENT = (
    "The knowledge base to read, by name; the server's own (kbpg mcp --kb, KBPG_KB) when "
    "omitted. Only when told which one to use."
)
MAX_LIST_LIMIT = 500
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

    def __init__(self, settings: Settings, embedder_name: str | None = None) -> None:
        self.settings = settings
        self.embedder_name = embedder_name
        self._kb: KnowledgeBase | None = None
        self._lock = threading.Lock()

    def knowledge_base(self) -> KnowledgeBase:
        from kbpg.app import KnowledgeBase

        with self._lock:
            if self._kb is None:
                self._kb = KnowledgeBase(settings=self.settings, embedder_name=self.embedder_name)
            return self._kb

    def close(self) -> None:
        with self._lock:
            if self._kb is not None:
                self._kb.close()
                self._kb = None

    def search(self, request: SearchRequest, kb: str | None = None) -> CallToolResult:
        with _tool_errors():
            result = self.knowledge_base().search(request, principal=_in(kb))
        payload = result.to_json()
        text = result.context or "No chunk of the knowledge base matches this question."
        for warning in result.warnings:
            text += f"\nWarning: {warning}"
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=payload
        )

    def documents(
        self, group: str | None, limit: int | None, offset: int | None, kb: str | None = None
    ) -> CallToolResult:
        """A page of the documents: `next_offset` is where the next page starts (None: done)."""
        from kbpg.store.catalog import list_documents

        limit = LIST_LIMIT if limit is None else limit
        offset = 0 if offset is None else offset
        with _tool_errors():
            if not 1 <= limit <= MAX_LIST_LIMIT or offset < 0:
                raise InvalidInput(
                    f"limit must be 1 to {MAX_LIST_LIMIT} and offset >= 0, not {limit}, {offset}",
                    hint="page with offset => next_offset",
                )
            found = list_documents(
                self.knowledge_base().db,
                group=group,
                principal=_in(kb),
                limit=limit + 1,
                offset=offset,
            )
        rows = [d.as_dict() for d in found[:limit]]
        more = len(found) > limit
        return _json_result(
            {"documents": rows, "offset": offset, "next_offset": offset + limit if more else None}
        )

    def knowledge_bases(self) -> CallToolResult:
        """The knowledge bases the server's role may read (kb.knowledge_bases()), default
        first, with the documents and chunks it may read in each."""
        from kbpg.store.knowledge_bases import list_all

        with _tool_errors():
            found = list_all(self.knowledge_base().db)
        return _json_result({"knowledge_bases": [k.as_dict() for k in found]})

    def document(self, source: str, kb: str | None = None) -> CallToolResult:
        from kbpg.store.catalog import document_chunks

        with _tool_errors():
            document = document_chunks(self.knowledge_base().db, source, principal=_in(kb))
        return _json_result(document.as_dict())


def _in(kb: str | None) -> Principal | None:
    """A tool call's knowledge base (None: the server's own, kbpg mcp --kb, KBPG_KB)."""
    return None if kb is None else Principal(knowledge_base=kb)


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


# Each tool's arguments and their JSON types, checked before the SDK converts anything: it
# reads a string holding JSON ("5") as the value (top: "5" was 5) and ignores names it does not
# know (a typo of an option was silently dropped). The same strictness as the HTTP API.
TOOL_ARGUMENTS: dict[str, dict[str, tuple[str, bool]]] = {
    "search_knowledge_base": {
        "query": ("string", True),
        "top": ("integer", False),
        "groups": ("list of strings", False),
        "category": ("string", False),
        "labels": ("list of strings", False),
        "filter": ("object", False),
        "recency": ("string", False),
        "recency_key": ("string", False),
        "diversity": ("number", False),
        "facets": ("list of strings", False),
        "kb": ("string", False),
    },
    "list_documents": {
        "group": ("string", False),
        "limit": ("integer", False),
        "offset": ("integer", False),
        "kb": ("string", False),
    },
    "get_document": {"source": ("string", True), "kb": ("string", False)},
}
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "list of strings"
    return {float: "number", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def has_surrogate(value: Any) -> bool:
    """A lone surrogate in any string of a JSON value (keys too): not UTF-8, not answerable."""
    if isinstance(value, str):
        return bool(_SURROGATE.search(value))
    if isinstance(value, list):
        return any(has_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    return False


def argument_problem(tool: str, arguments: Any) -> str | None:
    """What is wrong with a tool call's arguments (never quoting them), or None."""
    expected = TOOL_ARGUMENTS.get(tool)
    if expected is None:
        return None  # the SDK answers unknown tools itself
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return "the arguments must be an object"
    unknown = sorted(set(arguments) - set(expected))
    if unknown:
        names = ", ".join(repr(n) if not has_surrogate(n) else "(not UTF-8)" for n in unknown)
        return f"unknown argument {names}; {tool} takes {', '.join(expected)}"
    for name, (kind, required) in expected.items():
        if name not in arguments or arguments[name] is None:
            if required:
                return f"argument {name!r} is required ({kind})"
            continue
        found = _json_type(arguments[name])
        # (a JSON number may be written without a fraction: 1 is a number too)
        if found != kind and (kind, found) != ("number", "integer"):
            return f"argument {name!r} must be {_a(kind)}, not {_a(found)}"
    if has_surrogate(arguments):
        return "an argument holds a lone surrogate (not UTF-8): send valid Unicode"
    return None


class StrictArguments(ServerMiddleware[Any]):
    """Refuses a tools/call whose arguments do not match the tool's, as a tool error."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "tools/call" and ctx.params is not None:
            problem = argument_problem(str(ctx.params.get("name")), ctx.params.get("arguments"))
            if problem is not None:
                return CallToolResult(
                    content=[TextContent(type="text", text=problem)], is_error=True
                )
        return await call_next(ctx)


def create_server(tools: KnowledgeBaseTools) -> MCPServer[Any]:
    """The MCP server with kbpg's four tools over `tools`."""
    server: MCPServer[Any] = MCPServer(
        "kbpg",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        middleware=[StrictArguments()],
    )

    @server.tool(
        name="search_knowledge_base",
        title="Search the knowledge base",
        annotations=_READ_ONLY,
        description=(
            "Find the passages of the knowledge base that answer a question. Returns an "
            "LLM-ready context block: numbered chunks ([1], [2], ...) with their document and "
            "section, then the sources they come from; the structured result also lists each "
            "chunk with its fused score, its similarity to the question and its rank per "
            "retrieval arm. Use it before answering any "
            "question about the documents; ask in plain language (not keywords or SQL)."
        ),
    )
    def search_knowledge_base(
        query: Annotated[str, Field(description=_described("query"))],
        top: Annotated[int | None, Field(description=_described("top") + " Default 8.")] = None,
        groups: Annotated[list[str] | None, Field(description=_described("groups"))] = None,
        category: Annotated[str | None, Field(description=_described("category"))] = None,
        labels: Annotated[list[str] | None, Field(description=_described("labels"))] = None,
        filter: Annotated[dict[str, Any] | None, Field(description=_described("filter"))] = None,
        recency: Annotated[str | None, Field(description=_described("recency"))] = None,
        recency_key: Annotated[str | None, Field(description=_described("recency_key"))] = None,
        diversity: Annotated[float | None, Field(description=_described("diversity"))] = None,
        facets: Annotated[list[str] | None, Field(description=_described("facets"))] = None,
        kb: Annotated[str | None, Field(description=KB_ARGUMENT)] = None,
    ) -> CallToolResult:
        with _tool_errors():
            request = SearchRequest(
                query,
                top=top,
                groups=None if groups is None else tuple(groups),
                category=category,
                labels=None if labels is None else tuple(labels),
                filter=filter,
                recency=recency,
                recency_key=recency_key,
                diversity=diversity,
                facets=None if facets is None else tuple(facets),
            )
        return tools.search(request, kb)

    @server.tool(
        name="list_documents",
        title="List the documents",
        annotations=_READ_ONLY,
        description=(
            "List the documents in the knowledge base: source (its id or path), title, "
            "category, groups, labels and number of chunks, by source, a page at a time "
            f"({LIST_LIMIT} unless limit says otherwise); next_offset is the offset of the next "
            "page (null after the last). Use it to see what the knowledge base covers, or to "
            "find a source for get_document."
        ),
    )
    def list_documents(
        group: Annotated[str | None, Field(description="Only documents in this group.")] = None,
        limit: Annotated[
            int | None,
            Field(description=f"Documents per page, 1 to {MAX_LIST_LIMIT}. Default {LIST_LIMIT}."),
        ] = None,
        offset: Annotated[
            int | None, Field(description="Skip this many documents (a next_offset). Default 0.")
        ] = None,
        kb: Annotated[str | None, Field(description=KB_ARGUMENT)] = None,
    ) -> CallToolResult:
        return tools.documents(group, limit, offset, kb)

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
        kb: Annotated[str | None, Field(description=KB_ARGUMENT)] = None,
    ) -> CallToolResult:
        return tools.document(source, kb)

    @server.tool(
        name="list_knowledge_bases",
        title="List the knowledge bases",
        annotations=_READ_ONLY,
        description=(
            "List the knowledge bases of this database that the server may read, default "
            "first: name, language, embedding model, and how many documents and chunks it may "
            "read in each. Pass a name as kb to search_knowledge_base, list_documents or "
            "get_document to read that one; without kb they read the server's own."
        ),
    )
    def list_knowledge_bases() -> CallToolResult:
        return tools.knowledge_bases()

    return server


class _Wire:
    """The transport's stdout: each message written and flushed whole, ours and the SDK's alike
    (two writers must never interleave inside a line)."""

    def __init__(self, out: anyio.AsyncFile[str]) -> None:
        self._out = out
        self._lock = anyio.Lock()

    async def write(self, text: str) -> None:
        async with self._lock:
            await self._out.write(text)
            await self._out.flush()

    async def flush(self) -> None:
        return None


class _CheckedLines:
    """The transport's stdin: lines that are JSON go on to the SDK; a line that is not gets a
    JSON-RPC parse error (-32700), and a message with a lone surrogate (not UTF-8) an invalid
    request error (-32600), never echoing it. The SDK answered neither: the client waited."""

    def __init__(self, lines: anyio.AsyncFile[str], wire: _Wire) -> None:
        self._lines = lines
        self._wire = wire

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async for line in self._lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                await self._reply(None, -32700, "Parse error: the line is not a JSON value")
                continue
            if has_surrogate(message):
                ident = message.get("id") if isinstance(message, dict) else None
                if ident is not None and not isinstance(ident, int | str):
                    ident = None
                if isinstance(ident, str) and has_surrogate(ident):
                    ident = None
                if not isinstance(message, dict) or "id" in message:
                    await self._reply(
                        ident,
                        -32600,
                        "Invalid request: a string holds a lone surrogate (not UTF-8)",
                    )
                continue
            yield line

    async def _reply(self, ident: int | str | None, code: int, message: str) -> None:
        error = {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}
        await self._wire.write(json.dumps(error) + "\n")


async def _run_stdio(server: MCPServer[Any]) -> None:
    """What MCPServer.run("stdio") does, over checked lines: stdin and stdout are taken off fd 0
    and 1 (fd 1 then points at stderr, so nothing printed by accident reaches the wire)."""
    wire_in = os.fdopen(os.dup(0), "rb", closefd=True)
    wire_out = os.fdopen(os.dup(1), "wb", closefd=True)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    stdin = anyio.wrap_file(io.TextIOWrapper(wire_in, encoding="utf-8", errors="replace"))
    wire = _Wire(anyio.wrap_file(io.TextIOWrapper(wire_out, encoding="utf-8")))
    # the SDK's own runner over our streams (MCPServer.run_stdio_async opens its own)
    lowlevel = server._lowlevel_server
    async with stdio_server(stdin=_CheckedLines(stdin, wire), stdout=wire) as (read, write):  # type: ignore[arg-type]
        await lowlevel.run(read, write, lowlevel.create_initialization_options())


def serve(settings: Settings, embedder_name: str | None = None) -> None:
    """Load the model, then answer MCP requests on stdin/stdout until the client closes."""
    tools = KnowledgeBaseTools(settings, embedder_name)
    try:  # the knowledge base's model (or the one named), loaded before the first request
        tools.knowledge_base().embedder  # noqa: B018
    except KbpgError as exc:  # the database is down: the model loads on the first call
        log.warning("the model loads on the first call: %s", exc.message)
    try:
        anyio.run(_run_stdio, create_server(tools))
    finally:
        tools.close()
