"""Peak memory (RSS) of `kbpg ingest` on one large text file (not a test; prints numbers).

A throwaway embedded PostgreSQL (temp dir) is migrated; a text file of --mb megabytes of
English-like prose (sentences of 8-20 words from a 20k-word Zipfian vocabulary, paragraphs of
3-7 sentences, no headings: one section, the worst case for the chunker) is written; then the
real `kbpg ingest FILE --max-file-size ...` runs as a child process with the real MiniLM and
its peak RSS is read from the kernel (wait4's ru_maxrss), with the wall time and the chunks
written. Target (issue 14): under 1 GB for 50 MB.

    python benchmarks/bench_ingest_memory.py            # 50 MB, ~10-20 min on 2 shared cores
    python benchmarks/bench_ingest_memory.py --mb 5     # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from kbpg import db as kdb
from kbpg.server import EmbeddedServer

KBPG = str(Path(sys.executable).parent / "kbpg")


def write_prose(path: Path, megabytes: float, seed: int) -> int:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ru", "te", "so", "van", "dre", "pul", "nix", "bor", "gel"]
    common = (
        "the of and to a in is it that for on was with as be by at this are from or have an "
        "which one you were all we can her has there been if more when will would who so no"
    ).split()
    rare = ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(20000)]
    weights = [1.0 / (rank + 1) for rank in range(len(rare))]
    target = int(megabytes * 1_000_000)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            sentences = []
            for _ in range(rng.randint(3, 7)):
                words = [
                    rng.choice(common) if rng.random() < 0.45 else w
                    for w in rng.choices(rare, weights, k=rng.randint(8, 20))
                ]
                sentences.append(" ".join(words).capitalize() + ".")
            paragraph = " ".join(sentences) + "\n\n"
            out.write(paragraph)
            written += len(paragraph)
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the text file in MB")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-mem-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        url = admin.rsplit("/", 1)[0] + "/bench?" + admin.split("?", 1)[1]
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("drop database if exists bench")
            conn.execute("create database bench")
        kdb.upgrade(url)
        source = home / "big.txt"
        size = write_prose(source, args.mb, args.seed)
        print(f"text file: {size:,} bytes ({size / 1e6:.1f} MB)", flush=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
        env.update(KBPG_DATABASE_URL=url, KBPG_HOME=str(home / "home"), ORT_DISABLE_TELEMETRY="1")
        command = [KBPG, "ingest", str(source), "--json"]
        if size > 20 * 1024 * 1024:  # the default limit
            command[3:3] = ["--max-file-size", str(size)]
        print("$ " + " ".join(command[1:]), flush=True)
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        peak_mb = usage.ru_maxrss * 1024 / 1e6  # Linux reports KiB
        if child.returncode != 0:
            raise SystemExit(f"kbpg ingest exited {child.returncode}")
        summary = json.loads(output)
        print(
            f"chunks: {summary['chunks']:,} in {elapsed:.0f} s "
            f"(embedding {summary['seconds']['embedding']:.0f} s, "
            f"database {summary['seconds']['database']:.0f} s)"
        )
        print(
            f"peak RSS of kbpg ingest: {peak_mb:,.0f} MB "
            f"({peak_mb / (size / 1e6):.1f}x the file; target < 1,000 MB for 50 MB)"
        )
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
