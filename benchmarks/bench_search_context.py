"""Benchmark the cost of kb.search's exception section (issue 38), paired in one run.

kb.search re-raises any error from its inner functions so that a reader sees no internal
statement in CONTEXT; a PL/pgSQL block with an exception section starts a subtransaction each
call. This loads bench_search.py's synthetic corpus, installs a copy of kb.search without the
exception section (kb_bench.search) and times both on the same queries (frequent terms
and NPL questions, each with an embedding), one right after the other, as the owner and as a
reader granted 1 of 100 groups. It prints p50 per variant and the median per-query ratio.

    python benchmarks/bench_search_context.py --chunks 20000 --queries 100
"""

from __future__ import annotations

import argparse
import random
import re
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
from bench_search import (
    corpus_arguments,
    database_url,
    load,
    load_average,
    log,
    percentile,
    prewarm,
    query_embedding,
    query_texts,
)

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

# a schema of its own: the body qualifies its parameters by the function's name, `search.`
PLAIN = "kb_bench.search"


def install_plain(conn: psycopg.Connection[Any]) -> None:
    """kb.search's definition without its exception section, as PLAIN."""
    row = conn.execute(
        "select pg_get_functiondef(p.oid) from pg_proc p where p.oid = 'kb.search'::regproc"
    ).fetchone()
    assert row is not None
    source: str = row[0]
    plain, n = re.subn(
        r"\nexception when others or query_canceled then.*?\nend\n",
        "\nend\n",
        source,
        count=1,
        flags=re.S,
    )
    assert n == 1, "kb.search has no exception section"
    plain = plain.replace("FUNCTION kb.search(", f"FUNCTION {PLAIN}(", 1)
    conn.execute("create schema kb_bench")
    conn.execute(plain)
    conn.execute("grant usage on schema kb_bench to kbpg_reader")
    conn.execute(f"grant execute on function {PLAIN} to kbpg_reader")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser, keep=False)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-context-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        url = database_url(admin, "bench")
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench")
        kdb.upgrade(url)
        with psycopg.connect(url, prepare_threshold=None) as conn:
            register_vector(conn)
            log(f"loading {args.chunks:,} chunks ...")
            info = load(conn, url, args.chunks, args.seed)
            conn.autocommit = True
            conn.execute("select kb.access_enable()")
            conn.execute("create role bench_r1 login")
            conn.execute("grant kbpg_reader to bench_r1")
            conn.execute("select * from kb.grant_groups('bench_r1', array['g0'])")
            install_plain(conn)
            prewarm(conn)
        rng = random.Random(args.seed)
        draw = np.random.default_rng(args.seed)
        items = [
            (text, query_embedding(info["centroids"], draw))
            for texts in query_texts(info, rng, args.queries).values()
            for text in texts
        ]
        for who in (None, "bench_r1"):
            with psycopg.connect(url, prepare_threshold=None, autocommit=True) as conn:
                register_vector(conn)
                if who:
                    conn.execute(f"set role {who}")
                times: dict[str, list[float]] = {"kb.search": [], PLAIN: []}
                for text, emb in items * 2:  # the first pass warms up
                    for fn in ("kb.search", PLAIN) if rng.random() < 0.5 else (PLAIN, "kb.search"):
                        started = time.perf_counter()
                        rows = conn.execute(
                            f"select chunk_id from {fn}(%s, %s, match_count => 8)", (text, emb)
                        ).fetchall()
                        times[fn].append((time.perf_counter() - started) * 1000)
                        assert rows is not None
                half = len(items)
                now, plain = times["kb.search"][half:], times[PLAIN][half:]
                ratios = [a / b for a, b in zip(now, plain, strict=True)]
                log(
                    f"{who or 'owner'}: {len(now)} queries, p50 with exception section"
                    f" {percentile(now, 0.5):.2f} ms, without {percentile(plain, 0.5):.2f} ms,"
                    f" median per-query ratio {statistics.median(ratios):.3f}"
                    f" (load {load_average()})"
                )
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
