"""kb.search_lexical: exact Okapi BM25 over tsvector lexemes, on hand-built corpora."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from kbpg.store import db as kdb
from tests.sqldata import add_chunk, add_doc, function_calls, ids

K1, B = 1.2, 0.75


def bm25(tf: int, dl: int, avgdl: float, df: int, n: int) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + K1 * (1 - B + B * dl / avgdl))


def lexical(conn: psycopg.Connection[Any], query: str, k: int = 10, **filters: Any) -> list[Any]:
    args = ", ".join(f"{name} => %({name})s" for name in filters)
    sql = "select rank, chunk_id, document_id, score from kb.search_lexical(%(q)s, %(k)s"
    sql += (", " + args if args else "") + ")"
    return conn.execute(sql, {"q": query, "k": k, **filters}).fetchall()


def force_cache_path(conn: psycopg.Connection[Any], on: bool) -> None:
    """0: every query goes through the impact cache; a huge limit: always exhaustive."""
    set_exhaustive_limit(conn, 0 if on else 1_000_000_000)


def set_exhaustive_limit(conn: psycopg.Connection[Any], limit: int) -> None:
    """Below this many postings (or filtered chunks) the arm scores from the tsvector."""
    conn.execute("select set_config('kb.lexical_exhaustive_limit', %s, true)", (str(limit),))


def set_mask_limit(conn: psycopg.Connection[Any], limit: int | None) -> None:
    """Below this many filtered chunks the cache's block sums are masked to them (None: the
    default, 5% of the chunks or 20,000; 0: never)."""
    value = "" if limit is None else str(limit)
    conn.execute("select set_config('kb.lexical_mask_limit', %s, true)", (value,))


@pytest.fixture
def fruit(conn: psycopg.Connection[Any]) -> dict[str, int]:
    doc1 = add_doc(conn, "fruit-1")
    doc2 = add_doc(conn, "fruit-2")
    return {
        "c1": add_chunk(conn, doc1, "apple banana apple"),  # appl:2 banana:1, dl 3
        "c2": add_chunk(conn, doc1, "banana cherry"),  # dl 2
        "c3": add_chunk(conn, doc2, "cherry date elderberry fig"),  # dl 4
        "c4": add_chunk(conn, doc2, "grape"),  # dl 1
    }


@pytest.mark.parametrize("cached", [False, True])
def test_bm25_scores_equal_hand_computation(conn, fruit, cached):
    if cached:
        conn.execute("select kb.refresh_lexical_index()")
    force_cache_path(conn, cached)
    n, avgdl = 4, 10 / 4
    rows = lexical(conn, "apple cherry")
    expected = sorted(
        [
            (fruit["c1"], bm25(2, 3, avgdl, 1, n)),
            (fruit["c2"], bm25(1, 2, avgdl, 2, n)),
            (fruit["c3"], bm25(1, 4, avgdl, 2, n)),
        ],
        key=lambda x: -x[1],
    )
    assert ids(rows) == [cid for cid, _ in expected]
    assert [r[0] for r in rows] == [1, 2, 3]
    for row, (_, score) in zip(rows, expected, strict=True):
        assert row[3] == pytest.approx(score, abs=1e-9)


def test_or_semantics_and_unknown_terms(conn, fruit):
    # "kiwi" occurs nowhere and "the" is a stopword: the question still matches
    rows = lexical(conn, "what is the best kiwi or grape")
    assert ids(rows) == [fruit["c4"]]
    assert rows[0][3] == pytest.approx(bm25(1, 1, 2.5, 1, 4), abs=1e-9)


def test_negated_term_excludes(conn, fruit):
    assert ids(lexical(conn, "banana")) == [fruit["c2"], fruit["c1"]]
    assert ids(lexical(conn, "banana -cherry")) == [fruit["c1"]]


def test_section_and_body_occurrences_both_count(conn):
    doc = add_doc(conn, "sections")
    titled = add_chunk(conn, doc, "apple pie", section="Apple")  # appl tf 2, dl 3
    plain = add_chunk(conn, doc, "apple crumble pie")  # appl tf 1, dl 3
    rows = lexical(conn, "apple")
    assert ids(rows) == [titled, plain]
    assert rows[0][3] == pytest.approx(bm25(2, 3, 3.0, 2, 2), abs=1e-9)


def test_empty_and_stopword_queries_return_nothing(conn, fruit):
    assert lexical(conn, "") == []
    assert lexical(conn, "   ") == []
    assert lexical(conn, "the and of") == []


def test_filters_apply(conn):
    public = add_doc(conn, "public", groups=["staff", "all"], category="faq", labels=["en"])
    private = add_doc(conn, "private", groups=["hr"], category="policy", labels=["en", "internal"])
    a = add_chunk(conn, public, "holiday allowance")
    b = add_chunk(conn, private, "holiday holiday allowance")
    assert ids(lexical(conn, "holiday")) == [b, a]
    assert ids(lexical(conn, "holiday", groups=["all", "x"])) == [a]
    assert ids(lexical(conn, "holiday", groups=["hr"])) == [b]
    assert ids(lexical(conn, "holiday", groups=[])) == [b, a]
    assert ids(lexical(conn, "holiday", category="faq")) == [a]
    assert ids(lexical(conn, "holiday", labels=["en"])) == [b, a]
    assert ids(lexical(conn, "holiday", labels=["en", "internal"])) == [b]
    assert ids(lexical(conn, "holiday", groups=["staff"], category="policy")) == []


# -- the impact cache must never change a result ----------------------------------------------

SYLLABLES = ["ka", "lo", "mi", "ru", "te", "so", "van", "dre", "pul", "nix", "bor", "gel"]


def zipf_vocabulary(size: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))))
    return sorted(words)


def random_text(
    vocab: list[str], weights: list[float], rng: random.Random, lo: int, hi: int
) -> str:
    return " ".join(rng.choices(vocab, weights=weights, k=rng.randint(lo, hi)))


def keeps(
    filters: dict[str, Any],
    groups: list[str],
    category: str | None,
    labels: list[str],
    metadata: dict[str, Any],
) -> bool:
    """Whether a chunk passes kb.search's filters: any of the groups, the category, every label,
    the metadata filter (`filter`: the operators metadata_holds knows)."""
    return (
        (not filters.get("groups") or bool(set(filters["groups"]) & set(groups)))
        and (filters.get("category") is None or category == filters["category"])
        and set(filters.get("labels") or ()) <= set(labels)
        and (
            filters.get("filter") is None or metadata_holds(metadata, json.loads(filters["filter"]))
        )
    )


def metadata_items(metadata: dict[str, Any], key: str) -> list[Any]:
    """A dotted key's values in a document's metadata, an array's elements one by one."""
    found: list[Any] = [metadata]
    for part in key.split("."):
        found = [f[part] for f in found if isinstance(f, dict) and part in f]
    return [e for f in found for e in (f if isinstance(f, list) else [f])]


def metadata_holds(metadata: dict[str, Any], filter_: dict[str, Any]) -> bool:
    """The reference for the metadata filters of these tests ($eq, $in, $gte, $and; a scalar is
    $eq), in Python: a value of another JSON type never matches (True is not 1)."""

    def same(a: Any, b: Any) -> bool:
        return type(a) is type(b) or (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and bool not in (type(a), type(b))
        )

    for key, condition in filter_.items():
        if key == "$and":
            if not all(metadata_holds(metadata, f) for f in condition):
                return False
            continue
        items = metadata_items(metadata, key)
        conditions = condition if isinstance(condition, dict) else {"$eq": condition}
        for op, arg in conditions.items():
            if op == "$eq":
                ok = any(same(v, arg) and v == arg for v in items)
            elif op == "$in":
                ok = any(same(v, a) and v == a for v in items for a in arg)
            else:
                assert op == "$gte", op
                ok = any(same(v, arg) and v >= arg for v in items)
            if not ok:
                return False
    return True


def reference_top(
    conn: psycopg.Connection[Any], query: str, k: int, filters: dict[str, Any] | None = None
) -> list[tuple[int, float]]:
    """BM25 computed in Python from the stored tsvectors (no kbpg SQL involved), among the
    chunks the filters (groups, category, labels) keep."""

    def lexemes(tsquery_sql: str) -> set[str]:
        sql = (
            f"select distinct l from regexp_matches({tsquery_sql}, '''([^'']+)''', 'g') m(x),"
            " unnest(m.x) l"
        )
        return {r[0] for r in conn.execute(sql, (query,))}

    terms = lexemes("querytree(websearch_to_tsquery('english', %s))")
    excluded = lexemes("websearch_to_tsquery('english', %s)::text") - terms
    banned = {
        r[0]
        for r in conn.execute(
            "select c.id from kb.chunks c, unnest(c.tsv) u where u.lexeme = any(%s)",
            (sorted(excluded),),
        )
    }
    chunk_rows = conn.execute(
        "select c.id, c.groups, c.category, c.labels, d.metadata, u.lexeme,"
        " array_length(u.positions, 1)"
        " from kb.chunks c join kb.documents d on d.id = c.document_id, unnest(c.tsv) u"
    ).fetchall()
    lengths: dict[int, int] = defaultdict(int)
    tfs: dict[int, dict[str, int]] = defaultdict(dict)
    kept: dict[int, bool] = {}
    for cid, grp, category, labels, metadata, lexeme, tf in chunk_rows:
        lengths[cid] += tf
        kept[cid] = keeps(filters or {}, grp, category, labels, metadata)
        if lexeme in terms:
            tfs[cid][lexeme] = tf
    n = len(lengths)
    avgdl = sum(lengths.values()) / n
    df: dict[str, int] = defaultdict(int)
    for per in tfs.values():
        for lexeme in per:
            df[lexeme] += 1
    scores = [
        (cid, sum(bm25(tf, lengths[cid], avgdl, df[t], n) for t, tf in per.items()))
        for cid, per in tfs.items()
        if cid not in banned and kept[cid]
    ]
    scores.sort(key=lambda x: (-x[1], x[0]))
    return scores[:k]


def assert_matches_reference(
    conn: psycopg.Connection[Any], queries: list[str], k: int = 10, **filters: Any
) -> None:
    for query in queries:
        expected = reference_top(conn, query, k, filters)
        # 0: the cache (with filters: its block sums masked to the filtered chunks, or, mask
        # limit 0, unmasked in rounds sized by survival); 1000: with a filter keeping at most
        # 750 chunks, the filtered rows scored directly; huge: exhaustive from GIN
        for limit, mask in ((0, None), (0, 0), (1000, None), (1_000_000_000, None)):
            set_exhaustive_limit(conn, limit)
            set_mask_limit(conn, mask)
            runs = [lexical(conn, query, k, **filters)]
            if filters:
                # as kb.search calls it: the filtered chunks' ids already read (by the vector
                # arm's exact path), so the mask is built from them
                runs.append(lexical_given_filtered_ids(conn, query, k, **filters))
            for rows in runs:
                assert [r[1] for r in rows] == [cid for cid, _ in expected], (query, limit, mask)
                for row, (_, score) in zip(rows, expected, strict=True):
                    assert row[3] == pytest.approx(score, abs=1e-9)


def lexical_given_filtered_ids(
    conn: psycopg.Connection[Any], query: str, k: int, **filters: Any
) -> list[Any]:
    given = {"groups": None, "category": None, "labels": None, "filter": None, **filters}
    return conn.execute(
        "select rank, chunk_id, document_id, score from kb._search_lexical(%(q)s, %(k)s,"
        " %(groups)s, %(category)s, %(labels)s,"
        " (select array_agg(c.id) from kb.chunks c"
        "   where (%(groups)s::text[] is null or c.groups && %(groups)s)"
        "     and (%(category)s::text is null or c.category = %(category)s)"
        "     and (%(labels)s::text[] is null or c.labels @> %(labels)s)"
        "     and (%(filter)s::jsonb is null or c.document_id = any (%(kept_documents)s))),"
        " null, %(filter)s)",
        {"q": query, "k": k, "kept_documents": kept_documents(conn, given["filter"]), **given},
    ).fetchall()


def kept_documents(conn: psycopg.Connection[Any], filter_: str | None) -> list[int]:
    """The documents whose metadata a metadata filter (JSON) keeps, by metadata_holds."""
    if filter_ is None:
        return []
    rows = conn.execute("select id, metadata from kb.documents").fetchall()
    return [doc for doc, metadata in rows if metadata_holds(metadata, json.loads(filter_))]


def rescoring_rounds(
    conn: psycopg.Connection[Any], query: str, given_ids: bool = False, **filters: Any
) -> int:
    """How many times one filtered search rescored candidates (calls of kb._bm25_rank);
    given_ids: called as kb.search calls it, with the filtered chunks' ids."""
    before = function_calls(conn, "_bm25_rank")
    if given_ids:
        lexical_given_filtered_ids(conn, query, 10, **filters)
    else:
        lexical(conn, query, 10, **filters)
    return function_calls(conn, "_bm25_rank") - before


def test_cache_stays_exact_through_inserts_updates_deletes_and_drift(conn):
    rng = random.Random(7)
    vocab = zipf_vocabulary(400, rng)
    weights = [1 / (r + 1) for r in range(len(vocab))]
    # "few": 3 documents in 60, spread over the id range (as one team's in a shared database)
    docs = [
        add_doc(conn, f"z{i}", groups=["even" if i % 2 == 0 else "odd", *(["few"] * (i % 20 == 1))])
        for i in range(60)
    ]
    for i in range(1500):
        add_chunk(conn, docs[i % 60], random_text(vocab, weights, rng, 8, 40))
    # several blocks, so the block arithmetic and id mapping are exercised
    conn.execute("update kb.lexical_state set block_size = 250")
    conn.execute("select kb.refresh_lexical_index()")
    blocks = conn.execute("select count(distinct block_no) from kb.lexical_blocks").fetchone()
    assert blocks is not None and blocks[0] >= 6
    frequent, middle, rare = vocab[0], vocab[30], vocab[300]
    queries = [
        frequent,
        f"{frequent} {vocab[1]}",
        f"{frequent} {middle} {rare}",
        f"{vocab[2]} {vocab[3]} {vocab[4]} {vocab[5]}",
        f"{middle} -{frequent}",
    ]
    assert_matches_reference(conn, queries)
    assert_matches_reference(conn, queries[:3], groups=["odd"])
    assert_matches_reference(conn, queries[:3], groups=["few"])
    # the mask lets the cache serve a 5% filter in one round of rescoring; unmasked, 19 in 20
    # cached candidates fail the filter and the rounds repeat
    set_exhaustive_limit(conn, 0)
    set_mask_limit(conn, None)
    assert rescoring_rounds(conn, queries[0], groups=["few"]) == 1
    assert rescoring_rounds(conn, queries[0], given_ids=True, groups=["few"]) == 1
    set_mask_limit(conn, 0)
    assert rescoring_rounds(conn, queries[0], groups=["few"]) > 1
    assert rescoring_rounds(conn, queries[0], given_ids=True, groups=["few"]) > 1

    # new chunks above the watermark, an updated chunk, deletions, and avgdl drifting > 5%
    for i in range(200):
        add_chunk(conn, docs[i % 60], random_text(vocab, weights, rng, 60, 120))
    # a chunk the deletion below keeps (min(id) + 5 was a multiple of 7 on some sequence states)
    victim = conn.execute(
        "select min(id) from kb.chunks where id % 7 <> 0"
        " and id >= (select min(id) + 5 from kb.chunks)"
    ).fetchone()
    assert victim is not None
    conn.execute(
        "update kb.chunks set content = %s where id = %s", (" ".join([rare] * 12), victim[0])
    )
    conn.execute("delete from kb.chunks where id % 7 = 0")
    pending = conn.execute("select count(*) from kb.lexical_pending").fetchone()
    assert pending == (1,)
    assert_matches_reference(conn, [*queries, rare])
    top = lexical(conn, rare, 1)
    assert top[0][1] == victim[0]

    conn.execute("select kb.refresh_lexical_index()")
    assert conn.execute("select count(*) from kb.lexical_pending").fetchone() == (0,)
    assert_matches_reference(conn, [*queries, rare])


def test_refresh_is_incremental_below_drift(conn):
    doc = add_doc(conn, "inc")
    for i in range(30):
        add_chunk(conn, doc, f"alpha beta gamma {i}")
    conn.execute("update kb.lexical_state set block_size = 10")
    full = conn.execute("select * from kb.refresh_lexical_index()").fetchone()
    assert full is not None and full[0] >= 3
    add_chunk(conn, doc, "alpha beta gamma extra")
    incremental = conn.execute("select * from kb.refresh_lexical_index()").fetchone()
    assert incremental is not None
    assert incremental[0] in (1, 2)  # only the block(s) holding the new chunk
    assert incremental[3] == full[3]  # impacts keep the avgdl they were computed with
    rebuilt = conn.execute(
        "select * from kb.refresh_lexical_index(full_rebuild => true)"
    ).fetchone()
    assert rebuilt is not None and rebuilt[0] >= 4


def zipf_corpus(
    conn: psycopg.Connection[Any],
    prefix: str,
    chunks: int,
    rng: random.Random,
    reverse: bool = False,
    documents: Sequence[dict[str, Any]] = ({},) * 10,
) -> list[str]:
    """`chunks` chunks dealt round the documents (add_doc's filter columns for each; by default
    10 without any) from a 300-word vocabulary drawn with Zipf weights (reverse: the rare words
    become the frequent ones); the vocabulary, most frequent first."""
    vocab = zipf_vocabulary(300, random.Random(3))
    weights = [1 / (r + 1) for r in range(len(vocab))]
    if reverse:
        vocab = vocab[::-1]
    docs = [add_doc(conn, f"{prefix}{i}", **columns) for i, columns in enumerate(documents)]
    for i in range(chunks):
        add_chunk(conn, docs[i % len(docs)], random_text(vocab, weights, rng, 8, 40))
    return vocab


def bm25_statistics(conn: psycopg.Connection[Any]) -> tuple[Any, dict[str, int]]:
    corpus = conn.execute("select chunk_count, total_tokens from kb.corpus_stats").fetchone()
    lexemes = dict(conn.execute("select lexeme, doc_freq from kb.lexeme_stats").fetchall())
    return corpus, lexemes


def counted_statistics(conn: psycopg.Connection[Any]) -> tuple[Any, dict[str, int]]:
    """What kb.corpus_stats and kb.lexeme_stats should hold, counted from the chunks."""
    rows = conn.execute("select token_count, tsvector_to_array(tsv) from kb.chunks").fetchall()
    doc_freq: dict[str, int] = defaultdict(int)
    for _, lexemes in rows:
        for lexeme in lexemes:
            doc_freq[lexeme] += 1
    return (len(rows), sum(t for t, _ in rows)), dict(doc_freq)


def test_the_cache_serves_a_knowledge_base_whose_ids_grew_by_reingests(conn):
    """Each re-ingest of a changed document gives its chunks new ids: after long use the ids
    span far more blocks than hold chunks. Whether the cache or exact scoring from the tsvector
    serves a query depends on the blocks the cache holds (here 3 or 4), not on the id range."""
    conn.execute(
        "select setval('kb_data.chunks_id_seq', (select coalesce(max(id), 1) from kb.chunks) + 500000)"
    )
    vocab = zipf_corpus(conn, "churn", 600, random.Random(13), reverse=False)
    conn.execute("update kb.lexical_state set block_size = 200")
    conn.execute("select kb.refresh_lexical_index()")
    # the exhaustive path (and the rescoring under filters) calls kb._bm25_rank, the cache
    # path without filters does not
    before = function_calls(conn, "_bm25_rank")
    rows = lexical(conn, vocab[0], 10)  # in ~97% of the chunks
    assert function_calls(conn, "_bm25_rank") == before  # summed from the cache
    assert [r[1] for r in rows] == [cid for cid, _ in reference_top(conn, vocab[0], 10)]


def lexeme(conn: psycopg.Connection[Any], word: str) -> str:
    row = conn.execute("select tsvector_to_array(to_tsvector('english', %s))", (word,)).fetchone()
    assert row is not None and len(row[0]) == 1
    return str(row[0][0])


def test_truncate_resets_the_statistics_and_the_cache(conn):
    rng = random.Random(11)
    zipf_corpus(conn, "old", 800, rng, reverse=False)
    conn.execute("update kb.lexical_state set block_size = 100")
    conn.execute("select kb.refresh_lexical_index()")
    conn.execute("truncate kb_data.documents, kb_data.chunks restart identity cascade")
    assert bm25_statistics(conn) == ((0, 0), {})
    state = conn.execute(
        "select watermark, (select count(*) from kb.lexical_blocks) from kb.lexical_state"
    ).fetchone()
    assert state == (0, 0)
    # the new chunks take ids 1.. again, which the old cache covered, with other frequent words
    vocab = zipf_corpus(conn, "new", 400, rng, reverse=True)
    assert conn.execute("select min(id) from kb.chunks").fetchone() == (1,)
    assert bm25_statistics(conn) == counted_statistics(conn)
    queries = [vocab[0], f"{vocab[1]} {vocab[2]}", f"{vocab[0]} {vocab[150]} {vocab[-3]}"]
    assert_matches_reference(conn, queries)
    conn.execute("select kb.refresh_lexical_index()")
    assert_matches_reference(conn, queries)


def test_recount_repairs_what_the_triggers_did_not_see(conn):
    rng = random.Random(12)
    vocab = zipf_corpus(conn, "r", 600, rng, reverse=False)
    conn.execute("update kb.lexical_state set block_size = 100")
    conn.execute("select kb.refresh_lexical_index()")
    # the most frequent word, which the cache serves (a rare one is read from GIN: always exact)
    frequent = vocab[0]
    # a chunk's text changed with kb's triggers off (a restore, a logical replica): the cache
    # does not know, and the search misses the chunk
    victim = conn.execute(
        "select min(id) from kb.chunks where not tsv @@ to_tsquery('english', %s)", (frequent,)
    ).fetchone()
    assert victim is not None and victim[0] is not None
    conn.execute("alter table kb_data.chunks disable trigger chunks_stats_update")
    conn.execute("alter table kb_data.chunks disable trigger chunks_lexical_update")
    conn.execute(
        "update kb.chunks set content = %s where id = %s", (" ".join([frequent] * 12), victim[0])
    )
    conn.execute("alter table kb_data.chunks enable trigger chunks_stats_update")
    conn.execute("alter table kb_data.chunks enable trigger chunks_lexical_update")
    force_cache_path(conn, True)
    assert lexical(conn, frequent, 1)[0][1] != victim[0]  # its new text is not in the cache
    # and the statistics off in every way: counts, a lexeme missing, three miscounted, one left
    # behind
    missing, *miscounted = (lexeme(conn, word) for word in vocab[5:2:-1] + vocab[:1])
    conn.execute("update kb.corpus_stats set chunk_count = chunk_count + 500")
    conn.execute("delete from kb.lexeme_stats where lexeme = %s", (missing,))
    conn.execute(
        "update kb.lexeme_stats set doc_freq = doc_freq + 7 where lexeme = any(%s)", (miscounted,)
    )
    conn.execute("insert into kb.lexeme_stats values ('zzzgone', 5)")
    truth = counted_statistics(conn)
    damaged = bm25_statistics(conn)
    wrong = {w for w in truth[1].keys() | damaged[1].keys() if truth[1].get(w) != damaged[1].get(w)}
    assert {missing, *miscounted, "zzzgone", lexeme(conn, frequent)} <= wrong

    row = conn.execute("select * from kb.recount_bm25_statistics()").fetchone()
    assert row is not None
    assert row[:4] == (*truth[0], len(truth[1]), len(wrong))
    assert row[4] >= 6  # every block rebuilt
    assert bm25_statistics(conn) == truth
    assert_matches_reference(conn, [frequent, vocab[-1], f"{vocab[1]} {vocab[5]} {vocab[40]}"])
    force_cache_path(conn, True)
    assert lexical(conn, frequent, 1)[0][1] == victim[0]
    # a second recount finds nothing to correct
    again = conn.execute("select lexemes_corrected from kb.recount_bm25_statistics()").fetchone()
    assert again == (0,)


# What revision 0008's generated columns computed; revision 0009's trigger must agree.
TEXT_0008 = (
    "setweight(to_tsvector('english', section), 'A')"
    " || setweight(to_tsvector('english', content), 'B')"
    " || setweight(to_tsvector('english', coalesce(context, '')), 'C')"
)


def text_search_columns(conn: psycopg.Connection[Any], chunk: int) -> tuple[Any, ...]:
    row = conn.execute(
        f"select tsv::text, token_count, ({TEXT_0008})::text,"
        f" kb.tsvector_token_count({TEXT_0008}) from kb.chunks where id = %s",
        (chunk,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_tsvector_and_token_count_follow_the_text(conn: psycopg.Connection[Any]) -> None:
    doc = add_doc(conn, "text-search")
    chunk = add_chunk(conn, doc, "Renewing a parking permit: the permits office", section="Permits")
    tsv, count, expected_tsv, expected_count = text_search_columns(conn, chunk)
    assert (
        (tsv, count)
        == (expected_tsv, expected_count)
        == (
            "'offic':8B 'park':4B 'permit':1A,5B,7B 'renew':2B",
            6,
        )
    )
    conn.execute("update kb.chunks set context = 'Council fees page.' where id = %s", (chunk,))
    tsv, count, expected_tsv, expected_count = text_search_columns(conn, chunk)
    assert (tsv, count) == (expected_tsv, expected_count) and "'council':9C" in tsv
    # a new embedding leaves the text search columns alone; values written to them are replaced
    conn.execute(
        "update kb.chunks set embedding = null, tsv = 'forged', token_count = 99 where id = %s",
        (chunk,),
    )
    assert text_search_columns(conn, chunk)[:2] == (expected_tsv, expected_count)
    conn.execute("update kb.chunks set labels = '{x}' where id = %s", (chunk,))
    assert text_search_columns(conn, chunk)[:2] == (expected_tsv, expected_count)
    with (
        conn.cursor() as cur,
        cur.copy(
            "copy kb_data.chunks (document_id, ordinal, content, tsv, token_count) from stdin"
        ) as copy,
    ):
        copy.write_row((doc, 1, "Bins are collected weekly", "'forged'", 1))
    copied = conn.execute(
        "select id from kb.chunks where ordinal = 1 and document_id = %s", (doc,)
    ).fetchone()
    assert copied is not None
    tsv, count, expected_tsv, expected_count = text_search_columns(conn, copied[0])
    assert (tsv, count) == (expected_tsv, expected_count) == ("'bin':1B 'collect':3B 'week':4B", 3)


def stored_masks(conn: psycopg.Connection[Any]) -> dict[tuple[str, str, int], str]:
    rows = conn.execute(
        "select filter_kind, value, block_no, kept::text from kb.lexical_filter_masks"
    )
    return {(kind, value, block): bits for kind, value, block, bits in rows}


def expected_masks(
    conn: psycopg.Connection[Any], block_size: int
) -> dict[tuple[str, str, int], str]:
    """Per filter value (group, category, label) and block, a bit per chunk id of the block,
    set where the chunk holds the value."""
    masks: dict[tuple[str, str, int], list[str]] = {}
    for cid, values in chunk_filter_values(conn).items():
        for kind, value in values:
            bits = masks.setdefault((kind, value, cid // block_size), ["0"] * block_size)
            bits[cid % block_size] = "1"
    return {key: "".join(bits) for key, bits in masks.items()}


# filters the stored bitmaps serve, alone and combined (groups ORed, category and labels ANDed)
STORED_FILTERS: list[dict[str, Any]] = [
    {"groups": ["green"]},
    {"groups": ["green", "blue"]},
    {"category": "faq"},
    {"labels": ["a", "b"]},
    {"labels": ["b"]},
    {"groups": ["red"], "category": "guide"},
    {"groups": ["red", "blue"], "category": "faq", "labels": ["a"]},
]


def test_filter_masks_follow_the_chunks_filter_columns(conn):
    """The filters' stored bitmaps (kb.lexical_filter_masks) hold each group's, category's and
    label's chunks of each block of the cache, through UPDATEs of those columns in place,
    deletions and refreshes; filtered searches stay exact on them, and they count the
    filters' rows for the vector arm."""
    documents = [
        {
            "groups": [["red"], ["blue"], ["red", "green"], []][i % 4],
            "category": ["faq", "guide", None][i % 3],
            "labels": [["a"], ["a", "b"], [], ["b"], ["c"]][i % 5],
        }
        for i in range(40)
    ]
    vocab = zipf_corpus(conn, "m", 1200, random.Random(21), documents=documents)
    # a group or label listed twice (another writer's SQL; ingest dedupes) is one bit
    conn.execute(
        "update kb.chunks set groups = '{green,green}', labels = '{b,b}'"
        " where id = (select min(id) from kb.chunks)"
    )
    conn.execute("update kb.lexical_state set block_size = 100")
    conn.execute("select kb.refresh_lexical_index()")
    assert conn.execute("select filter_masks from kb.lexical_state").fetchone() == (True,)
    assert stored_masks(conn) == expected_masks(conn, 100)
    for filters in STORED_FILTERS:
        given = {"groups": None, "category": None, "labels": None, **filters}
        counted = conn.execute(
            "select count(*) from kb.chunks c where (%(groups)s::text[] is null"
            " or c.groups && %(groups)s) and (%(category)s::text is null"
            " or c.category = %(category)s) and (%(labels)s::text[] is null"
            " or c.labels @> %(labels)s)",
            given,
        ).fetchone()
        estimate = conn.execute(
            "select kb._filtered_rows_estimate(%(groups)s, %(category)s, %(labels)s, null)",
            given,
        ).fetchone()
        assert estimate == counted, filters
    queries = [vocab[0], f"{vocab[1]} {vocab[4]}", f"{vocab[0]} {vocab[40]} {vocab[200]}"]
    # the bitmaps are the mask: no estimate, count or mask built from the chunks
    set_exhaustive_limit(conn, 0)
    for filters in (STORED_FILTERS[0], STORED_FILTERS[2], STORED_FILTERS[6]):
        before = function_calls(conn, "_filtered_rows_estimate")
        assert rescoring_rounds(conn, queries[0], **filters) == 1
        assert function_calls(conn, "_filtered_rows_estimate") == before
    for filters in STORED_FILTERS:
        assert_matches_reference(conn, queries[:2], **filters)
    # a NULL label matches no chunk (labels @> '{a,NULL}' is never true): not served by the
    # bitmaps, and nothing found on any path
    for limit in (0, 1_000_000_000):
        set_exhaustive_limit(conn, limit)
        assert lexical(conn, queries[0], labels=["a", None]) == []

    # chunks moved into "green", "faq" and label "c" in place: pending (scored exactly) until
    # the refresh, whose bitmaps then hold them
    for column, value, was in (
        ("groups", "{green}", "{blue}"),
        ("category", "faq", "guide"),
        ("labels", "{c}", "{a}"),
    ):
        moved = [
            r[0]
            for r in conn.execute(
                f"update kb.chunks set {column} = %s where id in (select id from kb.chunks"
                f" where {column} = %s order by id limit 30) returning id",
                (value, was),
            )
        ]
        pending = {r[0] for r in conn.execute("select chunk_id from kb.lexical_pending")}
        assert len(moved) == 30 and set(moved) <= pending
    for filters in ({"groups": ["green"]}, {"category": "faq"}, {"labels": ["c"]}):
        assert_matches_reference(conn, queries, **filters)
    conn.execute("delete from kb.chunks where id % 5 = 0")
    conn.execute("select kb.refresh_lexical_index()")
    assert stored_masks(conn) == expected_masks(conn, 100)
    for filters in ({"groups": ["green"]}, {"category": "faq"}, {"labels": ["c"]}):
        assert_matches_reference(conn, queries, **filters)


ValueCaches = dict[tuple[str, str], dict[int, dict[str, tuple[float, float]]]]


def stored_value_caches(conn: psycopg.Connection[Any]) -> ValueCaches:
    """Per filter value with a cache of its own: per chunk with a slot, its lexemes' cached
    (weight, idf0)."""
    caches: ValueCaches = {}
    for cache, kind, value, count, block_size in conn.execute(
        "select cache_id, filter_kind, value, chunk_count, block_size from kb.lexical_filter_caches"
    ).fetchall():
        slots = dict(
            conn.execute(
                "select slot, chunk_id from kb.lexical_filter_slots where cache_id = %s",
                (cache,),
            ).fetchall()
        )
        assert len(slots) == count and len(set(slots.values())) == count
        entries: dict[int, dict[str, tuple[float, float]]] = {cid: {} for cid in slots.values()}
        for lexeme, block, vector, idf in conn.execute(
            "select lexeme, block_no, impacts::text, idf from kb.lexical_filter_blocks"
            " where cache_id = %s",
            (cache,),
        ):
            for element in vector.split("/")[0].strip("{}").split(","):
                position, weight = element.split(":")
                entries[slots[block * block_size + int(position) - 1]][lexeme] = (
                    float(weight),
                    idf,
                )
        caches[(kind, value)] = entries
    return caches


def value_members(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], set[int]]:
    """Each filter value's chunks."""
    members: dict[tuple[str, str], set[int]] = defaultdict(set)
    for cid, values in chunk_filter_values(conn).items():
        for value in values:
            members[value].add(cid)
    return members


def chunk_filter_values(conn: psycopg.Connection[Any]) -> dict[int, set[tuple[str, str]]]:
    """Each chunk's filter values as the bitmaps and value caches name them: its groups,
    category and labels, and its document's values of the indexed metadata keys
    ('["key", value]', a whole number without a fraction)."""
    keys = [r[0] for r in conn.execute("select key from kb.indexed_metadata_keys")]
    found: dict[int, set[tuple[str, str]]] = {}
    for cid, groups, category, labels, metadata in conn.execute(
        "select c.id, c.groups, c.category, c.labels, d.metadata"
        " from kb.chunks c join kb.documents d on d.id = c.document_id"
    ):
        values = {("group", g) for g in groups} | {("label", label) for label in labels}
        values |= {("category", category)} if category is not None else set()
        for key in keys:
            for item in metadata_items(metadata, key):
                if isinstance(item, float) and item.is_integer():
                    item = int(item)
                if isinstance(item, str | int | float):
                    values.add(("metadata", json.dumps([key, item], ensure_ascii=False)))
        found[cid] = values
    return found


def assert_no_rows_of_dropped_caches(conn: psycopg.Connection[Any]) -> None:
    """No block or slot is left of a value cache that was dropped."""
    for table in ("lexical_filter_blocks", "lexical_filter_slots"):
        orphans = conn.execute(
            f"select count(*) from kb.{table} t where not exists"
            " (select from kb.lexical_filter_caches f where f.cache_id = t.cache_id)"
        ).fetchone()
        assert orphans == (0,), table


def assert_value_caches(
    conn: psycopg.Connection[Any], low: int, high: int, fresh: bool = False
) -> None:
    """The values held by low to high chunks, and only they, have caches; each holds every
    chunk of its value with the BM25 weight of each of its lexemes (as of the average length
    at the refresh and the idf0 stored; fresh: the live idf, as after a rebuild), and at most
    chunks since deleted or moved out of the value besides."""
    n, avgdl = conn.execute(
        "select chunk_count, l.avgdl from kb.corpus_stats, kb.lexical_state l"
    ).fetchone() or (0, 1.0)
    df = dict(conn.execute("select lexeme, doc_freq from kb.lexeme_stats").fetchall())
    postings: dict[int, dict[str, tuple[int, int]]] = defaultdict(dict)
    for cid, lexeme, tf, dl in conn.execute(
        "select c.id, u.lexeme, coalesce(array_length(u.positions, 1), 1), c.token_count"
        " from kb.chunks c, unnest(c.tsv) u"
    ):
        postings[cid][lexeme] = (tf, dl)
    stored = stored_value_caches(conn)
    members = {
        value: chunks for value, chunks in value_members(conn).items() if low <= len(chunks) <= high
    }
    assert sorted(stored) == sorted(members)
    assert_no_rows_of_dropped_caches(conn)
    for value, chunks in members.items():
        assert chunks <= set(stored[value]), value
        for cid in chunks:
            assert set(stored[value][cid]) == set(postings[cid]), (value, cid)
            for lexeme, (weight, idf) in stored[value][cid].items():
                tf, dl = postings[cid][lexeme]
                if fresh:
                    live = math.log(1 + (n - df[lexeme] + 0.5) / (df[lexeme] + 0.5))
                    assert idf == pytest.approx(live, rel=1e-9)
                assert weight == pytest.approx(
                    idf * tf / (tf + K1 * (1 - B + B * dl / avgdl)), rel=1e-6
                ), (value, cid, lexeme)
        if fresh:
            assert set(stored[value]) == chunks, value


def value_cache_reads(conn: psycopg.Connection[Any]) -> int:
    """Scans of kb.lexical_filter_blocks so far in this transaction."""
    row = conn.execute(
        "select coalesce(seq_scan, 0) + coalesce(idx_scan, 0) from pg_stat_xact_user_tables"
        " where relid = 'kb_data.lexical_filter_blocks'::regclass"
    ).fetchone()
    return int(row[0]) if row else 0


def refresh_with_value_caches(conn: psycopg.Connection[Any], low: int, high: int) -> None:
    """kb.refresh_lexical_index with the values of low to high chunks eligible for a cache of
    their own (the limits the lexical arm also masks between)."""
    set_exhaustive_limit(conn, low)
    set_mask_limit(conn, high)
    conn.execute("select kb.refresh_lexical_index()")


def test_filter_value_caches_serve_selective_filters_exactly(conn):
    """A filter value (group, category, label) the lexical arm masks gets an impact cache of
    its own over its chunks (numbered in id order when built, then as they come); a filter
    holding such a value sums it in place of the masked blocks and ranks exactly, through
    updates in place, deletions, appends and refreshes; a value outside the limits loses its
    cache, and all do when they are switched off."""
    documents = [
        {
            "groups": [["red"], ["blue"], ["red", "green"], [], ["blue"]][i % 5],
            "category": ["faq", "guide", None][i % 3],
            "labels": [["a"], ["a", "b"], [], ["b"], ["c"]][i % 5],
        }
        for i in range(30)
    ]
    vocab = zipf_corpus(conn, "v", 1500, random.Random(8), documents=documents)
    conn.execute("update kb.lexical_state set block_size = 100")
    # values of 50 to 600 chunks (every one here) get their caches
    refresh_with_value_caches(conn, 50, 600)
    assert conn.execute("select filter_caches from kb.lexical_state").fetchone() == (True,)
    assert_value_caches(conn, 50, 600, fresh=True)
    assert len(stored_value_caches(conn)) == 8  # 3 groups, 2 categories, 3 labels
    queries = [vocab[0], f"{vocab[1]} {vocab[4]}", f"{vocab[0]} {vocab[40]} {vocab[200]}"]
    for filters in STORED_FILTERS:
        assert_matches_reference(conn, queries, **filters)
    # the caches are what the masked searches sum: each filter with a single group, or a
    # category or labels, reads one; two groups (ORed) do not
    set_exhaustive_limit(conn, 0)
    set_mask_limit(conn, None)
    for filters, summed in (
        ({"groups": ["green"]}, True),
        ({"category": "faq"}, True),
        ({"labels": ["a", "b"]}, True),
        ({"groups": ["red"], "category": "guide"}, True),
        ({"groups": ["red", "blue"]}, False),
    ):
        before = value_cache_reads(conn)
        lexical(conn, queries[1], **filters)
        assert (value_cache_reads(conn) > before) == summed, filters

    # chunks moved into "green", "faq" and label "c" in place are pending (scored exactly);
    # the refresh gives them slots in the values they joined (the values they left keep a slot
    # the rescoring drops until its block is rewritten)
    for column, value, was in (
        ("groups", "{green}", "{blue}"),
        ("category", "faq", "guide"),
        ("labels", "{c}", "{a}"),
    ):
        conn.execute(
            f"update kb.chunks set {column} = %s where id in (select id from kb.chunks"
            f" where {column} = %s order by id limit 40)",
            (value, was),
        )
    for filters in ({"groups": ["green"]}, {"category": "faq"}, {"labels": ["c"]}):
        assert_matches_reference(conn, queries, **filters)
    add_chunk(conn, add_doc(conn, "v-new", groups=["green"], category="faq"), vocab[1])
    conn.execute("delete from kb.chunks where id % 7 = 0")
    refresh_with_value_caches(conn, 50, 600)
    assert_value_caches(conn, 50, 600)
    for filters in STORED_FILTERS:
        assert_matches_reference(conn, queries, **filters)
    # more chunks of "green" land in the block of slots the last refresh began: its rows gain
    # them, weighed with the rows' idf0 (the block is appended to, not rewritten)
    word = lexeme(conn, vocab[1])

    def last_block_idf() -> Any:
        return conn.execute(
            "select b.idf from kb.lexical_filter_blocks b join kb.lexical_filter_caches f"
            " using (cache_id) where f.value = 'green' and b.lexeme = %s"
            " order by b.block_no desc limit 1",
            (word,),
        ).fetchone()

    appended_to = last_block_idf()
    more = add_doc(conn, "v-more", groups=["green"])
    for i in range(3):
        add_chunk(conn, more, f"{vocab[1]} {vocab[i + 2]} {vocab[i + 60]}")
    refresh_with_value_caches(conn, 50, 600)
    assert_value_caches(conn, 50, 600)
    n, df = conn.execute(
        "select chunk_count, doc_freq from kb.corpus_stats, kb.lexeme_stats where lexeme = %s",
        (word,),
    ).fetchone() or (0, 0)
    assert last_block_idf() == appended_to != (math.log(1 + (n - df + 0.5) / (df + 0.5)),)
    for filters in ({"groups": ["green"]}, {"groups": ["green"], "labels": ["c"]}):
        assert_matches_reference(conn, queries, **filters)
    # a value over the limit at the next refresh loses its cache; a full rebuild numbers the
    # others' chunks anew
    refresh_with_value_caches(conn, 50, 400)
    assert_value_caches(conn, 50, 400)
    assert ("group", "blue") not in stored_value_caches(conn)
    conn.execute("select kb.refresh_lexical_index(full_rebuild => true)")
    assert_value_caches(conn, 50, 400, fresh=True)
    for filters in ({"groups": ["green"]}, {"labels": ["c"]}):
        assert_matches_reference(conn, queries, **filters)
    # switched off: the next refresh drops them, and the masks serve the filters
    conn.execute("update kb.lexical_state set build_filter_caches = false")
    refresh_with_value_caches(conn, 50, 400)
    assert stored_value_caches(conn) == {}
    for filters in ({"groups": ["green"]}, {"labels": ["c"]}):
        assert_matches_reference(conn, queries, **filters)


# metadata filters over indexed keys: their equalities (a scalar, $eq, a $in of one, down
# $and) mask the arm; the rest of the filter applies when candidates are rescored
INDEXED_FILTERS: list[dict[str, Any]] = [
    {"filter": '{"product": "p1"}'},
    {"filter": '{"year": 2021}'},  # stored as 2021.0 in some documents: one value
    {"filter": '{"tags": "howto"}'},  # an array holds it
    {"filter": '{"author.name": {"$eq": "bob"}}'},
    {"filter": '{"product": {"$in": ["p2"]}, "year": {"$gte": 2021}}'},
    {"filter": '{"$and": [{"product": "p3"}, {"tags": "faq"}]}'},
    {"filter": '{"product": "p4", "note": "x"}'},  # "note" is not indexed
    {"filter": '{"product": {"$in": ["p1", "p3"]}}'},  # a set of values: their bitmaps ORed
    {"filter": '{"product": {"$in": ["p0", "p2"]}, "year": {"$in": [2020, 2022.0]}}'},
    {"filter": '{"product": {"$in": ["p1", null]}}'},  # a null alternative: no anchor
    {"filter": '{"product": "p1"}', "groups": ["green"]},
    {"filter": '{"product": "p1"}', "labels": ["a"]},
]


def test_indexed_metadata_keys_mask_the_lexical_arm_exactly(conn):
    """kb.index_metadata_key gives an indexed key's values bitmaps and value caches as a
    group's (named '["key", value]'), built at once; a filter's equalities on indexed keys
    then sum a value's cache or the masked blocks, and rank exactly, through metadata updates
    (pending until the refresh rewrites their blocks' bitmaps), new documents and unindexing."""
    documents = [
        {
            "groups": [["red"], ["green"], ["blue"]][i % 3],
            "labels": [["a"], []][i % 2],
            "metadata": {
                "product": f"p{i % 5}",
                "year": [2020, 2021.0, 2021, 2022][i % 4],
                "tags": [["faq"], ["faq", "howto"], []][i % 3],
                "author": {"name": ["ann", "bob"][i % 2]},
                "note": "x",
            },
        }
        for i in range(30)
    ]
    vocab = zipf_corpus(conn, "m", 1500, random.Random(9), documents=documents)
    conn.execute("update kb.lexical_state set block_size = 100")
    refresh_with_value_caches(conn, 50, 600)
    queries = [vocab[0], f"{vocab[1]} {vocab[4]}", f"{vocab[0]} {vocab[40]} {vocab[200]}"]
    before = {key: value for key, value in stored_masks(conn).items() if key[0] != "metadata"}
    for key in ("product", "year", "tags", "author.name"):
        assert conn.execute("select kb.index_metadata_key(%s)", (key,)).fetchone() == (True,)
    assert conn.execute("select kb.index_metadata_key('product')").fetchone() == (False,)
    listed = conn.execute("select key, values from kb.list_indexed_metadata_keys()").fetchall()
    assert listed == [("author.name", 2), ("product", 5), ("tags", 2), ("year", 3)]
    masks = stored_masks(conn)
    assert masks == expected_masks(conn, 100)
    assert {k: v for k, v in masks.items() if k[0] != "metadata"} == before
    refresh_with_value_caches(conn, 50, 600)
    assert_value_caches(conn, 50, 600)
    assert ("metadata", '["product", "p1"]') in stored_value_caches(conn)
    for filters in INDEXED_FILTERS:
        assert_matches_reference(conn, queries, **filters)
    # the masked searches sum a metadata value's cache, as a group's
    set_exhaustive_limit(conn, 0)
    set_mask_limit(conn, None)
    for filter_, summed in (
        ('{"product": "p1"}', True),
        ('{"$and": [{"product": "p3"}, {"tags": "faq"}]}', True),
        ('{"product": {"$in": ["p1", "p3"]}}', False),  # masked blocks: no one value's cache
    ):
        reads = value_cache_reads(conn)
        lexical(conn, queries[1], filter=filter_)
        assert (value_cache_reads(conn) > reads) == summed, filter_
    masks = conn.execute(
        "select mask_values, mask_sets, exact from kb._metadata_masks(%s)",
        ('{"product": {"$in": ["p3", "p1"]}, "year": 2021.0, "note": {"$in": ["x"]}}',),
    ).fetchone()
    # anchors in jsonb's key order (note, year, product), "note" not indexed: not exact
    assert masks == (['["year", 2021]', '["product", "p1"]', '["product", "p3"]'], [2, 3, 3], False)
    exact = "select exact from kb._metadata_masks(%s)"
    assert conn.execute(
        exact, ('{"product": {"$in": ["p3", "p1"]}, "year": 2021.0}',)
    ).fetchone() == (True,)
    assert conn.execute(
        exact, ('{"product": {"$in": ["p3", "p1"]}, "year": 2021, "x": 1}',)
    ).fetchone() == (False,)

    # documents moved to another product: their chunks pending and exact at once, the
    # bitmaps and caches follow at the refresh
    moved = conn.execute(
        "update kb.documents set metadata = jsonb_set(metadata, '{product}', '\"p1\"')"
        " where metadata->>'product' = 'p2' returning id"
    ).fetchall()
    pending = {r[0] for r in conn.execute("select chunk_id from kb.lexical_pending")}
    assert len(moved) == 6
    assert pending == {
        r[0]
        for r in conn.execute(
            "select id from kb.chunks where document_id = any (%s)", ([m[0] for m in moved],)
        )
    }
    for filters in INDEXED_FILTERS[:3]:
        assert_matches_reference(conn, queries, **filters)
    add_chunk(conn, add_doc(conn, "m-new", metadata={"product": "p1"}), vocab[1])
    refresh_with_value_caches(conn, 50, 600)
    assert stored_masks(conn) == expected_masks(conn, 100)
    assert_value_caches(conn, 50, 600)
    for filters in INDEXED_FILTERS:
        assert_matches_reference(conn, queries, **filters)
    # unindexed: its bitmaps and caches go, its filters stay exact
    assert conn.execute("select kb.unindex_metadata_key('product')").fetchone() == (True,)
    assert conn.execute("select kb.unindex_metadata_key('product')").fetchone() == (False,)
    assert not any(v.startswith('["product"') for _, v, _ in stored_masks(conn))
    assert not any(v.startswith('["product"') for _, v in stored_value_caches(conn))
    assert_no_rows_of_dropped_caches(conn)
    assert stored_masks(conn) == expected_masks(conn, 100)
    for filters in INDEXED_FILTERS[:2]:
        assert_matches_reference(conn, queries, **filters)


def test_a_bad_metadata_key_is_refused(conn):
    for key, message in (("", "empty part"), ("a..b", "empty part")):
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("select kb.index_metadata_key(%s)", (key,))
        assert raised.value.sqlstate == "KB004" and message in str(raised.value)
        conn.rollback()
    assert conn.execute("select count(*) from kb.indexed_metadata_keys").fetchone() == (0,)


def test_filter_masks_are_built_for_a_cache_from_before_them(new_database):
    """A knowledge base migrated from 0017 has a cache but no bitmaps and no filter value
    caches: its filters use the per-query mask until the next refresh builds both, without
    rebuilding the impacts. (The cache is built at head, then the schema taken down to 0017 and
    up again: 0018's to 0020's upgrades on a knowledge base with a cache.)"""
    url = new_database()
    filters: list[dict[str, Any]] = [{"groups": ["team"]}, {"category": "howto"}]
    documents = [
        {"groups": ["team" if i % 3 == 0 else "all"], "category": "howto" if i % 4 == 0 else None}
        for i in range(30)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        vocab = zipf_corpus(conn, "o", 600, random.Random(5), documents=documents)
        conn.execute("update kb.lexical_state set block_size = 100")
        conn.execute("select kb.refresh_lexical_index()")
    kdb.downgrade(url, "0017")
    kdb.upgrade(url)
    queries = [vocab[0], f"{vocab[2]} {vocab[9]}"]
    with psycopg.connect(url) as conn:
        assert conn.execute("select filter_masks from kb.lexical_state").fetchone() == (False,)
        assert conn.execute("select count(*) from kb.lexical_filter_masks").fetchone() == (0,)
        assert stored_value_caches(conn) == {}
        for given in filters:
            assert_matches_reference(conn, queries, **given)
        set_exhaustive_limit(conn, 0)  # every value gets a cache of its own
        rebuilt = conn.execute("select blocks_rebuilt from kb.refresh_lexical_index()").fetchone()
        assert rebuilt == (0,)
        assert conn.execute(
            "select filter_masks, filter_caches from kb.lexical_state"
        ).fetchone() == (
            True,
            True,
        )
        assert stored_masks(conn) == expected_masks(conn, 100)
        assert_value_caches(conn, 0, 20000, fresh=True)
        for given in filters:
            assert_matches_reference(conn, queries, **given)
