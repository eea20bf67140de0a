"""Benchmark layouts for many knowledge bases in one database (issue 39; not a test; prints numbers).

One throwaway embedded PostgreSQL, one database, four tables holding the same rows (synthetic
chunks as in bench_search.py: words drawn from NPL's unigram distribution, 384-d clustered unit
vectors), loaded in one run:

  alone    the big knowledge base's chunks only: the same corpus alone, the baseline
  shared   (a) every knowledge base in one table with `kb_id`: one HNSW and one GIN over all,
           a b-tree on kb_id; a knowledge base is a filter (pgvector #479)
  parted   (b) PARTITION BY LIST (kb_id), one partition per knowledge base, each with its own
           HNSW, GIN and primary key (indexes declared on the parent)
  tiered   (c) PARTITION BY LIST (part): a knowledge base past a size threshold has a
           partition of its own (HNSW, GIN); every small one lives in one shared partition
           (GIN, b-tree on (kb_id, id), no HNSW: below the exact/HNSW crossover kbpg's vector
           arm already sorts the filtered rows exactly), so creating one is an INSERT

Knowledge bases: 1 big (--big chunks, kb_id 1), 1 medium (--medium, kb_id 2), and --small
others of 100-1,000 chunks (log-uniform). A small knowledge base's vectors come from 5 of the
500 centroids (a topic), its queries are drawn near one of them; the big one uses all centroids.
Rows go in as knowledge bases ingest: batches of 100 chunks of random knowledge bases.

The queries are the two arms' access paths as kbpg's functions run them (the vector arm:
`order by embedding <=> q limit 32` with hnsw.ef_search 256, iterative scan relaxed_order,
hnsw.max_scan_tuples 20000, or the filtered rows sorted exactly; the lexical arm's GIN
candidates ranked, here by ts_rank over an OR query of the NPL question's lexemes, not kbpg's
BM25 impact cache), each statement planned per call as the functions' EXECUTE plans it. Then:

  search latency in the big knowledge base vs alone, paired query by query (interleaved);
  recall@32 against an exact scan of the knowledge base: big, medium and small ones;
  planning time with 1,000 partitions (EXPLAIN (SUMMARY), custom and generic plans) and a join
  by chunk id without kb_id; create / drop of a small knowledge base (500 chunks) and of the
  big one; catalog size; DDL an upgrade would run (add column, index, constraint, trigger) on
  the 1,000-partition table and on the others; whether creating or dropping a partition waits
  for a search running in another knowledge base.

    nice -n 10 python benchmarks/bench_knowledge_bases.py   # 612k chunks: over 40 min at load 6-12
    nice -n 10 python benchmarks/bench_knowledge_bases.py --big 50000 --medium 5000 --small-min 100 \
        --small-max 250     # 220k chunks, 1,000 knowledge bases: 30 min at load 7-12 (the doc's run)
    nice -n 10 python benchmarks/bench_knowledge_bases.py --big 20000 --small 200  # quick look
    ... --keep /tmp/kbpg-kbs   # keep the loaded server; a later run reuses it (no reload)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import (
    DIM,
    bench_home,
    database_url,
    interleaved,
    load_average,
    log,
    percentile,
    word_distribution,
)

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

POOL = 32  # kb.search's per-arm pool for match_count 8
EF_SEARCH = 256  # kb.search_vector: 8 x the pool it is asked for
BIG, MEDIUM = 1, 2
LAYOUTS = ("alone", "shared", "parted", "tiered")
BATCH = 100


def sizes(args: argparse.Namespace) -> dict[int, int]:
    """kb_id -> chunks: the big one, the medium one, the small ones (log-uniform between
    --small-min and --small-max)."""
    rng = random.Random(args.seed)
    out = {BIG: args.big, MEDIUM: args.medium}
    for k in range(3, args.small + 3):
        out[k] = round(math.exp(rng.uniform(math.log(args.small_min), math.log(args.small_max))))
    return out


def tiers(kb_sizes: dict[int, int], threshold: int) -> dict[int, int]:
    """kb_id -> `part` of the tiered layout: its own id past the threshold, else 0 (shared)."""
    return {k: (k if n >= threshold else 0) for k, n in kb_sizes.items()}


def generate(conn: psycopg.Connection[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Table src (kb_id, id, content, tsv, embedding) in ingest order, and the query material."""
    rng = random.Random(args.seed)
    nrng = np.random.default_rng(args.seed)
    words, probs, npl_queries = word_distribution(rng)
    centroids = nrng.normal(size=(500, DIM)).astype(np.float32)
    kb_sizes = sizes(args)
    topics = {k: nrng.choice(500, size=5, replace=False).tolist() for k in kb_sizes if k != BIG}
    batches = [k for k, n in kb_sizes.items() for _ in range(math.ceil(n / BATCH))]
    rng.shuffle(batches)
    left = dict(kb_sizes)
    conn.execute(
        f"create unlogged table src (kb_id integer not null, id bigint primary key,"
        f" content text not null, embedding vector({DIM}) not null)"
    )
    started = time.perf_counter()
    next_id = 1
    with conn.cursor() as cur, cur.copy("copy src from stdin with (format binary)") as copy:
        copy.set_types(["int4", "int8", "text", "vector"])
        for b, k in enumerate(batches):
            n = min(BATCH, left[k])
            left[k] -= n
            lengths = nrng.integers(30, 121, size=n)
            drawn = nrng.choice(len(words), size=int(lengths.sum()), p=probs)
            pick = (
                nrng.integers(0, 500, size=n)
                if k == BIG
                else np.array(topics[k])[nrng.integers(0, 5, size=n)]
            )
            vectors = centroids[pick] + nrng.normal(scale=0.9, size=(n, DIM)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            offset = 0
            for i in range(n):
                text = " ".join(words[j] for j in drawn[offset : offset + lengths[i]])
                offset += int(lengths[i])
                copy.write_row((k, next_id, text, vectors[i]))
                next_id += 1
            if b % 1000 == 999:
                log(f"  generated {next_id - 1:,} chunks ({time.perf_counter() - started:.0f} s)")
    conn.execute("alter table src add column tsv tsvector")
    conn.execute("update src set tsv = to_tsvector('english', content)")
    conn.execute("analyze src")
    conn.commit()
    log(f"src: {next_id - 1:,} chunks in {time.perf_counter() - started:.0f} s")
    return {
        "sizes": {str(k): n for k, n in kb_sizes.items()},
        "topics": {str(k): t for k, t in topics.items()},
        "centroids": centroids.tolist(),
        "npl_queries": npl_queries,
    }


COLUMNS = "kb_id, id, content, tsv, embedding"


def timed_sql(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> float:
    t = time.perf_counter()
    conn.execute(sql, params or None)
    return time.perf_counter() - t


def build(conn: psycopg.Connection[Any], info: dict[str, Any], args: argparse.Namespace) -> None:
    """The four layouts from src; build times into info['build']."""
    kb_sizes = {int(k): n for k, n in info["sizes"].items()}
    part = tiers(kb_sizes, args.threshold)
    spent: dict[str, float] = {}
    # the HNSW graph in memory (past it pgvector's build slows ~10x: 612k 384-d vectors, 1 GB)
    conn.execute("set maintenance_work_mem = '3GB'")
    conn.execute("set max_parallel_maintenance_workers = 0")
    hnsw = "using hnsw (embedding vector_cosine_ops) with (m = 16, ef_construction = 64)"
    cols = f"(kb_id integer not null, id bigint not null, content text not null, tsv tsvector, embedding vector({DIM}) not null"

    # the same corpus alone
    conn.execute(f"create table alone {cols}, primary key (id))")
    spent["alone rows"] = timed_sql(
        conn, f"insert into alone select {COLUMNS} from src where kb_id = {BIG} order by id"
    )
    spent["alone HNSW"] = timed_sql(conn, f"create index alone_hnsw on alone {hnsw}")
    spent["alone GIN"] = timed_sql(conn, "create index alone_gin on alone using gin (tsv)")
    conn.commit()
    log(f"  alone built ({sum(spent.values()):.0f} s)")

    # (a) one table, kb_id a filter
    conn.execute(f"create table shared {cols}, primary key (id))")
    spent["shared rows"] = timed_sql(
        conn, f"insert into shared select {COLUMNS} from src order by id"
    )
    spent["shared btree"] = timed_sql(conn, "create index shared_kb on shared (kb_id, id)")
    spent["shared HNSW"] = timed_sql(conn, f"create index shared_hnsw on shared {hnsw}")
    spent["shared GIN"] = timed_sql(conn, "create index shared_gin on shared using gin (tsv)")
    conn.commit()
    log(f"  shared built ({sum(spent.values()):.0f} s)")

    # (b) a partition per knowledge base
    conn.execute(f"create table parted {cols}, primary key (kb_id, id)) partition by list (kb_id)")
    t = time.perf_counter()
    for k in kb_sizes:
        conn.execute(f"create table parted_{k} partition of parted for values in ({k})")
    conn.commit()
    spent["parted 1,000 partitions (pk only)"] = time.perf_counter() - t
    spent["parted rows"] = timed_sql(
        conn, f"insert into parted select {COLUMNS} from src order by id"
    )
    conn.commit()
    spent["parted HNSW (one per partition)"] = timed_sql(
        conn, f"create index parted_hnsw on parted {hnsw}"
    )
    conn.commit()
    spent["parted GIN (one per partition)"] = timed_sql(
        conn, "create index parted_gin on parted using gin (tsv)"
    )
    conn.commit()
    log(f"  parted built ({sum(spent.values()):.0f} s)")

    # (c) own partitions past the threshold, one shared partition for the rest
    conn.execute(
        f"create table tiered (part integer not null, {cols[1:]},"
        " primary key (part, kb_id, id)) partition by list (part)"
    )
    conn.execute("create table tiered_shared partition of tiered for values in (0)")
    own = sorted({p for p in part.values() if p})
    for p in own:
        conn.execute(f"create table tiered_{p} partition of tiered for values in ({p})")
    conn.execute("create temporary table tiers (kb_id integer primary key, part integer)")
    with conn.cursor() as cur, cur.copy("copy tiers from stdin") as copy:
        for k, p in part.items():
            copy.write_row((k, p))
    spent["tiered rows"] = timed_sql(
        conn,
        f"insert into tiered select t.part, {COLUMNS} from src join tiers t using (kb_id) order by id",
    )
    spent["tiered HNSW (own partitions)"] = sum(
        timed_sql(conn, f"create index tiered_{p}_hnsw on tiered_{p} {hnsw}") for p in own
    )
    spent["tiered GIN"] = timed_sql(conn, "create index tiered_gin on tiered using gin (tsv)")
    conn.commit()
    log(f"  tiered built ({sum(spent.values()):.0f} s; own partitions: {own})")
    conn.autocommit = True
    for table in LAYOUTS:
        conn.execute(f"vacuum analyze {table}")
    conn.autocommit = False
    info["build"] = spent
    info["part"] = {str(k): p for k, p in part.items()}


# ---------------------------------------------------------------------------------------------
# queries


def kb_filter(layout: str, kb: int, part: int) -> str:
    if layout == "alone":
        return "true"
    if layout == "tiered":
        return f"part = {part} and kb_id = {kb}"
    return f"kb_id = {kb}"


def vector_hnsw(
    conn: psycopg.Connection[Any], layout: str, kb: int, part: int
) -> Callable[[Any], Any]:
    """The HNSW scan as kb.search_vector runs it (its settings are the session's: `settings`)."""
    sql = (
        f"select id from {layout} where {kb_filter(layout, kb, part)}"
        f" order by embedding <=> %s limit {POOL}"
    )

    def run(q: np.ndarray) -> list[int]:
        return [r[0] for r in conn.execute(sql, (q,)).fetchall()]

    return run


def vector_exact(
    conn: psycopg.Connection[Any], layout: str, kb: int, part: int
) -> Callable[[Any], Any]:
    """The filtered rows sorted exactly (kbpg's path below the crossover): the distance plus 0
    is no HNSW ordering, so only the filter can use an index."""
    sql = (
        f"select id from {layout} where {kb_filter(layout, kb, part)}"
        f" order by (embedding <=> %s) + 0, id limit {POOL}"
    )

    def run(q: np.ndarray) -> list[int]:
        return [r[0] for r in conn.execute(sql, (q,)).fetchall()]

    return run


SETTINGS = (
    f"set hnsw.ef_search = {EF_SEARCH}; set hnsw.iterative_scan = relaxed_order;"
    " set hnsw.max_scan_tuples = 20000"
)


def lexical(conn: psycopg.Connection[Any], layout: str, kb: int, part: int) -> Callable[[Any], Any]:
    sql = (
        f"select id from {layout} where {kb_filter(layout, kb, part)} and tsv @@ %s::tsquery"
        f" order by ts_rank(tsv, %s::tsquery) desc, id limit {POOL}"
    )

    def run(q: str) -> list[int]:
        return [r[0] for r in conn.execute(sql, (q, q)).fetchall()]

    return run


def or_query(conn: psycopg.Connection[Any], text: str) -> str:
    row = conn.execute(
        "select coalesce(string_agg(quote_literal(l), ' | '), '') from"
        " unnest(tsvector_to_array(to_tsvector('english', %s))) l",
        (text,),
    ).fetchone()
    return str(row[0]) if row else ""


def embedding_near(
    centroids: np.ndarray, topic: Sequence[int] | None, draw: np.random.Generator
) -> np.ndarray:
    c = int(draw.choice(topic)) if topic else int(draw.integers(0, len(centroids)))
    v = centroids[c] + draw.normal(scale=0.9, size=DIM)
    return np.asarray(v / np.linalg.norm(v), dtype=np.float32)


def per_kb(
    conn: psycopg.Connection[Any],
    make: Callable[[psycopg.Connection[Any], str, int, int], Callable[[Any], Any]],
    layout: str,
    part: dict[int, int],
) -> Callable[[tuple[int, np.ndarray]], Any]:
    """A search of (knowledge base, query embedding) pairs in one layout."""

    def run(item: tuple[int, np.ndarray]) -> Any:
        return make(conn, layout, item[0], part[item[0]])(item[1])

    return run


def recall(found: list[list[int]], truth: list[list[int]]) -> float:
    return statistics.mean(
        len(set(f) & set(t)) / max(1, len(t)) for f, t in zip(found, truth, strict=True)
    )


def stats_line(name: str, times: list[float], base: list[float] | None = None) -> str:
    line = (
        f"  {name:<52} p50 {statistics.median(times):7.2f}  p95 {percentile(times, 0.95):7.2f} ms"
    )
    if base is not None:
        ratio = statistics.median(a / b for a, b in zip(times, base, strict=True))
        line += f"   x{ratio:5.2f} (median per-query ratio to alone)"
    return line


def search_section(
    conn: psycopg.Connection[Any], info: dict[str, Any], args: argparse.Namespace
) -> None:
    centroids = np.array(info["centroids"], dtype=np.float32)
    part = {int(k): p for k, p in info["part"].items()}
    draw = np.random.default_rng(args.seed + 7)
    rng = random.Random(args.seed + 7)
    n = args.queries

    log(
        f"\n== the big knowledge base ({info['sizes'][str(BIG)]:,} chunks) vs the same corpus alone,"
        f" paired query by query, {n} queries (load average {load_average()})"
    )
    vectors = [embedding_near(centroids, None, draw) for _ in range(n)]
    texts = [or_query(conn, t) for t in rng.sample(info["npl_queries"], n)]
    truth = [vector_exact(conn, "alone", BIG, 0)(q) for q in vectors]
    for _ in range(args.repeat):
        for arm, fn, items in (
            ("vector (HNSW)", vector_hnsw, vectors),
            ("lexical (GIN + rank)", lexical, texts),
        ):
            interleaved([fn(conn, layout, BIG, part[BIG]) for layout in LAYOUTS], items[:5])  # warm
            runs = interleaved([fn(conn, layout, BIG, part[BIG]) for layout in LAYOUTS], items)
            for layout, (times, results) in zip(LAYOUTS, runs, strict=True):
                extra = ""
                if arm.startswith("vector"):
                    extra = f"  recall@{POOL} {recall(results, truth):.3f}"
                else:
                    same = sum(r == a for r, a in zip(results, runs[0][1], strict=True))
                    extra = f"  same ids as alone {same}/{n}"
                log(
                    stats_line(f"{arm}, {layout}", times, None if layout == "alone" else runs[0][0])
                    + extra
                )

    small = [k for k in (int(x) for x in info["sizes"]) if k > MEDIUM]
    for label, kbs in (
        (f"the medium knowledge base ({info['sizes'][str(MEDIUM)]:,} chunks)", [MEDIUM] * n),
        (
            f"small knowledge bases ({args.small_min}-{args.small_max} chunks), one query each",
            rng.sample(small, n),
        ),
    ):
        log(
            f"\n== {label}: recall@{POOL} against an exact scan of the knowledge base (load average {load_average()})"
        )
        qs = [embedding_near(centroids, info["topics"][str(k)], draw) for k in kbs]
        truth = [vector_exact(conn, "parted", k, part[k])(q) for k, q in zip(kbs, qs, strict=True)]
        variants = [
            ("shared, one HNSW filtered by kb_id", "shared", vector_hnsw),
            ("shared, exact (b-tree on kb_id, sorted)", "shared", vector_exact),
            ("parted, the partition's own HNSW", "parted", vector_hnsw),
            (
                "tiered, " + ("own partition HNSW" if part[kbs[0]] else "shared partition exact"),
                "tiered",
                vector_hnsw if part[kbs[0]] else vector_exact,
            ),
        ]
        pairs = list(zip(kbs, qs, strict=True))
        fns = [per_kb(conn, make, layout, part) for _, layout, make in variants]
        interleaved(fns, pairs[:5])
        runs = interleaved(fns, pairs)
        for (name, _, _), (times, results) in zip(variants, runs, strict=True):
            log(
                stats_line(name, times) + f"  recall@{POOL} {recall(results, truth):.3f}"
                f"  (min {min(len(set(r) & set(t)) / max(1, len(t)) for r, t in zip(results, truth, strict=True)):.2f})"
            )


# ---------------------------------------------------------------------------------------------
# planning, catalog, create/drop, DDL


def literal(v: Any) -> str:
    """A vector or an id array as an SQL literal (EXPLAIN and PREPARE take no bound values)."""
    if isinstance(v, np.ndarray):
        return "'[" + ",".join(f"{x:.6f}" for x in v) + "]'::vector"
    return "'{" + ",".join(str(i) for i in v) + "}'::bigint[]"


def explain_times(conn: psycopg.Connection[Any], sql: str, args: str = "") -> tuple[float, float]:
    """(planning, execution) ms of EXPLAIN (ANALYZE, SUMMARY), median of 5; with `args` the
    statement is PREPAREd and its generic plan EXECUTEd with them."""
    plans, execs = [], []
    for i in range(5):
        with conn.transaction():
            if args:
                conn.execute("set local plan_cache_mode = force_generic_plan")
                conn.execute(f"prepare p{i} as {sql}")
                explained = f"execute p{i}({args})"
            else:
                explained = sql
            text = "\n".join(
                r[0] for r in conn.execute(f"explain (analyze, summary) {explained}").fetchall()
            )
            if args:
                conn.execute(f"deallocate p{i}")
        plan = re.search(r"Planning Time: ([\d.]+)", text)
        done = re.search(r"Execution Time: ([\d.]+)", text)
        plans.append(float(plan.group(1)) if plan else 0.0)
        execs.append(float(done.group(1)) if done else 0.0)
    return statistics.median(plans), statistics.median(execs)


def planning_section(conn: psycopg.Connection[Any], info: dict[str, Any]) -> None:
    centroids = np.array(info["centroids"], dtype=np.float32)
    q = literal(embedding_near(centroids, None, np.random.default_rng(3)))
    part = {int(k): p for k, p in info["part"].items()}
    small = next(k for k, p in part.items() if p == 0 and k > MEDIUM)
    log(f"\n== planning (EXPLAIN (ANALYZE, SUMMARY), median of 5; load average {load_average()})")
    for layout in LAYOUTS:
        for kb, label in ((BIG, "big"), (small, "small")):
            if layout == "alone" and kb != BIG:
                continue
            where = kb_filter(layout, kb, part[kb])
            plan, exe = explain_times(
                conn,
                f"select id from {layout} where {where} order by embedding <=> {q} limit {POOL}",
            )
            log(
                f"  vector, {layout:<7} {label:<5} kb as a constant   planning {plan:7.2f} ms,"
                f" execution {exe:7.2f} ms"
            )
    for layout, key, args in (
        ("parted", "kb_id = $1", f"{BIG}, {q}"),
        ("tiered", "part = $1 and kb_id = $2", f"{part[BIG]}, {BIG}, {q}"),
    ):
        n = key.count("$") + 1
        plan, exe = explain_times(
            conn,
            f"select id from {layout} where {key} order by embedding <=> ${n} limit {POOL}",
            args,
        )
        log(
            f"  vector, {layout:<7} big   generic plan        planning {plan:7.2f} ms,"
            f" execution {exe:7.2f} ms"
        )
    ids = [r[0] for r in conn.execute(f"select id from alone order by random() limit {POOL}")]
    for layout in ("shared", "parted", "tiered"):
        for with_kb in (False, True):
            where = f" and c.kb_id = {BIG}" if with_kb else ""
            if with_kb and layout == "tiered":
                where += f" and c.part = {part[BIG]}"
            plan, exe = explain_times(
                conn,
                f"select c.id, c.content from unnest({literal(ids)}) f(id)"
                f" join {layout} c on c.id = f.id{where}",
            )
            log(
                f"  fetch 32 chunks by id, {layout:<7} {'with kb_id' if with_kb else 'id alone  '}"
                f"  planning {plan:7.2f} ms, execution {exe:7.2f} ms"
            )
    # a backend's caches after one statement that opened every partition
    with psycopg.connect(conn.info.dsn, autocommit=True) as fresh:
        memory = "select sum(total_bytes) from pg_backend_memory_contexts"
        before = fresh.execute(memory).fetchone()
        t = time.perf_counter()
        fresh.execute("explain select id from parted where embedding is null")
        first = time.perf_counter() - t
        after = fresh.execute(memory).fetchone()
    assert before is not None and after is not None
    log(
        f"  a new backend's memory contexts {before[0] / 2**20:.1f} MiB; after planning one"
        f" statement over every partition of parted {after[0] / 2**20:.1f} MiB"
        f" (that first plan took {first * 1000:.0f} ms)"
    )


def leaves(table: str) -> str:
    """SQL: the tables holding `table`'s rows (its partitions, or itself)."""
    return (
        f"(select relid from pg_partition_tree('{table}') where isleaf"
        f" union select '{table}'::regclass where not exists"
        f" (select from pg_partition_tree('{table}') where isleaf))"
    )


def layout_sizes(conn: psycopg.Connection[Any]) -> None:
    log("\n== sizes (heap + TOAST + indexes) and catalog")
    for layout in LAYOUTS:
        row = conn.execute(
            "select count(*), pg_size_pretty(sum(pg_total_relation_size(relid))),"
            f" pg_size_pretty(sum(pg_indexes_size(relid))) from {leaves(layout)} l"
        ).fetchone()
        assert row is not None
        log(f"  {layout:<7} {row[0]:>5} table(s)  total {row[1]:>9}  indexes {row[2]:>9}")
    row = conn.execute(
        "select count(*), count(*) filter (where relname like 'parted%%'"
        " or oid in (select reltoastrelid from pg_class where relname like 'parted%%')"
        " or oid in (select i.indexrelid from pg_index i join pg_class t on t.reltoastrelid = i.indrelid"
        "            where t.relname like 'parted%%')),"
        " pg_size_pretty(sum(pg_total_relation_size(oid))"
        "                filter (where relnamespace = 'pg_catalog'::regnamespace))"
        " from pg_class"
    ).fetchone()
    assert row is not None
    log(
        f"  pg_class rows {row[0]:,}, of which parted's (tables, indexes, TOAST) {row[1]:,};"
        f" pg_catalog total {row[2]}"
    )
    for name in (
        "pg_class",
        "pg_attribute",
        "pg_index",
        "pg_depend",
        "pg_constraint",
        "pg_statistic",
        "pg_inherits",
    ):
        r = conn.execute(
            f"select pg_size_pretty(pg_total_relation_size('pg_catalog.{name}')), count(*)"
            f" from pg_catalog.{name}"
        ).fetchone()
        assert r is not None
        log(f"    {name:<14} {r[0]:>9} {r[1]:>8,} rows")


def create_drop_section(
    conn: psycopg.Connection[Any], info: dict[str, Any], args: argparse.Namespace
) -> None:
    """A knowledge base of 500 chunks (the rows of small ones, renumbered) created and dropped,
    committed each time, 5 rounds; the big one dropped in a rolled-back transaction."""
    log(
        f"\n== create / drop a small knowledge base of 500 chunks, 5 rounds (load average {load_average()})"
    )
    offset = conn.execute("select max(id) from src").fetchone()[0]  # type: ignore[index]
    rows = f"select {{kb}}, id + {offset} * {{r}}, content, tsv, embedding from src where kb_id > {MEDIUM} order by id limit 500"
    timings: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        timings.setdefault(name, []).append(seconds * 1000)

    for r in range(1, 6):
        kb = 100000 + r
        for layout in ("shared", "parted", "tiered"):
            t = time.perf_counter()
            with conn.transaction():
                if layout == "parted":
                    conn.execute(
                        f"create table parted_{kb} partition of parted for values in ({kb})"
                    )
                cols = "0, " if layout == "tiered" else ""
                conn.execute(f"insert into {layout} select {cols}" + rows[7:].format(kb=kb, r=r))
            add(f"create {layout}", time.perf_counter() - t)
            t = time.perf_counter()
            with conn.transaction():
                if layout == "parted":
                    conn.execute(f"drop table parted_{kb}")
                else:
                    conn.execute(f"delete from {layout} where kb_id = {kb}")
            add(f"drop {layout}", time.perf_counter() - t)
    for name, ms in timings.items():
        log(f"  {name:<16} median {statistics.median(ms):8.1f} ms  max {max(ms):8.1f} ms")
    for layout, sql in (
        ("shared", f"delete from shared where kb_id = {BIG}"),
        ("parted", f"drop table parted_{BIG}"),
        (
            "tiered",
            f"drop table tiered_{info['part'][str(BIG)]}" if info["part"][str(BIG)] else None,
        ),
    ):
        if sql is None:
            continue
        with conn.transaction(force_rollback=True):
            t = time.perf_counter()
            conn.execute(sql)
            log(
                f"  drop the big one, {layout:<7} ({sql}): {(time.perf_counter() - t) * 1000:8.1f} ms (rolled back)"
            )
    t = time.perf_counter()
    conn.execute("vacuum shared")  # the deleted rows' HNSW entries
    log(f"  shared: VACUUM after the 5 drops above: {(time.perf_counter() - t) * 1000:8.1f} ms")
    t = time.perf_counter()
    with conn.transaction():
        conn.execute(f"insert into shared select {rows[7:].format(kb=200000, r=9)}")
        conn.execute("delete from shared where kb_id = 200000")
    conn.execute("vacuum shared")
    log(
        f"  shared: VACUUM after dropping a 500-chunk one (the HNSW repaired): "
        f"{(time.perf_counter() - t) * 1000:8.1f} ms with its create and delete"
    )
    # does DDL on the partitioned parent wait for a search in another knowledge base?
    small, other = [int(k) for k, p in info["part"].items() if p == 0 and int(k) > MEDIUM][:2]
    hold = threading.Event()
    done = threading.Event()

    def reader() -> None:
        with psycopg.connect(conn.info.dsn) as r:
            r.execute(f"select count(*) from parted where kb_id = {small}")
            hold.set()
            done.wait(30)
            r.rollback()

    conn.execute("create table parted_300001 partition of parted for values in (300001)")
    thread = threading.Thread(target=reader)
    thread.start()
    hold.wait(30)
    for what, sql in (
        (
            "create table ... partition of parted",
            "create table parted_300000 partition of parted for values in (300000)",
        ),
        ("drop table parted_<another>", f"drop table parted_{other}"),
        (
            "alter table parted detach partition <another>",
            f"alter table parted detach partition parted_{other}",
        ),
        (
            "insert into tiered (a new small one)",
            f"insert into tiered select 0, 300000, id + {offset} * 20, content, tsv, embedding from src where kb_id = {small}",
        ),
    ):
        try:
            with conn.transaction(force_rollback=True):
                conn.execute("set local lock_timeout = '300ms'")
                conn.execute(sql)
            log(
                f"  while a transaction has read another knowledge base of parted: {what}: did not wait"
            )
        except psycopg.errors.LockNotAvailable:
            log(
                f"  while a transaction has read another knowledge base of parted: {what}: WAITS (lock_timeout)"
            )
    try:
        conn.execute("set lock_timeout = '300ms'")
        conn.execute("alter table parted detach partition parted_300001 concurrently")
        log("  ... alter table parted detach partition <another> concurrently: did not wait")
    except psycopg.errors.LockNotAvailable:
        log(
            "  ... alter table parted detach partition <another> concurrently: WAITS (lock_timeout)"
        )
    finally:
        conn.execute("reset lock_timeout")
    done.set()
    thread.join()
    for sql in (
        "alter table parted detach partition parted_300001 finalize",
        "drop table parted_300001",
    ):
        try:
            conn.execute(sql)
        except psycopg.Error as exc:
            log(f"  ({sql}: {exc.diag.message_primary})")


DDL = [
    ("add column (nullable)", "alter table {t} add column extra text"),
    ("add column default ''", "alter table {t} add column extra2 text not null default ''"),
    ("create index (b-tree)", "create index on {t} (kb_id, length(content))"),
    ("add check constraint", "alter table {t} add constraint positive_kb check (kb_id > 0)"),
    (
        "create statement trigger",
        "create trigger t_stats after insert on {t} referencing new table as n"
        " for each statement execute function pg_catalog.suppress_redundant_updates_trigger()",
    ),
    ("comment + grant", "grant select on {t} to public"),
]


def promotion(conn: psycopg.Connection[Any]) -> None:
    """tiered: the medium knowledge base moved out of the shared partition into its own (a
    partition, its rows moved by an UPDATE of `part`, its HNSW built), rolled back."""
    log(
        f"\n== tiered: promote the medium knowledge base to a partition of its own, rolled back"
        f" (load average {load_average()})"
    )
    n = conn.execute(f"select count(*) from tiered where part = 0 and kb_id = {MEDIUM}").fetchone()
    if not n or not n[0]:
        log("  (the medium knowledge base already has its own partition)")
        return
    with conn.transaction(force_rollback=True):
        for label, sql in (
            (
                "create table ... partition of tiered",
                f"create table tiered_{MEDIUM} partition of tiered for values in ({MEDIUM})",
            ),
            (
                f"update tiered set part (moves {n[0]:,} rows)",
                f"update tiered set part = {MEDIUM} where part = 0 and kb_id = {MEDIUM}",
            ),
            (
                "its HNSW",
                f"create index on tiered_{MEDIUM} using hnsw (embedding vector_cosine_ops)",
            ),
        ):
            t = time.perf_counter()
            conn.execute(sql)
            log(f"  {label:<40} {(time.perf_counter() - t) * 1000:8.0f} ms")


def statistics_rows(conn: psycopg.Connection[Any]) -> None:
    """BM25 statistics per knowledge base: rows of (kb_id, lexeme) against one shared table."""
    row = conn.execute(
        "select (select count(distinct l) from src, unnest(tsvector_to_array(tsv)) l),"
        " (select sum(n) from (select kb_id, count(distinct l) as n from src,"
        "  unnest(tsvector_to_array(tsv)) l group by kb_id) s)"
    ).fetchone()
    assert row is not None
    log(
        f"  lexeme statistics: {row[0]:,} rows shared by every knowledge base,"
        f" {row[1]:,} rows of (kb_id, lexeme) kept per knowledge base"
    )


def upgrade_section(admin: str) -> None:
    """`kbpg db upgrade` today: base to head on an empty database, then again at head (what an
    upgrade re-applies whatever the rows: under the tiered layout its cost does not grow with
    the number of small knowledge bases, only with the big ones' partitions)."""
    log(f"\n== kbpg db upgrade (kbpg.store.db.upgrade; load average {load_average()})")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("drop database if exists kbpg_head")
        c.execute("create database kbpg_head")
    url = database_url(admin, "kbpg_head")
    for label in ("base -> head, empty database", "at head (sql/ re-applied)"):
        t = time.perf_counter()
        kdb.upgrade(url)
        log(f"  {label:<32} {time.perf_counter() - t:6.1f} s")


def ddl_section(conn: psycopg.Connection[Any]) -> None:
    log(f"\n== DDL an upgrade runs, each rolled back (load average {load_average()})")
    for label, sql in DDL:
        line = f"  {label:<26}"
        for layout in ("shared", "parted", "tiered"):
            try:
                with conn.transaction(force_rollback=True):
                    t = time.perf_counter()
                    conn.execute(sql.format(t=layout))
                    line += f"  {layout} {(time.perf_counter() - t) * 1000:8.1f} ms"
            except psycopg.Error as exc:
                line += f"  {layout} error: {exc.diag.message_primary}"
        log(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", type=int, default=100_000, help="chunks of the big knowledge base")
    parser.add_argument("--medium", type=int, default=10_000, help="chunks of the medium one")
    parser.add_argument(
        "--small", type=int, default=998, help="small knowledge bases (100-1,000 chunks)"
    )
    parser.add_argument("--small-min", type=int, default=100)
    parser.add_argument("--small-max", type=int, default=1000)
    parser.add_argument(
        "--threshold",
        type=int,
        default=20_000,
        help="tiered: chunks past which a knowledge base gets its own partition",
    )
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only",
        help="comma-separated sections to run: search, planning, sizes, statistics, promotion,"
        " create-drop, ddl, upgrade (default: all)",
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep (and reuse) the loaded server"
    )
    args = parser.parse_args()

    log(
        f"bench_knowledge_bases {' '.join(sys.argv[1:])}; load average {load_average()};"
        f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    home = bench_home(args.keep, "kbpg-kbs-")
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        url = database_url(admin, "kbs")
        saved = home / "kbs-info.json"
        info = json.loads(saved.read_text()) if saved.exists() else None
        if info is None:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute("drop database if exists kbs")
                c.execute("create database kbs")
            with psycopg.connect(url) as conn:
                conn.execute("create extension if not exists vector")
                conn.commit()
                register_vector(conn)
                info = generate(conn, args)
                build(conn, info, args)
            if args.keep is not None:
                saved.write_text(json.dumps(info))
        else:
            log(f"reusing the server loaded in {home}")
        total = sum(info["sizes"].values())
        log(
            f"{len(info['sizes']):,} knowledge bases, {total:,} chunks: big {info['sizes'][str(BIG)]:,},"
            f" medium {info['sizes'][str(MEDIUM)]:,}, small {args.small} of"
            f" {min(v for k, v in info['sizes'].items() if int(k) > MEDIUM)}-"
            f"{max(v for k, v in info['sizes'].items() if int(k) > MEDIUM)}"
        )
        log("build (s): " + ", ".join(f"{k} {v:.1f}" for k, v in info["build"].items()))
        with psycopg.connect(url, prepare_threshold=None) as conn:
            register_vector(conn)
            conn.autocommit = True
            conn.execute("create extension if not exists pg_prewarm")
            for layout in LAYOUTS:
                conn.execute(
                    f"select sum(pg_prewarm(c.oid)) from {leaves(layout)} t join pg_class c"
                    " on c.oid = t.relid or c.oid in (select indexrelid from pg_index"
                    " where indrelid = t.relid)"
                )
            conn.execute(SETTINGS)
            sections: dict[str, Callable[[], None]] = {
                "search": lambda: search_section(conn, info, args),
                "planning": lambda: planning_section(conn, info),
                "sizes": lambda: layout_sizes(conn),
                "statistics": lambda: statistics_rows(conn),
                "promotion": lambda: promotion(conn),
                "create-drop": lambda: create_drop_section(conn, info, args),
                "ddl": lambda: ddl_section(conn),
                "upgrade": lambda: upgrade_section(admin),
            }
            chosen = args.only.split(",") if args.only else list(sections)
            for name in chosen:
                sections[name]()
        log(f"\ndone; load average {load_average()}")
    finally:
        server.stop()
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
