"""The stages' own logic against real servers and SQL: rerank order, cap after it, paraphrases."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kbpg.models import ApiReranker, ChatClient, LlmReranker, ModelHTTP
from kbpg.models.clients import ExpansionCache
from kbpg.search.stages import (
    APPLIED,
    EXPAND_SYSTEM,
    FAILED,
    SKIPPED,
    cap_and_cut,
    paraphrases,
    rerank_order,
)
from tests.model_servers import ModelServer
from tests.sql.test_sql_search import search
from tests.sqldata import add_chunk, add_doc


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(slow_s=1.0) as running:
        yield running


def http(url: str, **kwargs: Any) -> ModelHTTP:
    return ModelHTTP(url, backoff_s=0.01, retries=0, **kwargs)


@pytest.fixture
def crowded(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Fused order favours four one-chunk docs; the reranker favours doc `zoo`'s 4 chunks."""
    zoo = add_doc(conn, "zoo.md")
    others = [add_doc(conn, f"other{i}.md") for i in range(4)]
    ids = {
        "others": [
            add_chunk(conn, doc, f"permit permit permit office {i}") for i, doc in enumerate(others)
        ],
        "zoo": [add_chunk(conn, zoo, f"zebra permit renewal desk {i}") for i in range(4)],
    }
    return {"ids": ids, "zoo": zoo}


def test_cap_runs_after_the_reranker(conn, crowded, server):
    ids = crowded["ids"]
    pool = search(conn, "permit", match_count=4, rerank_pool=20)
    assert [r["chunk_id"] for r in pool] == [*ids["others"], *ids["zoo"]]
    order, report = rerank_order(
        ApiReranker(http(server.api_url), "m"), "zebra permit renewal", pool, 4, 2000
    )
    assert report.status == APPLIED
    assert report.detail == "api reranked 8 of 8 fused candidates"
    reranked = [{**pool[i], "rerank_score": s} for i, s in order]
    assert [r["chunk_id"] for r in reranked][:4] == ids["zoo"]
    final = cap_and_cut(conn, reranked, 4, None)
    # the zoo's 4 chunks lead the reranker's order; the cap (3) leaves the 4th place to another
    assert [r["chunk_id"] for r in final] == [*ids["zoo"][:3], ids["others"][0]]
    assert [r["rank"] for r in final] == [1, 2, 3, 4]
    assert [r["fused_rank"] for r in final] == [5, 6, 7, 1]
    assert [r["rerank_score"] for r in final] == [1.0, 1.0, 1.0, pytest.approx(1 / 3)]
    assert [r["chunk_id"] for r in cap_and_cut(conn, reranked, 4, 1)] == [
        ids["zoo"][0],
        *ids["others"][:3],
    ]


def test_reranker_sees_title_section_and_content(conn, crowded, server):
    pool = search(conn, "permit", match_count=2, rerank_pool=20)
    rerank_order(ApiReranker(http(server.api_url), "m"), "permit", pool, 2, 30)
    documents = server.requests[0][1]["documents"]
    assert documents[0] == "OTHER0.MD\npermit permit permit office 0"[:30]
    assert all(len(d) <= 30 for d in documents)


def test_rerank_skipped_when_the_pool_is_not_larger_than_top(conn, crowded, server):
    pool = search(conn, "permit", match_count=8, rerank_pool=8)
    order, report = rerank_order(ApiReranker(http(server.api_url), "m"), "q", pool, 8, 2000)
    assert report.status == SKIPPED
    assert report.detail == "the fused pool of 8 is not larger than top 8"
    assert order == [(i, None) for i in range(8)]
    assert server.calls["total"] == 0


@pytest.mark.parametrize("action", ["500", "malformed", "slow"])
def test_rerank_failure_keeps_the_fused_order(conn, crowded, server, action, caplog):
    server.script = [action]
    pool = search(conn, "permit", match_count=2, rerank_pool=20)
    # only the slow reply (2 s) must outlast the budget; the others get time to arrive even
    # on a loaded machine (a 0.3 s budget for all three made "500" time out under load)
    budget = 0.3 if action == "slow" else 30.0
    reranker = ApiReranker(http(server.api_url, timeout_s=budget, budget_s=budget), "m")
    order, report = rerank_order(reranker, "zebra", pool, 2, 2000)
    assert order == [(i, None) for i in range(len(pool))]
    assert report.status == FAILED
    assert report.warning is not None and report.warning.startswith("kbpg: rerank stage failed (")
    assert report.warning in caplog.text
    # the slow reply is cut by the budget (the detail names it), not waited for
    expected = {"500": "HTTP 500", "malformed": "lacks 'index'", "slow": "ReadTimeout"}[action]
    assert expected in report.detail


def test_llm_rerank_stage(conn, crowded, server):
    pool = search(conn, "permit", match_count=4, rerank_pool=20)
    reranker = LlmReranker(ChatClient(http(server.chat_url), "chat"))
    order, report = rerank_order(reranker, "zebra renewal", pool, 4, 2000)
    assert report.status == APPLIED
    assert [i for i, _ in order][:4] == [4, 5, 6, 7]


# -- query expansion ------------------------------------------------------------------------


def expansion_reply(messages: list[dict[str, str]]) -> str:
    assert messages[0] == {"role": "system", "content": EXPAND_SYSTEM}
    question = messages[1]["content"].split("\n")[0].removeprefix("Query: ")
    return "Sure:\n" + json.dumps([f"{question} one", question, f"{question} two", 7, ""])


def test_paraphrases_and_cache(server):
    server.chat_reply = expansion_reply
    chat = ChatClient(http(server.chat_url), "chat")
    cache = ExpansionCache(max_entries=2)
    found, report = paraphrases(chat, "renew permit", 3, cache)
    # the question itself, a number and an empty string are dropped
    assert found == ("renew permit one", "renew permit two")
    assert (report.status, report.detail) == (APPLIED, "2 paraphrases")
    body = server.requests[0][1]
    assert body["temperature"] == 0.3
    assert "Write 3 different paraphrases" in body["messages"][1]["content"]
    again, report = paraphrases(chat, "renew permit", 3, cache)
    assert again == found and report.detail == "2 paraphrases (cached)"
    assert server.calls["total"] == 1
    paraphrases(chat, "a", 3, cache)
    paraphrases(chat, "b", 3, cache)  # evicts "renew permit" (size 2)
    paraphrases(chat, "renew permit", 3, cache)
    assert server.calls["total"] == 4


def test_failed_expansion_is_not_cached(server):
    server.chat_reply = expansion_reply
    server.script = ["prose"]
    chat = ChatClient(http(server.chat_url), "chat")
    cache = ExpansionCache()
    found, report = paraphrases(chat, "renew permit", 3, cache)
    assert found == ()
    assert report.status == FAILED and "no JSON array" in report.detail
    assert len(cache) == 0
    found, _ = paraphrases(chat, "renew permit", 3, cache)
    assert len(found) == 2 and server.calls["total"] == 2


def test_expansion_cache_expires() -> None:
    cache = ExpansionCache(ttl_s=0.05)
    cache.put(("m", 3, "q"), ("p",))
    assert cache.get(("m", 3, "q")) == ("p",)
    time.sleep(0.06)
    assert cache.get(("m", 3, "q")) is None
