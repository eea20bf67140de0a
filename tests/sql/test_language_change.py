"""Changing a knowledge base's language as a user does (`kbpg db upgrade --language`): one
transaction, so a kill -9 in the middle leaves the old language whole; exact afterwards; an
existing database keeps english through the migration; the CLI says what it did."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kbpg.errors import KbpgError
from kbpg.store import db as kdb
from tests.helpers import KBPG, clean_env, run_kbpg

# every chunk's text analysed as the trigger would in the recorded language, and compared
STALE_CHUNKS = """
select count(*) from kb.chunks c
 where c.tsv is distinct from
       setweight(kb.text_tsvector(c.section), 'A') || setweight(kb.text_tsvector(c.content), 'B')
       || setweight(kb.text_tsvector(coalesce(c.context, '')), 'C')
"""
SNAPSHOT = """
select (select name from kb.language),
       (select pg_catalog.pg_get_triggerdef(t.oid) from pg_catalog.pg_trigger t
         where t.tgrelid = 'kb_data.chunks'::regclass and t.tgname = 'chunks_text_search'),
       (select md5(string_agg(tsv::text || ':' || token_count, ',' order by id)) from kb.chunks),
       (select row(chunk_count, total_tokens)::text from kb.corpus_stats),
       (select md5(string_agg(lexeme || ':' || doc_freq, ',' order by lexeme)) from kb.lexeme_stats),
       (select md5(string_agg(lexeme || block_no || impacts::text, ',' order by lexeme, block_no))
          from kb.lexical_blocks),
       (select row(watermark, avgdl)::text from kb.lexical_state)
"""
WORDS = [
    "книга",
    "книги",
    "книгой",
    "книгу",
    "читать",
    "читаю",
    "читал",
    "библиотека",
    "библиотеки",
    "полка",
    "полке",
    "город",
    "города",
    "городом",
    "улица",
    "улицы",
    "дом",
    "дома",
    "домом",
    "река",
    "реки",
    "рекой",
    "house",
    "houses",
    "reading",
    "read",
]


def fill(url: str, chunks: int, *, refresh: bool = True) -> None:
    """`chunks` chunks of 30 words drawn from WORDS (Russian inflections and some English)."""
    with kdb.connect(url) as conn:
        conn.execute("insert into kb.documents (source, content_hash) values ('bulk', 'h')")
        conn.execute(
            "insert into kb.chunks (document_id, ordinal, content)"
            " select d.id, g, (select string_agg((%s::text[])[1 + (g * 7 + i * 13 + i * i * g) %% %s],"
            " ' ') from generate_series(1, 30) i)"
            " from kb.documents d, generate_series(0, %s - 1) g",
            (WORDS, len(WORDS), chunks),
        )
        if refresh:
            conn.execute("select kb.refresh_lexical_index()")
        conn.commit()


def snapshot(url: str) -> tuple[Any, ...]:
    with kdb.connect(url) as conn:
        row = conn.execute(SNAPSHOT).fetchone()
        assert row is not None
        return tuple(row)


def recount_corrects(url: str) -> int:
    with kdb.connect(url) as conn:
        row = conn.execute("select lexemes_corrected from kb.recount_bm25_statistics()").fetchone()
        conn.rollback()  # only the count: the statistics stay as the triggers kept them
        assert row is not None
        return int(row[0])


def wait_for_backend_gone(url: str, marker: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    with kdb.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "select count(*) from pg_stat_activity where query like %s and pid <> pg_backend_pid()",
                (f"%{marker}%",),
            ).fetchone()
            if row == (0,):
                return
            time.sleep(0.2)
    pytest.fail("the killed client's backend is still running")


def test_kill_9_in_the_middle_leaves_the_old_language_whole(db_url: str) -> None:
    fill(db_url, 40_000)
    before = snapshot(db_url)
    assert before[0] == "english"
    env = clean_env(KBPG_DATABASE_URL=db_url)
    process = subprocess.Popen(
        [KBPG, "db", "upgrade", "--language", "russian"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    try:
        # the first batch re-analysed (of eight): kill the client there
        for line in process.stderr:
            if "re-analysed" in line:
                assert "/40,000" in line and "40,000/40,000" not in line, line
                os.kill(process.pid, signal.SIGKILL)
                break
        else:
            pytest.fail(f"no progress line; exit {process.wait()}")
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    # its backend rolls back when it next reads from the dead client
    wait_for_backend_gone(db_url, "_language_")
    assert snapshot(db_url) == before
    with kdb.connect(db_url) as conn:
        assert conn.execute(STALE_CHUNKS).fetchone() == (0,)
    assert recount_corrects(db_url) == 0

    done = run_kbpg("db", "upgrade", "--language", "russian", env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "language: russian (was english; 40,000 chunks re-analysed" in done.stdout
    assert "russian: re-analysed 40,000/40,000 chunks (100%)" in done.stderr
    after = snapshot(db_url)
    assert after[0] == "russian" and "_chunks_text_search_language('russian')" in after[1]
    assert after[2:] != before[2:]
    with kdb.connect(db_url) as conn:
        assert conn.execute(STALE_CHUNKS).fetchone() == (0,)
        # книга, книги, книгой, книгу: one lexeme now
        row = conn.execute(
            "select count(*) from kb.lexeme_stats where lexeme like 'книг%%'"
        ).fetchone()
        assert row == (1,)
    assert recount_corrects(db_url) == 0


def test_an_existing_database_keeps_english_through_the_migration(new_database) -> None:
    url = new_database(migrated=False)
    kdb.upgrade(url, "0011")  # not at head: sql/'s functions are not there yet
    fill(url, 300, refresh=False)
    with kdb.connect(url) as conn:
        old = conn.execute("select id, tsv, token_count from kb.chunks order by id").fetchall()
    kdb.upgrade(url)
    with kdb.connect(url) as conn:
        assert conn.execute("select name from kb.language").fetchone() == ("english",)
        assert (
            conn.execute("select id, tsv, token_count from kb.chunks order by id").fetchall() == old
        )
        # new chunks are analysed as 0011 analysed them
        conn.execute(
            "insert into kb.chunks (document_id, ordinal, content)"
            " select id, 1000, 'Reading houses' from kb.documents"
        )
        row = conn.execute("select tsv::text from kb.chunks where ordinal = 1000").fetchone()
        assert row == ("'hous':2B 'read':1B",)
        conn.execute("select kb.set_language('russian')")
        conn.commit()
    # 0011 knows english only: the downgrade refuses until the language is english again
    with pytest.raises(KbpgError, match="in russian"):
        kdb.downgrade(url, "0011")
    with kdb.connect(url) as conn:
        conn.execute("select kb.set_language('english')")
        conn.commit()
    kdb.downgrade(url, "0011")
    with kdb.connect(url) as conn:
        trigger = conn.execute(
            "select pg_catalog.pg_get_triggerdef(oid) from pg_catalog.pg_trigger"
            " where tgrelid = 'kb.chunks'::regclass and tgname = 'chunks_text_search'"
        ).fetchone()
        assert trigger is not None and "kb._chunks_text_search()" in trigger[0]
    kdb.upgrade(url)


def test_cli_language_and_stats(db_url: str, tmp_path: Path) -> None:
    env = clean_env(KBPG_DATABASE_URL=db_url)
    up = run_kbpg("db", "upgrade", "--language", "russian", env=env)
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[-1].startswith(
        "language: russian (was english; 0 chunks re-analysed, 0 lexemes, 0 cache blocks rebuilt"
    )
    # a Russian knowledge base gets the multilingual model: nothing to warn about
    assert "warning" not in up.stderr
    # MiniLM named: English only, its vector arm is left out
    minilm = run_kbpg(
        "db", "upgrade", "--language", "russian", env={**env, "KBPG_EMBEDDER": "minilm"}
    )
    assert "warning: the knowledge base's language is russian, but all-MiniLM-L6-v2" in (
        minilm.stderr
    )
    assert "reembed --embedder e5-multilingual" in minilm.stderr
    again = run_kbpg(
        "db", "upgrade", env=clean_env(KBPG_DATABASE_URL=db_url, KBPG_LANGUAGE="Russian")
    )
    assert again.stdout.splitlines()[-1] == "language: russian (unchanged)"
    stats = run_kbpg("stats", env=env)
    assert stats.returncode == 0 and stats.stdout.splitlines()[0] == "language: russian"

    doc = tmp_path / "книги.md"
    doc.write_text("# Библиотека\n\nВ библиотеке много книг. Он пришёл с книгой.\n")
    ingest = run_kbpg("ingest", str(doc), env=env)
    assert ingest.returncode == 0, ingest.stderr
    assert "warning: the knowledge base's language is russian" not in ingest.stderr
    assert "multilingual-e5-small" in run_kbpg("stats", env=env).stdout
    found = run_kbpg("search", "книги", "--json", env=env)
    assert found.returncode == 0 and "книгой" in found.stdout

    other = run_kbpg(
        "ingest", str(doc), env=clean_env(KBPG_DATABASE_URL=db_url, KBPG_LANGUAGE="de")
    )
    assert other.returncode == 1
    assert "Error: unknown language de" in other.stderr
    german = run_kbpg(
        "ingest", str(doc), env=clean_env(KBPG_DATABASE_URL=db_url, KBPG_LANGUAGE="german")
    )
    assert german.returncode == 1
    assert "Error: KBPG_LANGUAGE is german, but this knowledge base is in russian" in german.stderr
    assert "kbpg db upgrade --language german" in german.stderr

    bad = run_kbpg("db", "upgrade", "--language", "klingon", env=env)
    assert bad.returncode == 1
    assert "Error: unknown language klingon" in bad.stderr
