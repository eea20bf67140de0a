"""Benchmark the vector arm's index layouts: vector, halfvec, binary + re-rank (prints numbers).

A throwaway embedded PostgreSQL (temp dir) is loaded with N chunks of 384-d clustered unit
vectors (500 Gaussian centroids plus noise, as benchmarks/bench_search.py), then, for each layout
in turn, in one run on the same data and queries:

  index build time (`kb.set_embedding_layout`, maintenance_work_mem and parallel workers as
  kbpg.indexing sizes them), index size, kb.search_vector p50/p95 (pool 32, prewarmed, wall clock
  over the unix socket, prepared statements off) and recall@32 against an exact scan (numpy,
  with the arm's 0.30 similarity floor). The binary layout is also measured at several re-rank
  factors (candidates = factor x pool, re-ranked by exact cosine).

    python benchmarks/bench_vector_layouts.py --chunks 20000     # quick look (~2 min)
    python benchmarks/bench_vector_layouts.py --chunks 200000    # ~10 min on 2 cores
    python benchmarks/bench_vector_layouts.py --chunks 1000000 --shared-buffers 6GB  # ~1 h
    python benchmarks/bench_vector_layouts.py --chunks 50000 --layouts vector,halfvec --interleave
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import database_url, restart_for_shared_buffers

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer
from kbpg.store.indexing import build_settings, set_layout

POOL = 32
FLOOR = 0.30


def log(message: str) -> None:
    print(message, flush=True)


def clustered(nrng: np.random.Generator, centroids: np.ndarray, n: int) -> np.ndarray:
    labels = nrng.integers(0, len(centroids), size=n)
    vectors = np.empty((n, centroids.shape[1]), dtype=np.float32)
    # the noise a slice at a time (in one piece, 200k x 4,096 of it took 6.5 GB as float64); the
    # generator draws the same numbers either way
    for start in range(0, n, 50_000):
        part = centroids[labels[start : start + 50_000]]
        part = part + nrng.normal(scale=0.9, size=part.shape).astype(np.float32)
        part /= np.linalg.norm(part, axis=1, keepdims=True)
        vectors[start : start + len(part)] = part
    return vectors


def load(conn: psycopg.Connection[Any], vectors: np.ndarray) -> float:
    """COPY the vectors (one document per 10 chunks); returns seconds."""
    n = len(vectors)
    dim = vectors.shape[1]
    conn.execute("select kb.set_embedding_space(%s, %s)", (f"bench-{dim}", dim))
    conn.execute("drop index kb_data.chunks_embedding_hnsw")
    conn.commit()
    started = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy("copy kb_data.documents (source, title, content_hash) from stdin") as copy:
            for d in range((n + 9) // 10):
                copy.write_row((f"doc-{d}", f"Document {d}", "h"))
        doc_ids = [r[0] for r in cur.execute("select id from kb.documents order by id")]
        with cur.copy(
            "copy kb_data.chunks (document_id, ordinal, content, embedding) from stdin (format binary)"
        ) as copy:
            copy.set_types(["int8", "int4", "text", "vector"])
            for i in range(n):
                copy.write_row((doc_ids[i // 10], i % 10, f"chunk {i}", vectors[i]))
    conn.commit()
    conn.autocommit = True
    conn.execute("vacuum analyze kb_data.chunks")
    return time.perf_counter() - started


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> list[set[int]]:
    """0-based row numbers of the exact top-k (similarity >= the arm's floor), per query."""
    out = []
    for q in queries:
        sims = vectors @ q
        top = np.argpartition(-sims, k)[:k]
        out.append({int(i) for i in top if sims[i] >= FLOOR})
    return out


def time_queries(
    conn: psycopg.Connection[Any], queries: np.ndarray, first_id: int
) -> tuple[list[float], list[set[int]]]:
    times, found = [], []
    sql = "select chunk_id from kb.search_vector(%s, %s)"
    for q in queries[:20]:  # warm the index pages and the plan cache
        conn.execute(sql, (q, POOL)).fetchall()
    for q in queries:
        t = time.perf_counter()
        rows = conn.execute(sql, (q, POOL)).fetchall()
        times.append((time.perf_counter() - t) * 1000)
        found.append({int(r[0]) - first_id for r in rows})
    return times, found


def interleaved(
    conn: psycopg.Connection[Any],
    layouts: list[str],
    queries: np.ndarray,
    truth: list[set[int]],
    first_id: int,
) -> None:
    """Every layout's index on the same table at once, the recorded layout switched before each
    query (alternating the order), so that a busy machine slows every layout alike."""
    conn.execute("drop index if exists kb_data.chunks_embedding_hnsw")
    for layout in layouts:
        definition = conn.execute(
            "select kb._vector_index_definition(%s, %s)", (layout, queries.shape[1])
        ).fetchone()
        assert definition is not None
        conn.execute(f"create index bench_{layout} on kb_data.chunks {definition[0]}")
        conn.execute("select pg_prewarm(%s::regclass)", (f"kb_data.bench_{layout}",))
    sql = "select chunk_id from kb.search_vector(%s, %s)"
    times: dict[str, list[float]] = {layout: [] for layout in layouts}
    found: dict[str, list[set[int]]] = {layout: [] for layout in layouts}
    for i, q in enumerate(queries):
        for layout in layouts if i % 2 == 0 else layouts[::-1]:
            conn.execute("update kb.embedding_space set layout = %s", (layout,))
            t = time.perf_counter()
            rows = conn.execute(sql, (q, POOL)).fetchall()
            times[layout].append((time.perf_counter() - t) * 1000)
            found[layout].append({int(r[0]) - first_id for r in rows})
    for layout in layouts:
        warm = times[layout][20:]
        log(
            f"  interleaved {layout:<8} p50 {statistics.median(warm):5.2f} ms"
            f"  p95 {p(warm, 95):5.2f} ms  recall@{POOL} {recall(found[layout], truth):.3f}"
        )


def recall(found: list[set[int]], truth: list[set[int]]) -> float:
    hits = sum(len(f & t) for f, t in zip(found, truth, strict=True))
    return hits / max(1, sum(len(t) for t in truth))


def p(times: list[float], q: float) -> float:
    return float(np.percentile(times, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--dim", type=int, default=384, help="dimensions (above 4,000: --layouts binary only)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layouts", default="vector,halfvec,binary")
    parser.add_argument("--factors", default="4,8,16", help="binary re-rank factors to measure")
    parser.add_argument(
        "--shared-buffers",
        help="the server's shared_buffers (e.g. 6GB; default: the embedded server's own, at most"
        " 2 GB, less than a 1M-chunk `vector` index)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="also time the layouts query by query, all indexes present (fair on a busy machine)",
    )
    args = parser.parse_args()

    nrng = np.random.default_rng(args.seed)
    centroids = nrng.normal(size=(500, args.dim)).astype(np.float32)
    vectors = clustered(nrng, centroids, args.chunks)
    queries = clustered(nrng, centroids, args.queries)
    log(f"exact top-{POOL} of {args.queries} queries over {args.chunks:,} vectors (numpy) ...")
    truth = exact_top(vectors, queries, POOL)

    home = Path(tempfile.mkdtemp(prefix="kbpg-layouts-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    results: list[dict[str, Any]] = []
    try:
        admin = server.start()
        if restart_for_shared_buffers(admin, args.shared_buffers):
            server.stop()
            admin = server.start()
        url = database_url(admin, "bench")
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench")
        kdb.upgrade(url)
        with psycopg.connect(url, prepare_threshold=None) as conn:
            register_vector(conn)
            load_s = load(conn, vectors)
            log(f"loaded {args.chunks:,} chunks in {load_s:.0f} s")
            row = conn.execute("select min(id) from kb.chunks").fetchone()
            assert row is not None
            first_id = int(row[0])
            conn.execute("create extension if not exists pg_prewarm")
            for layout in args.layouts.split(","):
                settings = build_settings(conn, layout)
                _, build_s = set_layout(conn, url, layout, lambda p: log("    " + p.describe()))
                size = conn.execute(
                    "select pg_relation_size('kb_data.chunks_embedding_hnsw'),"
                    " pg_prewarm('kb_data.chunks_embedding_hnsw')"
                ).fetchone()
                assert size is not None
                factors = [int(f) for f in args.factors.split(",")] if layout == "binary" else [0]
                for factor in factors:
                    if factor:
                        conn.execute(
                            "select set_config('kb.vector_rerank_factor', %s, false)",
                            (str(factor),),
                        )
                    times, found = time_queries(conn, queries, first_id)
                    result = {
                        "layout": layout + (f" x{factor}" if factor else ""),
                        "build_s": build_s,
                        "size_mb": size[0] / 2**20,
                        "p50": statistics.median(times),
                        "p95": p(times, 95),
                        "recall": recall(found, truth),
                    }
                    results.append(result)
                    log(
                        f"  {result['layout']:<11} build {build_s:6.1f} s  index"
                        f" {result['size_mb']:7.1f} MB  p50 {result['p50']:5.2f} ms"
                        f"  p95 {result['p95']:5.2f} ms  recall@{POOL} {result['recall']:.3f}"
                        f"  ({', '.join(f'{k}={v}' for k, v in settings.items())})"
                    )
            if args.interleave:
                conn.execute("reset kb.vector_rerank_factor")
                interleaved(conn, args.layouts.split(","), queries, truth, first_id)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(
        f"\n{args.chunks:,} chunks of {args.dim}-d, {args.queries} queries, pool {POOL}; client peak RSS {peak:.0f} MB"
    )
    log("| layout | build s | index MB | p50 ms | p95 ms | recall@32 |")
    log("|---|---|---|---|---|---|")
    for r in results:
        log(
            f"| {r['layout']} | {r['build_s']:.1f} | {r['size_mb']:.1f} | {r['p50']:.2f}"
            f" | {r['p95']:.2f} | {r['recall']:.3f} |"
        )


if __name__ == "__main__":
    main()
