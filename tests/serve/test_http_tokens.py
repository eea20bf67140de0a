"""HTTP per token (issue 11): each token of a tokens file runs as its database role, so row-level
security decides what it sees; a body's `groups` narrows, never widens; KBPG_API_TOKEN still
works; the file holds hashes only and is re-read when it changes."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from kbpg.models.embedders import Embedder
from kbpg.serve.tokens import hash_token, parse_tokens, token_line
from kbpg.store import db as kdb
from tests.conftest import TEMPLATE_DB, create_database, drop_database
from tests.helpers import KBPG, run_kbpg
from tests.http_server import free_port, running_server
from tests.search_kb import env_for, load_kb

SEARCH = "/api/v1/kb/search"
ADMIN_TOKEN = "admin-token-for-the-server-role"
PUBLIC_TOKEN = "token-of-the-public-role"
GHOST_TOKEN = "token-of-a-role-that-does-not-exist"
QUERY = {"query": "staff salary pay dates parking permit", "top": 20, "min_similarity": 0.0}
STAFF_ONLY = "staff/payroll.md"


@dataclass
class Setup:
    api: httpx.Client
    url: str
    roles: dict[str, str]
    tokens_file: Path
    staff_token: str


@pytest.fixture(scope="module")
def setup(
    admin_url: str,
    template_url: str,
    embedder: Embedder,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    """DOCS with access control on; roles `public` (group public) and `staff` (public, staff),
    `outsider` (no kbpg_reader); a tokens file with a token per role; `kbpg serve` on it."""
    name = f"kbpg_tokens_{uuid.uuid4().hex[:10]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    suffix = uuid.uuid4().hex[:8]
    roles = {who: f"kbt_{who}_{suffix}" for who in ("public", "staff", "outsider", "ghost")}
    home = tmp_path_factory.mktemp("kbpg-tokens")
    try:
        load_kb(url, embedder)
        with psycopg.connect(url, autocommit=True) as conn:
            for who, role in roles.items():
                if who != "ghost":
                    conn.execute(f'create role "{role}" nologin')
            row = conn.execute("select reader_role from kb.access_settings").fetchone()
            assert row is not None and row[0]
            conn.execute(f'grant "{row[0]}" to "{roles["public"]}", "{roles["staff"]}"')
            # the access helper's SQL API, as a DBA would run it from psql
            conn.execute("select kb.grant_groups(%s, array['public'])", (roles["public"],))
            conn.execute("select kb.grant_groups(%s, array['public', 'staff'])", (roles["staff"],))
            # a second knowledge base (readers: granted), the same documents: staff reads it
            row = conn.execute("select kb.create_knowledge_base('handbook')").fetchone()
            assert row is not None
            load_kb(kdb.in_knowledge_base(url, row[0]), embedder)
            conn.execute("select set_config('kbpg.kb_id', %s, false)", (str(row[0]),))
            conn.execute("select kb.grant_groups(%s, array['public', 'staff'])", (roles["staff"],))
            conn.execute("select set_config('kbpg.kb_id', '', false)")
            conn.execute("select kb.access_enable()")
        tokens_file = home / "tokens"
        tokens_file.write_text(
            "# kbpg serve tokens: <sha256 hex> <role>\n"
            + token_line(PUBLIC_TOKEN, roles["public"], "public web widget")
            + "\n"
            + token_line("outsider-token", roles["outsider"])
            + "\n"
            + token_line(GHOST_TOKEN, roles["ghost"])  # a role that was never created
            + "\n"
        )
        env = env_for(url, home)
        made = run_kbpg("token", "new", roles["staff"], "--file", str(tokens_file), env=env)
        assert made.returncode == 0, made.stderr
        staff_token = made.stdout.strip()
        assert staff_token.startswith("kbpg_") and len(staff_token) > 40
        assert staff_token not in tokens_file.read_text()  # only its hash is stored
        assert hash_token(staff_token) in tokens_file.read_text()
        env = env_for(url, home, KBPG_API_TOKEN=ADMIN_TOKEN)
        with running_server(env, home / "serve.log", "--tokens-file", str(tokens_file)) as api:
            yield Setup(api, url, roles, tokens_file, staff_token)
    finally:
        drop_database(admin_url, name)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role in roles.values():
                conn.execute(f'drop role if exists "{role}"')


def search(setup: Setup, token: str, **extra: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return setup.api.post(SEARCH, json={**QUERY, **extra}, headers=headers)


def sources(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {c["source"] for c in response.json()["chunks"]}


ALL = {
    "city/parking/permits.md",
    "city/parking/fines.md",
    "city/waste/collection.md",
    "staff/payroll.md",
    "city/library/cards.md",
}


def test_each_token_sees_exactly_its_groups(setup: Setup) -> None:
    assert sources(search(setup, setup.staff_token)) == ALL
    assert sources(search(setup, PUBLIC_TOKEN)) == ALL - {STAFF_ONLY}


def test_groups_in_the_body_narrow_but_never_widen(setup: Setup) -> None:
    widened = search(setup, PUBLIC_TOKEN, groups=["staff"])
    assert widened.json() == {
        "context": "",
        "sources": [],
        "chunks": [],
        "stages": [],
        "facets": [],
    }
    assert sources(search(setup, PUBLIC_TOKEN, groups=["staff", "public"])) == ALL - {STAFF_ONLY}
    assert sources(search(setup, setup.staff_token, groups=["staff"])) == {STAFF_ONLY}
    assert STAFF_ONLY not in sources(search(setup, setup.staff_token, groups=["public"]))


def test_the_single_api_token_keeps_working(setup: Setup) -> None:
    # KBPG_API_TOKEN runs as the server's own login role (here the owner: sees everything)
    assert sources(search(setup, ADMIN_TOKEN)) == ALL


@pytest.mark.parametrize("token", ["wrong", PUBLIC_TOKEN + "x", hash_token(PUBLIC_TOKEN)])
def test_unknown_tokens_are_refused(setup: Setup, token: str) -> None:
    response = search(setup, token)
    assert response.status_code == 401
    assert response.json()["error"] == "Unauthorized"


def test_a_role_without_search_rights_is_403_without_internals(setup: Setup) -> None:
    response = search(setup, "outsider-token")
    assert response.status_code == 403
    assert response.json() == {
        "error": "PermissionDenied",
        "message": "this token may not search this knowledge base",
        "hint": "ask the server's operator to grant the token's role kbpg_reader",
    }


def test_a_token_reads_another_knowledge_base_only_with_a_grant_there(setup: Setup) -> None:
    """The path /api/v1/kb/{name}/search and the body's `kb` search another knowledge base as
    the token's role; a token whose role holds no grant there is told it does not exist."""
    staff = {"Authorization": f"Bearer {setup.staff_token}"}
    in_default = search(setup, setup.staff_token).json()["chunks"]
    by_path = setup.api.post("/api/v1/kb/handbook/search", json=QUERY, headers=staff)
    by_body = setup.api.post(SEARCH, json={**QUERY, "kb": "handbook"}, headers=staff)
    assert sources(by_path) == ALL
    assert by_body.json() == by_path.json()
    # the same documents, so the same ranking, of handbook's own chunks
    handbook = by_path.json()["chunks"]
    assert [c["source"] for c in handbook] == [c["source"] for c in in_default]
    assert not {c["chunk_id"] for c in handbook} & {c["chunk_id"] for c in in_default}

    public = {"Authorization": f"Bearer {PUBLIC_TOKEN}"}
    for name in ("handbook", "nothing"):
        refused = setup.api.post(f"/api/v1/kb/{name}/search", json=QUERY, headers=public)
        assert refused.status_code == 404
        assert refused.json() == {
            "error": "NotFound",
            "message": f'no knowledge base "{name}"',
            "hint": "kbpg kb list (select * from kb.knowledge_bases()) names them; kbpg kb "
            "create makes one",
        }
    both = setup.api.post(
        "/api/v1/kb/handbook/search", json={**QUERY, "kb": "default"}, headers=staff
    )
    assert both.status_code == 422
    assert both.json()["message"] == "the path names knowledge base 'handbook', the body 'default'"
    assert sources(search(setup, PUBLIC_TOKEN)) == ALL - {STAFF_ONLY}  # its own goes on


def test_a_token_searches_across_the_knowledge_bases_its_role_reads(setup: Setup) -> None:
    """`kbs` in the body: one ranking across knowledge bases of one embedding space, each chunk
    and source naming its own; one the token's role may not read is not found; `kbs` beside a
    knowledge base in the path or `kb` is refused."""
    staff = {"Authorization": f"Bearer {setup.staff_token}"}
    own = {
        name: {
            c["chunk_id"]
            for c in setup.api.post(SEARCH, json={**QUERY, "kb": name}, headers=staff).json()[
                "chunks"
            ]
        }
        for name in ("default", "handbook")
    }
    across = setup.api.post(SEARCH, json={**QUERY, "kbs": ["default", "handbook"]}, headers=staff)
    assert across.status_code == 200, across.text
    chunks = across.json()["chunks"]
    assert len(chunks) == QUERY["top"]
    assert {c["knowledge_base"] for c in chunks} == {"default", "handbook"}
    for chunk in chunks:  # each labelled with the knowledge base its own search finds it in
        assert chunk["chunk_id"] in own[chunk["knowledge_base"]]
    assert {(s["knowledge_base"], s["source"]) for s in across.json()["sources"]} == {
        (c["knowledge_base"], c["source"]) for c in chunks
    }
    assert "(handbook)" in across.json()["context"]

    public = {"Authorization": f"Bearer {PUBLIC_TOKEN}"}
    refused = setup.api.post(SEARCH, json={**QUERY, "kbs": ["default", "handbook"]}, headers=public)
    assert refused.status_code == 404 and refused.json()["error"] == "NotFound"
    for path, extra in (("/api/v1/kb/handbook/search", {}), (SEARCH, {"kb": "handbook"})):
        both = setup.api.post(
            path, json={**QUERY, **extra, "kbs": ["default", "handbook"]}, headers=staff
        )
        assert both.status_code == 422
        assert both.json()["message"].startswith("kbs names the knowledge bases of a search")
    graph = setup.api.post(
        SEARCH, json={**QUERY, "kbs": ["default", "handbook"], "graph": True}, headers=staff
    )
    assert graph.status_code == 422
    assert graph.json()["message"] == "a search across knowledge bases does not take graph"


def test_a_token_whose_role_does_not_exist_is_403_and_logged(setup: Setup) -> None:
    """A server configuration error, not a bad request (it was 422 "check the request's
    values"): the client learns nothing of roles, the server log names the role."""
    response = search(setup, GHOST_TOKEN)
    assert response.status_code == 403
    assert response.json() == {
        "error": "RoleUnavailable",
        "message": "this token's database role cannot be used by the server",
        "hint": "the server's operator must fix the token's role (the server log names it)",
    }
    log = (setup.tokens_file.parent / "serve.log").read_text()
    assert f"RoleUnavailable (403): role '{setup.roles['ghost']}' does not exist" in log
    assert sources(search(setup, PUBLIC_TOKEN)) == ALL - {STAFF_ONLY}  # others go on


def test_the_tokens_file_is_reread_when_it_changes(setup: Setup) -> None:
    late = "a-token-added-while-serving"
    original = setup.tokens_file.read_text()
    try:
        setup.tokens_file.write_text(original + token_line(late, setup.roles["public"]) + "\n")
        assert sources(search(setup, late)) == ALL - {STAFF_ONLY}
        # a revoked token (line removed) is refused on the next request
        setup.tokens_file.write_text(original.replace(hash_token(PUBLIC_TOKEN), "0" * 64))
        assert search(setup, PUBLIC_TOKEN).status_code == 401
        # a broken file keeps the previous entries (and says so in the log)
        setup.tokens_file.write_text("not a hash line\n")
        assert search(setup, setup.staff_token).status_code == 200
    finally:
        setup.tokens_file.write_text(original)
    assert sources(search(setup, PUBLIC_TOKEN)) == ALL - {STAFF_ONLY}


def test_revoking_a_group_takes_effect_on_the_next_request(setup: Setup) -> None:
    with psycopg.connect(setup.url, autocommit=True) as conn:
        conn.execute("select kb.revoke_groups(%s, array['staff'])", (setup.roles["staff"],))
        try:
            assert sources(search(setup, setup.staff_token)) == ALL - {STAFF_ONLY}
        finally:
            conn.execute("select kb.grant_groups(%s, array['staff'])", (setup.roles["staff"],))
    assert sources(search(setup, setup.staff_token)) == ALL


def test_a_bad_tokens_file_stops_serve_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "tokens"
    bad.write_text(token_line("ok-token", "reader") + "\nsecret-token-in-clear reader\n")
    proc = subprocess.run(
        [KBPG, "serve", "--port", str(free_port()), "--tokens-file", str(bad)],
        env=env_for("postgresql://unused@/none?host=/nonexistent", tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Error: {bad}:2: the first field is not a sha256 hex digest")
    assert "secret-token-in-clear" not in proc.stderr


def test_token_hash_prints_the_line(tmp_path: Path) -> None:
    proc = run_kbpg("token", "hash", "kb_reader", input="my-token\n", env=env_for("", tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{hash_token('my-token')} kb_reader\n"
    (entry,) = parse_tokens(proc.stdout, "stdin")
    assert entry.principal.role == "kb_reader"
