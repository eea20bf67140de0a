"""Many knowledge bases beside a big one (issue 39's scale gate; not a test, prints numbers).

Takes a corpus kept by bench_search.py --keep (its `bench` database: the big knowledge base,
`default`) and fills it with MANY small knowledge bases of 100-250 chunks (log-uniform), each a
sample of the big one's chunks (their text and vectors: realistic lexemes and neighbours), each
with its own embedding space (no HNSW of its own below 2,000 chunks). It prints

- the first creation (default's HNSW built again limited to its rows, once),
- the time to create, fill (chunks, statistics, impact cache) and drop a small knowledge base,
  p50 / p95 / max over the last ones made, and to create-and-drop an empty one,
- searches in SEARCHED of the small knowledge bases (hybrid, BM25 only, vector only; a query
  made of a few words of one of its chunks, with that chunk's vector): p50 / p95 / max,
- `kbpg db upgrade`'s time with MANY + 1 knowledge bases (sql/ applied again),
- the growth of schema kb_data (relations, bytes).

The search gate (a search in the big one within 1.2x of the same corpus alone) is
bench_schema_pair.py on two copies of the corpus, one filled here:

    cp -a /tmp/kb200k /tmp/kb200k-crowded                       # the server stopped
    python benchmarks/bench_knowledge_bases_scale.py --corpus /tmp/kb200k-crowded --many 999
    python benchmarks/bench_schema_pair.py --chunks 200000 --base /tmp/kb200k \\
        --changed /tmp/kb200k-crowded --repeat 3
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from pgvector.psycopg import register_vector

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_schema_pair import own_sockets  # noqa: E402
from bench_search import database_url, load_average, log, percentile  # noqa: E402

from kbpg.store import db as kdb  # noqa: E402
from kbpg.store.embedded import EmbeddedServer  # noqa: E402

# a small knowledge base: documents of a few chunks each, sampled from the big one's rows
FILL = """
with picked as (
    select c.content, c.section, c.embedding, (row_number() over ()) - 1 as n
      from kb_data.chunks c tablesample system_rows (%(chunks)s)
     where c.kb_id = 1 and c.embedding is not null
), docs as (
    insert into kb_data.documents (source, title, content_hash)
    select 'doc-' || d, 'Document ' || d, md5(d::text) from generate_series(0, %(docs)s - 1) d
    returning id, source
)
insert into kb_data.chunks (document_id, ordinal, section, content, embedding)
select d.id, p.n / %(docs)s, p.section, p.content, p.embedding
  from picked p join docs d on d.source = 'doc-' || (p.n %% %(docs)s)
"""
CATALOG = (
    "select count(*), sum(pg_total_relation_size(c.oid))::bigint from pg_class c"
    " join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'kb_data'"
)


def seconds(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> float:
    started = time.perf_counter()
    conn.execute(sql, params)
    return time.perf_counter() - started


def make_small(
    conn: psycopg.Connection[Any], name: str, chunks: int, dimension: int
) -> dict[str, float]:
    """Create and fill one knowledge base in three transactions: create, fill, refresh."""
    timings = {}
    with conn.transaction():
        timings["create"] = seconds(conn, "select kb.create_knowledge_base(%s)", (name,))
    started = time.perf_counter()
    with conn.transaction():
        conn.execute(
            "select set_config('kbpg.kb_id', kb.knowledge_base_id(%s)::text, true)", (name,)
        )
        conn.execute("select kb.set_embedding_space('bench-model', %s)", (dimension,))
        conn.execute(FILL, {"chunks": chunks, "docs": max(1, chunks // 4)})
    timings["fill"] = time.perf_counter() - started
    with conn.transaction():
        conn.execute(
            "select set_config('kbpg.kb_id', kb.knowledge_base_id(%s)::text, true)", (name,)
        )
        timings["refresh"] = seconds(conn, "select * from kb.refresh_lexical_index()")
    return timings


SMALL_SEARCHES = [
    ("kb.search hybrid", "select chunk_id from kb.search(%(q)s, %(e)s, 8)"),
    ("kb.search lexical only", "select chunk_id from kb.search(%(q)s, null, 8)"),
    ("kb.search_vector", "select chunk_id from kb.search_vector(%(e)s, 8)"),
]


def small_searches(conn: psycopg.Connection[Any], searched: int, rng: random.Random) -> None:
    """Each search in `searched` small knowledge bases: a query of four words of one of its
    chunks and that chunk's vector, warmed once, timed as the best of 3."""
    names = [
        name
        for (name,) in conn.execute(
            "select name from kb_data.knowledge_bases where name like 'small-%' order by id"
        ).fetchall()
    ]
    picked = rng.sample(names, min(searched, len(names)))
    register_vector(conn)
    timings: dict[str, list[float]] = {label: [] for label, _ in SMALL_SEARCHES}
    for name in picked:
        conn.execute(
            "select set_config('kbpg.kb_id', kb.knowledge_base_id(%s)::text, false)", (name,)
        )
        row = conn.execute(
            "select c.content, c.embedding from kb.chunks c order by c.id limit 1"
        ).fetchone()
        assert row is not None, name
        query = " ".join(str(row[0]).split()[:4])
        for label, sql in SMALL_SEARCHES:
            params = {"q": query, "e": row[1]}
            conn.execute(sql, params).fetchall()
            timings[label].append(min(seconds(conn, sql, params) for _ in range(3)))
    conn.execute("select set_config('kbpg.kb_id', '1', false)")
    log(f"searches in {len(picked)} small knowledge bases (load {load_average()}):")
    for label, values in timings.items():
        summary(f"  {label}", values)


def summary(label: str, values: list[float]) -> None:
    log(
        f"{label:<34} p50 {percentile(values, 0.5) * 1000:8.1f} ms   p95 "
        f"{percentile(values, 0.95) * 1000:8.1f} ms   max {max(values) * 1000:8.1f} ms   (n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a kept corpus, filled here")
    parser.add_argument("--many", type=int, default=999, help="small knowledge bases to make")
    parser.add_argument("--small-min", type=int, default=100)
    parser.add_argument("--small-max", type=int, default=250)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument(
        "--searched", type=int, default=40, help="small knowledge bases to search in"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    own_sockets(args.corpus)
    server = EmbeddedServer(args.corpus, durable=False)
    url = database_url(server.start(), "bench")
    try:
        kdb.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("create extension if not exists tsm_system_rows")
            (dimension,) = conn.execute(
                "select dimension from kb_data.embedding_space where kb_id = 1"
            ).fetchone() or (0,)
            for (name,) in conn.execute(  # an interrupted run's probes
                "select name from kb_data.knowledge_bases where name like 'probe-%'"
            ).fetchall():
                conn.execute("select kb.drop_knowledge_base(%s)", (name,))
            (existing,) = conn.execute(
                "select count(*) - 1 from kb_data.knowledge_bases"
            ).fetchone() or (0,)
            catalog_before = conn.execute(CATALOG).fetchone()
            log(f"{args.corpus}: {existing} knowledge bases besides default; load {load_average()}")
            made: list[dict[str, float]] = []
            started = time.perf_counter()
            for i in range(existing, args.many):
                size = round(
                    math.exp(rng.uniform(math.log(args.small_min), math.log(args.small_max)))
                )
                timings = make_small(conn, f"small-{i:04d}", size, dimension)
                if i == 0:
                    log(
                        f"first knowledge base beside default: created in {timings['create']:.1f} s "
                        "(default's HNSW built again, limited to its rows)"
                    )
                else:
                    made.append(timings)
                if (i + 1) % 100 == 0:
                    log(
                        f"  {i + 1} made, {time.perf_counter() - started:.0f} s; load {load_average()}"
                    )
            if made:
                last = made[-200:]
                summary("create (small)", [t["create"] for t in last])
                summary("fill (chunks, index, statistics)", [t["fill"] for t in last])
                summary("refresh (impact cache)", [t["refresh"] for t in last])
            # create and drop while MANY exist: an empty one, and a filled one
            empty, filled = [], []
            for i in range(10):
                empty.append(
                    seconds(conn, "select kb.create_knowledge_base(%s)", (f"probe-{i}",))
                    + seconds(conn, "select kb.drop_knowledge_base(%s)", (f"probe-{i}",))
                )
                make_small(conn, f"probe-filled-{i}", 200, dimension)
                filled.append(
                    seconds(conn, "select kb.drop_knowledge_base(%s)", (f"probe-filled-{i}",))
                )
            summary("create + drop (empty)", empty)
            summary("drop (200 chunks)", filled)
            small_searches(conn, args.searched, rng)
            catalog_after = conn.execute(CATALOG).fetchone()
            assert catalog_before is not None and catalog_after is not None
            log(
                f"kb_data relations {catalog_before[0]} -> {catalog_after[0]}, "
                f"{catalog_before[1] / 2**20:.0f} -> {catalog_after[1] / 2**20:.0f} MiB"
            )
            (count,) = conn.execute("select count(*) from kb_data.knowledge_bases").fetchone() or (
                0,
            )
        upgraded = time.perf_counter()
        kdb.upgrade(url)
        log(f"kbpg db upgrade with {count} knowledge bases: {time.perf_counter() - upgraded:.1f} s")
        log(f"load {load_average()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
