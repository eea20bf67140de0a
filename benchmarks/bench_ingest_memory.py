"""Peak memory (RSS) of `kbpg ingest` on one large text file (not a test; prints numbers).

A throwaway embedded PostgreSQL (temp dir) is migrated; a text file of --mb megabytes of
English-like prose is written (sentences of 8-20 words from a 20k-word Zipfian vocabulary,
paragraphs of 3-7 sentences drawn from a pool of 4,000; no headings: one section, the worst
case for the chunker); then the real `kbpg ingest FILE --max-file-size ...` runs as a child
process and its peak RSS is read from the kernel (wait4's ru_maxrss), with the wall time and
the chunks written. Target (issue 14): under 1 GB for 50 MB.

A small file (--baseline-mb) is ingested first the same way: its peak is what does not grow
with the file (interpreter, libraries, the model, one slice of chunks in flight), and the
difference to the big file's peak, divided by the difference in size, what does (MB per MB of
text); both are printed, with the estimate for 50 MB when --mb is another size.

50 MB of prose is ~100k chunks: MiniLM embeds ~10-30 a second on 2 shared cores (hours), so
by default the vectors come from a local OpenAI-compatible stub server (deterministic hashed
vectors, in this process, not measured) and the run measures what grows with the file: text,
chunks, vectors, COPY. `--embedder minilm` measures the real model too, at a size that
finishes (its baseline is the model's constant; the slope should be the stub run's).

    python benchmarks/bench_ingest_memory.py                          # 50 MB, stub vectors
    python benchmarks/bench_ingest_memory.py --mb 4 --embedder minilm # the real model
    python benchmarks/bench_ingest_memory.py --shape headings --mb 4  # structure, not size

`--shape` measures the structures that cost more than their bytes: a Markdown file of only
headings (markdown-it's tokens, ~4 a line, were ~400 bytes per byte: 1.2 MB took 557 MB), a
heading and a word per section (a section and a chunk each), one long list, HTML nested as
deep as the size allows (BeautifulSoup's tree: 8.8 MB took 979 MB) and flat HTML paragraphs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

KBPG = str(Path(sys.executable).parent / "kbpg")


def write_prose(path: Path, megabytes: float, seed: int) -> int:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ru", "te", "so", "van", "dre", "pul", "nix", "bor", "gel"]
    common = [
        "the",
        "of",
        "and",
        "to",
        "a",
        "in",
        "is",
        "it",
        "that",
        "for",
        "on",
        "was",
        "with",
        "as",
        "be",
        "by",
        "at",
        "this",
        "are",
        "from",
        "or",
        "have",
        "an",
        "which",
        "one",
        "you",
        "were",
        "all",
        "we",
        "can",
        "her",
        "has",
        "there",
        "been",
        "if",
        "more",
        "when",
        "will",
        "would",
        "who",
        "so",
        "no",
    ]
    rare = ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(20000)]
    weights = [1.0 / (rank + 1) for rank in range(len(rare))]
    paragraphs = []
    for _ in range(4000):  # a pool of paragraphs, drawn in random order (fast to write)
        sentences = []
        for _ in range(rng.randint(3, 7)):
            words = [
                rng.choice(common) if rng.random() < 0.45 else w
                for w in rng.choices(rare, weights, k=rng.randint(8, 20))
            ]
            sentences.append(" ".join(words).capitalize() + ".")
        paragraphs.append(" ".join(sentences) + "\n\n")
    target = int(megabytes * 1_000_000)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            paragraph = rng.choice(paragraphs)
            out.write(paragraph)
            written += len(paragraph)
    return path.stat().st_size


def write_shape(path: Path, shape: str, megabytes: float, seed: int) -> int:
    """A file of the given shape, about `megabytes` large: the structures that cost a parser or
    the chunker more than their bytes (`prose` is write_prose)."""
    if shape == "prose":
        return write_prose(path, megabytes, seed)
    target = int(megabytes * 1_000_000)
    with path.open("w", encoding="utf-8") as out:
        written = 0
        i = 0
        if shape == "nested-html":
            depth = max(1, (target - 100) // 11)  # "<div>" + "</div>"
            out.write("<html><body>" + "<div>" * depth + "<p>Treasure at the bottom.</p>")
            out.write("</div>" * depth + "</body></html>")
        else:
            unit = {
                "headings": "# h\n",  # nothing but headings: no text to index at all
                "tiny-sections": "# h{i}\nword{i}\n",  # a section per heading, a word each
                "list": "- item {i}\n",  # one list, no blank line: no place to cut it
                "flat-html": "<p>para {i}</p>\n",
            }[shape]
            if shape == "flat-html":
                out.write("<html><body>\n")
            while written < target:
                line = unit.format(i=i)
                out.write(line)
                written += len(line)
                i += 1
            if shape == "flat-html":
                out.write("</body></html>\n")
    return path.stat().st_size


SUFFIX = {"prose": ".txt", "headings": ".md", "tiny-sections": ".md", "list": ".md",
          "nested-html": ".html", "flat-html": ".html"}  # fmt: skip


class StubEmbeddings(BaseHTTPRequestHandler):
    """`POST /v1/embeddings`: a unit 384-d vector per text, seeded by the text's CRC."""

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = []
        for index, text in enumerate(payload["input"]):
            vector = np.random.default_rng(zlib.crc32(text.encode())).standard_normal(384)
            data.append({"index": index, "embedding": (vector / np.linalg.norm(vector)).tolist()})
        body = json.dumps({"object": "list", "data": data, "model": payload["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def start_stub_embeddings(env: dict[str, str]) -> ThreadingHTTPServer:
    """StubEmbeddings served from a thread on 127.0.0.1, and `env` (kbpg's) pointed at it."""
    stub = ThreadingHTTPServer(("127.0.0.1", 0), StubEmbeddings)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    env.update(
        KBPG_EMBEDDER="openai",
        KBPG_OPENAI_BASE_URL=f"http://127.0.0.1:{stub.server_address[1]}/v1",
        KBPG_OPENAI_MODEL="stub-384",
    )
    return stub


def ingest(source: Path, env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """Run `kbpg ingest source` as a child: (peak RSS in MB, wall seconds, its JSON summary)."""
    size = source.stat().st_size
    command = [KBPG, "ingest", str(source), "--max-file-size", str(size), "--json"]
    print("$ " + " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
    except BaseException:
        child.kill()
        child.wait()
        raise
    elapsed = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    summary = json.loads(output) if output.strip() else {}
    if code != 0 and not summary.get("failures"):
        raise SystemExit(f"kbpg ingest exited {code}")
    for failure in summary.get("failures", []):  # refused (e.g. no text to index): measured too
        print(f"  refused: {failure['reason']}", flush=True)
    return usage.ru_maxrss * 1024 / 1e6, elapsed, summary  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the text file in MB")
    parser.add_argument(
        "--baseline-mb",
        type=float,
        default=0.05,
        help="size of a first, small file whose ingest measures what does not grow with the file",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--embedder", choices=["stub", "minilm"], default="stub")
    parser.add_argument(
        "--shape",
        choices=list(SUFFIX),
        default="prose",
        help="the file's structure: prose (.txt), Markdown of only headings, of a heading and a "
        "word per section, one long list, HTML nested as deep as the size allows, or flat "
        "HTML paragraphs",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # run finally

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
        env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
        env.update(KBPG_DATABASE_URL=url, KBPG_HOME=str(home / "home"), ORT_DISABLE_TELEMETRY="1")
        if args.embedder == "stub":
            start_stub_embeddings(env)  # a daemon thread: it ends with this process
        print(f"embedder: {args.embedder}", flush=True)
        small = home / ("small" + SUFFIX[args.shape])
        small_size = write_shape(small, args.shape, args.baseline_mb, args.seed + 1)
        base_mb, _, base = ingest(small, env)
        print(
            f"baseline: {small_size:,} bytes, {base.get('chunks', 0):,} chunks,"
            f" peak RSS {base_mb:,.0f} MB"
        )
        source = home / ("big" + SUFFIX[args.shape])
        size = write_shape(source, args.shape, args.mb, args.seed)
        print(f"{args.shape} file: {size:,} bytes ({size / 1e6:.1f} MB)", flush=True)
        peak_mb, elapsed, summary = ingest(source, env)
        seconds = summary.get("seconds", {})
        print(
            f"chunks: {summary.get('chunks', 0):,} in {elapsed:.0f} s "
            f"(prepare {seconds.get('prepare', 0):.0f} s, "
            f"embedding {seconds.get('embedding', 0):.0f} s, "
            f"database {seconds.get('database', 0):.0f} s)"
        )
        print(
            f"peak RSS of kbpg ingest: {peak_mb:,.0f} MB "
            f"({peak_mb / (size / 1e6):.1f}x the file; target < 1,000 MB for 50 MB)"
        )
        slope = (peak_mb - base_mb) / ((size - small_size) / 1e6)
        print(
            f"composition: {base_mb:,.0f} MB that does not grow with the file (the baseline) "
            f"+ {slope:.2f} MB per MB of text"
        )
        if abs(size / 1e6 - 50) > 0.5:
            print(
                f"estimate for 50 MB with {args.embedder}: {base_mb + 50 * slope:,.0f} MB "
                f"(baseline + 50 x slope)"
            )
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
