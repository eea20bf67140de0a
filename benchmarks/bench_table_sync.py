"""Table sources: trigger overhead, backfill rate and freshness (not a test; prints numbers).

Three measurements, each on throwaway embedded servers (temp dirs), each compared with its
baseline in the same run:

  trigger    the application's own single-row UPDATE (of an indexed column, and of a column the
             source does not read) and INSERT on a table with a source against the same
             statements on an identical table without one, interleaved in rounds (the queue is
             emptied between rounds, as a worker keeps it). Two ways: autocommit (what an
             application's write costs: statement and commit, on a durable server: fsync on,
             synchronous_commit on) and inside one transaction (the statement alone).
             Target: <= 1.3x on a single-row UPDATE. Then a 50,000-row UPDATE ... SET body =
             body || 'x' with the source and without, alternated. Target: <= 2x.
  backfill   the rows of NPL (first --rows abstracts) in a table, backfilled by `kbpg sync`,
             against `kbpg ingest` of the same records as JSONL, with the same embedder (MiniLM,
             loaded once, warmed up first); rows/s with the model, and the database side alone
             (rows over the time not spent embedding). Target: backfill >= the JSONL rate.
  freshness  an application writing --rate rows a second (updates and inserts, each its own
             transaction) for --seconds while `kbpg sync --watch` runs as its own process; a
             poller reads kb.documents every 20 ms: seconds from each write's commit to its
             document (with the write's new title) being stored, p50/p95/max, and the worker's
             embedding time per batch. Target: p95 <= 2 s plus the embedding time.
             `--embedder stub`: vectors from a local server that does no work (bench_ingest_
             memory's), for the database side alone, when the model cannot keep up.

    python benchmarks/bench_table_sync.py                       # all three, ~10 min on 2 cores
    python benchmarks/bench_table_sync.py --only trigger --statements 2000
    python benchmarks/bench_table_sync.py --only freshness --rate 50 --seconds 120
    python benchmarks/bench_table_sync.py --only freshness --embedder stub --before ../main
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from bench_ingest_memory import start_stub_embeddings

from kbpg.app import KnowledgeBase
from kbpg.config import Settings
from kbpg.ingest.run import ingest_paths
from kbpg.ingest.tables import sync
from kbpg.models.embedders import get_embedder
from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

NPL = Path(__file__).resolve().parent.parent.parent / "shared" / "ir" / "npl"
KBPG = str(Path(sys.executable).parent / "kbpg")


def log(message: str) -> None:
    print(message, flush=True)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextmanager
def server(durable: bool) -> Iterator[str]:
    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-sync-", dir="/tmp"))
    home.chmod(0o755)
    embedded = EmbeddedServer(home, durable=durable)
    try:
        yield embedded.start()
    finally:
        embedded.stop()
        shutil.rmtree(home, ignore_errors=True)


def new_database(admin: str, name: str, kbpg: str = KBPG) -> str:
    """A database migrated by `kbpg` (this checkout's in-process; another's by its command)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name}")
        conn.execute(f"create database {name}")
    url = admin.rsplit("/", 1)[0] + f"/{name}?" + admin.split("?", 1)[1]
    if kbpg == KBPG:
        kdb.upgrade(url)
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
        subprocess.run([kbpg, "db", "upgrade"], env={**env, "KBPG_DATABASE_URL": url},
                       check=True, capture_output=True)  # fmt: skip
    return url


def npl_records(rows: int) -> list[dict[str, str]]:
    records = []
    with (NPL / "corpus.jsonl").open() as f:
        for line in f:
            record = json.loads(line)
            records.append({"id": record["_id"], "title": record["title"], "text": record["text"]})
            if len(records) == rows:
                break
    return records


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# -- trigger overhead --------------------------------------------------------------------------

TABLES = ("plain", "synced", "quiet")  # no source; a source (NOTIFY at commit); one without

# Times a statement on each table inside the server, the tables interleaved statement by
# statement (order rotating); returns each table's times in microseconds. {t} is the table, $1
# a random key or a new id.
IN_SERVER = """
create function pg_temp.time_statements(template text, key text, n integer, table_rows integer,
                                         round integer)
returns table (table_name text, micros double precision[])
language plpgsql as $$
declare
    tables text[] := array['plain', 'synced', 'quiet'];
    times double precision[][] := array_fill(0::double precision, array[3, n]);
    t0 timestamptz;
    k bigint;
    j integer;
begin
    for i in 1..n loop
        for r in 0..2 loop
            j := 1 + (i + r) % 3;
            k := case when key = 'new' then 10000000 + (round * n + i) * 10 + j
                      else 1 + floor(random() * table_rows)::bigint end;
            t0 := clock_timestamp();
            execute format(template, tables[j]) using k, 'Permits are renewed at the town hall. ' || i;
            times[j][i] := extract(epoch from clock_timestamp() - t0) * 1e6;
        end loop;
    end loop;
    for j in 1..3 loop
        table_name := tables[j];
        micros := array(select times[j][x] from generate_series(1, n) as x);
        return next;
    end loop;
end $$
"""
IN_SERVER_STATEMENTS = {
    "UPDATE of the text": (
        "update public.%I set body = $2, updated_at = now() where id = $1", "random"),
    "UPDATE of view_count": (
        "update public.%I set view_count = view_count + 1 where id = $1", "random"),
    "INSERT": ("insert into public.%I (id, title, body, author) values ($1, 'n', $2, 'x')", "new"),
}  # fmt: skip

ARTICLES = """
create table public.{name} (
    id bigint primary key, title text not null, body text not null, author text,
    updated_at timestamptz not null default now(), view_count integer not null default 0
);
create index on public.{name} (updated_at);
insert into public.{name} (id, title, body, author)
select g, 'Article ' || g, repeat('Renew your parking permit online before it expires. ', 20) || g,
       'author ' || (g % 50)
  from generate_series(1, {rows}) g
"""


def bench_trigger(args: argparse.Namespace) -> None:
    log(f"\n== trigger overhead (durable server; load average {load_average()})")
    with server(durable=True) as admin:
        url = new_database(admin, "bench_trigger")
        with psycopg.connect(url, autocommit=True) as conn:
            for name in TABLES:
                for statement in ARTICLES.format(name=name, rows=args.table_rows).split(";"):
                    conn.execute(statement)
                conn.execute(f"vacuum analyze public.{name}")
            for name, notify in (("synced", True), ("quiet", False)):
                conn.execute(
                    f"select kb.add_table_source('{name}', 'public.{name}', text => 'body',"
                    " title => 'title', metadata => '{author, updated_at}', notify => %s)",
                    (notify,),
                )
            conn.execute("update kb.table_sources set backfill_state = 'done'")
        statements = {
            "UPDATE of the text": "update public.{t} set body = %s, updated_at = now() where id = %s",
            "UPDATE of view_count": "update public.{t} set view_count = view_count + 1 where id = %s",
            "INSERT": "insert into public.{t} (id, title, body, author) values (%s, %s, %s, 'x')",
        }
        rng = random.Random(7)
        next_id = dict.fromkeys(TABLES, args.table_rows + 1)
        body = "Permits are renewed at the town hall on weekdays. " * 20

        def params(kind: str, table: str, i: int) -> tuple[Any, ...]:
            if kind.startswith("UPDATE of the"):
                return (f"{body} {i}", rng.randint(1, args.table_rows))
            if kind.startswith("UPDATE"):
                return (rng.randint(1, args.table_rows),)
            next_id[table] += 1
            return (next_id[table], f"New {i}", f"{body} {i}")

        results: dict[tuple[str, str, str], list[float]] = {}
        # one connection per table, the statements interleaved one by one (the table order
        # rotating): the three see the same noise of a shared machine
        conns = {t: psycopg.connect(url, autocommit=True) for t in TABLES}
        try:
            for kind, template in statements.items():
                for _ in range(args.rounds):
                    for i in range(args.statements // args.rounds):
                        for table in TABLES[i % 3 :] + TABLES[: i % 3]:
                            values = params(kind, table, i)
                            sql = template.format(t=table)
                            t0 = time.perf_counter()
                            conns[table].execute(sql, values, prepare=True)
                            elapsed = time.perf_counter() - t0
                            results.setdefault(("autocommit", kind, table), []).append(elapsed)
                    conns["plain"].execute("delete from kb.source_queue")  # a worker's job
            # a bulk write: 50,000 rows (or the table) in one UPDATE of the text, with the source
            # (statement triggers, transition tables) against without, alternated; each table
            # vacuumed first (as autovacuum keeps it), so that neither pays for the dead rows of
            # the rounds before
            bulk_rows = min(50_000, args.table_rows)
            for r in range(args.bulk_repeat):
                for table in ("plain", "synced") if r % 2 == 0 else ("synced", "plain"):
                    conns[table].execute(f"vacuum public.{table}")
                    t0 = time.perf_counter()
                    conns[table].execute(
                        f"update public.{table} set body = body || 'x' where id <= {bulk_rows}"
                    )
                    results.setdefault(("bulk", "UPDATE", table), []).append(
                        time.perf_counter() - t0
                    )
                    conns["plain"].execute("delete from kb.source_queue")
            # the statement alone, timed inside the server (no round trip, no commit), the
            # tables interleaved statement by statement in one transaction
            with conns["plain"].transaction():
                conns["plain"].execute(IN_SERVER)
                for kind, (template, key) in IN_SERVER_STATEMENTS.items():
                    for r in range(args.rounds):
                        per_round = args.statements // args.rounds
                        timed = conns["plain"].execute(
                            "select * from pg_temp.time_statements(%s, %s, %s, %s, %s)",
                            (template, key, per_round, args.table_rows, r),
                        )
                        rows = timed.fetchall()
                        for table, micros in rows:
                            results.setdefault(("in the server", kind, table), []).extend(
                                m / 1e6 for m in micros
                            )
                        conns["plain"].execute("delete from kb.source_queue")
        finally:
            for conn in conns.values():
                conn.close()
        log(f"{'statement':<22} {'mode':<19} {'source':<16} {'p50':>8} {'ratio':>6}"
            f" {'mean':>8} {'ratio':>6}")  # fmt: skip
        for mode in ("autocommit", "in the server"):
            for kind in statements:
                plain = results[(mode, kind, "plain")]
                p, pm = statistics.median(plain) * 1e6, statistics.fmean(plain) * 1e6
                log(f"{kind:<22} {mode:<19} {'none':<16} {p:>6.0f}us {'':>6} {pm:>6.0f}us")
                for table, label in (("synced", "notify (default)"), ("quiet", "notify => false")):
                    t = results[(mode, kind, table)]
                    s, sm = statistics.median(t) * 1e6, statistics.fmean(t) * 1e6
                    log(f"{'':<22} {'':<19} {label:<16} {s:>6.0f}us {s / p:>5.2f}x"
                        f" {sm:>6.0f}us {sm / pm:>5.2f}x")  # fmt: skip
        plain_bulk = statistics.median(results[("bulk", "UPDATE", "plain")])
        synced_bulk = statistics.median(results[("bulk", "UPDATE", "synced")])
        log(f"UPDATE of {bulk_rows:,} rows (set body = body || 'x'), median of"
            f" {args.bulk_repeat // 2 or 1}+: without a source {plain_bulk:.2f} s, with"
            f" {synced_bulk:.2f} s: {synced_bulk / plain_bulk:.2f}x (target <= 2x)")  # fmt: skip
        log(f"({args.statements} statements per row, in {args.rounds} interleaved rounds;"
            f" load average after: {load_average()})")  # fmt: skip


# -- backfill rate ------------------------------------------------------------------------------


def bench_backfill(args: argparse.Namespace) -> None:
    log(f"\n== backfill vs JSONL ingest, {args.rows} NPL records (load average {load_average()})")
    records = npl_records(args.rows)
    embedder = get_embedder(Settings.from_env(), "minilm")
    embedder.embed_documents(["warm up the model"] * 8)
    work = Path(tempfile.mkdtemp(prefix="kbpg-bench-sync-", dir="/tmp"))
    jsonl = work / "npl.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    runs: dict[str, list[dict[str, float]]] = {"jsonl": [], "sync": []}
    try:
        with server(durable=False) as admin:
            for repeat in range(args.repeat):
                order = ("jsonl", "sync") if repeat % 2 == 0 else ("sync", "jsonl")
                for kind in order:
                    url = new_database(admin, f"bench_{kind}_{repeat}")
                    if kind == "sync":
                        with psycopg.connect(url, autocommit=True) as conn:
                            conn.execute("create table public.npl (id text primary key,"
                                         " title text, body text)")  # fmt: skip
                            with conn.cursor().copy("copy public.npl from stdin") as copy:
                                for r in records:
                                    copy.write_row((r["id"], r["title"], r["text"]))
                            conn.execute("select kb.add_table_source('npl', 'public.npl',"
                                         " text => 'body', title => 'title')")  # fmt: skip
                    with KnowledgeBase(url, embedder, pool_size=1) as kb:
                        t0 = time.perf_counter()
                        if kind == "jsonl":
                            done: Any = ingest_paths(kb.db, kb.models, [jsonl])
                            rows = done.documents
                        else:
                            done = sync(kb.db, kb.models, batch_rows=args.batch_rows)
                            rows = done.rows
                        total = time.perf_counter() - t0
                    runs[kind].append(
                        {"rows": rows, "chunks": done.chunks, "total": total,
                         "embed": done.embed_s}
                    )  # fmt: skip
                    log(f"  {kind:<5} run {repeat + 1}: {rows} rows, {done.chunks} chunks in"
                        f" {total:.1f} s = {rows / total:.1f} rows/s; embedding {done.embed_s:.1f}"
                        f" s; database side {rows / max(total - done.embed_s, 1e-9):.0f} rows/s")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rate = {k: statistics.fmean(r["rows"] / r["total"] for r in v) for k, v in runs.items()}
    side = {
        k: statistics.fmean(r["rows"] / max(r["total"] - r["embed"], 1e-9) for r in v)
        for k, v in runs.items()
    }
    log(f"with the model: sync {rate['sync']:.1f} rows/s, JSONL ingest {rate['jsonl']:.1f} rows/s"
        f" = {rate['sync'] / rate['jsonl']:.2f}x")  # fmt: skip
    log(f"database side: sync {side['sync']:.0f} rows/s, JSONL ingest {side['jsonl']:.0f} rows/s"
        f" (load average after: {load_average()})")  # fmt: skip


# -- freshness ----------------------------------------------------------------------------------


def bench_freshness(args: argparse.Namespace) -> None:
    log(
        f"\n== freshness: {args.rate} writes/s for {args.seconds} s (load average {load_average()})"
    )
    records = npl_records(args.rows)
    # with --before: that checkout's kbpg (its own migrations, functions and worker) and this
    # one's, alternated on the same server, each on a database of its own
    sides = [("this", KBPG)]
    if args.before:
        before = str(Path(args.before).resolve() / ".venv" / "bin" / "kbpg")
        sides = [("before", before), ("this", KBPG)]
    results: dict[str, list[list[float]]] = {label: [] for label, _ in sides}
    with server(durable=False) as admin:
        for repeat in range(args.repeat if args.before else 1):
            for label, kbpg in sides if repeat % 2 == 0 else sides[::-1]:
                url = new_database(admin, f"bench_fresh_{label}_{repeat}", kbpg)
                log(f"  [{label} run {repeat + 1}: {kbpg}; load average {load_average()}]")
                results[label].append(freshness_run(url, kbpg, records, args))
    if args.before:
        for label, runs in results.items():
            seen = [x for run in runs for x in run]
            if seen:
                log(f"{label:<6} all runs: p50 {percentile(seen, 0.5):.2f} s, p95"
                    f" {percentile(seen, 0.95):.2f} s, max {max(seen):.2f} s ({len(seen)} writes)")  # fmt: skip
    log(f"(load average after: {load_average()})")


def freshness_run(
    url: str, kbpg: str, records: list[dict[str, str]], args: argparse.Namespace
) -> list[float]:
    """One freshness run with the worker `kbpg` on the database `url`: commit -> searchable
    seconds of every write seen."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create table public.npl (id integer primary key, title text, body text)")
        with conn.cursor().copy("copy public.npl from stdin") as copy:
            for i, r in enumerate(records, start=1):
                copy.write_row((i, "rev 0", r["text"]))
        conn.execute(
            "select kb.add_table_source('npl', 'public.npl', text => 'body', title => 'title')"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
    env.update(KBPG_DATABASE_URL=url, ORT_DISABLE_TELEMETRY="1")
    stub: ThreadingHTTPServer | None = None
    if args.embedder == "stub":
        # the database side alone: vectors from a local server that does no work
        stub = start_stub_embeddings(env)
    try:
        return _freshness_load(url, kbpg, env, records, args)
    finally:
        if stub is not None:
            stub.shutdown()


def _freshness_load(
    url: str, kbpg: str, env: dict[str, str], records: list[dict[str, str]],
    args: argparse.Namespace,
) -> list[float]:  # fmt: skip
    log(f"  embedder {args.embedder}; backfilling {len(records)} rows first ...")
    subprocess.run([kbpg, "sync", "--batch-size", str(args.batch_rows)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    worker = subprocess.Popen(
        [kbpg, "sync", "--watch", "--json", "--batch-size", str(args.batch_rows)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # one write first, timed by nobody: the worker has started and loaded its model (the
    # run measures the steady state, not the worker's start)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("update public.npl set title = 'warm-up' where id = 1")
        warm_until = time.perf_counter() + 600
        while (
            conn.execute(
                "select 1 from kb.documents where source = 'table:npl/1' and title = 'warm-up'"
            ).fetchone()
            is None
        ):
            if time.perf_counter() > warm_until:
                raise SystemExit("the worker did not write the warm-up row within 600 s")
            time.sleep(0.05)
    committed: dict[str, tuple[str, float]] = {}  # source -> (title, commit time)
    seen: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def poll() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set() or committed:
                with lock:
                    wanted = dict(committed)
                if wanted:
                    rows = conn.execute(
                        "select source, title from kb.documents where source = any(%s)",
                        (list(wanted),),
                    ).fetchall()
                    now = time.perf_counter()
                    with lock:
                        for source, title in rows:
                            if source in committed and committed[source][0] == title:
                                seen.append(now - committed.pop(source)[1])
                if stop.is_set() and time.perf_counter() > deadline + 60:
                    break
                time.sleep(0.02)

    deadline = time.perf_counter() + args.seconds
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    rng = random.Random(11)
    writes = 0
    next_id = len(records) + 1
    with psycopg.connect(url, autocommit=True) as app:
        start = time.perf_counter()
        while time.perf_counter() < start + args.seconds:
            writes += 1
            title = f"rev {writes}"
            if rng.random() < 0.3:
                key, next_id = next_id, next_id + 1
                text = rng.choice(records)["text"]
                app.execute("insert into public.npl values (%s, %s, %s)", (key, title, text))
            else:
                key = rng.randint(1, len(records))
                app.execute(
                    "update public.npl set title = %s, body = body || ' ' || %s where id = %s",
                    (title, f"edit{writes}", key),
                )
            with lock:
                committed[f"table:npl/{key}"] = (title, time.perf_counter())
            pause = start + writes / args.rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    stop.set()
    poller.join(120)
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=120)
    summary = json.loads(out) if out.strip() else {}
    missing = len(committed)
    batches = max(summary.get("batches", 0), 1)
    embed_per_batch = summary.get("seconds", {}).get("embedding", 0.0) / batches
    log(f"  {writes} writes ({writes / args.seconds:.1f}/s); {len(seen)} seen searchable,"
        f" {missing} not within 60 s after the load")  # fmt: skip
    if seen:
        log(f"  commit -> searchable: p50 {percentile(seen, 0.5):.2f} s, p95"
            f" {percentile(seen, 0.95):.2f} s, max {max(seen):.2f} s")  # fmt: skip
    log(f"  worker: {summary.get('rows', 0)} rows in {summary.get('batches', 0)} batches,"
        f" embedding {embed_per_batch:.2f} s a batch on average"
        f" (target p95 <= 2 s + that); load average after: {load_average()}")  # fmt: skip
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="trigger,backfill,freshness",
                        help="comma-separated: trigger, backfill, freshness")  # fmt: skip
    parser.add_argument("--statements", type=int, default=4000,
                        help="trigger: statements per kind and table")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8, help="trigger: interleaved rounds")
    parser.add_argument(
        "--bulk-repeat",
        type=int,
        default=6,
        help="trigger: 50,000-row UPDATEs of each table, alternated",
    )
    parser.add_argument("--table-rows", type=int, default=100_000, help="trigger: table size")
    parser.add_argument("--rows", type=int, default=2000, help="backfill/freshness: NPL rows")
    parser.add_argument("--repeat", type=int, default=2,
                        help="backfill (and freshness with --before): runs of each, alternated")  # fmt: skip
    parser.add_argument("--before", default=None,
                        help="freshness: also run the worker of this checkout (with its .venv),"
                             " alternated with this one's, e.g. a worktree of main")  # fmt: skip
    parser.add_argument("--batch-rows", type=int, default=256, help="kbpg sync --batch-size")
    parser.add_argument("--rate", type=float, default=50.0, help="freshness: writes a second")
    parser.add_argument("--seconds", type=float, default=120.0, help="freshness: how long")
    parser.add_argument(
        "--embedder",
        choices=["minilm", "stub"],
        default="minilm",
        help="freshness: the model, or a local server answering at once (the database side)",
    )
    args = parser.parse_args()
    chosen = {c.strip() for c in args.only.split(",")}
    benches: dict[str, Callable[[argparse.Namespace], None]] = {
        "trigger": bench_trigger,
        "backfill": bench_backfill,
        "freshness": bench_freshness,
    }
    for name, bench in benches.items():
        if name in chosen:
            bench(args)


if __name__ == "__main__":
    main()
