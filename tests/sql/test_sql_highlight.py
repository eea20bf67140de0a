"""kb.highlight: the query's words marked whole, from the lexemes (English and Russian
inflections, CJK bigrams), and the snippet holding most of them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.sqldata import raises_sqlstate


def highlight(
    conn: psycopg.Connection[Any], content: str, query: str, length: int = 200
) -> tuple[list[str], str, int, int]:
    row = conn.execute(
        "select highlights, snippet, snippet_start, snippet_end from kb.highlight(%s, %s, %s)",
        (content, query, length),
    ).fetchone()
    assert row is not None
    marks, snippet, start, end = row
    return [content[a:b] for a, b in marks], snippet, start, end


def test_english_words_are_marked_whole_from_their_lexemes(conn):
    text = "Renewals of parking permits: renew your e-mail permit-holder card, or the renewal form."
    marked, snippet, start, end = highlight(conn, text, "renewing a permit")
    # "renew|al" is one word: marked whole (a stem prefix would mark "Renew" of "Renewals");
    # the hyphenated word's part "permit" is marked, not "holder"; "a" is a stop word
    assert marked == ["Renewals", "permits", "renew", "permit", "renewal"]
    assert (snippet, start, end) == (text, 0, len(text))


def test_russian_inflections(conn):
    conn.execute("select kb.set_language('russian')")
    text = "Продление разрешения на парковку: разрешение продлевают онлайн."
    marked, *_ = highlight(conn, text, "разрешение на парковку")
    assert marked == ["разрешения", "парковку", "разрешение"]


def test_cjk_bigrams(conn):
    conn.execute("select kb.set_language('cjk')")
    text = "停车许可证可以在网上续期。许可证过期前请续期。"
    marked, *_ = highlight(conn, text, "许可证续期")
    # the query's bigrams 许可, 可证, 续期 where they occur, overlapping ones merged
    assert marked == ["许可证", "续期", "许可证", "续期"]


def test_the_snippet_is_the_window_with_most_marks_cut_at_spaces(conn):
    filler = "lorem ipsum dolor sit amet " * 20
    text = filler + "renew the parking permit before it expires " + "lorem ipsum " * 30
    marked, snippet, start, end = highlight(conn, text, "renewing permits", 60)
    assert marked == ["renew", "permit"]
    assert snippet == text[start:end] and len(snippet) <= 60
    assert "renew the parking permit" in snippet
    assert text[start - 1] == " " and text[end] == " "  # whole words at both ends
    # most marks win over the first mark
    text = "permit " + "x " * 100 + "renew permit renew permit " + "y " * 100
    _, snippet, *_ = highlight(conn, text, "renew permit", 40)
    assert snippet.count("permit") == 2 and snippet.count("renew") == 2


def test_no_match_and_bad_input(conn):
    assert highlight(conn, "nothing here", "permit") == ([], "nothing here", 0, 12)
    assert highlight(conn, "a text", "the") == ([], "a text", 0, 6)  # only stop words
    long = "word " * 100
    assert highlight(conn, long, "permit", 30)[1] == "word word word word word word"  # 29 of 30
    with raises_sqlstate(conn, "22023"):
        highlight(conn, "text", "permit", 5)
    row = conn.execute(
        "select highlights from kb.highlight('a \x01b\x02 permit', 'permit')"
    ).fetchone()
    assert row is not None and row[0] == [[6, 12]]  # the markers ts_headline uses, in the text


@pytest.mark.parametrize("length", [20, 200, 10000])
def test_marks_outside_the_snippet_are_still_listed(conn, length):
    text = " ".join(["permit"] + ["word"] * 400 + ["permit"])
    row = conn.execute(
        "select highlights from kb.highlight(%s, 'permit', %s)", (text, length)
    ).fetchone()
    assert row is not None
    assert json.loads(json.dumps(row[0])) == [[0, 6], [len(text) - 6, len(text)]]
