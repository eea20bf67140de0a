"""Issue 39, a layout measured before building: every kb table read through a view that selects
one knowledge base (not a test; prints numbers).

The plan in docs/knowledge-bases-design.md made every statement of ~180 functions carry
`kb_id`. This measures the other way to get there: the tables keep every knowledge base's rows
(`kb_id` added), and each `kb.<table>` the functions read becomes a view

    select * from <table> where kb_id = (select current knowledge base)

so that every statement is confined to one knowledge base without being edited. On a corpus
kept by bench_search.py (--keep DIR), inside one transaction that is rolled back at the end
(the kept server is left as it was):

  1. `kb_id integer not null default 1` added to every kb table (catalog only), analyzed;
  2. a view per kb table as above, and today's sql/010-070 installed with their table names and
     calls renamed, in two schemas: kb_views, where every statement reads the views (relation
     names given as strings, and the page sample of kb._filtered_rows_estimate, stay on the
     tables: a view has no pages), and kb_views_static, where the text the functions EXECUTE
     keeps the tables (as if it named the knowledge base itself);
  3. the same queries through kb (the tables) and both view schemas, query by query, the first
     of the three rotating with the query: p50 / p95 of each, the median of the per-query ratio
     to the tables, and whether the ranked ids agree;
  4. the cost of the predicate alone: the vector arm's exact path over a 1% group (the rows
     sorted by distance), with and without `kb_id = ...`.

    python benchmarks/bench_search.py --chunks 200000 --keep /tmp/kb200k   # once: the corpus
    python benchmarks/bench_kb_views.py --chunks 200000 --keep /tmp/kb200k
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from pgvector.psycopg import register_vector

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_search import (  # noqa: E402
    PAIRED_CALLS,
    bench_home,
    corpus_arguments,
    database_url,
    load_average,
    log,
    percentile,
    prewarm,
    query_items,
    read_info,
    sql_function_names,
    vector_schema,
)

from kbpg.store import db as kdb  # noqa: E402
from kbpg.store.embedded import EmbeddedServer  # noqa: E402

SCHEMA = "kb_views"
SCHEMA_STATIC = "kb_views_static"
CURRENT = (
    "create function {s}._current_kb() returns integer language sql stable return"
    " coalesce(nullif(pg_catalog.current_setting('kbpg.kb_id', true), ''), '1')::integer"
)
EXACT_PATH = (
    "explain (analyze, format json) select c.id, c.document_id,"
    " c.embedding <=> (select embedding from kb.chunks where id = 777) as distance"
    " from kb.chunks c where c.groups && '{{g7}}' and c.embedding is not null {extra}"
    " order by 3, 1 limit 32"
)


def add_kb_id(conn: psycopg.Connection[Any]) -> list[str]:
    """Step 1 (in the caller's transaction): kb_id on every kb table; their names."""
    tables = [
        row[0]
        for row in conn.execute(
            "select c.relname from pg_class c"
            " where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'p')"
        ).fetchall()
    ]
    for table in tables:
        conn.execute(f"alter table kb.{table} add column kb_id integer not null default 1")
        conn.execute(f"analyze kb.{table} (kb_id)")
    return tables


def install_views(
    conn: psycopg.Connection[Any], schema: str, tables: list[str], executed_on_tables: bool
) -> None:
    """Step 2 (in the caller's transaction): views and functions in `schema`. executed_on_tables:
    only the static statements read the views, the text the functions EXECUTE (planned on every
    call) keeps the tables, as if it carried `kb_id = $n` itself (its cost: step 4)."""
    texts = [p.read_text() for p in sorted((ROOT / "sql").glob("0[1-7]*.sql"))]
    names = sorted(sql_function_names(texts) | set(tables), key=len, reverse=True)
    renamed = re.compile(r"\bkb\.(" + "|".join(names) + r")\b")
    vector = vector_schema(conn)
    conn.execute(f"create schema {schema}")
    conn.execute("set local search_path = pg_catalog, pg_temp")
    conn.execute(CURRENT.format(s=schema))
    for table in tables:
        conn.execute(
            f"create view {schema}.{table} as select * from kb.{table}"
            f" where kb_id = (select {schema}._current_kb())"
        )

    def rename(text: str) -> str:
        return renamed.sub(schema + r".\1", text)

    for text in texts:
        text = text.replace(kdb.EXTSCHEMA_VECTOR, vector)
        if executed_on_tables:
            # comments and string literals (the EXECUTEd text) as they are, the rest renamed
            pieces = re.split(r"(--[^\n]*|'(?:[^']|'')*')", text)
            sql = "".join(p if i % 2 else rename(p) for i, p in enumerate(pieces))
        else:
            sql = rename(text)
            sql = re.sub(rf"'{schema}\.(\w+)'", r"'kb.\1'", sql)
            sql = sql.replace(f"from {schema}.chunks c tablesample", "from kb.chunks c tablesample")
        conn.execute(sql.encode())
    conn.execute("reset search_path")


def exact_path_ms(conn: psycopg.Connection[Any], extra: str, rounds: int) -> float:
    """Step 4: the median execution time (ms) of the exact path's statement."""
    times = []
    for _ in range(rounds):
        row = conn.execute(EXACT_PATH.format(extra=extra)).fetchone()
        assert row is not None
        times.append(float(row[0][0]["Execution Time"]))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser)
    parser.add_argument("--repeat", type=int, default=2, help="passes over each query set")
    args = parser.parse_args()
    if args.keep is None:
        raise SystemExit("--keep DIR: a corpus kept by bench_search.py (run it first)")
    home = bench_home(args.keep, "kbpg-bench-")
    server = EmbeddedServer(home, durable=False)
    admin = server.start()
    try:
        info = read_info(home, args)
        if info is None:
            raise SystemExit(f"{home} holds no corpus: run bench_search.py --keep {home} first")
        url = database_url(admin, "bench")
        kdb.upgrade(url)
        with psycopg.connect(url, prepare_threshold=None) as conn:
            register_vector(conn)
            prewarm(conn)
            conn.commit()
            with conn.transaction(force_rollback=True):
                tables = add_kb_id(conn)
                install_views(conn, SCHEMA, tables, executed_on_tables=False)
                install_views(conn, SCHEMA_STATIC, tables, executed_on_tables=True)
                log(
                    f"kb_id on {len(tables)} tables, a view over each in schemas {SCHEMA} (every"
                    f" statement reads them) and {SCHEMA_STATIC} (the static ones)"
                )
                run(conn, info, args)
    finally:
        server.stop()


def rotated(
    fns: list[Callable[[Any], Any]], items: list[Any]
) -> list[tuple[list[float], list[Any]]]:
    """Every fn on every item one right after the other, the first of them rotating with the
    item (whichever runs first on a query pays for its pages: interleaved()'s alternation never
    puts the middle one of three first), so each fn is first, middle and last as often: per fn,
    the times (ms) and results, item by item."""
    runs: list[tuple[list[float], list[Any]]] = [([], []) for _ in fns]
    for i, item in enumerate(items):
        for k in (i + j for j in range(len(fns))):
            k %= len(fns)
            started = time.perf_counter()
            runs[k][1].append(fns[k](item))
            runs[k][0].append((time.perf_counter() - started) * 1000)
    return runs


def run(conn: psycopg.Connection[Any], info: dict[str, Any], args: argparse.Namespace) -> None:
    sets = query_items(info, args.seed, args.queries)
    schemas = ("kb", SCHEMA, SCHEMA_STATIC)
    for _, items in sets:  # warm every schema's plans and pages
        for text, embedding in items[:10]:
            for schema in schemas:
                conn.execute(f"select * from {schema}.search(%s, %s)", (text, embedding)).fetchall()
    log(f"\n{'':40} {'tables':>13} {'views':>13} {'static views':>13}   views/tables   same ids")
    log(f"{'':40}{'   p50   p95' * 3}    all  static  all  static")
    for pass_no in range(1, args.repeat + 1):
        for set_name, items in sets:
            log(f"-- {set_name} ({len(items)} queries), pass {pass_no} (load {load_average()})")
            for name, sql in PAIRED_CALLS:

                def in_schema(schema: str, sql: str = sql) -> Any:
                    return lambda item: conn.execute(
                        sql.format(s=schema), {"t": item[0], "e": item[1]}
                    ).fetchall()

                runs = rotated([in_schema(schema) for schema in schemas], items)
                (base_ms, base_ids), *others = runs
                cells = "".join(
                    f" {statistics.median(ms):6.2f}{percentile(ms, 0.95):6.2f}" for ms, _ in runs
                )
                ratios = "".join(
                    f" {statistics.median(v / t for v, t in zip(ms, base_ms, strict=True)):6.3f}"
                    for ms, _ in others
                )
                same = "".join(
                    f" {sum(a == b for a, b in zip(base_ids, ids, strict=True)):2}/{len(items)}"
                    for _, ids in others
                )
                log(f"{name:40}{cells}   {ratios}  {same}")
    plain = exact_path_ms(conn, "", 21)
    constant = exact_path_ms(conn, "and c.kb_id = 1", 21)
    param = exact_path_ms(conn, f"and c.kb_id = (select {SCHEMA}._current_kb())", 21)
    log(
        "\nthe vector arm's exact path over a 1% group (its rows sorted by distance), median of"
        f" 21: {plain:.2f} ms; with kb_id = 1: {constant:.2f} ms; with kb_id = the current"
        f" knowledge base: {param:.2f} ms (load {load_average()})"
    )


if __name__ == "__main__":
    main()
