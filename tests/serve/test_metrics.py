"""Operating `kbpg serve`: /metrics (values after a search, an ingest and a failed model call;
its token rules), /readyz (busy, down, unmigrated), /healthz, and JSON logs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from kbpg.app import KnowledgeBase
from kbpg.config import Settings
from kbpg.ingest.run import ingest_paths
from kbpg.models.embedders import Embedder
from kbpg.serve.http import create_app
from kbpg.store import db as kdb
from tests.embedding_server import EmbeddingServer
from tests.helpers import KBPG
from tests.http_server import free_port, running_server
from tests.model_servers import ModelServer
from tests.release_fixtures import REPO
from tests.search_kb import env_for

SEARCH = "/api/v1/kb/search"
PARKING = REPO / "samples" / "kb" / "parking"


def scrape(
    api: TestClient | httpx.Client, **headers: str
) -> dict[tuple[str, frozenset[Any]], float]:
    """GET /metrics parsed: (sample name, its labels) -> value."""
    response = api.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(metrics: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    return metrics.get((name, frozenset(labels.items())), 0.0)


def settings_for(url: str, **models: Any) -> Settings:
    settings = replace(Settings.from_env(), database_url=url)
    return replace(settings, models=replace(settings.models, **models)) if models else settings


@pytest.fixture
def reranker() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


def test_metrics_after_an_ingest_a_search_and_a_failed_model_call(
    db_url: str, embedder: Embedder, reranker: ModelServer
) -> None:
    settings = settings_for(db_url, rerank="api", rerank_url=reranker.api_url, rerank_model="m")
    settings = replace(settings, models=replace(settings.models, retries=1))
    with KnowledgeBase(db_url, embedder, settings=settings, pool_size=2) as kb:
        api = TestClient(create_app(kb), base_url="http://localhost")
        before = scrape(api)
        assert value(before, "kbpg_ingest_runs") == 0
        assert value(before, "kbpg_pool_max_connections", database="primary") == 2

        summary = ingest_paths(kb.db, kb.models, [PARKING], recursive=True)
        assert summary.added >= 2 and summary.chunks > summary.added

        plain = api.post(SEARCH, json={"query": "renew a parking permit", "rerank": False})
        assert plain.status_code == 200
        reranker.script = ["500", "500"]  # the call and its one retry fail: a fallback
        fallback = api.post(SEARCH, json={"query": "renew a parking permit", "top": 2})
        assert fallback.status_code == 200
        assert fallback.json()["stages"][0]["status"] == "failed"
        assert [c["chunk_id"] for c in fallback.json()["chunks"]] == [
            c["chunk_id"] for c in plain.json()["chunks"][:2]
        ]
        after = scrape(api)

    # ingest progress: what the run committed, and no run left in progress
    assert value(after, "kbpg_ingest_documents_total", outcome="added") == summary.added
    assert value(after, "kbpg_ingest_chunks_total") == summary.chunks
    assert value(after, "kbpg_ingest_runs") == 0
    # requests by route and status (the scrape before counts too)
    search = {"route": SEARCH, "method": "POST", "status": "200"}
    assert value(after, "kbpg_http_requests_total", **search) == 2
    assert (
        value(after, "kbpg_http_requests_total", route="/metrics", method="GET", status="200") == 1
    )
    assert value(after, "kbpg_http_request_duration_seconds_count", route=SEARCH) == 2
    # stage latencies: both searches embedded and ran SQL; one called the reranker
    for stage, count in (("embed", 2), ("sql", 2), ("rerank", 1), ("expand", 0)):
        assert value(after, "kbpg_search_stage_duration_seconds_count", stage=stage) == count
    assert value(after, "kbpg_search_stage_duration_seconds_sum", stage="sql") > 0
    assert value(after, "kbpg_search_stage_duration_seconds_bucket", stage="rerank", le="+Inf") == 1
    # queries per embedding call: the searches came one after the other, a query a call
    assert value(after, "kbpg_query_embedding_batch_size_count") == 2
    assert value(after, "kbpg_query_embedding_batch_size_sum") == 2
    assert value(after, "kbpg_query_embedding_batch_size_bucket", le="1.0") == 2
    # the failed model call: one error after one retry, and the fallback to the fused order
    assert value(after, "kbpg_model_errors_total", client="reranker", reason="unreachable") == 1
    assert value(after, "kbpg_model_retries_total", client="reranker") == 1
    assert value(after, "kbpg_search_stage_outcomes_total", stage="rerank", status="failed") == 1
    assert reranker.calls["/api/rerank"] == 2
    # reads by database: the plain search, the reranked search and its cap-and-cut
    assert value(after, "kbpg_reads_total", database="primary") == 3
    # the pool, read when scraped: both connections open at most, none lent out
    assert value(after, "kbpg_pool_in_use", database="primary") == 0
    assert value(after, "kbpg_pool_waiting", database="primary") == 0
    assert 1 <= value(after, "kbpg_pool_connections", database="primary") <= 2


def test_a_scrape_needs_the_api_token_or_the_metrics_token(db_url: str, embedder: Embedder) -> None:
    with KnowledgeBase(db_url, embedder, pool_size=2) as kb:
        api = TestClient(create_app(kb, token="api-secret"), base_url="http://localhost")
        refused = api.get("/metrics")
        assert refused.status_code == 401
        assert refused.json()["error"] == "Unauthorized"
        assert api.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        scrape(api, Authorization="Bearer api-secret")

        separate = TestClient(
            create_app(kb, token="api-secret", metrics_token="scrape-secret"),
            base_url="http://localhost",
        )
        assert separate.get("/metrics").status_code == 401
        # the scraper's token opens /metrics only; the API's token no longer opens /metrics
        assert (
            separate.get("/metrics", headers={"Authorization": "Bearer api-secret"}).status_code
            == 401
        )
        scrape(separate, Authorization="Bearer scrape-secret")
        search = separate.post(
            SEARCH, json={"query": "permit"}, headers={"Authorization": "Bearer scrape-secret"}
        )
        assert search.status_code == 401
        # without any API token, a loopback server's /metrics is as open as its API
        scrape(TestClient(create_app(kb), base_url="http://localhost"))


def test_probes_answer_any_host_and_metrics_does_not(db_url: str, embedder: Embedder) -> None:
    with KnowledgeBase(db_url, embedder, pool_size=2) as kb:
        api = TestClient(create_app(kb), base_url="http://localhost")
        foreign = {"Host": "lb.internal.example"}
        assert api.get("/healthz", headers=foreign).json() == {"ok": True}
        assert api.get("/readyz", headers=foreign).status_code == 200
        assert api.get("/metrics", headers=foreign).status_code == 400


# -- readiness ------------------------------------------------------------------------------


def test_readyz_says_busy_when_every_connection_stays_in_use(
    db_url: str, embedder: Embedder
) -> None:
    with KnowledgeBase(db_url, embedder, pool_size=2) as kb:
        api = TestClient(create_app(kb), base_url="http://localhost")
        assert api.get("/readyz").json()["primary"]["status"] == "ok"
        with kb.connection(), kb.connection():  # both pooled connections lent out
            busy = api.get("/readyz")
            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "2"
            assert busy.json()["ok"] is False
            assert busy.json()["primary"] == {"status": "busy", "schema": None}
            during = scrape(api)
        assert value(during, "kbpg_pool_in_use", database="primary") == 2
        assert value(during, "kbpg_pool_exhausted_total", database="primary") == 1
        ready = api.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["primary"] == {"status": "ok", "schema": kdb.head_revision()}


def test_readyz_says_down_when_the_database_refuses_connections(
    db_url: str, admin_url: str, embedder: Embedder
) -> None:
    name = db_url.rsplit("/", 1)[1].split("?")[0]
    with KnowledgeBase(db_url, embedder, pool_size=2) as kb:
        api = TestClient(create_app(kb), base_url="http://localhost")
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'alter database "{name}" allow_connections false')
            admin.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where datname = %s",
                (name,),
            )
            try:
                down = api.get("/readyz")
                assert api.get("/healthz").status_code == 200  # the process itself lives
            finally:
                admin.execute(f'alter database "{name}" allow_connections true')
        assert down.status_code == 503
        assert "retry-after" not in down.headers  # down is not busy: no retry promised
        assert down.json() == {
            "ok": False,
            "model": "all-MiniLM-L6-v2",
            "primary": {"status": "down", "schema": None},
            "replicas": [],
        }
        assert kb.readiness().primary.status == "ok"  # back once the database is


def test_readyz_says_unmigrated(new_database: Callable[..., str], embedder: Embedder) -> None:
    url = new_database()
    kdb.downgrade(url, "0003")
    with KnowledgeBase(url, embedder, pool_size=2) as kb:
        response = TestClient(create_app(kb), base_url="http://localhost").get("/readyz")
        assert response.status_code == 503
        assert response.json()["primary"] == {"status": "unmigrated", "schema": "0003"}
        state = kb.readiness().primary
        assert state.detail == f"kbpg schema at 0003, this kbpg needs {kdb.head_revision()}"


# -- JSON logs ------------------------------------------------------------------------------


def test_json_log_has_a_line_per_request(db_url: str, embedder: Embedder, tmp_path: Path) -> None:
    with KnowledgeBase(db_url, embedder, pool_size=2) as kb:
        ingest_paths(kb.db, kb.models, [PARKING], recursive=True)
    log = tmp_path / "serve.log"
    env = env_for(db_url, tmp_path / "home")
    with running_server(env, log, "--log-format", "json") as api:
        assert api.post(SEARCH, json={"query": "renew a parking permit"}).status_code == 200
        assert api.post(SEARCH, json={"query": ""}).status_code == 422
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(e) for e in entries)
    requests = [e for e in entries if e["logger"] == "kbpg.http"]
    searches = [(e["method"], e["route"], e["status"]) for e in requests if e["route"] == SEARCH]
    assert searches == [("POST", SEARCH, 200), ("POST", SEARCH, 422)]
    assert all(isinstance(e["ms"], float) and e["ms"] > 0 for e in requests)
    assert any(
        e["logger"] == "uvicorn.error" and "Uvicorn running" in e["message"] for e in entries
    )


@pytest.mark.parametrize("given", [None, 5])
def test_serve_sizes_its_pool_to_the_cores_unless_told(
    db_url: str, tmp_path: Path, given: int | None
) -> None:
    env = env_for(db_url, tmp_path / "home")
    extra = ("--pool-size", str(given)) if given else ()
    with running_server(env, tmp_path / "serve.log", *extra) as api:
        size = value(scrape(api), "kbpg_pool_max_connections", database="primary")
    assert size == (given or len(os.sched_getaffinity(0)) + 1)


# -- a long ingest ----------------------------------------------------------------------------


def test_a_long_ingest_serves_its_progress(db_url: str, embedder: Embedder, tmp_path: Path) -> None:
    """`kbpg ingest --metrics-port`: while the run lasts (a slow embedding server here), its
    progress is scraped from 127.0.0.1; the port closes with the run."""
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.md").write_text(f"# Note {name}\n\nParking note {name}.\n")
    with EmbeddingServer(embedder) as server:  # type: ignore[arg-type]
        server.slow_s = 1.5
        server.script = ["slow"] * 20
        # picked once the embedding server listens: picked before, its port was once the same
        port = free_port()
        env = env_for(
            db_url,
            tmp_path / "home",
            KBPG_EMBEDDER="openai",
            KBPG_OPENAI_BASE_URL=server.base_url,
            KBPG_OPENAI_MODEL="minilm-over-http",
        )
        proc = subprocess.Popen(
            [KBPG, "ingest", *(str(tmp_path / f"{n}.md") for n in "abc"), "--batch-size", "1",
             "--metrics-port", str(port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen: list[tuple[float, float]] = []  # (runs in progress, documents added) while running
        try:
            while proc.poll() is None:
                try:
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                metrics = {
                    (s.name, frozenset(s.labels.items())): s.value
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                }
                if proc.poll() is None:
                    seen.append(
                        (
                            value(metrics, "kbpg_ingest_runs"),
                            value(metrics, "kbpg_ingest_documents_total", outcome="added"),
                        )
                    )
                time.sleep(0.2)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert f"metrics at http://127.0.0.1:{port}/metrics" in err
    assert (1.0, 0.0) in seen  # running, nothing committed yet
    assert any(runs == 1.0 and 1 <= added < 3 for runs, added in seen)  # part way
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
