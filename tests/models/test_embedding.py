"""Embedding providers: the real MiniLM model and a real local OpenAI-compatible server."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from kbpg.config import Settings
from kbpg.errors import ConfigError, EmbeddingError
from kbpg.models.embedders import (
    MINILM_MODEL_NAME,
    Embedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    get_embedder,
    to_pgvector_literal,
)
from kbpg.store import db as kdb
from tests.embedding_server import EmbeddingServer
from tests.helpers import run_kbpg


@pytest.fixture(scope="module")
def minilm(embedder: Embedder) -> MiniLMEmbedder:
    assert isinstance(embedder, MiniLMEmbedder)
    return embedder


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_minilm_vectors_are_384d_float32_and_normalised(minilm: MiniLMEmbedder) -> None:
    texts = ["renew a parking permit", "library opening hours", "x", "a " * 100]
    vectors = minilm.embed_documents(texts)
    assert vectors.shape == (4, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert minilm.model_name == MINILM_MODEL_NAME
    assert minilm.dimension == 384
    assert isinstance(minilm, Embedder)


def test_minilm_similar_pair_closer_than_dissimilar(minilm: MiniLMEmbedder) -> None:
    query = minilm.embed_query("how do I renew my parking permit")
    similar = minilm.embed_query("parking permit renewal for residents")
    unrelated = minilm.embed_query("the volcano erupted and lava reached the sea")
    assert _cos(query, similar) > 0.6
    assert _cos(query, similar) > _cos(query, unrelated) + 0.4


def test_minilm_batching_keeps_input_order(minilm: MiniLMEmbedder) -> None:
    # sorted by length internally; every row must still belong to its own text
    texts = [f"{'long ' * (i % 7 * 10)}text number {i} about topic {i % 5}" for i in range(70)]
    batched = minilm.embed_documents(texts)
    for i in (0, 13, 41, 69):
        single = minilm.embed_query(texts[i])
        assert _cos(batched[i], single) > 0.999


def test_token_count_includes_special_tokens_and_window(minilm: MiniLMEmbedder) -> None:
    assert minilm.count_tokens("hello") == 3  # [CLS] hello [SEP]
    assert minilm.count_tokens_batch(["hello", "hello world"]) == [3, 4]
    assert minilm.max_tokens == 256
    # the vendored tokenizer.json truncates at 128: kbpg turns that off
    assert minilm.count_tokens("word " * 300) == 302


def test_minilm_refuses_text_over_window_instead_of_truncating(minilm: MiniLMEmbedder) -> None:
    with pytest.raises(EmbeddingError, match="exceeds the 256-token window"):
        minilm.embed_documents(["word " * 300])


def test_get_embedder_is_cached_and_validates_name() -> None:
    settings = Settings.from_env()
    assert get_embedder(settings, "minilm") is get_embedder(settings, "MiniLM")
    with pytest.raises(ConfigError, match="unknown embedder"):
        get_embedder(settings, "word2vec")


def test_pgvector_literal_round_trips_through_postgres(conn, minilm: MiniLMEmbedder) -> None:
    vector = minilm.embed_query("renew permit")
    literal = to_pgvector_literal(vector)
    assert literal.startswith("[") and literal.endswith("]")
    row = conn.execute(
        "select vector_dims(%s::vector), %s::vector <=> %s", (literal, literal, vector)
    ).fetchone()
    assert row[0] == 384
    assert row[1] == pytest.approx(0.0, abs=1e-6)


def test_kbpg_embed_cli_prints_a_vector_literal(cli_env, db_url, minilm) -> None:
    result = run_kbpg("embed", "renew permit", env=cli_env)
    assert result.returncode == 0, result.stderr
    literal = result.stdout.strip()
    with kdb.connect(db_url) as c:
        dims, distance = c.execute(
            "select vector_dims(%s::vector), %s::vector <=> %s",
            (literal, literal, minilm.embed_query("renew permit")),
        ).fetchone()
    assert dims == 384
    assert distance < 1e-5


# -- OpenAI-compatible provider against a real local server ------------------------------------


def test_openai_provider_matches_minilm_and_batches(minilm: MiniLMEmbedder) -> None:
    texts = [f"document {i} about {'permits' if i % 2 else 'libraries'}" for i in range(5)]
    with EmbeddingServer(minilm, api_key="sekret") as server:
        client = OpenAIEmbedder(server.base_url, "minilm-over-http", "sekret", batch_size=2)
        vectors = client.embed_documents(texts)
        assert client.dimension == 384
        assert server.batches == [2, 2, 1]
    np.testing.assert_allclose(vectors, minilm.embed_documents(texts), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_openai_provider_retries_server_errors_with_backoff(minilm: MiniLMEmbedder) -> None:
    with EmbeddingServer(minilm, fail_first=2, fail_status=503) as server:
        client = OpenAIEmbedder(server.base_url, "minilm-over-http", retries=3, backoff_s=0.05)
        started = time.perf_counter()
        vector = client.embed_query("renew permit")
        elapsed = time.perf_counter() - started
        assert server.attempts == 3
    assert vector.shape == (384,)
    assert elapsed >= 0.05 + 0.1  # two back-offs: 0.05 s then 0.1 s


def test_openai_provider_gives_up_after_retries_on_429(minilm: MiniLMEmbedder) -> None:
    with EmbeddingServer(minilm, fail_first=10, fail_status=429) as server:
        client = OpenAIEmbedder(server.base_url, "minilm-over-http", retries=2, backoff_s=0.01)
        with pytest.raises(EmbeddingError, match=r"failed after 3 attempts \(HTTP 429"):
            client.embed_query("x")
        assert server.attempts == 3


def test_openai_provider_server_down_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # nothing listens on `port` any more
    client = OpenAIEmbedder(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff_s=0.01)
    with pytest.raises(EmbeddingError) as info:
        client.embed_query("renew permit")
    assert "failed after 2 attempts" in info.value.message
    assert "ConnectError" in info.value.message
    assert "KBPG_OPENAI_BASE_URL" in (info.value.hint or "")
    assert client.requests_made == 2


def test_openai_provider_does_not_retry_auth_errors(minilm: MiniLMEmbedder) -> None:
    with EmbeddingServer(minilm, api_key="right") as server:
        client = OpenAIEmbedder(server.base_url, "minilm-over-http", "wrong", backoff_s=0.01)
        with pytest.raises(EmbeddingError, match="HTTP 401") as info:
            client.embed_query("x")
        assert server.attempts == 1
    assert "KBPG_OPENAI_API_KEY" in (info.value.hint or "")


def test_kbpg_embed_cli_server_down_exits_1_with_hint(cli_env) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(cli_env, KBPG_OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", KBPG_OPENAI_MODEL="m")
    result = run_kbpg("embed", "--embedder", "openai", "hello", env=env)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Error: embedding server" in result.stderr
    assert "Hint:" in result.stderr
    assert "Traceback" not in result.stderr
