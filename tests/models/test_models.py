"""Model clients (rerank API, TEI, LLM listwise, chat) against real local HTTP servers."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from kbpg.config import ModelSettings
from kbpg.errors import ConfigError, ModelError
from kbpg.models import (
    ApiReranker,
    ChatClient,
    LlmReranker,
    ModelHTTP,
    RerankHit,
    TeiReranker,
    as_positions,
    document_text,
    full_order,
    make_chat,
    make_reranker,
    parse_json_array,
)
from kbpg.models.rerank import LLM_RERANK_SYSTEM
from tests.model_servers import ModelServer

DOCS = [
    "library opening hours on sundays",
    "renew a parking permit online",
    "parking permit fees for residents who renew",
    "bicycle lanes in the city centre",
]
QUERY = "renew parking permit"


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(api_key="sekret", slow_s=1.5) as running:
        yield running


def http(url: str, **kwargs: object) -> ModelHTTP:
    options: dict[str, object] = {"api_key": "sekret", "backoff_s": 0.01, "retries": 1}
    options.update(kwargs)
    return ModelHTTP(url, **options)  # type: ignore[arg-type]


# -- JSON arrays out of chat answers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("[3, 1, 2]", [3, 1, 2]),
        ("Sure! The ranking is [2, 1] as requested.", [2, 1]),
        ('```json\n["a", "b"]\n```', ["a", "b"]),
        ("Ranking:\n```\n[1,\n 2]\n```\nThe [citation] is fine.", [1, 2]),
        ('{"ranking": [4, 2]}', [4, 2]),
        ("see [note] then [5, 6]", [5, 6]),
        ('["a [b] c", "d"]', ["a [b] c", "d"]),
    ],
)
def test_parse_json_array_tolerates_wrapping(answer: str, expected: list[object]) -> None:
    assert parse_json_array(answer) == expected


@pytest.mark.parametrize("answer", ["no array here", "", '{"a": 1}', "[1, 2"])
def test_parse_json_array_without_array_is_a_model_error(answer: str) -> None:
    with pytest.raises(ModelError, match="no JSON array"):
        parse_json_array(answer)


def test_positions_drop_repeats_unknowns_and_junk() -> None:
    assert as_positions([3, "1", 3, 9, 0, "[2]", True, None, 2.0, "x"], 4) == [2, 0, 1]
    order = full_order([RerankHit(2, 0.9), RerankHit(0, 0.5)], 4)
    assert order == [(2, 0.9), (0, 0.5), (1, None), (3, None)]


def test_document_text_has_title_section_content_and_a_bound() -> None:
    assert document_text("Parking", "Parking > Renewal", " Renew online. ", 100) == (
        "Parking > Renewal\nRenew online."
    )
    assert document_text("Parking", "Renewal", "Renew online.", 100) == (
        "Parking — Renewal\nRenew online."
    )
    assert document_text("Parking", "", "x" * 500, 50) == ("Parking\n" + "x" * 500)[:50]


# -- rerank API (Cohere / Jina / vLLM / Infinity / LiteLLM) ---------------------------------------


def test_api_reranker_sends_the_shared_body_and_reorders(server: ModelServer) -> None:
    reranker = ApiReranker(http(server.api_url), "rerank-test")
    hits = reranker.rerank(QUERY, DOCS)
    assert server.requests == [
        (
            "/api/rerank",
            {"model": "rerank-test", "query": QUERY, "documents": DOCS, "top_n": 4},
        )
    ]
    assert [h.index for h in hits] == [1, 2, 0, 3]
    assert [h.score for h in hits] == [1.0, 1.0, 0.0, 0.0]


def test_api_reranker_short_answer_is_completed_in_fused_order(server: ModelServer) -> None:
    server.script = ["short"]
    hits = ApiReranker(http(server.api_url), "m").rerank(QUERY, DOCS)
    assert [h.index for h in hits] == [1, 2]
    assert full_order(hits, len(DOCS)) == [(1, 1.0), (2, 1.0), (0, None), (3, None)]


def test_api_reranker_malformed_answer_is_a_model_error(server: ModelServer) -> None:
    server.script = ["malformed"]
    with pytest.raises(ModelError, match="lacks 'index'"):
        ApiReranker(http(server.api_url), "m").rerank(QUERY, DOCS)


def test_api_reranker_retries_a_500_then_succeeds(server: ModelServer) -> None:
    server.script = ["500"]
    hits = ApiReranker(http(server.api_url), "m").rerank(QUERY, DOCS)
    assert hits[0].index == 1
    assert server.calls["/api/rerank"] == 2


def test_api_reranker_gives_up_on_repeated_500(server: ModelServer) -> None:
    server.script = ["500", "500", "500"]
    with pytest.raises(ModelError, match=r"failed after 2 attempts \(HTTP 500") as info:
        ApiReranker(http(server.api_url), "m").rerank(QUERY, DOCS)
    assert server.calls["/api/rerank"] == 2
    assert info.value.message.startswith("model server http://127.0.0.1:")


def test_wrong_key_is_refused_without_retry(server: ModelServer) -> None:
    client = http(server.api_url, api_key="wrong", hint_refused="check the key")
    with pytest.raises(ModelError, match="HTTP 401") as info:
        ApiReranker(client, "m").rerank(QUERY, DOCS)
    assert info.value.hint == "check the key"
    assert server.calls["/api/rerank"] == 1


def test_slow_server_times_out_within_the_budget(server: ModelServer) -> None:
    # a server that would answer only after a minute: the call returns at all because the
    # budget ends it (no wall-clock assertion: the attempt count shows the budget at work)
    server.slow_s = 60.0
    server.script = ["slow", "slow", "slow", "slow"]
    client = http(server.api_url, timeout_s=0.6, budget_s=1.0, retries=3)
    with pytest.raises(ModelError, match=r"failed after [12] attempts? \(ReadTimeout"):
        ApiReranker(client, "m").rerank(QUERY, DOCS)
    # retries=3 allows four; the 1.0 s budget leaves room for one 0.6 s attempt and, if the
    # back-off fits, a shorter second one
    assert server.calls["/api/rerank"] in (1, 2)


def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = http(f"http://127.0.0.1:{port}/rerank", hint_unreachable="start it")
    with pytest.raises(ModelError, match="ConnectError") as info:
        TeiReranker(client).rerank(QUERY, DOCS)
    assert info.value.hint == "start it"
    assert client.requests_made == 2


# -- Hugging Face TEI -----------------------------------------------------------------------------


def test_tei_reranker_sends_its_body_and_reads_a_bare_list(server: ModelServer) -> None:
    hits = TeiReranker(http(server.tei_url)).rerank("bicycle lanes", DOCS)
    assert server.requests == [
        ("/tei/rerank", {"query": "bicycle lanes", "texts": DOCS, "truncate": True})
    ]
    assert [h.index for h in hits] == [3, 0, 1, 2]
    assert hits[0].score == 1.0


def test_tei_reranker_non_json_answer_is_a_model_error(server: ModelServer) -> None:
    server.script = ["malformed"]
    with pytest.raises(ModelError, match="not JSON"):
        TeiReranker(http(server.tei_url)).rerank(QUERY, DOCS)


# -- LLM listwise over chat completions ---------------------------------------------------------


def test_llm_reranker_prompt_and_tolerant_parsing(server: ModelServer) -> None:
    chat = ChatClient(http(server.chat_url), "chat-test")
    hits = LlmReranker(chat).rerank(QUERY, DOCS)
    # the server wraps [2, 3, 1, 4] in prose and a fence and adds a repeat and an unknown 11
    assert [h.index for h in hits] == [1, 2, 0, 3]
    assert [h.score for h in hits] == [1.0, 0.75, 0.5, 0.25]
    path, body = server.requests[0]
    assert path == "/v1/chat/completions"
    assert body["model"] == "chat-test"
    assert body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": LLM_RERANK_SYSTEM}
    prompt = body["messages"][1]["content"]
    assert prompt.startswith(f"Query: {QUERY}\n\nPassages:\n[1] {DOCS[0]}\n\n[2] {DOCS[1]}")
    assert "Rank all 4 passages" in prompt


def test_llm_reranker_short_list_keeps_the_rest_in_fused_order(server: ModelServer) -> None:
    server.script = ["short"]
    hits = LlmReranker(ChatClient(http(server.chat_url), "m")).rerank(QUERY, DOCS)
    assert [h.index for h in hits] == [1]
    assert [i for i, _ in full_order(hits, 4)] == [1, 0, 2, 3]


@pytest.mark.parametrize(
    ("action", "match"), [("prose", "no JSON array"), ("malformed", "no choices")]
)
def test_llm_reranker_unusable_answers_are_model_errors(
    server: ModelServer, action: str, match: str
) -> None:
    server.script = [action]
    with pytest.raises(ModelError, match=match):
        LlmReranker(ChatClient(http(server.chat_url), "m")).rerank(QUERY, DOCS)


def test_chat_client_passes_model_temperature_and_max_tokens(server: ModelServer) -> None:
    server.chat_reply = lambda messages: "echo: " + messages[-1]["content"]
    chat = ChatClient(http(server.chat_url), "chat-test")
    assert chat.complete([{"role": "user", "content": "hi"}], temperature=0.3, max_tokens=9) == (
        "echo: hi"
    )
    assert server.requests[0][1] == {
        "model": "chat-test",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "max_tokens": 9,
    }


# -- settings -> clients --------------------------------------------------------------------------


def test_make_reranker_from_settings(server: ModelServer) -> None:
    assert make_reranker(ModelSettings()) is None
    api = make_reranker(
        ModelSettings(
            rerank="api", rerank_url=server.api_url, rerank_model="m", rerank_api_key="sekret"
        )
    )
    assert isinstance(api, ApiReranker)
    assert [h.index for h in api.rerank(QUERY, DOCS)][:2] == [1, 2]
    llm = make_reranker(
        ModelSettings(rerank="llm", chat_base_url=server.chat_url, chat_model="c"), "llm"
    )
    assert isinstance(llm, LlmReranker) and llm.model == "c"
    with pytest.raises(ConfigError, match="needs KBPG_RERANK_URL"):
        make_reranker(ModelSettings(rerank="tei"))
    with pytest.raises(ConfigError, match="no chat model server"):
        make_chat(ModelSettings())


def test_model_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBPG_RERANK", "TEI")
    monkeypatch.setenv("KBPG_RERANK_TIMEOUT", "2.5")
    settings = ModelSettings.from_env()
    assert (settings.rerank, settings.rerank_timeout_s, settings.rerank_initial_k) == (
        "tei",
        2.5,
        20,
    )
    monkeypatch.setenv("KBPG_RERANK", "cohere")
    with pytest.raises(ConfigError, match="is not a reranker"):
        ModelSettings.from_env()
