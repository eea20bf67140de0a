"""The language of a knowledge base under access control: a reader searches in russian and cjk
through the reader API (which reads kb.language with its owner's rights) and reads only what
its grants allow; it neither reads nor changes kb.language; a writer reads it but changes it
only the owner's way (kb.set_language, which re-analyses every chunk)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.accessdata import AccessKb, build, login_roles
from tests.sqldata import add_chunk


@pytest.fixture
def kb(admin_url: str, new_database: Callable[..., str]) -> Iterator[AccessKb]:
    with login_roles(admin_url, ["alice", "bob", "dave", "walt"]) as roles:
        akb = build(new_database(), roles)
        with akb.connect("owner") as conn:
            conn.execute("select kb.access_enable()")
        yield akb


def language_of(akb: AccessKb) -> tuple[str, str]:
    """kb.language's name and the chunk trigger's argument, as the owner sees them."""
    with akb.connect("owner") as conn:
        row = conn.execute(
            "select (select name from kb.language),"
            " (select pg_catalog.pg_get_triggerdef(oid) from pg_catalog.pg_trigger"
            "   where tgrelid = 'kb_data.chunks'::regclass and tgname = 'chunks_text_search')"
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def lexical_ids(akb: AccessKb, who: str, query: str) -> set[int]:
    with akb.connect(who) as conn:
        rows = conn.execute("select chunk_id from kb.search_lexical(%s, 50)", (query,)).fetchall()
    return {int(r[0]) for r in rows}


@pytest.mark.parametrize(
    ("language", "texts", "query"),
    [
        # книги / книгу / книгой: one lexeme in russian only
        (
            "russian",
            (
                "Книги о зарплате сотрудников",
                "Книгу бюджета ведёт финансовый отдел",
                "Справочник по парковке с книгой",
            ),
            "книга",
        ),
        # 报告 ("report") as one of each text's bigrams
        ("cjk", ("工资报告", "预算报告", "停车报告"), "报告"),
    ],
)
def test_a_reader_searches_in_the_knowledge_bases_language_through_the_functions(
    kb: AccessKb, language: str, texts: tuple[str, str, str], query: str
) -> None:
    with kb.connect("owner") as conn:
        conn.execute("select * from kb.set_language(%s)", (language,))
        hr_text, finance_text, public_text = texts
        new = {
            "hr": add_chunk(conn, kb.ids["hr"], hr_text, [0, 0, 1]),
            "fin": add_chunk(conn, kb.ids["fin"], finance_text, [0, 0, 1]),
            "pub": add_chunk(conn, kb.ids["pub"], public_text, [0, 0, 1]),
        }
        conn.execute("select * from kb.refresh_lexical_index()")
        assert lexical_ids(kb, "owner", query) == set(new.values())
    # alice (hr), bob (finance through team), dave (no grants): each their own share
    assert lexical_ids(kb, "alice", query) == {new["hr"], new["pub"]}
    assert lexical_ids(kb, "bob", query) == {new["fin"], new["pub"]}
    assert lexical_ids(kb, "dave", query) == {new["pub"]}
    with kb.connect("alice") as conn:
        rows = conn.execute(
            "select chunk_id from kb.search(%s, match_count => 50)", (query,)
        ).fetchall()
        assert {int(r[0]) for r in rows} == {new["hr"], new["pub"]}
        # what language the knowledge base is in: through kb.stats(), not the table
        assert conn.execute("select language from kb.stats()").fetchone() == (language,)


def test_a_reader_neither_reads_nor_changes_the_language(kb: AccessKb) -> None:
    with kb.connect("alice") as conn:
        for sql in (
            "select name from kb.language",
            "update kb.language set name = 'russian'",
            "select * from kb.set_language('russian')",
            "select kb.text_tsvector('книги')",  # reads kb.language with the caller's rights
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        assert conn.execute("select language from kb.stats()").fetchone() == ("english",)
    name, trigger = language_of(kb)
    assert name == "english" and "_chunks_text_search_language('english')" in trigger


def test_a_writer_reads_the_language_but_only_the_owner_changes_it(kb: AccessKb) -> None:
    """kb.language is what queries are parsed in, the trigger's argument what chunks are analysed
    in: an UPDATE of the table alone would make every query miss (a writer could, before)."""
    with kb.connect("walt") as conn:
        assert conn.execute("select name from kb.language").fetchone() == ("english",)
        for sql in (
            "update kb.language set name = 'russian'",
            "delete from kb.language",
            "insert into kb.language default values",
            "truncate kb_data.language",
            "select * from kb.set_language('russian')",  # re-creates the trigger: the owner's
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
    name, trigger = language_of(kb)
    assert name == "english" and "_chunks_text_search_language('english')" in trigger
    with kb.connect("owner") as conn:
        conn.execute("select * from kb.set_language('russian')")
    assert language_of(kb)[0] == "russian"
    with kb.connect("walt") as conn:
        assert conn.execute("select name from kb.language").fetchone() == ("russian",)
