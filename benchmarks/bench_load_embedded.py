"""Benchmark loading records that carry their own embeddings (prints numbers; not a test).

Writes N JSONL records of 384-d clustered unit vectors (as benchmarks/bench_vector_layouts.py)
with short texts, then runs the real `kbpg ingest` on them against a throwaway embedded
PostgreSQL, with the default embedder named but never run (every record has its vector). The
knowledge base is empty, so the HNSW index is built once after the rows are in. Reports the
rows' load rate (chunks/s without the index build), the index build, the whole run, and peak
memory of the kbpg process and of the PostgreSQL server processes.

    python benchmarks/bench_load_embedded.py --chunks 20000
    python benchmarks/bench_load_embedded.py --chunks 200000   # ~10 min on 2 cores
    python benchmarks/bench_load_embedded.py --chunks 1000000 --rows-only  # stop at the build

With `--rows-only` the ingest is stopped (SIGINT) as soon as the index build starts: the rows'
rates and CPU are reported, the build, the lexical cache and kbpg's own split are not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psycopg

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

DIM = 384
INDEX_BUILDING = "select exists (select from pg_stat_progress_create_index)"
WORDS = [
    "permit",
    "renew",
    "parking",
    "waste",
    "library",
    "council",
    "tax",
    "housing",
    "bus",
    "route",
    "fee",
    "form",
    "office",
]


def write_records(path: Path, n: int, seed: int) -> None:
    nrng = np.random.default_rng(seed)
    centroids = nrng.normal(size=(500, DIM)).astype(np.float32)
    with path.open("w") as f:
        for start in range(0, n, 10_000):
            m = min(n, start + 10_000) - start
            vectors = centroids[nrng.integers(0, 500, size=m)]
            vectors = vectors + nrng.normal(scale=0.9, size=vectors.shape).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            words = nrng.integers(0, len(WORDS), size=(m, 40))
            for i in range(m):
                text = " ".join(WORDS[w] for w in words[i])
                record = {
                    "id": f"r{start + i}",
                    "title": f"Record {start + i}",
                    "text": f"Record {start + i}: {text}",
                    "groups": [f"g{(start + i) % 100}"],
                    "embedding": np.round(vectors[i].astype(np.float64), 6).tolist(),
                }
                f.write(json.dumps(record) + "\n")


def rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"VmRSS:\s+(\d+)", status)
        total += int(match.group(1)) if match else 0
    return total


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pids(pgdata: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", str(pgdata)], capture_output=True, text=True).stdout
    parents = [int(p) for p in out.split()]
    children = []
    for parent in parents:
        kids = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True)
        children += [int(p) for p in kids.stdout.split()]
    return parents + children


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, help="kbpg ingest --batch-size (its default)")
    parser.add_argument(
        "--records",
        type=Path,
        help="keep the records in this file and reuse it when it exists (same --chunks, --seed)",
    )
    parser.add_argument(
        "--rows-only", action="store_true", help="stop the ingest when the index build starts"
    )
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="kbpg-load-", dir="/tmp"))
    home.chmod(0o755)
    records = args.records or home / "records.jsonl"
    if not records.exists():
        t = time.perf_counter()
        write_records(records, args.chunks, args.seed)
        size_mb = records.stat().st_size / 2**20
        print(
            f"wrote {args.chunks:,} records ({size_mb:.0f} MB) in {time.perf_counter() - t:.0f} s"
        )
    server = EmbeddedServer(home / "pg", durable=False)
    try:
        admin = server.start()
        url = admin.rsplit("/", 1)[0] + "/bench?" + admin.split("?", 1)[1]
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench")
        kdb.upgrade(url)
        env = dict(os.environ, KBPG_DATABASE_URL=url)
        kbpg = str(Path(sys.executable).parent / "kbpg")
        started = time.perf_counter()
        proc = subprocess.Popen(
            [kbpg, "ingest", str(records), "--json"]
            + (["--batch-size", str(args.batch_size)] if args.batch_size else []),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        peaks = {"kbpg": 0, "server": 0}
        index_started: list[float] = []
        cpu_at_index: list[float] = []
        server_cpu: dict[int, float] = {}  # the latest reading per server process
        stderr_lines: list[str] = []
        first_batch: list[tuple[float, int]] = []

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                stderr_lines.append(line)
                match = re.match(r"ingest: \d+ documents, (\d+) chunks", line)
                if match and not first_batch:  # start-up over: the first batch is written
                    first_batch.append((time.perf_counter(), int(match.group(1))))
                print("  " + line.rstrip()[-150:], flush=True)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        client_cpu = 0.0
        client_cpu_at_index: list[float] = []
        # the rows are in when the index build starts (seen in pg_stat_progress_create_index)
        watch = psycopg.connect(url, autocommit=True)
        while proc.poll() is None:
            pids = server_pids(home / "pg")  # backends and workers come and go
            peaks["kbpg"] = max(peaks["kbpg"], rss_kb([proc.pid]))
            peaks["server"] = max(peaks["server"], rss_kb(pids))
            for pid in pids:
                server_cpu[pid] = max(server_cpu.get(pid, 0.0), cpu_s(pid))
            client_cpu = max(client_cpu, cpu_s(proc.pid))
            if not index_started and watch.execute(INDEX_BUILDING).fetchone() == (True,):
                index_started.append(time.perf_counter())
                cpu_at_index.append(sum(server_cpu.values()))
                client_cpu_at_index.append(client_cpu)
                if args.rows_only:
                    proc.send_signal(signal.SIGINT)
                    proc.wait()
                    break
            time.sleep(0.25)
        watch.close()
        total_s = time.perf_counter() - started
        reader.join(timeout=5)
        assert proc.stdout is not None
        summary = None if args.rows_only else json.loads(proc.stdout.read())
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "select count(*), (select layout from kb.embedding_space),"
                " pg_relation_size(to_regclass('kb_data.chunks_embedding_hnsw')) from kb.chunks"
            ).fetchone()
        assert row is not None
        index = f"{row[1]} index {row[2] / 2**20:.0f} MB" if row[2] is not None else "no index"
        print(
            f"\n{row[0]:,} chunks, {index};"
            f" kbpg ingest {total_s:.0f} s in all ({args.chunks / total_s:,.0f} chunks/s)"
        )
        if index_started:
            rows_s = index_started[0] - started
            print(
                f"rows in {rows_s:.0f} s ({args.chunks / rows_s:,.0f} chunks/s, model not run),"
                f" index build from {rows_s:.0f} s on (~{total_s - rows_s:.0f} s incl. the"
                " lexical cache)"
            )
            if first_batch and index_started[0] > first_batch[0][0]:
                at, done = first_batch[0]
                print(
                    f"steady load rate (first batch written to index build, start-up left out):"
                    f" {(args.chunks - done) / (index_started[0] - at):,.0f} chunks/s"
                )
        db_cpu = sum(server_cpu.values())
        print(
            f"CPU: kbpg {client_cpu:.0f} s, PostgreSQL {db_cpu:.0f} s (sampled every 0.5 s) ->"
            f" {args.chunks / db_cpu:,.0f} chunks per PostgreSQL CPU-second,"
            f" {args.chunks / client_cpu:,.0f} per kbpg CPU-second (on a shared machine the"
            " wall-clock rates above measure the neighbours too)"
        )
        if cpu_at_index:
            print(
                f"CPU before the index build: PostgreSQL {cpu_at_index[0]:.1f} s"
                f" ({args.chunks / max(cpu_at_index[0], 0.01):,.0f} chunks per CPU-second),"
                f" kbpg {client_cpu_at_index[0]:.1f} s (start-up included); from it on"
                f" PostgreSQL {db_cpu - cpu_at_index[0]:.0f} s"
            )
        split = (
            f"kbpg's own split (s): {summary['seconds']};" if summary else "stopped at the build;"
        )
        print(
            f"{split}"
            f" peak RSS kbpg {peaks['kbpg'] / 1024:.0f} MB,"
            f" PostgreSQL processes (sum) {peaks['server'] / 1024:.0f} MB"
        )
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
