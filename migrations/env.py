"""Alembic environment for kbpg: its own version table, a connection shared via attributes.

Ops pipelines run `alembic upgrade head` with KBPG_DATABASE_URL set (alembic.ini in the
repository root); `kbpg db upgrade` passes its connection in `config.attributes`. Whenever the
database ends at head, the sql/ function files are re-applied in the same transaction.
"""

from __future__ import annotations

import os

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine
from sqlalchemy.pool import NullPool

from kbpg import db

config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        version_table=db.VERSION_TABLE,
        transactional_ddl=True,
    )


def _at_head(connection: Connection) -> bool:
    script = ScriptDirectory.from_config(config)
    current = context.get_context().get_current_heads()
    return set(current) == set(script.get_heads())


# Revisions 0001-0003 (frozen) name pgvector's types unqualified: put the extension's schema
# (Supabase: `extensions`) on this transaction's search_path when it is elsewhere.
_EXTENSION_ON_PATH = """
select pg_catalog.set_config('search_path',
           pg_catalog.current_setting('search_path') || ', ' || pg_catalog.quote_ident(n.nspname),
           true)
  from pg_catalog.pg_extension e
  join pg_catalog.pg_namespace n on n.oid = e.extnamespace
 where e.extname = 'vector'
   and n.nspname <> all (pg_catalog.current_schemas(false))
"""


def run_migrations(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        connection.exec_driver_sql(_EXTENSION_ON_PATH)
        context.run_migrations()
        if _at_head(connection):
            db.apply_sql_functions(connection)


def _url_from_environment() -> str:
    from kbpg.config import Settings

    url = config.get_main_option("sqlalchemy.url") or os.environ.get("KBPG_DATABASE_URL")
    return url or db.resolve_url(Settings.from_env())


if context.is_offline_mode():
    raise SystemExit("kbpg migrations run online only (they re-apply sql/ at head)")

shared = config.attributes.get("connection")
if shared is not None:
    run_migrations(shared)
else:
    engine = create_engine(db.sqlalchemy_url(_url_from_environment()), poolclass=NullPool)
    with engine.begin() as connection:
        run_migrations(connection)
    engine.dispose()
