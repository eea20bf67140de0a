"""`kbpg db ...` run as a user runs it: exit codes, stdout, stderr."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import psycopg
import pytest

from kbpg.app import KnowledgeBase, Principal
from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer
from tests.helpers import KBPG, clean_env, run_kbpg
from tests.release_fixtures import REPO

SAMPLES = REPO / "samples" / "kb"
UNREACHABLE = "postgresql://postgres@/kbpg?host=/nonexistent-kbpg-socket-dir&port=5432"


def test_version() -> None:
    result = run_kbpg("--version", env=clean_env())
    assert result.returncode == 0
    assert result.stdout.startswith("kbpg, version ")


def test_url_prints_the_external_database(db_url: str) -> None:
    result = run_kbpg("db", "url", env=clean_env(KBPG_DATABASE_URL=db_url))
    assert result.returncode == 0
    assert result.stdout.strip() == db_url


def test_unmigrated_database_lifecycle(new_database) -> None:
    env = clean_env(KBPG_DATABASE_URL=new_database(migrated=False))

    current = run_kbpg("db", "current", env=env)
    assert (current.returncode, current.stdout.strip()) == (0, "none")

    check = run_kbpg("db", "check", env=env)
    assert check.returncode == 1
    assert check.stdout == ""
    assert "Error: this database has no kbpg schema" in check.stderr
    assert "run `kbpg db upgrade`" in check.stderr

    upgrade = run_kbpg("db", "upgrade", env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stdout.strip() == f"schema at {kdb.head_revision()} (head)"

    check = run_kbpg("db", "check", env=env)
    assert (check.returncode, check.stdout.strip()) == (
        0,
        f"schema at head ({kdb.head_revision()})",
    )

    status = run_kbpg("db", "status", env=env)
    assert status.returncode == 0
    assert "database: external (KBPG_DATABASE_URL)" in status.stdout
    assert "pgvector: 0." in status.stdout
    assert f"schema: {kdb.head_revision()} (head {kdb.head_revision()}, at head)" in status.stdout

    down = run_kbpg("db", "downgrade", "base", env=env)
    assert (down.returncode, down.stdout.strip()) == (0, "schema at base")
    assert run_kbpg("db", "current", env=env).stdout.strip() == "none"


@pytest.mark.parametrize(
    "args", [("db", "check"), ("db", "current"), ("db", "upgrade"), ("db", "status")]
)
def test_unreachable_database_is_one_clear_line(args: tuple[str, ...]) -> None:
    result = run_kbpg(*args, env=clean_env(KBPG_DATABASE_URL=UNREACHABLE), timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: cannot connect to PostgreSQL")
    assert all(line.startswith(("Error:", "Hint:")) for line in lines)


def test_debug_shows_the_traceback() -> None:
    result = run_kbpg("--debug", "db", "check", env=clean_env(KBPG_DATABASE_URL=UNREACHABLE))
    assert result.returncode == 1
    assert "Traceback" in result.stderr


def test_unknown_command_is_a_usage_error() -> None:
    result = run_kbpg("db", "frobnicate", env=clean_env())
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_psql_runs_on_the_database(db_url: str) -> None:
    result = run_kbpg(
        "db",
        "psql",
        "-At",
        "-c",
        "select count(*) from kb.chunks",
        env=clean_env(KBPG_DATABASE_URL=db_url),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_embedded_server_start_status_stop(kbpg_home: Path) -> None:
    env = clean_env(KBPG_HOME=str(kbpg_home))
    status = run_kbpg("db", "status", env=env)
    assert status.returncode == 0
    assert "server: not initialised" in status.stdout

    start = run_kbpg("db", "start", "--prewarm", env=env)
    assert start.returncode == 0, start.stderr
    url = start.stdout.strip()
    assert url.startswith("postgresql://kbpg@/kbpg?host=")
    assert "not prewarmed: kb.prewarm() is missing, run `kbpg db upgrade`" in start.stderr

    upgrade = run_kbpg("db", "upgrade", env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    status = run_kbpg("db", "status", env=env)
    assert "server: running" in status.stdout
    assert "postgresql: 18." in status.stdout
    assert "at head" in status.stdout
    assert run_kbpg("db", "url", env=env).stdout.strip() == url

    assert run_kbpg("db", "stop", env=env).stdout.strip() == "stopped"
    # after a restart: kbpg's relations loaded again (pg_prewarm ships with the embedded server)
    start = run_kbpg("db", "start", "--prewarm", env=env)
    assert start.returncode == 0, start.stderr
    assert start.stdout.strip() == url
    assert re.search(r"prewarmed [\d,]+ MB into shared buffers in [\d.]+ s", start.stderr)
    assert run_kbpg("db", "stop", env=env).stdout.strip() == "stopped"
    assert run_kbpg("db", "stop", env=env).stdout.strip() == "not running"
    assert "server: stopped" in run_kbpg("db", "status", env=env).stdout


def test_commands_start_the_embedded_server_on_demand(kbpg_home: Path) -> None:
    env = clean_env(KBPG_HOME=str(kbpg_home))
    check = run_kbpg("db", "check", env=env)
    assert check.returncode == 1
    assert "run `kbpg db upgrade`" in check.stderr
    assert EmbeddedServer(kbpg_home).status().running


def test_server_commands_refuse_when_an_external_url_is_set(db_url: str) -> None:
    result = run_kbpg("db", "start", env=clean_env(KBPG_DATABASE_URL=db_url))
    assert result.returncode == 1
    assert "KBPG_DATABASE_URL is set" in result.stderr


def test_upgrade_an_external_postgresql_by_url(kbpg_home: Path) -> None:
    """A second embedded server on another data dir, reached only through its URL."""
    other = EmbeddedServer(kbpg_home / "other")
    url = other.start()
    try:
        env = clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(kbpg_home / "unused"))
        result = run_kbpg("db", "upgrade", env=env)
        assert result.returncode == 0, result.stderr
        assert run_kbpg("db", "check", env=env).returncode == 0
        assert not (kbpg_home / "unused").exists(), "no embedded server was started"
    finally:
        other.stop()


def test_first_use_of_the_embedded_server_creates_the_schema(kbpg_home: Path) -> None:
    """A fresh KBPG_HOME: ingest and search work with no `kbpg db upgrade` (the embedded
    server is kbpg's own); two first commands at once both succeed, one creating the schema."""
    env = clean_env(KBPG_HOME=str(kbpg_home))
    first = [
        subprocess.Popen(
            [KBPG, "documents", "list", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in first:
        out, err = proc.communicate(timeout=300)
        assert (proc.returncode, json.loads(out or "null")) == (0, []), err
    ingest = run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env)
    assert ingest.returncode == 0, ingest.stderr
    found = run_kbpg("search", "how do I renew a parking permit", "--json", env=env)
    assert found.returncode == 0, found.stderr
    assert Path(json.loads(found.stdout)["chunks"][0]["source"]).name == "renew-permit.md"
    assert run_kbpg("db", "current", env=env).stdout.strip() == kdb.head_revision()


def _owners(url: str) -> dict[str, object]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select current_user::text, r.rolsuper, r.rolcreatedb, r.rolcreaterole,"
            " r.rolreplication, r.rolbypassrls,"
            " (select nspowner::regrole::text from pg_namespace where nspname = 'kb'),"
            " (select count(*) from pg_class where relnamespace = 'kb'::regnamespace"
            "   and relowner <> current_user::regrole),"
            " (select count(*) from pg_proc where pronamespace = 'kb'::regnamespace"
            "   and proowner <> current_user::regrole)"
            " from pg_roles r where r.rolname = current_user"
        ).fetchone()
    assert row is not None
    keys = ("role", "super", "createdb", "createrole", "replication", "bypassrls", "kb owner",
            "kb relations of another owner", "kb functions of another owner")  # fmt: skip
    return dict(zip(keys, row, strict=True))


OWNED = {
    "role": "kbpg",
    "super": False,
    "createdb": True,
    "createrole": True,
    "replication": False,
    "bypassrls": False,
    "kb owner": "kbpg",
    "kb relations of another owner": 0,
    "kb functions of another owner": 0,
}


def test_the_embedded_server_s_owner_is_no_superuser(kbpg_home: Path) -> None:
    """Issue 38: every kbpg command on the embedded server connects as `kbpg`, which owns
    schema kb and is no superuser, so that no SECURITY DEFINER function of kbpg's (a table
    source's trigger included) runs with the server's rights; an application role kbpg's
    owner made cannot be made a superuser through it."""
    env = clean_env(KBPG_HOME=str(kbpg_home))
    assert run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env).returncode == 0
    url = run_kbpg("db", "url", env=env).stdout.strip()
    assert _owners(url) == OWNED
    # what the owner still does on its own server: roles for access control and an application
    # table with a source (the trigger's rights are the owner's, not a superuser's)
    assert run_kbpg("access", "setup", env=env).returncode == 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create role kbpg_test_app login")
        try:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("alter role kbpg_test_app superuser")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("copy (select 1) to program 'true'")
            # a role it made is one it may act as (tokens, Principal: SET LOCAL ROLE) without
            # inheriting its rights
            conn.execute("set role kbpg_test_app")
            assert conn.execute("select current_user").fetchone() == ("kbpg_test_app",)
            conn.execute("reset role")
            assert conn.execute(
                "select bool_or(m.inherit_option), bool_or(m.set_option), bool_or(m.admin_option)"
                " from pg_auth_members m"
                " where m.roleid = 'kbpg_test_app'::regrole and m.member = 'kbpg'::regrole"
            ).fetchone() == (False, True, True)
        finally:
            conn.execute("drop role kbpg_test_app")


def test_only_the_server_s_own_user_may_open_its_socket(kbpg_home: Path) -> None:
    """The socket's authentication is `trust`: its file is 0700 (the OS user the server runs
    as; root, kbpg's user when the server runs as kbpg-postgres, passes by its capabilities).
    A home whose path is too long for a socket puts it in a directory of its own under /tmp,
    which any user may traverse: under root the socket was 0777 there, so any local user could
    log in as the server's superuser."""
    home = kbpg_home / ("h" * 90)
    home.mkdir()
    home.chmod(0o755)
    server = EmbeddedServer(home)
    try:
        url = server.start()
        socket_dir = Path(unquote(url.split("host=", 1)[1].split("&", 1)[0]))
        assert socket_dir != server.pgdata  # the long path's own socket directory
        socket = socket_dir / ".s.PGSQL.5432"
        assert socket.is_socket()
        assert socket.stat().st_mode & 0o777 == 0o700
    finally:
        server.stop()


def test_a_server_made_before_hands_its_objects_to_the_owner(kbpg_home: Path) -> None:
    """A server an earlier kbpg made: the superuser owns schema kb, the roles and your tables.
    The next command hands them to `kbpg` (and ADMIN over the roles), and everything keeps
    working as before: the same ranked results, grants, a table source's sync."""
    server = EmbeddedServer(kbpg_home)
    superuser = server.start()  # what kbpg connected as before
    before = clean_env(KBPG_HOME=str(kbpg_home), KBPG_DATABASE_URL=superuser)
    assert run_kbpg("db", "upgrade", env=before).returncode == 0
    assert run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=before).returncode == 0
    assert run_kbpg("access", "setup", env=before).returncode == 0
    with psycopg.connect(superuser, autocommit=True) as conn:
        conn.execute("create role kbpg_test_bob login in role kbpg_reader")
        conn.execute("create table public.articles (id int primary key, body text not null)")
        conn.execute("insert into public.articles values (1, 'Bins are collected on Tuesdays.')")
        conn.execute("select kb.add_table_source('articles', 'public.articles', text => 'body')")
    try:
        assert run_kbpg("sync", env=before).returncode == 0
        query = ("search", "how do I renew a parking permit", "--json")
        ranked_before = json.loads(run_kbpg(*query, env=before).stdout)["chunks"]

        after = clean_env(KBPG_HOME=str(kbpg_home))
        ranked_after = json.loads(run_kbpg(*query, env=after).stdout)["chunks"]
        assert [c["chunk_id"] for c in ranked_after] == [c["chunk_id"] for c in ranked_before]
        url = run_kbpg("db", "url", env=after).stdout.strip()
        assert _owners(url) == OWNED
        grant = run_kbpg("access", "grant", "kbpg_test_bob", "parking", env=after)
        assert grant.returncode == 0, grant.stderr
        # bob's searches through kbpg (a token's, a Principal's: SET LOCAL ROLE) as before
        with KnowledgeBase(url, pool_size=1) as kb:
            found = kb.search("renew parking permit", principal=Principal("kbpg_test_bob"))
        assert Path(found.chunks[0].source).name == "renew-permit.md"
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute(
                "select relowner::regrole::text from pg_class where oid = 'public.articles'::regclass"
            ).fetchone() == ("kbpg",)
            conn.execute("insert into public.articles values (2, 'Bins go out on Monday night.')")
        synced = run_kbpg("sync", env=after)
        assert synced.returncode == 0, synced.stderr
        documents = json.loads(run_kbpg("documents", "list", "--json", env=after).stdout)
        assert {d["source"] for d in documents} >= {"table:articles/1", "table:articles/2"}
    finally:
        with psycopg.connect(superuser, autocommit=True) as conn:
            conn.execute("drop role if exists kbpg_test_bob")


def test_first_use_of_the_embedded_server_takes_kbpg_language(kbpg_home: Path) -> None:
    """KBPG_LANGUAGE on a fresh KBPG_HOME: the schema is created in that language, so ingest
    neither stops at "KBPG_LANGUAGE is german, but this knowledge base is in english" nor needs
    `kbpg db upgrade --language`."""
    env = clean_env(KBPG_HOME=str(kbpg_home), KBPG_LANGUAGE="german")
    ingest = run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env)
    assert ingest.returncode == 0, ingest.stderr
    assert "this knowledge base is in english" not in ingest.stderr
    stats = json.loads(run_kbpg("stats", "--json", env=env).stdout)
    assert (stats["language"], stats["documents"]) == ("german", 5)


def test_a_database_of_your_own_is_never_migrated_by_ingest(new_database) -> None:
    env = clean_env(KBPG_DATABASE_URL=new_database(migrated=False))
    ingest = run_kbpg("ingest", str(SAMPLES / "parking"), "--recursive", env=env)
    assert ingest.returncode == 1
    assert "Hint: run `kbpg db upgrade`" in ingest.stderr
    assert run_kbpg("db", "current", env=env).stdout.strip() == "none"
