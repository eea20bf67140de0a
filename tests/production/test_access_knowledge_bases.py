"""Who reads which knowledge base (issue 39, revision 0031): a reader holding a grant in one
knowledge base sees nothing of another, whatever it sets kbpg.kb_id to by hand.

default is the access-control knowledge base of tests/accessdata.py (alice reads hr, bob
finance through the role team, dave nothing but public chunks, walt writes). Two more are made
here, `a` and `b`, each with a public and an hr document; alice holds hr in `a` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from kbpg.store import db as kdb
from tests.accessdata import AccessKb, build, login_roles
from tests.sqldata import add_chunk, add_doc

# one call per function of the reader API that reads a knowledge base
READS_A_KNOWLEDGE_BASE = {
    "search": "select * from kb.search('permit', '[1,0,0]'::vector)",
    "search_vector": "select * from kb.search_vector('[1,0,0]'::vector, 5)",
    "search_lexical": "select * from kb.search_lexical('permit', 5)",
    "expand_graph": "select * from kb.expand_graph(array[1]::bigint[])",
    "list_documents": "select * from kb.list_documents()",
    "get_document": "select * from kb.get_document('hr-rules.md')",
    "get_chunk": "select * from kb.get_chunk(1)",
    "get_embedding_space": "select * from kb.get_embedding_space()",
    "stats": "select * from kb.stats()",
    "list_grants": "select * from kb.list_grants()",
    "access_status": "select * from kb.access_status()",
    "model_defaults": "select * from kb.model_defaults()",
    "highlight": "select * from kb.highlight('a parking permit', 'permit')",
    "facets": "select * from kb.facets('permit', array['category'])",
    # (by name: the one hidden below is `b`)
    "search_knowledge_bases": "select * from kb.search_knowledge_bases(array['b'], 'permit')",
}
# the reader API's functions of their arguments alone, and those taking a name (tested below)
READS_NO_KNOWLEDGE_BASE = {
    "fuse_rrf",
    "fuse_convex",
    "cap_per_document",
    "knowledge_base_id",
    "use_knowledge_base",
    "knowledge_bases",
}


@dataclass
class TwoMore:
    akb: AccessKb
    ids: dict[str, int]  # knowledge base name -> id
    chunks: dict[str, int]  # "a public", "a hr", "b public", "b hr" -> chunk id


def fill(conn: psycopg.Connection[Any], name: str) -> dict[str, int]:
    """A knowledge base `name` with a public and an hr document, 3-d vectors."""
    (kb_id,) = conn.execute(
        "select kb.create_knowledge_base(%s, model_name => 'test-model', vector_dimension => 3)",
        (name,),
    ).fetchone() or (0,)
    conn.execute("select set_config('kbpg.kb_id', %s, false)", (str(kb_id),))
    public = add_doc(conn, "parking.md")
    hr = add_doc(conn, "hr-rules.md", groups=["hr"])
    chunks = {
        f"{name} public": add_chunk(conn, public, f"parking permit rules of {name}", [1, 0, 0]),
        f"{name} hr": add_chunk(conn, hr, f"parking permit for staff of {name}", [0.9, 0.1, 0]),
    }
    conn.execute("select * from kb.refresh_lexical_index()")
    conn.execute("select set_config('kbpg.kb_id', '', false)")
    return {"id": kb_id, **chunks}


@pytest.fixture
def two_more(admin_url: str, new_database: Callable[..., str]) -> Iterator[TwoMore]:
    with login_roles(admin_url, ["alice", "bob", "dave", "walt"]) as roles:
        akb = build(new_database(), roles)
        ids: dict[str, int] = {}
        chunks: dict[str, int] = {}
        with akb.connect("owner") as conn:
            for name in ("a", "b"):
                made = fill(conn, name)
                ids[name] = made.pop("id")
                chunks.update(made)
            conn.execute("select set_config('kbpg.kb_id', %s, false)", (str(ids["a"]),))
            conn.execute("select * from kb.grant_groups(%s, array['hr'])", (roles["alice"],))
        yield TwoMore(akb, ids, chunks)


def enforce(akb: AccessKb, on: bool = True) -> None:
    with akb.connect("owner") as conn:
        conn.execute(f"select kb.access_{'enable' if on else 'disable'}()")


def in_kb(conn: psycopg.Connection[Any], kb_id: int) -> psycopg.Connection[Any]:
    """The connection with kbpg.kb_id set by hand, as any psql user may."""
    conn.execute("select set_config('kbpg.kb_id', %s, false)", (str(kb_id),))
    return conn


def searched(conn: psycopg.Connection[Any]) -> set[int]:
    rows = conn.execute("select chunk_id from kb.search('parking permit', '[1,0,0]'::vector)")
    return {int(r[0]) for r in rows}


def refusal(conn: psycopg.Connection[Any], sql: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    return info.value


def test_every_function_of_the_reader_api_is_classified(db_url: str) -> None:
    with kdb.connect(db_url) as conn:
        names = {
            r[0]
            for r in conn.execute(
                "select distinct p.proname::text from pg_catalog.pg_proc p"
                " where p.oid = any (kb._access_reader_api())"
            )
        }
    assert names == set(READS_A_KNOWLEDGE_BASE) | READS_NO_KNOWLEDGE_BASE


def test_a_reader_granted_hr_in_one_sees_nothing_of_the_other(two_more: TwoMore) -> None:
    akb, ids, chunks = two_more.akb, two_more.ids, two_more.chunks
    enforce(akb)
    with akb.connect("owner") as conn:
        in_default = searched(conn)
    with akb.connect("alice") as conn:
        assert searched(in_kb(conn, ids["a"])) == {chunks["a public"], chunks["a hr"]}
        # default is read by every reader, as before knowledge bases: alice's hr there
        assert searched(in_kb(conn, 1)) == in_default & akb.visible["alice"]
        in_kb(conn, ids["b"])
        for name, sql in READS_A_KNOWLEDGE_BASE.items():
            error = refusal(conn, sql)
            assert error.sqlstate == "KB011", (name, error)
            assert str(error).startswith(
                (f"no knowledge base with id {ids['b']}", 'no knowledge base "b"')
            ), name
        # a hidden knowledge base and one that does not exist look the same
        hidden = refusal(conn, "select kb.knowledge_base_id('b')")
        missing = refusal(conn, "select kb.knowledge_base_id('nothing')")
        assert (hidden.sqlstate, missing.sqlstate) == ("KB011", "KB011")
        assert str(hidden).replace('"b"', '"nothing"') == str(missing)
        assert conn.execute("select kb.knowledge_base_id('a')").fetchone() == (ids["a"],)
        assert refusal(conn, "select kb.use_knowledge_base('b')").sqlstate == "KB011"
        # the knowledge bases alice may read, her documents in each (default: public and hr)
        listed = conn.execute("select name, documents, readers from kb.knowledge_bases()")
        assert listed.fetchall() == [("default", 3, "all"), ("a", 2, "granted")]
        assert conn.execute("select kb.use_knowledge_base('a')").fetchone() == (ids["a"],)
        assert searched(conn) == {chunks["a public"], chunks["a hr"]}
        in_kb(conn, 999)
        assert str(refusal(conn, READS_A_KNOWLEDGE_BASE["search"])).startswith(
            "no knowledge base with id 999"
        )
    with akb.connect("dave") as conn:  # a reader without any grant
        assert searched(in_kb(conn, 1)) == in_default & akb.visible["dave"]
        listed = conn.execute("select name, documents from kb.knowledge_bases()").fetchall()
        assert listed == [("default", 1)]
        for name in ("a", "b"):
            assert refusal(conn, f"select kb.knowledge_base_id('{name}')").sqlstate == "KB011"
            assert (
                refusal(in_kb(conn, ids[name]), READS_A_KNOWLEDGE_BASE["stats"]).sqlstate == "KB011"
            )
    with akb.connect("walt") as conn:  # the writer reads every knowledge base whole
        for name in ("a", "b"):
            assert searched(in_kb(conn, ids[name])) == {
                chunks[f"{name} public"],
                chunks[f"{name} hr"],
            }


def test_a_grant_in_one_knowledge_base_gives_no_group_in_another(two_more: TwoMore) -> None:
    """`b` opened to every reader: its public chunks for all, its hr chunk for nobody (alice's
    hr is a grant in `a`), until alice is granted hr in `b` too."""
    akb, ids, chunks = two_more.akb, two_more.ids, two_more.chunks
    enforce(akb)
    with akb.connect("owner") as conn:
        conn.execute("select kb.set_knowledge_base_readers('b', 'all')")
        listed = conn.execute("select name, readers from kb.knowledge_bases()").fetchall()
        assert listed == [("default", "all"), ("a", "granted"), ("b", "all")]
    for who in ("alice", "dave"):
        with akb.connect(who) as conn:
            assert searched(in_kb(conn, ids["b"])) == {chunks["b public"]}, who
            assert conn.execute("select kb.knowledge_base_id('b')").fetchone() == (ids["b"],)
    with akb.connect("owner") as conn:
        in_kb(conn, ids["b"]).execute(
            "select * from kb.grant_groups(%s, array['hr'])", (akb.roles["alice"],)
        )
        conn.execute("select kb.set_knowledge_base_readers('b', 'granted')")
    with akb.connect("alice") as conn:
        assert searched(in_kb(conn, ids["b"])) == {chunks["b public"], chunks["b hr"]}
    with akb.connect("dave") as conn:
        assert refusal(in_kb(conn, ids["b"]), READS_A_KNOWLEDGE_BASE["search"]).sqlstate == "KB011"
    with akb.connect("owner") as conn:
        bad = refusal(conn, "select kb.set_knowledge_base_readers('b', 'some')")
        assert bad.sqlstate == "22023" and "readers must be all or granted" in str(bad)


def test_with_access_control_off_every_reader_reads_every_knowledge_base(
    two_more: TwoMore,
) -> None:
    akb, ids, chunks = two_more.akb, two_more.ids, two_more.chunks
    with akb.connect("dave") as conn:
        assert searched(in_kb(conn, ids["b"])) == {chunks["b public"], chunks["b hr"]}
    enforce(akb)
    enforce(akb, on=False)
    with akb.connect("dave") as conn:
        assert searched(in_kb(conn, ids["b"])) == {chunks["b public"], chunks["b hr"]}


def test_the_knowledge_bases_an_upgrade_finds_stay_open_to_every_reader(db_url: str) -> None:
    """Revision 0031 keeps `all` for the knowledge bases that exist (readers read them before);
    new ones start `granted`."""
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("select kb.create_knowledge_base('before')")
    kdb.downgrade(db_url, "0030")
    kdb.upgrade(db_url)
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("select kb.create_knowledge_base('after')")
        listed = conn.execute("select name, readers from kb.knowledge_bases()").fetchall()
    assert listed == [("default", "all"), ("before", "all"), ("after", "granted")]
