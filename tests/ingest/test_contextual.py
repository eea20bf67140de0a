"""Contextual retrieval: one chat call a document, fallbacks on length mismatch, failures."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbpg.ingest.contextual import (
    CONTEXT_SYSTEM,
    FALLBACK_BATCH,
    context_key,
    write_contexts,
)
from kbpg.models import ChatClient, ModelHTTP
from tests.model_servers import ModelServer


def numbered(messages: list[dict[str, str]]) -> list[int]:
    return [int(n) for n in re.findall(r"^\[(\d+)\] ", messages[-1]["content"], re.MULTILINE)]


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        running.chat_reply = lambda m: json.dumps([f"ctx {n}" for n in numbered(m)])
        yield running


def chat(server: ModelServer) -> ChatClient:
    return ChatClient(ModelHTTP(server.chat_url, retries=0, backoff_s=0.01), "ctx-model")


PASSAGES = [f"passage number {i}" for i in range(12)]


def test_one_call_per_document(server):
    result = write_contexts(chat(server), "Kayaks", "the whole document", PASSAGES)
    assert result.contexts == tuple(f"ctx {i}" for i in range(1, 13))
    assert (result.calls, result.failures) == (1, ())
    body = server.requests[0][1]
    assert body["messages"][0] == {"role": "system", "content": CONTEXT_SYSTEM}
    prompt = body["messages"][1]["content"]
    assert prompt.startswith("<document title='Kayaks'>\nthe whole document\n</document>")
    assert "[12] passage number 11" in prompt and body["temperature"] == 0.0


def test_wrong_length_falls_back_to_batches_then_single_passages(server):
    def reply(messages: list[dict[str, str]]) -> str:
        numbers = numbered(messages)
        if len(numbers) == len(PASSAGES):
            return json.dumps(["too", "short"])
        if numbers[0] == 1 and len(numbers) == FALLBACK_BATCH:
            return "I cannot do that"  # no array at all: this batch goes one by one
        return json.dumps([f"ctx {n}" for n in numbers])

    server.chat_reply = reply
    result = write_contexts(chat(server), "T", "doc", PASSAGES)
    assert result.contexts == tuple(f"ctx {i}" for i in range(1, 13))
    # 1 whole + 2 batches (8, 4) + 8 single passages of the failed batch
    assert result.calls == 11
    assert result.failures[0] == "the model answered 2 contexts for 12 passages"


def test_server_failure_leaves_contexts_missing_without_more_calls(server):
    server.script = ["500"]
    result = write_contexts(chat(server), "T", "doc", PASSAGES)
    assert result.contexts == (None,) * 12
    assert result.calls == 1 and server.calls["total"] == 1
    assert "HTTP 500" in result.failures[0]


def test_context_key_changes_with_each_input():
    base = context_key("chunk", "dochash", "m")
    assert base == context_key("chunk", "dochash", "m")
    assert (
        len(
            {
                base,
                context_key("chunk2", "dochash", "m"),
                context_key("chunk", "h2", "m"),
                context_key("chunk", "dochash", "m2"),
            }
        )
        == 4
    )


# -- end to end: ingest, search, re-ingest, model change, model down ---------------------------

KAYAK_DOCS = {
    "fees.md": "# Fees\n\nThe rental costs 20 euros an hour, paid at the front desk.\n",
    "hours.md": "# Opening hours\n\nThe boathouse opens at nine and closes at six.\n",
}


def context_reply(messages: list[dict[str, str]]) -> str:
    prompt = messages[-1]["content"]
    title = re.search(r"<document title='([^']*)'>", prompt)
    assert messages[0]["content"] == CONTEXT_SYSTEM and title is not None
    about = "kayak rentals" if title.group(1) == "Fees" else "the boathouse"
    return json.dumps(
        [f"From the {title.group(1)} page about {about}." for _ in numbered(messages)]
    )


def context_rows(url: str) -> list[tuple[str, str | None, str | None]]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select d.source, c.context, c.context_key from kb.chunks c "
            "join kb.documents d on d.id = c.document_id order by d.source, c.ordinal"
        ).fetchall()
    return [(Path(s).name, c, k) for s, c, k in rows]


def test_contextual_ingest_search_reingest_and_recontextualize(
    db_url: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.helpers import run_kbpg
    from tests.ingest.test_ingest import assert_bm25_stats_exact

    folder = tmp_path / "kb"
    folder.mkdir()
    for name, text in KAYAK_DOCS.items():
        (folder / name).write_text(text)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with ModelServer() as server:
        server.chat_reply = context_reply
        env = {**cli_env, "KBPG_CHAT_BASE_URL": server.chat_url, "KBPG_CHAT_MODEL": "ctx-a"}

        # the model is down: documents are ingested without context, marked missing
        down = run_kbpg(
            "ingest", str(folder), "--contextual", env={**env, "KBPG_CHAT_BASE_URL": dead}
        )
        assert down.returncode == 0, down.stderr
        assert "contexts: 0 written, 2 missing (2 model calls)" in down.stderr
        assert "kbpg recontextualize" in down.stderr
        assert [(s, c) for s, c, _ in context_rows(db_url)] == [
            ("fees.md", None),
            ("hours.md", None),
        ]
        assert all(k is not None for *_, k in context_rows(db_url))
        vector_only = ["search", "kayak", "--no-lexical", "--min-similarity", "-1", "--json"]

        def fees_similarity() -> float:
            chunks = json.loads(run_kbpg(*vector_only, env=env).stdout)["chunks"]
            return next(c["similarity"] for c in chunks if c["source"].endswith("fees.md"))

        before = fees_similarity()

        # a later run fills them in (progress on stderr), and BM25 finds the context's word
        filled = run_kbpg("recontextualize", "--json", env=env)
        assert filled.returncode == 0, filled.stderr
        report = json.loads(filled.stdout)
        assert (report["missing"], report["written"], report["model_calls"]) == (2, 2, 2)
        assert "recontextualize: 1 documents redone" in filled.stderr
        assert server.calls["total"] == 2
        found = json.loads(run_kbpg("search", "kayak", "--json", env=env).stdout)["chunks"]
        assert found[0]["source"].endswith("fees.md") and found[0]["lexical_rank"] == 1
        assert "kayak" not in found[0]["content"].lower()
        assert fees_similarity() > before + 0.1  # the context is in the embedded text too
        assert_bm25_stats_exact(db_url)

        # re-ingesting unchanged documents makes no model call
        again = run_kbpg("ingest", str(folder), "--contextual", env=env)
        assert again.returncode == 0 and "unchanged 2" in again.stderr
        assert server.calls["total"] == 2

        # a changed document is contextualised at ingest, one call for the document
        (folder / "hours.md").write_text(KAYAK_DOCS["hours.md"] + "\nClosed on Mondays.\n")
        changed = run_kbpg("ingest", str(folder), "--contextual", env=env)
        assert "contexts: 1 written, 0 missing (1 model calls)" in changed.stderr
        assert server.calls["total"] == 3

        # another model makes every context stale; recontextualize redoes them
        other = {**env, "KBPG_CHAT_MODEL": "ctx-b"}
        dry = json.loads(run_kbpg("recontextualize", "--dry-run", "--json", env=other).stdout)
        assert (dry["stale"], dry["missing"], dry["model_calls"]) == (2, 0, 0)
        redone = json.loads(run_kbpg("recontextualize", "--json", env=other).stdout)
        assert (redone["redone_documents"], redone["model_calls"]) == (2, 2)
        assert server.requests[-1][1]["model"] == "ctx-b"
        final = json.loads(run_kbpg("recontextualize", "--dry-run", "--json", env=other).stdout)
        assert (final["stale"], final["missing"]) == (0, 0)
        assert server.calls["total"] == 5
        assert_bm25_stats_exact(db_url)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
