"""kb.facets: exact counts per value over the match set, filtered as kb.search filters."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, raises_sqlstate

CATEGORIES = ["faq", "howto", None]
LABELS = ["parking", "fees", "online"]
GROUPS = [[], ["staff"], ["staff", "hr"]]


@pytest.fixture
def corpus(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    rng = random.Random(68)
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    rows = []
    for d in range(60):
        category = CATEGORIES[d % 3]
        labels = sorted(rng.sample(LABELS, rng.randint(0, 2)))
        groups = GROUPS[d % 3 if d % 7 else 0]
        meta = {"year": 2018 + d % 4, "tags": rng.sample(["a", "b", "c"], rng.randint(0, 2))}
        doc = add_doc(
            conn, f"d{d}.md", category=category, labels=labels, groups=groups, metadata=meta
        )
        for k in range(1 + d % 2):
            text = "permit renewal" if (d + k) % 3 else "bicycle storage"
            add_chunk(conn, doc, text, [1, 0, 0])
            rows.append({"doc": doc, "text": text, "category": category, "labels": labels,
                         "groups": groups or ["public"], "meta": meta})  # fmt: skip
    return rows


def facets(
    conn: psycopg.Connection[Any], query: str, names: list[str], **kw: Any
) -> dict[str, dict[str, tuple[int, int]]]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    found: dict[str, dict[str, tuple[int, int]]] = {}
    for facet, value, docs, chunks in conn.execute(
        f"select * from kb.facets(%(q)s, %(names)s, top_values => 1000{args})",
        {"q": query, "names": names, **kw},
    ).fetchall():
        found.setdefault(facet, {})[value] = (docs, chunks)
    return found


def brute(rows: list[dict[str, Any]], values: Any) -> dict[str, tuple[int, int]]:
    docs: dict[str, set[int]] = {}
    chunks: Counter[str] = Counter()
    for row in rows:
        for value in set(values(row)):
            docs.setdefault(value, set()).add(row["doc"])
            chunks[value] += 1
    return {v: (len(docs[v]), chunks[v]) for v in docs}


FIELDS = {
    "category": lambda r: [r["category"]] if r["category"] else [],
    "labels": lambda r: r["labels"],
    "groups": lambda r: r["groups"],
    "metadata.year": lambda r: [str(r["meta"]["year"])],
    "metadata.tags": lambda r: r["meta"]["tags"],
}


@pytest.mark.parametrize(
    ("query", "kw", "keep"),
    [
        ("permit", {}, lambda r: "permit" in r["text"]),
        ("", {}, lambda r: True),
        (
            "permits",
            {"category": "faq"},
            lambda r: "permit" in r["text"] and r["category"] == "faq",
        ),
        ("permit", {"groups": ["hr"]}, lambda r: "permit" in r["text"] and "hr" in r["groups"]),
        (
            "permit",
            {"filter": '{"year": {"$gte": 2020}}'},
            lambda r: "permit" in r["text"] and r["meta"]["year"] >= 2020,
        ),
        ("permit", {"labels": ["fees"]}, lambda r: "permit" in r["text"] and "fees" in r["labels"]),
    ],
)
def test_counts_equal_a_brute_force_count(conn, corpus, query, kw, keep):
    got = facets(conn, query, list(FIELDS), **kw)
    kept = [r for r in corpus if keep(r)]
    for name, values in FIELDS.items():
        assert got.get(name, {}) == brute(kept, values), name


def test_values_with_most_documents_first_cut_at_top_values(conn, corpus):
    rows = conn.execute(
        "select value, documents from kb.facets('', '{metadata.year}', top_values => 2)"
    ).fetchall()
    every = brute(corpus, FIELDS["metadata.year"])
    best = sorted(every.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:2]
    assert [(v, d) for v, d in rows] == [(v, c[0]) for v, c in best]


@pytest.mark.parametrize(
    ("names", "top", "message"),
    [
        ([], 10, "facets takes 1 to 20 field names"),
        (["nope"], 10, "unknown facet nope"),
        (["metadata."], 10, 'the key "" at facets has an empty part'),
        (["category"], 0, "top_values must be between 1 and 1000"),
    ],
)
def test_bad_facets_are_refused(conn, corpus, names, top, message):
    with raises_sqlstate(conn, "KB004" if "empty part" in message else "22023") as info:
        conn.execute("select * from kb.facets('permit', %s, top_values => %s)", (names, top))
    assert message in info.value.diag.message_primary


def test_a_hostile_metadata_key_is_only_a_key(conn, corpus):
    # the key goes into a jsonpath literal as a quoted JSON string: no SQL, no path syntax
    for key in ["year') or true --", 'year" || $.tags', "year'); drop table kb.chunks; --"]:
        rows = conn.execute(
            "select * from kb.facets('', %s::text[])", ([f"metadata.{key}"],)
        ).fetchall()
        assert rows == [], key
    assert conn.execute("select count(*) from kb.chunks").fetchone() == (len(corpus),)
