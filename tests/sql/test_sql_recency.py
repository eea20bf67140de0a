"""kb.search's recency: a half-life applied after fusion, never inside an arm's order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, raises_sqlstate


def ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).isoformat()


@pytest.fixture
def kb(conn: psycopg.Connection[Any]) -> dict[str, int]:
    conn.execute("select kb.set_embedding_space('test-model', 3)")
    # the lexical order for "permit renewal" is old, month, undated (BM25: shorter first)
    old = add_doc(conn, "old.md", metadata={"published": ago(730)})
    month = add_doc(conn, "month.md", metadata={"published": ago(30), "meta": {"on": ago(90)}})
    undated = add_doc(conn, "undated.md", metadata={"published": "not a date"})
    return {
        "old": add_chunk(conn, old, "permit renewal permit", [1, 0, 0]),
        "month": add_chunk(conn, month, "permit renewal", [0.9, 0.1, 0]),
        "undated": add_chunk(conn, undated, "permit renewal office hours today", [0, 1, 0]),
    }


def ranked(conn: psycopg.Connection[Any], **kw: Any) -> list[tuple[int, float, int]]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    rows = conn.execute(
        f"select chunk_id, score, fused_rank from kb.search('permit renewal'{args})", kw
    ).fetchall()
    return [(int(r[0]), float(r[1]), int(r[2])) for r in rows]


def test_recency_decays_fused_scores_by_the_documents_age(conn, kb):
    plain = ranked(conn)
    assert [r[0] for r in plain] == [kb["old"], kb["month"], kb["undated"]]
    fused = {cid: score for cid, score, _ in plain}
    recent = ranked(conn, recency="30 days", recency_key="published")
    # undated (no date under the key: its updated_at, just now) keeps its score; a month-old
    # document's halves; a two-year-old one's nearly vanishes
    assert [r[0] for r in recent] == [kb["undated"], kb["month"], kb["old"]]
    scores = {cid: score for cid, score, _ in recent}
    assert scores[kb["undated"]] == pytest.approx(fused[kb["undated"]], rel=1e-3)
    assert scores[kb["month"]] == pytest.approx(fused[kb["month"]] / 2, rel=1e-3)
    assert scores[kb["old"]] == pytest.approx(fused[kb["old"]] * 0.5 ** (730 / 30), rel=1e-3)
    assert [r[2] for r in recent] == [1, 2, 3]  # fused_rank: the order the cap saw


def test_a_nested_key_and_the_updated_time(conn, kb):
    nested = ranked(conn, recency="90 days", recency_key="meta.on")
    scores = {cid: score for cid, score, _ in nested}
    plain = {cid: score for cid, score, _ in ranked(conn)}
    assert scores[kb["month"]] == pytest.approx(plain[kb["month"]] / 2, rel=1e-3)
    # without a key every document's updated_at (all just now): the order stands
    assert [r[0] for r in ranked(conn, recency="30 days")] == [r[0] for r in ranked(conn)]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"recency": "-1 day"}, "recency must be a positive half-life"),
        ({"recency": "0"}, "recency must be a positive half-life"),
        ({"recency": "infinity"}, "recency must be a positive half-life"),
        ({"recency_key": "published"}, "recency_key given without recency"),
        ({"recency": "1 day", "recency_key": "a..b"}, 'the key "a..b" at recency_key'),
    ],
)
def test_bad_recency_is_refused(conn, kb, kw, message):
    with raises_sqlstate(conn, "22023" if "a..b" not in message else "KB004") as info:
        ranked(conn, **kw)
    assert message in info.value.diag.message_primary
