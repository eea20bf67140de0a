"""The models kbpg calls: embedders (offline MiniLM, OpenAI-compatible HTTP), rerankers and
the chat model over one HTTP helper, and ModelClients, which builds them from the settings.

May import: kbpg.config, kbpg.errors, kbpg.telemetry. Knows no database: callers hand it texts and get
vectors, orders and answers back.
"""

from __future__ import annotations

from kbpg.models.chat import ChatClient
from kbpg.models.clients import ModelClients, make_chat, make_reranker
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
    "ModelClients",
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
