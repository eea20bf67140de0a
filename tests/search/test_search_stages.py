"""Reranking and query expansion end to end: real MiniLM, real PostgreSQL, real model servers
on 127.0.0.1, through the Python API, the CLI and HTTP."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kbpg.app import KnowledgeBase
from kbpg.config import ModelSettings, Settings
from kbpg.errors import ConfigError
from kbpg.models.embedders import Embedder
from kbpg.search.stages import APPLIED, FAILED, SKIPPED
from tests.conftest import TEMPLATE_DB, create_database, drop_database
from tests.helpers import run_kbpg
from tests.http_server import running_server
from tests.model_servers import ModelServer
from tests.search_kb import Doc, env_for, load_kb
from tests.serve.test_http import AUTH, SEARCH, TOKEN

# The fused order puts the one-chunk "desk" documents first for the question; the
# term-overlap reranker, which reads titles (BM25 and the vector do not), prefers all four
# sections of the crossings document, whose title holds every word of the question.
DOCS = [
    *[
        Doc(
            f"desk{i}.md",
            f"Desk {i}",
            "desk",
            ["public"],
            [(f"Desk {i}", f"Zebra crossing permits are issued at permit desk {i}.")],
        )
        for i in range(4)
    ],
    Doc(
        "crossings.md",
        "Zebra crossing permit handbook",
        "roads",
        ["public"],
        [(f"Part {i}", f"Section {i}: fees and forms for a permit.") for i in range(4)],
    ),
    Doc(
        "trams.md",
        "Trams",
        "transport",
        ["public"],
        [
            ("Trams > Zephyrline", "The Zephyrline card gives a month of unlimited tram rides."),
            ("Trams > Night service", "Night trams run every thirty minutes after midnight."),
        ],
    ),
]
QUERY = "zebra crossing permit handbook"
# No word of it is in the knowledge base and MiniLM finds nothing similar enough (< 0.30).
NONSENSE = "blorptastic wibble"
PARAPHRASES = {NONSENSE: ["Zephyrline tram card", "a monthly tram pass"]}


@pytest.fixture(scope="module")
def stage_kb(admin_url: str, template_url: str, embedder: Embedder) -> Iterator[str]:
    name = f"kbpg_stages_{uuid.uuid4().hex[:10]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    try:
        load_kb(url, embedder, DOCS)
        yield url
    finally:
        drop_database(admin_url, name)


def paraphrase_reply(messages: list[dict[str, str]]) -> str:
    question = messages[-1]["content"].split("\n")[0].removeprefix("Query: ")
    return "Here you go:\n```json\n" + json.dumps(PARAPHRASES.get(question, [])) + "\n```"


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(slow_s=2.0) as running:
        running.chat_reply = paraphrase_reply
        yield running


def open_kb(url: str, embedder: Embedder, **models: object) -> KnowledgeBase:
    settings = replace(Settings.from_env(), models=ModelSettings(**models))  # type: ignore[arg-type]
    return KnowledgeBase(url, embedder, settings=settings, pool_size=1)


# -- reranking --------------------------------------------------------------------------------


def test_rerank_reorders_then_caps_in_sql(stage_kb, embedder, server):
    with open_kb(
        stage_kb, embedder, rerank="api", rerank_url=server.api_url, rerank_model="m"
    ) as kb:
        plain = kb.search(QUERY, top=4, rerank=False)
        reranked = kb.search(QUERY, top=4)  # KBPG_RERANK=api: on by default
    assert server.calls["/api/rerank"] == 1
    assert {c.source for c in plain} <= {"desk0.md", "desk1.md", "desk2.md", "desk3.md"}
    # the crossings doc's four sections lead the reranker's order; the cap keeps three of
    # them in front and the fourth place goes to another document
    assert [c.source for c in reranked] == ["crossings.md"] * 3 + [plain.chunks[0].source]
    assert reranked.chunks[3].chunk_id == plain.chunks[0].chunk_id
    assert [c.rerank_score for c in reranked] == [1.0, 1.0, 1.0, 0.75]
    assert all(c.fused_rank is not None and c.fused_rank > 4 for c in reranked.chunks[:3])
    assert reranked.chunks[3].fused_rank == 1
    (stage,) = reranked.stages
    assert (stage.stage, stage.status, stage.model) == ("rerank", APPLIED, "m")
    _, body = server.requests[0]
    assert body["query"] == QUERY and body["model"] == "m"
    assert body["top_n"] == len(body["documents"]) > 4  # the whole pool: 20 an arm, fused
    assert (
        "Zebra crossing permit handbook — Part 0\nSection 0: fees and forms for a permit."
        in body["documents"]
    )
    assert plain.stages == () and all(c.rerank_score is None for c in plain)


def test_rerank_off_by_default_makes_no_call(stage_kb, embedder, server):
    with open_kb(stage_kb, embedder, rerank_url=server.api_url, rerank_model="m") as kb:
        result = kb.search(QUERY, top=4)
        assert result.stages == ()
        with pytest.raises(ConfigError, match="no reranker is configured"):
            kb.search(QUERY, top=4, rerank=True)
    assert server.calls["total"] == 0


def test_rerank_skipped_when_the_pool_is_not_larger_than_top(stage_kb, embedder, server):
    with open_kb(stage_kb, embedder, rerank="tei", rerank_url=server.tei_url) as kb:
        result = kb.search(QUERY, top=50)
        plain = kb.search(QUERY, top=50, rerank=False)
    assert server.calls["total"] == 0
    (stage,) = result.stages
    assert stage.status == SKIPPED and stage.detail.startswith("the fused pool of ")
    assert [c.chunk_id for c in result] == [c.chunk_id for c in plain]


@pytest.mark.parametrize("action", ["500", "slow", "malformed"])
def test_rerank_failure_leaves_the_fused_order(stage_kb, embedder, server, action):
    server.script = [action, action]
    with open_kb(
        stage_kb,
        embedder,
        rerank="api",
        rerank_url=server.api_url,
        rerank_model="m",
        rerank_timeout_s=0.5,
    ) as kb:
        result = kb.search(QUERY, top=4)
        plain = kb.search(QUERY, top=4, rerank=False)
    assert [c.chunk_id for c in result] == [c.chunk_id for c in plain]
    assert [c.fused_rank for c in result] == [c.fused_rank for c in plain]
    (stage,) = result.stages
    assert stage.status == FAILED
    assert result.warnings == (
        f"kbpg: rerank stage failed ({stage.detail}); using the plain result",
    )


def test_llm_rerank_through_the_cli(stage_kb, server, tmp_path):
    env = env_for(
        stage_kb,
        tmp_path,
        KBPG_RERANK="llm",
        KBPG_CHAT_BASE_URL=server.chat_url,
        KBPG_CHAT_MODEL="judge",
    )
    off = run_kbpg("search", QUERY, "--top", "4", "--json", "--no-rerank", env=env)
    plain = [c["source"] for c in json.loads(off.stdout)["chunks"]]
    assert "crossings.md" not in plain
    proc = run_kbpg("search", QUERY, "--top", "4", "--json", "--explain", env=env)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert [c["source"] for c in payload["chunks"]] == ["crossings.md"] * 3 + plain[:1]
    assert payload["stages"][0]["status"] == "applied"
    assert payload["stages"][0]["model"] == "judge"
    assert "rerank_score" in proc.stderr and "llm reranked" in proc.stderr

    assert server.calls["/v1/chat/completions"] == 1


def test_rerank_failure_through_the_cli_warns_and_explains(stage_kb, server, tmp_path):
    server.script = ["500", "500"]
    env = env_for(
        stage_kb, tmp_path, KBPG_RERANK="api", KBPG_RERANK_URL=server.api_url, KBPG_RERANK_MODEL="m"
    )
    proc = run_kbpg("search", QUERY, "--top", "4", "--explain", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Warning: kbpg: rerank stage failed (reranker http://127.0.0.1:" in proc.stderr
    assert "HTTP 500" in proc.stderr
    assert "status: failed" in proc.stderr or ",failed," in proc.stderr


def test_rerank_without_a_reranker_is_an_error_in_the_cli(stage_kb, tmp_path):
    proc = run_kbpg("search", QUERY, "--rerank", env=env_for(stage_kb, tmp_path))
    assert proc.returncode == 1
    assert "Error: reranking was asked for, but no reranker is configured" in proc.stderr
    assert "Hint: set KBPG_RERANK" in proc.stderr


def test_rerank_and_expand_over_http(stage_kb, server, tmp_path: Path):
    env = env_for(
        stage_kb,
        tmp_path,
        KBPG_API_TOKEN=TOKEN,
        KBPG_RERANK_URL=server.tei_url,
        KBPG_RERANK="tei",
        KBPG_CHAT_BASE_URL=server.chat_url,
        KBPG_CHAT_MODEL="para",
    )
    with running_server(env, tmp_path / "serve.log") as client:
        response = client.post(SEARCH, json={"query": QUERY, "top": 4}, headers=AUTH)
        off = client.post(SEARCH, json={"query": QUERY, "top": 4, "rerank": False}, headers=AUTH)
        expanded = client.post(SEARCH, json={"query": NONSENSE, "expand": True}, headers=AUTH)
        bad = client.post(SEARCH, json={"query": QUERY, "rerank": "yes"}, headers=AUTH)
    assert response.status_code == 200
    payload = response.json()
    plain = [c["source"] for c in off.json()["chunks"]]
    assert [c["source"] for c in payload["chunks"]] == ["crossings.md"] * 3 + plain[:1]
    assert payload["stages"] == [
        {
            "stage": "rerank",
            "status": "applied",
            "detail": payload["stages"][0]["detail"],
            "model": "tei",
            "ms": payload["stages"][0]["ms"],
        }
    ]
    assert payload["chunks"][0]["rerank_score"] == 1.0
    assert off.json()["stages"] == []
    assert expanded.json()["chunks"][0]["section"] == "Trams > Zephyrline"
    assert bad.status_code == 422


# -- query expansion --------------------------------------------------------------------------


def test_expansion_paraphrase_finds_the_target_through_the_api(stage_kb, embedder, server):
    with open_kb(stage_kb, embedder, chat_base_url=server.chat_url, chat_model="para") as kb:
        plain = kb.search(NONSENSE, top=3)
        expanded = kb.search(NONSENSE, top=3, expand=True)
        again = kb.search(NONSENSE, top=3, expand=True)
    assert "Trams > Zephyrline" not in [c.section for c in plain]
    assert expanded.chunks[0].section == "Trams > Zephyrline"
    assert expanded.chunks[0].vector_rank == 1
    (stage,) = expanded.stages
    assert (stage.status, stage.detail) == (APPLIED, "2 paraphrases")
    assert again.stages[0].detail == "2 paraphrases (cached)"
    assert [c.chunk_id for c in again] == [c.chunk_id for c in expanded]
    assert server.calls["/v1/chat/completions"] == 1  # the second question hit the cache
    body = server.requests[0][1]
    assert body["model"] == "para" and body["temperature"] == 0.3


def test_expansion_through_sql_with_real_embeddings(stage_kb, embedder):
    import psycopg

    with psycopg.connect(stage_kb) as conn:
        from kbpg.store.db import register_types

        register_types(conn)
        question, *paraphrases = embedder.embed_documents([NONSENSE, *PARAPHRASES[NONSENSE]])
        plain = conn.execute(
            "select section from kb.search(%s, %s, match_count => 3)", (NONSENSE, question)
        ).fetchall()
        expanded = conn.execute(
            "select section, similarity from kb.search(%s, %s, match_count => 3, "
            "extra_embeddings => %s)",
            (NONSENSE, question, paraphrases),
        ).fetchall()
    assert ("Trams > Zephyrline",) not in plain
    assert expanded[0][0] == "Trams > Zephyrline"
    assert expanded[0][1] > 0.5


def test_expansion_through_the_cli_and_its_failure(stage_kb, server, tmp_path):
    env = env_for(stage_kb, tmp_path, KBPG_CHAT_BASE_URL=server.chat_url, KBPG_CHAT_MODEL="para")
    proc = run_kbpg("search", NONSENSE, "--expand", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chunks"][0]["section"] == "Trams > Zephyrline"
    server.script = ["prose"]
    failed = run_kbpg("search", NONSENSE, "--expand", "--json", "--explain", env=env)
    assert failed.returncode == 0, failed.stderr
    assert "Trams > Zephyrline" not in [c["section"] for c in json.loads(failed.stdout)["chunks"]]
    assert "Warning: kbpg: expand stage failed (" in failed.stderr
    on_by_default = run_kbpg("search", NONSENSE, "--json", env={**env, "KBPG_EXPAND": "true"})
    assert json.loads(on_by_default.stdout)["chunks"][0]["section"] == "Trams > Zephyrline"
    assert server.calls["/v1/chat/completions"] == 3


# -- kbpg eval --------------------------------------------------------------------------------


def test_eval_adds_rerank_and_expand_arms(server, tmp_path, cli_env):
    from tests.search.test_evaluate import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir

    dataset = write_beir(
        tmp_path / "tiny",
        [{"_id": s, "title": t, "text": x} for s, t, x in TINY_CORPUS],
        [{"_id": q, "text": t} for q, t in TINY_QUERIES],
        TINY_QRELS,
    )
    env = {
        **cli_env,
        "KBPG_RERANK": "api",
        "KBPG_RERANK_URL": server.api_url,
        "KBPG_RERANK_MODEL": "m",
        "KBPG_CHAT_BASE_URL": server.chat_url,
        "KBPG_CHAT_MODEL": "para",
    }
    # no similarity floor: every pool holds all 8 documents, more than top, so reranking fires
    server.chat_reply = lambda messages: json.dumps(
        [messages[-1]["content"].split("\n")[0].removeprefix("Query: ") + " explained"]
    )
    args = [
        "eval",
        str(dataset),
        "--json",
        "--top-k",
        "2",
        "--depth",
        "3",
        "--min-similarity",
        "-1",
    ]
    proc = run_kbpg(*args, "--rerank", "--expand", "--contextual", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert list(report["arms"]) == ["hybrid", "vector", "lexical", "rerank", "expand"]
    # every tiny query has one obvious answer; the term-overlap reranker keeps it first
    assert report["arms"]["rerank"]["mrr@2"] == 1.0
    assert report["arms"]["expand"]["mrr@2"] == 1.0
    assert server.calls["/api/rerank"] == 8  # 4 queries x (top-k call + depth call)
    # 8 documents contextualised (one call each), 4 queries expanded (the depth call hits
    # the cache)
    assert server.calls["/v1/chat/completions"] == 8 + 4

    missing = run_kbpg(*args, "--rerank", env=cli_env)
    assert missing.returncode == 1
    assert "Error: the rerank arm needs a reranker" in missing.stderr
    assert "ingesting" not in missing.stderr
