"""Issue 40: one metadata filter, the same answer through every face — the CLI (JSON and the
short form), HTTP and MCP — on samples/kb/parking ingested by kbpg's own pipeline (each file's
front matter `updated:` date is its metadata)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from mcp.client.session import ClientSession

from kbpg.app import KnowledgeBase
from kbpg.cli import main
from kbpg.ingest.run import ingest_paths
from kbpg.models.embedders import Embedder
from tests.conftest import TEMPLATE_DB, create_database, drop_database
from tests.http_server import running_server
from tests.search_kb import env_for
from tests.serve.test_mcp import run_session

PARKING = Path(__file__).resolve().parents[2] / "samples" / "kb" / "parking"
QUESTION = "parking permit"
# updated: accessible 2023-11-02, fines 2024-03-15, renew 2025-01-20, residential 2025-06-30,
# visitor 2024-09-01
SINCE_2025 = {"renew-permit.md", "residential-permits.md"}
TOKEN = "filter-token"


@pytest.fixture(scope="module")
def env(
    admin_url: str, template_url: str, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    name = f"kbpg_filters_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    try:
        kb = KnowledgeBase(url, embedder, pool_size=1)
        try:
            summary = ingest_paths(kb.db, kb.models, [PARKING], recursive=True)
            assert summary.documents == 5
        finally:
            kb.close()
        yield env_for(url, Path(tmp_path_factory.mktemp("home")), KBPG_API_TOKEN=TOKEN)
    finally:
        drop_database(admin_url, name)


def names(sources: list[str]) -> set[str]:
    return {Path(s).name for s in sources}


def cli(env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(main, ["search", QUESTION, "--top", "20", *args], env=env)


def cli_sources(env: dict[str, str], *args: str) -> set[str]:
    result = cli(env, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return names([c["source"] for c in json.loads(result.stdout)["chunks"]])


def test_the_cli_takes_json_and_the_short_form_alike(env: dict[str, str]) -> None:
    assert cli_sources(env) == {p.name for p in PARKING.glob("*.md")}
    assert cli_sources(env, "--filter", '{"updated": {"$gte": "2025-01-01"}}') == SINCE_2025
    assert cli_sources(env, "--filter", "updated>=2025-01-01") == SINCE_2025
    # repeated: all hold
    assert cli_sources(
        env, "--filter", "updated>=2024-01-01", "--filter", "updated<2025-01-01"
    ) == {"fines-and-appeals.md", "visitor-permits.md"}
    assert cli_sources(env, "--filter", "updated!=2025-01-20", "--filter", "updated>2025") == set()


def test_indexed_keys_keep_the_answers_and_say_what_they_hold(env: dict[str, str]) -> None:
    def keys(*args: str) -> Any:
        return CliRunner().invoke(main, ["metadata-keys", *args], env=env)

    before = cli_sources(env, "--filter", '{"updated": "2025-01-20"}')
    assert before == {"renew-permit.md"}
    indexed = keys("index", "updated", "author.name")
    assert (indexed.exit_code, indexed.stdout) == (0, "indexed updated\nindexed author.name\n")
    again = keys("index", "updated")
    assert (again.exit_code, again.stdout) == (0, "updated was indexed already\n")
    listed = keys("list", "--json")
    assert listed.exit_code == 0, listed.stderr
    # five dates, no author in the front matter; too few chunks for a value cache
    assert [(k["key"], k["values"], k["cached_values"]) for k in json.loads(listed.stdout)] == [
        ("author.name", 0, 0),
        ("updated", 5, 0),
    ]
    assert cli_sources(env, "--filter", '{"updated": "2025-01-20"}') == before
    assert cli_sources(env, "--filter", "updated>=2025-01-01") == SINCE_2025
    stats = CliRunner().invoke(main, ["stats"], env=env)
    assert "indexed metadata keys: author.name, updated\n" in stats.stdout, stats.stderr
    bad = keys("index", "a..b")
    assert bad.exit_code == 1 and 'the key "a..b"' in bad.stderr and "empty part" in bad.stderr
    removed = keys("unindex", "updated", "author.name")
    assert (removed.exit_code, removed.stdout) == (0, "unindexed updated\nunindexed author.name\n")
    missing = keys("unindex", "updated")
    assert missing.exit_code == 1 and "not indexed: updated" in missing.stderr
    assert keys("list").stdout == ""
    stats = CliRunner().invoke(main, ["stats", "--json"], env=env)
    assert json.loads(stats.stdout)["indexed_metadata_keys"] == []


def test_recency_puts_the_newest_page_first(env: dict[str, str]) -> None:
    # a 30-day half-life: five months between the two newest pages is a factor of 2^-5
    result = cli(env, "--json", "--recency", "30 days", "--recency-key", "updated")
    assert result.exit_code == 0, result.stderr
    chunks = json.loads(result.stdout)["chunks"]
    assert Path(chunks[0]["source"]).name == "residential-permits.md"
    bad = cli(env, "--recency", "soon")
    assert bad.exit_code == 1 and "soon" in bad.stderr


def test_facets_count_the_match_set_by_field(env: dict[str, str]) -> None:
    result = cli(
        env, "--json", "--facets", "metadata.updated,category", "--filter", "updated>=2024-01-01"
    )
    assert result.exit_code == 0, result.stderr
    facets = json.loads(result.stdout)["facets"]
    # the fields in the order asked, values with most documents (then chunks) first
    assert [f["facet"] for f in facets] == ["metadata.updated"] * 4 + ["category"]
    assert {(f["value"], f["documents"]) for f in facets[:4]} == {
        ("2024-03-15", 1),
        ("2024-09-01", 1),
        ("2025-01-20", 1),
        ("2025-06-30", 1),
    }
    assert (facets[4]["value"], facets[4]["documents"]) == ("permits", 4)
    assert all(f["chunks"] >= f["documents"] for f in facets)


@pytest.mark.parametrize(
    ("value", "code", "message"),
    [
        ('{"updated": ', 2, "the filter is not valid JSON"),
        ("no operator here", 2, "cannot read the filter"),
        ('{"updated": {"$after": "2025-01-01"}}', 1, "unknown operator $after at filter.updated"),
        ('{"updated": {"$gt": "2025-13-01"}}', 1, "is not a valid date"),
    ],
)
def test_a_bad_filter_is_refused_with_its_reason(
    env: dict[str, str], value: str, code: int, message: str
) -> None:
    result = cli(env, "--filter", value)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_http_and_mcp_take_the_same_filter(env: dict[str, str], tmp_path: Path) -> None:
    since = {"updated": {"$gte": "2025-01-01"}}
    with running_server(env, tmp_path / "serve.log") as api:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        ok = api.post(
            "/api/v1/kb/search", json={"query": QUESTION, "top": 20, "filter": since}, headers=auth
        )
        assert ok.status_code == 200, ok.text
        assert names([c["source"] for c in ok.json()["chunks"]]) == SINCE_2025
        faceted = api.post(
            "/api/v1/kb/search",
            json={"query": QUESTION, "filter": since, "facets": ["metadata.updated"]},
            headers=auth,
        ).json()["facets"]
        assert [(f["value"], f["documents"]) for f in faceted] == [
            ("2025-01-20", 1),
            ("2025-06-30", 1),
        ]
        bad = api.post(
            "/api/v1/kb/search",
            json={"query": QUESTION, "filter": {"updated": {"$gtt": 1}}},
            headers=auth,
        )
        assert bad.status_code == 422, bad.text
        assert "unknown operator $gtt at filter.updated" in bad.text
        not_an_object: httpx.Response = api.post(
            "/api/v1/kb/search", json={"query": QUESTION, "filter": "updated>2025"}, headers=auth
        )
        assert not_an_object.status_code == 422, not_an_object.text

    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        seen["ok"] = await session.call_tool(
            "search_knowledge_base", {"query": QUESTION, "top": 20, "filter": since}
        )
        seen["bad"] = await session.call_tool(
            "search_knowledge_base", {"query": QUESTION, "filter": {"updated": {"$in": []}}}
        )
        seen["recent"] = await session.call_tool(
            "search_knowledge_base",
            {
                "query": QUESTION,
                "recency": "30 days",
                "recency_key": "updated",
                "diversity": 0,
                "facets": ["metadata.updated"],
                "filter": since,
            },
        )
        seen["bad diversity"] = await session.call_tool(
            "search_knowledge_base", {"query": QUESTION, "diversity": "a lot"}
        )

    run_session(env, body, tmp_path / "mcp.log")
    structured = seen["ok"].structured_content
    assert names([c["source"] for c in structured["chunks"]]) == SINCE_2025
    recent = seen["recent"].structured_content
    # the newest page first (a 30-day half-life), the match set's dates counted
    assert Path(recent["chunks"][0]["source"]).name == "residential-permits.md"
    assert [(f["value"], f["documents"]) for f in recent["facets"]] == [
        ("2025-01-20", 1),
        ("2025-06-30", 1),
    ]
    assert seen["bad diversity"].is_error
    assert "argument 'diversity' must be a number, not a string" in (
        seen["bad diversity"].content[0].text
    )
    assert seen["bad"].is_error
    assert "$in at filter.updated holds 0 values" in seen["bad"].content[0].text
