"""Benchmark kb.search as readers with access control enforced, against off, in one run.

Loads the synthetic corpus of bench_search.py (documents in 100 groups, 1% of chunks each), then
times the same queries (frequent terms and NPL questions, each with an embedding):

  off: as the owner (a superuser);
  on (a copy of the database after kb.access_enable(), which rebuilds the lexical cache by
       visibility class): reader r1 granted 1 of the 100 groups (1% of the chunks), reader r50
       granted 50 (50%), and the owner.

Readers run under SET ROLE (what kbpg's KnowledgeBase.session does per transaction) and read
through the SECURITY DEFINER reader API, which applies their grants itself. `--before REV` also
times REV's functions (installed in schema kb_before of the "on" database; the readers get
SELECT on kb's tables for them, as REV granted it, and row-level security filters their rows),
so each reader's cost is compared before and after in the same run.

Every query runs in all variants one right after the other (the machine is shared, so blocks
timed minutes apart are not comparable). It prints p50/p95 per variant, the ratios to the
owner's with access control off (and now / before, the median of per-query ratios), the vector
arm's recall@32 against an exact scan of the rows the reader may see, and whether the lexical
arm's top-32 is identical to exhaustive BM25 over those rows.

    python benchmarks/bench_access.py --before main     # 200k chunks, ~20 min on 2 cores
    python benchmarks/bench_access.py --layout interleaved   # the lexical cache's worst case
    python benchmarks/bench_access.py --chunks 20000  # quick look
"""

from __future__ import annotations

import argparse
import random
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
    POOL,
    corpus_arguments,
    database_url,
    load,
    log,
    percentile,
    prewarm,
    query_embedding,
    query_texts,
)
from bench_search import install_before as install_rev

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

N_GROUPS = 100
READERS = {"bench_r1": ["g0"], "bench_r50": [f"g{i}" for i in range(50)]}
Item = tuple[str, np.ndarray]


def setup_readers(conn: psycopg.Connection[Any]) -> None:
    reader = conn.execute("select reader_role from kb.access_settings").fetchone()
    assert reader is not None and reader[0], "kb.access_setup() did not run"
    for role, groups in READERS.items():
        conn.execute(f"drop role if exists {role}")
        conn.execute(f"create role {role} nologin")
        conn.execute(f'grant "{reader[0]}" to {role}')
        conn.execute("select kb.grant_groups(%s, %s)", (role, groups))


def exact_visible(conn: psycopg.Connection[Any], groups: list[str], emb: np.ndarray) -> set[int]:
    """The true top-POOL ids among the rows of these groups (a sequential scan, as the owner)."""
    with conn.transaction():
        conn.execute("set local enable_indexscan = off")
        conn.execute("set local enable_bitmapscan = off")
        rows = conn.execute(
            "select s.id from (select id, embedding <=> %s as distance from kb.chunks"
            " where groups = '{}' or groups && %s order by 2, id limit %s) s"
            " where 1 - s.distance >= 0.30",
            (emb, groups, POOL),
        ).fetchall()
    return {r[0] for r in rows}


def exhaustive_bm25(conn: psycopg.Connection[Any], groups: list[str], text: str) -> list[Any]:
    """Exact BM25 over the given groups' chunks, as the owner, without the impact cache (every
    chunk of the corpus has a group: a reader's visibility is this groups filter)."""
    with conn.transaction():
        conn.execute("set local kb.lexical_exhaustive_limit = 1000000000")
        return conn.execute(
            "select chunk_id from kb.search_lexical(%s, %s, groups => %s)", (text, POOL, groups)
        ).fetchall()


def install_before(conn: psycopg.Connection[Any], rev: str) -> None:
    """REV's search functions in schema kb_before (bench_search.install_before); readers may
    run them with REV's table grants (SELECT under row-level security)."""
    install_rev(conn, rev)
    for role in READERS:
        conn.execute(f"grant usage on schema kb_before to {role}")
        conn.execute(f"grant select on all tables in schema kb to {role}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser, keep=False)
    parser.add_argument(
        "--layout",
        choices=["grouped", "interleaved"],
        default="grouped",
        help="grouped: each group's documents loaded together (ids contiguous per group, as"
        " when each group is ingested on its own); interleaved: every block of chunk ids holds"
        " every group (the lexical cache's worst case: a row per lexeme, block and group)",
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also time REV's sql/ functions (a git revision; schema kb_before) as each reader",
    )
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-access-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()

        def db_url(name: str) -> str:
            return database_url(admin, name)

        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench_off")
        kdb.upgrade(db_url("bench_off"))
        with psycopg.connect(db_url("bench_off"), prepare_threshold=None) as conn:
            register_vector(conn)
            log(f"loading {args.chunks:,} chunks in {N_GROUPS} groups, {args.layout} ...")
            info = load(
                conn,
                db_url("bench_off"),
                args.chunks,
                args.seed,
                n_groups=N_GROUPS,
                grouped=args.layout == "grouped",
            )
            conn.autocommit = True
            setup_readers(conn)
        # the same data twice, enforcement off and on, so every query is timed in both states
        # one right after the other (the machine is shared: blocks timed minutes apart differ)
        started = time.perf_counter()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench_on template bench_off")
        with psycopg.connect(db_url("bench_on"), autocommit=True) as conn:
            conn.execute("select kb.access_enable()")
            size = conn.execute(
                "select pg_size_pretty(pg_total_relation_size('kb.lexical_blocks'))"
            ).fetchone()
            assert size is not None
            if args.before:
                install_before(conn, args.before)
        log(
            f"copy + kb.access_enable(): {time.perf_counter() - started:.0f} s (lexical cache"
            f" rebuilt by visibility class: {size[0]}, was {info['sizes']['lexical_blocks']})"
        )
        conns = {}
        for label, name, role, schema in VARIANTS:
            if schema == "kb_before" and not args.before:
                continue
            conn = psycopg.connect(db_url(name), prepare_threshold=None, autocommit=True)
            register_vector(conn)
            if role is not None:
                conn.execute(f"set role {role}")
            conns[label] = (conn, schema)
        try:
            run(conns, info, args)
        finally:
            for conn, _ in conns.values():
                conn.close()
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


# (label, database, role, schema): the owner is a superuser; a reader runs its grants through
# the reader API (kb) or, before, through row-level security on tables it may SELECT (kb_before)
VARIANTS = [
    ("off, owner", "bench_off", None, "kb"),
    ("on, r1 (1%) before", "bench_on", "bench_r1", "kb_before"),
    ("on, r1 (1%) now", "bench_on", "bench_r1", "kb"),
    ("on, r50 (50%) before", "bench_on", "bench_r50", "kb_before"),
    ("on, r50 (50%) now", "bench_on", "bench_r50", "kb"),
    ("on, owner", "bench_on", None, "kb"),
]


def run(
    conns: dict[str, tuple[psycopg.Connection[Any], str]],
    info: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    prewarm(conns["off, owner"][0])
    prewarm(conns["on, owner"][0])
    rng = random.Random(args.seed + 1)
    nrng = np.random.default_rng(args.seed + 1)
    centroids: np.ndarray = info["centroids"]

    def embedding() -> np.ndarray:
        return query_embedding(centroids, nrng)

    texts = query_texts(info, rng, args.queries)
    sets = {name: [(t, embedding()) for t in ts] for name, ts in texts.items()}
    warm = [(t, embedding()) for t in rng.sample(info["npl_queries"], 40)]

    arms = {
        "kb.search hybrid": "select chunk_id from {kb}.search(%(t)s, %(e)s, match_count => 8)",
        "kb.search hybrid, groups {g3}": "select chunk_id from {kb}.search(%(t)s, %(e)s,"
        " match_count => 8, groups => '{{g3}}')",
        "kb.search lexical only": "select chunk_id from {kb}.search(%(t)s, match_count => 8)",
        "kb.search_vector": f"select chunk_id from {{kb}}.search_vector(%(e)s, {POOL})",
        "kb.search_lexical": f"select chunk_id from {{kb}}.search_lexical(%(t)s, {POOL})",
    }
    for conn, schema in conns.values():
        for text, emb in warm:
            conn.execute(
                arms["kb.search hybrid"].format(kb=schema), {"t": text, "e": emb}
            ).fetchall()

    times: dict[tuple[str, str, str], list[float]] = {}
    out: dict[tuple[str, str, str], list[Any]] = {}
    log(f"\n{'':22} {'queries':15} {'':30} {'p50 ms':>8} {'p95 ms':>8}")
    for set_name, items in sets.items():
        for arm, sql in arms.items():
            for n, (text, emb) in enumerate(items):
                # each query in every variant, one right after the other (alternating order)
                order = list(conns.items()) if n % 2 == 0 else list(reversed(conns.items()))
                for label, (conn, schema) in order:
                    t = time.perf_counter()
                    got = conn.execute(sql.format(kb=schema), {"t": text, "e": emb}).fetchall()
                    times.setdefault((label, set_name, arm), []).append(
                        (time.perf_counter() - t) * 1000
                    )
                    out.setdefault((label, set_name, arm), []).append(got)
            for label in conns:
                ms = times[(label, set_name, arm)]
                log(
                    f"{label:22} {set_name:15} {arm:30} {statistics.median(ms):8.2f}"
                    f" {percentile(ms, 0.95):8.2f}"
                )

    log("\np95 ratio to the owner's with access control off:")
    for set_name in sets:
        for arm in arms:
            base = percentile(times[("off, owner", set_name, arm)], 0.95)
            ratios = ", ".join(
                f"{label} {percentile(times[(label, set_name, arm)], 0.95) / base:.2f}x"
                for label in conns
                if label != "off, owner"
            )
            log(f"  {set_name:15} {arm:30} {ratios}")
    if args.before:
        log("\nnow / before, median of per-query ratios; identical results now vs before:")
        for set_name in sets:
            for arm in arms:
                parts = []
                for reader in ("r1 (1%)", "r50 (50%)"):
                    before = (f"on, {reader} before", set_name, arm)
                    now = (f"on, {reader} now", set_name, arm)
                    ratio = statistics.median(
                        a / b for a, b in zip(times[now], times[before], strict=True)
                    )
                    same = sum(a == b for a, b in zip(out[now], out[before], strict=True))
                    parts.append(f"{reader} {ratio:.2f}x ({same}/{len(out[now])} same)")
                log(f"  {set_name:15} {arm:30} {', '.join(parts)}")

    # last: the exact scans read the whole table and would evict what the timings rely on
    owner = conns["on, owner"][0]
    for reader, role in (("r1 (1%)", "bench_r1"), ("r50 (50%)", "bench_r50")):
        label = f"on, {reader} now"
        for set_name, items in sets.items():
            got = out[(label, set_name, "kb.search_vector")]
            truths = [exact_visible(owner, READERS[role], emb) for _, emb in items]
            # a query with no visible chunk above min_similarity has nothing to recall: it
            # counts as right when the arm returns nothing too (as 0 it read as a miss)
            recall = statistics.mean(
                len({r[0] for r in g} & t) / len(t) if t else float(not g)
                for g, t in zip(got, truths, strict=True)
            )
            empty = sum(not t for t in truths)
            lexical = out[(label, set_name, "kb.search_lexical")]
            exact = [exhaustive_bm25(owner, READERS[role], text) for text, _ in items]
            same = sum(a == b for a, b in zip(lexical, exact, strict=True))
            log(
                f"{label:22} {set_name:15} vector recall@{POOL} vs exact visible scan {recall:.3f}"
                f" ({empty} with no visible match);"
                f" lexical top-{POOL} identical to exhaustive BM25 on {same}/{len(items)}"
            )


if __name__ == "__main__":
    main()
