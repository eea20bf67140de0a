"""kbpg sync on the real server with the real model: rows become documents and follow every
change; the backfill reports progress and resumes; rows that fail are parked; a model that is
down or refuses an input loses nothing; definitions change; access control follows the groups."""

from __future__ import annotations

import dataclasses
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kbpg.app import KnowledgeBase
from kbpg.config import Settings
from kbpg.errors import Busy, EmbeddingError, NotFound
from kbpg.ingest import tables
from kbpg.ingest.tables import SyncProgress, sync
from kbpg.ingest.writer import WRITE_LOCK_KEY
from kbpg.models.embedders import MiniLMEmbedder, OpenAIEmbedder
from kbpg.store import db as kdb
from kbpg.store import table_sources
from tests.accessdata import login_roles, url_as
from tests.embedding_server import EmbeddingServer
from tests.tablesdata import ADD_SOURCE, add_articles, count, documents, insert_article


@pytest.fixture
def app_db(db_url: str) -> str:
    """A migrated database with the articles table and its source (nothing synced yet)."""
    with kdb.connect(db_url, autocommit=True) as conn:
        add_articles(conn)
        conn.execute(ADD_SOURCE)
    return db_url


@pytest.fixture
def kb(app_db: str, embedder: MiniLMEmbedder) -> Iterator[KnowledgeBase]:
    with KnowledgeBase(app_db, embedder, pool_size=1) as knowledge_base:
        yield knowledge_base


def run(url: str, sql: str, params: Any = None) -> None:
    with kdb.connect(url, autocommit=True) as conn:
        conn.execute(sql, params)


def docs(url: str, prefix: str = "table:articles/") -> dict[str, Any]:
    with kdb.connect(url) as conn:
        return documents(conn, prefix)


def scalar(url: str, sql: str, params: Any = None) -> int:
    with kdb.connect(url) as conn:
        return count(conn, sql, params)


def test_rows_become_documents_and_follow_every_change(kb: KnowledgeBase, app_db: str) -> None:
    first = sync(kb.db, kb.models)
    assert (first.rows, first.added, first.backfill_rows, first.failed) == (3, 3, 3, 0)
    assert first.backfills["articles"].done
    stored = docs(app_db)
    assert sorted(stored) == ["table:articles/1", "table:articles/2", "table:articles/3"]
    title, groups, category, labels, metadata, chunks = stored["table:articles/2"]
    assert (title, groups, category, labels) == ("Parental leave", ["hr"], "hr", ["leave"])
    assert metadata["author"] == "bob" and metadata["updated_at"].startswith("20")
    assert chunks == ["Staff get twenty weeks of parental leave at full salary."]
    hits = kb.search("how do I renew my parking permit", top=3)
    assert hits.chunks[0].source == "table:articles/1"

    # a column the source does not read: nothing queued, nothing to do
    run(app_db, "update public.articles set view_count = view_count + 1")
    assert sync(kb.db, kb.models).rows == 0

    run(
        app_db,
        "update public.articles set body = 'Permits are renewed at the town hall.' where id = 1",
    )
    changed = sync(kb.db, kb.models)
    assert (changed.rows, changed.updated, changed.added) == (1, 1, 0)
    assert docs(app_db)["table:articles/1"][5] == ["Permits are renewed at the town hall."]
    assert kb.search("town hall", top=1).chunks[0].source == "table:articles/1"

    # NULL text: no document; text again: a document; NULL again: deleted
    with kdb.connect(app_db, autocommit=True) as conn:
        insert_article(conn, 4, "Draft", None)
    assert sync(kb.db, kb.models).empty == 1
    assert "table:articles/4" not in docs(app_db)
    run(app_db, "update public.articles set body = 'Drafts are published on Mondays.' where id = 4")
    assert sync(kb.db, kb.models).added == 1
    run(app_db, "update public.articles set body = null where id = 4")
    gone = sync(kb.db, kb.models)
    assert (gone.empty, gone.deleted) == (1, 1)
    assert "table:articles/4" not in docs(app_db)

    # a deleted row, and a key that changed: the old document goes, the new one comes
    run(app_db, "delete from public.articles where id = 2")
    run(app_db, "update public.articles set id = 33 where id = 3")
    moved = sync(kb.db, kb.models)
    assert (moved.rows, moved.deleted, moved.added) == (3, 2, 1)
    assert sorted(docs(app_db)) == ["table:articles/1", "table:articles/33"]

    # a transaction rolled back left nothing to do
    with kdb.connect(app_db) as conn:
        insert_article(conn, 50, "Never", "This row was rolled back.")
        conn.rollback()
    assert sync(kb.db, kb.models).rows == 0
    assert scalar(app_db, "select count(*) from kb.source_queue") == 0
    assert scalar(app_db, "select count(*) from kb.source_claims") == 0
    with kdb.connect(app_db) as conn:
        recount = conn.execute("select lexemes_corrected from kb.recount_bm25_statistics()")
        assert recount.fetchone() == (0,)


def test_the_backfill_reports_progress_and_resumes(embedder: MiniLMEmbedder, db_url: str) -> None:
    rows = [
        (i, f"Article {i}", f"Article number {i} explains topic {i % 7}.") for i in range(1, 121)
    ]
    with kdb.connect(db_url, autocommit=True) as conn:
        add_articles(conn, rows)
        conn.execute(ADD_SOURCE)
    events: list[SyncProgress] = []
    stop = threading.Event()

    def progress(event: SyncProgress) -> None:
        events.append(event)
        if len(events) == 2:
            stop.set()  # as SIGTERM does: the batch in hand finishes, then the run ends

    with KnowledgeBase(db_url, embedder, pool_size=1) as kb:
        # a backfill goes 4 batches at a time (kbpg.ingest.tables.BACKFILL_BATCHES)
        partial = sync(kb.db, kb.models, batch_rows=10, progress=progress, stop=stop)
        assert partial.rows == 80 and partial.released == 0
        backfill = events[-1].backfills[0]
        assert (backfill.source, backfill.total, backfill.done) == ("articles", 120, False)
        assert events[-1].rows_per_s > 0 and events[-1].eta_s(backfill) is not None
        state = table_sources.show(kb.db, "articles")
        assert (state.backfill_state, state.documents, state.claimed) == ("running", 80, 0)
        assert state.backfill_enqueued == 80
        rest = sync(kb.db, kb.models, batch_rows=10)
    assert rest.rows == 40 and rest.added == 40
    assert len(docs(db_url)) == 120
    with kdb.connect(db_url) as conn:
        assert conn.execute(
            "select backfill_state, backfill_enqueued, backfill_total from kb.table_sources"
        ).fetchone() == ("done", 120, 120)


def test_rows_that_cannot_be_ingested_are_parked_and_retried_with_backoff(
    kb: KnowledgeBase, app_db: str
) -> None:
    run(app_db, "update kb.table_sources set backfill_state = 'done'")
    with kdb.connect(app_db, autocommit=True) as conn:
        insert_article(conn, 10, "Bad group", "A row with an empty group name.", ["hr", ""])
        insert_article(conn, 11, "Too long", "word " * 400)
        insert_article(conn, 12, "Fine", "A row that is fine.")
    first = sync(kb.db, kb.models, max_text_bytes=1000)
    assert (first.rows, first.added, first.failed) == (3, 1, 2)
    parked = {e.document: e for e in table_sources.errors(kb.db)}
    assert sorted(parked) == ["table:articles/10", "table:articles/11"]
    assert parked["table:articles/10"].error == "groups holds an empty value (NULL or blank)"
    assert parked["table:articles/11"].error.startswith("text is 2 KiB, over the 1000 bytes limit")
    for error in parked.values():
        assert error.attempts == 1
        assert 25 <= (error.retry_at - error.last_failed_at).total_seconds() <= 35
    assert sorted(docs(app_db)) == ["table:articles/12"]

    # not due yet: nothing is tried again
    assert sync(kb.db, kb.models, max_text_bytes=1000).rows == 0

    # the application fixes a row: it is tried at once, and its error goes
    run(app_db, "update public.articles set visible_to = '{hr}' where id = 10")
    fixed = sync(kb.db, kb.models, max_text_bytes=1000)
    assert (fixed.rows, fixed.added, fixed.failed) == (1, 1, 0)
    assert [e.document for e in table_sources.errors(kb.db)] == ["table:articles/11"]

    # due: tried again, parked again, the wait doubled
    run(app_db, "update kb.source_errors set retry_at = now() - interval '1 s'")
    again = sync(kb.db, kb.models, max_text_bytes=1000)
    assert (again.rows, again.failed) == (1, 1)
    (error,) = table_sources.errors(kb.db)
    assert error.attempts == 2
    assert 55 <= (error.retry_at - error.last_failed_at).total_seconds() <= 65
    # asked for, at once; with a larger limit the row goes in
    assert table_sources.retry(kb.db, "articles") == 1
    final = sync(kb.db, kb.models)
    assert (final.rows, final.added, final.failed) == (1, 1, 0)
    assert table_sources.errors(kb.db) == []


def test_a_row_the_model_refuses_is_parked_alone(app_db: str, embedder: MiniLMEmbedder) -> None:
    run(app_db, "update public.articles set body = body || ' REFUSE' where id = 2")
    with EmbeddingServer(embedder, refuse="REFUSE") as server:
        client = OpenAIEmbedder(server.base_url, "minilm-over-http", dimension=384, backoff_s=0.01)
        with KnowledgeBase(app_db, client, pool_size=1) as kb:
            summary = sync(kb.db, kb.models)
            (error,) = table_sources.errors(kb.db)
    assert (summary.rows, summary.added, summary.failed) == (3, 2, 1)
    assert error.document == "table:articles/2"
    assert error.error.startswith("the model refused it: embedding server")
    assert "HTTP 400" in error.error
    assert sorted(docs(app_db)) == ["table:articles/1", "table:articles/3"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_model_server_that_is_down_leaves_the_rows_queued(
    app_db: str, embedder: MiniLMEmbedder
) -> None:
    down = OpenAIEmbedder(
        f"http://127.0.0.1:{_closed_port()}/v1", "minilm-over-http", dimension=384,
        retries=1, backoff_s=0.01,
    )  # fmt: skip
    with KnowledgeBase(app_db, down, pool_size=1) as kb, pytest.raises(EmbeddingError):
        sync(kb.db, kb.models)
    assert docs(app_db) == {}
    assert scalar(app_db, "select count(*) from kb.source_queue") == 3
    assert scalar(app_db, "select count(*) from kb.source_claims") == 0
    assert scalar(app_db, "select count(*) from kb.source_errors") == 0
    with EmbeddingServer(embedder) as server:
        up = OpenAIEmbedder(server.base_url, "minilm-over-http", dimension=384)
        with KnowledgeBase(app_db, up, pool_size=1) as kb:
            assert sync(kb.db, kb.models).added == 3
    assert len(docs(app_db)) == 3


def test_a_watching_worker_waits_for_the_model_and_loses_nothing(
    app_db: str, embedder: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tables, "MODEL_BACKOFF_S", (0.2, 0.5))
    with EmbeddingServer(embedder, fail_first=4, fail_status=503) as server:
        flaky = OpenAIEmbedder(
            server.base_url, "minilm-over-http", dimension=384, retries=0, backoff_s=0.01
        )
        stop = threading.Event()
        done: list[Any] = []

        def stop_when_synced(event: SyncProgress) -> None:
            if event.rows >= 3:
                stop.set()

        with KnowledgeBase(app_db, flaky, pool_size=1) as kb:
            worker = threading.Thread(
                target=lambda: done.append(
                    sync(kb.db, kb.models, watch=True, poll_s=0.2, progress=stop_when_synced,
                         stop=stop)
                )
            )  # fmt: skip
            worker.start()
            worker.join(120)
            stop.set()
            worker.join(10)
    assert done and done[0].added == 3 and done[0].released == 12  # 3 rows handed back 4 times
    assert len(docs(app_db)) == 3


def test_another_writer_holding_the_write_lock_leaves_the_rows_queued(
    app_db: str, embedder: MiniLMEmbedder
) -> None:
    settings = dataclasses.replace(Settings.from_env(), write_lock_wait_ms=300)
    with kdb.connect(app_db, autocommit=True) as ingest:
        ingest.execute("select pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
        with KnowledgeBase(app_db, embedder, settings=settings, pool_size=1) as kb:
            with pytest.raises(Busy):
                sync(kb.db, kb.models)
            assert scalar(app_db, "select count(*) from kb.source_queue") == 3
            ingest.execute("select pg_advisory_unlock(%s)", (WRITE_LOCK_KEY,))
            assert sync(kb.db, kb.models).added == 3


def test_changing_a_definition_reads_every_row_again(kb: KnowledgeBase, app_db: str) -> None:
    sync(kb.db, kb.models)
    changed = table_sources.alter(kb.db, "articles", metadata=["author"], title="")
    assert changed.triggers == [
        "kbpg_articles_insert", "kbpg_articles_update", "kbpg_articles_delete", "kbpg_articles_truncate",
    ]  # fmt: skip
    redone = sync(kb.db, kb.models)
    assert (redone.rows, redone.updated) == (3, 3)
    title, _, _, _, metadata, _ = docs(app_db)["table:articles/1"]
    assert (title, metadata) == ("", {"author": "ann"})
    # the same definition again: every row read, none rewritten
    table_sources.alter(kb.db, "articles", metadata=["author"])
    same = sync(kb.db, kb.models)
    assert (same.rows, same.unchanged, same.updated) == (3, 3, 0)
    # the update trigger follows the new columns: the title is not read any more
    run(app_db, "update public.articles set title = 'Renamed' where id = 1")
    assert sync(kb.db, kb.models).rows == 0

    table_sources.remove(kb.db, "articles")
    assert len(docs(app_db)) == 3  # kept unless asked
    with pytest.raises(NotFound):
        table_sources.show(kb.db, "articles")
    run(app_db, ADD_SOURCE)
    sync(kb.db, kb.models)
    removed = table_sources.remove(kb.db, "articles", drop_documents=True)
    assert removed.documents_deleted == 3 and docs(app_db) == {}


def test_a_truncated_table_deletes_its_documents(kb: KnowledgeBase, app_db: str) -> None:
    sync(kb.db, kb.models)
    run(app_db, "truncate public.articles")
    with kdb.connect(app_db, autocommit=True) as conn:
        insert_article(conn, 7, "After", "Written after the truncate.")
    summary = sync(kb.db, kb.models)
    assert (summary.deleted, summary.added) == (3, 1)
    assert sorted(docs(app_db)) == ["table:articles/7"]


def test_a_source_whose_table_cannot_be_read_is_skipped_with_a_hint(
    kb: KnowledgeBase, app_db: str
) -> None:
    run(app_db, "update kb.table_sources set backfill_state = 'done'")
    run(app_db, "update public.articles set body = 'x' where id = 1")
    run(app_db, "alter table public.articles rename column body to text_body")
    summary = sync(kb.db, kb.models)
    assert summary.rows == 1 and summary.released == 1
    assert "column t.body does not exist" in summary.unreadable["articles"]
    assert "kbpg sources alter articles" in summary.unreadable["articles"]
    assert scalar(app_db, "select count(*) from kb.source_queue") == 1  # kept for later
    table_sources.alter(kb.db, "articles", text="text_body")
    assert sync(kb.db, kb.models).added == 3


@pytest.fixture
def readers(admin_url: str) -> Iterator[dict[str, str]]:
    with login_roles(admin_url, ["alice", "dave"]) as roles:
        yield roles


def test_the_group_column_decides_who_finds_a_row(
    kb: KnowledgeBase, app_db: str, readers: dict[str, str]
) -> None:
    sync(kb.db, kb.models)
    with kdb.connect(app_db, autocommit=True) as conn:
        reader = conn.execute("select reader_role from kb.access_settings").fetchone()[0]
        for who in ("alice", "dave"):
            conn.execute(f'grant "{reader}" to "{readers[who]}"')
        conn.execute("select * from kb.grant_groups(%s, array['hr'])", (readers["alice"],))
        assert conn.execute("select kb.access_enable()").fetchone() == (True,)
    query = "select source from kb.search('parental leave salary', match_count => 5)"
    found = {}
    for who in ("alice", "dave"):
        with psycopg.connect(url_as(app_db, readers[who])) as conn:
            found[who] = {r[0] for r in conn.execute(query).fetchall()}
    assert "table:articles/2" in found["alice"]  # hr, granted
    assert "table:articles/2" not in found["dave"]  # hr, not granted
    # a row moved into a group the reader lacks disappears for it at the next sync
    run(app_db, "update public.articles set visible_to = '{finance}' where id = 2")
    sync(kb.db, kb.models)
    with psycopg.connect(url_as(app_db, readers["alice"])) as conn:
        assert "table:articles/2" not in {r[0] for r in conn.execute(query).fetchall()}


def test_sources_named_must_exist(kb: KnowledgeBase) -> None:
    with pytest.raises(NotFound) as info:
        sync(kb.db, kb.models, ["articles", "tickets"])
    assert "'tickets'" in info.value.message and "kbpg sources list" in (info.value.hint or "")


def test_a_migration_of_a_column_the_source_reads(kb: KnowledgeBase, app_db: str) -> None:
    """The statement triggers depend on no column (revision 0022): the application's ALTER TABLE
    of one the source reads just runs, and the changes around it are queued."""
    sync(kb.db, kb.models)
    with kdb.connect(app_db, autocommit=True) as conn:
        conn.execute("alter table public.articles alter column body type varchar(2000)")
        conn.execute(
            "update public.articles set body = 'Changed during the migration.' where id = 3"
        )
    caught_up = sync(kb.db, kb.models)
    assert (caught_up.rows, caught_up.updated) == (1, 1)
    assert docs(app_db)["table:articles/3"][5] == ["Changed during the migration."]
    table_sources.resync(kb.db, "articles")
    again = sync(kb.db, kb.models)
    assert (again.rows, again.updated, again.unchanged) == (3, 0, 3)
    assert (
        scalar(
            app_db, "select count(*) from pg_trigger where tgrelid = 'public.articles'::regclass"
        )
        == 4
    )


def _key_only_the_application_holds(url: str, prefix: list[str]) -> str:
    """A text key of 10,000 characters that the application's unique index holds (it compresses
    to just under a btree entry's 2,704 bytes) but an entry shaped like 0014's queue key (the
    source id and the key as text[], `prefix` the key columns before it) does not: found by
    trying, as compression decides."""
    rng = random.Random(26)
    with kdb.connect(url) as conn:
        conn.execute("create temp table app (a text, b text, unique (a, b))")
        conn.execute(
            'create temp table queue (s int, key text[] collate "C", primary key (s, key))'
        )
        for tail in range(2300, 2500, 2):
            key = "x" * (10_000 - tail) + "".join(
                rng.choice("0123456789abcdef") for _ in range(tail)
            )
            try:
                with conn.transaction():
                    conn.execute(
                        "insert into app values (%s, %s)", (*prefix, key) if prefix else ("", key)
                    )
            except psycopg.errors.ProgramLimitExceeded:
                continue
            try:
                with conn.transaction():
                    conn.execute("insert into queue values (1, %s)", ([*prefix, key],))
            except psycopg.errors.ProgramLimitExceeded:
                return key
    pytest.fail("no key fits the application's index but not 0014's queue")


def test_a_key_longer_than_an_index_entry_is_synced_and_deleted(
    embedder: MiniLMEmbedder, db_url: str
) -> None:
    """A text key of 10 kB that the application's btree holds but a queue entry keyed by it would
    not: the application's writes succeed, and the worker keeps the rows (single and composite
    keys) searchable, parks one that fails and deletes them with their rows."""
    slug = _key_only_the_application_holds(db_url, [])
    tenant = _key_only_the_application_holds(db_url, ["acme"])
    run(db_url, "create table public.pages (slug text primary key, body text, visible_to text[])")
    run(
        db_url,
        "create table public.notes (org text, tenant text, body text, primary key (org, tenant))",
    )
    run(
        db_url,
        "select kb.add_table_source('pages', 'public.pages', text => 'body',"
        " groups => 'visible_to')",
    )
    run(db_url, "select kb.add_table_source('notes', 'public.notes', id => 'org, tenant',"
                " text => 'body')")  # fmt: skip
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("insert into public.pages values (%s, %s, null), (%s, %s, '{\"\"}')",
                     (slug, "Sundials tell the time by the shadow of a gnomon.",
                      slug[:-1], "A row whose group name is blank."))  # fmt: skip
        conn.execute("insert into public.notes values ('acme', %s, 'Lighthouses guide ships.')",
                     (tenant,))  # fmt: skip
        # a second change of a queued row: a second entry, the row read once
        conn.execute("update public.pages set body = body || ' Noon casts the shortest shadow.'"
                     " where slug = %s", (slug,))  # fmt: skip
        assert count(conn, "select count(*) from kb.source_queue") == 4
    with KnowledgeBase(db_url, embedder, pool_size=1) as kb:
        first = sync(kb.db, kb.models)
        assert (first.rows, first.added, first.failed) == (3, 2, 1)
        (parked,) = table_sources.errors(kb.db)
        assert parked.key == [slug[:-1]]
        assert parked.error == "groups holds an empty value (NULL or blank)"
        stored = docs(db_url, "table:pages/") | docs(db_url, "table:notes/")
        assert len(stored) == 2 and all(len(name) < 100 for name in stored)
        assert parked.document.startswith("table:pages/%sha256:")
        for query, text in [("sundial shadow", "Sundials"), ("lighthouse ships", "Lighthouses")]:
            assert kb.search(query, top=1).chunks[0].content.startswith(text)
        # the row fixed: tried at once; then the rows deleted or truncated: their documents go
        run(db_url, "update public.pages set visible_to = '{}' where slug = %s", (slug[:-1],))
        assert sync(kb.db, kb.models).added == 1
        assert table_sources.errors(kb.db) == []
        run(db_url, "delete from public.pages where slug = %s", (slug,))
        run(db_url, "delete from public.notes")
        assert sync(kb.db, kb.models).deleted == 2
        run(db_url, "truncate public.pages")
        assert sync(kb.db, kb.models).deleted == 1
    assert docs(db_url, "table:pages/") == {} and docs(db_url, "table:notes/") == {}
    for table in ("source_queue", "source_claims", "source_errors"):
        assert scalar(db_url, f"select count(*) from kb.{table}") == 0


def test_the_worker_runs_none_of_the_applications_casts(kb: KnowledgeBase, app_db: str) -> None:
    """Issue 38: an enum of the application's (as the key, title, category, labels and metadata)
    and a domain over it, with casts to text and json, from text and a CHECK that record who runs
    them: `kbpg sync` reads the rows through output functions only, and the documents are right."""
    run(
        app_db,
        """
        create table public.cast_calls (who text, via text);
        create type public.mood as enum ('calm', 'glad');
        create function public.mood_log(via text) returns boolean language plpgsql as $$
        begin insert into public.cast_calls values (current_user, via); return true; end $$;
        create function public.mood_json(m public.mood) returns json language plpgsql as $$
        begin perform public.mood_log('json'); return '"x"'; end $$;
        create function public.mood_text(m public.mood) returns text language plpgsql as $$
        begin perform public.mood_log('text'); return 'x'; end $$;
        create function public.text_mood(t text) returns public.mood language plpgsql as $$
        begin perform public.mood_log('from text'); return 'glad'; end $$;
        create cast (public.mood as json) with function public.mood_json(public.mood);
        create cast (public.mood as text) with function public.mood_text(public.mood);
        create cast (text as public.mood) with function public.text_mood(text);
        create domain public.checked_mood as public.mood check (public.mood_log('check'));
        create table public.notes (id bigint not null, mood public.checked_mood not null,
            body text, kind public.mood, feelings public.mood[], primary key (id, mood));
        insert into public.notes values (1, 'calm', 'Quiet mornings by the lake.', 'glad',
                                         '{glad,calm}');
        select kb.add_table_source('notes', 'public.notes', id => 'id, mood', text => 'body',
            title => 'kind', category => 'mood', labels => 'feelings', metadata => '{kind, mood}');
        delete from public.cast_calls;
        """,
    )
    done = sync(kb.db, kb.models, ["notes"])
    assert (done.added, done.failed, done.released) == (1, 0, 0), done
    run(app_db, "update public.notes set body = 'Loud evenings.' where id = 1")
    assert sync(kb.db, kb.models, ["notes"]).updated == 1
    assert scalar(app_db, "select count(*) from public.cast_calls") == 0
    assert docs(app_db, "table:notes/") == {
        "table:notes/1/calm": (
            "glad", [], "calm", ["glad", "calm"], {"kind": "glad", "mood": "calm"},
            ["Loud evenings."],
        )
    }  # fmt: skip
