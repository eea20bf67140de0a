"""Benchmark the lexical arm on a knowledge base whose chunk ids grew by re-ingests (prints numbers).

Re-ingesting a changed document deletes its chunks and inserts them anew, with new ids, so a
knowledge base in long use holds its chunks in a small part of a wide id range. This loads NPL's
11,429 abstracts (one chunk each) with ids from --id-offset + 1 (default 5,000,000: years of
re-ingests), refreshes the impact cache, and times kb.search_lexical (pool 32) on NPL's 93
queries against REV's functions (--before, in schema kb_before, query by query interleaved),
checking that both rank the same ids.

    python benchmarks/bench_reingested_ids.py --before 6b4bfd8~1
    python benchmarks/bench_reingested_ids.py --before 6b4bfd8~1 --id-offset 0   # dense ids
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import POOL, database_url, install_before, log, timed_both

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

NPL = Path(__file__).resolve().parents[2] / "shared" / "ir" / "npl"


def load(conn: psycopg.Connection[Any], npl: Path, id_offset: int) -> None:
    """NPL's abstracts as one chunk each, chunk ids from id_offset + 1; the cache refreshed."""
    if id_offset:
        conn.execute("select setval('kb.chunks_id_seq', %s)", (id_offset,))
    docs = [json.loads(line) for line in (npl / "corpus.jsonl").open()]
    with conn.cursor() as cur:
        with cur.copy("copy kb_data.documents (source, title, content_hash) from stdin") as copy:
            for doc in docs:
                copy.write_row((f"npl-{doc['_id']}", doc["title"] or doc["_id"], "h"))
        ids = [r[0] for r in cur.execute("select id from kb.documents order by id")]
        with cur.copy("copy kb_data.chunks (document_id, ordinal, content) from stdin") as copy:
            for doc_id, doc in zip(ids, docs, strict=True):
                copy.write_row((doc_id, 0, doc["text"]))
    conn.execute("select kb.refresh_lexical_index()")
    conn.execute("vacuum analyze kb_data.chunks")
    conn.execute("vacuum analyze kb_data.lexical_blocks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, metavar="REV", help="the baseline's commit")
    parser.add_argument("--id-offset", type=int, default=5_000_000)
    parser.add_argument("--npl", type=Path, default=NPL, help="NPL in BEIR layout")
    args = parser.parse_args()
    queries = [json.loads(line)["text"] for line in (args.npl / "queries.jsonl").open()]

    home = Path(tempfile.mkdtemp(prefix="kbpg-bench-ids-", dir="/tmp"))
    home.chmod(0o755)
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        url = database_url(admin, "bench")
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("create database bench")
        kdb.upgrade(url)
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            load(conn, args.npl, args.id_offset)
            row = conn.execute(
                "select min(c.id), max(c.id), count(*),"
                " (select count(distinct block_no) from kb.lexical_blocks),"
                " (select block_size from kb.lexical_state) from kb.chunks c"
            ).fetchone()
            assert row is not None
            low, high, chunks, blocks, size = row
            log(
                f"{chunks:,} chunks, ids {low:,}-{high:,}: {high // size + 1:,} blocks of"
                f" {size:,} ids up to the last, {blocks} holding chunks"
            )
            install_before(conn, args.before)
            target = {"kb": "kb"}

            def search(query: str) -> list[Any]:
                sql = f"select chunk_id from {target['kb']}.search_lexical(%s, {POOL})"
                return conn.execute(sql.encode(), (query,)).fetchall()

            for query in queries[:10]:  # warm both
                search(query)
            (b50, b95, before), (n50, n95, now), ratio = timed_both(search, queries, target)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    same = sum(a == b for a, b in zip(before, now, strict=True))
    log(f"kb.search_lexical (pool {POOL}), {len(queries)} NPL queries, p50 / p95 ms:")
    log(f"  {args.before:>12}  {b50:6.2f} / {b95:6.2f}")
    log(f"  {'now':>12}  {n50:6.2f} / {n95:6.2f}   now/before per query (median) {ratio:.3f}")
    log(f"  identical ranked ids: {same}/{len(queries)}")


if __name__ == "__main__":
    main()
