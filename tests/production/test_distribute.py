"""`kbpg db distribute` where no Citus is: refused with a hint; its SQL printed without a database.

On a Citus cluster the command is tested by tests/test_citus.py (KBPG_CITUS_PG).
"""

from __future__ import annotations

import psycopg
import pytest

from kbpg.errors import KbpgError
from kbpg.store import db as kdb
from kbpg.store import distribute
from tests.helpers import clean_env, run_kbpg


def test_refused_on_a_server_without_citus(cli_env: dict[str, str], db_url: str) -> None:
    done = run_kbpg("db", "distribute", "--shards", "4", env=cli_env)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("Error: this database has no Citus extension")
    assert "CREATE EXTENSION citus" in done.stderr and "citus_add_node" in done.stderr
    assert "Traceback" not in done.stderr
    with kdb.connect(db_url) as conn:  # nothing changed
        assert conn.execute("select kb._distributed()").fetchone() == (False,)


def test_the_script_refuses_too(db_url: str) -> None:
    # the same check inside the SQL, for a DBA who runs the printed script with psql
    with kdb.connect(db_url) as conn, pytest.raises(psycopg.errors.FeatureNotSupported) as raised:
        conn.execute(distribute.script(4))
    assert raised.value.diag.message_hint and "citus_add_node" in raised.value.diag.message_hint


def test_sql_is_printed_without_a_database() -> None:
    env = clean_env(KBPG_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    done = run_kbpg("db", "distribute", "--shards", "8", "--sql", env=env)
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert script.startswith("\\set ON_ERROR_STOP on\nbegin;\ndo $distribute$")
    assert script.rstrip().endswith("commit;")
    assert "shards constant integer := 8;" in script
    assert "create_distributed_table('kb_data.documents', 'id', shard_count => shards)" in script
    default = run_kbpg("db", "distribute", "--sql", env=env).stdout
    assert "shards constant integer := null;" in default


def test_shard_count_out_of_range_is_a_usage_error(cli_env: dict[str, str]) -> None:
    done = run_kbpg("db", "distribute", "--shards", "0", env=cli_env)
    assert done.returncode == 2
    assert "--shards" in done.stderr
    with pytest.raises(KbpgError):
        distribute.script(0)


def test_single_server_never_takes_the_distributed_branches(conn: psycopg.Connection) -> None:
    assert conn.execute("select kb._distributed()").fetchone() == (False,)
