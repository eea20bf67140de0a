"""Recall@32 and latency of the HNSW index for several hnsw.ef_search values (not a test;
prints numbers).

Runs on a server kept by `bench_search.py --keep DIR` (its corpus and centroids): the query
vectors are drawn as bench_search draws them, the truth is an exact scan (sequential, parallel
workers allowed; cached in DIR per query count), and each ef_search value is timed on the
plain index query kb.search_vector issues for the layout (top 32 by the index's expression,
re-ranked by exact cosine). The index is whatever DIR holds: rebuild it with other parameters
through `kbpg index` (or kb.set_embedding_layout) to compare builds.

    python benchmarks/bench_search.py --chunks 1000000 --keep /tmp/kb1m   # once
    python benchmarks/bench_hnsw_recall.py --keep /tmp/kb1m --ef 128,256,400
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from bench_search import DIM, POOL, log, percentile, query_embedding
from pgvector.psycopg import register_vector

from kbpg.store.embedded import EmbeddedServer

ORDER_BY = {
    "vector": "embedding <=> %(q)s",
    "halfvec": f"embedding::halfvec({DIM}) <=> %(q)s::halfvec({DIM})",
    "binary": f"binary_quantize(embedding)::bit({DIM}) <~> binary_quantize(%(q)s)::bit({DIM})",
}


def truths(conn: psycopg.Connection[Any], queries: list[np.ndarray], cache: Path) -> list[set[int]]:
    if cache.exists():
        return [set(t) for t in json.loads(cache.read_text())]
    started = time.perf_counter()
    found: list[set[int]] = []
    for q in queries:
        with conn.transaction():
            conn.execute("set local enable_indexscan = off")
            rows = conn.execute(
                "select id from kb.chunks order by embedding <=> %s, id limit %s", (q, POOL)
            ).fetchall()
        found.append({r[0] for r in rows})
    cache.write_text(json.dumps([sorted(t) for t in found]))
    log(f"exact top-{POOL} of {len(queries)} queries in {time.perf_counter() - started:.0f} s")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, required=True, metavar="DIR")
    parser.add_argument("--ef", default="128,256,400", help="comma-separated ef_search values")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--seed", type=int, default=99)
    args = parser.parse_args()

    home = args.keep.resolve()
    info = json.loads((home / "bench-info.json").read_text())
    centroids = np.array(info["centroids"], dtype=np.float32)
    draw = np.random.default_rng(args.seed)
    queries = [query_embedding(centroids, draw) for _ in range(args.queries)]
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        url = admin.rsplit("/", 1)[0] + "/bench?" + admin.split("?", 1)[1]
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            register_vector(conn)
            row = conn.execute(
                "select e.layout, i.indexdef from kb.embedding_space e,"
                " pg_indexes i where i.indexname = 'chunks_embedding_hnsw'"
            ).fetchone()
            assert row is not None, "no HNSW index in DIR"
            layout, indexdef = row
            log(indexdef)
            truth = truths(conn, queries, home / f"truth-{args.queries}-{args.seed}.json")
            conn.execute("create extension if not exists pg_prewarm")
            conn.execute("select pg_prewarm('kb.chunks_embedding_hnsw')")
            sql = (
                "select id from (select id, embedding <=> %(q)s as d from kb.chunks"
                f" order by {ORDER_BY[layout]} limit %(n)s) x order by d, id"
            )
            for ef in [int(v) for v in args.ef.split(",")]:
                times: list[float] = []
                recalls: list[float] = []
                for q, true_ids in zip(queries, truth, strict=True):
                    with conn.transaction():
                        conn.execute(f"set local hnsw.ef_search = {ef}")
                        started = time.perf_counter()
                        rows = conn.execute(sql, {"q": q, "n": POOL}).fetchall()
                        times.append((time.perf_counter() - started) * 1000)
                    recalls.append(len({r[0] for r in rows} & true_ids) / POOL)
                log(
                    f"ef_search {ef:5}: recall@{POOL} {statistics.mean(recalls):.3f}"
                    f" (worst query {min(recalls):.3f}, queries with none: "
                    f"{sum(r == 0 for r in recalls)}), p50 {statistics.median(times):.1f} ms,"
                    f" p95 {percentile(times, 0.95):.1f} ms"
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
