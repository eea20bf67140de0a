"""`kbpg mcp`: the real server process over stdio, driven by the MCP SDK's own client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from kbpg.models.embedders import Embedder
from kbpg.store import db as kdb
from tests.helpers import KBPG
from tests.search_kb import DOCS, env_for, kb_env, kb_url, load_kb  # noqa: F401 - fixtures

Session = Callable[[ClientSession], Awaitable[None]]


@asynccontextmanager
async def mcp_session(env: dict[str, str], errlog: Any) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=KBPG, args=["mcp"], env=env)
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def run_session(env: dict[str, str], body: Session, errlog_path: Path) -> None:
    """Start `kbpg mcp` with `env`, run `body` against it, stop it (bounded in time)."""

    async def main() -> None:
        with errlog_path.open("w") as errlog, anyio.fail_after(240):
            async with mcp_session(env, errlog) as session:
                await body(session)

    anyio.run(main)


def _text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def test_tools_over_stdio(kb_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        tools = await session.list_tools()
        seen["tools"] = {tool.name: tool for tool in tools.tools}
        seen["search"] = await session.call_tool(
            "search_knowledge_base", {"query": "how do I renew a parking permit", "top": 3}
        )
        seen["filtered"] = await session.call_tool(
            "search_knowledge_base",
            {"query": "how do I renew a parking permit", "category": "library"},
        )
        seen["documents"] = await session.call_tool("list_documents", {})
        seen["page1"] = await session.call_tool("list_documents", {"limit": 2})
        seen["page2"] = await session.call_tool("list_documents", {"limit": 2, "offset": 2})
        seen["last"] = await session.call_tool("list_documents", {"limit": 2, "offset": 4})
        seen["limit0"] = await session.call_tool("list_documents", {"limit": 0})
        seen["document"] = await session.call_tool(
            "get_document", {"source": "city/parking/permits.md"}
        )
        seen["missing"] = await session.call_tool("get_document", {"source": "no/such.md"})
        seen["empty"] = await session.call_tool("search_knowledge_base", {"query": "   "})
        seen["top0"] = await session.call_tool(
            "search_knowledge_base", {"query": "permit", "top": 0}
        )
        seen["after"] = await session.call_tool(
            "search_knowledge_base", {"query": "parking fine", "top": 1}
        )

    run_session(kb_env, body, tmp_path / "stderr.log")

    tools = seen["tools"]
    assert set(tools) == {
        "search_knowledge_base",
        "list_documents",
        "get_document",
        "list_knowledge_bases",
    }
    schema = tools["search_knowledge_base"].input_schema
    assert schema["required"] == ["query"]
    assert {"top", "groups", "category", "labels"} <= set(schema["properties"])
    assert "question" in tools["search_knowledge_base"].description

    search = seen["search"]
    assert not search.is_error
    assert _text(search).startswith("[1] Parking permits > Renewing a permit\n")
    assert "Sources:" in _text(search)
    chunks = search.structured_content["chunks"]
    assert len(chunks) == 3
    assert chunks[0]["section"] == "Parking permits > Renewing a permit"
    assert {"vector_rank", "lexical_rank", "graph_rank", "score"} <= set(chunks[0])

    filtered = seen["filtered"].structured_content["chunks"]
    assert filtered and {c["source"] for c in filtered} == {"city/library/cards.md"}

    documents = seen["documents"].structured_content["documents"]
    assert "city/parking/permits.md" in {d["source"] for d in documents}
    # paged (issue 42): a limit, an offset, and where the next page starts
    every = [d["source"] for d in documents]
    assert len(every) == 5 and seen["documents"].structured_content["next_offset"] is None
    pages = [seen[k].structured_content for k in ("page1", "page2", "last")]
    assert [d["source"] for p in pages for d in p["documents"]] == every
    assert [p["next_offset"] for p in pages] == [2, 4, None]
    assert seen["limit0"].is_error and "limit must be 1 to 500" in _text(seen["limit0"])
    assert set(tools["list_documents"].input_schema["properties"]) == {
        "group",
        "limit",
        "offset",
        "kb",
    }

    document = seen["document"].structured_content
    assert document["title"] == "Parking permits"
    assert [c["ordinal"] for c in document["chunks"]] == [0, 1, 2, 3]
    assert document["chunks"][0]["content"].startswith("Residents renew")

    assert seen["missing"].is_error
    assert "no such document: no/such.md" in _text(seen["missing"])
    assert seen["empty"].is_error
    assert "the query must not be empty" in _text(seen["empty"])
    assert seen["top0"].is_error
    assert "top" in _text(seen["top0"])
    # the server survived the bad calls
    assert not seen["after"].is_error
    assert seen["after"].structured_content["chunks"][0]["source"] == "city/parking/fines.md"


def test_each_tool_takes_the_knowledge_base(
    new_database: Callable[..., str], embedder: Embedder, tmp_path: Path
) -> None:
    """`kb` on every tool: another knowledge base's documents (handbook holds two of the five),
    the server's own without it; a knowledge base that does not exist is a tool error."""
    url = new_database()
    load_kb(url, embedder)
    with kdb.connect(url, autocommit=True) as conn:
        row = conn.execute("select kb.create_knowledge_base('handbook')").fetchone()
    assert row is not None
    load_kb(kdb.in_knowledge_base(url, row[0]), embedder, docs=DOCS[:2])
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        seen["knowledge_bases"] = await session.call_tool("list_knowledge_bases", {})
        seen["own"] = await session.call_tool("list_documents", {})
        seen["listed"] = await session.call_tool("list_documents", {"kb": "handbook"})
        seen["search"] = await session.call_tool(
            "search_knowledge_base", {"query": "renew a parking permit", "top": 8, "kb": "handbook"}
        )
        seen["document"] = await session.call_tool(
            "get_document", {"source": DOCS[0].source, "kb": "handbook"}
        )
        seen["elsewhere"] = await session.call_tool(
            "get_document", {"source": DOCS[4].source, "kb": "handbook"}
        )
        seen["missing"] = await session.call_tool(
            "search_knowledge_base", {"query": "library card", "kb": "nothing"}
        )

    run_session(env_for(url, tmp_path / "home"), body, tmp_path / "stderr.log")
    handbook = sorted(d.source for d in DOCS[:2])
    listed = seen["knowledge_bases"].structured_content["knowledge_bases"]
    assert [(k["name"], k["documents"]) for k in listed] == [
        ("default", len(DOCS)),
        ("handbook", 2),
    ]
    assert listed[1]["model"] == listed[0]["model"] and listed[0]["chunks"] > listed[1]["chunks"]
    assert len(seen["own"].structured_content["documents"]) == len(DOCS)
    assert [d["source"] for d in seen["listed"].structured_content["documents"]] == handbook
    found = {c["source"] for c in seen["search"].structured_content["chunks"]}
    assert found and found <= set(handbook)
    assert seen["document"].structured_content["source"] == DOCS[0].source
    assert seen["elsewhere"].is_error and f"no such document: {DOCS[4].source}" in _text(
        seen["elsewhere"]
    )
    assert seen["missing"].is_error and 'no knowledge base "nothing"' in _text(seen["missing"])


def test_database_down_is_a_tool_error(tmp_path: Path) -> None:
    env = env_for("postgresql://kbpg@127.0.0.1:9/kbpg", tmp_path / "home")
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        seen["first"] = await session.call_tool("search_knowledge_base", {"query": "permit"})
        seen["second"] = await session.call_tool("list_documents", {})

    run_session(env, body, tmp_path / "stderr.log")
    for key in ("first", "second"):
        assert seen[key].is_error
        assert "cannot connect to PostgreSQL" in _text(seen[key])
        assert "Traceback" not in _text(seen[key])


@pytest.mark.parametrize("source", ["city/library/cards.md"])
def test_tool_errors_name_no_internals(
    kb_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
    source: str,
) -> None:
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        seen["ok"] = await session.call_tool("get_document", {"source": source})
        seen["nul"] = await session.call_tool("get_document", {"source": "a\x00b"})
        seen["badtype"] = await session.call_tool(
            "search_knowledge_base", {"query": "permit", "top": "many"}
        )

    run_session(kb_env, body, tmp_path / "stderr.log")
    assert not seen["ok"].is_error
    assert seen["nul"].is_error and "NUL" in _text(seen["nul"])
    assert seen["badtype"].is_error


def test_every_line_gets_an_answer_and_arguments_are_strict(
    kb_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The raw protocol, line by line: a lone surrogate got no response at all (the client
    waited forever), nor did a line that is not JSON; `top: "5"` and `top: true` were accepted
    and an unknown argument ignored. Now: the same strictness as the HTTP API."""
    import json
    import select
    import subprocess

    process = subprocess.Popen(
        [KBPG, "mcp"],
        env=kb_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr.log").open("w"),
    )
    assert process.stdin is not None and process.stdout is not None

    def exchange(line: str, wait: float = 120) -> dict[str, Any]:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(line.encode() + b"\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], wait)
        assert ready, f"no response to {line[:60]!r}"
        return dict(json.loads(process.stdout.readline()))

    def call(ident: int, name: str, arguments: dict[str, Any]) -> str:
        return json.dumps(
            {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
             "params": {"name": name, "arguments": arguments}}
        )  # fmt: skip

    try:
        hello = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        assert "result" in exchange(json.dumps(init), wait=240)
        process.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        surrogate = call(2, "search_knowledge_base", {"query": "a"}).replace('"a"', '"a\\ud800"')
        assert exchange(surrogate) == {
            "jsonrpc": "2.0",
            "id": 2,
            "error": {
                "code": -32600,
                "message": "Invalid request: a string holds a lone surrogate (not UTF-8)",
            },
        }
        assert exchange("{not json")["error"]["code"] == -32700
        for ident, arguments, message in (
            (3, {"query": "permit", "top": "5"}, "argument 'top' must be an integer, not a string"),
            (
                4,
                {"query": "permit", "top": True},
                "argument 'top' must be an integer, not a boolean",
            ),
            (5, {"query": "permit", "topp": 3}, "unknown argument 'topp'"),
            (6, {"top": 3}, "argument 'query' is required"),
            (7, {"query": "permit", "groups": "hr"}, "'groups' must be a list of strings"),
        ):
            result = exchange(call(ident, "search_knowledge_base", arguments))["result"]
            assert result["isError"], arguments
            assert message in result["content"][0]["text"], result
        result = exchange(call(8, "search_knowledge_base", {"query": "parking fine", "top": 1}))
        assert not result["result"]["isError"]
        assert result["result"]["structuredContent"]["chunks"][0]["source"].endswith("fines.md")
    finally:
        process.kill()
        process.wait()
