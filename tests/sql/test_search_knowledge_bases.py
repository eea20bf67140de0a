"""kb.search_knowledge_bases (issue 39): one hybrid search across knowledge bases that share an
embedding space, each searched with its own BM25 statistics, the arms merged by score, fused
and capped as kb.search, every chunk labelled with its knowledge base.

Checked against kb.search itself (one knowledge base: the same ranking) and against a reference
written here from the arms each knowledge base answers alone (several)."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, raises_sqlstate, vec

WORDS = [
    "permit",
    "parking",
    "salary",
    "budget",
    "renew",
    "online",
    "staff",
    "review",
    "memo",
    "forecast",
    "rules",
    "office",
]
QUERIES = [
    ("parking permit", [1.0, 0.2, 0.0]),
    ("salary review staff", [0.0, 1.0, 0.1]),
    ("renew online", None),
    (None, [0.3, 0.3, 0.9]),
    ("budget forecast memo office", [0.5, 0.5, 0.5]),
]
COLUMNS = "chunk_id, score, similarity, vector_rank, lexical_rank, fused_rank"


def use(conn: psycopg.Connection[Any], kb_id: int) -> None:
    conn.execute("select set_config('kbpg.kb_id', %s, false)", (str(kb_id),))


def fill(conn: psycopg.Connection[Any], seed: int, documents: int = 6) -> None:
    """Random documents of 1-5 chunks: words from WORDS, 3-d vectors, groups on some."""
    rng = random.Random(seed)
    for d in range(documents):
        groups = ["hr"] if d % 3 == 2 else []
        doc = add_doc(conn, f"doc-{seed}-{d}.md", groups=groups, category=rng.choice("xy"))
        for _ in range(rng.randint(1, 5)):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
            add_chunk(conn, doc, text, [rng.uniform(-1, 1) for _ in range(3)])
    conn.execute("select * from kb.refresh_lexical_index()")


def make(conn: psycopg.Connection[Any], name: str, seed: int, model: str = "test-model") -> int:
    row = conn.execute(
        "select kb.create_knowledge_base(%s, model_name => %s, vector_dimension => %s)",
        (name, model, 3 if model == "test-model" else 5),
    ).fetchone()
    assert row is not None
    use(conn, row[0])
    if model == "test-model":
        fill(conn, seed)
    use(conn, 1)
    return int(row[0])


@pytest.fixture
def three(db_url: str) -> Any:
    """default and `a`, `b` in one embedding space (3-d), `c` in another (5-d)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("select kb.set_embedding_space('test-model', 3)")
        fill(conn, 1)
        ids = {"default": 1}
        ids["a"] = make(conn, "a", 2)
        ids["b"] = make(conn, "b", 3)
        ids["c"] = make(conn, "c", 4, model="other-model")
        yield conn, ids


def across(
    conn: psycopg.Connection[Any], names: list[str], text: str | None, emb: Any, **kw: Any
) -> list[tuple[Any, ...]]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    return conn.execute(
        f"select knowledge_base, {COLUMNS} from kb.search_knowledge_bases(%(n)s, %(t)s,"
        f" %(e)s::vector{args}) order by rank",
        {"n": names, "t": text, "e": None if emb is None else vec(emb), **kw},
    ).fetchall()


def test_one_knowledge_base_ranks_as_kb_search(three: Any) -> None:
    conn, _ = three
    for text, emb in QUERIES:
        for kw in ({}, {"match_count": 20, "max_per_doc": 1}, {"groups": ["hr"]}):
            alone = conn.execute(
                f"select {COLUMNS} from kb.search(%(t)s, %(e)s::vector"
                + "".join(f", {k} => %({k})s" for k in kw)
                + ") order by rank",
                {"t": text, "e": None if emb is None else vec(emb), **kw},
            ).fetchall()
            assert alone, (text, kw)
            assert across(conn, ["default"], text, emb, **kw) == [
                ("default", *row) for row in alone
            ], (text, kw)


def reference(
    conn: psycopg.Connection[Any], names: dict[str, int], text: str | None, emb: Any, top: int
) -> list[tuple[str, int, float]]:
    """The arms each knowledge base answers alone (kb.search_vector, kb.search_lexical: its own
    BM25 statistics), merged by score, fused by RRF (k 60), at most 3 chunks a document in
    front, the first `top`: (knowledge base, chunk, score)."""
    pool = top * 4
    vector: list[tuple[float, int, int, int, str]] = []
    lexical: list[tuple[float, int, int, int, str]] = []
    document: dict[int, int] = {}
    for position, (name, kb_id) in enumerate(names.items()):
        use(conn, kb_id)
        if emb is not None:
            rows = conn.execute(
                "select chunk_id, document_id, similarity from kb.search_vector(%s::vector, %s)"
                " order by rank",
                (vec(emb), pool),
            ).fetchall()
            vector += [(-s, position, i, c, name) for i, (c, _, s) in enumerate(rows)]
            document.update({c: d for c, d, _ in rows})
        if text is not None:
            rows = conn.execute(
                "select chunk_id, document_id, score from kb.search_lexical(%s, %s) order by rank",
                (text, pool),
            ).fetchall()
            lexical += [(-s, position, i, c, name) for i, (c, _, s) in enumerate(rows)]
            document.update({c: d for c, d, _ in rows})
    use(conn, 1)
    score: dict[int, float] = {}
    best: dict[int, list[int | None]] = {}
    label: dict[int, str] = {}
    for arm, hits in enumerate((sorted(vector)[:pool], sorted(lexical)[:pool])):
        for rank, (_, _, _, chunk, name) in enumerate(hits, start=1):
            score[chunk] = score.get(chunk, 0.0) + 1.0 / (60 + rank)
            best.setdefault(chunk, [None, None])[arm] = rank
            label[chunk] = name
    big = 10**9
    fused = sorted(
        score,
        key=lambda c: (-score[c], best[c][0] or big, best[c][1] or big, c),
    )
    front: list[int] = []
    tail: list[int] = []
    per_document: dict[int, int] = {}
    for chunk in fused:
        per_document[document[chunk]] = per_document.get(document[chunk], 0) + 1
        (front if per_document[document[chunk]] <= 3 else tail).append(chunk)
    return [(label[c], c, score[c]) for c in (front + tail)[:top]]


def test_several_are_fused_and_labelled_as_their_arms_merged_by_score(three: Any) -> None:
    conn, ids = three
    names = {n: ids[n] for n in ("a", "default", "b")}
    labels_seen: set[str] = set()
    for text, emb in QUERIES:
        got = across(conn, list(names), text, emb, match_count=12)
        expected = reference(conn, names, text, emb, 12)
        assert [(r[0], r[1]) for r in got] == [(n, c) for n, c, _ in expected], text
        assert [r[2] for r in got] == pytest.approx([s for _, _, s in expected], abs=1e-12)
        labels_seen |= {r[0] for r in got}
        # every chunk is the knowledge base's it is labelled with
        for name, chunk, *_ in got:
            row = conn.execute(
                "select k.name from kb_data.chunks c join kb_data.knowledge_bases k"
                " on k.id = c.kb_id where c.id = %s",
                (chunk,),
            ).fetchone()
            assert row == (name,)
    assert labels_seen == {"a", "default", "b"}
    # the current knowledge base is the caller's again afterwards
    assert conn.execute("select kb._current_kb()").fetchone() == (1,)


def test_each_bm25_score_is_its_own_knowledge_base_s(three: Any) -> None:
    """A chunk's lexical score in the fused list is the one kb.search_lexical gives it in its
    knowledge base alone (its statistics, not a sum over the knowledge bases)."""
    conn, ids = three
    got = conn.execute(
        "select knowledge_base, chunk_id, lexical_rank from kb.search_knowledge_bases("
        "array['a', 'b'], 'parking permit', match_count => 50, max_per_doc => null)"
    ).fetchall()
    merged: list[tuple[float, int]] = []
    for name in ("a", "b"):
        use(conn, ids[name])
        merged += [
            (-s, c)
            for c, s in conn.execute(
                "select chunk_id, score from kb.search_lexical('parking permit', 200)"
            ).fetchall()
        ]
    use(conn, 1)
    by_rank = [c for _, c in sorted(merged)]
    assert {c: r for _, c, r in got} == {c: by_rank.index(c) + 1 for _, c, _ in got}


def test_different_embedding_spaces_are_refused(three: Any) -> None:
    conn, _ = three
    with raises_sqlstate(conn, "KB001") as info:
        across(conn, ["a", "c"], "parking", [1, 0, 0])
    assert str(info.value).startswith(
        "knowledge bases a and c hold different embedding spaces (test-model 3-d, other-model 5-d)"
    )
    assert "kbpg reembed" in (info.value.diag.message_hint or "")
    with raises_sqlstate(conn, "KB011") as info:
        across(conn, ["a", "nothing"], "parking", None)
    assert str(info.value).startswith('no knowledge base "nothing"')
    for names, message in (([], "name at least one knowledge base"), (None, "name at least")):
        with raises_sqlstate(conn, "22023") as info:
            across(conn, names, "parking", None)  # type: ignore[arg-type]
        assert str(info.value).startswith(message)
    assert conn.execute("select kb._current_kb()").fetchone() == (1,)
