"""The same searches on two kept corpora, query by query: a schema change against the one before it
(not a test; prints numbers).

bench_search.py --before REV compares two revisions' functions over the same tables; a change of
the tables themselves (issue 39's views, a partitioned layout) needs two databases. This starts
two servers kept by bench_search.py --keep: BASE as it is (its schema untouched) and CHANGED, a
copy of it (`cp -a`, then this script's --upgrade runs `kbpg.store.db.upgrade` on it with this
work tree's migrations and sql/). Every query of bench_search.py's two sets runs on both, one right
after the other, the first alternating; per call it prints p50 / p95 of each, the median of the
per-query ratio CHANGED / BASE, and how many ranked id lists agree.

    cp -a /tmp/kb200k /tmp/kb200k-changed      # the server stopped
    python benchmarks/bench_schema_pair.py --chunks 200000 --base /tmp/kb200k \\
        --changed /tmp/kb200k-changed --upgrade

Run it from the work tree whose code CHANGED should have: the editable install imports kbpg (and
its migrations) from the main work tree unless PYTHONPATH says otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from pgvector.psycopg import register_vector

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_search import (  # noqa: E402
    PAIRED_CALLS,
    corpus_arguments,
    database_url,
    load_average,
    log,
    prewarm,
    query_items,
    read_info,
    timed_pair,
)

from kbpg.store import db as kdb  # noqa: E402
from kbpg.store.embedded import EmbeddedServer  # noqa: E402

# the calls bench_kb_views.py pairs, and a metadata filter (a path neither arm's own filters take)
CALLS = [
    *PAIRED_CALLS,
    (
        "kb.search hybrid, 1% metadata filter",
        'select chunk_id from {s}.search(%(t)s, %(e)s, 8, filter => \'{{"product": "p7"}}\')',
    ),
]


def own_sockets(home: Path) -> None:
    """A copied home's server listens where the original's did (postgresql.conf names the
    socket directory): point it at its own, so that both run side by side."""
    conf = home / "pgdata" / "postgresql.conf"
    lines = conf.read_text().splitlines()
    mine = f"unix_socket_directories = '{home.resolve() / 'pgdata'}'"
    changed = [mine if line.startswith("unix_socket_directories =") else line for line in lines]
    if changed != lines:
        conf.write_text("\n".join(changed) + "\n")


@contextmanager
def kept_server(home: Path, upgrade: bool) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the bench database of the server kept in `home` (started here)."""
    own_sockets(home)
    server = EmbeddedServer(home, durable=False)
    url = database_url(server.start(), "bench")
    try:
        if upgrade:
            started = time.perf_counter()
            kdb.upgrade(url)
            log(f"{home}: upgraded in {time.perf_counter() - started:.1f} s")
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            register_vector(conn)
            row = conn.execute("select version_num from public.kbpg_alembic_version").fetchone()
            log(f"{home}: revision {row[0] if row else '?'}")
            conn.execute("analyze")
            prewarm(conn)
            yield conn
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser, keep=False)
    parser.add_argument("--base", type=Path, required=True, help="the corpus as it is")
    parser.add_argument("--changed", type=Path, required=True, help="its copy, changed")
    parser.add_argument(
        "--upgrade", action="store_true", help="apply this work tree's migrations to --changed"
    )
    parser.add_argument("--repeat", type=int, default=2, help="passes over each query set")
    args = parser.parse_args()
    info = read_info(args.base, args)
    if info is None:
        raise SystemExit(f"{args.base} holds no corpus of bench_search.py")
    sets = query_items(info, args.seed, args.queries)
    with ExitStack() as stack:
        conns = {
            "base": stack.enter_context(kept_server(args.base, upgrade=False)),
            "changed": stack.enter_context(kept_server(args.changed, upgrade=args.upgrade)),
        }
        for _, items in sets:  # warm both
            for text, embedding in items:
                for conn in conns.values():
                    conn.execute("select * from kb.search(%s, %s)", (text, embedding)).fetchall()
        for pass_no in range(1, args.repeat + 1):
            for set_name, items in sets:
                log(f"-- {set_name} ({len(items)} queries), pass {pass_no} (load {load_average()})")
                for name, sql in CALLS:

                    def on(side: str, sql: str = sql) -> Any:
                        return lambda item: (
                            conns[side]
                            .execute(sql.format(s="kb"), {"t": item[0], "e": item[1]})
                            .fetchall()
                        )

                    (b50, b95, base_ids), (c50, c95, changed_ids), ratio = timed_pair(
                        on("base"), on("changed"), items
                    )
                    same = sum(a == b for a, b in zip(base_ids, changed_ids, strict=True))
                    log(
                        f"{name:40} base {b50:6.2f} {b95:6.2f}  changed {c50:6.2f} {c95:6.2f}"
                        f"  changed/base {ratio:.3f}  same ids {same}/{len(items)}"
                    )


if __name__ == "__main__":
    main()
