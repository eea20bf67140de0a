"""Connections, migrations and the SQL function files: how kbpg reaches its database."""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from kbpg.config import Settings
from kbpg.errors import (
    DatabaseUnavailable,
    KbpgError,
    SchemaNotMigrated,
    first_line,
    from_psycopg,
)
from kbpg.store import queries
from kbpg.store.language import change_language

VERSION_TABLE = "kbpg_alembic_version"
CONNECT_TIMEOUT_S = 5
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # kbpg/


def _resource_dir(packaged: str, source: str) -> Path:
    """sql/ and migrations/ ship inside the wheel; in a source checkout they sit beside kbpg/."""
    inside = _PACKAGE_DIR / packaged
    return inside if inside.is_dir() else _PACKAGE_DIR.parent / source


def sql_dir() -> Path:
    return _resource_dir("_sql", "sql")


def migrations_dir() -> Path:
    return _resource_dir("_migrations", "migrations")


def sql_files() -> list[Path]:
    """The function files, in the order they are applied (their numeric prefix)."""
    return sorted(sql_dir().glob("[0-9][0-9][0-9]-*.sql"))


def resolve_url(settings: Settings) -> str:
    """KBPG_DATABASE_URL when set, else the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    from kbpg.store.embedded import EmbeddedServer

    return EmbeddedServer(settings.home).owner_url()


def register_types(conn: psycopg.Connection[Any]) -> None:
    """Register pgvector's types on a connection when the extension is installed, in whatever
    schema it lives (Supabase: `extensions`, often off the search_path)."""
    from pgvector.psycopg.bit import register_bit_info
    from pgvector.psycopg.halfvec import register_halfvec_info
    from pgvector.psycopg.sparsevec import register_sparsevec_info
    from pgvector.psycopg.vector import register_vector_info
    from psycopg import sql
    from psycopg.types import TypeInfo

    row = conn.execute(
        "select n.nspname from pg_catalog.pg_extension e"
        " join pg_catalog.pg_namespace n on n.oid = e.extnamespace where e.extname = 'vector'"
    ).fetchone()
    if row is not None:
        schema = str(row[0])
        register_vector_info(conn, TypeInfo.fetch(conn, sql.Identifier(schema, "vector")))
        register_bit_info(conn, TypeInfo.fetch(conn, "bit"))
        for name, register in (
            ("halfvec", register_halfvec_info),
            ("sparsevec", register_sparsevec_info),
        ):
            info = TypeInfo.fetch(conn, sql.Identifier(schema, name))
            if info is not None:
                register(conn, info)
    # the queries above opened a transaction; leave none behind
    if not conn.autocommit:
        conn.rollback()


def in_knowledge_base(url: str, kb_id: int) -> str:
    """`url` with the knowledge base selected for every session it opens (the setting
    kbpg.kb_id, as a startup option beside any the URL has): no round trip per call."""
    params = conninfo_to_dict(url)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c kbpg.kb_id={int(kb_id)}".strip()
    return make_conninfo(**params)  # type: ignore[arg-type]


def knowledge_base_id(conn: psycopg.Connection[Any], name: str) -> int:
    """The id of the knowledge base `name` (NotFound, with a hint, when there is none)."""
    with translate_errors():
        row = conn.execute(queries.KNOWLEDGE_BASE_ID, (name,)).fetchone()
    assert row is not None
    return int(row[0])


def connect(url: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    """One connection with pgvector types registered; errors become KbpgError."""
    try:
        conn = psycopg.connect(
            url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S, **kwargs
        )
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL: {first_line(str(exc))}",
            hint="check KBPG_DATABASE_URL, or unset it to use the embedded server",
        ) from exc
    register_types(conn)
    return conn


# A pooled connection back from its last call less than this ago is lent without the check's
# round trip: under load every connection comes back within milliseconds, and the check cost
# a sixth of a search's round trips. A server restart inside that second fails one call.
CHECK_IDLE_AFTER_S = 1.0
_returned_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
    weakref.WeakKeyDictionary()
)


def _returned(conn: psycopg.Connection[Any]) -> None:
    _returned_at[conn] = time.monotonic()


def _check_if_idle(conn: psycopg.Connection[Any]) -> None:
    """A server restart breaks idle connections: test one on checkout (one round trip) when it
    has been idle for CHECK_IDLE_AFTER_S."""
    last = _returned_at.get(conn)
    if last is None or time.monotonic() - last >= CHECK_IDLE_AFTER_S:
        ConnectionPool.check_connection(conn)


def create_pool(url: str, *, min_size: int = 1, max_size: int = 8) -> ConnectionPool:
    """A connection pool whose connections have pgvector types registered."""
    pool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs={"connect_timeout": CONNECT_TIMEOUT_S},
        configure=register_types,
        check=_check_if_idle,
        reset=_returned,
        open=False,
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
    except Exception as exc:
        pool.close()
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL: {first_line(str(exc))}",
            hint="check KBPG_DATABASE_URL, or unset it to use the embedded server",
        ) from exc
    return pool


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn psycopg errors raised inside the block into KbpgError subclasses."""
    try:
        yield
    except psycopg.Error as exc:
        raise from_psycopg(exc) from exc


# -- migrations ------------------------------------------------------------------------------


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy spelling of a libpq URL (driver psycopg 3)."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise KbpgError(f"not a PostgreSQL URL: {url!r}", hint="use postgresql://user@host/db")


def alembic_config(connection: Any = None) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


@dataclass(frozen=True)
class SchemaStatus:
    current: str | None
    head: str

    @property
    def at_head(self) -> bool:
        return self.current == self.head


def schema_status(conn: psycopg.Connection[Any]) -> SchemaStatus:
    """Which alembic revision the database is at, read from kbpg's own version table."""
    with translate_errors():
        exists = conn.execute("select pg_catalog.to_regclass(%s)", (VERSION_TABLE,)).fetchone()
        current = None
        if exists and exists[0] is not None:
            row = conn.execute(f"select version_num from {VERSION_TABLE}").fetchone()
            current = row[0] if row else None
    return SchemaStatus(current=current, head=head_revision())


def require_schema(conn: psycopg.Connection[Any]) -> SchemaStatus:
    """The schema status; SchemaNotMigrated unless the database is at kbpg's head revision."""
    status = schema_status(conn)
    if status.current is None:
        raise SchemaNotMigrated("this database has no kbpg schema", hint="run `kbpg db upgrade`")
    if not status.at_head:
        raise SchemaNotMigrated(
            f"kbpg schema is at {status.current}, this kbpg needs {status.head}",
            hint="run `kbpg db upgrade`",
        )
    return status


# serialises the first use of a database by concurrent commands (a session advisory lock key)
FIRST_USE_LOCK_KEY = 0x6B627068


def create_schema_if_missing(
    conn: psycopg.Connection[Any], url: str, language: str | None = None
) -> bool:
    """Migrate to head a database with no kbpg schema at all (the embedded server's, on first
    use), in `language` when given (KBPG_LANGUAGE); True when it did. Concurrent first uses: one
    migrates, the others wait for it. A database at another revision is left alone (its upgrade
    is for `kbpg db upgrade`)."""
    if schema_status(conn).current is not None:
        return False
    with translate_errors():
        conn.execute("select pg_catalog.pg_advisory_lock(%s)", (FIRST_USE_LOCK_KEY,))
    try:
        if schema_status(conn).current is not None:
            return False
        upgrade(url)
        if language is not None:
            # an empty knowledge base: nothing to re-analyse
            with translate_errors(), conn.transaction():
                change_language(conn, language)
        return True
    finally:
        with translate_errors():
            conn.execute("select pg_catalog.pg_advisory_unlock(%s)", (FIRST_USE_LOCK_KEY,))


def _run_alembic(url: str, action: str, revision: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.begin() as connection:
            config = alembic_config(connection)
            if action == "upgrade":
                command.upgrade(config, revision)
            else:
                command.downgrade(config, revision)
    except Exception as exc:
        orig = getattr(exc, "orig", None)
        if isinstance(orig, psycopg.Error):
            raise from_psycopg(orig) from exc
        if isinstance(exc, psycopg.Error):
            raise from_psycopg(exc) from exc
        if type(exc).__module__.startswith("alembic"):
            raise KbpgError(f"migration failed: {exc}") from exc
        if type(exc).__module__.startswith("sqlalchemy"):
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL: {first_line(str(exc))}",
                hint="check KBPG_DATABASE_URL",
            ) from exc
        raise
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Alembic upgrade; at head the sql/ function files are re-applied in the same transaction."""
    _run_alembic(url, "upgrade", revision)


def upgrade_script(revision: str = "head", *, vector_schema: str = "public") -> str:
    """The migration to `revision` as a psql script, for a DBA to review and run (offline:
    no database is read, so a partial upgrade names its start, e.g. `0003:head`)."""
    import io

    from alembic import command

    buffer = io.StringIO()
    config = alembic_config()
    config.output_buffer = buffer
    config.attributes["vector_schema"] = vector_schema
    command.upgrade(config, revision, sql=True)
    return buffer.getvalue()


def downgrade(url: str, revision: str) -> None:
    _run_alembic(url, "downgrade", revision)


EXTSCHEMA_VECTOR = "@extschema:vector@"

_VECTOR_SCHEMA = """
select pg_catalog.quote_ident(n.nspname)
  from pg_catalog.pg_extension e
  join pg_catalog.pg_namespace n on n.oid = e.extnamespace
 where e.extname = 'vector'
"""


def vector_schema(connection: Any) -> str:
    """The schema pgvector is installed in, quoted as an identifier (`public`, `extensions`)."""
    row = connection.exec_driver_sql(_VECTOR_SCHEMA).fetchone()
    if row is None:
        raise KbpgError(
            "the vector extension (pgvector) is not installed in this database",
            hint="ask an administrator to run CREATE EXTENSION vector (optionally SCHEMA name)",
        )
    schema = str(row[0])
    if "'" in schema or "$" in schema:  # it is substituted inside string literals too
        raise KbpgError(
            f"cannot use the vector extension's schema {schema}: quotes or $ in its name",
            hint="install pgvector in a schema with a plain name (e.g. public or extensions)",
        )
    return schema


def sql_function_text(path: Path, schema: str) -> str:
    """A sql/ file with the vector extension's schema substituted for @extschema:vector@."""
    return path.read_text().replace(EXTSCHEMA_VECTOR, schema)


def sql_function_statements(schema: str) -> list[str]:
    """What applying the sql/ files runs, in order; also the end of the `--sql` script."""
    return [
        f"select '[1]'::{schema}.vector;  -- loads vector.so, so SET hnsw.* is known",
        "select pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);",
        *(sql_function_text(path, schema) for path in sql_files()),
    ]


def apply_sql_functions(connection: Any) -> None:
    """Run every sql/NNN-*.sql file on a SQLAlchemy connection (CREATE OR REPLACE, idempotent).

    The files run with search_path pinned to pg_catalog, pg_temp, so SQL-standard bodies
    (bound when created) can resolve nothing through a schema others may write; the vector
    extension's schema is substituted for @extschema:vector@. A cast to vector first loads
    vector.so: declaring a function with SET hnsw.* needs the parameters known, else only a
    superuser (or GRANT SET ON PARAMETER) may create it.
    """
    raw = connection.execution_options(no_parameters=True)
    schema = vector_schema(raw)
    saved = raw.exec_driver_sql("select pg_catalog.current_setting('search_path')").scalar()
    for statement in sql_function_statements(schema):
        raw.exec_driver_sql(statement)
    connection.exec_driver_sql(
        "select pg_catalog.set_config('search_path', %(path)s, true)", {"path": saved}
    )
