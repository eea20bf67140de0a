"""Benchmark kb.search and each arm on a synthetic 200k-chunk corpus (not a test; prints numbers).

A throwaway embedded PostgreSQL (temp dir) is loaded with chunks whose words are drawn from the
NPL collection's unigram distribution (Zipfian, with frequent content words) and 384-d clustered
unit vectors; HNSW and GIN are built after the load and the BM25 impact cache is refreshed.
Then, in one run and on the same queries, it times (wall clock per call over the unix socket,
prepared statements off so every call is planned like a psql call):

  kb.search (hybrid, lexical-only, a 1%-group filter paired with the same with the filter
  value caches off, a 1% filter by group and category paired with the same with the filter
  bitmaps off, a 1% metadata filter on an indexed key paired with the group filter keeping the
  same chunks and with the same key not indexed),
  kb.search_vector, kb.search_lexical (impact
  cache) and its bulk step alone (the block sums), the same BM25 without the cache
  (exhaustive), a ts_rank_cd OR-query arm, and client-side fusion (plain HNSW query +
  ts_rank_cd query + RRF in Python); then the cached BM25 against the exhaustive one and the
  vector arm's recall against an exact scan. Caches are warmed first with other queries.

    python benchmarks/bench_search.py                 # 200k chunks, ~6 min on 2 cores
    python benchmarks/bench_search.py --chunks 20000  # quick look
    python benchmarks/bench_search.py --keep /tmp/kbpg-bench  # keep the loaded server; a later
        # run with the same --keep reuses it (re-applies sql/ with kbpg.db.upgrade, no reload)
    python benchmarks/bench_search.py --keep /tmp/kbpg-bench --only search_lexical,without
    python benchmarks/bench_search.py --keep /tmp/kbpg-bench --before main~3 --only kb.search
        # REV's functions and today's, query by query back to back, and how often they agree
    python benchmarks/bench_search.py --keep /tmp/kbpg-bench --refresh-docs 1,100
        # the cache's refresh after an ingest of 1 and 100 documents (rolled back)
    python benchmarks/bench_search.py --keep /tmp/kbpg-bench --cold --repeat 2
        # a restarted server's first searches, then the same again warm (--drop-os-cache: as
        # after a reboot; --kb-prewarm: after kb.prewarm()); --repeat prints the spread
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from kbpg.store import db as kdb
from kbpg.store import indexing
from kbpg.store.embedded import EmbeddedServer

NPL = Path(__file__).resolve().parent.parent.parent / "shared" / "ir" / "npl"
DIM = 384
POOL = 32  # match_count 8 x fetch_multiplier 4, what kb.search fetches per arm
RRF_K = 60


def log(message: str) -> None:
    print(message, flush=True)


def word_distribution(rng: random.Random) -> tuple[list[str], np.ndarray, list[str]]:
    """Words and probabilities from NPL (or a synthetic Zipf law), plus NPL's real queries."""
    counts: Counter[str] = Counter()
    queries: list[str] = []
    if (NPL / "corpus.jsonl").exists():
        with (NPL / "corpus.jsonl").open() as f:
            for line in f:
                counts.update(json.loads(line)["text"].split())
        with (NPL / "queries.jsonl").open() as f:
            queries = [json.loads(line)["text"] for line in f]
    else:
        syllables = ["ka", "lo", "mi", "ru", "te", "so", "van", "dre", "pul", "nix", "bor", "gel"]
        for rank in range(20000):
            word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) + str(rank)
            counts[word] = int(1e6 / (rank + 1))
        queries = [" ".join(rng.choices(list(counts), k=6)) for _ in range(93)]
    words = list(counts)
    freq = np.array([counts[w] for w in words], dtype=np.float64)
    return words, freq / freq.sum(), queries


def metadata(d: int) -> str:
    """Document d's metadata (JSON): its product p{d % 100} (the same 1% of the documents as
    group g{d % 100}), a year and a nested author, as front matter gives them."""
    return json.dumps(
        {"product": f"p{d % 100}", "year": 2000 + d % 25, "author": {"name": f"a{d % 37}"}}
    )


def load(
    conn: psycopg.Connection[Any],
    url: str,
    n_chunks: int,
    seed: int,
    n_groups: int = 100,
    layout: str | None = None,
    grouped: bool = False,
    assign: Callable[[int], tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Documents of 10 chunks, document d in category cat{d % 10} and group g{d % n_groups}
    (interleaved: every id range holds every group) or, `grouped`, each group's documents
    loaded together (as when each group's folder is ingested on its own); `assign` gives
    document d's (group, category) instead."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    words, probs, npl_queries = word_distribution(rng)
    n_docs = max(1, n_chunks // 10)

    def labels(d: int) -> tuple[str, str]:
        if assign is not None:
            return assign(d)
        return (f"g{d * n_groups // n_docs}" if grouped else f"g{d % n_groups}", f"cat{d % 10}")

    centroids = nrng.normal(size=(500, DIM)).astype(np.float32)
    conn.execute("select kb.set_embedding_space('bench-384', %s, %s)", (DIM, layout))
    # indexes are built after the load: far faster than maintaining them row by row
    conn.execute("drop index kb_data.chunks_embedding_hnsw")
    conn.execute("drop index kb_data.chunks_tsv_gin")
    conn.commit()

    started = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy(
            "copy kb_data.documents (source, title, category, groups, metadata, content_hash) from stdin"
        ) as copy:
            for d in range(n_docs):
                group, category = labels(d)
                copy.write_row((f"doc-{d}", f"Document {d}", category, [group], metadata(d), "h"))
        doc_ids = [r[0] for r in cur.execute("select id from kb.documents order by id")]
    conn.commit()

    lengths = nrng.integers(30, 121, size=n_chunks)
    batch = 20000
    for start in range(0, n_chunks, batch):
        stop = min(n_chunks, start + batch)
        drawn = nrng.choice(len(words), size=int(lengths[start:stop].sum()), p=probs)
        vectors = centroids[nrng.integers(0, len(centroids), size=stop - start)]
        vectors = vectors + nrng.normal(scale=0.9, size=vectors.shape).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        offset = 0
        with (
            conn.cursor() as cur,
            cur.copy(
                "copy kb_data.chunks (document_id, ordinal, content, groups, category, embedding)"
                " from stdin with (format binary)"
            ) as copy,
        ):
            copy.set_types(["int8", "int4", "text", "text[]", "text", "vector"])
            for i in range(start, stop):
                n = int(lengths[i])
                text = " ".join(words[j] for j in drawn[offset : offset + n])
                offset += n
                group, category = labels(i // 10)
                copy.write_row(
                    (doc_ids[i // 10], i % 10, text, [group], category, vectors[i - start])
                )
        conn.commit()
        log(f"  loaded {stop:,} chunks ({time.perf_counter() - started:.0f} s)")
    timings: dict[str, Any] = {"load_s": time.perf_counter() - started}
    build_indexes(conn, url, timings)

    # frequent content words: the most common words that are not stopwords
    frequent: list[tuple[str, float]] = []
    n_total = n_chunks
    for w in [words[i] for i in np.argsort(-probs)[:200]]:
        row = conn.execute(
            "select s.doc_freq from kb.lexeme_stats s"
            " where s.lexeme = any (tsvector_to_array(to_tsvector('english', %s)))",
            (w,),
        ).fetchone()
        if row is not None:
            frequent.append((w, row[0] / n_total))
        if len(frequent) == 30:
            break
    timings["frequent_words"] = frequent
    timings["npl_queries"] = npl_queries
    timings["centroids"] = centroids
    return timings


def relation_size(name: str) -> str:
    """SQL for a kb relation's total size, pretty; a partitioned table's or index's is the sum
    of its partitions' (its own is 0)."""
    return (
        f"pg_size_pretty(greatest(pg_total_relation_size('{name}'),"
        f" (select sum(pg_total_relation_size(t.relid)) from pg_partition_tree('{name}') t)))"
    )


def build_indexes(conn: psycopg.Connection[Any], url: str, timings: dict[str, Any]) -> None:
    """GIN on tsv, the space's HNSW index (as kbpg builds it after a first load) and the BM25
    impact cache, timed into `timings`, then VACUUM ANALYZE; leaves conn in autocommit."""
    conn.execute("set maintenance_work_mem = '1GB'")
    conn.execute("set max_parallel_maintenance_workers = 1")
    t = time.perf_counter()
    conn.execute("create index chunks_tsv_gin on kb_data.chunks using gin (tsv)")
    conn.commit()
    timings["gin_s"] = time.perf_counter() - t
    # the index of the space's layout (vector, halfvec or binary: sql/010), built as kbpg builds
    # it after a first load: memory and workers sized to the machine, progress shown
    conn.autocommit = True
    last = [0.0]

    def progress(p: indexing.IndexProgress) -> None:
        if p.elapsed_s - last[0] >= 30:
            last[0] = p.elapsed_s
            log(f"  {p.describe()}")

    _, timings["hnsw_s"] = indexing.set_layout(conn, url, progress=progress)
    conn.autocommit = False
    conn.execute("set local track_functions = 'all'")
    t = time.perf_counter()
    conn.execute("select kb.refresh_lexical_index()")
    timings["filter_caches_s"] = filter_caches_seconds(conn)
    conn.commit()
    timings["lexical_cache_s"] = time.perf_counter() - t
    conn.autocommit = True
    conn.execute("vacuum analyze kb_data.chunks")
    conn.execute("analyze")
    names = (
        "kb_data.lexical_blocks",
        "kb_data.chunks_embedding_hnsw",
        "kb_data.chunks_tsv_gin",
        "kb_data.lexical_filter_blocks",
    )
    size = conn.execute("select " + ", ".join(relation_size(n) for n in names)).fetchone()
    assert size is not None
    timings["sizes"] = {
        "lexical_blocks": size[0],
        "hnsw": size[1],
        "gin": size[2],
        "filter_value_caches": size[3],
    }


def filter_caches_seconds(conn: psycopg.Connection[Any]) -> float:
    """The time this transaction's kb.refresh_lexical_index calls spent on the filter values'
    own caches (pg_stat_xact_user_functions: counted while `track_functions` is 'all')."""
    row = conn.execute(
        "select coalesce(sum(total_time), 0) from pg_stat_xact_user_functions"
        " where schemaname = 'kb' and funcname = '_refresh_filter_cache'"
    ).fetchone()
    return float(row[0]) / 1000 if row else 0.0


def time_refresh(conn: psycopg.Connection[Any], documents: int, rounds: int = 3) -> None:
    """kb.refresh_lexical_index after `documents` new documents of 10 chunks (copies of
    existing chunks' text and vectors) spread over the groups, each round rolled back: the
    whole refresh and the filter values' caches' part of it."""
    groups = conn.execute(
        "select count(distinct value) from kb.lexical_filter_masks where filter_kind = 'group'"
    ).fetchone()
    n_groups = max(1, int(groups[0]) if groups else 1)
    totals, caches = [], []
    for round_no in range(rounds):
        with conn.transaction(force_rollback=True):
            conn.execute("set local track_functions = 'all'")
            for d in range(documents):
                group, category = f"g{(d * 37 + round_no) % n_groups}", f"cat{d % 10}"
                row = conn.execute(
                    "insert into kb.documents (source, title, category, groups, content_hash)"
                    " values (%s, 'refresh timing', %s, %s, 'h') returning id",
                    (f"refresh-{round_no}-{d}", category, [group]),
                ).fetchone()
                assert row is not None
                conn.execute(
                    "insert into kb.chunks (document_id, ordinal, content, groups, category,"
                    " embedding) select %s, o, c.content, %s, %s, c.embedding from kb.chunks c"
                    " join generate_series(0, 9) o on c.id = 1000 * (%s + 1) + 7 * o",
                    (row[0], [group], category, d),
                )
            started = time.perf_counter()
            conn.execute("select kb.refresh_lexical_index()")
            totals.append(time.perf_counter() - started)
            caches.append(filter_caches_seconds(conn))
    log(
        f"refresh after {documents} new documents over {min(documents, n_groups)} groups"
        f" (load average {load_average()}): "
        + ", ".join(
            f"{t:.2f} s (value caches {c:.2f})" for t, c in zip(totals, caches, strict=True)
        )
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn: Callable[[Any], Any], items: Sequence[Any]) -> tuple[float, float, list[Any]]:
    out: list[Any] = []
    times: list[float] = []
    for item in items:
        t = time.perf_counter()
        out.append(fn(item))
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), percentile(times, 0.95), out


# the variants that call kb's arms, timed before and after with --before
COMPARED = {
    "kb.search hybrid (text + embedding)",
    "kb.search lexical only (NULL embedding)",
    "kb.search hybrid, 1% group filter",
    "kb.search hybrid, 1% group + category filter",
    "kb.search_vector (pool 32)",
    "kb.search_lexical BM25 (pool 32)",
    "BM25 without the impact cache",
}


def interleaved(
    fns: Sequence[Callable[[Any], Any]], items: Sequence[Any]
) -> list[tuple[list[float], list[Any]]]:
    """Every fn on every item, one right after the other (the first item in the order given,
    the next reversed, ...), so that a shared machine's load falls on all alike: per fn, the
    times (ms) and results, item by item."""
    runs: list[tuple[list[float], list[Any]]] = [([], []) for _ in fns]
    for i, item in enumerate(items):
        order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
        for k in order:
            t = time.perf_counter()
            runs[k][1].append(fns[k](item))
            runs[k][0].append((time.perf_counter() - t) * 1000)
    return runs


def timed_pair(
    baseline: Callable[[Any], Any], fn: Callable[[Any], Any], items: Sequence[Any]
) -> tuple[tuple[float, float, list[Any]], tuple[float, float, list[Any]], float]:
    """baseline and fn on every item, interleaved: each one's p50, p95 (ms) and results, and the
    median over the items of fn / baseline (paired, so steadier than the ratio of two medians)."""
    base, now = interleaved([baseline, fn], items)
    return (
        (statistics.median(base[0]), percentile(base[0], 0.95), base[1]),
        (statistics.median(now[0]), percentile(now[0], 0.95), now[1]),
        statistics.median(a / b for a, b in zip(now[0], base[0], strict=True)),
    )


def timed_both(
    fn: Callable[[Any], Any], items: Sequence[Any], target: dict[str, str]
) -> tuple[tuple[float, float, list[Any]], tuple[float, float, list[Any]], float]:
    """timed_pair of fn in schema kb_before (the baseline) and in kb."""

    def in_schema(schema: str) -> Callable[[Any], Any]:
        def call(item: Any) -> Any:
            target["kb"] = schema
            return fn(item)

        return call

    try:
        return timed_pair(in_schema("kb_before"), in_schema("kb"), items)
    finally:
        target["kb"] = "kb"


# the searches two setups of the same corpus are paired on (bench_kb_views.py, bench_schema_pair.py):
# (name, SQL with {s} for the schema of kb's functions, %(t)s the query text, %(e)s its embedding)
PAIRED_CALLS: list[tuple[str, str]] = [
    ("kb.search hybrid", "select chunk_id from {s}.search(%(t)s, %(e)s, 8)"),
    ("kb.search lexical only", "select chunk_id from {s}.search(%(t)s, null, 8)"),
    (
        "kb.search hybrid, 1% group",
        "select chunk_id from {s}.search(%(t)s, %(e)s, 8, groups => '{{g7}}')",
    ),
    (
        "kb.search hybrid, 1% group + category",
        "select chunk_id from {s}.search(%(t)s, %(e)s, 8, groups => '{{g7}}', category => 'cat7')",
    ),
    ("kb.search_vector", f"select chunk_id from {{s}}.search_vector(%(e)s, {POOL})"),
    (
        "kb.search_vector, 1% group",
        f"select chunk_id from {{s}}.search_vector(%(e)s, {POOL}, groups => '{{{{g7}}}}')",
    ),
    ("kb.search_lexical", f"select chunk_id from {{s}}.search_lexical(%(t)s, {POOL})"),
    (
        "kb.search_lexical, 1% group",
        f"select chunk_id from {{s}}.search_lexical(%(t)s, {POOL}, groups => '{{{{g7}}}}')",
    ),
]


def vector_schema(conn: psycopg.Connection[Any]) -> str:
    """The schema pgvector is installed in, quoted (kbpg.store.db.vector_schema's, over psycopg)."""
    row = conn.execute(
        "select quote_ident(n.nspname) from pg_extension e"
        " join pg_namespace n on n.oid = e.extnamespace where e.extname = 'vector'"
    ).fetchone()
    assert row is not None
    return str(row[0])


def sql_function_names(texts: Sequence[str]) -> set[str]:
    """The names of the kb functions the sql/ texts define."""
    return set(re.findall(r"create or replace function kb\.(\w+)", "\n".join(texts)))


def install_before(conn: psycopg.Connection[Any], rev: str) -> None:
    """REV's search functions (sql/010-070) in schema kb_before, their calls to one another
    renamed; they read today's kb tables."""
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent)]
    names = subprocess.run(
        [*git, "ls-tree", "--name-only", rev, "sql/"], capture_output=True, text=True, check=True
    ).stdout.split()
    texts = [
        subprocess.run(
            [*git, "show", f"{rev}:{name}"], capture_output=True, text=True, check=True
        ).stdout
        for name in sorted(names)
        if re.match(r"sql/0[1-7]\d-", name)
    ]
    defined = sql_function_names(texts)
    calls = re.compile(r"\bkb\.(" + "|".join(sorted(defined, key=len, reverse=True)) + r")\b")
    vector = vector_schema(conn)
    with conn.transaction():
        conn.execute("drop schema if exists kb_before cascade")
        conn.execute("create schema kb_before")
        conn.execute("set local search_path = pg_catalog, pg_temp")
        for text in texts:
            sql = calls.sub(r"kb_before.\1", text.replace(kdb.EXTSCHEMA_VECTOR, vector))
            conn.execute(sql.encode())
    log(f"{rev}'s functions ({len(defined)}) installed in schema kb_before")


def exact_neighbours(
    conn: psycopg.Connection[Any], embedding: np.ndarray, category: str | None = None
) -> set[int]:
    """The true top-POOL chunk ids by cosine distance (a sequential scan, no HNSW), above the
    vector arm's default similarity floor (0.30) as the arm's own answer is; of one category."""
    with conn.transaction():
        conn.execute("set local enable_indexscan = off")
        rows = conn.execute(
            "select s.id from (select id, embedding <=> %s as distance from kb.chunks"
            " where %s::text is null or category = %s order by 2, id limit %s) s"
            " where 1 - s.distance >= 0.30",
            (embedding, category, category, POOL),
        ).fetchall()
    return {r[0] for r in rows}


TS_RANK_CD = """
with q as (select kb._lexemes_tsquery(t.terms) as q from kb._query_terms(%s) t)
select c.id from kb.chunks c, q where c.tsv @@ q.q
 order by ts_rank_cd(c.tsv, q.q) desc, c.id limit %s
"""


def corpus_arguments(parser: argparse.ArgumentParser, keep: bool = True) -> None:
    """--chunks, --queries, --seed (and --keep) of the benchmarks on this corpus."""
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=40, help="queries per query set")
    parser.add_argument("--seed", type=int, default=1)
    if keep:
        parser.add_argument(
            "--keep",
            type=Path,
            metavar="DIR",
            help="keep the loaded server in DIR; reuse it (no reload) if DIR already holds one",
        )


def bench_home(keep: Path | None, prefix: str) -> Path:
    """The server's home: --keep's directory, else a new temporary one."""
    if keep is not None:
        home = keep.resolve()
        home.mkdir(parents=True, exist_ok=True)
    else:
        home = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    home.chmod(0o755)
    return home


def database_url(admin: str, name: str) -> str:
    """The URL of database `name` on the server of `admin` (an EmbeddedServer URL)."""
    return admin.rsplit("/", 1)[0] + f"/{name}?" + admin.split("?", 1)[1]


def read_info(home: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """What a run that kept its loaded server in `home` saved of the load (None: nothing)."""
    saved = home / "bench-info.json"
    if not saved.exists():
        return None
    info: dict[str, Any] = json.loads(saved.read_text())
    if info["chunks"] != args.chunks or info["seed"] != args.seed:
        raise SystemExit(f"{home} holds {info['chunks']:,} chunks, seed {info['seed']}")
    info["centroids"] = np.array(info["centroids"], dtype=np.float32)
    log(f"reusing the {args.chunks:,} chunks loaded in {home}")
    return info


def write_info(home: Path, info: dict[str, Any], args: argparse.Namespace) -> None:
    keep = dict(info, chunks=args.chunks, seed=args.seed)
    keep["centroids"] = info["centroids"].tolist()
    (home / "bench-info.json").write_text(json.dumps(keep))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser)
    parser.add_argument(
        "--only", help="comma-separated substrings: time only the variants whose name has one"
    )
    parser.add_argument("--repeat", type=int, default=1, help="time each query set N times")
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also time REV's sql/ functions (a git revision; installed in schema kb_before), "
        "interleaved query by query with today's, and count identical results",
    )
    parser.add_argument(
        "--shared-buffers",
        metavar="SIZE",
        help="the server's shared_buffers for the timings (e.g. 6GB: a quarter of this machine; "
        "the embedded server caps it at 2GB, less than a 1M-chunk knowledge base's working set)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="restart the server and time from there: no prewarming, no warm-up queries (the "
        "first pass is a just-started server's first searches; --repeat 2 adds a warm pass)",
    )
    parser.add_argument(
        "--drop-os-cache",
        action="store_true",
        help="with --cold: also evict this server's files from the kernel's page cache (as after "
        "a reboot; other processes' files stay cached)",
    )
    parser.add_argument(
        "--kb-prewarm",
        action="store_true",
        help="prewarm with kb.prewarm() (timed) instead of loading every kb relation, no warm-up"
        " queries when --cold",
    )
    parser.add_argument(
        "--layout",
        choices=["vector", "halfvec", "binary"],
        help="vector index layout (default: kb.default_vector_layout's)",
    )
    parser.add_argument(
        "--refresh-docs",
        metavar="N[,N...]",
        help="instead of timing searches, time kb.refresh_lexical_index after N new documents "
        "of 10 chunks spread over the groups (3 rounds, each rolled back), and the filter "
        "values' caches' part of it",
    )
    args = parser.parse_args()

    home = bench_home(args.keep, "kbpg-bench-")
    server = EmbeddedServer(home, durable=False)
    try:
        admin = server.start()
        url = database_url(admin, "bench")
        info = read_info(home, args)
        if info is None:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute("drop database if exists bench")
                c.execute("create database bench")
        if restart_for_shared_buffers(admin, args.shared_buffers):
            server.stop()
            admin = server.start()
        kdb.upgrade(url)  # re-applies sql/ on a reused server
        if args.cold and info is not None:
            server.stop()
            if args.drop_os_cache:
                log(f"evicted {evict_os_cache(server.pgdata) / 2**20:,.0f} MB from the OS cache")
            admin = server.start()
            log("server restarted: timings start from cold buffers")
        with psycopg.connect(url, prepare_threshold=None) as conn:
            register_vector(conn)
            if info is None:
                log(f"loading {args.chunks:,} chunks ...")
                info = load(conn, url, args.chunks, args.seed, layout=args.layout)
                if args.keep is not None:
                    write_info(home, info, args)
            conn.autocommit = True
            if args.refresh_docs:
                for documents in args.refresh_docs.split(","):
                    time_refresh(conn, int(documents))
            else:
                run(conn, info, args)
    finally:
        server.stop()
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def evict_os_cache(directory: Path) -> int:
    """Drop the kernel's cached pages of every file under `directory` (posix_fadvise
    DONTNEED; the server must be stopped); the bytes those files hold."""
    total = 0
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            total += path.stat().st_size
    return total


def restart_for_shared_buffers(admin: str, size: str | None) -> bool:
    """Set shared_buffers to `size` (None: the embedded server's own); True if a restart must
    apply it."""
    with psycopg.connect(admin, autocommit=True) as c:
        if size:
            c.execute(f"alter system set shared_buffers = '{size}'")
        else:
            c.execute("alter system reset shared_buffers")
        c.execute("select pg_reload_conf()")
        time.sleep(1)
        row = c.execute(
            "select pending_restart from pg_settings where name = 'shared_buffers'"
        ).fetchone()
    return row is not None and bool(row[0])


PREWARM = """
with rels as (
    select c.oid from pg_class c
     where c.relnamespace::regnamespace::text in ('kb', 'kb_data') and c.relkind in ('r', 'i')
    union all
    select t.oid from pg_class c join pg_class t on t.oid = c.reltoastrelid
     where c.relnamespace::regnamespace::text in ('kb', 'kb_data')
    union all
    select i.indexrelid from pg_class c join pg_index i on i.indrelid = c.reltoastrelid
     where c.relnamespace::regnamespace::text in ('kb', 'kb_data')
)
select pg_size_pretty(sum(pg_prewarm(rels.oid)) * current_setting('block_size')::bigint),
       current_setting('shared_buffers')
  from rels
"""


def prewarm(conn: psycopg.Connection[Any]) -> None:
    """Load every kb relation into shared buffers, as on a server in steady state.

    Without it the arm timed first after a start reads its pages through the kernel (the
    vector arm 2.7 ms p50 cold vs 1.3 ms warm at 200k): that measures the start, not the arm.
    """
    try:
        conn.execute("create extension if not exists pg_prewarm")
    except psycopg.Error as exc:
        log(f"no pg_prewarm ({exc.diag.message_primary}): timings start from cold buffers")
        return
    row = conn.execute(PREWARM).fetchone()
    assert row is not None
    log(f"prewarmed {row[0]} into shared_buffers {row[1]}")


def query_texts(info: dict[str, Any], rng: random.Random, n: int) -> dict[str, list[str]]:
    """The two query sets: 2-3 of the 15 most frequent content words, and NPL's questions."""
    frequent = info["frequent_words"]
    return {
        "frequent terms": [
            " ".join(w for w, _ in rng.sample(frequent[:15], rng.randint(2, 3))) for _ in range(n)
        ],
        "NPL questions": rng.sample(info["npl_queries"], min(n, len(info["npl_queries"]))),
    }


def query_embedding(centroids: np.ndarray, draw: np.random.Generator) -> np.ndarray:
    """A unit query vector near a random centroid, drawn like the corpus vectors."""
    v = centroids[draw.integers(0, len(centroids))] + draw.normal(scale=0.9, size=DIM)
    return np.asarray(v / np.linalg.norm(v), dtype=np.float32)


def query_items(
    info: dict[str, Any], seed: int, n: int
) -> list[tuple[str, list[tuple[str, np.ndarray]]]]:
    """The two query sets with their query embeddings, (text, embedding) per query, as `run`
    times them (bench_hnsw_recall.py measures recall on the same ones)."""
    nrng = np.random.default_rng(seed + 1)
    texts = query_texts(info, random.Random(seed + 1), n)
    return [
        (name, [(t, query_embedding(info["centroids"], nrng)) for t in ts])
        for name, ts in texts.items()
    ]


def run(conn: psycopg.Connection[Any], info: dict[str, Any], args: argparse.Namespace) -> None:
    log(
        f"load {info['load_s']:.0f} s, GIN {info['gin_s']:.0f} s, HNSW {info['hnsw_s']:.0f} s,"
        f" BM25 impact cache {info['lexical_cache_s']:.0f} s"
        + (
            f" (filter value caches {info['filter_caches_s']:.0f} s of it)"
            if "filter_caches_s" in info
            else ""
        )
        + f"; sizes {info['sizes']}"
    )
    # the key the metadata filter rows use, indexed as a user would (`kbpg metadata-keys index
    # product`); a server kept from an earlier run indexes it once
    started = time.perf_counter()
    if conn.execute("select kb.index_metadata_key('product')").fetchone() == (True,):
        log(f"indexed metadata key 'product' in {time.perf_counter() - started:.1f} s")
    if args.kb_prewarm:
        started = time.perf_counter()
        loaded = conn.execute("select mode, sum(bytes) from kb.prewarm() group by mode").fetchall()
        log(
            f"kb.prewarm() in {time.perf_counter() - started:.1f} s: "
            + ", ".join(f"{mode} {int(n) / 2**20:,.0f} MB" for mode, n in loaded)
        )
    elif not args.cold:
        prewarm(conn)
    frequent = info["frequent_words"]
    log(
        "frequent words (share of chunks containing them): "
        + ", ".join(f"{w} {share:.0%}" for w, share in frequent[:12])
    )
    sets = query_items(info, args.seed, args.queries)
    centroids: np.ndarray = info["centroids"]

    def embedding(draw: np.random.Generator) -> np.ndarray:
        return query_embedding(centroids, draw)

    # warm the caches (a just-started server reads the HNSW graph and the lexical cache from
    # disk: the first variant timed would pay for it) with other queries of both kinds, so the
    # timed ones are not already answered from the buffer cache
    warm_rng = random.Random(args.seed + 2)
    warm_nrng = np.random.default_rng(args.seed + 2)
    warm_texts = [
        " ".join(w for w, _ in warm_rng.sample(frequent[:15], warm_rng.randint(2, 3)))
        for _ in range(args.queries)
    ] + [q for q in info["npl_queries"] if q not in {t for t, _ in dict(sets)["NPL questions"]}]
    if args.cold:  # the first pass is the just-started server's first searches
        warm_texts = []
    for text in warm_texts:
        conn.execute("select * from kb.search(%s, %s)", (text, embedding(warm_nrng))).fetchall()

    # the schema the arms are called in: kb, or kb_before (--before REV) for the same query
    target = {"kb": "kb"}
    if args.before:
        install_before(conn, args.before)
        for text in warm_texts:
            conn.execute(
                "select * from kb_before.search(%s, %s)", (text, embedding(warm_nrng))
            ).fetchall()

    def search(item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(
            f"select chunk_id from {target['kb']}.search(%s, %s, match_count => 8)", item
        ).fetchall()

    def search_text(item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(
            f"select chunk_id from {target['kb']}.search(%s, match_count => 8)", (item[0],)
        ).fetchall()

    def search_filtered(item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(
            f"select chunk_id from {target['kb']}.search(%s, %s, match_count => 8, groups => '{{g7}}')",
            item,
        ).fetchall()

    def search_filtered_masked(item: tuple[str, np.ndarray]) -> list[Any]:
        # the baseline for the 1% group filter: the filter values' own caches emptied in a
        # rolled-back transaction (as before revision 0020), so the lexical arm sums every
        # block of the impact cache masked to the group's chunks
        with conn.transaction(force_rollback=True):
            conn.execute("delete from kb.lexical_filter_caches")
            return search_filtered(item)

    def search_metadata_filtered(item: tuple[str, np.ndarray]) -> list[Any]:
        # the same 1% of the chunks as g7 (document d: p{d % 100}), through a metadata filter
        return conn.execute(
            f"select chunk_id from {target['kb']}.search(%s, %s, match_count => 8,"
            """ filter => '{"product": "p7"}')""",
            item,
        ).fetchall()

    def search_metadata_unindexed(item: tuple[str, np.ndarray]) -> list[Any]:
        # the baseline for the indexed key: the key unlisted in a rolled-back transaction (as
        # before revision 0026), so the lexical arm scores the filtered chunks one by one
        with conn.transaction(force_rollback=True):
            conn.execute("delete from kb.indexed_metadata_keys")
            return search_metadata_filtered(item)

    def search_group_category(item: tuple[str, np.ndarray]) -> list[Any]:
        # the same 1% of the chunks as g7 alone (document d: g{d % 100}, cat{d % 10}), through
        # a filter of two columns: the bitmaps of both, ANDed per block (revision 0019)
        return conn.execute(
            f"select chunk_id from {target['kb']}.search(%s, %s, match_count => 8,"
            " groups => '{g7}', category => 'cat7')",
            item,
        ).fetchall()

    def search_group_category_per_query_mask(item: tuple[str, np.ndarray]) -> list[Any]:
        # the baseline for the row above: the filter bitmaps switched off in a rolled-back
        # transaction (as before they were built), so the arms count the filter's rows from a
        # page sample and the lexical arm builds its mask from the filtered rows' ids
        with conn.transaction(force_rollback=True):
            conn.execute("update kb.lexical_state set filter_masks = false")
            return search_group_category(item)

    def vector_arm(item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(
            f"select chunk_id from {target['kb']}.search_vector(%s, %s)", (item[1], POOL)
        ).fetchall()

    def lexical_arm(item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(
            f"select chunk_id from {target['kb']}.search_lexical(%s, %s)", (item[0], POOL)
        ).fetchall()

    def lexical_block_sums(item: tuple[str, np.ndarray]) -> list[Any]:
        # the lexical arm's bulk step alone: every query term's cached impacts summed per
        # block (no threshold search, no rescoring) -- the floor of that design
        return conn.execute(
            "select sum(vector_dims(s.scores)) from (select b.block_no,"
            " sum(b.impacts::vector order by b.lexeme) as scores from kb.lexical_blocks b"
            " where b.lexeme = any ((kb._query_terms(%s)).terms) group by b.block_no) s",
            (item[0],),
        ).fetchall()

    def lexical_exhaustive(item: tuple[str, np.ndarray]) -> list[Any]:
        with conn.transaction():
            conn.execute("set local kb.lexical_exhaustive_limit = 1000000000")
            return conn.execute(
                f"select chunk_id from {target['kb']}.search_lexical(%s, %s)", (item[0], POOL)
            ).fetchall()

    def ts_rank_cd(item: tuple[str, np.ndarray]) -> list[Any]:
        return conn.execute(TS_RANK_CD, (item[0], POOL)).fetchall()

    # a plain HNSW query on the space's index (binary: Hamming order, no re-rank)
    (layout,) = conn.execute("select layout from kb.embedding_space").fetchone() or ("vector",)
    order_by = {
        "vector": "embedding <=> %s",
        "halfvec": f"embedding::halfvec({DIM}) <=> %s::halfvec({DIM})",
        "binary": f"binary_quantize(embedding)::bit({DIM}) <~> binary_quantize(%s)::bit({DIM})",
    }[layout]

    def client_fusion(item: tuple[str, np.ndarray]) -> list[Any]:
        text, emb = item
        with conn.transaction():
            conn.execute(f"set local hnsw.ef_search = {4 * POOL}")  # as kb.search_vector
            dense = conn.execute(
                f"select id from kb.chunks order by {order_by} limit %s", (emb, POOL)
            ).fetchall()
        lexical = conn.execute(TS_RANK_CD, (text, POOL)).fetchall()
        scores: dict[int, float] = {}
        for ranked in (dense, lexical):
            for rank, (cid,) in enumerate(ranked, 1):
                scores[cid] = scores.get(cid, 0.0) + 1 / (RRF_K + rank)
        top = sorted(scores, key=lambda c: -scores[c])[:8]
        return conn.execute(
            "select c.id, c.content, d.source from kb.chunks c join kb.documents d"
            " on d.id = c.document_id where c.id = any(%s)",
            (top,),
        ).fetchall()

    variants: list[tuple[str, Callable[[Any], Any]]] = [
        ("kb.search hybrid (text + embedding)", search),
        ("kb.search lexical only (NULL embedding)", search_text),
        ("kb.search hybrid, 1% group filter", search_filtered),
        ("kb.search hybrid, 1% group + category filter", search_group_category),
        ("kb.search hybrid, 1% metadata filter", search_metadata_filtered),
        ("kb.search hybrid, 1% metadata filter, again", search_metadata_filtered),
        ("kb.search_vector (pool 32)", vector_arm),
        ("kb.search_lexical BM25 (pool 32)", lexical_arm),
        ("  block sums of all query terms, no top-k", lexical_block_sums),
        ("BM25 without the impact cache", lexical_exhaustive),
        ("ts_rank_cd OR query (pool 32)", ts_rank_cd),
        ("client-side fusion (HNSW + ts_rank_cd + RRF)", client_fusion),
    ]
    # variants timed paired with a baseline of the same run (name, function), query by query
    baselines = {
        "kb.search hybrid, 1% group filter": (
            "  same, filter value caches off (masked blocks)",
            search_filtered_masked,
        ),
        "kb.search hybrid, 1% group + category filter": (
            "  same, filter bitmaps off (per-query mask)",
            search_group_category_per_query_mask,
        ),
        # the same chunks as the 1% group filter: the ratio is the target's (<= 1.5)
        "kb.search hybrid, 1% metadata filter": (
            "  the same 1% as a group filter",
            search_filtered,
        ),
        "kb.search hybrid, 1% metadata filter, again": (
            "  same, key not indexed (filtered chunks scored)",
            search_metadata_unindexed,
        ),
    }
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        variants = [(n, fn) for n, fn in variants if any(w in n for w in wanted)]
    if args.before:
        log(f"\n{'':48} {'before':>8} {'':>8} {'now':>8}")
        log(f"{'':48} {'p50 ms':>8} {'p95 ms':>8} {'p50 ms':>8} {'p95 ms':>8}  same  now/before")
    else:
        log(f"\n{'':48} {'p50 ms':>8} {'p95 ms':>8}")
    vector_results: dict[str, list[Any]] = {}
    # p50 / p95 of every pass, per query set and variant (today's functions)
    passes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for pass_no in range(args.repeat):
        for set_name, items in sets:
            log(
                f"-- {set_name} ({len(items)} queries), {args.chunks:,} chunks, pass {pass_no + 1}"
                f" (load average {load_average()})"
            )
            results: dict[str, list[Any]] = {}
            for name, fn in variants:
                if args.before and name in COMPARED:
                    (b50, b95, before), (p50, p95, out), ratio = timed_both(fn, items, target)
                    same = sum(a == b for a, b in zip(before, out, strict=True))
                    log(
                        f"{name:48} {b50:8.1f} {b95:8.1f} {p50:8.1f} {p95:8.1f}"
                        f"  {same}/{len(items)}  {ratio:.2f}"
                    )
                    passes.setdefault((set_name, name + " (before)"), []).append((b50, b95))
                elif name in baselines:
                    base_name, baseline = baselines[name]
                    (b50, b95, base), (p50, p95, out), ratio = timed_pair(baseline, fn, items)
                    same = sum(a == b for a, b in zip(base, out, strict=True))
                    pad = " " * 18 if args.before else ""
                    log(f"{name:48} {pad}{p50:8.1f} {p95:8.1f}")
                    log(
                        f"{base_name:48} {pad}{b50:8.1f} {b95:8.1f}  paired: same ranked ids"
                        f" {same}/{len(items)}, median of now / baseline {ratio:.2f}"
                    )
                    passes.setdefault((set_name, base_name), []).append((b50, b95))
                else:
                    p50, p95, out = timed(fn, items)
                    pad = " " * 18 if args.before else ""
                    log(f"{name:48} {pad}{p50:8.1f} {p95:8.1f}")
                passes.setdefault((set_name, name), []).append((p50, p95))
                results[name] = out
            exact = results.get("BM25 without the impact cache")
            cached = results.get("kb.search_lexical BM25 (pool 32)")
            if exact is not None and cached is not None:
                same = sum(a == b for a, b in zip(cached, exact, strict=True))
                log(
                    f"BM25 cache vs exhaustive: identical top-{POOL} on {same}/{len(items)} queries"
                )
            ranked = results.get("ts_rank_cd OR query (pool 32)")
            if exact is not None and ranked is not None:
                overlap = statistics.mean(
                    len({r[0] for r in a[:10]} & {r[0] for r in b[:10]}) / max(1, min(10, len(b)))
                    for a, b in zip(ranked, exact, strict=True)
                )
                log(f"ts_rank_cd overlap@10 with BM25 {overlap:.2f}")
            if "kb.search_vector (pool 32)" in results:
                vector_results[set_name] = results["kb.search_vector (pool 32)"]

    if args.repeat > 1:
        log(f"\nspread over {args.repeat} passes: p95 ms of each pass, and the worst p50 / p95")
        for (set_name, name), values in passes.items():
            each = ", ".join(f"{p95:.1f}" for _, p95 in values)
            log(
                f"{set_name:15} {name:48} {each}; worst {max(v[0] for v in values):.1f}"
                f" / {max(v[1] for v in values):.1f}"
            )

    # last: the exact scans read the whole table and would evict what the timings rely on
    for set_name, items in sets:
        if set_name in vector_results:
            truths = [exact_neighbours(conn, emb) for _, emb in items]
            recall = statistics.mean(
                len({r[0] for r in got} & truth) / max(1, len(truth))
                for got, truth in zip(vector_results[set_name], truths, strict=True)
            )
            log(f"{set_name}: kb.search_vector recall@{POOL} against an exact scan {recall:.3f}")


if __name__ == "__main__":
    main()
