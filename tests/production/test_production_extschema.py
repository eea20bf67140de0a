"""pgvector in another schema than public (Supabase keeps extensions in `extensions`), not on
the role's search_path: upgrade, ingest, hybrid search from the CLI, and kb.search from psql."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from kbpg.store.embedded import _binaries_dir
from tests.helpers import clean_env, run_kbpg
from tests.release_fixtures import REPO

pytestmark = pytest.mark.least_privilege


def _ok(*args: str, env: dict[str, str]) -> str:
    result = run_kbpg(*args, env=env)
    assert result.returncode == 0, f"kbpg {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_vector_in_schema_extensions_end_to_end(
    owned_database: Callable[..., str], tmp_path: Path
) -> None:
    url = owned_database(vector_schema="extensions")
    with psycopg.connect(url) as conn:
        assert "extensions" not in conn.execute("show search_path").fetchone()[0]  # type: ignore[index]
        assert conn.execute("select to_regtype('vector')").fetchone() == (None,)
    env = clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(tmp_path / "home"))
    for _ in range(2):
        assert "(head)" in _ok("db", "upgrade", env=env)
    _ok("ingest", str(REPO / "samples" / "kb"), "--recursive", env=env)
    hits = json.loads(_ok("search", "how do I renew a parking permit", "--json", env=env))
    assert hits["chunks"][0]["source"].endswith("parking/renew-permit.md")
    assert hits["chunks"][0]["similarity"] is not None  # the vector arm ran

    with psycopg.connect(url) as conn:
        column = conn.execute(
            "select format_type(atttypid, atttypmod) from pg_attribute"
            " where attrelid = 'kb_data.chunks'::regclass and attname = 'embedding'"
        ).fetchone()
        assert column == ("extensions.vector",)  # untyped: each knowledge base its dimension
        assert conn.execute(
            "select to_regprocedure('public.vector_in(cstring,oid,integer)')"
        ).fetchone() == (None,)

    literal = _ok("embed", "how do I renew a parking permit", env=env).strip()
    psql = subprocess.run(
        [
            str(_binaries_dir() / "psql"),
            url,
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            f"q={literal}",
            "-f",
            "-",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        input="select source, vector_rank is not null from kb.search("
        "'how do I renew a parking permit', :'q', match_count => 1);\n"
        "select source from kb.search('renew parking permit', match_count => 1);\n",
    )
    assert psql.returncode == 0, psql.stderr
    lines = psql.stdout.split()
    assert lines[0].endswith("parking/renew-permit.md|t"), psql.stdout
    assert lines[1].endswith("parking/renew-permit.md"), psql.stdout
