"""kb.search in `russian` and `cjk` against `english` at 200k chunks, paired (not a test).

One embedded server, three knowledge bases of the same size and the same vectors: English text
in `english`, Russian in `russian`, Chinese in `cjk`. The text is drawn from XQuAD's paragraphs
in each language (../shared/ir/xquad-{en,ru,zh}): a chunk is runs of consecutive words (or, in
Chinese, characters) cut from random sentences, 30-120 words (60-240 characters), so lexemes
keep their real frequencies and inflections and bigrams their real co-occurrence. Queries are
XQuAD's questions, the same ones in the three languages, timed query by query in the three
knowledge bases back to back (so the machine's load falls on all alike); then the lexical arm
through its impact cache against exhaustive BM25 (exact: the same ids, the same scores).

    python benchmarks/bench_languages.py                 # 200k chunks each
    python benchmarks/bench_languages.py --chunks 20000  # quick look
    python benchmarks/bench_languages.py --keep /tmp/kbpg-lang  # keep the servers; reuse
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_search import (
    DIM,
    bench_home,
    build_indexes,
    database_url,
    interleaved,
    log,
    percentile,
    query_embedding,
    restart_for_shared_buffers,
)

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

IR = Path(__file__).resolve().parent.parent.parent / "shared" / "ir"
LANGUAGES = {"english": "xquad-en", "russian": "xquad-ru", "cjk": "xquad-zh"}
SENTENCE = re.compile(r"[^.!?。！？]+[.!?。！？]?")


def corpus(language: str) -> tuple[list[list[str]], dict[str, str]]:
    """The collection's sentences as token lists (words, or characters for cjk) and its
    questions by id."""
    root = IR / LANGUAGES[language]
    sentences: list[list[str]] = []
    with (root / "corpus.jsonl").open() as f:
        for line in f:
            for sentence in SENTENCE.findall(json.loads(line)["text"]):
                tokens = list(sentence.strip()) if language == "cjk" else sentence.split()
                if len(tokens) >= 4:
                    sentences.append(tokens)
    with (root / "queries.jsonl").open() as f:
        questions = {q["_id"]: q["text"] for q in map(json.loads, f)}
    return sentences, questions


def chunk_texts(language: str, n: int, seed: int) -> list[str]:
    sentences, _ = corpus(language)
    rng = random.Random(seed)
    scale, joiner = (2, "") if language == "cjk" else (1, " ")
    texts = []
    for _ in range(n):
        target = rng.randint(30, 120) * scale
        tokens: list[str] = []
        while len(tokens) < target:
            sentence = rng.choice(sentences)
            run = rng.randint(3, 12) * scale
            start = rng.randint(0, max(0, len(sentence) - run))
            tokens += sentence[start : start + run]
            if language == "cjk":
                tokens.append("，")
        texts.append(joiner.join(tokens[:target]))
    return texts


def load(url: str, language: str, n_chunks: int, seed: int) -> dict[str, Any]:
    """n_chunks chunks of `language` (documents of 10), the same vectors in every language."""
    nrng = np.random.default_rng(seed)
    centroids = nrng.normal(size=(500, DIM)).astype(np.float32)
    texts = chunk_texts(language, n_chunks, seed)
    with psycopg.connect(url) as conn:
        register_vector(conn)
        conn.execute("select kb.set_language(%s)", (language,))
        conn.execute("select kb.set_embedding_space('bench-384', %s)", (DIM,))
        conn.execute("drop index kb_data.chunks_embedding_hnsw")
        conn.execute("drop index kb_data.chunks_tsv_gin")
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cur:
            with cur.copy(
                "copy kb_data.documents (source, title, content_hash) from stdin"
            ) as copy:
                for d in range(max(1, n_chunks // 10)):
                    copy.write_row((f"doc-{d}", "", "h"))
            doc_ids = [r[0] for r in cur.execute("select id from kb.documents order by id")]
        conn.commit()
        batch = 20000
        for start in range(0, n_chunks, batch):
            stop = min(n_chunks, start + batch)
            vectors = centroids[nrng.integers(0, len(centroids), size=stop - start)]
            vectors = vectors + nrng.normal(scale=0.9, size=vectors.shape).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            with (
                conn.cursor() as cur,
                cur.copy(
                    "copy kb_data.chunks (document_id, ordinal, content, embedding)"
                    " from stdin with (format binary)"
                ) as copy,
            ):
                copy.set_types(["int8", "int4", "text", "vector"])
                for i in range(start, stop):
                    copy.write_row((doc_ids[i // 10], i % 10, texts[i], vectors[i - start]))
            conn.commit()
        info: dict[str, Any] = {"load_s": time.perf_counter() - started}
        log(f"  {language}: loaded {n_chunks:,} chunks in {info['load_s']:.0f} s")
        build_indexes(conn, url, info)
        row = conn.execute(
            "select avg(pg_column_size(tsv)), avg(token_count), avg(length(content)),"
            " (select count(*) from kb.lexeme_stats) from kb.chunks"
        ).fetchone()
        assert row is not None
        info["tsv_bytes"], info["tokens"], info["chars"], info["lexemes"] = map(float, row)
    info["centroids"] = centroids.tolist()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2, help="time the query set N times")
    parser.add_argument("--keep", type=Path, metavar="DIR")
    parser.add_argument("--shared-buffers", default="6GB", metavar="SIZE")
    args = parser.parse_args()

    home = bench_home(args.keep, "kbpg-lang-")
    server = EmbeddedServer(home, durable=False)
    saved = home / "bench-languages.json"
    try:
        admin = server.start()
        if restart_for_shared_buffers(admin, args.shared_buffers):
            server.stop()
            admin = server.start()
        infos: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
        urls = {}
        for language in LANGUAGES:
            url = database_url(admin, f"bench_{language}")
            urls[language] = url
            if language not in infos:
                with psycopg.connect(admin, autocommit=True) as c:
                    c.execute(f"drop database if exists bench_{language}")
                    c.execute(f"create database bench_{language}")
                kdb.upgrade(url)
                infos[language] = load(url, language, args.chunks, args.seed)
                saved.write_text(json.dumps(infos))
            else:
                kdb.upgrade(url)
        for language, info in infos.items():
            log(
                f"{language}: load {info['load_s']:.0f} s, GIN {info['gin_s']:.0f} s, cache "
                f"{info['lexical_cache_s']:.0f} s; tsvector {info['tsv_bytes']:.0f} B a chunk, "
                f"{info['tokens']:.0f} tokens, {info['chars']:.0f} characters, "
                f"{info['lexemes']:,.0f} lexemes; {info['sizes']}"
            )
        run(urls, np.array(infos["english"]["centroids"], dtype=np.float32), args)
    finally:
        server.stop()
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)


def run(urls: dict[str, str], centroids: np.ndarray, args: argparse.Namespace) -> None:
    questions = {language: corpus(language)[1] for language in LANGUAGES}
    shared = sorted(set.intersection(*(set(q) for q in questions.values())))
    rng = random.Random(args.seed + 1)
    chosen = rng.sample(shared, min(args.queries, len(shared)))
    warm = [q for q in shared if q not in chosen][: args.queries]
    nrng = np.random.default_rng(args.seed + 1)
    embeddings = [query_embedding(centroids, nrng) for _ in chosen]
    conns = {}
    for language, url in urls.items():
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        register_vector(conn)
        for qid in warm:  # the caches, not the timed queries
            conn.execute(
                "select * from kb.search(%s, %s)", (questions[language][qid], embeddings[0])
            ).fetchall()
        conns[language] = conn

    def caller(language: str, sql: str, with_embedding: bool) -> Any:
        def call(i: int) -> list[Any]:
            text = questions[language][chosen[i]]
            params = (text, embeddings[i]) if with_embedding else (text,)
            return conns[language].execute(sql, params).fetchall()

        return call

    variants = {
        "kb.search hybrid": ("select chunk_id from kb.search(%s, %s, match_count => 8)", True),
        "kb.search_lexical": ("select chunk_id from kb.search_lexical(%s, 32)", False),
    }
    items = list(range(len(chosen))) * args.repeat
    log(f"{len(chosen)} XQuAD questions x {args.repeat}, paired across the three languages")
    for name, (sql, with_embedding) in variants.items():
        runs = interleaved([caller(lang, sql, with_embedding) for lang in LANGUAGES], items)
        p95 = {}
        for language, (times, _) in zip(LANGUAGES, runs, strict=True):
            p95[language] = percentile(times, 0.95)
            log(
                f"  {name:<18} {language:<8} p50 {statistics.median(times):6.2f} ms, "
                f"p95 {p95[language]:6.2f} ms"
            )
        for language in ("russian", "cjk"):
            log(f"  {name:<18} {language} / english p95: {p95[language] / p95['english']:.2f}")

    # what analysing a chunk costs (the trigger's work at ingest): 5,000 chunks' text in the
    # knowledge base's language, three rounds interleaved, the median
    analyse = (
        "select sum(length(kb.text_tsvector(c.content))), sum(length(c.content))"
        " from (select content from kb.chunks order by id limit 5000) c"
    )
    cost: dict[str, list[float]] = {language: [] for language in LANGUAGES}
    chars = {}
    for _ in range(3):
        for language, conn in conns.items():
            t = time.perf_counter()
            row = conn.execute(analyse).fetchone()
            cost[language].append((time.perf_counter() - t) / 5000 * 1e6)
            chars[language] = int(row[1]) / 5000 if row else 0
    for language, values in cost.items():
        log(
            f"  analysis {language:<8} {statistics.median(values):6.0f} us a chunk "
            f"({chars[language]:.0f} characters)"
        )

    # exact: the cached arm returns what exhaustive BM25 returns, ids and scores
    for language, conn in conns.items():
        same = 0
        for i in range(len(chosen)):
            text = questions[language][chosen[i]]
            cached = conn.execute("select * from kb.search_lexical(%s, 32)", (text,)).fetchall()
            conn.execute("set kb.lexical_exhaustive_limit = 1000000000000")
            exact = conn.execute("select * from kb.search_lexical(%s, 32)", (text,)).fetchall()
            conn.execute("reset kb.lexical_exhaustive_limit")
            same += [r[1] for r in cached] == [r[1] for r in exact] and all(
                abs(a[3] - b[3]) <= 1e-9 * max(1.0, abs(b[3]))
                for a, b in zip(cached, exact, strict=True)
            )
        log(f"  lexical arm {language}: {same}/{len(chosen)} queries identical to exhaustive BM25")
    for conn in conns.values():
        conn.close()


if __name__ == "__main__":
    main()
