"""Table sources in SQL: definitions checked against the table, triggers that queue only what
changed and never make the application's write wait or fail, the worker's claims."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from kbpg.store import db as kdb
from tests.sqldata import raises_sqlstate
from tests.tablesdata import ADD_SOURCE, add_articles, count, entries, insert_article, queue

WORKER_LOCK = 0x6B627073


@pytest.fixture
def articles(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The shared database in a rolled-back transaction, with public.articles and its source."""
    add_articles(conn)
    conn.execute(ADD_SOURCE)
    return conn


# -- definitions ---------------------------------------------------------------------------------


def test_add_records_the_source_and_creates_its_triggers(
    articles: psycopg.Connection[Any],
) -> None:
    row = articles.execute(
        "select name, source_table, key_columns, text_column, title_column, groups_column,"
        " category_column, labels_column, metadata_columns, notify, backfill_state"
        " from kb.list_table_sources()"
    ).fetchone()
    assert row == (
        "articles", "public.articles", ["id"], "body", "title", "visible_to", "section", "tags",
        ["author", "updated_at"], True, "pending",
    )  # fmt: skip
    triggers = articles.execute(
        "select tgname, pg_get_triggerdef(oid) from pg_trigger"
        " where tgrelid = 'public.articles'::regclass order by tgname"
    ).fetchall()
    assert [t[0] for t in triggers] == [
        "kbpg_articles_delete", "kbpg_articles_insert", "kbpg_articles_truncate", "kbpg_articles_update",
    ]  # fmt: skip
    # statement triggers, a statement's rows in its transition tables
    assert (
        "AFTER UPDATE ON public.articles REFERENCING OLD TABLE AS kbpg_old NEW TABLE AS kbpg_new"
        in triggers[3][1]
    )
    assert "FOR EACH STATEMENT" in triggers[3][1]


@pytest.mark.parametrize(
    ("call", "sqlstate", "message", "hint"),
    [
        ("text => 'nope'", "42703", 'column "nope" of public.articles does not exist',
         "its columns: id, title, body, visible_to"),
        ("text => 'view_count'", "42804", 'column "view_count" of public.articles is integer, not text',
         "text, varchar or char"),
        ("text => 'body', groups => 'extra'", "42804", "is json, not a list of names",
         "text[]"),
        ("text => 'body', category => 'tags'", "42804", "is text[], an array", "one value"),
        ("text => 'body', metadata => '{author, missing}'", "42703", '"missing"', "its columns"),
        ("title => 'title'", "22023", "a table source needs a text column", "text => 'body'"),
        ("text => 'body', id => 'view_count'", "42P10", "no unique index on (view_count)",
         "alter table public.articles add unique (view_count)"),
        ("text => 'body', id => 'author'", "42P10", 'key column "author" of public.articles may be NULL',
         "set not null"),
    ],
)  # fmt: skip
def test_a_definition_is_checked_against_the_table(
    conn: psycopg.Connection[Any], call: str, sqlstate: str, message: str, hint: str
) -> None:
    add_articles(conn)
    with raises_sqlstate(conn, sqlstate) as info:
        conn.execute(f"select kb.add_table_source('a', 'public.articles', {call})")
    assert message in info.value.diag.message_primary
    assert hint in (info.value.diag.message_hint or "")


def test_a_table_without_a_usable_key_is_refused_with_what_to_do(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("create table public.nokey (a integer, b text)")
    conn.execute("create table public.pair (a integer, b integer, body text, primary key (a, b))")
    conn.execute("create table public.floats (x float8 primary key, body text)")
    conn.execute("create view public.v as select 1 as id, 'x'::text as body")
    with raises_sqlstate(conn, "42P10") as info:
        conn.execute("select kb.add_table_source('a', 'public.nokey', text => 'b')")
    assert "has no primary key" in info.value.diag.message_primary
    assert "id => 'column'" in info.value.diag.message_hint
    with raises_sqlstate(conn, "42P10") as info:
        conn.execute("select kb.add_table_source('a', 'public.pair', text => 'body')")
    assert "composite primary key (a, b)" in info.value.diag.message_primary
    assert info.value.diag.message_hint == "name its columns explicitly: id => 'a, b'"
    with raises_sqlstate(conn, "42804") as info:
        conn.execute("select kb.add_table_source('a', 'public.floats', text => 'body')")
    assert "cannot be a table source's key" in info.value.diag.message_primary
    with raises_sqlstate(conn, "42809"):
        conn.execute("select kb.add_table_source('a', 'public.v', text => 'body')")
    with raises_sqlstate(conn, "42P01"):
        conn.execute("select kb.add_table_source('a', 'public.missing', text => 'body')")
    with raises_sqlstate(conn, "22023"):
        conn.execute(
            "select kb.add_table_source('no/slash', 'public.pair', id => 'a,b', text => 'body')"
        )
    # the composite key named explicitly, in either spelling
    row = conn.execute(
        "select key_columns from kb.add_table_source('pair', 'public.pair', id => '{b, a}',"
        " text => 'body')"
    ).fetchone()
    assert row == (["b", "a"],)
    with raises_sqlstate(conn, "42710"):
        conn.execute(
            "select kb.add_table_source('pair', 'public.pair', id => 'a, b', text => 'body')"
        )


@pytest.mark.parametrize(
    ("key_type", "value", "text_form"),
    [
        ("integer", "7", "7"),
        ("bigint", "9007199254740993", "9007199254740993"),
        ("uuid", "'6f1c1b0e-8f4d-4d55-9a8e-2d1c7f6b4a10'", "6f1c1b0e-8f4d-4d55-9a8e-2d1c7f6b4a10"),
        ("text", "'faq/billing 100%'", "faq/billing 100%"),
    ],
)
def test_any_single_column_key_type_round_trips(
    conn: psycopg.Connection[Any], key_type: str, value: str, text_form: str
) -> None:
    conn.execute(f"create table public.k (k {key_type} primary key, body text)")
    conn.execute("select kb.add_table_source('k', 'public.k', text => 'body')")
    conn.execute(f"insert into public.k values ({value}, 'hello')")
    assert queue(conn) == [([text_form], "I")]
    source_id = count(conn, "select id from kb.table_sources where name = 'k'")
    rows = conn.execute(
        "select key, document, present, body from kb._source_rows(%s, %s)",
        (source_id, Jsonb([[text_form]])),
    ).fetchall()
    escaped = text_form.replace("%", "%25").replace("/", "%2F")
    assert rows == [([text_form], f"table:k/{escaped}", True, "hello")]
    assert conn.execute(
        "select kb._source_document_key('table:k/', %s)", (f"table:k/{escaped}",)
    ).fetchone() == ([text_form],)


# -- the triggers --------------------------------------------------------------------------------


def test_only_changes_of_what_the_source_reads_are_queued(
    articles: psycopg.Connection[Any],
) -> None:
    conn = articles
    assert queue(conn) == []  # the existing rows are the backfill's, not the triggers'
    conn.execute("update public.articles set view_count = view_count + 1")
    conn.execute("update public.articles set body = body, extra = '{\"a\": 1}'")
    assert queue(conn) == []
    conn.execute("update public.articles set body = 'Permits are renewed online.' where id = 1")
    conn.execute("update public.articles set tags = '{parking,permits}' where id = 1")
    for _ in range(50):  # an entry per change (the queue is a log), the key taken once
        conn.execute("update public.articles set updated_at = clock_timestamp() where id = 1")
    assert queue(conn) == [(["1"], "U")]
    assert entries(conn) == 52
    insert_article(conn, 4, "New", "A new article.")
    conn.execute("delete from public.articles where id = 2")
    conn.execute(
        "update public.articles set id = 33 where id = 3"
    )  # the old key goes, the new comes
    # (one transaction: every entry has the same enqueued_at, the order is the key's)
    assert queue(conn) == [(["1"], "U"), (["2"], "D"), (["3"], "D"), (["33"], "U"), (["4"], "I")]
    conn.execute("truncate public.articles")
    assert ([], "T") in queue(conn)


def test_a_removed_source_stops_queueing_and_drops_its_triggers(
    articles: psycopg.Connection[Any],
) -> None:
    conn = articles
    insert_article(conn, 4, "New", "A new article.")
    row = conn.execute("select * from kb.remove_table_source('articles')").fetchone()
    assert row == ("articles", 0, [])
    assert count(conn, "select count(*) from kb.source_queue") == 0
    assert (
        count(conn, "select count(*) from pg_trigger where tgrelid = 'public.articles'::regclass")
        == 0
    )
    insert_article(conn, 5, "Later", "Not followed.")
    assert queue(conn) == []
    with raises_sqlstate(conn, "42704") as info:
        conn.execute("select kb.remove_table_source('articles')")
    assert "kbpg sources list" in info.value.diag.message_hint


def test_a_partitioned_table_queues_through_its_partitions(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "create table public.tickets (region text not null, id integer not null, body text,"
        " primary key (region, id)) partition by list (region)"
    )
    conn.execute("create table public.tickets_eu partition of public.tickets for values in ('eu')")
    conn.execute("create table public.tickets_us partition of public.tickets for values in ('us')")
    conn.execute(
        "select kb.add_table_source('tickets', 'public.tickets', id => 'region, id', text => 'body')"
    )
    conn.execute("insert into public.tickets values ('eu', 1, 'printer on fire'), ('us', 1, 'no')")
    conn.execute("update public.tickets_us set body = 'yes' where id = 1")
    assert queue(conn) == [(["eu", "1"], "I"), (["us", "1"], "I")]


def test_key_values_with_slashes_make_distinct_documents(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "create table public.pages (site text, path text, body text, primary key (site, path))"
    )
    conn.execute(
        "select kb.add_table_source('pages', 'public.pages', id => 'site, path', text => 'body')"
    )
    conn.execute(
        "insert into public.pages values ('a/b', 'c', 'x'), ('a', 'b/c', 'y'), ('a%2Fb', 'c', 'z')"
    )
    docs = conn.execute(
        "select kb._source_document('pages', key) from kb.source_queue order by key"
    ).fetchall()
    assert sorted(d[0] for d in docs) == [
        "table:pages/a%252Fb/c", "table:pages/a%2Fb/c", "table:pages/a/b%2Fc",
    ]  # fmt: skip
    back = conn.execute(
        "select kb._source_document_key('table:pages/', kb._source_document('pages', key)) = key"
        " from kb.source_queue"
    ).fetchall()
    assert back == [(True,)] * 3


# -- committed: rollback, claims, no waiting -----------------------------------------------------


@pytest.fixture
def committed(db_url: str) -> str:
    with kdb.connect(db_url, autocommit=True) as conn:
        add_articles(conn)
        conn.execute(ADD_SOURCE)
        conn.execute("update kb.table_sources set backfill_state = 'done'")
    return db_url


def test_a_rolled_back_write_queues_nothing(committed: str) -> None:
    with kdb.connect(committed) as conn:
        insert_article(conn, 10, "Draft", "Never committed.")
        conn.execute("update public.articles set body = 'changed' where id = 1")
        assert len(queue(conn)) == 2  # visible inside the transaction ...
        conn.rollback()
    with kdb.connect(committed) as conn:
        assert queue(conn) == []  # ... and gone with it


def _claim(conn: psycopg.Connection[Any], worker: int, limit: int = 10) -> list[list[str]]:
    rows = conn.execute("select key from kb._source_claim(%s, null, %s)", (worker, limit))
    return sorted(list(r[0]) for r in rows.fetchall())


def test_claims_are_one_workers_and_a_new_change_waits_for_the_claim(committed: str) -> None:
    with (
        kdb.connect(committed, autocommit=True) as app,
        kdb.connect(committed, autocommit=True) as w,
    ):
        for i in (10, 11, 12):
            insert_article(app, i, f"t{i}", f"body {i}")
        assert _claim(w, 1, limit=2) == [["10"], ["11"]]
        assert _claim(w, 2) == [["12"]]  # another worker gets what is left
        app.execute("update public.articles set body = 'again' where id = 10")
        # 10 changed again while worker 1 holds it: queued, but not claimable until settled
        assert queue(app) == [(["10"], "U")]
        assert _claim(w, 2) == []
        w.execute("select kb._source_settle(1, 1, '[[\"10\"], [\"11\"]]', '[]')")
        assert _claim(w, 2) == [["10"]]
        assert count(app, "select count(*) from kb.source_claims where worker = 2") == 2
        # a worker whose session lock is free is gone: its claims go back to the queue
        assert count(w, "select kb._source_reclaim(3)") == 2
        assert sorted(k for k, _ in queue(app)) == [["10"], ["12"]]


def test_a_claim_takes_a_key_once_with_its_first_change(committed: str) -> None:
    with (
        kdb.connect(committed, autocommit=True) as app,
        kdb.connect(committed, autocommit=True) as w,
    ):
        insert_article(app, 10, "t", "body")
        for i in range(3):
            app.execute("update public.articles set body = %s where id = 10", (f"v{i}",))
        app.execute("update public.articles set body = 'changed' where id = 1")
        assert entries(app) == 5
        # kbpg sources list counts the rows waiting, not the entries
        assert count(app, "select queued from kb.list_table_sources('articles')") == 2
        # a batch of one entry takes its key's every entry: the row is read once for them all
        rows = w.execute("select key, op from kb._source_claim(1, null, 1)").fetchall()
        assert rows == [(["10"], "I")]
        assert entries(app) == 1
        rows = w.execute("select key, op from kb._source_claim(1, null, 10)").fetchall()
        assert rows == [(["1"], "U")]
        assert entries(app) == 0


def test_a_key_claimed_by_another_worker_meanwhile_goes_back(committed: str) -> None:
    """Two workers claiming two entries of one key at the same moment: the second waits for the
    first's claim to commit, leaves the key to it and puts its entry back, untouched."""
    with (
        kdb.connect(committed, autocommit=True) as app,
        kdb.connect(committed) as first,
        kdb.connect(committed, autocommit=True) as second,
    ):
        insert_article(app, 10, "t", "body")
        # the first worker takes the key and has not committed its claim yet; the row changes
        assert _claim(first, 1, limit=1) == [["10"]]
        app.execute("update public.articles set body = 'again' where id = 10")
        result: list[list[list[str]]] = []
        thread = threading.Thread(target=lambda: result.append(_claim(second, 2)))
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive()  # waiting on the first worker's claim of the same key
        first.commit()
        thread.join(10)
        assert result == [[]]
        assert queue(app) == [(["10"], "U")]
        assert count(app, "select count(*) from kb.source_claims where worker = 1") == 1


def test_a_downgrade_keeps_each_keys_first_entry(committed: str) -> None:
    """Revision 0026 keyed the queue by key: going back keeps each key's earliest entry, and the
    entries come back whole. (Below 0028 the functions are the older release's own: the
    downgrade drops those that read the views, so only the queue's triggers are exercised.)"""
    with kdb.connect(committed, autocommit=True) as app:
        insert_article(app, 10, "t", "body")
        app.execute("update public.articles set body = 'again' where id = 10")
        app.execute("update public.articles set body = 'changed' where id = 1")
        assert entries(app) == 3
    kdb.downgrade(committed, "0026")
    with kdb.connect(committed, autocommit=True) as app:
        assert entries(app) == 2
        assert queue(app) == [(["10"], "I"), (["1"], "U")]
        app.execute("update public.articles set body = 'once more' where id = 10")  # deduped
        assert entries(app) == 2
    kdb.upgrade(committed)
    with kdb.connect(committed, autocommit=True) as app:
        assert _claim(app, 1) == [["1"], ["10"]]
        app.execute("update public.articles set body = 'and again' where id = 1")
        assert queue(app) == [(["1"], "U")]


def test_claims_of_a_live_worker_are_not_reclaimed(committed: str) -> None:
    with (
        kdb.connect(committed, autocommit=True) as app,
        kdb.connect(committed, autocommit=True) as live,
        kdb.connect(committed, autocommit=True) as other,
    ):
        insert_article(app, 10, "t", "body")
        live.execute("select pg_advisory_lock(%s, 7)", (WORKER_LOCK,))
        assert _claim(live, 7) == [["10"]]
        assert count(other, "select kb._source_reclaim(8)") == 0
        live.close()  # the worker dies: its session lock goes with it (once its backend exits)
        reclaimed = 0
        for _ in range(100):
            reclaimed = count(other, "select kb._source_reclaim(8)")
            if reclaimed:
                break
            time.sleep(0.05)
        assert reclaimed == 1
        assert queue(app) == [(["10"], "I")]


def test_the_application_never_waits_for_a_worker(committed: str) -> None:
    """A worker that claimed rows and reads them in an open transaction (as while it embeds)
    holds nothing the application's writes of those rows need: they succeed at once."""
    with (
        kdb.connect(committed, autocommit=True) as app,
        kdb.connect(committed, autocommit=True) as worker,
    ):
        insert_article(app, 10, "t", "body")
        app.execute("update public.articles set body = 'x' where id = 1")
        assert _claim(worker, 1) == [["1"], ["10"]]
        worker.execute("begin")
        worker.execute('select * from kb._source_rows(1, \'[["1"], ["10"]]\')').fetchall()
        app.execute("set lock_timeout = '200ms'")
        app.execute("update public.articles set body = 'y' where id in (1, 10)")
        app.execute("delete from public.articles where id = 10")
        worker.execute("commit")
        assert sorted(queue(app)) == [(["1"], "U"), (["10"], "U")]


def test_writes_go_on_while_the_sql_files_are_reapplied(committed: str) -> None:
    """An upgrade at head re-applies sql/ in one transaction (kb._source_enqueue replaced in it):
    the application's writes neither wait for it nor fail."""
    with (
        kdb.connect(committed) as migration,
        kdb.connect(committed, autocommit=True) as app,
    ):
        schema = migration.execute(
            "select n.nspname from pg_extension e join pg_namespace n on n.oid = e.extnamespace"
            " where e.extname = 'vector'"
        ).fetchone()[0]
        for statement in kdb.sql_function_statements(schema):
            migration.execute(statement)
        app.execute("set lock_timeout = '2s'")
        insert_article(app, 20, "During", "written mid-migration")
        app.execute("update public.articles set body = 'also' where id = 2")
        migration.commit()
        assert queue(app) == [(["20"], "I"), (["2"], "U")]


def test_serializable_writers_do_not_conflict_through_the_queue(committed: str) -> None:
    """Two SERIALIZABLE transactions updating rows far apart commit with the triggers as they do
    without them (the queue's dedupe probe takes no predicate lock). Rows on one index page
    would conflict with or without kbpg: PostgreSQL's predicate locks are per page."""
    with kdb.connect(committed, autocommit=True) as conn:
        conn.execute(
            "insert into public.articles (id, body) select g, 'row ' || g"
            " from generate_series(100, 5000) g"
        )
        conn.execute("create table public.control (like public.articles including all)")
        conn.execute("insert into public.control select * from public.articles")
        conn.execute("delete from kb.source_queue")
    for table in ("public.control", "public.articles"):
        with kdb.connect(committed) as a, kdb.connect(committed) as b:
            for conn in (a, b):
                conn.execute("set transaction isolation level serializable")
            a.execute(f"update {table} set body = 'changed by a' where id = 100")
            b.execute(f"update {table} set body = 'changed by b' where id = 4990")
            a.commit()
            b.commit()
    with kdb.connect(committed) as conn:
        assert sorted(k for k, _ in queue(conn)) == [["100"], ["4990"]]


def test_the_backfill_pages_in_key_order_and_resumes(committed: str) -> None:
    with kdb.connect(committed, autocommit=True) as conn:
        conn.execute("drop table public.articles cascade")
        conn.execute("select kb.remove_table_source('articles')")
        conn.execute("create table public.pair (a integer, b text, body text, primary key (a, b))")
        conn.execute(
            "insert into public.pair select g / 10, 'k' || (g % 10), 'row ' || g"
            " from generate_series(0, 49) g"
        )
        conn.execute(
            "select kb.add_table_source('pair', 'public.pair', id => 'a, b', text => 'body')"
        )
        source = count(conn, "select id from kb.table_sources where name = 'pair'")
        pages = []
        while True:
            row = conn.execute("select * from kb._source_backfill(%s, 20)", (source,)).fetchone()
            pages.append(row)
            if row[1] == "done":
                break
            cursor = conn.execute(
                "select backfill_cursor from kb.table_sources where id = %s", (source,)
            ).fetchone()
            assert cursor is not None and cursor[0] is not None  # a restart resumes here
        assert pages == [(20, "running", 50, 20), (20, "running", 50, 40), (10, "done", 50, 50)]
        assert count(conn, "select count(distinct key) from kb.source_queue where op = 'B'") == 50
        # another page once done queues nothing; a resync starts again from the first row
        assert conn.execute("select * from kb._source_backfill(%s, 20)", (source,)).fetchall() == []
        conn.execute("delete from kb.source_queue")
        conn.execute("select kb.resync_table_source('pair')")
        assert queue(conn) == [([], "S")]
        assert conn.execute("select * from kb._source_backfill(%s, 100)", (source,)).fetchone() == (
            50, "done", 50, 50,
        )  # fmt: skip


# -- least privilege -----------------------------------------------------------------------------


@pytest.fixture
def app_roles(admin_url: str, db_url: str) -> Iterator[Callable[[str], str]]:
    """Login roles of this test's own (cluster-wide), dropped afterwards with their grants in
    the test's database."""
    suffix = uuid.uuid4().hex[:8]
    made: list[str] = []

    def make(name: str) -> str:
        role = f"kbt_{name}_{suffix}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("create role {} login password 'pw'").format(sql.Identifier(role)))
        made.append(role)
        return role

    yield make
    with psycopg.connect(db_url, autocommit=True) as conn:
        for role in made:
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in made:
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


def test_the_applications_role_needs_no_grant_on_kb(
    committed: str, app_roles: Callable[[str], str]
) -> None:
    app = app_roles("app")
    with kdb.connect(committed, autocommit=True) as owner:
        owner.execute(
            sql.SQL("grant select, insert, update, delete on public.articles to {}").format(
                sql.Identifier(app)
            )
        )
        owner.execute(sql.SQL("revoke all on schema kb from {}").format(sql.Identifier(app)))
    with kdb.connect(committed, autocommit=True) as conn:
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(app)))
        with raises_sqlstate(conn, "42501"):
            conn.execute("select count(*) from kb.source_queue")
        insert_article(conn, 40, "From the app", "Written by the application's own role.")
        conn.execute("update public.articles set body = 'changed by the app' where id = 1")
        conn.execute("reset role")
        assert queue(conn) == [(["40"], "I"), (["1"], "U")]


def test_a_trigger_on_another_table_raises_and_queues_nothing(
    articles: psycopg.Connection[Any],
) -> None:
    """A trigger naming a source it was not created for (a writer's temp table pointed at a
    source's id) queues nothing and fails the statement."""
    conn = articles
    conn.execute("create temp table other (id integer primary key, body text)")
    source = count(conn, "select id from kb.table_sources where name = 'articles'")
    conn.execute(
        "create trigger forged after insert on pg_temp.other referencing new table as kbpg_new"
        f" for each statement execute function kb._source_enqueue('{source}')"
    )
    conn.execute(
        "create trigger forged_row after update on pg_temp.other for each row"
        f" execute function kb._source_enqueue('{source}')"
    )
    conn.execute("savepoint s")
    with pytest.raises(
        psycopg.errors.InsufficientPrivilege, match="does not belong to table source"
    ):
        conn.execute("insert into pg_temp.other values (1, 'x')")
    conn.execute("rollback to savepoint s")
    conn.execute("drop trigger forged on pg_temp.other")
    conn.execute("insert into pg_temp.other values (1, 'x')")
    with pytest.raises(
        psycopg.errors.InsufficientPrivilege, match="does not belong to table source"
    ):
        conn.execute("update pg_temp.other set body = 'y'")
    conn.execute("rollback to savepoint s")
    assert queue(conn) == []


def _watch(conn: psycopg.Connection[Any], results: list[Any]) -> threading.Thread:
    def run() -> None:
        results.extend(conn.notifies(timeout=10, stop_after=1))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_commit_notifies_the_worker_unless_asked_not_to(committed: str) -> None:
    with (
        kdb.connect(committed, autocommit=True) as app,
        kdb.connect(committed, autocommit=True) as listener,
    ):
        listener.execute("listen kbpg_sync")
        got: list[Any] = []
        thread = _watch(listener, got)
        insert_article(app, 50, "n", "notify me")
        thread.join(15)
        # no payload: any role may listen, and the source's name is not theirs to learn
        assert [(n.channel, n.payload) for n in got] == [("kbpg_sync", "")]
        app.execute("select kb.alter_table_source('articles', notify => false)")
        got.clear()
        for _ in listener.notifies(timeout=0.2):  # alter's own notification
            pass
        insert_article(app, 51, "n", "quiet")
        assert list(listener.notifies(timeout=1)) == []
        assert (["51"], "I") in queue(app)


# -- issue 38: the triggers run none of the application's code ------------------------------------

# an enum of the application's with casts to json and text whose function records who ran it: to
# run it as kbpg's owner was to hand the application the owner's rights (`alter role ... superuser`)
CAST_TRAP = """
create table {schema}.cast_calls (who text, via text);
create type {schema}.mood as enum ('calm', 'glad');
create function {schema}.mood_json(m {schema}.mood) returns json language plpgsql as $$
begin insert into {schema}.cast_calls values (current_user, 'json'); return '"x"'; end $$;
create function {schema}.mood_text(m {schema}.mood) returns text language plpgsql as $$
begin insert into {schema}.cast_calls values (current_user, 'text'); return 'x'; end $$;
create cast ({schema}.mood as json) with function {schema}.mood_json({schema}.mood);
create cast ({schema}.mood as text) with function {schema}.mood_text({schema}.mood);
create table {schema}.notes (id bigint not null, mood {schema}.mood not null, body text,
                             feeling {schema}.mood, primary key (id, mood));
"""


@pytest.fixture
def trapped(committed: str, app_roles: Callable[[str], str]) -> Iterator[tuple[str, str, str]]:
    """(url, application role, its schema): the application owns a schema with CAST_TRAP in it,
    its table notes a source of kbpg's (added by the owner)."""
    app = app_roles("app")
    schema = app
    with kdb.connect(committed, autocommit=True) as owner:
        owner.execute(
            sql.SQL("create schema {} authorization {}").format(
                sql.Identifier(schema), sql.Identifier(app)
            )
        )
        owner.execute(sql.SQL("set role {}").format(sql.Identifier(app)))
        owner.execute(CAST_TRAP.format(schema=schema))
        owner.execute("reset role")
        owner.execute(
            "select kb.add_table_source('notes', %s, id => 'id, mood', text => 'body',"
            " metadata => '{feeling}')",
            (f"{schema}.notes",),
        )
    yield committed, app, schema
    with kdb.connect(committed, autocommit=True) as owner:  # the casts are not DROP OWNED's
        owner.execute(sql.SQL("drop schema {} cascade").format(sql.Identifier(schema)))


def test_the_applications_casts_never_run_in_the_triggers(trapped: tuple[str, str, str]) -> None:
    url, app, schema = trapped
    with kdb.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(app)))
        notes = sql.Identifier(schema, "notes")
        conn.execute(
            sql.SQL(
                "insert into {} values (1, 'calm', 'one', 'calm'), (2, 'calm', 'two', null),"
                " (3, 'glad', 'three', 'glad')"
            ).format(notes)
        )
        conn.execute(sql.SQL("update {} set feeling = 'glad' where id = 1").format(notes))
        conn.execute(sql.SQL("update {} set id = id + 10 where id >= 2").format(notes))
        conn.execute(sql.SQL("delete from {} where id = 13").format(notes))
        calls = conn.execute(
            sql.SQL("select * from {}").format(sql.Identifier(schema, "cast_calls"))
        )
        assert calls.fetchall() == []
        assert conn.execute(
            "select rolsuper from pg_roles where rolname = current_user"
        ).fetchone() == (False,)
        conn.execute("reset role")
        # (one entry a key: the first change's op stands until the worker takes it)
        assert sorted(queue(conn)) == [
            (["1", "calm"], "I"), (["12", "calm"], "U"), (["13", "glad"], "U"),
            (["2", "calm"], "I"), (["3", "glad"], "I"),
        ]  # fmt: skip


def test_a_statement_queues_exactly_the_rows_it_changed(articles: psycopg.Connection[Any]) -> None:
    conn = articles
    conn.execute(
        "insert into public.articles (id, title, body) values (4, 'a', 'x'), (5, 'b', 'y'), (6, 'c', 'z')"
    )
    assert queue(conn) == [(["4"], "I"), (["5"], "I"), (["6"], "I")]
    conn.execute("delete from kb.source_queue")
    # one statement: a key changed (4 -> 40), a read column changed (1), the rest untouched
    conn.execute(
        "update public.articles set id = case when id = 4 then 40 else id end,"
        " body = case when id = 1 then 'changed' else body end"
    )
    assert sorted(queue(conn)) == [(["1"], "U"), (["4"], "D"), (["40"], "U")]
    conn.execute("delete from kb.source_queue")
    conn.execute("update public.articles set view_count = view_count + 1, body = body")
    assert queue(conn) == []
    conn.execute("update public.articles set title = null where id = 5")  # 'b' -> NULL
    conn.execute("update public.articles set author = '' where id = 6")  # NULL -> ''
    assert sorted(queue(conn)) == [(["5"], "U"), (["6"], "U")]
    conn.execute("delete from kb.source_queue")
    conn.execute("delete from public.articles where id in (5, 6, 40)")
    assert sorted(queue(conn)) == [(["40"], "D"), (["5"], "D"), (["6"], "D")]
    conn.execute("truncate public.articles")
    assert ([], "T") in queue(conn)


def test_a_row_trigger_made_before_0022_queues_safely(articles: psycopg.Connection[Any]) -> None:
    """Where the owner could not re-create them, the row triggers stay: the same queue."""
    conn = articles
    source = count(conn, "select id from kb.table_sources where name = 'articles'")
    for t in ("insert", "update", "delete"):
        conn.execute(f"drop trigger kbpg_articles_{t} on public.articles")
    conn.execute(
        "create trigger kbpg_articles_change after insert or update or delete on public.articles"
        f" for each row execute function kb._source_enqueue('{source}')"
    )
    insert_article(conn, 4, "New", "A new article.")
    conn.execute("update public.articles set view_count = 9 where id = 1")
    conn.execute("update public.articles set body = 'b' where id = 2")
    conn.execute("update public.articles set id = 30 where id = 3")
    conn.execute("delete from public.articles where id = 4")
    assert sorted(queue(conn)) == [(["2"], "U"), (["3"], "D"), (["30"], "U"), (["4"], "I")]
