"""What one query may cost (issue 14): long queries and deep graph walks, 0.1.0 vs now.

A throwaway embedded PostgreSQL (temp dir) at head, a small corpus, then per run (wall clock,
one call each, the median of --repeat):

  * query parsing (kb._query_terms) for 500 / 2,000 / 7,300 distinct words (7,300 ~ 64 KB;
    up to 3,000 of them in the corpus), against 0.1.0's function;
  * kb.search_lexical and kb.search (text only) on those queries;
  * kb.expand_graph on a 70-chunk clique at depths 1-5, against 0.1.0's every-path walk
    (depths 1-3 only by default: depth 4 took 10 s; --old-depth 4 to see it).

    python benchmarks/bench_query_cost.py [--repeat 3] [--old-depth 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

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
        cur.copy("copy kb.chunks (document_id, ordinal, content) from stdin") as copy,
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
    with conn.cursor() as cur, cur.copy("copy kb.edges from stdin") as copy:
        for i, src in enumerate(clique):
            for dst in clique[i + 1 :]:
                copy.write_row((src, dst, "link", rng.uniform(0.55, 1.0)))
    conn.execute("select kb.refresh_lexical_index()")
    conn.commit()
    return vocabulary, clique


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-depth", type=int, default=3, help="deepest 0.1.0 walk to time")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-cost-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
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
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
