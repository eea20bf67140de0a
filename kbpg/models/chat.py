"""The one OpenAI-compatible chat client: LLM reranking, query expansion, chunk context."""

from __future__ import annotations

from typing import Any

from kbpg.errors import ModelError
from kbpg.models.transport import ModelHTTP


class ChatClient:
    """`/chat/completions` of an OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM...).

    `base_url` is the API root (e.g. http://localhost:8000/v1); the transport brings the
    timeouts, retries and error mapping.
    """

    def __init__(self, http: ModelHTTP, model: str) -> None:
        if not model:
            raise ModelError("no chat model is configured", hint="set KBPG_CHAT_MODEL")
        self.http = http
        self.model = model

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> str:
        """The text of the first choice; a ModelError when the answer has none."""
        body: dict[str, Any] = {
            "model": model or self.model,
            "messages": messages,
            "temperature": temperature,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        answer = self.http.post_json("chat/completions", body)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise ModelError(
                f"chat server {self.http.url('chat/completions')} sent an unexpected response: "
                f"no choices[0].message.content in {str(answer)[:200]!r}"
            )
        return content
