"""Model clients over one HTTP helper: rerankers and the chat model, built from settings."""

from __future__ import annotations

from kbpg.config import ModelSettings
from kbpg.errors import ConfigError
from kbpg.models.chat import ChatClient
from kbpg.models.parsing import as_positions, fill_order, parse_json_array
from kbpg.models.rerank import (
    ApiReranker,
    LlmReranker,
    Reranker,
    RerankHit,
    TeiReranker,
    document_text,
    full_order,
)
from kbpg.models.transport import ModelHTTP

__all__ = [
    "ApiReranker",
    "ChatClient",
    "LlmReranker",
    "ModelHTTP",
    "RerankHit",
    "Reranker",
    "TeiReranker",
    "as_positions",
    "document_text",
    "fill_order",
    "full_order",
    "make_chat",
    "make_reranker",
    "parse_json_array",
]


def make_chat(settings: ModelSettings, *, timeout_s: float | None = None) -> ChatClient:
    """The chat client of KBPG_CHAT_BASE_URL / KBPG_CHAT_MODEL / KBPG_CHAT_API_KEY."""
    if not settings.chat_base_url:
        raise ConfigError(
            "no chat model server is configured",
            hint="set KBPG_CHAT_BASE_URL (e.g. http://localhost:8000/v1) and KBPG_CHAT_MODEL",
        )
    timeout = timeout_s or settings.chat_timeout_s
    http = ModelHTTP(
        settings.chat_base_url,
        api_key=settings.chat_api_key,
        what="chat server",
        connect_timeout_s=settings.connect_timeout_s,
        timeout_s=timeout,
        budget_s=timeout,
        retries=settings.retries,
        hint_unreachable="is the server running? check KBPG_CHAT_BASE_URL",
        hint_refused="check KBPG_CHAT_MODEL and KBPG_CHAT_API_KEY",
    )
    if not settings.chat_model:
        raise ConfigError("KBPG_CHAT_MODEL is empty", hint="name the chat model to call")
    return ChatClient(http, settings.chat_model)


def make_reranker(settings: ModelSettings, provider: str | None = None) -> Reranker | None:
    """The reranker KBPG_RERANK names (None for `none`); one call is bounded by
    KBPG_RERANK_TIMEOUT seconds, retries included."""
    chosen = (provider or settings.rerank).strip().lower()
    if chosen == "none":
        return None
    if chosen == "llm":
        chat = make_chat(settings, timeout_s=settings.rerank_timeout_s)
        return LlmReranker(chat, settings.rerank_model or None)
    if chosen not in {"api", "tei"}:
        raise ConfigError(
            f"unknown reranker {chosen!r}", hint="KBPG_RERANK is one of none, api, tei, llm"
        )
    if not settings.rerank_url:
        raise ConfigError(
            f"KBPG_RERANK={chosen} needs KBPG_RERANK_URL",
            hint="the rerank endpoint itself, e.g. http://localhost:8080/rerank or "
            "https://api.cohere.com/v2/rerank",
        )
    http = ModelHTTP(
        settings.rerank_url,
        api_key=settings.rerank_api_key,
        what="reranker",
        connect_timeout_s=settings.connect_timeout_s,
        timeout_s=settings.rerank_timeout_s,
        budget_s=settings.rerank_timeout_s,
        retries=settings.retries,
        hint_unreachable="is the server running? check KBPG_RERANK_URL",
        hint_refused="check KBPG_RERANK_MODEL and KBPG_RERANK_API_KEY",
    )
    if chosen == "tei":
        return TeiReranker(http, settings.rerank_model)
    if not settings.rerank_model:
        raise ConfigError("KBPG_RERANK=api needs KBPG_RERANK_MODEL", hint="e.g. rerank-v3.5")
    return ApiReranker(http, settings.rerank_model)
