"""`kbpg access` and every reading command, run as real login roles against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.accessdata import url_as, write_files
from tests.helpers import run_kbpg


@pytest.fixture
def kb(
    admin_url: str, db_url: str, cli_env: dict[str, str], tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """Three documents ingested by the owner (public, hr, finance) and two login readers."""
    import psycopg

    from tests.accessdata import login_roles

    write_files(tmp_path / "docs")
    for folder, group in (("public", None), ("hr", "hr"), ("finance", "finance")):
        args = ["ingest", str(tmp_path / "docs" / folder)] + (["--group", group] if group else [])
        done = run_kbpg(*args, env=cli_env)
        assert done.returncode == 0, done.stderr
    with (
        login_roles(admin_url, ["alice", "bob"]) as roles,
        psycopg.connect(db_url, autocommit=True) as conn,
    ):
        row = conn.execute("select reader_role from kb.access_settings").fetchone()
        assert row is not None
        conn.execute(f'grant "{row[0]}" to "{roles["alice"]}", "{roles["bob"]}"')
        yield {
            "roles": roles,
            "owner": cli_env,
            "alice": dict(cli_env, KBPG_DATABASE_URL=url_as(db_url, roles["alice"])),
            "bob": dict(cli_env, KBPG_DATABASE_URL=url_as(db_url, roles["bob"])),
        }


def kbpg_ok(*args: str, env: dict[str, str]) -> str:
    done = run_kbpg(*args, env=env)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def sources(env: dict[str, str], query: str) -> set[str]:
    """The files a `kbpg search --json` returns chunks from."""
    data = json.loads(kbpg_ok("search", query, "--json", "--top", "10", env=env))
    return {Path(c["source"]).name for c in data["chunks"]}


def test_grants_enforced_through_every_command(kb: dict[str, Any]) -> None:
    alice, bob, owner = kb["alice"], kb["bob"], kb["owner"]
    roles = kb["roles"]
    out = kbpg_ok("access", "grant", roles["alice"], "hr", env=owner)
    assert out == f"granted hr to {roles['alice']}\n"
    kbpg_ok("access", "grant", roles["bob"], "finance", env=owner)
    query = "salary parking budget permit review"

    # off: everybody sees everything, as before
    assert sources(alice, query) == {"parking.md", "salary.md", "budget.md"}

    out = kbpg_ok("access", "enable", env=owner)
    assert "enforced: on (4/4 tables)" in out
    assert sources(alice, query) == {"parking.md", "salary.md"}
    assert sources(bob, query) == {"parking.md", "budget.md"}
    assert sources(owner, query) == {"parking.md", "salary.md", "budget.md"}
    # asking for a group alice may not read: nothing from it, no error
    data = json.loads(kbpg_ok("search", query, "--json", "--group", "finance", env=alice))
    assert data["chunks"] == []

    listed = json.loads(kbpg_ok("documents", "list", "--json", env=alice))
    assert {Path(d["source"]).name for d in listed} == {"parking.md", "salary.md"}
    stats = json.loads(kbpg_ok("stats", "--json", env=bob))
    assert stats["documents"] == 2
    assert stats["indexed_metadata_keys"] is None  # not a reader's to read
    assert json.loads(kbpg_ok("stats", "--json", env=owner))["indexed_metadata_keys"] == []

    grants = json.loads(kbpg_ok("access", "list", "--json", env=alice))
    assert [(g["role"], g["group"]) for g in grants] == [(roles["alice"], "hr")]
    status = json.loads(kbpg_ok("access", "status", "--json", env=alice))
    assert status["enforced"] is True and status["visible_groups"] == ["hr"]

    # revoking takes effect on the next command
    out = kbpg_ok("access", "revoke", roles["alice"], "hr", env=owner)
    assert out == f"revoked hr from {roles['alice']}\n"
    assert sources(alice, query) == {"parking.md"}

    out = kbpg_ok("access", "disable", env=owner)
    assert "enforced: off (0/4 tables)" in out
    assert sources(alice, query) == {"parking.md", "salary.md", "budget.md"}


def test_readers_cannot_change_access_and_say_why(kb: dict[str, Any]) -> None:
    done = run_kbpg("access", "enable", env=kb["alice"])
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("Error: must be owner of table")
    assert "Hint: run it as the owner of the kb tables" in done.stderr
    done = run_kbpg("access", "grant", kb["roles"]["alice"], "finance", env=kb["alice"])
    assert done.returncode == 1
    assert "permission denied for table access_grants" in done.stderr


def test_bad_access_commands(kb: dict[str, Any]) -> None:
    done = run_kbpg("access", "grant", "no_such_role_kbpg", "hr", env=kb["owner"])
    assert done.returncode == 1
    assert 'Error: role "no_such_role_kbpg" does not exist' in done.stderr
    done = run_kbpg("access", "revoke", kb["roles"]["alice"], env=kb["owner"])
    assert done.returncode == 2
    assert "give GROUPS or --all" in done.stderr
    assert kbpg_ok("access", "list", "--json", env=kb["owner"]) == "[]\n"
