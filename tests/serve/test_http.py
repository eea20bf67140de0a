"""The HTTP API, served by the real `kbpg serve` on a loopback port."""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kbpg.models.embedders import Embedder
from kbpg.store import db as kdb
from tests.conftest import drop_database
from tests.helpers import KBPG, run_kbpg
from tests.http_server import free_port, running_server
from tests.search_kb import (  # noqa: F401 - fixtures
    HOSTILE_QUERIES,
    env_for,
    kb_url,
    load_kb,
)

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEARCH = "/api/v1/kb/search"


@pytest.fixture(scope="module")
def api(kb_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:  # noqa: F811
    home = tmp_path_factory.mktemp("kbpg-serve")
    env = env_for(kb_url, home, KBPG_API_TOKEN=TOKEN)
    with running_server(env, home / "serve.log") as client:
        yield client


def search(api: httpx.Client, **body: object) -> httpx.Response:
    return api.post(SEARCH, json=body, headers=AUTH)


def test_probes_need_no_token(api: httpx.Client) -> None:
    alive = api.get("/healthz")
    assert (alive.status_code, alive.json()) == (200, {"ok": True})
    ready = api.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "ok": True,
        "model": "all-MiniLM-L6-v2",
        "primary": {"status": "ok", "schema": kdb.head_revision()},
        "replicas": [],
    }


def test_search(api: httpx.Client) -> None:
    response = search(api, query="how do I renew a parking permit")
    assert response.status_code == 200
    payload = response.json()
    assert set(payload) == {"context", "sources", "chunks", "stages", "facets"}
    assert len(payload["chunks"]) == 8  # KBPG_DEFAULT_MAX_CHUNKS, not the CLI's 5
    first = payload["chunks"][0]
    assert first["section"] == "Parking permits > Renewing a permit"
    assert first["vector_rank"] == 1
    for key in ("document", "source", "score", "similarity", "lexical_rank", "graph_rank"):
        assert key in first
    assert payload["context"].startswith("[1] Parking permits > Renewing a permit\n")
    assert payload["sources"][0] == {
        "source": "city/parking/permits.md",
        "document": "Parking permits",
        "ranks": [c["rank"] for c in payload["chunks"] if c["source"] == "city/parking/permits.md"],
    }


def test_search_matches_the_cli_json(api: httpx.Client, kb_url: str, tmp_path: Path) -> None:  # noqa: F811
    query = "renew parking permit"
    proc = run_kbpg("search", query, "--top", "4", "--json", env=env_for(kb_url, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert search(api, query=query, top=4).json() == json.loads(proc.stdout)


def test_filters(api: httpx.Client) -> None:
    staff = search(api, query="parking permit", groups=["staff"], min_similarity=0.0).json()
    assert {c["source"] for c in staff["chunks"]} == {"staff/payroll.md"}
    waste = search(api, query="parking permit", category="waste", min_similarity=0.0).json()
    assert {c["source"] for c in waste["chunks"]} == {"city/waste/collection.md"}
    howto = search(api, query="renew", labels=["howto"], top=20, min_similarity=0.0).json()
    assert {c["source"] for c in howto["chunks"]} <= {
        "city/parking/permits.md",
        "city/library/cards.md",
    }
    empty = search(api, query="parking", groups=["nobody"])
    assert empty.status_code == 200
    assert empty.json() == {"context": "", "sources": [], "chunks": [], "stages": [], "facets": []}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "permit", "top": 0}, "top"),
        ({"query": "permit", "top": "many"}, "top"),
        ({"query": "permit", "groups": "staff"}, "groups"),
        ({"query": "permit", "min_similarity": 3}, "min_similarity"),
        ({"query": "permit", "sql": "drop table"}, "sql"),
        ({"query": 42}, "query"),
        # strict types: no coercion from strings, booleans or floats
        ({"query": "permit", "top": "5"}, "top"),
        ({"query": "permit", "top": True}, "top"),
        ({"query": "permit", "top": 1000.0}, "top"),
        ({"query": "permit", "top": 5.0}, "top"),
        ({"query": "permit", "lexical": "true"}, "lexical"),
        ({"query": "permit", "lexical": 1}, "lexical"),
        ({"query": "permit", "min_similarity": "0.5"}, "min_similarity"),
        ({"query": "permit", "category": 5}, "category"),
        ({"query": "permit", "groups": [1]}, 0),
        # filters are validated like the query
        ({"query": "permit", "groups": ["st\u0000aff"]}, "groups"),
        ({"query": "permit", "category": "waste\u0000"}, "category"),
        ({"query": "permit", "labels": ["howto", ""]}, "labels"),
        ({"query": "permit\u0000"}, "query"),
    ],
)
def test_validation_errors_are_422(api: httpx.Client, body: dict[str, object], field: str) -> None:
    response = api.post(SEARCH, json=body, headers=AUTH)
    assert response.status_code == 422
    payload = response.json()
    detail = payload["detail"]
    assert any(error["loc"][-1] == field for error in detail), detail
    assert all(error["msg"] for error in detail)
    # the documented error shape, with each problem in detail (issue 42)
    assert payload["error"] == "InvalidRequest" and payload["hint"]
    assert str(field) in payload["message"], payload


def test_every_4xx_has_the_documented_body(api: httpx.Client) -> None:
    """{"error", "message", "hint"} on every 4xx, not FastAPI's {"detail": ...} (issue 42)."""
    cases = [
        (api.post(SEARCH, json={"query": "permit", "top": "many"}, headers=AUTH), 422,
         "InvalidRequest", "top: "),
        (api.post(SEARCH, content=b"{not json", headers={**AUTH, "Content-Type":
         "application/json"}), 422, "InvalidRequest", ""),
        (api.get("/api/v1/kb/nowhere", headers=AUTH), 404, "NotFound", "Not Found"),
        (api.get(SEARCH, headers=AUTH), 405, "MethodNotAllowed", "Method Not Allowed"),
        (api.post(SEARCH, json={"query": "   "}, headers=AUTH), 422, "InvalidRequest",
         "query: Value error, the query must not be empty"),
    ]  # fmt: skip
    for response, status, error, message in cases:
        payload = response.json()
        assert response.status_code == status, payload
        assert {"error", "message", "hint"} <= set(payload), payload
        assert payload["error"] == error and payload["message"].startswith(message), payload
    assert cases[3][0].headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (rb'{"query": "caf\ud800"}', ["body", "query"]),
        (rb'{"query": "permit", "groups": ["st\udfffaff"]}', ["body", "groups"]),
        (rb'{"query": "permit", "labels": ["\ud800"]}', ["body", "labels"]),
        (rb'{"query": "permit", "category": "\udc80waste"}', ["body", "category"]),
        (rb'{"query": "permit", "cat\ud800": "waste"}', ["body"]),
    ],
)
def test_lone_surrogates_are_422_and_keep_the_connection(
    api: httpx.Client, body: bytes, loc: list[object]
) -> None:
    port = api.base_url.port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {**AUTH, "Content-Type": "application/json"}
    try:
        connection.request("POST", SEARCH, body=body, headers=headers)
        response = connection.getresponse()
        payload = json.loads(response.read())
        assert response.status == 422, payload
        assert [error["loc"] for error in payload["detail"]] == [loc]
        # the same keep-alive connection answers the next request
        connection.request("POST", SEARCH, body=b'{"query": "permit", "top": 1}', headers=headers)
        again = connection.getresponse()
        assert again.status == 200
        assert len(json.loads(again.read())["chunks"]) == 1
    finally:
        connection.close()


def test_foreign_host_is_refused_on_the_wire(api: httpx.Client) -> None:
    rebound = {**AUTH, "Host": f"attacker.example:{api.base_url.port}"}
    response = api.post(SEARCH, json={"query": "permit"}, headers=rebound)
    assert response.status_code == 400
    assert response.json()["error"] == "HostNotAllowed"


def test_malformed_json_is_422(api: httpx.Client) -> None:
    response = api.post(
        SEARCH, content=b'{"query": ', headers={**AUTH, "content-type": "application/json"}
    )
    assert response.status_code == 422


@pytest.mark.parametrize("bad", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_422_saying_a_finite_number(api: httpx.Client, bad: bytes) -> None:
    body = b'{"query": "permit", "lexical_weight": ' + bad + b"}"
    response = api.post(SEARCH, content=body, headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [(e["loc"][-1], e["msg"]) for e in detail] == [
        ("lexical_weight", "Input should be a finite number")
    ]


def test_request_size_limit(api: httpx.Client) -> None:
    big = {"query": "permit " * 12_000}  # ~84 KB
    assert search(api, **big).status_code == 413

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit still holds
        yield b'{"query": "'
        for _ in range(100):
            yield b"permit " * 100
        yield b'"}'

    response = api.post(
        SEARCH, content=chunked(), headers={**AUTH, "content-type": "application/json"}
    )
    assert response.status_code == 413


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=range(len(HOSTILE_QUERIES)))
def test_queries_are_data(api: httpx.Client, query: str) -> None:
    response = search(api, query=query, top=3)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}],
)
def test_token_guards_the_api(api: httpx.Client, headers: dict[str, str]) -> None:
    response = api.post(SEARCH, json={"query": "permit"}, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert api.get("/api/v1/anything", headers=headers).status_code == 401
    assert api.get("/unknown", headers=headers).status_code == 401
    # the page, its assets and the API docs hold no data: a browser loads them without a token
    for path in ("/", "/docs", "/openapi.json", "/static/app.js"):
        assert api.get(path, headers=headers).status_code == 200, path


def test_openapi_document(api: httpx.Client) -> None:
    response = api.get("/openapi.json", headers=AUTH)
    assert response.status_code == 200
    spec = response.json()
    operation = spec["paths"][SEARCH]["post"]
    assert "requestBody" in operation and "422" in operation["responses"]
    assert "SearchRequest" in spec["components"]["schemas"]
    assert "/healthz" in spec["paths"] and "/readyz" in spec["paths"]


def test_twenty_concurrent_clients(api: httpx.Client) -> None:
    queries = ["renew parking permit", "bin collection day", "library card", "pay a fine"]
    base_url = str(api.base_url)

    def client_session(n: int) -> list[int]:
        with httpx.Client(base_url=base_url, timeout=60, headers=AUTH) as client:
            statuses = []
            for i in range(5):
                response = client.post(SEARCH, json={"query": queries[(n + i) % 4], "top": 3})
                statuses.append(response.status_code)
                assert response.json()["chunks"], response.text
            return statuses

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(client_session, range(20)))
    assert [s for statuses in results for s in statuses] == [200] * 100


def test_binds_loopback_by_default(api: httpx.Client) -> None:
    assert api.base_url.host == "127.0.0.1"


def test_database_gone_is_503(
    new_database: Callable[..., str],
    admin_url: str,
    embedder: Embedder,
    tmp_path: Path,
) -> None:
    url = new_database()
    load_kb(url, embedder)
    with running_server(env_for(url, tmp_path), tmp_path / "serve.log") as client:
        assert client.post(SEARCH, json={"query": "permit"}).status_code == 200
        drop_database(admin_url, url.rsplit("/", 1)[1].split("?")[0])
        assert client.get("/healthz").status_code == 200  # the process lives
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["ok"] is False
        response = client.post(SEARCH, json={"query": "permit"})
        assert response.status_code == 503
        assert response.json() == {
            "error": "DatabaseUnavailable",
            "message": "the database is unavailable",
            "hint": "retry later",
        }
        # no socket path, no PostgreSQL text
        assert ready.json()["primary"] == {"status": "down", "schema": None}


def test_serve_refuses_to_start_without_a_database(tmp_path: Path) -> None:
    url = f"postgresql://postgres@/kbpg?host={tmp_path / 'no-such-socket-dir'}"
    proc = subprocess.run(
        [KBPG, "serve", "--port", str(free_port())],
        env=env_for(url, tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: cannot connect to PostgreSQL")
    assert "Traceback" not in proc.stderr


def test_stage_without_a_model_is_422(api: httpx.Client) -> None:
    rerank = search(api, query="renew permit", rerank=True)
    assert rerank.status_code == 422
    assert rerank.json()["error"] == "StageUnavailable"
    assert "no reranker is configured" in rerank.json()["message"]
    expand = search(api, query="renew permit", expand=True)
    assert expand.status_code == 422
    assert "no chat model server is configured" in expand.json()["message"]
