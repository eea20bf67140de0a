"""Recall@32 of the HNSW index per hnsw.ef_search, over several builds of the index (not a test;
prints numbers).

Runs on a server kept by `bench_search.py --keep DIR` (its corpus and centroids). Query sets:
bench_search's two (the embeddings of its "frequent terms" and "NPL questions" queries, the
vector recall it prints) and `--random N` more drawn the same way. The truth is an exact scan
with the vector arm's 0.30 similarity floor (cached in DIR per set), recall as bench_search
counts it. Each ef_search value runs the index query kb.search_vector issues for the layout (top
32 by the index's expression, re-ranked by exact cosine), timed.

HNSW builds are not deterministic (parallel workers insert concurrently, levels are drawn at
random), so recall differs from one build to the next: `--builds K` rebuilds the index K times
as kbpg builds it (kb.set_embedding_layout; `--m` / `--ef-construction` override its build
parameters) and measures each. Every build's numbers are appended to DIR/recall-builds.jsonl;
the summary prints, per build parameters, ef_search and query set, the worst / median / best
build over every record of the files given (`--summary FILE ...` combines kept servers).

    python benchmarks/bench_search.py --chunks 1000000 --keep /tmp/kb1m --shared-buffers 6GB
    python benchmarks/bench_hnsw_recall.py --keep /tmp/kb1m --ef 256,384,512   # the index there
    python benchmarks/bench_hnsw_recall.py --keep /tmp/kb1m --builds 2 --ef-construction 200
    python benchmarks/bench_hnsw_recall.py --summary /tmp/kb1m*/recall-builds.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from bench_search import (
    DIM,
    POOL,
    database_url,
    log,
    percentile,
    query_embedding,
    query_items,
    restart_for_shared_buffers,
)
from pgvector.psycopg import register_vector

from kbpg.store import indexing
from kbpg.store.embedded import EmbeddedServer

ORDER_BY = {
    "vector": "embedding <=> %(q)s",
    "halfvec": f"embedding::halfvec({DIM}) <=> %(q)s::halfvec({DIM})",
    "binary": f"binary_quantize(embedding)::bit({DIM}) <~> binary_quantize(%(q)s)::bit({DIM})",
}
FLOOR = 0.30  # kb.search_vector's default min_similarity


def truths(
    conn: psycopg.Connection[Any], queries: list[np.ndarray], cache: Path
) -> list[list[int]]:
    """The exact top-POOL ids at or above the floor, per query (as bench_search's
    exact_neighbours), cached in `cache`."""
    if cache.exists():
        cached: list[list[int]] = json.loads(cache.read_text())
        if len(cached) == len(queries):
            return cached
    started = time.perf_counter()
    found: list[list[int]] = []
    for q in queries:
        with conn.transaction():
            conn.execute("set local enable_indexscan = off")
            rows = conn.execute(
                "select s.id from (select id, embedding <=> %s as distance from kb.chunks"
                " order by 2, id limit %s) s where 1 - s.distance >= %s",
                (q, POOL, FLOOR),
            ).fetchall()
        found.append([r[0] for r in rows])
    cache.write_text(json.dumps(found))
    log(f"exact top-{POOL} of {len(queries)} queries in {time.perf_counter() - started:.0f} s")
    return found


def index_parameters(indexdef: str) -> str:
    found = re.search(r"with \((.*)\)", indexdef, re.IGNORECASE)
    return found.group(1) if found else "?"


def rebuild(
    conn: psycopg.Connection[Any], url: str, m: int | None, ef_construction: int | None
) -> float:
    """Rebuild the index as kbpg does (kb.set_embedding_layout, settings sized by kbpg), with
    kb._vector_index_definition's m / ef_construction replaced for this build if given."""
    original = None
    if m is not None or ef_construction is not None:
        row = conn.execute(
            "select pg_get_functiondef('kb._vector_index_definition(text, integer)'::regprocedure)"
        ).fetchone()
        assert row is not None
        original = str(row[0])
        changed = original
        if m is not None:
            changed = re.sub(r"m = \d+", f"m = {m}", changed)
        if ef_construction is not None:
            changed = re.sub(
                r"ef_construction = \d+", f"ef_construction = {ef_construction}", changed
            )
        conn.execute(changed.encode())
    last = [0.0]

    def progress(p: indexing.IndexProgress) -> None:
        if p.elapsed_s - last[0] >= 60:
            last[0] = p.elapsed_s
            log(f"  {p.describe()}")

    try:
        _, seconds = indexing.set_layout(conn, url, progress=progress)
    finally:
        if original is not None:
            conn.execute(original.encode())
    conn.execute("vacuum analyze kb_data.chunks")
    return seconds


def measure(
    conn: psycopg.Connection[Any],
    layout: str,
    sets: dict[str, list[np.ndarray]],
    truth: dict[str, list[list[int]]],
    efs: list[int],
    fetched: list[int],
    retries: list[int],
) -> list[dict[str, Any]]:
    sql = (
        "select id from (select id, embedding <=> %(q)s as d from kb.chunks"
        f" where embedding is not null order by {ORDER_BY[layout]} limit %(n)s) x"
        " where 1 - x.d >= %(floor)s order by d, id limit %(pool)s"
    )
    out: list[dict[str, Any]] = []
    combinations = [(e, n, r, name) for e in efs for n in fetched for r in retries for name in sets]
    for ef, n, retry, name in combinations:
        queries = sets[name]
        times: list[float] = []
        recalls: list[float] = []
        retried = 0
        for q, true_ids in zip(queries, truth[name], strict=True):
            with conn.transaction():
                conn.execute(f"set local hnsw.ef_search = {ef}")
                conn.execute("set local hnsw.iterative_scan = relaxed_order")
                started = time.perf_counter()
                rows = conn.execute(sql, {"q": q, "n": n, "pool": POOL, "floor": FLOOR}).fetchall()
                if retry and len(rows) < POOL:  # as kb.search_vector: once more, wider
                    retried += 1
                    conn.execute(f"set local hnsw.ef_search = {retry}")
                    rows = conn.execute(
                        sql, {"q": q, "n": n, "pool": POOL, "floor": FLOOR}
                    ).fetchall()
                times.append((time.perf_counter() - started) * 1000)
            recalls.append(len({r[0] for r in rows} & set(true_ids)) / max(1, len(true_ids)))
        out.append(
            {
                "ef_search": ef,
                "candidates": n,
                "retry": retry,
                "retried": retried,
                "set": name,
                "recall": statistics.mean(recalls),
                "recalls": recalls,
                "p50_ms": statistics.median(times),
                "p95_ms": percentile(times, 0.95),
            }
        )
        log(
            f"ef_search {ef:5}, {n:3} candidates, {name:15}: recall@{POOL} {statistics.mean(recalls):.3f}"
            f" (queries under .5: {sum(r < 0.5 for r in recalls)} of {len(recalls)}"
            + (f", {retried} scanned again" if retry else "")
            + "),"
            f" p50 {statistics.median(times):.1f} ms, p95 {percentile(times, 0.95):.1f} ms"
        )
    return out


def summary(files: list[Path]) -> None:
    """Worst / median / best build per (build parameters, chunks, ef_search, set)."""
    latest: dict[tuple[str, int, str, int, int, int], dict[str, Any]] = {}
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)  # the same build measured again: its last numbers count
            key = (
                r["dir"],
                r["index_oid"],
                r["set"],
                r["ef_search"],
                r.get("candidates", POOL),
                r.get("retry", 0),
            )
            latest[key] = r
    by: dict[tuple[int, str, str, int, int, int], list[float]] = defaultdict(list)
    for r in latest.values():
        key = (
            r["chunks"],
            r["parameters"],
            r["set"],
            r["ef_search"],
            r.get("candidates", POOL),
            r.get("retry", 0),
        )
        by[key].append(r["recall"])
    log(
        f"\n{'chunks':>9} {'build':32} {'set':15} {'ef':>5} {'fetch':>5} {'retry':>5}"
        f" {'builds':>6}  worst  median  best"
    )
    for (chunks, params, name, ef, n, retry), recalls in sorted(by.items()):
        log(
            f"{chunks:9,} {params:32} {name:15} {ef:5} {n:5} {retry or '-':>5} {len(recalls):6}"
            f"  {min(recalls):.3f}  {statistics.median(recalls):.3f}  {max(recalls):.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, metavar="DIR")
    parser.add_argument("--ef", default="256,384,512", help="comma-separated ef_search values")
    parser.add_argument(
        "--candidates",
        default=str(POOL),
        help="comma-separated: rows the index scan fetches, re-ranked by exact cosine to the top 32",
    )
    parser.add_argument(
        "--retry",
        default="0,1000",
        metavar="EF,...",
        help="as kb.search_vector does: a scan that brings back fewer than 32 chunks above the"
        " floor runs again at ef_search EF (0: no second scan); each value in turn",
    )
    parser.add_argument("--random", type=int, default=200, help="queries of the random set")
    parser.add_argument("--seed", type=int, default=99, help="seed of the random set")
    parser.add_argument("--builds", type=int, default=0, help="rebuild the index K times")
    parser.add_argument("--m", type=int, help="m of the rebuilt index (default: kbpg's)")
    parser.add_argument("--ef-construction", type=int, help="ef_construction of the rebuilt index")
    parser.add_argument("--shared-buffers", metavar="SIZE", help="as bench_search's")
    parser.add_argument("--summary", type=Path, nargs="*", metavar="FILE", help="only summarize")
    args = parser.parse_args()
    if args.summary is not None:
        summary(args.summary)
        return
    if args.keep is None:
        parser.error("--keep DIR is required")

    home = args.keep.resolve()
    info = json.loads((home / "bench-info.json").read_text())
    info["centroids"] = np.array(info["centroids"], dtype=np.float32)
    sets = {name: [e for _, e in items] for name, items in query_items(info, info["seed"], 40)}
    if args.random:
        draw = np.random.default_rng(args.seed)
        sets["random"] = [query_embedding(info["centroids"], draw) for _ in range(args.random)]
    efs = [int(v) for v in args.ef.split(",")]
    fetched = [int(v) for v in args.candidates.split(",")]
    retries = [int(v) for v in args.retry.split(",")]
    results = home / "recall-builds.jsonl"
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        if restart_for_shared_buffers(admin, args.shared_buffers):
            server.stop()
            admin = server.start()
        url = database_url(admin, "bench")
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            register_vector(conn)
            truth = {
                name: truths(conn, qs, home / f"truth-{name.replace(' ', '-')}-{len(qs)}.json")
                for name, qs in sets.items()
            }
            conn.execute("create extension if not exists pg_prewarm")
            for build in range(max(1, args.builds)):
                build_s = None
                if args.builds:
                    log(f"build {build + 1} of {args.builds} ...")
                    build_s = rebuild(conn, url, args.m, args.ef_construction)
                row = conn.execute(
                    "select e.layout, i.indexdef, 'kb_data.chunks_embedding_hnsw'::regclass::oid"
                    " from kb.embedding_space e, pg_indexes i"
                    " where i.indexname = 'chunks_embedding_hnsw'"
                ).fetchone()
                assert row is not None, "no HNSW index in DIR"
                layout, indexdef, index_oid = row
                log(indexdef + (f" (built in {build_s:.0f} s)" if build_s else ""))
                conn.execute("select pg_prewarm('kb_data.chunks_embedding_hnsw')")
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                with results.open("a") as f:
                    for r in measure(conn, layout, sets, truth, efs, fetched, retries):
                        record = {
                            "dir": str(home),
                            "chunks": info["chunks"],
                            "parameters": index_parameters(indexdef),
                            "index": indexdef,
                            "index_oid": int(index_oid),
                            "built_s": build_s,
                            "measured": stamp,
                            **r,
                        }
                        f.write(json.dumps(record) + "\n")
    finally:
        server.stop()
    summary([results])


if __name__ == "__main__":
    main()
