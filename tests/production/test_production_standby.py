"""A real hot standby of the embedded server (pg_basebackup -R from the wheel's binaries):
reads work there once WAL is replayed; writes are refused with a hint to use the primary."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from kbpg.app import KnowledgeBase
from kbpg.config import Settings
from kbpg.serve.http import create_app
from kbpg.store.db import head_revision, upgrade
from kbpg.store.embedded import OWNER, SUPERUSER, EmbeddedServer
from tests.conftest import with_database
from tests.helpers import KBPG, clean_env, run_kbpg
from tests.release_fixtures import REPO


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


def as_superuser(url: str) -> str:
    """The embedded server's URL as its superuser: pausing a standby's replay is an
    administrator's statement, not the owner's."""
    return url.replace(f"://{OWNER}@", f"://{SUPERUSER}@", 1)


@pytest.fixture(scope="module")
def standby_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="kbpg-standby-", dir="/tmp"))
    root.chmod(0o755)  # reachable by the unprivileged server user when tests run as root
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def replicated(standby_root: Path) -> Iterator[tuple[str, str]]:
    """(primary URL, standby URL): an embedded server and a hot standby of it, made by
    `kbpg db standby`."""
    primary = EmbeddedServer(standby_root / "primary", durable=False)
    standby = EmbeddedServer(standby_root / "standby")
    try:
        primary_url = primary.owner_url()  # what kbpg connects as (no superuser)
        made = run_kbpg(
            "db",
            "standby",
            str(standby_root / "standby"),
            env=clean_env(KBPG_HOME=str(standby_root / "primary")),
            timeout=600,
        )
        assert made.returncode == 0, made.stderr
        standby_url = made.stdout.strip()
        assert standby_url == standby.url(user=OWNER)
        assert f"export KBPG_READ_URL='{standby_url}'" in made.stderr
        assert f"KBPG_HOME={standby_root / 'standby'} kbpg db stop" in made.stderr
        yield primary_url, standby_url
    finally:
        standby.stop()
        primary.stop()


@pytest.fixture(scope="module")
def kb_on_primary(replicated: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """KBPG_HOME for the tests: samples/kb/parking ingested on the primary, replayed."""
    primary_url, standby_url = replicated
    home = str(tmp_path_factory.mktemp("home"))
    env = clean_env(KBPG_DATABASE_URL=primary_url, KBPG_HOME=home)
    for args in (("db", "upgrade"), ("ingest", str(REPO / "samples" / "kb" / "parking"))):
        result = run_kbpg(*args, env=env)
        assert result.returncode == 0, result.stderr
    wait_for_replay(primary_url, standby_url)
    return home


def _sources(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [Path(c["source"]).name for c in json.loads(result.stdout)["chunks"]]


def test_standby_serves_searches_and_refuses_writes(
    replicated: tuple[str, str], kb_on_primary: str, tmp_path: Path
) -> None:
    _, standby_url = replicated
    on_standby = clean_env(KBPG_DATABASE_URL=standby_url, KBPG_HOME=kb_on_primary)
    with psycopg.connect(standby_url) as conn:
        assert conn.execute("select pg_is_in_recovery()").fetchone() == (True,)
    found = run_kbpg("search", "how do I renew a parking permit", "--json", env=on_standby)
    assert _sources(found)[0] == "renew-permit.md"

    (tmp_path / "note.md").write_text("# Note\n\nA note about parking.\n")
    for args in (("db", "upgrade"), ("ingest", str(tmp_path / "note.md")), ("reembed",)):
        result = run_kbpg(*args, env=on_standby)
        assert result.returncode == 1, (args, result.stderr)
        assert "this server is a read-only standby: write on the primary" in result.stderr
        assert "Traceback" not in result.stderr


def test_read_url_sends_searches_to_the_replica_and_writes_to_the_primary(
    replicated: tuple[str, str], kb_on_primary: str, tmp_path: Path
) -> None:
    primary_url, standby_url = replicated
    routed = clean_env(
        KBPG_DATABASE_URL=primary_url, KBPG_READ_URL=standby_url, KBPG_HOME=kb_on_primary
    )
    primary_only = clean_env(KBPG_DATABASE_URL=primary_url, KBPG_HOME=kb_on_primary)
    query = ("search", "street party on a residential street", "--json")
    (tmp_path / "street-parties.md").write_text(
        "# Street parties\n\nResidents may close a quiet street for a street party once a"
        " year; apply to the events team six weeks ahead.\n"
    )
    with psycopg.connect(as_superuser(standby_url), autocommit=True) as standby:
        standby.execute("select pg_wal_replay_pause()")
        try:
            result = run_kbpg("ingest", str(tmp_path / "street-parties.md"), env=routed)
            assert result.returncode == 0, result.stderr  # written on the primary
            # the replica lags (replay paused): searches there do not see the new document
            assert "street-parties.md" not in _sources(run_kbpg(*query, env=routed))
            assert _sources(run_kbpg(*query, env=primary_only))[0] == "street-parties.md"
        finally:
            standby.execute("select pg_wal_replay_resume()")
    wait_for_replay(primary_url, standby_url)
    assert _sources(run_kbpg(*query, env=routed))[0] == "street-parties.md"


def test_replica_down_or_behind_is_skipped_with_a_warning(
    replicated: tuple[str, str], kb_on_primary: str
) -> None:
    primary_url, standby_url = replicated
    down = "postgresql://postgres@/kbpg?host=%2Ftmp%2Fkbpg-no-such-server&port=5432"
    query = ("search", "how do I renew a parking permit", "--json")

    env = clean_env(
        KBPG_DATABASE_URL=primary_url,
        KBPG_READ_URL=f"{down},{standby_url}",
        KBPG_HOME=kb_on_primary,
    )
    result = run_kbpg(*query, env=env)
    assert _sources(result)[0] == "renew-permit.md"
    assert f"read replica {down} skipped" in result.stderr

    # a replica database whose kbpg schema is behind (as during an upgrade's replay)
    with psycopg.connect(with_database(primary_url, "postgres"), autocommit=True) as conn:
        conn.execute("drop database if exists kbpg_behind")
        conn.execute("create database kbpg_behind")
    try:
        upgrade(with_database(primary_url, "kbpg_behind"), "0003")
        wait_for_replay(primary_url, standby_url)
        behind = with_database(standby_url, "kbpg_behind")
        env = clean_env(
            KBPG_DATABASE_URL=primary_url, KBPG_READ_URL=behind, KBPG_HOME=kb_on_primary
        )
        result = run_kbpg(*query, env=env)
        assert _sources(result)[0] == "renew-permit.md"  # answered by the primary
        assert "its kbpg schema is at 0003, this kbpg needs" in result.stderr
        assert "reading from the primary" in result.stderr
    finally:
        with psycopg.connect(with_database(primary_url, "postgres"), autocommit=True) as conn:
            conn.execute("drop database if exists kbpg_behind with (force)")


def test_knowledge_base_sessions_route_by_write(
    replicated: tuple[str, str], kb_on_primary: str
) -> None:
    primary_url, standby_url = replicated
    settings = replace(Settings.from_env(), database_url=primary_url, read_urls=(standby_url,))
    with KnowledgeBase(primary_url, settings=settings, pool_size=2) as kb:
        with kb.session() as conn:
            assert conn.execute("select pg_is_in_recovery()").fetchone() == (True,)
        with kb.session(write=True) as conn:
            assert conn.execute("select pg_is_in_recovery()").fetchone() == (False,)


def test_serve_searches_on_the_replica(replicated: tuple[str, str], kb_on_primary: str) -> None:
    """kbpg serve with KBPG_READ_URL: with replay paused, a document ingested on the primary
    is not in its answers; the primary's own search has it."""
    primary_url, standby_url = replicated
    env = clean_env(
        KBPG_DATABASE_URL=primary_url, KBPG_READ_URL=standby_url, KBPG_HOME=kb_on_primary
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with psycopg.connect(as_superuser(standby_url), autocommit=True) as standby:
        standby.execute("select pg_wal_replay_pause()")
        process = subprocess.Popen(
            [KBPG, "serve", "--port", str(port)], env=env, stderr=subprocess.DEVNULL
        )
        try:
            with psycopg.connect(primary_url) as conn:
                conn.execute(
                    "update kb.documents set title = 'Renewal (new title)'"
                    " where source like '%renew-permit.md'"
                )
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "kbpg serve did not start"
                time.sleep(0.2)
            body = httpx.post(
                f"{base}/api/v1/kb/search", json={"query": "renew a parking permit"}, timeout=30
            ).json()
            top = body["chunks"][0]
            assert top["source"].endswith("renew-permit.md")
            assert top["document"] != "Renewal (new title)"  # the replica's, not yet replayed
        finally:
            process.terminate()
            process.wait(timeout=30)
            standby.execute("select pg_wal_replay_resume()")
    wait_for_replay(primary_url, standby_url)


def test_read_url_list_keeps_multi_host_urls_whole() -> None:
    from kbpg.config import parse_read_urls
    from kbpg.store.replicas import redacted

    value = (
        " postgresql://kb@r1,r2:5433/knowledge?target_session_attrs=any , postgres://kb:pw@r3/kb"
    )
    assert parse_read_urls(value) == (
        "postgresql://kb@r1,r2:5433/knowledge?target_session_attrs=any",
        "postgres://kb:pw@r3/kb",
    )
    assert parse_read_urls("") == () == parse_read_urls(None)
    assert redacted("postgres://kb:pw@r3/kb") == "postgres://kb:***@r3/kb"


def test_standby_of_a_primary_given_by_url(
    replicated: tuple[str, str], kb_on_primary: str, standby_root: Path
) -> None:
    """`kbpg db standby DIR --primary URL`: a copy of any PostgreSQL 18 the URL's role may
    replicate, answering searches once made; a second standby into the same place is refused."""
    primary_url, _ = replicated
    primary_url = as_superuser(primary_url)  # a role with REPLICATION
    target = standby_root / "by-url"
    made = run_kbpg("db", "standby", str(target), "--primary", primary_url, env=clean_env())
    try:
        assert made.returncode == 0, made.stderr
        url = made.stdout.strip()
        assert url == EmbeddedServer(target).url("kbpg", "postgres")
        wait_for_replay(primary_url, url)
        with psycopg.connect(url) as conn:
            assert conn.execute("select pg_is_in_recovery()").fetchone() == (True,)
        env = clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=kb_on_primary)
        found = run_kbpg("search", "how do I renew a parking permit", "--json", env=env)
        assert _sources(found)[0] == "renew-permit.md"
        again = run_kbpg("db", "standby", str(target), "--primary", primary_url, env=clean_env())
        assert again.returncode == 1
        assert again.stderr.startswith(f"Error: {target / 'pgdata'} already holds a database")
    finally:
        EmbeddedServer(target).stop()


def test_readiness_and_metrics_per_replica(replicated: tuple[str, str], kb_on_primary: str) -> None:
    """/readyz reports the primary and each replica (down, lagging, ok); /metrics counts the
    reads each served and the replicas skipped."""
    primary_url, standby_url = replicated
    down = "postgresql://postgres@/kbpg?host=%2Ftmp%2Fkbpg-no-such-server&port=5432"
    settings = replace(Settings.from_env(), database_url=primary_url, read_urls=(down, standby_url))
    head = head_revision()
    with KnowledgeBase(primary_url, settings=settings, pool_size=2) as kb:
        api = TestClient(create_app(kb), base_url="http://localhost")
        body = api.get("/readyz").json()
        assert body["ok"] is True
        assert body["primary"] == {"status": "ok", "schema": head}
        assert [r["status"] for r in body["replicas"]] == ["down", "ok"]
        assert body["replicas"][1] == {
            "replica": 2, "status": "ok", "schema": head, "lag_bytes": 0, "lag_s": 0.0
        }  # fmt: skip

        assert api.post("/api/v1/kb/search", json={"query": "parking permit"}).status_code == 200
        metrics = api.get("/metrics").text
        assert f'kbpg_reads_total{{database="{standby_url}"}} 1.0' in metrics
        assert f'kbpg_replica_skips_total{{reason="down",replica="{down}"}} 1.0' in metrics
        assert 'kbpg_reads_total{database="primary"}' not in metrics

        with psycopg.connect(as_superuser(standby_url), autocommit=True) as standby:
            standby.execute("select pg_wal_replay_pause()")
            try:
                with psycopg.connect(primary_url) as conn:
                    # flushed at commit (this test primary runs with synchronous_commit off)
                    conn.execute("set synchronous_commit = on")
                    conn.execute("update kb.documents set title = title")
                lagging = kb.readiness().replicas[1]
                assert lagging.status == "lagging" and lagging.lag_bytes and lagging.lag_bytes > 0
                assert "its WAL replay is paused" in lagging.detail
                body = api.get("/readyz").json()
                assert body["ok"] is True  # the primary answers searches meanwhile
                assert body["replicas"][1]["status"] == "lagging"
                assert body["replicas"][1]["lag_bytes"] == lagging.lag_bytes
            finally:
                standby.execute("select pg_wal_replay_resume()")
        wait_for_replay(primary_url, standby_url)
        assert kb.readiness().replicas[1].status == "ok"
