"""Group grants follow the role's identity (its OID), not its name (issue 38, item 4).

A role dropped and re-created under the same name by a role with CREATEROLE starts with no
grant; a renamed role keeps its grants and is listed under its new name; the rows of dropped
roles apply to nobody at once and are deleted by the next grant, revoke or listing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from kbpg.store import db as kdb
from tests.accessdata import PASSWORD, AccessKb, build, login_roles
from tests.sqldata import vec


@pytest.fixture
def akb(admin_url: str, new_database: Callable[..., str]) -> Iterator[AccessKb]:
    with login_roles(admin_url, ["alice", "bob", "dave", "walt"]) as roles:
        kb = build(new_database(), roles)
        with kb.connect("owner") as conn:
            conn.execute("select kb.access_enable()")
            # bob reads finance by a grant of his own (not through `team`)
            conn.execute(f'revoke "{roles["team"]}" from "{roles["bob"]}"')
            conn.execute("select * from kb.grant_groups(%s, array['finance'])", (roles["bob"],))
        yield kb


@pytest.fixture
def creator(admin_url: str, akb: AccessKb) -> Iterator[psycopg.Connection[Any]]:
    """A role with CREATEROLE (not a superuser) that administers bob and the reader role."""
    name = f"kbt_creator_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"create role \"{name}\" login createrole password '{PASSWORD}'")
        admin.execute(
            f'grant "{akb.roles["bob"]}", "{akb.reader_role}" to "{name}" with admin option'
        )
    try:
        with psycopg.connect(akb.url, user=name, password=PASSWORD, autocommit=True) as conn:
            yield conn
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'drop owned by "{name}"')
            admin.execute(f'drop role "{name}"')


def finance_hits(conn: psycopg.Connection[Any], akb: AccessKb) -> set[int]:
    rows = conn.execute(
        "select chunk_id from kb.search('budget forecast salary', %s::vector)",
        (vec([0, 0.9, 0.1]),),
    ).fetchall()
    return {int(r[0]) for r in rows} & {akb.ids["F1"], akb.ids["F2"]}


def grant_rows(akb: AccessKb) -> int:
    with akb.connect("owner") as conn:
        row = conn.execute("select count(*) from kb.access_grants").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("drop_owned", [False, True])
def test_a_role_recreated_under_the_same_name_starts_with_nothing(
    akb: AccessKb, creator: psycopg.Connection[Any], drop_owned: bool
) -> None:
    bob = akb.roles["bob"]
    with akb.connect("bob") as conn:
        assert finance_hits(conn, akb) == {akb.ids["F1"], akb.ids["F2"]}
    before = grant_rows(akb)  # alice's hr, team's finance, bob's finance
    if drop_owned:
        creator.execute(f'drop owned by "{bob}"')
    creator.execute(f'drop role "{bob}"')
    creator.execute(f"create role \"{bob}\" login password '{PASSWORD}'")
    creator.execute(f'grant "{akb.reader_role}" to "{bob}"')
    creator.execute(f'grant "{bob}" to current_user')
    with akb.connect("bob") as conn:
        assert finance_hits(conn, akb) == set()
        assert conn.execute("select visible_groups from kb.access_status()").fetchone() == ([],)
        assert conn.execute("select * from kb.list_grants()").fetchall() == []
    # the owner's listing never shows the dropped role's grant, and deletes it
    with akb.connect("owner") as conn:
        listed = conn.execute("select role, group_name from kb.list_grants()").fetchall()
        assert listed == sorted([(akb.roles["alice"], "hr"), (akb.roles["team"], "finance")])
    assert grant_rows(akb) == before - 1


def test_a_renamed_role_keeps_its_grants_under_its_new_name(admin_url: str, akb: AccessKb) -> None:
    bob = akb.roles["bob"]
    renamed = f"{bob}_renamed"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'alter role "{bob}" rename to "{renamed}"')
        # a new role takes the old name: it inherits nothing
        admin.execute(f"create role \"{bob}\" login password '{PASSWORD}'")
        admin.execute(f'grant "{akb.reader_role}" to "{bob}"')
    try:
        with akb.connect("bob") as conn:
            assert finance_hits(conn, akb) == set()
        with psycopg.connect(akb.url, user=renamed, password=PASSWORD, autocommit=True) as conn:
            assert finance_hits(conn, akb) == {akb.ids["F1"], akb.ids["F2"]}
            assert conn.execute("select role, group_name from kb.list_grants()").fetchall() == [
                (renamed, "finance")
            ]
        with akb.connect("owner") as conn:
            revoked = conn.execute(
                "select * from kb.revoke_groups(%s, array['finance'])", (bob,)
            ).fetchall()
            assert revoked == []  # the new bob has none; the renamed one keeps its grant
            assert conn.execute(
                "select group_name from kb.list_grants(%s)", (renamed,)
            ).fetchall() == [("finance",)]
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'drop role if exists "{renamed}"')


def test_a_recreated_writer_role_does_not_read_every_group(
    akb: AccessKb, creator: psycopg.Connection[Any], admin_url: str
) -> None:
    # writer and reader roles of this database's own (role names are cluster-wide)
    suffix = uuid.uuid4().hex[:8]
    reader, writer = f"kbt_reader_{suffix}", f"kbt_writer_{suffix}"
    dave = akb.roles["dave"]
    try:
        with akb.connect("owner") as conn:
            conn.execute("select * from kb.access_setup(%s, %s)", (reader, writer))
            conn.execute(f'grant "{reader}" to "{dave}"')
            conn.execute(f'grant "{writer}" to "{akb.roles["walt"]}"')
        with akb.connect("walt") as conn:
            assert conn.execute("select reads_all from kb.access_status()").fetchone() == (True,)
        with akb.connect("owner") as conn:
            conn.execute(f'drop owned by "{writer}"')
            conn.execute(f'drop role "{writer}"')
        # a role with CREATEROLE takes the writer's name and hands it to a reader
        creator.execute(f'create role "{writer}" nologin')
        creator.execute(f'grant "{writer}" to "{dave}"')
        with akb.connect("dave") as conn:
            assert finance_hits(conn, akb) == set()
            assert conn.execute(
                "select reads_all, writer_role from kb.access_status()"
            ).fetchone() == (False, None)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin, kdb.connect(akb.url) as db:
            for role in (reader, writer):
                if admin.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone():
                    db.execute(f'drop owned by "{role}"')
                    db.commit()
                    admin.execute(f'drop role "{role}"')
