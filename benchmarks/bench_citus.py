"""kbpg on Citus against one server: latencies at 1, 2 and 8 shards, commands a search sends,
vector recall@32, in one run on the same corpus (not a test; prints numbers).

Needs KBPG_CITUS_PG: a PostgreSQL installation with Citus built in (docs/citus.md: the build;
no package registry ships one). A coordinator and two workers start on 127.0.0.1 from it
(tests/citus.py), beside a throwaway embedded server for the single-server baseline. The
synthetic corpus of tests/citus_harness.py (40k one-chunk records by default: NPL's word
distribution, clustered 384-d vectors, groups / categories / labels, shared codes for entity
edges) is ingested by kbpg into the single server and into one cluster database per shard
count, then each search variant runs on every target query by query, interleaved (so load
from other jobs falls on all alike), each call in its own transaction block as kbpg's clients
run it, prepared statements off.

    KBPG_CITUS_PG=/path/to/pginstall python benchmarks/bench_citus.py
    KBPG_CITUS_PG=... python benchmarks/bench_citus.py --chunks 10000 --shards 2 --queries 20
    KBPG_CITUS_PG=... python benchmarks/bench_citus.py --pool-size 1  # one connection a worker

Everything runs on this machine: workers and coordinator share its cores, so the cluster's
latencies measure Citus's overhead (planning, a round trip a task, merging), not a speed-up.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbpg.store import db as kdb
from kbpg.store import distribute
from kbpg.store.embedded import EmbeddedServer
from tests import citus_harness as h
from tests.citus import Cluster, installation, skip_reason

TIMED = [
    "search hybrid",
    "search text only",
    "search vector only",
    "search graph",
    "search groups",
    "search category",
    "search_vector",
    "search_lexical",
    "search_lexical groups",
]


def log(message: str) -> None:
    print(message, flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=40_000)
    parser.add_argument("--shards", default="1,2,8", help="shard counts, comma-separated")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the queries timed")
    parser.add_argument("--port", type=int, default=57700)
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="citus.max_adaptive_executor_pool_size for the searches (connections a worker)",
    )
    args = parser.parse_args()
    install = installation()
    if install is None:
        sys.exit(skip_reason())
    shard_counts = [int(s) for s in args.shards.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kbpg-bench-citus-", dir="/tmp"))
    work.chmod(0o755)
    cluster = Cluster(install, work / "cluster", workers=2, port=args.port)
    single_server = EmbeddedServer(work / "single", durable=False)
    log(f"load average at start: {loadavg()}")
    try:
        cluster.start()
        single_server.start()
        corpus = h.synthetic_corpus(work, n_chunks=args.chunks, n_queries=args.queries)
        targets: dict[str, str] = {}
        admin = single_server.url("postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("create database bench_single")
        targets["single"] = single_server.url("bench_single")
        kdb.upgrade(targets["single"])
        for shards in shard_counts:
            url = cluster.create_database(f"bench_{shards}")
            kdb.upgrade(url)
            distribute.distribute(url, shards)
            targets[f"citus {shards} shards"] = url
        for name, url in targets.items():
            t0 = time.perf_counter()
            summary = h.load(url, corpus)
            log(f"loaded {name}: {summary.chunks} chunks in {time.perf_counter() - t0:.1f} s")

        log("\nequivalence (every variant, every query, against the single server):")
        for name, url in targets.items():
            if name == "single":
                continue
            for exact in (True, False):
                result = h.compare(targets["single"], url, corpus, exact_vectors=exact)
                differing = sorted({d.variant for d in result.differences})
                log(
                    f"  {name}, {'exact vector scans' if exact else 'HNSW'}: "
                    f"{result.checked - len(result.differences)}/{result.checked} calls identical "
                    f"({result.rows} rows)" + (f"; differing: {differing}" if differing else "")
                )

        log("\nvector recall@32 (kb.search_vector against an exact scan):")
        for name, url in targets.items():
            log(f"  {name}: {h.recall_at(url, corpus):.3f}")

        run(targets, corpus, args)
    finally:
        log(f"\nload average at end: {loadavg()}")
        cluster.remove()
        single_server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(targets: dict[str, str], corpus: h.Corpus, args: argparse.Namespace) -> None:
    conns = {name: kdb.connect(url, prepare_threshold=None) for name, url in targets.items()}
    by_name = {v.name: v for v in h.variants(corpus)}
    try:
        log("\ncommands sent to the workers by one call (query 0, in a transaction block):")
        for variant in ("search hybrid", "search text only", "search_vector", "search graph"):
            counts = []
            for name, conn in conns.items():
                if name == "single":
                    continue
                sent = h.commands(conn, by_name[variant].sql, h.parameters(corpus, 0))
                counts.append(f"{name}: {sent['all']} ({sent['SELECT']} SELECT)")
            log(f"  {variant}: " + ", ".join(counts))

        # warm every target (caches, connections to the workers)
        for variant in TIMED:
            for i in range(min(5, len(corpus.queries))):
                for conn in conns.values():
                    h.run_variant(conn, by_name[variant], h.parameters(corpus, i))
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for i in range(len(corpus.queries)):
                params = h.parameters(corpus, i)
                for variant in TIMED:
                    for name, conn in conns.items():
                        if args.pool_size and name != "single":
                            conn.execute(
                                "select set_config('citus.max_adaptive_executor_pool_size', %s, true)",
                                (str(args.pool_size),),
                            )
                        t0 = time.perf_counter()
                        h.run_variant(conn, by_name[variant], params)
                        times.setdefault((variant, name), []).append(
                            (time.perf_counter() - t0) * 1000
                        )
        log(f"\nlatency, ms p50 / p95 ({args.rounds} x {len(corpus.queries)} calls each):")
        header = "variant".ljust(26) + "".join(n.rjust(22) for n in conns)
        log(header)
        for variant in TIMED:
            cells = []
            for name in conns:
                values = times[(variant, name)]
                cells.append(
                    f"{statistics.median(values):.2f} / {percentile(values, 0.95):.2f}".rjust(22)
                )
            log(variant.ljust(26) + "".join(cells))
    finally:
        for conn in conns.values():
            conn.close()


if __name__ == "__main__":
    main()
