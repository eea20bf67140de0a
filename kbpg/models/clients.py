"""The model clients of one knowledge base: embedder, reranker and chat model, built from the
settings on first use, and the paraphrase cache query expansion shares across requests."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from kbpg.config import ModelSettings, Settings
from kbpg.errors import ConfigError, StageUnavailable
from kbpg.models.chat import ChatClient
from kbpg.models.embedders import Embedder, FloatArray, get_embedder
from kbpg.models.querybatch import QueryBatcher
from kbpg.models.rerank import ApiReranker, LlmReranker, Reranker, TeiReranker
from kbpg.models.transport import ModelHTTP


class ExpansionCache:
    """Paraphrases by (model, N, question): bounded in size (least recently used goes) and in
    age. Only successful answers are stored."""

    def __init__(self, max_entries: int = 1024, ttl_s: float = 3600.0) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[tuple[str, int, str], tuple[float, tuple[str, ...]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, str]) -> tuple[str, ...] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            stored, value = entry
            if time.monotonic() - stored > self.ttl_s:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key: tuple[str, int, str], value: tuple[str, ...]) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class ModelClients:
    """The models a knowledge base calls: the embedder (the one given, else --embedder /
    KBPG_EMBEDDER, else `default_embedder()`: the knowledge base's own), the reranker and the
    chat model, each built on first use, and the query-expansion cache they share across
    requests."""

    def __init__(
        self,
        settings: Settings,
        embedder: Embedder | None = None,
        embedder_name: str | None = None,
        default_embedder: Callable[[], str] | None = None,
    ) -> None:
        self.settings = settings.models
        self.expansions = ExpansionCache()
        self._embedder_settings = settings
        self._embedder = embedder
        self._embedder_name = embedder_name or settings.embedder
        self._default_embedder = default_embedder
        self._embedder_lock = threading.Lock()
        self._batcher: QueryBatcher | None = None
        self._lock = threading.Lock()
        self._reranker: Reranker | None = None
        self._chat: ChatClient | None = None

    @property
    def embedder(self) -> Embedder:
        """The query and document model, loaded on first use."""
        with self._embedder_lock:
            if self._embedder is None:
                embedder = get_embedder(self._embedder_settings, self.embedder_name())
                load = getattr(embedder, "load", None)
                if callable(load):
                    load()
                self._embedder = embedder
            return self._embedder

    def embed_query(self, text: str) -> FloatArray:
        """The query's vector; concurrent callers share model calls (QueryBatcher)."""
        embedder = self.embedder
        with self._embedder_lock:
            if self._batcher is None or self._batcher.embedder is not embedder:
                self._batcher = QueryBatcher(embedder)
            batcher = self._batcher
        return batcher.embed(text)

    def document_embedder(self) -> Embedder:
        """The model as ingest uses it: loaded by its first use, so that a load whose records
        all carry their vectors neither runs nor holds it (MiniLM: ~200 MB of RSS)."""
        with self._embedder_lock:
            if self._embedder is not None:
                return self._embedder
        return get_embedder(
            self._embedder_settings, self.embedder_name()
        )  # the one `embedder` loads

    def embedder_name(self) -> str | None:
        """The embedder named (--embedder, KBPG_EMBEDDER), else the knowledge base's default
        (its recorded model, else its language's); resolved once."""
        if self._embedder_name is None and self._default_embedder is not None:
            self._embedder_name = self._default_embedder()
        return self._embedder_name

    def reranker(self) -> Reranker:
        """The reranker KBPG_RERANK names; ConfigError when it is `none`."""
        with self._lock:
            if self._reranker is None:
                reranker = make_reranker(self.settings)
                if reranker is None:
                    raise StageUnavailable(
                        "reranking was asked for, but no reranker is configured",
                        hint="set KBPG_RERANK to api, tei or llm (and KBPG_RERANK_URL / "
                        "KBPG_RERANK_MODEL or KBPG_CHAT_*), or search without --rerank",
                    )
                self._reranker = reranker
            return self._reranker

    def chat(self) -> ChatClient:
        """The chat model of KBPG_CHAT_BASE_URL / KBPG_CHAT_MODEL (query expansion, context)."""
        with self._lock:
            if self._chat is None:
                try:
                    self._chat = make_chat(self.settings)
                except ConfigError as exc:
                    raise StageUnavailable(exc.message, hint=exc.hint) from None
            return self._chat


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
        client="chat",
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
        client="reranker",
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
