"""A tiny real OpenAI-compatible `/v1/embeddings` server on 127.0.0.1, backed by MiniLM.

Tests start it to exercise kbpg's HTTP provider end to end: batching, ordering by `index`,
retries on 5xx and 429, authentication errors. The plumbing is tests.model_servers'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kbpg.models.embedders import MiniLMEmbedder
from tests.model_servers import LocalServer


class EmbeddingServer(LocalServer):
    def __init__(
        self,
        embedder: MiniLMEmbedder,
        *,
        model: str = "minilm-over-http",
        api_key: str | None = None,
        fail_first: int = 0,
        fail_status: int = 503,
        refuse: str | None = None,
        dimensions: int | None = None,
    ) -> None:
        super().__init__(api_key=api_key)
        self.embedder = embedder
        self.model = model
        self.script = [str(fail_status)] * fail_first
        self.batches: list[int] = []
        # a batch holding a text with this marker is refused (HTTP 400), as servers refuse an
        # input over their limits or their content policy
        self.refuse = refuse
        # shortened vectors (the first n, normalised again), as servers of Matryoshka models
        # answer with their `dimensions` setting: another model's dimension, deterministically
        self.dimensions = dimensions

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def attempts(self) -> int:
        return self.calls["total"]

    def __enter__(self) -> EmbeddingServer:
        super().__enter__()
        return self

    def answer(self, path: str, payload: Any, action: str) -> tuple[int, Any]:
        if path != "/v1/embeddings":
            return 404, {"error": {"message": "not found"}}
        if payload.get("model") != self.model:
            return 404, {"error": {"message": f"model {payload.get('model')} not found"}}
        texts = payload["input"]
        self.batches.append(len(texts))
        if self.refuse is not None and any(self.refuse in t for t in texts):
            return 400, {"error": {"message": "input refused", "type": "invalid_request_error"}}
        vectors = self.embedder.embed_documents(texts)
        if self.dimensions is not None:
            vectors = vectors[:, : self.dimensions]
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)
        ]
        # real servers may answer out of order: clients must sort by index
        data.reverse()
        return 200, {"object": "list", "data": data, "model": self.model}
