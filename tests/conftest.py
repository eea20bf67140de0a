"""Test harness: one real PostgreSQL with pgvector per session, a migrated template database.

Server order: KBPG_TEST_DSN (any PostgreSQL >= 15 with pgvector) -> testcontainers
pgvector/pgvector:pg17 when a Docker engine answers -> kbpg's embedded server in a temp dir.
Fixtures:
- `conn`: a connection to a shared migrated database inside a transaction rolled back after
  the test (fast; for SQL tests that do not commit).
- `db_url`: the URL of a fresh database cloned from the migrated template (for tests that
  commit, run the CLI or spawn processes).
- `server_url(dbname)` / `admin_url`: URLs on the same server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from kbpg.store import db as kdb

if TYPE_CHECKING:
    from kbpg.models.embedders import Embedder

REPO_ROOT = Path(__file__).resolve().parent.parent
NPL_DIR = Path(os.environ.get("KBPG_NPL_DIR", REPO_ROOT.parent / "shared" / "ir" / "npl"))
# one per pytest-xdist worker (PYTEST_XDIST_WORKER: gw0, gw1, ...), should workers share a server
TEMPLATE_DB = "kbpg_template" + os.environ.get("PYTEST_XDIST_WORKER", "").replace("gw", "_")

# The quality gates' tables, printed in pytest's terminal summary (visible under -q): a gate
# records (title, lines) as a test property of this name; properties travel with each test's
# report, so the summary is complete when pytest-xdist runs the tests in worker processes.
QUALITY_SUMMARY = "kbpg quality summary"
_summaries: dict[str, list[str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == QUALITY_SUMMARY:
            title, lines = value
            kept = _summaries.setdefault(title, [])
            kept.extend(line for line in lines if line not in kept)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for title, lines in _summaries.items():
        terminalreporter.write_sep("=", title)
        for line in lines:
            terminalreporter.write_line(line)


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


def _docker_server() -> Iterator[str] | None:
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        return None
    try:
        container = PostgresContainer("pgvector/pgvector:pg17", driver=None)
        container.start()
    except Exception:  # docker.errors.DockerException in ~2 ms when no engine answers
        return None

    def gen() -> Iterator[str]:
        try:
            yield container.get_connection_url()
        finally:
            container.stop()

    return gen()


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    """URL of the maintenance database `postgres` on the session's server."""
    dsn = os.environ.get("KBPG_TEST_DSN")
    if dsn:
        yield with_database(dsn, "postgres")
        return
    docker = _docker_server()
    if docker is not None:
        url = next(docker)
        yield with_database(url, "postgres")
        with contextlib.suppress(StopIteration):
            next(docker)
        return
    from kbpg.store.embedded import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="kbpg-test-", dir="/tmp"))
    home.chmod(0o755)  # reachable by the unprivileged server user when tests run as root
    server = EmbeddedServer(home, durable=False)
    try:
        server.start()
        yield server.url("postgres")
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def server_url(admin_url: str) -> Callable[[str], str]:
    return lambda dbname: with_database(admin_url, dbname)


def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if template:
            conn.execute(f'create database "{name}" template "{template}"')
        else:
            conn.execute(f'create database "{name}"')
    return with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture(scope="session")
def template_url(admin_url: str) -> Iterator[str]:
    """A database migrated to head, used as the template of every test database; dropped at
    the end of the session (and at its start, after a run that was killed)."""
    drop_database(admin_url, TEMPLATE_DB)
    url = create_database(admin_url, TEMPLATE_DB)
    try:
        kdb.upgrade(url)
        yield url
    finally:
        drop_database(admin_url, TEMPLATE_DB)


@pytest.fixture
def new_database(admin_url: str, template_url: str) -> Iterator[Callable[..., str]]:
    """Factory: a fresh database (migrated by default, `migrated=False` for an empty one)."""
    created: list[str] = []

    def make(migrated: bool = True) -> str:
        name = f"kbpg_t_{uuid.uuid4().hex[:12]}"
        created.append(name)
        return create_database(admin_url, name, TEMPLATE_DB if migrated else None)

    yield make
    for name in created:
        drop_database(admin_url, name)


@pytest.fixture
def db_url(new_database: Callable[..., str]) -> str:
    """A fresh migrated database of this test's own (commit freely)."""
    return new_database()


@pytest.fixture(scope="session")
def shared_db_url(admin_url: str, template_url: str) -> Iterator[str]:
    name = f"kbpg_shared_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    yield url
    drop_database(admin_url, name)


@pytest.fixture
def conn(shared_db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction that is rolled back after the test."""
    connection = kdb.connect(shared_db_url)
    try:
        yield connection
    finally:
        connection.rollback()
        connection.close()


@pytest.fixture
def cli_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running the real `kbpg` command against this test's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
    env.update(
        {
            "KBPG_DATABASE_URL": db_url,
            "KBPG_HOME": str(tmp_path / "kbpg-home"),
            "ORT_DISABLE_TELEMETRY": "1",
        }
    )
    return env


@pytest.fixture
def kbpg_home() -> Iterator[Path]:
    """A fresh KBPG_HOME for an embedded server of the test's own, stopped afterwards."""
    from kbpg.store.embedded import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="kbpg-home-", dir="/tmp"))
    home.chmod(0o755)  # reachable by the unprivileged server user when tests run as root
    yield home
    EmbeddedServer(home).stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The offline default model (all-MiniLM-L6-v2, int8 ONNX), loaded once per session."""
    from kbpg.config import Settings
    from kbpg.models.embedders import get_embedder

    return get_embedder(Settings.from_env(), "minilm")


@pytest.fixture(scope="session")
def npl_dir() -> Path:
    """The NPL collection; absent -> skip locally, fail in CI (the only acceptable skip)."""
    if not (NPL_DIR / "corpus.jsonl").exists():
        message = f"NPL collection not found at {NPL_DIR} (set KBPG_NPL_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return NPL_DIR


# -- least privilege: a non-superuser role that owns its database ------------------------------


def with_user(url: str, user: str, password: str) -> str:
    """The same server URL, logging in as another role."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user)}:{quote(password)}@{host}"))


@pytest.fixture(scope="session")
def owner_role(admin_url: str) -> Iterator[tuple[str, str]]:
    """(name, password) of a login role with no SUPERUSER, CREATEDB or CREATEROLE — what a DBA
    hands an application. Dropped at the end of the session, with the databases it owns."""
    name, password = f"kbpg_owner_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("create role {} login password {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
    try:
        yield name, password
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            owned = conn.execute(
                "select datname from pg_catalog.pg_database d"
                " join pg_catalog.pg_roles r on r.oid = d.datdba where r.rolname = %s",
                (name,),
            ).fetchall()
            for (database,) in owned:
                drop_database(admin_url, database)
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


@pytest.fixture
def owned_database(admin_url: str, owner_role: tuple[str, str]) -> Iterator[Callable[..., str]]:
    """Factory: a new database and the URL `owner_role` logs in with.

    The admin's one-time statements (docs/operations.md "Using your own PostgreSQL") run first:
    `vector_schema="public"` -> CREATE EXTENSION vector; another name -> CREATE SCHEMA name,
    GRANT USAGE ON SCHEMA name TO role, CREATE EXTENSION vector SCHEMA name (Supabase:
    `extensions`); None -> no extension. `owned=False`: the admin keeps the database and
    grants the role CONNECT and TEMPORARY only.
    """
    role, password = owner_role
    created: list[str] = []

    def make(vector_schema: str | None = "public", owned: bool = True) -> str:
        name = f"kbpg_t_{uuid.uuid4().hex[:12]}"
        created.append(name)
        url = create_database(admin_url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            if owned:
                conn.execute(
                    sql.SQL("alter database {} owner to {}").format(
                        sql.Identifier(name), sql.Identifier(role)
                    )
                )
            else:
                conn.execute(
                    sql.SQL("revoke create on database {} from public").format(sql.Identifier(name))
                )
                conn.execute(
                    sql.SQL("grant connect, temporary on database {} to {}").format(
                        sql.Identifier(name), sql.Identifier(role)
                    )
                )
            if vector_schema == "public":
                conn.execute("create extension if not exists vector")
            elif vector_schema is not None:
                schema = sql.Identifier(vector_schema)
                conn.execute(sql.SQL("create schema {}").format(schema))
                conn.execute(
                    sql.SQL("grant usage on schema {} to {}").format(schema, sql.Identifier(role))
                )
                conn.execute(sql.SQL("create extension vector schema {}").format(schema))
        return with_user(url, role, password)

    yield make
    for name in created:
        drop_database(admin_url, name)
