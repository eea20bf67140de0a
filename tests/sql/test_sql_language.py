"""A knowledge base's language (sql/015, revision 0012): chunks and queries analysed alike, in
the language's text search configuration or as CJK bigrams; exact ranked ids on hand-built
Russian, German, Chinese, Japanese and Korean chunks; statistics exact after every change."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sqldata import add_chunk, add_doc, ids, raises_sqlstate


def lexical(conn: psycopg.Connection[Any], query: str, k: int = 10) -> list[int]:
    return ids(conn.execute("select * from kb.search_lexical(%s, %s)", (query, k)).fetchall())


def set_language(conn: psycopg.Connection[Any], language: str) -> tuple[Any, ...]:
    row = conn.execute("select * from kb.set_language(%s)", (language,)).fetchone()
    assert row is not None
    return tuple(row)


def assert_statistics_exact(conn: psycopg.Connection[Any]) -> None:
    """What the triggers kept equals a recount from the chunks (nothing corrected)."""
    before = conn.execute(
        "select chunk_count, total_tokens, (select count(*) from kb.lexeme_stats)"
        " from kb.corpus_stats"
    ).fetchone()
    row = conn.execute(
        "select chunk_count, total_tokens, lexemes, lexemes_corrected"
        " from kb.recount_bm25_statistics()"
    ).fetchone()
    assert row is not None and before is not None
    assert row[3] == 0
    assert tuple(row[:3]) == tuple(before)


def assert_cache_agrees(conn: psycopg.Connection[Any], queries: list[str]) -> None:
    """Through the impact cache (rebuilt by the change) and exhaustively: the same ranking."""
    exhaustive = {q: lexical(conn, q) for q in queries}
    conn.execute("set local kb.lexical_exhaustive_limit = 0")
    assert {q: lexical(conn, q) for q in queries} == exhaustive
    conn.execute("reset kb.lexical_exhaustive_limit")


def test_a_new_knowledge_base_is_in_english(conn):
    assert conn.execute("select name from kb.language").fetchone() == ("english",)
    trigger = conn.execute(
        "select pg_catalog.pg_get_triggerdef(oid) from pg_catalog.pg_trigger"
        " where tgrelid = 'kb_data.chunks'::regclass and tgname = 'chunks_text_search'"
    ).fetchone()
    assert trigger is not None and "_chunks_text_search_language('english')" in trigger[0]


def test_russian_inflected_forms_find_each_other(conn):
    doc = add_doc(conn, "ru")
    shelf = add_chunk(conn, doc, "Книги, книги и ещё раз книги на полке")
    came = add_chunk(conn, doc, "Он пришёл с книгой")
    square = add_chunk(conn, doc, "Красная площадь в Москве")
    conn.execute("select kb.refresh_lexical_index()")
    # english: Cyrillic words are kept as written, so only the exact form matches
    assert lexical(conn, "книгой") == [came]
    assert lexical(conn, "книги") == [shelf]

    before, after, chunks, _, _ = set_language(conn, "russian")
    assert (before, after, chunks) == ("english", "russian", 3)
    # both forms stem to книг: three occurrences beat one (the longer chunk notwithstanding)
    assert lexical(conn, "книгой") == [shelf, came]
    assert lexical(conn, "книги") == [shelf, came]
    assert lexical(conn, "книга -полке") == [came]
    assert lexical(conn, "площади") == [square]
    assert_statistics_exact(conn)
    assert_cache_agrees(conn, ["книгой", "площадь", "книги -полка"])


def test_german_inflected_forms_find_each_other(conn):
    doc = add_doc(conn, "de")
    houses = add_chunk(conn, doc, "Die Häuser der Altstadt sind alt")
    house = add_chunk(conn, doc, "Ein Haus am See")
    garden = add_chunk(conn, doc, "Der Garten blüht")
    assert lexical(conn, "Haus") == [house]
    set_language(conn, "german")
    # one occurrence each: the shorter chunk first (haus see vs haus altstadt alt)
    assert lexical(conn, "Haus") == [house, houses]
    assert lexical(conn, "Häusern") == [house, houses]
    assert lexical(conn, "Gärten") == [garden]
    assert_statistics_exact(conn)


def test_cjk_analysis(conn):
    def lexemes(text: str) -> list[str]:
        row = conn.execute(
            "select tsvector_to_array(kb.text_tsvector(%s, 'cjk'))", (text,)
        ).fetchone()
        assert row is not None
        return sorted(row[0])

    assert lexemes("北京大学") == sorted(["北京", "京大", "大学"])
    assert lexemes("日") == ["日"]
    assert lexemes("東京へ行く") == sorted(["東京", "京へ", "へ行", "行く"])
    assert lexemes("한국어 텍스트") == sorted(["한국", "국어", "텍스", "스트"])
    # other scripts as simple words; NFKC folds full-width Latin and digits
    assert lexemes("新しいiPhone15を購入") == sorted(["新し", "しい", "iphone15", "を購", "購入"])
    assert lexemes("ＮＦＬ") == ["nfl"]
    # tf: each occurrence of a bigram counts
    row = conn.execute(
        "select array_length(positions, 1) from unnest(kb.text_tsvector('北京，北京', 'cjk'))"
    ).fetchone()
    assert row == (2,)


def test_chinese_word_found_inside_a_sentence(conn):
    doc = add_doc(conn, "zh")
    campus = add_chunk(conn, doc, "我们在北京大学学习中文")
    shanghai = add_chunk(conn, doc, "上海是中国最大的城市")
    capital = add_chunk(conn, doc, "北京是中国的首都，北京很大")
    conn.execute("select kb.refresh_lexical_index()")
    # english: PostgreSQL's parser keeps each clause as one token
    assert lexical(conn, "北京") == []

    set_language(conn, "cjk")
    # 北京 twice against once, both chunks ten bigrams long
    assert lexical(conn, "北京") == [capital, campus]
    assert lexical(conn, "大学") == [campus]
    assert lexical(conn, "中国的城市") == [shanghai, capital]
    # -word and quoted phrases as in any language
    assert lexical(conn, "中国 -首都") == [shanghai]
    assert lexical(conn, '"北京大学"') == [campus, capital]
    # a negated word excludes the chunks holding all of its bigrams, not any one of them:
    # capital holds 北京 but not 京大 / 大学
    assert lexical(conn, "北京 -北京大学") == [capital]
    assert_statistics_exact(conn)
    assert_cache_agrees(conn, ["北京", "中国 -首都", "北京 -北京大学"])


def test_mixed_cjk_and_latin_chunks_found_by_either_part(conn):
    doc = add_doc(conn, "mixed")
    laptop = add_chunk(conn, doc, "苹果公司发布了新款MacBook Pro笔记本电脑")
    surface = add_chunk(conn, doc, "微软发布了Surface Laptop")
    phone = add_chunk(conn, doc, "新しいiPhone15を購入しました")
    tower = add_chunk(conn, doc, "東京タワーの高さは333メートルです")
    part = add_chunk(conn, doc, "型番ABC-1234の部品を交換")
    korean = add_chunk(conn, doc, "한국어 텍스트 검색")
    set_language(conn, "cjk")
    assert lexical(conn, "MacBook") == [laptop]
    assert lexical(conn, "笔记本") == [laptop]
    # a query word of both scripts: its Latin part and its bigrams (two of m1's against one)
    assert lexical(conn, "Surface笔记本") == [laptop, surface]
    assert lexical(conn, "iPhone15") == [phone]
    assert lexical(conn, "購入") == [phone]
    assert lexical(conn, "東京タワー") == [tower]
    assert lexical(conn, "ABC-1234") == [part]
    assert lexical(conn, "部品") == [part]
    assert lexical(conn, "텍스트") == [korean]
    assert lexical(conn, "发布 -MacBook") == [surface]
    assert_statistics_exact(conn)


def test_queries_parse_in_the_knowledge_bases_language(conn):
    set_language(conn, "russian")
    row = conn.execute("select * from kb._query_terms('книгой -площадь')").fetchone()
    assert row is not None
    assert (row[0], row[1]) == (["книг"], ["площад"])
    set_language(conn, "cjk")
    row = conn.execute("select * from kb._query_terms('北京大学 -东京')").fetchone()
    assert row is not None
    assert (sorted(row[0]), row[1]) == (sorted(["北京", "京大", "大学"]), ["东京"])


def test_changing_back_and_forth_keeps_statistics_exact(conn):
    doc = add_doc(conn, "many")
    for i in range(40):
        add_chunk(conn, doc, f"Книги {i} и книгой, 北京大学 {i % 7}, houses house {i % 3}")
    conn.execute("select kb.refresh_lexical_index()")
    english = lexical(conn, "house")
    for language in ("russian", "cjk", "simple", "english"):
        set_language(conn, language)
        assert_statistics_exact(conn)
    assert lexical(conn, "house") == english
    # the same language again: nothing to do
    assert set_language(conn, "english")[:3] == ("english", "english", 40)


def test_language_names(conn):
    assert set_language(conn, "Russian")[1] == "russian"
    assert set_language(conn, " CJK ")[1] == "cjk"
    names = {r[0] for r in conn.execute("select language from kb.languages()")}
    assert {"cjk", "english", "russian", "german", "simple"} <= names
    assert len(names) >= 31  # cjk, simple and the 29 Snowball languages of PostgreSQL 15+
    with raises_sqlstate(conn, "22023") as info:
        conn.execute("select kb.set_language('klingon')")
    assert "russian" in (info.value.diag.message_hint or "")
    with raises_sqlstate(conn, "22023"):
        conn.execute("select kb.set_language('')")


def test_a_dbas_own_configuration(conn):
    conn.execute("create text search configuration public.kbpg_t_plain (copy = pg_catalog.simple)")
    doc = add_doc(conn, "dba")
    chunk = add_chunk(conn, doc, "Running runners run")
    # found by name in another schema, recorded qualified (functions pin their search_path)
    assert set_language(conn, "kbpg_t_plain")[1] == "public.kbpg_t_plain"
    assert conn.execute("select name from kb.language").fetchone() == ("public.kbpg_t_plain",)
    assert lexical(conn, "running") == [chunk]
    assert lexical(conn, "run") == [chunk]
    assert lexical(conn, "runs") == []  # no stemming in a copy of simple
    add_chunk(conn, doc, "runs")  # new chunks are analysed with it too
    assert len(lexical(conn, "runs")) == 1
    assert_statistics_exact(conn)


def test_steps_refuse_outside_a_change(conn):
    with raises_sqlstate(conn, "55000"):
        conn.execute("select kb._language_reanalyse(10)")
    with raises_sqlstate(conn, "55000"):
        conn.execute("select * from kb._language_change_finish()")
    doc = add_doc(conn, "half")
    for i in range(5):
        add_chunk(conn, doc, f"книги {i}")
    conn.execute("select * from kb._language_change_begin('russian')")
    assert conn.execute("select kb._language_reanalyse(2)").fetchone() == (2,)
    # three chunks still in english: refused, never a half-analysed knowledge base
    with raises_sqlstate(conn, "55000") as info:
        conn.execute("select * from kb._language_change_finish()")
    assert "3 chunks" in info.value.diag.message_primary


@pytest.mark.parametrize("language", ["russian", "cjk"])
def test_search_through_kb_search_uses_the_language(conn, language):
    doc = add_doc(conn, "api")
    hit = add_chunk(conn, doc, "Книгой 北京大学")
    add_chunk(conn, doc, "Площадь 上海")
    set_language(conn, language)
    query = "книги" if language == "russian" else "大学"
    rows = conn.execute("select chunk_id from kb.search(%s)", (query,)).fetchall()
    assert [r[0] for r in rows] == [hit]
