"""Concurrent query embeddings share model calls (QueryBatcher), reported to kbpg.telemetry."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kbpg import telemetry
from kbpg.models.embedders import Embedder, MiniLMEmbedder
from kbpg.models.querybatch import QueryBatcher

QUERIES = [
    "renew a parking permit",
    "when is my bin collected",
    "library card for a child",
    "appeal a parking fine",
    "reset my password",
    "pay property tax in instalments",
    "book a park shelter",
    "old paint and batteries",
]


class Batches(telemetry.Observer):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def query_batch(self, size: int) -> None:
        self.sizes.append(size)


@pytest.fixture
def batches() -> Iterator[Batches]:
    observer = Batches()
    telemetry.subscribe(observer)
    try:
        yield observer
    finally:
        telemetry.unsubscribe(observer)


def test_queries_waiting_for_a_busy_model_share_its_next_call(
    embedder: Embedder, batches: Batches
) -> None:
    assert isinstance(embedder, MiniLMEmbedder)
    batcher = QueryBatcher(embedder)
    alone = [embedder.embed_query(q) for q in QUERIES]
    results: dict[int, np.ndarray] = {}

    def search(i: int) -> None:
        results[i] = batcher.embed(QUERIES[i])

    threads = [threading.Thread(target=search, args=(i,)) for i in range(len(QUERIES))]
    model = embedder.session
    free = threading.Event()

    class BusyModel:  # the model is busy: the first query's call waits until `free`
        def run(self, *args: Any, **kwargs: Any) -> Any:
            free.wait(timeout=60)
            return model.run(*args, **kwargs)

    embedder.__dict__["session"] = BusyModel()
    try:
        threads[0].start()
        while not (batcher._busy and not batcher._waiting):  # it took its query
            time.sleep(0.001)
        for thread in threads[1:]:
            thread.start()
        deadline = time.monotonic() + 30
        while len(batcher._waiting) < len(QUERIES) - 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        free.set()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        embedder.__dict__["session"] = model

    # the first query alone, the seven that gathered meanwhile in one call
    assert batches.sizes == [1, len(QUERIES) - 1]
    for i, vector in enumerate(alone):
        assert float(results[i] @ vector) > 0.999  # both unit length
