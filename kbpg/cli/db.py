"""`kbpg db ...`: the embedded server, the URL, migrations."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kbpg.cli.common import (
    AppContext,
    handle_errors,
    pass_app,
)
from kbpg.errors import KbpgError

if TYPE_CHECKING:
    from kbpg.store.db import SchemaStatus


@click.group()
def db() -> None:
    """Manage the database: embedded server, URL, migrations."""


def _embedded_server(app: AppContext) -> Any:
    from kbpg.store.embedded import EmbeddedServer

    if app.settings.database_url:
        raise KbpgError(
            "KBPG_DATABASE_URL is set: kbpg uses that database, not its embedded server",
            hint="unset KBPG_DATABASE_URL to manage the embedded server",
        )
    return EmbeddedServer(app.settings.home)


@db.command("start")
@click.option(
    "--prewarm",
    is_flag=True,
    help="Then load kbpg's indexes and tables into memory (kb.prewarm(), with PostgreSQL's "
    "pg_prewarm where the server has it), so the first searches run as fast as later ones.",
)
@pass_app
@handle_errors
def db_start(app: AppContext, prewarm: bool) -> None:
    """Start the embedded PostgreSQL server (it keeps running until `kbpg db stop`)."""
    server = _embedded_server(app)
    url = server.owner_url()
    click.echo(f"embedded PostgreSQL running in {server.pgdata}", err=True)
    if prewarm:
        _prewarm(url)
    click.echo(url)


def _prewarm(url: str) -> None:
    """kb.prewarm() on kbpg's database, timed, on stderr; skipped with a note where it cannot
    run (no pg_prewarm on this server, or a schema from before kb.prewarm)."""
    from kbpg.store import db as kdb
    from kbpg.store import queries

    started = time.perf_counter()
    with kdb.connect(url, autocommit=True) as conn, kdb.translate_errors():
        row = conn.execute(queries.PREWARM_AVAILABLE).fetchone()
        if row is None or not row[0]:
            click.echo(
                "not prewarmed: this server has no pg_prewarm (PostgreSQL contrib)", err=True
            )
            return
        if not row[1]:
            click.echo("not prewarmed: kb.prewarm() is missing, run `kbpg db upgrade`", err=True)
            return
        conn.execute(queries.CREATE_PREWARM)  # kbpg's own server created it (EmbeddedServer)
        loaded = dict(conn.execute(queries.PREWARM).fetchall())
    where = [
        f"{int(loaded[mode]) / 2**20:,.0f} MB into {place}"
        for mode, place in (("buffer", "shared buffers"), ("read", "the OS cache"))
        if mode in loaded
    ]
    click.echo(
        f"prewarmed {', '.join(where) or 'nothing'} in {time.perf_counter() - started:.1f} s",
        err=True,
    )


@db.command("stop")
@pass_app
@handle_errors
def db_stop(app: AppContext) -> None:
    """Stop the embedded PostgreSQL server."""
    server = _embedded_server(app)
    stopped = server.stop()
    click.echo("stopped" if stopped else "not running")


@db.command("standby")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--primary",
    "primary_url",
    metavar="URL",
    help="Copy the PostgreSQL server at URL (its role needs REPLICATION; PostgreSQL 18, the "
    "embedded version).  [default: KBPG_DATABASE_URL, else the embedded server]",
)
@pass_app
@handle_errors
def db_standby(app: AppContext, directory: Path, primary_url: str | None) -> None:
    """Make a hot standby of the primary in DIRECTORY, start it, print its URL for KBPG_READ_URL.

    pg_basebackup -R (the embedded wheel's) copies the primary and the copy keeps replaying
    its WAL: searches run there, writes are refused. Stop it with
    `KBPG_HOME=DIRECTORY kbpg db stop`, start it again with `... kbpg db start`.
    """
    from psycopg.conninfo import conninfo_to_dict

    from kbpg.store.embedded import DATABASE_NAME, OWNER, SUPERUSER, EmbeddedServer
    from kbpg.store.replicas import redacted

    home = directory.expanduser().resolve()
    primary_url = primary_url or app.settings.database_url
    if primary_url is None:
        primary = EmbeddedServer(app.settings.home)
        primary.owner_url()  # its owner role set up first: the copy has it
        standby = primary.create_standby(home)
        url = standby.url(user=OWNER)
        source = f"the embedded server in {primary.pgdata}"
    else:
        standby = EmbeddedServer.standby_of(primary_url, home)
        parts = conninfo_to_dict(primary_url)
        url = standby.url(
            str(parts.get("dbname") or DATABASE_NAME), str(parts.get("user") or SUPERUSER)
        )
        source = redacted(primary_url)
    click.echo(f"hot standby of {source} running in {standby.pgdata}", err=True)
    click.echo(f"searches go there with: export KBPG_READ_URL='{url}'", err=True)
    click.echo(f"stop it with: KBPG_HOME={shlex.quote(str(home))} kbpg db stop", err=True)
    click.echo(url)


@db.command("status")
@pass_app
@handle_errors
def db_status(app: AppContext) -> None:
    """Show which database kbpg uses, whether it is up, and its schema revision."""
    from kbpg.store import db as kdb

    settings = app.settings
    if settings.database_url:
        click.echo("database: external (KBPG_DATABASE_URL)")
        url = settings.database_url
    else:
        status = _embedded_server(app).status()
        click.echo(f"database: embedded, data in {status.pgdata}")
        click.echo(f"server: {status.note}" + (f" (pid {status.pid})" if status.pid else ""))
        if not status.running:
            return
        assert status.url is not None
        url = status.url
    from kbpg.store import queries

    with kdb.connect(url) as conn:
        version = conn.execute(queries.SERVER_VERSION).fetchone()
        vector = conn.execute(queries.VECTOR_VERSION).fetchone()
        schema = kdb.schema_status(conn)
    click.echo(f"postgresql: {version[0] if version else '?'}")
    click.echo(f"pgvector: {vector[0] if vector else 'not installed'}")
    current = schema.current or "none"
    state = "at head" if schema.at_head else "run `kbpg db upgrade`"
    click.echo(f"schema: {current} (head {schema.head}, {state})")


@db.command("url")
@pass_app
@handle_errors
def db_url(app: AppContext) -> None:
    """Print the connection URL, so that `psql "$(kbpg db url)"` works."""
    click.echo(app.url)


@db.command("psql", context_settings={"ignore_unknown_options": True})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@pass_app
@handle_errors
def db_psql(app: AppContext, psql_args: tuple[str, ...]) -> None:
    """Open psql on kbpg's database (extra arguments go to psql)."""
    from kbpg.store.embedded import _binaries_dir

    psql = shutil.which("psql")
    if psql is None and not app.settings.database_url:
        psql = str(_binaries_dir() / "psql")
    if psql is None:
        raise KbpgError("psql is not installed", hint="install the PostgreSQL client")
    url = app.url
    sys.stdout.flush()
    os.execv(psql, [psql, url, *psql_args])


def _schema_status(app: AppContext) -> SchemaStatus:
    """The alembic revision of the database kbpg uses."""
    from kbpg.store import db as kdb

    with kdb.connect(app.url) as conn:
        return kdb.schema_status(conn)


@db.command("upgrade")
@click.argument("revision", default="head")
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the migration as a psql script instead of running it (reads no database; "
    "from a revision: REV:head).",
)
@click.option(
    "--vector-schema",
    metavar="SCHEMA",
    help="With --sql: the schema pgvector is in.  [default: public]",
)
@click.option(
    "--language",
    metavar="LANG",
    help="The knowledge base's language: a text search configuration of the server (english, "
    "russian, german, simple, ...: `select * from kb.languages()`) or cjk (Chinese, Japanese, "
    "Korean). A change re-analyses every chunk in one transaction  [env var: KBPG_LANGUAGE; "
    "default: english for a new knowledge base, else unchanged].",
)
@pass_app
@handle_errors
def db_upgrade(
    app: AppContext, revision: str, as_sql: bool, vector_schema: str | None, language: str | None
) -> None:
    """Migrate to REVISION (default head) and re-apply the sql/ function files at head."""
    from kbpg.store import db as kdb

    language = language or app.settings.language
    if as_sql:
        if language is not None:
            raise click.UsageError("--language runs online (the script leaves the language)")
        click.echo(kdb.upgrade_script(revision, vector_schema=vector_schema or "public"), nl=False)
        return
    if vector_schema is not None:
        raise click.UsageError("--vector-schema goes with --sql (online, kbpg finds it itself)")
    kdb.upgrade(app.url, revision)
    status = _schema_status(app)
    click.echo(f"schema at {status.current}" + (" (head)" if status.at_head else ""))
    if language is not None:
        if not status.at_head:
            raise KbpgError(
                "--language needs the schema at head", hint="run `kbpg db upgrade --language ...`"
            )
        _set_language(app, language)


def _set_language(app: AppContext, language: str) -> None:
    """The knowledge base's language, changed in one transaction with progress on stderr."""
    from kbpg.models.embedders import default_embedder, get_embedder, model_mismatch
    from kbpg.store import db as kdb
    from kbpg.store import queries
    from kbpg.store.language import change_language, is_english

    tty = sys.stderr.isatty()

    def progress(event: Any) -> None:
        click.echo(("\r\x1b[K" if tty else "") + event.describe(), nl=not tty, err=True)

    with kdb.connect(app.url) as conn, kdb.translate_errors():
        change = change_language(conn, language, progress)
        space = conn.execute(queries.EMBEDDING_SPACE).fetchone()
        english = is_english(conn, change.after)
        conn.commit()
    if tty and change.changed:
        click.echo("\r\x1b[K", nl=False, err=True)
    click.echo(change.describe())
    if space:
        model = str(space[0])
    else:  # the model a first ingest will record
        name = app.settings.embedder or default_embedder(english)
        model = get_embedder(app.settings, name).model_name
    warning = model_mismatch(change.after, english, model)
    if warning:
        click.echo(f"warning: {warning}", err=True)


@db.command("downgrade")
@click.argument("revision")
@pass_app
@handle_errors
def db_downgrade(app: AppContext, revision: str) -> None:
    """Migrate down to REVISION (`base` removes the kb schema and all its data)."""
    from kbpg.store import db as kdb

    kdb.downgrade(app.url, revision)
    status = _schema_status(app)
    click.echo(f"schema at {status.current or 'base'}")


@db.command("current")
@pass_app
@handle_errors
def db_current(app: AppContext) -> None:
    """Print the schema revision of the database (`none` when unmigrated)."""

    status = _schema_status(app)
    click.echo(status.current or "none")


@db.command("check")
@pass_app
@handle_errors
def db_check(app: AppContext) -> None:
    """Exit 0 when the schema is at head, 1 (with a hint) otherwise."""
    from kbpg.store import db as kdb

    with kdb.connect(app.url) as conn:
        status = kdb.require_schema(conn)
    click.echo(f"schema at head ({status.head})")


@db.command("distribute")
@click.option(
    "--shards",
    type=click.IntRange(1, 64000),
    metavar="N",
    help="Shards per distributed table.  [default: the coordinator's citus.shard_count]",
)
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the SQL it runs as a psql script instead of running it (reads no database).",
)
@pass_app
@handle_errors
def db_distribute(app: AppContext, shards: int | None, as_sql: bool) -> None:
    """Distribute the knowledge base over a Citus cluster (run on the coordinator, at head).

    Documents, chunks and their graph rows are spread by document id and co-located; the small
    global tables become reference tables; chunk ids stay global. Refused on a server without
    Citus; a knowledge base distributed already is left as it is.
    """
    from kbpg.store import distribute

    if as_sql:
        click.echo(distribute.full_script(shards), nl=False)
        return
    done = distribute.distribute(app.url, shards)
    state = "distributed already" if done.already else "distributed"
    click.echo(f"{state}: {done.shards} shards on {done.nodes} nodes")
