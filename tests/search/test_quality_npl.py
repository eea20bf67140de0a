"""Quality gate on NPL: `kbpg eval` arms against bm25s BM25 and exact dense references."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kbpg import evaluate as ev
from kbpg.store import db as kdb
from tests.conftest import QUALITY_SUMMARY

pytestmark = pytest.mark.slow

BM25_K1 = 1.2
BM25_B = 0.75
NDCG = "ndcg@10"
# bm25s tokenizes with a regex and Lucene's 33 English stopwords, PostgreSQL's `english`
# parser with Snowball's 127; both stem with Snowball English, so the top-10s cannot agree
# exactly. Measured on NPL (93 queries): mean overlap@10 0.889, 86% of queries >= 0.8,
# minimum 0.40. The bounds leave a small margin and catch an approximate or broken BM25.
MIN_MEAN_OVERLAP = 0.85
AGREEING_OVERLAP = 0.8
MIN_AGREEING_QUERIES = 0.75


def bm25s_run(dataset: ev.Dataset, depth: int) -> dict[str, list[str]]:
    """BM25 (k1=1.2, b=0.75, idf = ln(1 + (N - df + 0.5)/(df + 0.5)): bm25s' "lucene"),
    English Snowball stemming and stopwords, over title + text; zero scores are no match."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    docs = [f"{d.title} {d.text}".strip() for d in dataset.corpus]
    ids = [d.id for d in dataset.corpus]
    retriever = bm25s.BM25(method="lucene", k1=BM25_K1, b=BM25_B)
    retriever.index(
        bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    qids = dataset.query_ids
    tokens = bm25s.tokenize(
        [dataset.queries[q] for q in qids], stopwords="en", stemmer=stemmer, show_progress=False
    )
    hits, scores = retriever.retrieve(
        tokens, k=min(depth, len(ids)), show_progress=False, n_threads=1
    )
    return {
        qid: [ids[i] for i, s in zip(row, row_scores, strict=True) if s > 0]
        for qid, row, row_scores in zip(qids, hits, scores, strict=True)
    }


def exact_dense_run(
    url: str, dataset: ev.Dataset, query_vectors: Mapping[str, Any], depth: int
) -> dict[str, list[str]]:
    """Brute-force cosine over the chunk embeddings stored by ingest (no index, no floor)."""
    with kdb.connect(url) as conn:
        rows = conn.execute(
            "select d.source, c.embedding from kb.chunks c"
            " join kb.documents d on d.id = c.document_id order by c.id"
        ).fetchall()
    sources = [r[0] for r in rows]
    matrix = np.stack([np.asarray(r[1].to_numpy(), dtype=np.float32) for r in rows])
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    run = {}
    for qid in dataset.query_ids:
        q = np.asarray(query_vectors[qid], dtype=np.float32)
        sims = matrix @ (q / np.linalg.norm(q))
        order = np.argsort(-sims, kind="stable")
        run[qid] = ev.first_occurrences((sources[i] for i in order), depth)
    return run


def overlap_at(a: Sequence[str], b: Sequence[str], k: int = 10) -> float:
    """|top-k(a) ∩ top-k(b)| / k, k shrunk to the longer list when both are short."""
    n = min(k, max(len(a[:k]), len(b[:k])))
    return len(set(a[:k]) & set(b[:k])) / n if n else 1.0


@dataclass
class NplResults:
    report: ev.EvalReport
    references: dict[str, dict[str, float]]
    overlaps: list[float]
    wall_s: float


def _table(results: NplResults) -> list[str]:
    rows = {**results.report.metrics, **results.references}
    names = list(next(iter(rows.values())))
    lines = ["  ".join([f"{'arm':<18}", *(f"{n:>10}" for n in names)])]
    for arm, values in rows.items():
        lines.append("  ".join([f"{arm:<18}", *(f"{values[n]:>10.4f}" for n in names)]))
    overlaps = results.overlaps
    lines.append(
        f"lexical vs bm25s overlap@10: mean {np.mean(overlaps):.3f}, "
        f"min {min(overlaps):.2f}, queries >= {AGREEING_OVERLAP}: {np.mean([o >= AGREEING_OVERLAP for o in overlaps]):.2f}"
    )
    timings = ", ".join(f"{k} {v:.1f}" for k, v in results.report.timings.items())
    lines.append(f"eval wall time {results.wall_s:.1f} s ({timings})")
    return lines


@pytest.fixture(scope="module")
def npl(npl_dir: Path, admin_url: str) -> Iterator[NplResults]:
    """One `kbpg eval` of NPL per session with the default embedder, plus the references."""
    from kbpg.config import Settings
    from kbpg.models.embedders import get_embedder

    dataset = ev.load_beir(npl_dir)
    embedder = get_embedder(Settings.from_env())
    started = time.perf_counter()
    # --keep, so the exact dense reference reads the very vectors the arms searched
    report = ev.evaluate(admin_url, dataset, embedder, keep=True)
    wall = time.perf_counter() - started
    assert report.database is not None
    try:
        eval_url = ev.url_for_database(admin_url, report.database)
        qids = dataset.query_ids
        vectors = dict(
            zip(qids, embedder.embed_documents([dataset.queries[q] for q in qids]), strict=True)
        )
        cutoffs = ev.Cutoffs()
        runs = {
            "bm25s (reference)": bm25s_run(dataset, cutoffs.depth),
            "exact dense (ref)": exact_dense_run(eval_url, dataset, vectors, cutoffs.depth),
        }
    finally:
        ev.drop_database(admin_url, report.database)
    references = {name: ev.evaluate_run(dataset.qrels, run, qids) for name, run in runs.items()}
    lexical = report.runs["lexical"]
    bm25 = runs["bm25s (reference)"]
    overlaps = [overlap_at(lexical.get(q, []), bm25.get(q, [])) for q in qids]
    results = NplResults(report, references, overlaps, wall)
    print("\n" + "\n".join(_table(results)))
    yield results


def test_metrics_recorded(npl: NplResults, record_property: Any) -> None:
    record_property(QUALITY_SUMMARY, ("NPL quality gate (kbpg eval)", _table(npl)))
    for arm, values in {**npl.report.metrics, **npl.references}.items():
        for name, value in values.items():
            record_property(f"{arm} {name}", round(value, 4))
    record_property("lexical-bm25s mean overlap@10", round(float(np.mean(npl.overlaps)), 4))
    record_property("eval wall s", round(npl.wall_s, 1))
    assert npl.report.queries == 93
    assert set(npl.report.metrics) >= {"hybrid", "vector", "lexical"}


def test_hybrid_beats_each_arm(npl: NplResults) -> None:
    m = npl.report.metrics
    assert m["hybrid"][NDCG] >= m["vector"][NDCG]
    assert m["hybrid"][NDCG] >= m["lexical"][NDCG]


def test_lexical_arm_is_bm25(npl: NplResults) -> None:
    lexical = npl.report.metrics["lexical"][NDCG]
    reference = npl.references["bm25s (reference)"][NDCG]
    assert lexical == pytest.approx(reference, abs=0.02)


def test_lexical_top10_agrees_with_bm25s(npl: NplResults) -> None:
    assert float(np.mean(npl.overlaps)) >= MIN_MEAN_OVERLAP
    agreeing = np.mean([o >= AGREEING_OVERLAP for o in npl.overlaps])
    assert agreeing >= MIN_AGREEING_QUERIES
