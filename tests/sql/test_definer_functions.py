"""Every SECURITY DEFINER function in schema kb, with why none of them runs a caller's code (issue
38), and the writer's temp-table route to the owner's rights, refused."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kbpg.store.db import sql_function_statements
from tests.sqldata import raises_sqlstate
from tests.tablesdata import ADD_SOURCE, add_articles, count, queue

# What each one evaluates and why no caller-defined code (a type, cast, operator or function of
# the caller's) runs with the owner's rights. All pin search_path to pg_catalog, pg_temp (no
# function or operator is ever looked up in pg_temp) and take only arguments of built-in types,
# pgvector's or kbpg's own (test below). A new SECURITY DEFINER function fails this test until
# it is listed here with its reason.
DEFINERS = {
    # the reader API (sql/015, sql/075): the owner's rights so that a reader needs no table
    # privilege; each applies the caller's grants itself (kb._access_visibility())
    "kb.search": "query text, vectors, numbers and text[] filters: built-in and pgvector operators over kb's tables",
    "kb.search_vector": "a vector, numbers and text[] filters: pgvector's distance operators over kb.chunks",
    "kb.search_lexical": "query text through the knowledge base's text search configuration (kb.language), numbers, text[] filters",
    "kb.highlight": "a text and query text through the knowledge base's text search configuration (kb.language): ts_headline, strpos and arithmetic on offsets; reads kb.language alone",
    "kb.facets": "query text through kb.language, field names from a fixed list or a metadata key compiled to a jsonpath literal (%L), text[] filters and a metadata filter as kb.search: counts over kb.chunks and kb.documents",
    "kb.expand_graph": "bigint chunk ids, numbers, text[] filters: joins over kb.edges and kb.chunks",
    "kb.list_documents": "one text prefix compared with starts_with over kb.documents",
    "kb.get_document": "text[] document sources compared with text equality",
    "kb.get_chunk": "one bigint id",
    "kb.get_embedding_space": "no argument: kb.embedding_space's row",
    "kb.model_defaults": "no argument: kbpg's model settings",
    "kb.stats": "no argument: counts over kb's tables",
    "kb.list_grants": "one role name, looked up with to_regrole (regrolein): pg_catalog only",
    "kb.access_status": "no argument: kb.access_settings and pg_catalog",
    "kb.knowledge_base_id": "one name compared with text equality over kb_data.knowledge_bases",
    "kb.use_knowledge_base": "one name through kb.knowledge_base_id, then set_config of kbpg.kb_id to its id",
    "kb.knowledge_bases": "no argument: each knowledge base the caller may read (kb._access_admits), its counts through the views as kb.stats counts them",
    "kb.search_knowledge_bases": "text[] names through kb.knowledge_base_id, then kb.search's arms (query text, a vector, numbers, text[] filters) in each: pgvector and built-in operators over kb_data's tables",
    # table sources (sql/090)
    "kb._source_enqueue": "statement trigger: a changed row's columns as text through to_jsonb of built-in types or the type's output function (no cast), only on its source's own permanent table",
    # one per table source on a plain table with a key of integer, numeric, text or uuid type
    "kb._source_enqueue_<id>": "statement trigger compiled for one source: static statements reading the transition tables' columns through format('%s') only (keys too), raising unless fired per statement on its table's OID",
    "kb._source_enqueue_truncate": "statement trigger: its source id only (no row), only on its source's own permanent table",
    "kb._source_catalog_insert": "a writer's new source: name (regex), regclass, column names checked in pg_catalog; no row of the table is read",
    "kb._source_catalog_define": "a writer's column names checked in pg_catalog against a source's permanent table",
    "kb._source_catalog_reset": "a source id: resets its backfill columns",
    "kb._source_catalog_delete": "a source id: deletes its catalog row",
    "kb._source_catalog_compile": "a source id: the CREATE FUNCTION kb._source_compile_sql builds from the catalog (identifiers by %I, the body one literal), its grants; no row read",
    "kb._source_catalog_rebind": "a source id and a regclass: the new table's columns checked in pg_catalog, no row read",
    "kb._source_backfill_lock": "a source id: locks its catalog row (SKIP LOCKED)",
    "kb._source_backfill_save": "a source id, a state from a fixed list, a text[] cursor and two counts",
}


def _definers(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return conn.execute(
        "select p.oid::regprocedure::text, p.pronamespace::regnamespace::text || '.' || p.proname"
        "  from pg_catalog.pg_proc p"
        " where p.pronamespace = 'kb'::regnamespace and p.prosecdef order by 1"
    ).fetchall()


def test_every_security_definer_function_is_listed_with_its_reason(
    conn: psycopg.Connection[Any],
) -> None:
    add_articles(conn)
    conn.execute(ADD_SOURCE)  # (a compiled trigger function: kb._source_enqueue_<id>)
    names = [re.sub(r"_\d+$", "_<id>", name) for _, name in _definers(conn)]
    assert len(names) == len(set(names)), "an overloaded SECURITY DEFINER function"
    assert sorted(names) == sorted(DEFINERS)
    assert all(reason and "\n" not in reason for reason in DEFINERS.values())


def test_security_definer_functions_take_no_type_a_caller_could_define(
    conn: psycopg.Connection[Any],
) -> None:
    """Arguments and results are of built-in types (OID below 16384), pgvector's or kbpg's own:
    an argument value never carries a type (and with it an output function or cast) the caller
    made."""
    rows = conn.execute(
        "select p.oid::regprocedure::text, t.oid::regtype::text"
        "  from pg_catalog.pg_proc p"
        "  cross join lateral pg_catalog.unnest(p.proargtypes::oid[] || p.prorettype"
        "                                      || coalesce(p.proallargtypes, '{}')) as a(oid)"
        "  join pg_catalog.pg_type t on t.oid = a.oid"
        "  left join pg_catalog.pg_depend d on d.classid = 'pg_type'::regclass and d.objid = t.oid"
        "       and d.deptype = 'e'"
        "  left join pg_catalog.pg_extension x on x.oid = d.refobjid"
        " where p.pronamespace = 'kb'::regnamespace and p.prosecdef"
        "   and t.oid >= 16384 and t.typnamespace <> 'kb'::regnamespace"
        "   and coalesce(x.extname, '') <> 'vector'"
    ).fetchall()
    assert rows == []


# -- issue 38, item 2: a writer's temp objects do not reach the owner's rights --------------------

# A temp enum with a cast to json that tells who ran it. A notice and a sequence survive the
# failed statement that would run it (a row written by it would be rolled back with it).
TRAP = """
create sequence pg_temp.cast_calls;
create type pg_temp.mood as enum ('calm');
create function pg_temp.mood_json(m pg_temp.mood) returns json language plpgsql as $$
begin
    perform pg_catalog.nextval('pg_temp.cast_calls');
    raise notice 'cast ran as %', current_user;
    return '"x"';
end $$;
create cast (pg_temp.mood as json) with function pg_temp.mood_json(pg_temp.mood);
create temp table t (id bigint primary key, body text, mood pg_temp.mood);
"""


def test_a_writer_cannot_point_a_source_at_its_temp_table(conn: psycopg.Connection[Any]) -> None:
    add_articles(conn)
    conn.execute(ADD_SOURCE)
    source = count(conn, "select id from kb.table_sources where name = 'articles'")
    owner = conn.execute("select current_user").fetchone()
    writer = conn.execute(
        "select r.rolname from kb.access_settings s join pg_roles r on r.oid = s.writer_oid"
    ).fetchone()
    assert owner is not None and writer is not None
    member = f"kbt_member_{uuid.uuid4().hex[:8]}"  # rolled back with the test's transaction
    conn.execute(sql.SQL("create role {} login").format(sql.Identifier(member)))
    conn.execute(
        sql.SQL("grant {} to {}").format(sql.Identifier(writer[0]), sql.Identifier(member))
    )
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute(sql.SQL("set role {}").format(sql.Identifier(member)))
    conn.execute(TRAP)
    # the trap works: the member's own to_jsonb runs its cast (as the member)
    conn.execute("select pg_catalog.to_jsonb('calm'::pg_temp.mood)")
    assert notices == [f"cast ran as {member}"]
    notices.clear()

    # the catalog is the owner's: no UPDATE, INSERT or DELETE for a writer
    for statement in (
        "update kb.table_sources set relation = 'pg_temp.t'::regclass where name = 'articles'",
        "insert into kb.table_sources (name, relation, key_columns, text_column)"
        " values ('evil', 'pg_temp.t'::regclass, '{id}', 'body')",
        "delete from kb.table_sources",
    ):
        with raises_sqlstate(conn, "42501") as info:
            conn.execute(statement)
        assert info.value.diag.message_primary == "permission denied for view table_sources"
    # ... and its helpers refuse a temp table, whichever way it is named
    for call in (
        "select kb.add_table_source('evil', 'pg_temp.t', text => 'body')",
        "select kb._source_catalog_insert('evil', 'pg_temp.t', null, 'body', null, null, null,"
        " null, '{}', true)",
    ):
        with raises_sqlstate(conn, "42809") as info:
            conn.execute(call)
        assert info.value.diag.message_primary == (
            "table t is temporary: a table source reads a permanent table"
        )
        assert info.value.diag.message_hint == (
            "kbpg sync reads the table from a session of its own: create it without TEMPORARY"
            " (an UNLOGGED table will do)"
        )
    # nor may the writer redefine a source on a table it may not put triggers on
    with raises_sqlstate(conn, "42501") as info:
        conn.execute(
            "select kb._source_catalog_define(%s, 'body', null, null, null, null, '{}', null)",
            (source,),
        )
    assert info.value.diag.message_primary == (
        f"role {member} may not create triggers on public.articles"
    )

    # the trigger on the temp table, naming the source's id: the insert fails
    conn.execute(
        "create trigger forged after insert on pg_temp.t referencing new table as kbpg_new"
        f" for each statement execute function kb._source_enqueue('{source}')"
    )
    with raises_sqlstate(conn, "42501") as info:
        conn.execute("insert into pg_temp.t values (1, 'x', 'calm')")
    assert info.value.diag.message_primary == (
        f'trigger forged on t does not belong to table source "articles" (table {source_table(conn)})'
    )
    conn.execute("drop trigger forged on pg_temp.t")
    conn.execute(
        "create trigger forged_row after insert on pg_temp.t for each row"
        f" execute function kb._source_enqueue('{source}')"
    )
    with raises_sqlstate(conn, "42501"):
        conn.execute("insert into pg_temp.t values (1, 'x', 'calm')")

    # the cast never ran, as the owner or anyone
    assert notices == []
    assert conn.execute("select last_value, is_called from pg_temp.cast_calls").fetchone() == (
        1,
        True,
    )  # the one call above, by the member itself
    conn.execute("reset role")
    assert conn.execute(
        "select relation = 'public.articles'::regclass from kb.table_sources where id = %s",
        (source,),
    ).fetchone() == (True,)
    assert queue(conn) == []
    assert conn.execute(
        "select rolsuper from pg_roles where rolname = %s", (member,)
    ).fetchone() == (False,)


def source_table(conn: psycopg.Connection[Any]) -> int:
    """The OID of public.articles (the trigger's message names the source's table by OID)."""
    return count(conn, "select 'public.articles'::regclass::oid")


def test_a_source_on_a_temp_table_queues_nothing(conn: psycopg.Connection[Any]) -> None:
    """A catalog row naming a temp table (only the owner could write one now; a writer could
    before) makes its trigger raise 42809, before it reads a row."""
    conn.execute("create temp table t (id bigint primary key, body text)")
    conn.execute(
        "insert into kb.table_sources (name, relation, relation_name, key_columns, text_column)"
        " values ('temp', 'pg_temp.t'::regclass, 'pg_temp.t', '{id}', 'body')"
    )
    source = count(conn, "select id from kb.table_sources where name = 'temp'")
    conn.execute(
        "create trigger kbpg_temp_insert after insert on pg_temp.t referencing new table as"
        f" kbpg_new for each statement execute function kb._source_enqueue('{source}')"
    )
    conn.execute(
        "create trigger kbpg_temp_truncate after truncate on pg_temp.t for each statement"
        f" execute function kb._source_enqueue_truncate('{source}')"
    )
    for statement in ("insert into pg_temp.t values (1, 'x')", "truncate pg_temp.t"):
        with raises_sqlstate(conn, "42809") as info:
            conn.execute(statement)
        assert info.value.diag.message_primary == (
            "table t is temporary: a table source reads a permanent table"
        )
    assert queue(conn) == []
    with raises_sqlstate(conn, "42809"):
        conn.execute("select kb.resync_table_source('temp')")


@pytest.mark.parametrize(
    "call",
    [
        "select kb._source_catalog_delete(1)",
        "select kb._source_backfill_lock(1)",
        "select kb._source_backfill_save(1, 'done', null, 0, 0)",
    ],
)
def test_the_catalog_helpers_refuse_a_role_that_is_not_a_writer(
    conn: psycopg.Connection[Any], call: str
) -> None:
    """EXECUTE is the writer role's and the owner's only; granted by hand to another role, the
    helper still refuses it (and names the grant)."""
    other = f"kbt_other_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("create role {} login").format(sql.Identifier(other)))
    conn.execute(sql.SQL("grant usage on schema kb to {}").format(sql.Identifier(other)))
    conn.execute(sql.SQL("set role {}").format(sql.Identifier(other)))
    with raises_sqlstate(conn, "42501") as info:
        conn.execute(call)
    assert info.value.diag.message_primary.startswith("permission denied for function _source_")
    conn.execute("reset role")
    function = call.split("(")[0].removeprefix("select ")
    conn.execute(
        sql.SQL("grant execute on function {} to {}").format(
            sql.SQL(count_text(conn, f"select '{function}'::regproc::regprocedure::text")),
            sql.Identifier(other),
        )
    )
    conn.execute(sql.SQL("set role {}").format(sql.Identifier(other)))
    with raises_sqlstate(conn, "42501") as info:
        conn.execute(call)
    assert info.value.diag.message_primary == f"role {other} may not define table sources"
    assert info.value.diag.message_hint is not None
    assert info.value.diag.message_hint.startswith("kbpg's writer role may: grant ")
    assert info.value.diag.message_hint.endswith(f" to {other};  (run by the owner of schema kb)")


def count_text(conn: psycopg.Connection[Any], query: str) -> str:
    row = conn.execute(query).fetchone()
    assert row is not None
    return str(row[0])


def test_a_compiled_trigger_runs_static_statements_while_the_types_hold(
    conn: psycopg.Connection[Any],
) -> None:
    """A source on a plain table gets kb._source_enqueue_<id>(): the statements kb._source_enqueue
    would build, static, run while the columns keep their types; after an ALTER TABLE to a type
    of the application's, built anew (its values by output function: no cast of the
    application's runs); it raises when a writer hangs it on a table of its own, and goes with
    its source (with a trigger left on it)."""
    add_articles(conn)
    conn.execute(ADD_SOURCE)
    source = count(conn, "select id from kb.table_sources where name = 'articles'")
    function = f"kb._source_enqueue_{source}()"
    assert conn.execute(
        "select distinct tgfoid::regprocedure::text from pg_trigger"
        " where tgrelid = 'public.articles'::regclass and tgname <> 'kbpg_articles_truncate'"
    ).fetchall() == [(function,)]
    body = count_text(conn, f"select prosrc from pg_proc where oid = '{function}'::regprocedure")
    # its INSERT, DELETE and UPDATE statements, as kb._source_change_template builds them
    for new, old, op in (("kbpg_new", None, "'I'"), (None, "kbpg_old", None),
                         ("kbpg_new", "kbpg_old", "'U'")):  # fmt: skip
        static = conn.execute(
            "select kb._source_change_template(%s, %s, %s, %s, %s)",
            (source, new, old, str(source), op),
        ).fetchone()
        assert static is not None and f"        {static[0]};" in body
    assert count_text(conn, f"select kb._source_types_changed_sql({source})") in body
    assert body.count("execute kb._source_change_sql(") == 1  # only after a type changed
    conn.execute("update public.articles set body = 'changed' where id = 2")
    assert queue(conn) == [(["2"], "U")]
    conn.execute("delete from kb.source_queue")

    # the application makes a column it reads an enum of its own, with casts that record calls
    conn.execute(
        "create table public.cast_calls (via text);"
        "create type public.mood as enum ('calm', 'glad');"
        "create function public.mood_json(m public.mood) returns json language plpgsql as $$"
        " begin insert into public.cast_calls values ('json'); return '\"x\"'; end $$;"
        "create function public.mood_text(m public.mood) returns text language plpgsql as $$"
        " begin insert into public.cast_calls values ('text'); return 'x'; end $$;"
        "create cast (public.mood as json) with function public.mood_json(public.mood);"
        "create cast (public.mood as text) with function public.mood_text(public.mood);"
        "alter table public.articles alter column author type public.mood using 'calm'"
    )
    conn.execute("update public.articles set author = 'glad' where id = 1")
    conn.execute("update public.articles set view_count = 7 where id = 3")  # not read: nothing
    assert queue(conn) == [(["1"], "U")]
    assert conn.execute("select count(*) from public.cast_calls").fetchone() == (0,)

    # hung by a writer on a table of its own, it raises before it reads a row
    writer = conn.execute(
        "select r.rolname from kb.access_settings s join pg_roles r on r.oid = s.writer_oid"
    ).fetchone()
    assert writer is not None
    member = f"kbt_member_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("create role {} login").format(sql.Identifier(member)))
    conn.execute(
        sql.SQL("grant {} to {}").format(sql.Identifier(writer[0]), sql.Identifier(member))
    )
    conn.execute(sql.SQL("set role {}").format(sql.Identifier(member)))
    conn.execute("create temp table t (id bigint primary key, body text)")
    conn.execute(
        "create trigger forged after insert on pg_temp.t referencing new table as kbpg_new"
        f" for each statement execute function {function}"
    )
    with raises_sqlstate(conn, "42501") as info:
        conn.execute("insert into pg_temp.t values (1, 'x')")
    assert info.value.diag.message_primary == (
        "trigger forged on t does not belong to table source articles"
    )
    conn.execute("reset role")

    # its source removed, it goes, and a trigger left on it with it
    conn.execute("select * from kb.remove_table_source('articles')")
    assert conn.execute(
        "select count(*) from pg_proc where proname = %s", (f"_source_enqueue_{source}",)
    ).fetchone() == (0,)
    assert conn.execute(
        "select count(*) from pg_trigger where tgrelid = 'pg_temp.t'::regclass"
    ).fetchone() == (0,)


def test_applying_the_sql_files_switches_a_source_to_its_compiled_trigger(
    conn: psycopg.Connection[Any],
) -> None:
    """A source made before compiled triggers (its triggers call kb._source_enqueue) gets its
    compiled function at the next `kbpg db upgrade`, which applies sql/ again."""
    add_articles(conn)
    conn.execute(ADD_SOURCE)
    source = count(conn, "select id from kb.table_sources where name = 'articles'")
    conn.execute(f"drop function kb._source_enqueue_{source}() cascade")
    for event, tables in (
        ("insert", "new table as kbpg_new"),
        ("update", "old table as kbpg_old new table as kbpg_new"),
        ("delete", "old table as kbpg_old"),
    ):
        conn.execute(
            f"create trigger kbpg_articles_{event} after {event} on public.articles"
            f" referencing {tables} for each statement execute function"
            f" kb._source_enqueue('{source}')"
        )
    schema = count_text(
        conn,
        "select n.nspname from pg_extension e join pg_namespace n on n.oid = e.extnamespace"
        " where e.extname = 'vector'",
    )
    for statement in sql_function_statements(schema):
        conn.execute(statement)
    conn.execute("reset search_path")
    assert conn.execute(
        "select tgname, tgfoid::regprocedure::text from pg_trigger"
        " where tgrelid = 'public.articles'::regclass order by tgname"
    ).fetchall() == [
        ("kbpg_articles_delete", f"kb._source_enqueue_{source}()"),
        ("kbpg_articles_insert", f"kb._source_enqueue_{source}()"),
        ("kbpg_articles_truncate", "kb._source_enqueue_truncate()"),
        ("kbpg_articles_update", f"kb._source_enqueue_{source}()"),
    ]
    conn.execute("update public.articles set body = 'changed' where id = 3")
    assert queue(conn) == [(["3"], "U")]
