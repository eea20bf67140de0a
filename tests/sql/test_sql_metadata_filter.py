"""Metadata filters (`filter => jsonb`): every operator, every arm, exact against brute force."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, add_edge, raises_sqlstate, vec

# four documents, one chunk each: the lexical order for "permit renewal" is d4, d3, d2, d1
# (shorter chunks, more occurrences first); the vector order for [1, 0, 0] is d1, d2, d3, d4
DOCS: dict[str, dict[str, Any]] = {
    "d1": {
        "year": 2019,
        "lang": "de",
        "tags": ["faq", "howto"],
        "author": {"name": "Ann Lee"},
        "date": "2024-01-15",
        "src": "a.md",
        "score": 4.5,
    },
    "d2": {
        "year": 2021,
        "lang": "fr",
        "tags": ["faq"],
        "author": {"name": "bob"},
        "date": "2024-06-01T10:00:00+02:00",
        "src": "b.txt",
        "reviewed": False,
    },
    "d3": {"year": "2022", "lang": "de", "reviewed": True, "date": "oops", "src": "50%.md"},
    "d4": {},
}
CONTENT = {
    "d1": "permit renewal office opening hours for the whole week",
    "d2": "permit renewal office hours",
    "d3": "permit renewal",
    "d4": "permit renewal permit",
}
EMBEDDING = {"d1": [1, 0, 0], "d2": [0.9, 0.1, 0], "d3": [0.8, 0.2, 0], "d4": [0.7, 0.3, 0]}
LEXICAL_ORDER = ["d4", "d3", "d2", "d1"]
VECTOR_ORDER = ["d1", "d2", "d3", "d4"]


@pytest.fixture
def kb(conn: psycopg.Connection[Any]) -> dict[str, int]:
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    chunks = {}
    for name, metadata in DOCS.items():
        doc = add_doc(conn, f"{name}.md", metadata=metadata)
        chunks[name] = add_chunk(conn, doc, CONTENT[name], EMBEDDING[name])
    return chunks


def lexical_path(conn: psycopg.Connection[Any], path: str) -> None:
    """The lexical arm's exhaustive path, or its impact cache with a filter mask."""
    if path == "cache":
        conn.execute("select kb.refresh_lexical_index()")
        conn.execute("select set_config('kb.lexical_exhaustive_limit', '0', true)")


def run(conn: psycopg.Connection[Any], sql: str, filter_: Any) -> list[int]:
    return [int(r[0]) for r in conn.execute(sql, {"f": json.dumps(filter_)}).fetchall()]


OPERATOR_CASES = [
    ({"lang": "de"}, {"d1", "d3"}),
    ({"lang": {"$eq": "de"}}, {"d1", "d3"}),
    ({"lang": {"$ne": "de"}}, {"d2"}),  # d4 has no lang: $ne holds only where the key exists
    ({"year": {"$gt": 2019}}, {"d2"}),  # d3's "2022" is a string: never above a number
    ({"year": {"$gte": 2019}}, {"d1", "d2"}),
    ({"year": {"$lt": 2021}}, {"d1"}),
    ({"year": {"$lte": 2021}}, {"d1", "d2"}),
    ({"year": {"$gte": 2019, "$lt": 2021}}, {"d1"}),
    ({"score": {"$gt": 4.4}}, {"d1"}),
    ({"year": {"$in": [2021, "2022"]}}, {"d2", "d3"}),
    ({"lang": {"$nin": ["fr"]}}, {"d1", "d3"}),
    ({"year": {"$between": [2019, 2021]}}, {"d1", "d2"}),
    ({"reviewed": {"$exists": True}}, {"d2", "d3"}),
    ({"reviewed": {"$exists": False}}, {"d1", "d4"}),
    ({"reviewed": False}, {"d2"}),
    ({"reviewed": True}, {"d3"}),
    ({"src": {"$like": "%.md"}}, {"d1", "d3"}),
    ({"src": {"$like": "_.md"}}, {"d1"}),
    ({"src": {"$like": "50\\%%"}}, {"d3"}),  # \% is a percent sign
    ({"author.name": {"$like": "ann%"}}, set()),
    ({"author.name": {"$ilike": "ann%"}}, {"d1"}),
    ({"author.name": "bob"}, {"d2"}),
    ({"tags": "faq"}, {"d1", "d2"}),  # an array holds the value
    ({"tags": {"$in": ["howto", "x"]}}, {"d1"}),
    ({"date": {"$gte": "2024-03-01"}}, {"d2"}),  # a date against a timestamp with time zone
    ({"date": {"$lt": "2024-06-01T09:00:00+00:00"}}, {"d1", "d2"}),
    ({"date": {"$between": ["2024-01-01", "2024-02-01"]}}, {"d1"}),
    ({"$or": [{"year": 2019}, {"reviewed": True}]}, {"d1", "d3"}),
    ({"$and": [{"lang": "de"}, {"year": {"$lt": 2020}}]}, {"d1"}),
    ({"$not": {"lang": "de"}}, {"d2", "d4"}),
    ({"$not": [{"lang": "de"}, {"tags": "faq"}]}, {"d4"}),  # a list: none of them holds
    ({"lang": "de", "reviewed": True}, {"d3"}),  # several keys: all hold
    ({}, {"d1", "d2", "d3", "d4"}),  # no filter
]


@pytest.mark.parametrize("path", ["exhaustive", "cache"])
@pytest.mark.parametrize(
    ("filter_", "kept"), OPERATOR_CASES, ids=[json.dumps(f) for f, _ in OPERATOR_CASES]
)
def test_every_operator_keeps_the_same_chunks_in_every_arm(conn, kb, path, filter_, kept):
    lexical_path(conn, path)
    lexical = [kb[d] for d in LEXICAL_ORDER if d in kept]
    vector = [kb[d] for d in VECTOR_ORDER if d in kept]
    assert (
        run(
            conn,
            "select chunk_id from kb.search_lexical('permit renewal', 8, filter => %(f)s)",
            filter_,
        )
        == lexical
    )
    assert (
        run(
            conn,
            "select chunk_id from kb.search_vector('[1,0,0]', 8, filter => %(f)s)",
            filter_,
        )
        == vector
    )
    # kb.search: the lexical arm alone (no embedding), then the vector arm alone
    assert (
        run(conn, "select chunk_id from kb.search('permit renewal', filter => %(f)s)", filter_)
        == lexical
    )
    assert (
        run(
            conn,
            "select chunk_id from kb.search('permit renewal', '[1,0,0]', use_lexical => false,"
            " filter => %(f)s)",
            filter_,
        )
        == vector
    )


def test_a_hybrid_search_fuses_only_the_kept_chunks(conn, kb):
    rows = conn.execute(
        "select chunk_id, vector_rank, lexical_rank from kb.search('permit renewal', '[1,0,0]',"
        ' filter => \'{"lang": "de"}\')'
    ).fetchall()
    # d1: vector 1, lexical 2; d3: vector 2, lexical 1 — a tie at 1/61 + 1/62, broken by id
    assert rows == [(kb["d1"], 1, 2), (kb["d3"], 2, 1)]


def test_the_filter_combines_with_groups_category_and_labels(conn):
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    a = add_doc(conn, "a.md", groups=["team"], category="faq", metadata={"year": 2020})
    b = add_doc(conn, "b.md", groups=["team"], metadata={"year": 2020})
    c = add_doc(conn, "c.md", groups=["other"], category="faq", metadata={"year": 2020})
    d = add_doc(conn, "d.md", groups=["team"], category="faq", metadata={"year": 2010})
    ids = {
        n: add_chunk(conn, doc, "permit renewal", [1, 0, 0])
        for n, doc in zip("abcd", [a, b, c, d], strict=True)
    }
    got = run(
        conn,
        "select chunk_id from kb.search('permit', '[1,0,0]', groups => '{team}', category => 'faq',"
        " filter => %(f)s)",
        {"year": 2020},
    )
    assert got == [ids["a"]]


def test_the_graph_arm_returns_only_kept_chunks(conn, kb):
    add_edge(conn, kb["d4"], kb["d1"], 0.9)
    add_edge(conn, kb["d4"], kb["d2"], 0.8)
    add_edge(conn, kb["d4"], kb["d3"], 0.7)
    sql = (
        "select chunk_id from kb.expand_graph(%(seed)s, max_returned => 10, filter => %(f)s)"
        " order by rank"
    )
    rows = conn.execute(sql, {"seed": [kb["d4"]], "f": json.dumps({"lang": "de"})}).fetchall()
    assert [r[0] for r in rows] == [kb["d1"], kb["d3"]]
    rows = conn.execute(sql, {"seed": [kb["d4"]], "f": None}).fetchall()
    assert [r[0] for r in rows] == [kb["d1"], kb["d2"], kb["d3"]]


@pytest.mark.parametrize(
    ("filter_", "sqlstate", "message"),
    [
        ({"year": {"$gtt": 2020}}, "KB004", "unknown operator $gtt at filter.year"),
        ({"$gte": 2020}, "KB004", "$gte at filter is not a logical operator"),
        ({"lang": ["de", "fr"]}, "KB004", 'the key "lang" at filter is given a list'),
        ({"author": {"name": "Ann"}}, "KB004", 'holds "name", not an operator'),
        ([{"lang": "de"}], "KB004", "filter must be an object of conditions"),
        ("lang=de", "KB004", "filter must be an object of conditions"),
        ({"lang": {}}, "KB004", 'the key "lang" at filter has no condition'),
        ({"lang": {"$in": []}}, "KB004", "$in at filter.lang holds 0 values"),
        ({"lang": {"$in": "de"}}, "KB004", "$in at filter.lang takes array"),
        ({"year": {"$between": [2019]}}, "KB004", "$between at filter.year takes two values"),
        ({"year": {"$between": [2019, "x"]}}, "KB004", "$between at filter.year takes two values"),
        ({"year": {"$gt": True}}, "KB004", "$gt at filter.year takes number or string"),
        ({"year": {"$gt": [1]}}, "KB004", "$gt at filter.year takes number or string"),
        ({"reviewed": {"$exists": 1}}, "KB004", "$exists at filter.reviewed takes boolean"),
        ({"src": {"$like": 3}}, "KB004", "$like at filter.src takes string"),
        ({"date": {"$gt": "2024-13-45"}}, "KB004", "is not a valid date"),
        ({"a..b": 1}, "KB004", 'the key "a..b" at filter has an empty part'),
        ({"$or": {"lang": "de"}}, "KB004", "$or at filter takes a list of filters"),
        ({"$or": []}, "KB004", "$or at filter takes a list of filters"),
        ({"$or": [{"lang": "de"}, {"src": {"$ilike": 1}}]}, "KB004", "at filter.$or[1].src"),
        ({"$and": [{}]}, "KB004", "filter.$and[0] must be an object of conditions"),
        ({"lang": {"$in": list(range(1001))}}, "KB003", "holds 1001 values"),
        ({".".join("k" * 17): 1}, "KB003", "nested 17 deep"),
        ({"x": "y" * 70000}, "KB003", "over the limit of 64 kB"),
    ],
    ids=lambda v: v if isinstance(v, str) else json.dumps(v)[:40],
)
def test_a_bad_filter_is_refused_naming_the_place(conn, kb, filter_, sqlstate, message):
    for sql in (
        "select * from kb.search('permit', filter => %(f)s)",
        "select * from kb.search('permit', '[1,0,0]', filter => %(f)s)",
        "select * from kb.search_lexical('permit', filter => %(f)s)",
        "select * from kb.search_vector('[1,0,0]', filter => %(f)s)",
        "select * from kb.expand_graph(array[1]::bigint[], filter => %(f)s)",
    ):
        with raises_sqlstate(conn, sqlstate) as info:
            conn.execute(sql, {"f": json.dumps(filter_)})
        assert message in info.value.diag.message_primary, (sql, info.value)
        assert info.value.diag.message_hint, sql


def test_null_and_empty_filters_filter_nothing(conn, kb):
    everything = [kb[d] for d in LEXICAL_ORDER]
    for value in (None, "null", "{}"):
        got = conn.execute(
            "select chunk_id from kb.search('permit renewal', filter => %s::jsonb)", (value,)
        ).fetchall()
        assert [r[0] for r in got] == everything


def test_key_names_need_no_escaping(conn):
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    odd = {'we"ird key': "it's", "ключ": "значение", "a b": {"c\\d": 1}}
    doc = add_doc(conn, "odd.md", metadata=odd)
    other = add_doc(conn, "other.md", metadata={"ключ": "другое"})
    kept = add_chunk(conn, doc, "permit", [1, 0, 0])
    add_chunk(conn, other, "permit", [1, 0, 0])
    for filter_ in ({'we"ird key': "it's"}, {"ключ": "значение"}, {"a b.c\\d": 1}):
        assert run(conn, "select chunk_id from kb.search('permit', filter => %(f)s)", filter_) == [
            kept
        ]


# ---- exact against a brute-force reference on a few hundred chunks --------------------------

WORDS = ["permit", "renewal", "office", "parking", "fee", "online", "form", "hours", "city", "zone"]
LANGS = ["de", "fr", "en", "it"]


def _brute_matches(meta: dict[str, Any], filter_: dict[str, Any]) -> bool:
    """The reference: the filters below, evaluated in Python on the metadata."""
    for key, cond in filter_.items():
        if key == "$or":
            if not any(_brute_matches(meta, f) for f in cond):
                return False
            continue
        value = meta.get(key)
        if not isinstance(cond, dict):
            cond = {"$eq": cond}
        for op, arg in cond.items():
            ok = {
                "$eq": lambda v, a: v == a,
                "$gte": lambda v, a: isinstance(v, int) and v >= a,
                "$lt": lambda v, a: isinstance(v, int) and v < a,
                "$in": lambda v, a: v in a,
                "$ne": lambda v, a: v is not None and v != a,
            }[op](value, arg)
            if not ok:
                return False
    return True


# (filter, group): with a group, the group's stored bitmaps mask the impact cache and the
# metadata filter applies when the candidates are rescored
BRUTE_FILTERS: list[tuple[dict[str, Any], str | None]] = [
    ({"lang": "de"}, None),
    ({"n": {"$gte": 7}}, None),
    ({"n": {"$lt": 1}}, None),
    ({"$or": [{"lang": "it"}, {"n": 3}]}, None),
    ({"lang": {"$in": ["fr", "en"]}, "n": {"$gte": 5}}, None),
    ({"lang": {"$ne": "de"}}, None),
    ({"n": {"$gte": 5}}, "g1"),
    ({"lang": "fr"}, "g2"),
]


@pytest.fixture
def corpus(
    conn: psycopg.Connection[Any],
) -> tuple[dict[int, dict[str, Any]], dict[int, list[float]]]:
    rng = random.Random(40)
    conn.execute("select kb.set_embedding_space('test-model', 8)")
    metadata: dict[int, dict[str, Any]] = {}
    embeddings: dict[int, list[float]] = {}
    for i in range(400):
        meta = {"n": i % 10, "lang": LANGS[rng.randrange(4)]}
        doc = add_doc(conn, f"doc{i}.md", groups=[f"g{i % 3}"], metadata=meta)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        embedding = [rng.uniform(-1, 1) for _ in range(8)]
        chunk = add_chunk(conn, doc, text, embedding)
        metadata[chunk] = {**meta, "group": f"g{i % 3}"}
        embeddings[chunk] = embedding
    return metadata, embeddings


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.mark.parametrize("path", ["exhaustive", "cache"])
def test_filtered_rankings_equal_the_brute_force_reference(conn, corpus, path):
    metadata, embeddings = corpus
    lexical_path(conn, path)
    query_vector = [0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0, 0.2]
    everything = run(conn, "select chunk_id from kb.search_lexical('permit fee zone', 1000)", None)
    for filter_, group in BRUTE_FILTERS:
        kept = {
            c
            for c, meta in metadata.items()
            if _brute_matches(meta, filter_) and group in (None, meta["group"])
        }
        assert 0 < len(kept) < len(metadata)
        # BM25 statistics are the whole corpus's: the unfiltered ranking cut to the kept chunks
        expected = [c for c in everything if c in kept][:10]
        got = [
            int(r[0])
            for r in conn.execute(
                "select chunk_id from kb.search_lexical('permit fee zone', 10, groups => %s,"
                " filter => %s)",
                (None if group is None else [group], json.dumps(filter_)),
            ).fetchall()
        ]
        assert got == expected, (filter_, group)
        by_similarity = sorted(kept, key=lambda c: (-_cosine(embeddings[c], query_vector), c))
        expected_vector = [c for c in by_similarity if _cosine(embeddings[c], query_vector) >= 0.3][
            :10
        ]
        got_vector = [
            int(r[0])
            for r in conn.execute(
                "select chunk_id from kb.search_vector(%s::vector, 10, groups => %s, filter => %s)",
                (vec(query_vector), None if group is None else [group], json.dumps(filter_)),
            ).fetchall()
        ]
        assert got_vector == expected_vector, (filter_, group)
