"""A tiny real OpenAI-compatible `/v1/embeddings` server on 127.0.0.1, backed by MiniLM.

Tests start it to exercise kbpg's HTTP provider end to end: batching, ordering by `index`,
retries on 5xx and 429, authentication errors.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kbpg.embedding import MiniLMEmbedder


class EmbeddingServer:
    def __init__(
        self,
        embedder: MiniLMEmbedder,
        *,
        model: str = "minilm-over-http",
        api_key: str | None = None,
        fail_first: int = 0,
        fail_status: int = 503,
    ) -> None:
        self.embedder = embedder
        self.model = model
        self.api_key = api_key
        self.fail_remaining = fail_first
        self.fail_status = fail_status
        self.batches: list[int] = []
        self.attempts = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> EmbeddingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.attempts += 1
                    failing = server.fail_remaining > 0
                    if failing:
                        server.fail_remaining -= 1
                if self.path != "/v1/embeddings":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                if (
                    server.api_key
                    and self.headers.get("Authorization") != f"Bearer {server.api_key}"
                ):
                    self._send(401, {"error": {"message": "invalid api key"}})
                    return
                if failing:
                    self._send(server.fail_status, {"error": {"message": "overloaded"}})
                    return
                if payload.get("model") != server.model:
                    self._send(
                        404, {"error": {"message": f"model {payload.get('model')} not found"}}
                    )
                    return
                texts = payload["input"]
                with server._lock:
                    server.batches.append(len(texts))
                vectors = server.embedder.embed_documents(texts)
                data = [
                    {"object": "embedding", "index": i, "embedding": v.tolist()}
                    for i, v in enumerate(vectors)
                ]
                # real servers may answer out of order: clients must sort by index
                data.reverse()
                self._send(200, {"object": "list", "data": data, "model": server.model})

        return Handler
