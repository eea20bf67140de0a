"""Table sources as the production roles: a database owned by a non-superuser (the kb owner), an
application role that owns its table and has no grant on schema kb, an ingest bot in kbpg's
writer role that adds the source and runs the worker; each missing grant named by a hint."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from tests.conftest import with_database, with_user
from tests.helpers import clean_env, invoke_kbpg
from tests.tablesdata import ARTICLES, ROWS, insert_article

pytestmark = pytest.mark.least_privilege

PASSWORD = "kbpg-test-secret"


@dataclass
class Roles:
    reader: str
    writer: str
    app: str  # owns public.articles, writes it, nothing in kb
    bot: str  # member of the writer role: adds the source, runs kbpg sync


@pytest.fixture
def production(
    admin_url: str, owned_database: Callable[..., str], tmp_path: Path
) -> Iterator[tuple[str, Roles]]:
    """The owner's URL, after `kbpg db upgrade` and `kb.access_setup` with roles a DBA made."""
    url = owned_database()
    suffix = uuid.uuid4().hex[:8]
    roles = Roles(*(f"kbt_{n}_{suffix}" for n in ("reader", "writer", "app", "bot")))
    database = urlsplit(url).path.lstrip("/")
    admin_db = with_database(admin_url, database)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in (roles.reader, roles.writer):
            conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(role)))
        for role in (roles.app, roles.bot):
            conn.execute(
                sql.SQL("create role {} login password {}").format(
                    sql.Identifier(role), sql.Literal(PASSWORD)
                )
            )
        conn.execute(
            sql.SQL("grant {} to {}").format(
                sql.Identifier(roles.writer), sql.Identifier(roles.bot)
            )
        )
    try:
        env = clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(tmp_path / "home"))
        assert invoke_kbpg("db", "upgrade", env=env).returncode == 0
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("select kb.access_setup(%s, %s)", (roles.reader, roles.writer))
            # the vector index is the owner's to create (docs/operations.md "Migrations"): the writer's
            # first ingest then finds it
            conn.execute("select kb.set_embedding_space('all-MiniLM-L6-v2', 384)")
            conn.execute(sql.SQL("grant create on schema public to {}").format(
                sql.Identifier(roles.app)
            ))  # fmt: skip
        with psycopg.connect(with_user(url, roles.app, PASSWORD), autocommit=True) as conn:
            conn.execute(ARTICLES)
            for row in ROWS:
                insert_article(conn, *row)
        yield url, roles
    finally:
        with psycopg.connect(admin_db, autocommit=True) as conn:
            for role in (roles.app, roles.bot, roles.reader, roles.writer):
                conn.execute(sql.SQL("drop owned by {} cascade").format(sql.Identifier(role)))
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role in (roles.app, roles.bot, roles.reader, roles.writer):
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


def _as(url: str, role: str, tmp_path: Path) -> dict[str, str]:
    return clean_env(
        KBPG_DATABASE_URL=with_user(url, role, PASSWORD), KBPG_HOME=str(tmp_path / "home")
    )


def test_the_production_roles_add_a_source_and_sync_it(
    production: tuple[str, Roles], admin_url: str, tmp_path: Path
) -> None:
    url, roles = production
    bot, app = _as(url, roles.bot, tmp_path), _as(url, roles.app, tmp_path)
    add = ("sources", "add", "articles", "public.articles", "--text", "body",
           "--groups", "visible_to")  # fmt: skip

    # the application's own role has no kbpg role: it is told which one it would need
    refused = invoke_kbpg(*add, env=app)
    assert refused.returncode == 1
    assert "Error: permission denied for table kbpg_alembic_version" in refused.stderr
    assert "Hint: table sources are kbpg's writer role's to define: grant kbpg_writer (or the" in (
        refused.stderr
    )
    assert f"to {roles.app};" in refused.stderr

    # the bot may write the catalog, not put triggers on someone else's table
    refused = invoke_kbpg(*add, env=bot)
    assert refused.returncode == 1
    assert "may not create triggers on public.articles" in refused.stderr
    assert f"its owner runs: grant trigger on public.articles to {roles.bot};" in refused.stderr

    with psycopg.connect(with_user(url, roles.app, PASSWORD), autocommit=True) as conn:
        conn.execute(sql.SQL("grant trigger on public.articles to {}").format(
            sql.Identifier(roles.bot)
        ))  # fmt: skip
    added = invoke_kbpg(*add, env=bot)
    assert added.returncode == 0, added.stderr
    # ... and is told what the worker will lack
    assert f"Warning: kbpg sync running as {roles.writer} cannot read public.articles" in (
        added.stderr
    )
    assert f"grant select on public.articles to {roles.writer};" in added.stderr
    unreadable = invoke_kbpg("sync", env=bot)
    assert unreadable.returncode == 1
    assert "Error: source articles could not be read: permission denied" in unreadable.stderr
    assert f"grant select on public.articles to {roles.writer};" in unreadable.stderr

    with psycopg.connect(with_user(url, roles.app, PASSWORD), autocommit=True) as conn:
        conn.execute(sql.SQL("grant select on public.articles to {}").format(
            sql.Identifier(roles.writer)
        ))  # fmt: skip
        # the application writes as before, without any grant on schema kb
        insert_article(conn, 4, "From the app", "Written by the application's own role.")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select count(*) from kb.source_queue")
    synced = invoke_kbpg("sync", "--json", env=bot)
    assert synced.returncode == 0, synced.stderr
    assert '"added": 4' in synced.stdout

    # issue 38: an enum of the application's whose casts record who runs them; its insert runs
    # the trigger (kbpg's owner's rights) and nothing of the application's
    with psycopg.connect(with_user(url, roles.app, PASSWORD), autocommit=True) as conn:
        conn.execute(
            "create table public.cast_calls (who text);"
            "create type public.mood as enum ('calm');"
            "create function public.mood_json(m public.mood) returns json language plpgsql as $$"
            " begin insert into public.cast_calls values (current_user); return '\"x\"'; end $$;"
            "create cast (public.mood as json) with function public.mood_json(public.mood);"
            "alter table public.articles add column mood public.mood"
        )
        conn.execute(
            "insert into public.articles (id, title, body, mood) values (100, 'x', 'harmless', 'calm')"
        )
        conn.execute(
            "update public.articles set body = 'still harmless', mood = 'calm' where id = 100"
        )
        assert conn.execute("select count(*) from public.cast_calls").fetchone() == (0,)
        assert conn.execute(
            "select rolsuper from pg_roles where rolname = current_user"
        ).fetchone() == (False,)

    # the sources' definitions, queue, claims and parked rows are not the reader's to read
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("table_sources", "source_queue", "source_claims", "source_errors"):
            assert conn.execute(
                "select has_table_privilege(%s, %s, 'SELECT')", (roles.reader, f"kb.{table}")
            ).fetchone() == (False,), table
        # the trigger functions run with the owner's rights: only the owner and the writer
        # role may hang them on a table (firing one checks nothing)
        assert conn.execute(
            "select has_function_privilege('public', 'kb._source_enqueue()', 'EXECUTE'),"
            "       has_function_privilege(%s, 'kb._source_enqueue()', 'EXECUTE'),"
            "       has_function_privilege(%s, 'kb._source_enqueue_truncate()', 'EXECUTE'),"
            "       has_function_privilege(%s, 'kb._source_enqueue()', 'EXECUTE')",
            (roles.reader, roles.app, roles.writer),
        ).fetchone() == (False, False, False, True)
    # nor the functions that read them (security invoker: the reader has no table to read)
    database = urlsplit(url).path.lstrip("/")
    with psycopg.connect(with_database(admin_url, database), autocommit=True) as conn:
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(roles.reader)))
        for call in (
            "select * from kb.list_table_sources()",
            "select * from kb.list_source_errors()",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(call)
        conn.execute("reset role")
        conn.execute(sql.SQL("grant usage on schema kb to {}").format(sql.Identifier(roles.app)))
    with psycopg.connect(with_user(url, roles.app, PASSWORD), autocommit=True) as conn:
        conn.execute("create table public.forged (id integer primary key, body text)")
        with pytest.raises(
            psycopg.errors.InsufficientPrivilege, match="permission denied for function"
        ):
            conn.execute(
                "create trigger forged after insert on public.forged for each row"
                " execute function kb._source_enqueue('1')"
            )

    # only the table's owner may drop a trigger: removed by the bot, they stay, inert
    removed = invoke_kbpg("sources", "remove", "articles", env=bot)
    assert removed.returncode == 0, removed.stderr
    assert "stay until its owner drops them" in removed.stderr
    assert "drop trigger kbpg_articles_insert on public.articles;" in removed.stderr
    with psycopg.connect(with_user(url, roles.app, PASSWORD), autocommit=True) as conn:
        insert_article(conn, 5, "After", "Written after the source was removed.")
    with psycopg.connect(url) as conn:
        assert conn.execute("select count(*) from kb.source_queue").fetchone() == (0,)
