"""Block-max pruning for the BM25 arm, simulated on a loaded corpus (not a test; prints numbers).

Issue 43 asks for an exact BM25 arm that skips most postings, as Lucene's block-max WAND,
PISA and pg_textsearch do, with upper bounds per term and block "fine enough to skip". Before
choosing the cache layout that holds those bounds, this measures what each granularity would
save on bench_search.py's corpus and queries: it reads the postings of every query term (the
impact cache's weights, kb.lexical_blocks, for the cached lexemes; the same BM25 weight from
the tsvector for the others), and for each query, in numpy:

  exhaustive   every posting of every term summed per chunk, the top k by score (what the arm's
               block sums amount to today: 100% of the postings);
  block-max B  chunk ids cut into sub-blocks of B ids; per term and sub-block its largest
               weight; a sub-block's bound, the sum of its terms' largest weights; sub-blocks
               scored whole in order of their bound, until the next bound is below the k-th
               score found (exact: an unscored chunk scores at most its sub-block's bound);
  MaxScore     the terms whose largest weights sum below the k-th score (known in advance
               here: the best case) are not summed; the others' postings are, and every chunk
               whose partial sum plus those terms' largest weights reaches the k-th score must
               be rescored exactly (the candidates);
  impact tiers each term's postings at or above a share a of its largest weight, a the largest
               share for which an unread chunk provably scores below the k-th score (a = k-th
               score / sum of the largest weights); every chunk read is rescored.

It prints, per query set and B, the postings scored (median and p95 of the fraction per
query), the sub-blocks scored, the (term, sub-block) bounds read, and whether the top k
(ranked ids) equals the exhaustive one on every query.

    python benchmarks/bench_search.py --chunks 1000000 --keep /tmp/kbpg-bench-1m --only none
    python benchmarks/bench_block_max.py --chunks 1000000 --keep /tmp/kbpg-bench-1m
    python benchmarks/bench_block_max.py --npl   # NPL's own abstracts and questions, no server:
        # postings from a Python BM25 (the same formula and weights, words as [a-z0-9]+ minus a
        # short stop list), sub-blocks down to 32
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from bench_search import (
    NPL,
    POOL,
    bench_home,
    corpus_arguments,
    database_url,
    load_average,
    log,
    query_texts,
    read_info,
)

from kbpg.store.embedded import EmbeddedServer

BLOCK_SIZES = (128, 256, 512, 1024, 4096, 16000)

QUERY_TERMS = "select terms from kb._query_terms(%s)"
CACHED = """
select b.block_no, b.impacts::text
  from kb.lexical_blocks b
 where b.lexeme = %s
 order by b.block_no
"""
UNCACHED = """
select c.id, s.score
  from kb.chunks c
 cross join (select pg_catalog.ln(1 + (x.chunk_count - t.doc_freq + 0.5) / (t.doc_freq + 0.5)) as idf,
                    x.total_tokens::float8 / greatest(x.chunk_count, 1) as avgdl
               from kb.corpus_stats x, kb.lexeme_stats t where t.lexeme = %(lexeme)s) l
 cross join lateral kb._bm25_score(c.tsv, c.token_count, array[%(lexeme)s], array[l.idf], l.avgdl) s
 where c.tsv @@ kb._lexemes_tsquery(array[%(lexeme)s])
 order by c.id
"""


def postings(
    conn: psycopg.Connection[Any], lexeme: str, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ids, weights) of one lexeme: the impact cache's, else scored from the tsvectors."""
    ids: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for block_no, text in conn.execute(CACHED, (lexeme,)):
        body = text[1 : text.index("}")]
        if not body:
            continue
        pairs = np.array([p.split(":") for p in body.split(",")], dtype=np.float64)
        ids.append(block_no * block_size + pairs[:, 0].astype(np.int64) - 1)
        weights.append(pairs[:, 1].astype(np.float32))
    if ids:
        return np.concatenate(ids), np.concatenate(weights)
    rows = conn.execute(UNCACHED, {"lexeme": lexeme}).fetchall()
    return (
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.float32),
    )


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[float, int]]:
    """The best k (score desc, id asc), as (score, id)."""
    order = np.lexsort((ids, -scores))[:k]
    return [(float(scores[i]), int(ids[i])) for i in order]


def block_max(
    terms: list[tuple[np.ndarray, np.ndarray]],
    ids: np.ndarray,
    scores: np.ndarray,
    size: int,
    k: int,
) -> tuple[list[tuple[float, int]], int, int, int, int]:
    """Sub-blocks of `size` ids scored in order of their bound until the next bound is below the
    k-th score: (top k, postings scored, sub-blocks scored, bounds read, sub-blocks holding a
    posting). `ids`/`scores`: every chunk's exact score (the exhaustive sums), read per sub-block."""
    bound: dict[int, float] = {}
    held: dict[int, int] = {}
    bounds_read = 0
    for term_ids, term_weights in terms:
        blocks = term_ids // size
        starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
        maxima = np.maximum.reduceat(term_weights, starts)
        counts = np.diff(np.r_[starts, len(blocks)])
        bounds_read += len(starts)
        for b, m, n in zip(blocks[starts].tolist(), maxima.tolist(), counts.tolist(), strict=True):
            bound[b] = bound.get(b, 0.0) + m
            held[b] = held.get(b, 0) + n
    chunk_blocks = ids // size
    first = np.searchsorted(chunk_blocks, np.arange(0, max(bound) + 2))
    best: list[tuple[float, int]] = []  # a min-heap of (score, -id): the k best so far
    scored = visited = 0
    for b in sorted(bound, key=lambda x: (-bound[x], x)):
        if len(best) == k and bound[b] * (1 + 1e-6) < best[0][0]:
            break
        visited += 1
        scored += held[b]
        lo, hi = first[b], first[b + 1]
        for s, i in zip(scores[lo:hi].tolist(), ids[lo:hi].tolist(), strict=True):
            item = (s, -i)
            if len(best) < k:
                heapq.heappush(best, item)
            elif item > best[0]:
                heapq.heapreplace(best, item)
    ranked = sorted(((s, -i) for s, i in best), key=lambda x: (-x[0], x[1]))
    return ranked, scored, visited, bounds_read, len(bound)


def scores_of(terms: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Every chunk holding a term, its score (the sum of its postings' weights), and the postings."""
    all_ids = np.concatenate([t[0] for t in terms])
    all_weights = np.concatenate([t[1] for t in terms]).astype(np.float64)
    ids, inverse = np.unique(all_ids, return_inverse=True)
    scores = np.zeros(len(ids))
    np.add.at(scores, inverse, all_weights)
    return ids, scores, len(all_ids)


def maxscore(terms: list[tuple[np.ndarray, np.ndarray]], theta: float) -> tuple[float, int]:
    """(share of the postings summed, candidates rescored) with the k-th score theta known."""
    maxima = [float(t[1].max()) for t in terms]
    skipped: set[int] = set()
    below = 0.0
    for j in sorted(range(len(terms)), key=lambda j: maxima[j]):
        if below + maxima[j] >= theta:
            break
        below += maxima[j]
        skipped.add(j)
    summed = [t for j, t in enumerate(terms) if j not in skipped]
    _, partial, postings = scores_of(summed)
    total = sum(len(t[0]) for t in terms)
    return postings / total, int((partial + below >= theta).sum())


def impact_tiers(
    terms: list[tuple[np.ndarray, np.ndarray]], theta: float
) -> tuple[float, int, float]:
    """(share of the postings read, chunks read, a) for the tiers described above."""
    maxima = np.array([float(t[1].max()) for t in terms])
    share = theta / float(maxima.sum())
    read = [t[0][t[1] >= share * m] for t, m in zip(terms, maxima, strict=True)]
    total = sum(len(t[0]) for t in terms)
    return sum(len(r) for r in read) / total, len(np.unique(np.concatenate(read))), share


def quantiles(values: list[float], share: bool = True) -> str:
    """'median M p95 P' of values (as percentages when share)."""
    ordered = sorted(values)
    median, p95 = (
        statistics.median(ordered),
        ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
    )
    if share:
        return f"median {median:.1%} p95 {p95:.1%}"
    return (
        f"median {median:,.2f} p95 {p95:,.2f}"
        if median < 10
        else f"median {median:,.0f} p95 {p95:,.0f}"
    )


def report(
    name: str, queries: list[list[tuple[np.ndarray, np.ndarray]]], k: int, sizes: tuple[int, ...]
) -> None:
    """Simulate every scheme on the queries (each its terms' postings) and print a query set."""
    rows: dict[int, list[tuple[float, int, int, int, bool]]] = {s: [] for s in sizes}
    total_postings = []
    term_level: list[tuple[float, int]] = []
    tiered: list[tuple[float, int, float]] = []
    for terms in queries:
        if not terms:
            continue
        ids, scores, total = scores_of(terms)
        exhaustive = top_k(ids, scores, k)
        total_postings.append(total)
        for size in sizes:
            ranked, scored, visited, bounds_read, held = block_max(terms, ids, scores, size, k)
            same = [i for _, i in ranked] == [i for _, i in exhaustive]
            rows[size].append((scored / total, visited, held, bounds_read, same))
        theta = exhaustive[-1][0]
        term_level.append(maxscore(terms, theta))
        tiered.append(impact_tiers(terms, theta))
    log(f"{name}: {len(total_postings)} queries, postings per query median"
        f" {statistics.median(total_postings):,.0f}, max {max(total_postings):,}")  # fmt: skip
    log(f"  {'sub-block':>9} {'postings scored':>22} {'sub-blocks scored':>24}"
        f" {'bounds read':>12} {'same top k':>10}")  # fmt: skip
    for size, results in rows.items():
        fractions = sorted(r[0] for r in results)
        p95 = fractions[min(len(fractions) - 1, int(0.95 * len(fractions)))]
        visited = statistics.median(r[1] for r in results)
        held = statistics.median(r[2] for r in results)
        bounds = statistics.median(r[3] for r in results)
        same = sum(r[4] for r in results)
        log(f"  {size:>9} {statistics.median(fractions):>10.1%} p95 {p95:>6.1%}"
            f" {visited:>10,.0f} of {held:>9,.0f} {bounds:>12,.0f} {same:>5}/{len(results)}")  # fmt: skip
    log(f"  MaxScore (the k-th score known): postings summed {quantiles([r[0] for r in term_level])},"
        f" candidates rescored {quantiles([r[1] for r in term_level], share=False)}")  # fmt: skip
    log(f"  impact tiers: postings read {quantiles([r[0] for r in tiered])}, chunks rescored"
        f" {quantiles([r[1] for r in tiered], share=False)}, a {quantiles([r[2] for r in tiered], share=False)}")  # fmt: skip


def run(conn: psycopg.Connection[Any], info: dict[str, Any], args: argparse.Namespace) -> None:
    block_size = conn.execute("select block_size from kb.lexical_state").fetchone()[0]
    texts = query_texts(info, random.Random(args.seed + 1), args.queries)
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    log(f"\n== block-max pruning simulated, top {args.k}, {args.chunks:,} chunks"
        f" (load average {load_average()})")  # fmt: skip
    for name, texts_of_set in texts.items():
        queries = []
        for text in texts_of_set:
            lexemes = conn.execute(QUERY_TERMS, (text,)).fetchone()[0] or []
            terms = []
            for lexeme in lexemes:
                if lexeme not in cache:
                    cache[lexeme] = postings(conn, lexeme, block_size)
                if len(cache[lexeme][0]):
                    terms.append(cache[lexeme])
            queries.append(terms)
        report(name, queries, args.k, BLOCK_SIZES)


STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "which",
        "with",
    ]
)


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP_WORDS]


def run_npl(k: int) -> None:
    """NPL's abstracts and questions, BM25 in Python (k1 1.2, b 0.75, kbpg's idf)."""
    documents = [json.loads(line) for line in (NPL / "corpus.jsonl").open()]
    questions = [json.loads(line) for line in (NPL / "queries.jsonl").open()]
    counts = [Counter(words(f"{d.get('title', '')} {d['text']}")) for d in documents]
    lengths = np.array([sum(c.values()) for c in counts], dtype=np.float64)
    average = float(lengths.mean())
    by_word: dict[str, list[tuple[int, int]]] = {}
    for i, c in enumerate(counts):
        for w, tf in c.items():
            by_word.setdefault(w, []).append((i, tf))

    def weights(word: str) -> tuple[np.ndarray, np.ndarray]:
        found = by_word[word]
        idf = math.log(1 + (len(counts) - len(found) + 0.5) / (len(found) + 0.5))
        ids = np.array([i for i, _ in found], dtype=np.int64)
        tf = np.array([t for _, t in found], dtype=np.float64)
        w = idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * lengths[ids] / average))
        return ids, w.astype(np.float32)

    log(f"\n== block-max pruning simulated, top {k}, NPL ({len(documents):,} abstracts)")
    queries = [[weights(w) for w in set(words(q["text"])) if w in by_word] for q in questions]
    report("NPL questions", queries, k, (32, 64, 128, 256, 512))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus_arguments(parser)
    parser.add_argument("--k", type=int, default=POOL, help="the top k (kb.search's pool: 32)")
    parser.add_argument("--npl", action="store_true", help="NPL itself, in Python (no server)")
    args = parser.parse_args()
    if args.npl:
        run_npl(args.k)
        return
    if args.keep is None:
        raise SystemExit("--keep DIR: a server bench_search.py loaded and kept")
    home = bench_home(args.keep, "kbpg-bench-")
    info = read_info(home, args)
    if info is None:
        raise SystemExit(f"{home} holds no loaded corpus: run bench_search.py --keep {home} first")
    server = EmbeddedServer(Path(home), durable=False)
    try:
        admin = server.start()
        with psycopg.connect(database_url(admin, "bench"), autocommit=True) as conn:
            run(conn, info, args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
