"""MiniLM (int8 ONNX) load time, per-query latency and document throughput on this machine.

    python benchmarks/bench_embedding.py [--corpus ../shared/ir/npl/corpus.jsonl] [--docs 2000]

Ingest throughput end to end is measured with the real command on a throwaway home:
    KBPG_HOME=$(mktemp -d) kbpg db upgrade && time kbpg ingest ../shared/ir/npl/corpus.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default = Path(__file__).resolve().parents[2] / "shared" / "ir" / "npl" / "corpus.jsonl"
    parser.add_argument("--corpus", type=Path, default=default)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()

    started = time.perf_counter()
    from kbpg.models.embedders import MiniLMEmbedder

    embedder = MiniLMEmbedder()
    embedder.load()
    load_s = time.perf_counter() - started
    print(f"model load (import + tokenizer + ONNX session): {load_s:.2f} s")

    texts: list[str] = []
    with args.corpus.open() as handle:
        for line in handle:
            texts.append(json.loads(line)["text"])
            if len(texts) >= args.docs:
                break
    queries = [" ".join(t.split()[:6]) for t in texts[: args.queries]]
    embedder.embed_query("warm up")
    latencies = []
    for query in queries:
        t0 = time.perf_counter()
        embedder.embed_query(query)
        latencies.append((time.perf_counter() - t0) * 1000)
    latencies.sort()
    p95 = latencies[int(len(latencies) * 0.95) - 1]
    print(
        f"query latency over {len(queries)} queries: p50 {statistics.median(latencies):.1f} ms, p95 {p95:.1f} ms"
    )

    tokens = embedder.count_tokens_batch(texts)
    t0 = time.perf_counter()
    embedder.embed_documents(texts)
    elapsed = time.perf_counter() - t0
    print(
        f"documents: {len(texts)} texts (mean {statistics.mean(tokens):.0f} word pieces) in "
        f"{elapsed:.1f} s = {len(texts) / elapsed:.0f} texts/s (load average {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
