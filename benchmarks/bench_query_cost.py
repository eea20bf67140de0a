"""What one query may cost (issue 14): long queries and deep graph walks, 0.1.0 vs now.

A throwaway embedded PostgreSQL (temp dir) at head, a small corpus, then per run (wall clock,
one call each, the median of --repeat):

  * query parsing (kb._query_terms) for 500 / 2,000 / 7,300 distinct words (7,300 ~ 64 KB;
    up to 3,000 of them in the corpus), against 0.1.0's function;
  * kb.search_lexical and kb.search (text only) on those queries;
  * kb.expand_graph on a 70-chunk clique at depths 1-5, against 0.1.0's every-path walk
    (depths 1-3 only by default: depth 4 took 10 s; --old-depth 4 to see it).

    python benchmarks/bench_query_cost.py [--repeat 3] [--old-depth 3]

`--dense N` measures the bound on every parameter that multiplies work at the documented
maximums, on bench_search.py's corpus of N chunks (384-d vectors in an HNSW index, the BM25
cache) with a dense graph of 64 edges a chunk (32 out, 32 in): the graph walk from 1,000 seeds
at depth 5 with min_score 0, kb.search as the audit's HTTP request (graph, depth 5, top 1,000,
fetch_multiplier 100), 8 extra embeddings, and the calls over the bound (KB003), as the owner
and as a reader under access control; `--before REV` runs the same calls on REV's functions.

    python benchmarks/bench_query_cost.py --dense 1000000 --before main --shared-buffers 6GB
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import (
    database_url,
    install_before,
    prewarm,
    query_embedding,
    restart_for_shared_buffers,
)
from bench_search import load as load_corpus

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

# 0.1.0's kb.query_terms, created in pg_temp (its helper renamed kb._tsquery_lexemes since)
OLD_QUERY_TERMS = """
create function pg_temp.query_terms_0_1_0(query_text text, out terms text[], out excluded text[])
language sql immutable parallel safe security invoker
set search_path = pg_catalog, kb, public
begin atomic
    with q as (
        select pg_catalog.websearch_to_tsquery('english'::pg_catalog.regconfig,
                                               coalesce(query_text, '')) as full_query
    ), e as (
        select q.full_query, kb._tsquery_lexemes(q.full_query::text) as every from q
    ), t as (
        select case when pg_catalog.strpos(e.full_query::text, '!') = 0 then e.every
                    else kb._tsquery_lexemes(pg_catalog.querytree(e.full_query)) end as positive,
               e.every
          from e
    )
    select t.positive,
           coalesce(array(select l from pg_catalog.unnest(t.every) as l
                           where l <> all (t.positive) order by l), '{}')
      from t;
end
"""

V0_1_0_SQL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "v0_1_0" / "sql"


OLD_WALK = "select * from pg_temp.expand_graph(%s::bigint[], %s, 3, 0.5)"


def create_0_1_0_walk(conn: psycopg.Connection[Any]) -> None:
    """0.1.0's kb.expand_graph (it followed every simple path) as pg_temp.expand_graph."""
    text = (V0_1_0_SQL / "050-expand-graph.sql").read_text()
    text = text.replace("kb.expand_graph(", "pg_temp.expand_graph(")
    conn.execute(text.replace("kb.chunk_matches_filters(", "kb._chunk_matches_filters("))


def words(n: int, rng: random.Random) -> str:
    letters = "bcdfghjklmnpqrstvwxz"
    found: set[str] = set()
    while len(found) < n:
        found.add("q" + "".join(rng.choice(letters) for _ in range(7)))
    return " ".join(sorted(found))


def timed_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def load(conn: psycopg.Connection[Any], rng: random.Random) -> tuple[list[str], list[int]]:
    """2,000 chunks of 3,000 made-up words and a 70-chunk clique: the words, the clique's ids."""
    doc = conn.execute(
        "insert into kb.documents (source, content_hash) values ('bench', 'h') returning id"
    ).fetchone()[0]
    vocabulary = words(3000, rng).split()
    with (
        conn.cursor() as cur,
        cur.copy("copy kb_data.chunks (document_id, ordinal, content) from stdin") as copy,
    ):
        for i in range(2000):
            copy.write_row((doc, i, " ".join(rng.choices(vocabulary, k=60))))
    clique = [
        r[0]
        for r in conn.execute(
            "insert into kb.chunks (document_id, ordinal, content)"
            " select %s, 10000 + g, 'member ' || g from generate_series(0, 69) g returning id",
            (doc,),
        )
    ]
    with (
        conn.cursor() as cur,
        cur.copy(
            "copy kb_data.edges (src_chunk_id, dst_chunk_id, relation, weight) from stdin"
        ) as copy,
    ):
        for i, src in enumerate(clique):
            for dst in clique[i + 1 :]:
                copy.write_row((src, dst, "link", rng.uniform(0.55, 1.0)))
    conn.execute("select kb.refresh_lexical_index()")
    conn.commit()
    return vocabulary, clique


EDGES_OUT = 32  # per chunk; as many come in: 64 edges a chunk


def add_dense_graph(conn: psycopg.Connection[Any]) -> int:
    """32 edges out of every chunk to chunks at 32 fixed pseudo-random offsets (so 32 in too),
    weights in [0.5, 1); the edge indexes are built after the rows, then the table is vacuumed.
    Returns the edge count."""
    count = conn.execute("select count(*) from kb.chunks").fetchone()
    assert count is not None and count[0] > EDGES_OUT
    offsets = random.Random(7).sample(range(1, int(count[0])), EDGES_OUT)  # distinct mod n
    started = time.perf_counter()
    # the other indexes (revision 0016's weight-ordered ones, or edges_dst before it) as they are
    indexes = [
        r[0]
        for r in conn.execute(
            "select indexdef from pg_indexes"
            " where schemaname = 'kb' and tablename = 'edges' and indexname <> 'edges_pkey'"
        )
    ]
    conn.execute("alter table kb_data.edges drop constraint edges_pkey")
    for (name,) in conn.execute(
        "select indexname from pg_indexes"
        " where schemaname = 'kb' and tablename = 'edges' and indexname <> 'edges_pkey'"
    ).fetchall():
        conn.execute(f"drop index kb_data.{name}")
    conn.execute(
        "insert into kb.edges (src_chunk_id, dst_chunk_id, relation, weight)"
        " select c.id, b.first + (c.id - b.first + o.off) %% b.n, 'link', 0.5 + random() / 2"
        "   from kb.chunks c,"
        "        (select min(id) as first, count(*) as n from kb.chunks) b,"
        "        unnest(%s::bigint[]) as o(off)",
        (offsets,),
    )
    conn.execute(
        "alter table kb_data.edges add constraint edges_pkey"
        " primary key (src_chunk_id, dst_chunk_id, relation)"
    )
    for definition in indexes:
        conn.execute(definition)
    # as autovacuum leaves a table after a bulk insert (the visibility map: index-only scans)
    conn.execute("vacuum analyze kb_data.edges")
    row = conn.execute("select count(*) from kb.edges").fetchone()
    assert row is not None
    print(f"  {row[0]:,} edges in {time.perf_counter() - started:.0f} s", flush=True)
    return int(row[0])


def dense(args: argparse.Namespace, home: Path, admin: str) -> None:
    """The bound on every work-multiplying parameter, at the documented maximums."""
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("create database bench_dense")
    url = database_url(admin, "bench_dense")
    kdb.upgrade(url)
    with psycopg.connect(url, prepare_threshold=None) as conn:
        register_vector(conn)
        print(f"loading {args.dense:,} chunks ...", flush=True)
        info = load_corpus(conn, url, args.dense, 1, n_groups=1)
        conn.autocommit = True
        add_dense_graph(conn)
        reader = conn.execute("select reader_role from kb.access_settings").fetchone()
        assert reader is not None
        conn.execute("drop role if exists bench_cost_reader")
        conn.execute("create role bench_cost_reader nologin")
        conn.execute(f'grant "{reader[0]}" to bench_cost_reader')
        # the reader may read every chunk, through the visibility checks (the costly path)
        conn.execute("select kb.grant_groups('bench_cost_reader', array['g0'])")
        conn.execute("select kb.access_enable()")
        if args.before:
            install_before(conn, args.before)
            conn.execute("grant usage on schema kb_before to bench_cost_reader")
            conn.execute("grant select on all tables in schema kb to bench_cost_reader")
        prewarm(conn)
        ids = [r[0] for r in conn.execute("select id from kb.chunks order by id")]
    rng = np.random.default_rng(3)
    seeds = [int(ids[i]) for i in rng.choice(len(ids), 1000, replace=False)]
    huge = [int(ids[i]) for i in rng.choice(len(ids), min(100_000, len(ids)), replace=False)]
    emb = query_embedding(info["centroids"], rng)
    extra = [query_embedding(info["centroids"], rng) for _ in range(100)]
    text = "parking permit renewal fees"
    heavy = (
        "select count(*) from {kb}.search(%s, %s, match_count => 1000, fetch_multiplier => 100,"
        " use_graph => true, graph_max_depth => 5, graph_min_score => 0,"
        " graph_max_returned => 1000{extra})"
    )
    calls: list[tuple[str, str, tuple[Any, ...]]] = [
        (
            "expand_graph: 1,000 seeds, depth 5, min_score 0",
            "select count(*) from {kb}.expand_graph(%s::bigint[], 5, 1000, 0)",
            (seeds,),
        ),
        ("kb.search: the audit's HTTP request (top 1,000, graph depth 5)", heavy, (text, emb)),
        (
            "kb.search: top 1,000 and 8 extra embeddings",
            "select count(*) from {kb}.search(%s, %s, match_count => 1000, extra_embeddings => %s)",
            (text, emb, extra[:8]),
        ),
        (
            "over the bound: 100,000 seeds",
            "select count(*) from {kb}.expand_graph(%s::bigint[], 5, 1000, 0)",
            (huge,),
        ),
        (
            "over the bound: 100 extra embeddings",
            "select count(*) from {kb}.search(%s, %s, match_count => 1000, extra_embeddings => %s)",
            (text, emb, extra),
        ),
    ]
    who = [("owner", None), ("reader", "bench_cost_reader")]
    schemas = ["kb_before", "kb"] if args.before else ["kb"]
    print(f"\n{'ms (median of ' + str(args.repeat) + '; max)':62} {'owner':>16} {'reader':>16}")
    for name, sql, params in calls:
        for schema in schemas:
            cells = []
            for _, role in who:
                with psycopg.connect(url, prepare_threshold=None, autocommit=True) as conn:
                    register_vector(conn)
                    conn.execute("set statement_timeout = '300s'")
                    if role is not None:
                        conn.execute(f"set role {role}")
                    times = []
                    outcome = ""
                    for _ in range(args.repeat if schema == "kb" else 1):
                        started = time.perf_counter()
                        try:
                            conn.execute(sql.format(kb=schema, extra=""), params).fetchall()
                        except psycopg.Error as exc:
                            outcome = f" {exc.sqlstate}"
                        times.append((time.perf_counter() - started) * 1000)
                    cells.append(f"{statistics.median(times):8.0f}/{max(times):.0f}{outcome}")
            label = f"{name} [{'before' if schema == 'kb_before' else 'now'}]"
            print(f"{label:62} {cells[0]:>16} {cells[1]:>16}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-depth", type=int, default=3, help="deepest 0.1.0 walk to time")
    parser.add_argument(
        "--dense", type=int, default=0, metavar="N", help="also the bounds on N chunks (see above)"
    )
    parser.add_argument("--before", metavar="REV", help="with --dense: REV's functions too")
    parser.add_argument("--shared-buffers", default=None, help="the server's, e.g. 6GB")
    parser.add_argument("--only-dense", action="store_true", help="skip the small corpus")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-cost-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        if restart_for_shared_buffers(admin, args.shared_buffers):
            server.stop()
            admin = server.start()
        if args.only_dense:
            dense(args, home, admin)
            return
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench_cost")
        url = admin.rsplit("/", 1)[0] + "/bench_cost?" + admin.split("?", 1)[1]
        kdb.upgrade(url)
        rng = random.Random(1)
        with psycopg.connect(url, prepare_threshold=None) as conn:
            vocabulary, clique = load(conn, rng)
            conn.autocommit = True
            conn.execute(OLD_QUERY_TERMS)
            create_0_1_0_walk(conn)
            print(f"{'':44} {'0.1.0 ms':>10} {'now ms':>10}")
            for n in (500, 2000, 7300):
                # the corpus's words first (each in ~40 chunks), then words it lacks
                text = " ".join(vocabulary[:n]) + " " + words(max(0, n - len(vocabulary)), rng)
                old = timed_ms(
                    lambda t=text: conn.execute(
                        "select * from pg_temp.query_terms_0_1_0(%s)", (t,)
                    ).fetchall(),
                    1,
                )
                new = timed_ms(
                    lambda t=text: conn.execute(
                        "select * from kb._query_terms(%s)", (t,)
                    ).fetchall(),
                    args.repeat,
                )
                print(
                    f"{f'parse {n:,} distinct words ({len(text):,} chars)':44} {old:10.1f} {new:10.1f}"
                )
                for name, sql in (
                    ("kb.search_lexical", "select * from kb.search_lexical(%s, 32)"),
                    ("kb.search (text only)", "select * from kb.search(%s)"),
                ):
                    ms = timed_ms(
                        lambda t=text, s=sql: conn.execute(s, (t,)).fetchall(), args.repeat
                    )
                    print(f"{f'  {name}, {n:,} words':44} {'':>10} {ms:10.1f}")
            for depth in range(1, 6):
                old_ms = (
                    f"{timed_ms(lambda d=depth: conn.execute(OLD_WALK, ([clique[0]], d)).fetchall(), 1):10.1f}"
                    if depth <= args.old_depth
                    else f"{'(skipped)':>10}"
                )
                new = timed_ms(
                    lambda d=depth: conn.execute(
                        "select * from kb.expand_graph(%s::bigint[], %s, 3, 0.5)", ([clique[0]], d)
                    ).fetchall(),
                    args.repeat,
                )
                print(f"{f'expand_graph, 70-chunk clique, depth {depth}':44} {old_ms} {new:10.1f}")
        if args.dense:
            dense(args, home, admin)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
