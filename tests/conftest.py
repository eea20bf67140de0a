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
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from kbpg import db as kdb

if TYPE_CHECKING:
    from kbpg.embedding import Embedder

REPO_ROOT = Path(__file__).resolve().parent.parent
NPL_DIR = Path(os.environ.get("KBPG_NPL_DIR", REPO_ROOT.parent / "shared" / "ir" / "npl"))
TEMPLATE_DB = "kbpg_template"


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
    from kbpg.server import EmbeddedServer

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
    from kbpg.server import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="kbpg-home-", dir="/tmp"))
    home.chmod(0o755)  # reachable by the unprivileged server user when tests run as root
    yield home
    EmbeddedServer(home).stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The offline default model (all-MiniLM-L6-v2, int8 ONNX), loaded once per session."""
    from kbpg.config import Settings
    from kbpg.embedding import get_embedder

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
