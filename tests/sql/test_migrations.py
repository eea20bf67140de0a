"""Alembic migrations and the sql/ function files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
from alembic.script import ScriptDirectory

from kbpg.store import db as kdb

REPO = Path(__file__).resolve().parents[2]

CATALOG_SNAPSHOT = """
select p.oid::regprocedure::text, pg_catalog.pg_get_functiondef(p.oid), p.xmin::text
  from pg_catalog.pg_proc p
 where p.pronamespace = 'kb'::regnamespace
 order by 1
"""

SCHEMA_SNAPSHOT = """
select c.relname, c.relkind, pg_catalog.pg_get_indexdef(c.oid)
  from pg_catalog.pg_class c
 where c.relnamespace = 'kb'::regnamespace
 order by 1
"""


def test_single_head() -> None:
    script = ScriptDirectory.from_config(kdb.alembic_config())
    assert len(script.get_heads()) == 1
    assert script.get_current_head() == kdb.head_revision()


def test_upgrade_downgrade_upgrade(new_database) -> None:
    url = new_database(migrated=False)
    kdb.upgrade(url)
    with kdb.connect(url) as conn:
        assert kdb.schema_status(conn).at_head
        first = conn.execute(SCHEMA_SNAPSHOT).fetchall()
        functions = conn.execute(CATALOG_SNAPSHOT).fetchall()
    kdb.downgrade(url, "base")
    with kdb.connect(url) as conn:
        assert kdb.schema_status(conn).current is None
        assert conn.execute("select pg_catalog.to_regnamespace('kb')").fetchone() == (None,)
    kdb.upgrade(url)
    with kdb.connect(url) as conn:
        assert kdb.schema_status(conn).at_head
        assert conn.execute(SCHEMA_SNAPSHOT).fetchall() == first
        assert [r[:2] for r in conn.execute(CATALOG_SNAPSHOT)] == [r[:2] for r in functions]


def test_reapplying_sql_files_changes_nothing(db_url: str) -> None:
    with kdb.connect(db_url) as conn:
        before = [(sig, body) for sig, body, _ in conn.execute(CATALOG_SNAPSHOT)]
    kdb.upgrade(db_url)  # at head already: re-applies every sql/ file
    with kdb.connect(db_url) as conn:
        after = [(sig, body) for sig, body, _ in conn.execute(CATALOG_SNAPSHOT)]
        status = kdb.schema_status(conn)
    assert after == before
    assert status.at_head
    assert before, "the sql/ files define kb functions"


def test_every_sql_file_is_applied(db_url: str) -> None:
    files = kdb.sql_files()
    assert files and [f.name for f in files] == sorted(f.name for f in files)
    with kdb.connect(db_url) as conn:
        names = {
            row[0]
            for row in conn.execute(
                "select proname from pg_catalog.pg_proc where pronamespace = 'kb'::regnamespace"
            )
        }
    assert {"set_embedding_space", "_check_query_embedding"} <= names


def test_own_version_table_leaves_host_alembic_alone(new_database) -> None:
    url = new_database(migrated=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create table alembic_version (version_num varchar(32) primary key)")
        conn.execute("insert into alembic_version values ('hostapp42')")
    kdb.upgrade(url)
    with psycopg.connect(url) as conn:
        assert conn.execute("select version_num from alembic_version").fetchall() == [
            ("hostapp42",)
        ]
        assert conn.execute(f"select version_num from {kdb.VERSION_TABLE}").fetchall() == [
            (kdb.head_revision(),)
        ]


def test_plain_alembic_upgrade_for_ops_pipelines(new_database) -> None:
    """`alembic upgrade head` with KBPG_DATABASE_URL, as an ops pipeline runs it."""
    url = new_database(migrated=False)
    from tests.helpers import clean_env

    alembic = str(Path(sys.executable).parent / "alembic")
    result = subprocess.run(
        [alembic, "-c", str(REPO / "alembic.ini"), "upgrade", "head"],
        env=clean_env(KBPG_DATABASE_URL=url),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    with kdb.connect(url) as conn:
        assert kdb.schema_status(conn).at_head
        assert (
            conn.execute(
                "select count(*) from pg_catalog.pg_proc where pronamespace = 'kb'::regnamespace"
            ).fetchone()[0]
            >= 3
        )


def test_migration_sql_is_packaged_in_the_wheel_layout() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"sql" = "kbpg/_sql"' in pyproject
    assert '"migrations" = "kbpg/_migrations"' in pyproject


def test_0021_binds_grants_to_role_oids_and_drops_those_of_missing_roles(new_database) -> None:
    url = new_database(migrated=False)
    kdb.upgrade(url, "0020")
    with kdb.connect(url, autocommit=True) as conn:
        conn.execute(
            "insert into kb.access_grants (role, group_name) values"
            " ('pg_monitor', 'hr'), ('pg_monitor', 'finance'), ('no_such_role_0021', 'hr')"
        )
    kdb.upgrade(url, "0021")
    with kdb.connect(url) as conn:
        rows = conn.execute(
            "select role_id::regrole::text, group_name from kb.access_grants order by 2"
        ).fetchall()
    assert rows == [("pg_monitor", "finance"), ("pg_monitor", "hr")]
