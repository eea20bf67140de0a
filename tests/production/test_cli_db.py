"""`kbpg db ...` run as a user runs it: exit codes, stdout, stderr."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer
from tests.helpers import KBPG, clean_env, run_kbpg
from tests.release_fixtures import REPO

SAMPLES = REPO / "samples" / "kb"
UNREACHABLE = "postgresql://postgres@/kbpg?host=/nonexistent-kbpg-socket-dir&port=5432"


def test_version() -> None:
    result = run_kbpg("--version", env=clean_env())
    assert result.returncode == 0
    assert result.stdout.startswith("kbpg, version ")


def test_url_prints_the_external_database(db_url: str) -> None:
    result = run_kbpg("db", "url", env=clean_env(KBPG_DATABASE_URL=db_url))
    assert result.returncode == 0
    assert result.stdout.strip() == db_url


def test_unmigrated_database_lifecycle(new_database) -> None:
    env = clean_env(KBPG_DATABASE_URL=new_database(migrated=False))

    current = run_kbpg("db", "current", env=env)
    assert (current.returncode, current.stdout.strip()) == (0, "none")

    check = run_kbpg("db", "check", env=env)
    assert check.returncode == 1
    assert check.stdout == ""
    assert "Error: this database has no kbpg schema" in check.stderr
    assert "run `kbpg db upgrade`" in check.stderr

    upgrade = run_kbpg("db", "upgrade", env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stdout.strip() == f"schema at {kdb.head_revision()} (head)"

    check = run_kbpg("db", "check", env=env)
    assert (check.returncode, check.stdout.strip()) == (
        0,
        f"schema at head ({kdb.head_revision()})",
    )

    status = run_kbpg("db", "status", env=env)
    assert status.returncode == 0
    assert "database: external (KBPG_DATABASE_URL)" in status.stdout
    assert "pgvector: 0." in status.stdout
    assert f"schema: {kdb.head_revision()} (head {kdb.head_revision()}, at head)" in status.stdout

    down = run_kbpg("db", "downgrade", "base", env=env)
    assert (down.returncode, down.stdout.strip()) == (0, "schema at base")
    assert run_kbpg("db", "current", env=env).stdout.strip() == "none"


@pytest.mark.parametrize(
    "args", [("db", "check"), ("db", "current"), ("db", "upgrade"), ("db", "status")]
)
def test_unreachable_database_is_one_clear_line(args: tuple[str, ...]) -> None:
    result = run_kbpg(*args, env=clean_env(KBPG_DATABASE_URL=UNREACHABLE), timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: cannot connect to PostgreSQL")
    assert all(line.startswith(("Error:", "Hint:")) for line in lines)


def test_debug_shows_the_traceback() -> None:
    result = run_kbpg("--debug", "db", "check", env=clean_env(KBPG_DATABASE_URL=UNREACHABLE))
    assert result.returncode == 1
    assert "Traceback" in result.stderr


def test_unknown_command_is_a_usage_error() -> None:
    result = run_kbpg("db", "frobnicate", env=clean_env())
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_psql_runs_on_the_database(db_url: str) -> None:
    result = run_kbpg(
        "db",
        "psql",
        "-At",
        "-c",
        "select count(*) from kb.chunks",
        env=clean_env(KBPG_DATABASE_URL=db_url),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_embedded_server_start_status_stop(kbpg_home: Path) -> None:
    env = clean_env(KBPG_HOME=str(kbpg_home))
    status = run_kbpg("db", "status", env=env)
    assert status.returncode == 0
    assert "server: not initialised" in status.stdout

    start = run_kbpg("db", "start", "--prewarm", env=env)
    assert start.returncode == 0, start.stderr
    url = start.stdout.strip()
    assert url.startswith("postgresql://postgres@/kbpg?host=")
    assert "not prewarmed: kb.prewarm() is missing, run `kbpg db upgrade`" in start.stderr

    upgrade = run_kbpg("db", "upgrade", env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    status = run_kbpg("db", "status", env=env)
    assert "server: running" in status.stdout
    assert "postgresql: 18." in status.stdout
    assert "at head" in status.stdout
    assert run_kbpg("db", "url", env=env).stdout.strip() == url

    assert run_kbpg("db", "stop", env=env).stdout.strip() == "stopped"
    # after a restart: kbpg's relations loaded again (pg_prewarm ships with the embedded server)
    start = run_kbpg("db", "start", "--prewarm", env=env)
    assert start.returncode == 0, start.stderr
    assert start.stdout.strip() == url
    assert re.search(r"prewarmed [\d,]+ MB into shared buffers in [\d.]+ s", start.stderr)
    assert run_kbpg("db", "stop", env=env).stdout.strip() == "stopped"
    assert run_kbpg("db", "stop", env=env).stdout.strip() == "not running"
    assert "server: stopped" in run_kbpg("db", "status", env=env).stdout


def test_commands_start_the_embedded_server_on_demand(kbpg_home: Path) -> None:
    env = clean_env(KBPG_HOME=str(kbpg_home))
    check = run_kbpg("db", "check", env=env)
    assert check.returncode == 1
    assert "run `kbpg db upgrade`" in check.stderr
    assert EmbeddedServer(kbpg_home).status().running


def test_server_commands_refuse_when_an_external_url_is_set(db_url: str) -> None:
    result = run_kbpg("db", "start", env=clean_env(KBPG_DATABASE_URL=db_url))
    assert result.returncode == 1
    assert "KBPG_DATABASE_URL is set" in result.stderr


def test_upgrade_an_external_postgresql_by_url(kbpg_home: Path) -> None:
    """A second embedded server on another data dir, reached only through its URL."""
    other = EmbeddedServer(kbpg_home / "other")
    url = other.start()
    try:
        env = clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(kbpg_home / "unused"))
        result = run_kbpg("db", "upgrade", env=env)
        assert result.returncode == 0, result.stderr
        assert run_kbpg("db", "check", env=env).returncode == 0
        assert not (kbpg_home / "unused").exists(), "no embedded server was started"
    finally:
        other.stop()


def test_first_use_of_the_embedded_server_creates_the_schema(kbpg_home: Path) -> None:
    """A fresh KBPG_HOME: ingest and search work with no `kbpg db upgrade` (the embedded
    server is kbpg's own); two first commands at once both succeed, one creating the schema."""
    env = clean_env(KBPG_HOME=str(kbpg_home))
    first = [
        subprocess.Popen(
            [KBPG, "documents", "list", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in first:
        out, err = proc.communicate(timeout=300)
        assert (proc.returncode, json.loads(out or "null")) == (0, []), err
    ingest = run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env)
    assert ingest.returncode == 0, ingest.stderr
    found = run_kbpg("search", "how do I renew a parking permit", "--json", env=env)
    assert found.returncode == 0, found.stderr
    assert Path(json.loads(found.stdout)["chunks"][0]["source"]).name == "renew-permit.md"
    assert run_kbpg("db", "current", env=env).stdout.strip() == kdb.head_revision()


def test_first_use_of_the_embedded_server_takes_kbpg_language(kbpg_home: Path) -> None:
    """KBPG_LANGUAGE on a fresh KBPG_HOME: the schema is created in that language, so ingest
    neither stops at "KBPG_LANGUAGE is german, but this knowledge base is in english" nor needs
    `kbpg db upgrade --language`."""
    env = clean_env(KBPG_HOME=str(kbpg_home), KBPG_LANGUAGE="german")
    ingest = run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env)
    assert ingest.returncode == 0, ingest.stderr
    assert "this knowledge base is in english" not in ingest.stderr
    stats = json.loads(run_kbpg("stats", "--json", env=env).stdout)
    assert (stats["language"], stats["documents"]) == ("german", 5)


def test_a_database_of_your_own_is_never_migrated_by_ingest(new_database) -> None:
    env = clean_env(KBPG_DATABASE_URL=new_database(migrated=False))
    ingest = run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env)
    assert ingest.returncode == 1
    assert "Hint: run `kbpg db upgrade`" in ingest.stderr
    assert run_kbpg("db", "current", env=env).stdout.strip() == "none"
