"""Benchmark kb.chunks partitioned by tenant against the usual table, in one run (not a test; prints numbers).

The synthetic corpus of bench_search.py (words from NPL's distribution, 384-d clustered vectors,
documents of 10 chunks), each document in one tenant: 12 tenants (--tenants), t00 with 1% of
the chunks, t01 with 25%, t02-t11 with 7.4% each, interleaved over the ids. A document's tenant is both its
group and its category: `category` is the partition key, because it is the one scalar filter
kb.search takes (an equality, so the planner can prune on it); `groups` is text[] and filters
by overlap, which no partitioning prunes.

Database `plain` is loaded as kbpg loads (indexes after the rows, BM25 impact cache refreshed),
with `next` edges between consecutive chunks. Database `parted` starts as a copy of it; its
kb.chunks is then rebuilt as a table PARTITIONED BY LIST (category), one partition per tenant:
primary key (id, category) and unique (document_id, ordinal, category) (PostgreSQL requires
the partition key in both), kb.edges / kb.chunk_links / kb.chunk_entities gain the tenant of
the chunk they reference (foreign keys on (chunk id, tenant), filled by a trigger for writers
that do not know it), the triggers, indexes, policies and grants of kb.chunks re-created on
the parent, the rows inserted through the parent (so the BM25 statistics triggers count them
again from zero), the sql/ functions re-applied, and GIN, HNSW and the impact cache rebuilt as
kbpg builds them. Then, in one run:

  exactness: BM25 statistics and the impact cache of both databases compared; kb.search
    (hybrid, lexical only, graph arm on; no filter, a tenant by category and by groups) and
    kb.search_vector compared query by query (identical ranked ids); the vector arm's
    recall@32 against an exact scan, without and with a tenant filter;
  speed: every variant on both databases query by query, one right after the other, p50/p95
    and the median of the per-query ratio partitioned / plain;
  plans: which partitions each statement inside kb.search read (auto_explain, nested);
  ingest: the real `kbpg ingest`, `kbpg search` and `kbpg stats` on an empty knowledge base
    partitioned first (database `ingest`), with records the partitions cannot take, and
    kb.access_enable with a reader granted one tenant's group;
  writes: insert, text update, cascaded delete and a move between tenants on both databases,
    statistics and lexical results compared after each and after a refresh of the cache;
    rows the partitioned table refuses (no tenant, unknown tenant); a tenant's partition
    detached or dropped, the statistics against a recount (all rolled back).

The schema rebuild is benchmarks/partitioned_chunks.py.

    python benchmarks/bench_partitioning.py                  # 200k chunks, ~10 min on 2 cores
    python benchmarks/bench_partitioning.py --chunks 50000   # quick look
    python benchmarks/bench_partitioning.py --keep /tmp/kbpg-part  # keep the two loaded
        # databases; a later run with the same --keep reuses them (no reload)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
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
    POOL,
    bench_home,
    corpus_arguments,
    database_url,
    exact_neighbours,
    interleaved,
    load,
    log,
    percentile,
    prewarm,
    query_embedding,
    query_texts,
    read_info,
    write_info,
)
from partitioned_chunks import (
    BIG,
    SMALL,
    assigner,
    partition_chunks,
    rows,
    tenant_shares,
)

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

NEXT_EDGES = """
insert into kb.edges (src_chunk_id, dst_chunk_id, relation, weight)
select c.id, n.id, 'next', 0.5 from kb.chunks c
  join kb.chunks n on n.document_id = c.document_id and n.ordinal = c.ordinal + 1
"""


STATS = {
    "kb.corpus_stats": "select chunk_count, total_tokens from kb.corpus_stats",
    "kb.lexeme_stats": "select count(*), sum(doc_freq),"
    " sum(hashtextextended(lexeme || ':' || doc_freq, 0)) from kb.lexeme_stats",
    "recount of kb.chunks": "select count(*), sum(token_count) from kb.chunks",
}
CACHE = {
    "kb.lexical_blocks": "select count(*), sum(hashtextextended(lexeme || ':' || block_no"
    " || ':' || impacts::text || ':' || idf, 0)) from kb.lexical_blocks",
    "kb.lexical_filter_masks": "select count(*), sum(hashtextextended(filter_kind || ':' || value"
    " || ':' || block_no || ':' || kept::text, 0)) from kb.lexical_filter_masks",
    "kb.lexical_filter_blocks": "select count(*), sum(hashtextextended(f.filter_kind || ':'"
    " || f.value || ':' || b.lexeme || ':' || b.block_no || ':' || b.impacts::text || ':' || b.idf,"
    " 0)) from kb.lexical_filter_blocks b join kb.lexical_filter_caches f using (cache_id)",
    "kb.lexical_filter_slots": "select count(*), sum(hashtextextended(f.filter_kind || ':'"
    " || f.value || ':' || s.slot || ':' || s.chunk_id, 0)) from kb.lexical_filter_slots s"
    " join kb.lexical_filter_caches f using (cache_id)",
    "kb.lexical_state": "select watermark, avgdl, filter_masks, filter_caches from kb.lexical_state",
}


def compare(
    plain: psycopg.Connection[Any], parted: psycopg.Connection[Any], checks: dict[str, str]
) -> bool:
    """Run each check on both databases; log what differs. True when all agree."""
    same = True
    for name, sql in checks.items():
        a, b = rows(plain, sql), rows(parted, sql)
        if a != b:
            same = False
            log(f"  DIFFERENT {name}: plain {a} partitioned {b}")
    return same


def plan_summary(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[str]:
    """The plans (auto_explain, nested statements, executed) of one call, summarised: per
    statement that read kb.chunks, its first words and the partitions it read."""
    notices: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        with conn.transaction():
            conn.execute("load 'auto_explain'")
            for name, value in (
                ("log_min_duration", "0"),
                ("log_nested_statements", "on"),
                ("log_analyze", "on"),
                ("log_timing", "off"),
                ("log_level", "notice"),
            ):
                conn.execute(f"set local auto_explain.{name} = {value}")
            conn.execute(sql, params).fetchall()
    finally:
        conn.remove_notice_handler(keep)
    out = []
    for plan in notices:
        scans: dict[str, set[str]] = {}
        never = set()
        for line in plan.splitlines():
            found = re.search(r"(\w+(?: \w+)*? Scan)(?: using \w+)? on (chunks_t\d\d)\b", line)
            if found and "never executed" in line:
                never.add(found.group(2))
            elif found:
                scans.setdefault(found.group(1).strip(), set()).add(found.group(2))
        if not scans and not never:
            continue
        text = re.search(r"Query Text: (.*)", plan)
        took = re.search(r"duration: ([\d.]+) ms", plan)
        head = " ".join((text.group(1) if text else "?").split())[:60]
        joins = sorted(set(re.findall(r"(Merge Append|Append|Hash Join|Nested Loop)", plan)))
        read = ", ".join(f"{kind} {len(parts)}" for kind, parts in sorted(scans.items()))
        out.append(
            f"{float(took.group(1)) if took else 0:6.1f} ms  {read}"
            + (f", {len(never)} never executed" if never else "")
            + (" (pruned: Subplans Removed)" if "Subplans Removed" in plan else "")
            + f" [{', '.join(joins)}]: {head}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser)
    parser.add_argument(
        "--tenants",
        type=int,
        default=12,
        help="tenants (partitions): t00 1%%, t01 25%%, the others equal shares of the rest",
    )
    args = parser.parse_args()
    tenant_shares(args.tenants)  # checked before anything is loaded

    home = bench_home(args.keep, "kbpg-part-")
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()

        def url(database: str) -> str:
            return database_url(admin, database)

        info = read_info(home, args)
        if info is not None and info.get("tenants", 12) != args.tenants:
            raise SystemExit(f"{home} holds {info.get('tenants', 12)} tenants")
        if info is None:
            info = load_both(admin, url, args)
            info["tenants"] = args.tenants
            write_info(home, info, args)
        else:  # a kept server: today's sql/ functions in both databases
            kdb.upgrade(url("plain"))
            kdb.upgrade(url("parted"))
        with (
            psycopg.connect(url("plain"), prepare_threshold=None, autocommit=True) as plain,
            psycopg.connect(url("parted"), prepare_threshold=None, autocommit=True) as parted,
        ):
            register_vector(plain)
            register_vector(parted)
            run(plain, parted, info, args)
            ingest_check(admin, url("ingest"), home)
            # rolled back: a kept server's databases stay as loaded
            with plain.transaction(force_rollback=True), parted.transaction(force_rollback=True):
                writes(plain, parted, info)
    finally:
        server.stop()
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)


def load_both(admin: str, url: Callable[[str], str], args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("drop database if exists plain")
        c.execute("drop database if exists parted")
        c.execute("create database plain")
    kdb.upgrade(url("plain"))
    with psycopg.connect(url("plain"), prepare_threshold=None) as conn:
        register_vector(conn)
        log(f"loading {args.chunks:,} chunks into database plain ...")
        info = load(
            conn, url("plain"), args.chunks, args.seed, assign=assigner(tenant_shares(args.tenants))
        )
        conn.execute(NEXT_EDGES)
    log(
        f"plain: load {info['load_s']:.0f} s, GIN {info['gin_s']:.0f} s,"
        f" HNSW {info['hnsw_s']:.0f} s, BM25 impact cache {info['lexical_cache_s']:.0f} s;"
        f" sizes {info['sizes']}"
    )
    t = time.perf_counter()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("create database parted template plain strategy file_copy")
    log(f"parted: copied from plain in {time.perf_counter() - t:.0f} s; partitioning kb.chunks")
    with psycopg.connect(url("parted"), prepare_threshold=None) as conn:
        register_vector(conn)
        timings = partition_chunks(conn, url("parted"), list(tenant_shares(args.tenants)))
    for line in timings.pop("dropped"):
        log(f"  {line}")
    log(
        f"parted: rows in through the parent {timings['insert_s']:.0f} s, filter indexes"
        f" {timings['filter_indexes_s']:.0f} s, GIN {timings['gin_s']:.0f} s,"
        f" HNSW {timings['hnsw_s']:.0f} s, BM25 impact cache {timings['lexical_cache_s']:.0f} s;"
        f" sizes {timings['sizes']}"
    )
    info["parted"] = timings
    return info


def run(
    plain: psycopg.Connection[Any],
    parted: psycopg.Connection[Any],
    info: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    sizes = rows(
        parted,
        "select p.relid::text, count(*) from pg_partition_tree('kb.chunks') p"
        " join kb.chunks c on c.tableoid = p.relid group by 1 order by 1",
    )
    log("partitions: " + ", ".join(f"{name.split('_')[-1]} {n:,}" for name, n in sizes))
    log("exactness of what the triggers and the refresh keep (plain vs partitioned):")
    log(f"  BM25 statistics identical: {compare(plain, parted, STATS)}")
    log(f"  BM25 impact cache identical: {compare(plain, parted, CACHE)}")
    for conn in (plain, parted):
        prewarm(conn)
    uptime = Path("/proc/loadavg").read_text().split()[:3]
    log(f"load average {' '.join(uptime)}")

    rng = random.Random(args.seed + 1)
    nrng = np.random.default_rng(args.seed + 1)
    query_sets = query_texts(info, rng, args.queries)
    centroids: np.ndarray = info["centroids"]
    # warm both with other queries first
    warm = np.random.default_rng(args.seed + 2)
    for text in info["npl_queries"][: args.queries]:
        emb = query_embedding(centroids, warm)
        for conn in (plain, parted):
            conn.execute("select * from kb.search(%s, %s)", (text, emb)).fetchall()

    def search(extra: str = "", text: bool = True, emb: bool = True) -> Callable[..., Any]:
        args_sql = ", ".join(
            [*(["%s"] if text else ["null"]), *(["%s"] if emb else []), "match_count => 8"]
        )
        sql = f"select chunk_id from kb.search({args_sql}{extra})"

        def call(conn: psycopg.Connection[Any], item: tuple[str, np.ndarray]) -> list[Any]:
            params = [*([item[0]] if text else []), *([item[1]] if emb else [])]
            return conn.execute(sql, params).fetchall()

        return call

    def vector_arm(category: str | None) -> Callable[..., Any]:
        def call(conn: psycopg.Connection[Any], item: tuple[str, np.ndarray]) -> list[Any]:
            return conn.execute(
                "select chunk_id from kb.search_vector(%s, %s, category => %s)",
                (item[1], POOL, category),
            ).fetchall()

        return call

    def lexical_arm(conn: psycopg.Connection[Any], item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(
            "select chunk_id from kb.search_lexical(%s, %s)", (item[0], POOL)
        ).fetchall()

    variants: list[tuple[str, Callable[..., Any]]] = [
        ("kb.search hybrid, no filter", search()),
        (f"kb.search hybrid, 1% tenant (category {SMALL})", search(f", category => '{SMALL}'")),
        (f"kb.search hybrid, 25% tenant (category {BIG})", search(f", category => '{BIG}'")),
        (f"kb.search hybrid, 1% tenant (groups {SMALL})", search(f", groups => '{{{SMALL}}}'")),
        ("kb.search lexical only, no filter", search(emb=False)),
        (
            f"kb.search lexical only, 1% tenant ({SMALL})",
            search(f", category => '{SMALL}'", emb=False),
        ),
        ("kb.search hybrid + graph arm", search(", use_graph => true")),
        ("kb.search_lexical (pool 32), no filter", lexical_arm),
        ("kb.search_vector (pool 32), no filter", vector_arm(None)),
        (f"kb.search_vector (pool 32), 25% tenant ({BIG})", vector_arm(BIG)),
    ]
    log(f"\n{'':52} {'plain':>8} {'':>8} {'partitioned':>11}")
    log(f"{'':52} {'p50 ms':>8} {'p95 ms':>8} {'p50 ms':>8} {'p95 ms':>8}  parted/plain  identical")
    for set_name, texts in query_sets.items():
        items = [(t, query_embedding(centroids, nrng)) for t in texts]
        log(f"-- {set_name} ({len(items)} queries), {args.chunks:,} chunks")
        vector_results: dict[str, tuple[list[Any], list[Any]]] = {}
        for name, fn in variants:
            (a_times, a_out), (b_times, b_out) = interleaved(
                [lambda item, fn=fn: fn(plain, item), lambda item, fn=fn: fn(parted, item)], items
            )
            same = sum(a == b for a, b in zip(a_out, b_out, strict=True))
            ratio = statistics.median(b / a for a, b in zip(a_times, b_times, strict=True))
            log(
                f"{name:52} {statistics.median(a_times):8.1f} {percentile(a_times, 0.95):8.1f}"
                f" {statistics.median(b_times):8.1f} {percentile(b_times, 0.95):8.1f}"
                f"  {ratio:12.2f}  {same}/{len(items)}"
            )
            if name.startswith("kb.search_vector"):
                vector_results[name] = (a_out, b_out)
        # last: the exact scans read whole tables and would evict what the timings rely on
        for name, results in vector_results.items():
            category = BIG if BIG in name else None
            truths = [exact_neighbours(plain, emb, category) for _, emb in items]
            recall = [
                statistics.mean(
                    len({r[0] for r in got} & truth) / max(1, len(truth))
                    for got, truth in zip(out, truths, strict=True)
                )
                for out in results
            ]
            log(
                f"{name}: recall@{POOL} against an exact scan: plain {recall[0]:.3f},"
                f" partitioned {recall[1]:.3f}"
            )
    uptime = Path("/proc/loadavg").read_text().split()[:3]
    log(f"load average {' '.join(uptime)}")

    item = (query_sets["NPL questions"][0], query_embedding(centroids, nrng))
    log(
        "\nplans in the partitioned database (auto_explain, statements inside kb.search that read"
        " kb.chunks: time with instrumentation, scans by kind and how many partitions each read):"
    )
    for label, extra in (
        ("no filter", ""),
        (f"category => '{SMALL}'", f", category => '{SMALL}'"),
        (f"groups => '{{{SMALL}}}'", f", groups => '{{{SMALL}}}'"),
    ):
        log(f"-- kb.search hybrid, {label}")
        for line in plan_summary(
            parted, f"select * from kb.search(%s, %s, match_count => 8{extra})", item
        ):
            log(f"  {line}")


def writes(
    plain: psycopg.Connection[Any], parted: psycopg.Connection[Any], info: dict[str, Any]
) -> None:
    """The same writes on both databases (in the caller's transactions); statistics and lexical
    results compared after each."""
    log("\nwrites through the parent (the same on both databases):")
    texts = info["npl_queries"][:20]

    def lexical_same() -> str:
        same = 0
        for text in texts:
            sql = "select chunk_id from kb.search(%s, match_count => 8)"
            same += rows(plain, sql, (text,)) == rows(parted, sql, (text,))
        return f"{same}/{len(texts)}"

    steps = [
        (
            f"insert a document of 3 chunks into {SMALL}",
            [
                "insert into kb.documents (source, title, category, groups, content_hash)"
                f" values ('new-doc', 'New', '{SMALL}', '{{{SMALL}}}', 'h')",
                "insert into kb.chunks (document_id, ordinal, content, groups, category)"
                " select d.id, g, 'reactor neutron flux measurement ' || g, d.groups, d.category"
                " from kb.documents d, generate_series(0, 2) g where d.source = 'new-doc'",
            ],
        ),
        (
            "update the text of 10 chunks",
            ["update kb.chunks set content = content || ' plasma' where id % 20000 = 7"],
        ),
        (
            "delete 2 documents (chunks and edges cascade)",
            ["delete from kb.documents where source in ('doc-3', 'doc-1000')"],
        ),
        (
            f"move a document to another tenant (category {SMALL} -> t02: row movement)",
            [
                "update kb.documents set category = 't02', groups = '{t02}'"
                " where id = (select min(document_id) from kb.chunks"
                f" where category = '{SMALL}')",
                "update kb.chunks c set category = d.category, groups = d.groups"
                " from kb.documents d where d.id = c.document_id and c.category <> d.category",
            ],
        ),
    ]
    for name, statements in steps:
        outcome = []
        for conn in (plain, parted):
            try:
                with conn.transaction():
                    for sql in statements:
                        conn.execute(sql)
                outcome.append("ok")
            except psycopg.Error as exc:
                outcome.append(f"{exc.sqlstate} {exc.diag.message_primary}")
        log(f"  {name}: plain {outcome[0]}, partitioned {outcome[1]}")
        log(f"    BM25 statistics identical: {compare(plain, parted, STATS)}")
    edges = "select count(*), sum(hashtextextended(src_chunk_id || ':' || dst_chunk_id, 0)) from kb.edges"
    log(f"  edges identical after the cascades: {compare(plain, parted, {'kb.edges': edges})}")
    log(f"  lexical-only kb.search identical with the cache stale: {lexical_same()}")
    for conn in (plain, parted):
        conn.execute("select kb.refresh_lexical_index()")
    log(f"  after kb.refresh_lexical_index(): cache identical {compare(plain, parted, CACHE)},")
    log(f"    lexical-only kb.search identical: {lexical_same()}")
    log("rows the partitioned table refuses (the plain one takes them):")
    for name, sql in (
        (
            "a chunk without a category",
            "insert into kb.chunks (document_id, ordinal, content) select id, 90, 'x'"
            " from kb.documents where source = 'new-doc'",
        ),
        (
            "a chunk of a tenant without a partition",
            "insert into kb.chunks (document_id, ordinal, content, category) select id, 91, 'x',"
            " 't99' from kb.documents where source = 'new-doc'",
        ),
    ):
        outcome = []
        for conn in (plain, parted):
            try:
                with conn.transaction():
                    conn.execute(sql)
                    outcome.append("accepted")
                    raise psycopg.Rollback  # keep both databases alike
            except psycopg.Error as exc:
                outcome.append(f"SQLSTATE {exc.sqlstate}: {exc.diag.message_primary}")
        log(f"  {name}: plain {outcome[0]}; partitioned {outcome[1]}")
    log("removing a tenant's partition (partitioned database only; statistics against a recount):")
    recount = "select (select chunk_count from kb.corpus_stats), (select count(*) from kb.chunks)"
    for name, statements in (
        ("detach", [f"alter table kb_data.chunks detach partition kb_data.chunks_{BIG}"]),
        (
            "delete its edges, then detach",
            [
                f"delete from kb.edges where src_category = '{BIG}' or dst_category = '{BIG}'",
                f"alter table kb_data.chunks detach partition kb_data.chunks_{BIG}",
            ],
        ),
        (
            "delete its edges, then drop",
            [
                f"delete from kb.edges where src_category = '{BIG}' or dst_category = '{BIG}'",
                f"drop table kb.chunks_{BIG}",
            ],
        ),
    ):
        try:
            with parted.transaction():
                for sql in statements:
                    parted.execute(sql)
                counted, present = rows(parted, recount)[0]
                result = (
                    f"ok; kb.corpus_stats counts {counted:,} chunks, kb.chunks holds {present:,}"
                )
                raise psycopg.Rollback
        except psycopg.Error as exc:
            result = f"SQLSTATE {exc.sqlstate}: {exc.diag.message_primary}"
        log(f"  {name} kb.chunks_{BIG}: {result}")


def ingest_check(admin: str, url: str, home: Path) -> None:
    """The real `kbpg ingest` (records with their own embeddings: no model) and `kbpg search`
    on an empty knowledge base whose kb.chunks was partitioned first."""
    log("\nkbpg ingest and search on a partitioned kb.chunks (empty knowledge base, real CLI):")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("drop database if exists ingest")
        c.execute("create database ingest")
    kdb.upgrade(url)
    with psycopg.connect(url) as conn:
        partition_chunks(conn, url, list(tenant_shares(12)), build=False)
    nrng = np.random.default_rng(7)
    files = {
        # tenants as categories; a shared rare code (an entity edge) and a link between records
        "tenants.jsonl": [{"category": f"t0{d % 3}", "groups": [f"t0{d % 3}"]} for d in range(60)],
        "no-category.jsonl": [{"groups": ["t00"]}],
        "new-tenant.jsonl": [{"category": "t99", "groups": ["t99"]}],
    }
    kbpg = str(Path(sys.executable).parent / "kbpg")
    env = dict(os.environ, KBPG_DATABASE_URL=url)
    for name, records in files.items():
        path = home / name
        with path.open("w") as f:
            for d, record in enumerate(records):
                vector = nrng.normal(size=DIM)
                text = f"Reactor XK-{d // 2} neutron flux measurement number {d} of {name}"
                record = {"id": f"{name}-{d}", "title": f"Record {d}", "text": text, **record}
                record["embedding"] = (vector / np.linalg.norm(vector)).round(6).tolist()
                f.write(json.dumps(record) + "\n")
        done = subprocess.run(
            [kbpg, "ingest", str(path), "--json"], env=env, capture_output=True, text=True
        )
        lines = done.stderr.strip().splitlines() or [""]
        log(f"  kbpg ingest {name} ({len(records)} records): exit {done.returncode}; {lines[-1]}")
        for line in lines[:-1][:2]:
            log(f"    {line[:200]}")
    with psycopg.connect(url) as conn:
        counts = rows(
            conn,
            "select (select count(*) from kb.chunks), (select count(*) from kb.edges),"
            " (select count(*) from kb.chunk_entities), (select count(*) from kb.lexical_blocks),"
            " to_regclass('kb_data.chunks_embedding_hnsw') is not null,"
            " (select chunk_count from kb.corpus_stats)",
        )[0]
    log(
        f"  chunks {counts[0]}, edges {counts[1]}, chunk entities {counts[2]}, impact cache rows"
        f" {counts[3]}, HNSW index present {counts[4]}, kb.corpus_stats chunk_count {counts[5]}"
    )
    access_check(url)
    for command in (["search", "reactor neutron flux", "--json", "--category", "t01"], ["stats"]):
        done = subprocess.run([kbpg, *command], env=env, capture_output=True, text=True)
        out = done.stdout if done.returncode == 0 else done.stderr
        hits = len(json.loads(out)) if "--json" in command and done.returncode == 0 else None
        summary = f"{hits} hits" if hits is not None else " ".join(out.split())[:300]
        log(f"  kbpg {command[0]}: exit {done.returncode}; {summary}")


def access_check(url: str) -> None:
    """kb.access_enable (row-level security on the partitioned parent) and a reader granted one
    tenant's group: what kb.search returns to it."""
    reader = "kbpg_bench_partition_reader"
    search = (
        "select c.category, count(*) from kb.search('reactor neutron flux', match_count => 60) s"
        " join kb.chunks c on c.id = s.chunk_id group by 1 order by 1"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"drop role if exists {reader}")
        conn.execute(f"create role {reader} in role kbpg_reader")
        conn.execute("select kb.grant_groups(%s, array['t01'])", (reader,))
        try:
            (enabled,) = rows(conn, "select kb.access_enable()")[0]
            (split,) = rows(conn, "select split_by_groups from kb.lexical_state")[0]
            owner = rows(conn, search)
            with conn.transaction():
                conn.execute(f"set local role {reader}")
                seen = rows(conn, search)
            log(
                f"  access control: kb.access_enable() {enabled}, impact cache split by groups"
                f" {split}; kb.search (lexical) returns the owner {owner}, a reader granted"
                f" t01 {seen}"
            )
        except psycopg.Error as exc:
            log(f"  access control: SQLSTATE {exc.sqlstate}: {exc.diag.message_primary}")
        finally:
            conn.execute("select kb.access_disable()")
            conn.execute("select kb.revoke_groups(%s)", (reader,))
            conn.execute(f"drop role {reader}")


if __name__ == "__main__":
    main()
