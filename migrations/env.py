"""Alembic environment for kbpg: its own version table, a connection shared via attributes.

Ops pipelines run `alembic upgrade head` with KBPG_DATABASE_URL set (alembic.ini in the
repository root); `kbpg db upgrade` passes its connection in `config.attributes`. Whenever the
database ends at head, the sql/ function files are re-applied in the same transaction.

pgvector may live in any schema (Supabase keeps extensions in `extensions`): the migration's
transaction appends that schema to its search_path, so the frozen revisions' unqualified
`vector` / `sparsevec` resolve, and the function files get it substituted for
`@extschema:vector@`.

Offline (`alembic upgrade head --sql`, `kbpg db upgrade --sql`) prints the same migration as a
psql script; `-x vector_schema=NAME` (default public) names pgvector's schema there.
"""

from __future__ import annotations

import os
import re
from typing import Any

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from kbpg.errors import KbpgError
from kbpg.store import db

config = context.config

VECTOR_SCHEMA = """
select n.nspname, e.extversion
  from pg_catalog.pg_extension e
  join pg_catalog.pg_namespace n on n.oid = e.extnamespace
 where e.extname = 'vector'
"""
MINIMUM_PGVECTOR = (0, 8)


def _quote_identifier(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    if "'" in name or "$" in name:  # substituted inside string literals too
        raise KbpgError(f"cannot use schema {name!r} for pgvector: quotes or $ in its name")
    return '"' + name.replace('"', '""') + '"'


def _search_path_including(schema: str) -> str:
    """This transaction's search_path plus `schema` (a quoted identifier)."""
    return (
        "select pg_catalog.set_config('search_path', pg_catalog.concat_ws(', ',"
        " nullif(pg_catalog.current_setting('search_path'), ''),"
        f" '{schema}'), true);"
    )


def _at_head(revisions: tuple[str, ...] | set[str]) -> bool:
    script = ScriptDirectory.from_config(config)
    return set(revisions) == set(script.get_heads())


# -- online -----------------------------------------------------------------------------------


def _admin_hint(statement: str, connection: Connection) -> str:
    database = connection.exec_driver_sql("select pg_catalog.current_database()").scalar()
    statement = statement.replace("{database}", str(database))
    return (
        f'ask an administrator to run, connected to database "{database}": {statement}'
        " — then run `kbpg db upgrade` again"
    )


def _create_vector(connection: Connection) -> None:
    """What revision 0001 would do, first, so that a role that may not gets a usable hint."""
    available = connection.exec_driver_sql(
        "select 1 from pg_catalog.pg_available_extensions where name = 'vector'"
    ).scalar()
    if available is None:
        raise KbpgError(
            "pgvector is not installed on this PostgreSQL server",
            hint="install pgvector >= 0.8 on the server (e.g. the postgresql-NN-pgvector "
            "package), or enable it in your provider's console",
        )
    try:
        with connection.begin_nested():
            connection.exec_driver_sql("create extension if not exists vector")
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != "42501":
            raise
        raise KbpgError(
            "permission denied to create extension vector: pgvector is not a trusted "
            "extension, only a superuser (or your provider's admin role) can create it",
            hint=_admin_hint(
                "CREATE EXTENSION vector;  (or CREATE EXTENSION vector SCHEMA extensions; "
                "GRANT USAGE ON SCHEMA extensions TO <this role>;)",
                connection,
            ),
        ) from exc


def _check_primary(connection: Connection) -> None:
    if connection.exec_driver_sql("select pg_catalog.pg_is_in_recovery()").scalar():
        raise KbpgError(
            "this server is a read-only standby: write on the primary",
            hint="point KBPG_DATABASE_URL at the primary (replicas belong in KBPG_READ_URL)",
        )


def _check_privileges(connection: Connection) -> None:
    """Say which grant is missing before a statement half-way through fails on it."""
    row = connection.exec_driver_sql(
        """
        select pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE'),
               n.nspowner::regrole::text,
               n.oid is null or pg_catalog.pg_has_role(n.nspowner, 'USAGE'),
               current_user
          from (select 1) one
          left join pg_catalog.pg_namespace n on n.nspname = 'kb'
        """
    ).one()
    may_create, kb_owner, owns_kb, user = row
    if kb_owner is None and not may_create:
        raise KbpgError(
            f"role {user} may not create schema kb in this database",
            hint=_admin_hint(f'GRANT CREATE ON DATABASE "{{database}}" TO {user};', connection),
        )
    if not owns_kb:
        raise KbpgError(
            f"schema kb belongs to role {kb_owner}: only its owner can migrate it",
            hint=f"run `kbpg db upgrade` as {kb_owner}, or ask an administrator to run: "
            f"GRANT {kb_owner} TO {user};",
        )


def _use_vector_schema(connection: Connection) -> str:
    """pgvector's schema (created by then), appended to this transaction's search_path."""
    found = connection.exec_driver_sql(VECTOR_SCHEMA).one_or_none()
    if found is None:
        _create_vector(connection)
        found = connection.exec_driver_sql(VECTOR_SCHEMA).one()
    schema, version = found
    numbers = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if numbers < MINIMUM_PGVECTOR:
        raise KbpgError(
            f"pgvector {version} is too old: kbpg needs 0.8 or later (iterative index scans)",
            hint=_admin_hint("ALTER EXTENSION vector UPDATE;", connection),
        )
    connection.exec_driver_sql(_search_path_including(_quote_identifier(schema)))
    return str(schema)


def run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, version_table=db.VERSION_TABLE, transactional_ddl=True)
    with context.begin_transaction():
        _check_primary(connection)
        _check_privileges(connection)
        _use_vector_schema(connection)
        context.run_migrations()
        if _at_head(context.get_context().get_current_heads()):
            db.apply_sql_functions(connection)


def _url_from_environment() -> str:
    from kbpg.config import Settings

    url = config.get_main_option("sqlalchemy.url") or os.environ.get("KBPG_DATABASE_URL")
    return url or db.resolve_url(Settings.from_env())


# -- offline: a script for psql ---------------------------------------------------------------


class _ScriptConnection:
    """`op.get_bind()` while printing a script: revisions run their SQL with exec_driver_sql,
    which here writes it verbatim (alembic's own text() would read `:name` as parameters)."""

    def __init__(self, impl: Any) -> None:
        self._impl = impl

    def exec_driver_sql(self, statement: str, *args: Any, **kwargs: Any) -> None:
        self._impl.static_output(statement.strip())

    def execution_options(self, **kwargs: Any) -> _ScriptConnection:
        return self


def run_migrations_offline() -> None:
    arguments = context.get_x_argument(as_dictionary=True)
    schema = _quote_identifier(
        arguments.get("vector_schema") or config.attributes.get("vector_schema") or "public"
    )
    context.configure(
        dialect_name="postgresql",
        version_table=db.VERSION_TABLE,
        transactional_ddl=True,
        literal_binds=True,
    )
    migration = context.get_context()
    migration.impl.connection = _ScriptConnection(migration.impl)
    context.static_output("\\set ON_ERROR_STOP on")
    with context.begin_transaction():
        context.static_output(_search_path_including(schema))
        context.run_migrations()
        destination = context.get_revision_argument()
        targets = {destination} if isinstance(destination, str) else set(destination or ())
        if "heads" in targets or "head" in targets or _at_head(targets):
            context.static_output(f"-- sql/ function files, pgvector in schema {schema}")
            for statement in db.sql_function_statements(schema):
                context.static_output(statement)


if context.is_offline_mode():
    run_migrations_offline()
else:
    shared = config.attributes.get("connection")
    if shared is not None:
        run_migrations(shared)
    else:
        engine = create_engine(db.sqlalchemy_url(_url_from_environment()), poolclass=NullPool)
        with engine.begin() as connection:
            run_migrations(connection)
        engine.dispose()
