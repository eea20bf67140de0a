"""Least privilege is the tested default: kbpg run by a login role that owns its database and
is not superuser, with pgvector created once by an administrator (README "Using your own
PostgreSQL"). Migrations, ingest, search (CLI, psql), serve and eval; and the hints a DBA gets
when a grant is missing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from kbpg import db as kdb
from tests.helpers import clean_env, run_kbpg
from tests.production import REPO

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
