"""Least privilege is the tested default: kbpg run by a login role that owns its database and
is not superuser, with pgvector created once by an administrator (docs/operations.md "Using your own
PostgreSQL"). Migrations, ingest, search (CLI, psql), serve and eval; and the hints a DBA gets
when a grant is missing."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg import sql

from kbpg.store import db as kdb
from tests.conftest import with_database, with_user
from tests.helpers import KBPG, clean_env, run_kbpg
from tests.http_server import free_port
from tests.release_fixtures import REPO, build_v0_1_0_schema, load_rows, v0_1_0_rows

pytestmark = pytest.mark.least_privilege

SAMPLES = REPO / "samples" / "kb"


def _env(url: str, tmp_path: Path) -> dict[str, str]:
    return clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(tmp_path / "home"))


def _ok(*args: str, env: dict[str, str]) -> str:
    result = run_kbpg(*args, env=env)
    assert result.returncode == 0, f"kbpg {' '.join(args)}: {result.stderr}"
    return result.stdout


def _superuser(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("select rolsuper from pg_catalog.pg_roles where rolname = current_user")
        return bool(row.fetchone()[0])  # type: ignore[index]


def test_upgrade_as_owner_works_the_first_time_and_every_time(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    url = owned_database()
    assert not _superuser(url)
    env = _env(url, tmp_path)
    # each run is a new session, where vector.so is not loaded until kbpg loads it
    for _ in range(3):
        assert "(head)" in _ok("db", "upgrade", env=env)
    assert "schema at head" in _ok("db", "check", env=env)
    with psycopg.connect(url) as conn:
        owner = conn.execute(
            "select nspowner::regrole::text from pg_namespace where nspname = 'kb'"
        )
        assert owner.fetchone() == (conn.info.user,)


def test_owner_upgrades_a_populated_0_1_0_database(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    """A kbpg version bump as it happens in production: 0.1.0's schema and data, made by the
    owner in the session that loaded vector.so, upgraded later by a new kbpg process."""
    url = owned_database()
    with psycopg.connect(url) as conn:
        conn.execute("select '[1]'::vector")  # 0.1.0 could only apply its files this way
        build_v0_1_0_schema(conn)
        load_rows(conn, v0_1_0_rows())
    env = _env(url, tmp_path)
    assert "(head)" in _ok("db", "upgrade", env=env)
    hits = json.loads(_ok("search", "renew a parking permit", "--json", env=env))
    assert hits["chunks"][0]["source"].endswith("parking/renew-permit.md")


def test_missing_extension_names_the_statement_to_ask_for(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    url = owned_database(vector_schema=None)
    result = run_kbpg("db", "upgrade", env=_env(url, tmp_path))
    assert result.returncode == 1
    assert "Error: permission denied to create extension vector" in result.stderr
    assert "CREATE EXTENSION vector;" in result.stderr
    assert "CREATE EXTENSION vector SCHEMA extensions;" in result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(url) as conn:  # nothing half-done
        assert conn.execute("select to_regnamespace('kb')").fetchone() == (None,)
        assert conn.execute("select to_regclass(%s)", (kdb.VERSION_TABLE,)).fetchone() == (None,)


def test_missing_create_on_database_names_the_grant(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    url = owned_database(owned=False)
    result = run_kbpg("db", "upgrade", env=_env(url, tmp_path))
    assert result.returncode == 1
    database = urlsplit(url).path.lstrip("/")
    assert "may not create schema kb" in result.stderr
    assert f'GRANT CREATE ON DATABASE "{database}" TO ' in result.stderr


def test_schema_of_another_role_names_its_owner(
    owned_database: Callable[..., str], admin_url: str, tmp_path: Path
) -> None:
    url = owned_database()
    _ok("db", "upgrade", env=_env(url, tmp_path))
    owner, database = urlsplit(url).username, urlsplit(url).path.lstrip("/")
    other = sql.Identifier(f"{owner}_other")
    with psycopg.connect(with_database(admin_url, database), autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login password 'other'").format(other))
        conn.execute(
            sql.SQL("grant create on database {} to {}").format(sql.Identifier(database), other)
        )
    try:
        result = run_kbpg(
            "db", "upgrade", env=_env(with_user(url, f"{owner}_other", "other"), tmp_path)
        )
        assert result.returncode == 1
        assert f"schema kb belongs to role {owner}" in result.stderr
        assert f"GRANT {owner} TO {owner}_other;" in result.stderr
    finally:
        with psycopg.connect(with_database(admin_url, database), autocommit=True) as conn:
            conn.execute(sql.SQL("drop owned by {}").format(other))
            conn.execute(sql.SQL("drop role {}").format(other))


@pytest.fixture
def owner_kb(owned_database: Callable[..., str], tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A database the owner migrated and filled with samples/kb."""
    url = owned_database()
    env = _env(url, tmp_path)
    _ok("db", "upgrade", env=env)
    _ok("ingest", str(SAMPLES), "--recursive", env=env)
    return url, env


def test_owner_ingests_and_searches_by_cli_and_psql(owner_kb: tuple[str, dict[str, str]]) -> None:
    url, env = owner_kb
    hits = json.loads(_ok("search", "how do I renew a parking permit", "--json", env=env))
    assert hits["chunks"][0]["source"].endswith("parking/renew-permit.md")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select source from kb.search('renew parking permit', match_count => 1)"
        ).fetchone()
    assert row is not None and row[0].endswith("parking/renew-permit.md")


@pytest.fixture
def served(owner_kb: tuple[str, dict[str, str]]) -> Iterator[str]:
    _, env = owner_kb
    port = free_port()
    process = subprocess.Popen(
        [KBPG, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_owner_serves_http_search(served: str) -> None:
    response = httpx.post(
        f"{served}/api/v1/kb/search", json={"query": "renew a parking permit"}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.json()["chunks"][0]["source"] == "renew-permit.md"  # no server path


def _beir(tmp_path: Path) -> Path:
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    corpus = [
        {
            "_id": "d1",
            "title": "Parking permits",
            "text": "Renew a residential parking permit online.",
        },
        {"_id": "d2", "title": "Bins", "text": "Missed bin collections are reported by phone."},
        {"_id": "d3", "title": "Library", "text": "A library card is free for every resident."},
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    queries = [{"_id": "q1", "text": "renew parking permit"}, {"_id": "q2", "text": "missed bin"}]
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return root


def test_eval_without_createdb_says_what_it_needs(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    url = owned_database()
    result = run_kbpg("eval", str(_beir(tmp_path)), env=_env(url, tmp_path))
    assert result.returncode == 1
    assert "CREATEDB" in result.stderr


@pytest.fixture
def evaluator(admin_url: str, owner_role: tuple[str, str]) -> Iterator[str]:
    """The owner role given CREATEDB, and pgvector in template1 (both by the admin, undone
    afterwards): what `kbpg eval` needs to make its throwaway databases."""
    role = sql.Identifier(owner_role[0])
    template1 = with_database(admin_url, "template1")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("alter role {} createdb").format(role))
    with psycopg.connect(template1, autocommit=True) as conn:
        conn.execute("create extension if not exists vector")
    try:
        yield owner_role[0]
    finally:
        with psycopg.connect(template1, autocommit=True) as conn:
            conn.execute("drop extension if exists vector")
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("alter role {} nocreatedb").format(role))


def test_eval_as_non_superuser_with_createdb(
    evaluator: str, owned_database: Callable[..., str], tmp_path: Path
) -> None:
    url = owned_database()
    assert not _superuser(url)
    report = json.loads(_ok("eval", str(_beir(tmp_path)), "--json", env=_env(url, tmp_path)))
    assert report
    assert "hybrid" in json.dumps(report)
