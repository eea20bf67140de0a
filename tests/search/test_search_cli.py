"""`kbpg search`: the real command's exit codes, stdout and stderr for each case of issue 5."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import toon_format
from click.testing import CliRunner

from kbpg.cli import main
from tests.helpers import KBPG, run_kbpg
from tests.search_kb import (  # noqa: F401 - fixtures
    HOSTILE_QUERIES,
    env_for,
    kb_env,
    kb_url,
    set_foreign_space,
)


def invoke(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """In-process run (the model stays loaded between cases); exit code, stdout, stderr."""
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_default_output_is_toon(kb_env: dict[str, str]) -> None:  # noqa: F811
    proc = run_kbpg("search", "how do I renew a parking permit", env=kb_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == "chunks[5]{document,source,section,score,similarity,content_preview}:"
    assert len(lines) == 6
    decoded = toon_format.decode(proc.stdout)
    first = decoded["chunks"][0]
    assert first["document"] == "Parking permits"
    assert first["source"] == "city/parking/permits.md"
    assert 0.5 < first["similarity"] <= 1 and first["score"] == round(2 / 61, 4)
    assert first["section"] == "Parking permits > Renewing a permit"
    assert first["content_preview"].startswith("Residents renew a residential parking permit")


def test_json_output(kb_env: dict[str, str]) -> None:  # noqa: F811
    code, out, err = invoke(kb_env, "search", "renew parking permit", "--json", "--top", "3")
    assert code == 0, err
    payload = json.loads(out)
    assert set(payload) == {"context", "sources", "chunks", "stages", "facets"}
    assert len(payload["chunks"]) == 3
    chunk = payload["chunks"][0]
    for key in ("document", "source", "section", "score", "similarity", "content"):
        assert key in chunk
    for arm in ("vector_rank", "lexical_rank", "graph_rank"):
        assert arm in chunk
    assert payload["sources"][0]["source"] == "city/parking/permits.md"
    assert payload["context"].startswith("[1] Parking permits > Renewing a permit\n")


def test_context_output_is_the_json_context(kb_env: dict[str, str]) -> None:  # noqa: F811
    code, out, _ = invoke(kb_env, "search", "renew parking permit", "--context")
    assert code == 0
    _, as_json, _ = invoke(kb_env, "search", "renew parking permit", "--json")
    assert out == json.loads(as_json)["context"]
    assert "\n\nSources:\n- Parking permits: city/parking/permits.md [" in out


def test_explain_goes_to_stderr(kb_env: dict[str, str]) -> None:  # noqa: F811
    proc = run_kbpg("search", "renew parking permit", "--explain", "--top", "2", env=kb_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("chunks[2]{")
    report = toon_format.decode(proc.stderr)
    assert set(report["timings_ms"]) == {"embed", "sql", "total"}
    assert report["ranks"][0]["vector"] == 1
    assert {"vector", "lexical", "graph", "similarity"} <= set(report["ranks"][0])


def test_filters(kb_env: dict[str, str]) -> None:  # noqa: F811
    code, out, _ = invoke(
        kb_env, "search", "parking permit", "--group", "staff", "--min-similarity", "0", "--json"
    )
    assert code == 0
    assert {c["source"] for c in json.loads(out)["chunks"]} == {"staff/payroll.md"}
    code, out, _ = invoke(
        kb_env, "search", "bins", "--category", "waste", "--label", "nope", "--json"
    )
    assert code == 0 and json.loads(out)["chunks"] == []
    code, out, _ = invoke(kb_env, "search", "renew", "--label", "howto", "--top", "20", "--json")
    sources = {c["source"] for c in json.loads(out)["chunks"]}
    assert sources and sources <= {"city/parking/permits.md", "city/library/cards.md"}


def test_arm_switches(kb_env: dict[str, str]) -> None:  # noqa: F811
    code, out, _ = invoke(kb_env, "search", "renew parking permit", "--no-lexical", "--json")
    assert code == 0
    assert all(c["lexical_rank"] is None for c in json.loads(out)["chunks"])
    code, out, _ = invoke(kb_env, "search", "renew parking permit", "--graph", "--json")
    assert code == 0 and json.loads(out)["chunks"]


def test_zero_hits_is_success(kb_env: dict[str, str]) -> None:  # noqa: F811
    proc = run_kbpg("search", "qwxzv zzkj", "--min-similarity", "0.99", env=kb_env)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert toon_format.decode(proc.stdout) == {"chunks": []}
    code, out, _ = invoke(kb_env, "search", "qwxzv", "--min-similarity", "0.99", "--json")
    assert code == 0 and json.loads(out) == {
        "context": "",
        "sources": [],
        "chunks": [],
        "stages": [],
        "facets": [],
    }
    code, out, _ = invoke(kb_env, "search", "qwxzv", "--min-similarity", "0.99", "--context")
    assert (code, out) == (0, "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", ""], "the query must not be empty"),
        (["search", "   "], "the query must not be empty"),
        (["search", "permit", "--top", "0"], "--top"),
        (["search", "permit", "--bogus"], "No such option '--bogus'"),
        (["search", "permit", "--json", "--context"], "cannot be used together"),
        (["search", "permit", "--min-similarity", "2"], "--min-similarity"),
        (["search"], "Missing argument 'QUERY'"),
    ],
)
def test_usage_errors_exit_2(kb_env: dict[str, str], args: list[str], message: str) -> None:  # noqa: F811
    code, out, err = invoke(kb_env, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("Usage: ") and message in err


def test_usage_error_from_the_real_command(kb_env: dict[str, str]) -> None:  # noqa: F811
    proc = run_kbpg("search", "  ", env=kb_env)
    assert proc.returncode == 2
    assert "Usage: kbpg search" in proc.stderr and "Traceback" not in proc.stderr


def test_undecodable_argument_is_a_usage_error(kb_env: dict[str, str]) -> None:  # noqa: F811
    proc = subprocess.run(
        [KBPG.encode(), b"search", b"caf\xe9 permit"], env=kb_env, capture_output=True
    )
    assert proc.returncode == 2
    assert b"the query is not valid UTF-8 text" in proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=range(len(HOSTILE_QUERIES)))
def test_queries_are_data(kb_env: dict[str, str], query: str) -> None:  # noqa: F811
    # `--` ends the options, so that a query starting with "-" is not read as one
    code, out, err = invoke(kb_env, "search", "--json", "--", query)
    assert code == 0, err
    assert isinstance(json.loads(out)["chunks"], list)


def test_long_query_through_the_real_command(kb_env: dict[str, str]) -> None:  # noqa: F811
    proc = run_kbpg("search", "parking permit renewal " * 450, env=kb_env)  # 10,350 chars
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("chunks[")


def _one_error(stderr: str) -> tuple[str, str]:
    lines = stderr.strip().splitlines()
    assert len(lines) == 2, stderr
    assert lines[0].startswith("Error: ") and lines[1].startswith("Hint: ")
    return lines[0], lines[1]


def test_database_down(tmp_path: Path) -> None:
    url = f"postgresql://postgres@/kbpg?host={tmp_path / 'no-such-socket-dir'}"
    env = env_for(url, tmp_path / "home")
    proc = run_kbpg("search", "renew parking permit", env=env)
    assert proc.returncode == 1
    assert proc.stdout == ""
    error, hint = _one_error(proc.stderr)
    assert "cannot connect to PostgreSQL" in error
    assert "KBPG_DATABASE_URL" in hint
    debug = run_kbpg("--debug", "search", "renew parking permit", env=env)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_schema_not_migrated(new_database: Callable[..., str], tmp_path: Path) -> None:
    env = env_for(new_database(migrated=False), tmp_path / "home")
    proc = run_kbpg("search", "renew parking permit", env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    error, hint = _one_error(proc.stderr)
    assert "kbpg schema missing" in error
    assert hint == "Hint: run `kbpg db upgrade`"


def test_model_mismatch(db_url: str, tmp_path: Path) -> None:
    set_foreign_space(db_url, "text-embedding-3-small", 1536)
    env = env_for(db_url, tmp_path / "home", KBPG_EMBEDDER="minilm")
    proc = run_kbpg("search", "renew parking permit", env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    error, hint = _one_error(proc.stderr)
    assert "text-embedding-3-small" in error and "all-MiniLM-L6-v2" in error
    assert "--embedder openai" in hint and "kbpg reembed --embedder minilm" in hint


def test_help_lists_every_option() -> None:
    result = CliRunner().invoke(main, ["search", "--help"])
    assert result.exit_code == 0
    for option in ("--top", "--group", "--category", "--label", "--min-similarity", "--graph",
                   "--no-lexical", "--explain", "--json", "--context"):  # fmt: skip
        assert option in result.stdout


def test_unknown_embedder(kb_env: dict[str, str]) -> None:  # noqa: F811
    code, out, err = invoke(kb_env, "search", "permit", "--embedder", "nope")
    assert (code, out) == (1, "")
    assert err.startswith("Error: unknown embedder 'nope'\nHint: ")


def test_lexical_arm_follows_the_environment(kb_env: dict[str, str]) -> None:  # noqa: F811
    env = {**kb_env, "KBPG_HYBRID_LEXICAL_ENABLED": "false"}
    code, out, _ = invoke(env, "search", "renew parking permit", "--json")
    assert code == 0
    assert all(c["lexical_rank"] is None for c in json.loads(out)["chunks"])
    code, out, _ = invoke(env, "search", "renew parking permit", "--lexical", "--json")
    assert code == 0
    assert any(c["lexical_rank"] is not None for c in json.loads(out)["chunks"])
