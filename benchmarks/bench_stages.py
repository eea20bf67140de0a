"""Overhead of the rerank stage against the plain search on the demo KB (not a test; prints numbers).

    python benchmarks/bench_stages.py                # samples/kb, 12 queries x 20 rounds
    python benchmarks/bench_stages.py --rounds 50 --top 5

Ingests samples/kb into a throwaway database on the configured server (KBPG_DATABASE_URL or
the embedded one), starts the test suite's local reranker (tests/model_servers.py, TEI
format, term-overlap scores) on 127.0.0.1, and times, on the same queries in one run:

  plain    kb.search(top)                                  one round trip
  rerank   kb.search(rerank_pool) -> reranker -> kb.cap_per_document, cut   two round trips

Per query it reports the whole search (embedding included) and the stage's overhead
= rerank total - the reranker call (the model server's own time plus HTTP, measured around
the call) - plain total: what kbpg adds around the model (wider arm pools, a larger fused
result, building the reranker's texts, the second round trip for the cap). Plain and rerank
calls alternate so both see the same cache state.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbpg.app import KnowledgeBase  # noqa: E402
from kbpg.config import ModelSettings, Settings  # noqa: E402
from kbpg.evaluate import throwaway_database  # noqa: E402
from kbpg.ingest.run import ingest_paths  # noqa: E402
from kbpg.store import db as kdb  # noqa: E402
from tests.model_servers import ModelServer  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_http import QUERIES, percentile  # noqa: E402 - the demo KB's questions


def line(name: str, values: list[float]) -> str:
    return (
        f"{name:<34} p50 {statistics.median(values):7.2f} ms   p95 {percentile(values, 0.95):7.2f} ms"
        f"   mean {statistics.fmean(values):7.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()

    settings = Settings.from_env()
    url = kdb.resolve_url(settings)
    with ModelServer() as server, throwaway_database(url) as bench_url:
        models = ModelSettings(rerank="tei", rerank_url=server.tei_url, retries=0)
        with KnowledgeBase(bench_url, settings=replace(settings, models=models), pool_size=1) as kb:
            summary = ingest_paths(kb.db, kb.models, [ROOT / "samples" / "kb"], recursive=True)
            print(f"demo KB: {summary.documents} documents, {summary.chunks} chunks", flush=True)
            for query in QUERIES:  # warm the model, the caches and the plans
                kb.search(query, top=args.top, rerank=False)
                kb.search(query, top=args.top, rerank=True)
            plain: list[float] = []
            plain_sql: list[float] = []
            reranked: list[float] = []
            model: list[float] = []
            overhead: list[float] = []
            rerank_sql: list[float] = []
            pools: list[int] = []
            skipped = 0
            for _ in range(args.rounds):
                for query in QUERIES:
                    started = time.perf_counter()
                    base = kb.search(query, top=args.top, rerank=False)
                    base_ms = (time.perf_counter() - started) * 1000
                    started = time.perf_counter()
                    result = kb.search(query, top=args.top, rerank=True)
                    total_ms = (time.perf_counter() - started) * 1000
                    (stage,) = result.stages
                    skipped += stage.status == "skipped"
                    plain.append(base_ms)
                    plain_sql.append(base.timings.sql_ms)
                    reranked.append(total_ms)
                    model.append(stage.ms)
                    rerank_sql.append(result.timings.sql_ms)
                    overhead.append(total_ms - stage.ms - base_ms)
                    if stage.status == "applied":
                        pools.append(len(server.requests[-1][1]["texts"]))
    calls = len(plain)
    print(f"{calls} searches each, top {args.top}; reranker skipped {skipped} times (pool <= top)")
    print(f"reranker pool: median {statistics.median(pools) if pools else 0} candidates")
    print(line("plain search (total)", plain))
    print(line("rerank search (total)", reranked))
    print(line("  of which the reranker call", model))
    print(line("plain: kb.search", plain_sql))
    print(line("rerank: kb.search pool + cap", rerank_sql))
    print(line("stage overhead (excl. model call)", overhead))


if __name__ == "__main__":
    main()
