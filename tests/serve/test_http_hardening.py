"""HTTP hardening (issue 14): allowed hosts, token-less binds, errors without internals, source
paths, a disconnected client's SQL cancelled, 503 + Retry-After when the pool is exhausted."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from kbpg.app import KnowledgeBase
from kbpg.config import Settings
from kbpg.models.embedders import Embedder
from kbpg.serve.guard import allowed_hosts
from kbpg.serve.http import create_app
from tests.helpers import KBPG
from tests.http_server import free_port, running_server
from tests.search_kb import DOCS, env_for, kb_url, load_kb  # noqa: F401 - fixtures

SEARCH = "/api/v1/kb/search"


@pytest.fixture(scope="module")
def knowledge_base(kb_url: str, embedder: Embedder) -> Iterator[KnowledgeBase]:  # noqa: F811
    with KnowledgeBase(kb_url, embedder, pool_size=4) as kb:
        yield kb


def client(kb: KnowledgeBase, **options: Any) -> TestClient:
    """A client on the app (not entered: the app's lifespan would close the shared kb)."""
    return TestClient(create_app(kb, **options), base_url="http://localhost")


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# -- allowed hosts (DNS rebinding) ----------------------------------------------------------


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8080", "127.0.0.1.nip.io"])
def test_foreign_host_names_are_refused(knowledge_base: KnowledgeBase, host: str) -> None:
    api = client(knowledge_base)
    for response in (
        api.post(SEARCH, json={"query": "parking permit"}, headers={"Host": host}),
        api.get("/", headers={"Host": host}),
        api.get("/openapi.json", headers={"Host": host}),
    ):
        assert response.status_code == 400
        assert response.json()["error"] == "HostNotAllowed"
        assert "--allowed-host" in response.json()["hint"]
    # a load balancer's health probe uses whatever address it reached
    assert api.get("/healthz", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:80", "[::1]:8080"])
def test_loopback_names_are_served(knowledge_base: KnowledgeBase, host: str) -> None:
    response = client(knowledge_base).post(
        SEARCH, json={"query": "parking permit", "top": 1}, headers={"Host": host}
    )
    assert response.status_code == 200, response.text


def test_allowed_hosts_are_configurable(knowledge_base: KnowledgeBase) -> None:
    hosts = allowed_hosts("127.0.0.1", ["kb.example.org"])
    api = client(knowledge_base, hosts=hosts)
    body = {"query": "parking permit", "top": 1}
    assert api.post(SEARCH, json=body, headers={"Host": "kb.example.org"}).status_code == 200
    assert api.post(SEARCH, json=body, headers={"Host": "kb.example.org:443"}).status_code == 200
    assert api.post(SEARCH, json=body, headers={"Host": "evil.example.org"}).status_code == 400
    anything = client(knowledge_base, hosts=None)  # --allowed-host '*'
    assert anything.post(SEARCH, json=body, headers={"Host": "evil.example.org"}).status_code == 200
    bound = client(knowledge_base, hosts=allowed_hosts("10.1.2.3"))
    assert bound.post(SEARCH, json=body, headers={"Host": "10.1.2.3:8080"}).status_code == 200


def test_non_loopback_bind_without_a_token_is_refused(kb_url: str, tmp_path: Path) -> None:  # noqa: F811
    proc = subprocess.run(
        [KBPG, "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        env=env_for(kb_url, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: refusing to serve on 0.0.0.0 without a token"), (
        proc.stderr
    )
    assert "--insecure-no-token" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_non_loopback_bind_can_be_forced(kb_url: str, tmp_path: Path) -> None:  # noqa: F811
    args = ("--host", "0.0.0.0", "--insecure-no-token", "--allowed-host", "kb.example.org")
    with running_server(env_for(kb_url, tmp_path), tmp_path / "serve.log", *args) as api:
        body = {"query": "parking permit", "top": 1}
        assert api.post(SEARCH, json=body).status_code == 200
        assert api.post(SEARCH, json=body, headers={"Host": "kb.example.org"}).status_code == 200
        assert api.post(SEARCH, json=body, headers={"Host": "rebound.example"}).status_code == 400
    assert "without a token (--insecure-no-token)" in (tmp_path / "serve.log").read_text()


# -- errors without internals ---------------------------------------------------------------


def test_unmigrated_database_is_503_without_internals(
    new_database: Callable[..., str], embedder: Embedder
) -> None:
    with KnowledgeBase(new_database(migrated=False), embedder, pool_size=2) as kb:
        api = client(kb)
        response = api.post(SEARCH, json={"query": "parking permit"})
        assert response.status_code == 503
        assert response.json() == {
            "error": "SchemaNotMigrated",
            "message": "the knowledge base is not ready yet",
            "hint": "retry later",
        }
        ready = api.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["primary"] == {"status": "unmigrated", "schema": None}


@contextmanager
def locked_chunks(url: str) -> Iterator[psycopg.Connection[Any]]:
    """kb.chunks locked ACCESS EXCLUSIVE by another session: every search waits for it."""
    with psycopg.connect(url) as conn:
        conn.execute("lock table kb.chunks in access exclusive mode")
        try:
            yield conn
        finally:
            conn.rollback()


def test_statement_timeout_is_504_without_internals(
    kb_url: str,  # noqa: F811
    embedder: Embedder,
) -> None:
    settings = replace(Settings.from_env(), statement_timeout_ms=300, lock_timeout_ms=0)
    with KnowledgeBase(kb_url, embedder, settings=settings, pool_size=2) as kb:
        api = client(kb)
        with locked_chunks(kb_url):
            response = api.post(SEARCH, json={"query": "parking permit"})
        assert response.status_code == 504
        assert response.json() == {
            "error": "QueryTimeout",
            "message": "the search took too long and was stopped",
            "hint": "use fewer words or filters",
        }
        assert api.post(SEARCH, json={"query": "parking permit"}).status_code == 200


# -- paths in `source` ----------------------------------------------------------------------


def test_sources_show_no_server_paths(new_database: Callable[..., str], embedder: Embedder) -> None:
    url = new_database()
    docs = [replace(doc, source=f"/srv/secret/kb/{doc.source}") for doc in DOCS]
    docs.append(replace(DOCS[0], source="https://example.org/permits"))
    load_kb(url, embedder, docs)
    with KnowledgeBase(url, embedder, pool_size=2) as kb:
        body = {"query": "parking permit", "top": 20, "min_similarity": 0.0}
        plain = client(kb).post(SEARCH, json=body).json()
        rooted = client(kb, source_root="/srv/secret/kb").post(SEARCH, json=body).json()
    assert "/srv" not in json.dumps(plain)
    shown = {s["source"] for s in plain["sources"]}
    assert {"permits.md", "fines.md", "payroll.md", "https://example.org/permits"} <= shown
    assert {c["source"] for c in plain["chunks"]} == shown
    assert "- Parking permits: permits.md [" in plain["context"]
    assert "/srv" not in json.dumps(rooted)
    assert {"city/parking/permits.md", "staff/payroll.md"} <= {
        s["source"] for s in rooted["sources"]
    }


# -- query cost: a client that leaves, a pool that is full ----------------------------------


@pytest.fixture(scope="module")
def small_api(
    kb_url: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[httpx.Client]:
    """`kbpg serve` with 2 connections, a 1 s pool wait and a lock wait longer than any test."""
    home = tmp_path_factory.mktemp("kbpg-serve-small")
    env = env_for(kb_url, home, KBPG_LOCK_TIMEOUT="2min", KBPG_POOL_TIMEOUT="1s")
    with running_server(env, home / "serve.log", "--pool-size", "2") as api:
        yield api


def waiting_searches(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "select count(*) from pg_catalog.pg_stat_activity where datname = current_database()"
            " and wait_event_type = 'Lock' and query like '%kb.search%'"
        ).fetchone()
    return int(row[0]) if row else 0


def raw_search(port: int, query: str) -> socket.socket:
    """A search sent on a raw socket, left waiting for its answer."""
    body = json.dumps({"query": query}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST " + SEARCH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    return sock


def test_a_client_that_leaves_has_its_sql_cancelled(small_api: httpx.Client, kb_url: str) -> None:  # noqa: F811
    port = small_api.base_url.port
    assert port is not None
    with locked_chunks(kb_url):
        sock = raw_search(port, "parking permit")
        assert wait_until(lambda: waiting_searches(kb_url) == 1), "the search never started"
        sock.close()
        # without the cancel, the backend waits for the lock (2 min here) after its client left
        assert wait_until(lambda: waiting_searches(kb_url) == 0, timeout=15)
    response = small_api.post(SEARCH, json={"query": "parking permit", "top": 1})
    assert response.status_code == 200


def test_an_exhausted_pool_answers_503_with_retry_after(
    small_api: httpx.Client,
    kb_url: str,  # noqa: F811
) -> None:
    port = small_api.base_url.port
    assert port is not None
    with locked_chunks(kb_url) as holder:
        waiting = [raw_search(port, "parking permit") for _ in range(2)]
        assert wait_until(lambda: waiting_searches(kb_url) == 2)
        response = small_api.post(SEARCH, json={"query": "library card"})
        assert response.status_code == 503
        assert response.headers["retry-after"] == "2"
        assert response.json() == {
            "error": "Busy",
            "message": "the server is busy",
            "hint": "retry in 2 seconds",
        }
        holder.rollback()  # the lock goes: the two waiting searches finish
        for sock in waiting:
            sock.settimeout(30)
            assert sock.recv(64).startswith(b"HTTP/1.1 200 ")
            sock.close()
    assert small_api.post(SEARCH, json={"query": "library card"}).status_code == 200


def test_clients_that_send_too_slowly_are_disconnected(small_api: httpx.Client) -> None:
    """A request's headers trickled a byte at a time (slowloris) held a connection as long as
    bytes kept coming: 20 such clients stayed connected over a minute. Headers must now be in
    within 10 s of the connection; the server then closes it."""
    from kbpg.serve.slow_clients import HEADERS_S

    port = small_api.base_url.port
    assert port is not None
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    started = time.monotonic()
    closed = [False] * len(slow)
    try:
        while not all(closed) and time.monotonic() - started < HEADERS_S + 20:
            for i, sock in enumerate(slow):
                if closed[i]:
                    continue
                try:
                    sock.sendall(b"X-Slow: 1\r\n" if time.monotonic() - started > 0.1 else b"GET ")
                    sock.settimeout(0.05)
                    closed[i] = sock.recv(1) == b""
                except TimeoutError:
                    pass
                except OSError:
                    closed[i] = True
            time.sleep(0.5)  # a line every half second: never idle, never done
    finally:
        for sock in slow:
            sock.close()
    assert all(closed), "slow clients still connected"
    assert small_api.get("/healthz").status_code in (200, 503)  # the server serves on
