"""Real model servers on 127.0.0.1 for tests: rerank APIs and an OpenAI-compatible chat.

`LocalServer` is the shared plumbing (a threaded stdlib HTTP server, a request log, a call
counter and scripted failures); `ModelServer` speaks the wire formats kbpg's model clients
use, with deterministic answers:
- POST /api/rerank  `{model, query, documents, top_n}` -> `{results: [{index, relevance_score}]}`
  (Cohere / Jina / vLLM / Infinity / LiteLLM)
- POST /tei/rerank  `{query, texts, truncate}` -> `[{index, score}]` (Hugging Face TEI)
- POST /v1/chat/completions -> a listwise ranking for kbpg's rerank prompt (wrapped in prose
  and a code fence, as chat models do), otherwise `chat_reply(messages)`.
Scores are term overlap: the share of the query's words found in the text (ties: input order).
`script` holds one action per coming request: "ok", an HTTP status ("500", "429"), "malformed", "short",
"slow" (sleeps `slow_s` first), "prose" (chat: an answer with no array in it).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def overlap(query: str, text: str) -> float:
    """Share of the query's words that occur in the text."""
    terms = words(query)
    return len(terms & words(text)) / len(terms) if terms else 0.0


def ranked_by_overlap(query: str, texts: list[str]) -> list[tuple[int, float]]:
    """(index, score) best first; equal scores keep the input order."""
    scored = [(i, overlap(query, t)) for i, t in enumerate(texts)]
    return sorted(scored, key=lambda item: (-item[1], item[0]))


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 with a request log, call counts and a script."""

    def __init__(self, *, api_key: str | None = None, slow_s: float = 2.0) -> None:
        self.api_key = api_key
        self.slow_s = slow_s
        self.script: list[str] = []
        self.requests: list[tuple[str, Any]] = []
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a slow reply must not hold up the test
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def root(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def next_action(self) -> str:
        with self._lock:
            return self.script.pop(0) if self.script else "ok"

    def answer(self, path: str, payload: Any, action: str) -> tuple[int, Any]:
        """(status, JSON body or raw str) for one authorised request; subclasses speak APIs."""
        raise NotImplementedError

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to answer

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(raw)
                except ValueError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                with server._lock:
                    server.requests.append((self.path, payload))
                    server.calls[self.path] += 1
                    server.calls["total"] += 1
                if (
                    server.api_key
                    and self.headers.get("Authorization") != f"Bearer {server.api_key}"
                ):
                    self._send(401, {"error": {"message": "invalid api key"}})
                    return
                action = server.next_action()
                if action == "slow":
                    time.sleep(server.slow_s)
                if action.isdigit():
                    self._send(int(action), {"error": {"message": "overloaded"}})
                    return
                status, body = server.answer(self.path, payload, action)
                self._send(status, body)

        return Handler


class ModelServer(LocalServer):
    """Rerank APIs and chat completions with deterministic, term-overlap answers."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Answers chat requests that are not kbpg's rerank prompt (expansion, chunk context).
        self.chat_reply: Callable[[list[dict[str, str]]], str] = lambda messages: "[]"

    @property
    def api_url(self) -> str:
        return f"{self.root}/api/rerank"

    @property
    def tei_url(self) -> str:
        return f"{self.root}/tei/rerank"

    @property
    def chat_url(self) -> str:
        return f"{self.root}/v1"

    def __enter__(self) -> ModelServer:
        super().__enter__()
        return self

    def answer(self, path: str, payload: Any, action: str) -> tuple[int, Any]:
        if path == "/api/rerank":
            ranked = ranked_by_overlap(payload["query"], payload["documents"])
            ranked = ranked[: payload.get("top_n") or len(ranked)]
            if action == "short":
                ranked = ranked[: max(1, len(ranked) // 2)]
            if action == "malformed":
                return 200, {"results": [{"document": "no index here"}]}
            results = [{"index": i, "relevance_score": s} for i, s in ranked]
            return 200, {"id": "local", "results": results, "meta": {}}
        if path == "/tei/rerank":
            ranked = ranked_by_overlap(payload["query"], payload["texts"])
            if action == "short":
                ranked = ranked[: max(1, len(ranked) // 2)]
            if action == "malformed":
                return 200, "this is not json"
            return 200, [{"index": i, "score": s} for i, s in ranked]
        if path == "/v1/chat/completions":
            text = self._chat(payload["messages"], action)
            if action == "malformed":
                return 200, {"choices": []}
            return 200, {
                "id": "local",
                "object": "chat.completion",
                "model": payload.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            }
        return 404, {"error": {"message": f"no route {path}"}}

    def _chat(self, messages: list[dict[str, str]], action: str) -> str:
        if action == "prose":
            return "I am sorry, I cannot rank these passages."
        prompt = messages[-1]["content"]
        if not prompt.startswith("Query: ") or "\nPassages:\n" not in prompt:
            return self.chat_reply(messages)
        query = prompt[len("Query: ") : prompt.index("\n")]
        passages = re.findall(r"^\[(\d+)\] (.*)$", prompt, flags=re.MULTILINE)
        ranked = ranked_by_overlap(query, [text for _, text in passages])
        numbers = [int(passages[i][0]) for i, _ in ranked]
        if action == "short":
            numbers = numbers[:1]
        # what chat models do: prose, a fence, a repeated and an unknown number
        numbers = [*numbers, numbers[0], len(passages) + 7]
        return f"Here is the ranking:\n```json\n{json.dumps(numbers)}\n```\nHope it helps."
