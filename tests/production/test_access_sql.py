"""Access control in SQL: row-level security by group, per login role, on every arm and table."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.accessdata import AccessKb, build, login_roles
from tests.sqldata import vec

WHO = ["alice", "bob", "dave", "walt"]


@pytest.fixture
def akb(admin_url: str, new_database: Callable[..., str]) -> Iterator[AccessKb]:
    with login_roles(admin_url, WHO) as roles:
        url = new_database()
        yield build(url, roles)


@pytest.fixture
def enforced(akb: AccessKb) -> AccessKb:
    with akb.connect("owner") as conn:
        assert conn.execute("select kb.access_enable()").fetchone() == (True,)
    return akb


def chunk_ids(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> list[int]:
    return [int(r[0]) for r in conn.execute(sql, params).fetchall()]


def readable_chunks(conn: psycopg.Connection[Any]) -> set[int]:
    """The chunk ids a role reads through the reader API: every listed document's chunks."""
    return set(
        chunk_ids(
            conn,
            "select g.chunk_id from kb.list_documents() d"
            " cross join lateral kb.get_document(d.source) g",
        )
    )


def assert_sqlstate(conn: psycopg.Connection[Any], sql: str, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    assert info.value.sqlstate == sqlstate, (sql, info.value)


def walk(conn: psycopg.Connection[Any], seed: int) -> list[int]:
    """The graph arm alone from one seed, 3 hops deep."""
    return chunk_ids(
        conn,
        "select chunk_id from kb.expand_graph(array[%s]::bigint[], max_depth => 3,"
        " max_returned => 10, min_score => 0.1) order by rank",
        (seed,),
    )


def search_ids(
    conn: psycopg.Connection[Any], text: str | None, emb: list[float] | None, **kw: Any
) -> list[int]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    return chunk_ids(
        conn,
        f"select chunk_id from kb.search(%(t)s, %(e)s::vector{args}) order by rank",
        {"t": text, "e": None if emb is None else vec(emb), **kw},
    )


def test_roles_are_set_up_and_enforcement_is_off_by_default(akb: AccessKb) -> None:
    with akb.connect("owner") as conn:
        status = conn.execute(
            "select enforced, tables_enforced, tables_total, lexical_cache_split from kb.access_status()"
        ).fetchone()
        assert status == (False, 0, 4, False)
        assert akb.reader_role.endswith("_reader") and akb.writer_role.endswith("_writer")
        login = conn.execute(
            "select rolcanlogin from pg_roles where rolname = any (%s)",
            ([akb.reader_role, akb.writer_role],),
        ).fetchall()
        assert login == [(False,), (False,)]


def test_with_enforcement_off_every_reader_sees_everything(akb: AccessKb) -> None:
    with akb.connect("owner") as conn:
        owner_result = search_ids(conn, "parking permit salary", [1, 0, 0], match_count=20)
    for who in WHO:
        with akb.connect(who) as conn:
            assert readable_chunks(conn) == akb.visible["owner"], who
            assert (
                search_ids(conn, "parking permit salary", [1, 0, 0], match_count=20) == owner_result
            )


def test_each_role_sees_exactly_its_groups(enforced: AccessKb) -> None:
    """Readers through the reader API (no table privilege at all); the writer and the owner in
    the tables too (row-level security gives them every row)."""
    akb = enforced
    docs = {"P1": "public", "H1": "hr", "H2": "hr", "F1": "finance", "F2": "finance", "B1": "both"}
    for who in [*WHO, "owner"]:
        visible = akb.visible[who]
        with akb.connect(who) as conn:
            assert readable_chunks(conn) == visible, who
            expected = {f"{docs[k]}.md" for k, v in akb.ids.items() if v in visible and k in docs}
            listed = {r[0] for r in conn.execute("select source from kb.list_documents()")}
            assert listed == expected, who
            for name, chunk in akb.ids.items():
                if name in docs:
                    got = chunk_ids(conn, "select chunk_id from kb.get_chunk(%s)", (chunk,))
                    assert got == ([chunk] if chunk in visible else []), (who, name)
            if who in ("walt", "owner"):
                assert set(chunk_ids(conn, "select id from kb.chunks")) == visible, who
            else:
                assert_sqlstate(conn, "select id from kb.chunks", "42501")
    # P1 -> F1 and F1 -> H1 touch finance: alice counts only H1 -> H2 and P1 -> B1
    for who, edges in (("alice", 2), ("bob", 2), ("dave", 0), ("walt", 4)):
        with akb.connect(who) as conn:
            assert conn.execute("select edges from kb.stats()").fetchone() == (
                {"link": edges} if edges else {},
            ), who


def test_hybrid_search_returns_only_visible_chunks_in_the_owner_order(enforced: AccessKb) -> None:
    akb = enforced
    i = akb.ids
    expected = {
        "alice": [i["P1"], i["H1"], i["B1"]],
        "bob": [i["P1"], i["F1"], i["B1"]],
        "dave": [i["P1"]],
        "walt": [i["P1"], i["F1"], i["H1"], i["B1"]],
    }
    for who, want in expected.items():
        with akb.connect(who) as conn:
            assert (
                search_ids(conn, "parking permit", [1, 0, 0], match_count=10, max_per_doc=None)
                == want
            ), who
            # lexical only (psql without an embedding)
            got = search_ids(conn, "permit", None, match_count=10)
            assert set(got) == set(want), who


def test_each_arm_alone_respects_visibility(enforced: AccessKb) -> None:
    akb = enforced
    i = akb.ids
    with akb.connect("alice") as conn:
        assert chunk_ids(
            conn,
            "select chunk_id from kb.search_vector(%s::vector, 10) order by rank",
            (vec([1, 0, 0]),),
        ) == [
            i["P1"],
            i["H1"],
            i["B1"],
        ]
        assert set(chunk_ids(conn, "select chunk_id from kb.search_lexical('salary', 10)")) == {
            i["H1"],
            i["H2"],
        }
        # graph: from P1, F1 is invisible, and so is the path P1 -> F1 -> H1
        walked = walk(conn, i["P1"])
        assert walked == [i["B1"]]
    with akb.connect("bob") as conn:
        walked = walk(conn, i["P1"])
        assert walked == [i["F1"], i["B1"]]  # H1 (via F1) is hr's
        assert set(chunk_ids(conn, "select chunk_id from kb.search_lexical('salary', 10)")) == {
            i["F2"]
        }
    with akb.connect("walt") as conn:
        walked = walk(conn, i["P1"])
        assert walked == [i["F1"], i["H1"], i["H2"], i["B1"]]  # 0.9, 0.81, 0.648, 0.6


@pytest.mark.parametrize("indexed", [False, True], ids=["key", "indexed key"])
def test_a_metadata_filter_never_matches_a_hidden_document(
    enforced: AccessKb, indexed: bool
) -> None:
    """A reader's metadata filter selects among the chunks it may read: the finance document's
    metadata matches the filter, and alice (hr) still finds nothing of it, in any arm; the same
    with the key indexed by the writer (a reader may not index one; the bitmaps hold every
    reader's chunks) and the lexical arm forced through its cache."""
    akb = enforced
    i = akb.ids
    with akb.connect("owner") as conn:
        conn.execute(
            "update kb.documents set metadata = %s where id in (%s, %s)",
            ('{"quarter": "q3"}', i["fin"], i["hr"]),
        )
    if indexed:
        # a reader may not index a key; a writer may, from psql as from the CLI
        with akb.connect("alice") as conn:
            assert_sqlstate(conn, "select kb.index_metadata_key('quarter')", "42501")
        with akb.connect("walt") as conn:
            assert conn.execute("select kb.index_metadata_key('quarter')").fetchone() == (True,)
        with akb.connect("owner") as conn:
            held = conn.execute(
                "select value, sum(bit_count(kept)) from kb.lexical_filter_masks"
                " where filter_kind = 'metadata' group by value"
            ).fetchall()
            assert held == [('["quarter", "q3"]', 4)]  # F1, F2, H1, H2: every reader's
    only_q3 = json.dumps({"quarter": "q3"})
    calls = [
        "select chunk_id from kb.search('parking permit salary budget', %(e)s::vector,"
        " match_count => 10, filter => %(f)s) order by rank",
        "select chunk_id from kb.search('parking permit salary budget', match_count => 10,"
        " filter => %(f)s) order by rank",
        "select chunk_id from kb.search_lexical('parking permit salary budget', 10,"
        " filter => %(f)s) order by rank",
        "select chunk_id from kb.search_vector(%(e)s::vector, 10, min_similarity => -1,"
        " filter => %(f)s) order by rank",
        "select chunk_id from kb.expand_graph(%(seeds)s, max_depth => 3, max_returned => 10,"
        " min_score => 0.1, filter => %(f)s) order by rank",
    ]
    seen = {}
    for who in ("alice", "bob", "dave", "walt"):
        with akb.connect(who) as conn:
            if indexed:
                conn.execute("set kb.lexical_exhaustive_limit = 0")
            found: set[int] = set()
            for sql in calls:
                found |= set(
                    chunk_ids(
                        conn,
                        sql,
                        {"e": vec([1, 0, 0]), "f": only_q3, "seeds": [i["P1"], i["B1"]]},
                    )
                )
            seen[who] = found
    assert seen == {
        "alice": {i["H1"], i["H2"]},
        "bob": {i["F1"], i["F2"]},
        "dave": set(),
        "walt": {i["H1"], i["H2"], i["F1"], i["F2"]},
    }


def test_facets_count_only_what_the_reader_may_read(enforced: AccessKb) -> None:
    counts = {}
    for who in ("alice", "bob", "dave", "walt"):
        with enforced.connect(who) as conn:
            counts[who] = {
                (v, d)
                for v, d, _ in conn.execute(
                    "select value, documents, chunks from kb.facets('', '{groups}')"
                ).fetchall()
            }
    assert counts == {
        "alice": {("public", 1), ("hr", 2), ("finance", 1)},  # both.md is in hr and finance
        "bob": {("public", 1), ("finance", 2), ("hr", 1)},
        "dave": {("public", 1)},
        "walt": {("public", 1), ("hr", 2), ("finance", 2)},
    }


def test_lexical_cache_rows_are_split_by_class_and_hidden(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("owner") as conn:
        assert conn.execute("select split_by_groups from kb.lexical_state").fetchone() == (True,)
        classes = {
            tuple(r[0]) for r in conn.execute("select distinct groups from kb.lexical_blocks")
        }
        assert classes == {(), ("hr",), ("finance",), ("hr", "finance")}
    with akb.connect("alice") as conn:
        # readers read no cache row: 'budget' is only in finance chunks, and nothing of it shows
        assert_sqlstate(conn, "select groups from kb.lexical_blocks", "42501")
        assert chunk_ids(conn, "select chunk_id from kb.search_lexical('budget', 10)") == []


@pytest.mark.parametrize("path", ["cache", "exhaustive-limit"])
def test_lexical_scores_equal_the_owners_restricted_to_visible_chunks(
    enforced: AccessKb, path: str
) -> None:
    akb = enforced
    query = "permit salary budget parking"
    with akb.connect("owner") as conn:
        owner = conn.execute(
            "select chunk_id, score from kb.search_lexical(%s, 50) order by rank", (query,)
        ).fetchall()
    for who in ["alice", "bob", "dave"]:
        with akb.connect(who) as conn:
            if path == "cache":
                conn.execute("set kb.lexical_exhaustive_limit = 0")
            got = conn.execute(
                "select chunk_id, score from kb.search_lexical(%s, 50) order by rank", (query,)
            ).fetchall()
        want = [(c, s) for c, s in owner if c in akb.visible[who]]
        assert [c for c, _ in got] == [c for c, _ in want], who
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-9), who


def test_asking_for_an_unreadable_group_returns_nothing_from_it(enforced: AccessKb) -> None:
    akb = enforced
    i = akb.ids
    with akb.connect("alice") as conn:
        # B1 is in finance too, and alice reads it through hr; F1 and F2 never appear
        assert search_ids(conn, "permit budget", [1, 0, 0], groups=["finance"]) == [i["B1"]]
        assert search_ids(conn, "budget", None, groups=["nonexistent"]) == []
        listed = conn.execute("select source from kb.list_documents(group_name => 'finance')")
        assert listed.fetchall() == [("both.md",)]


def test_a_revoked_grant_takes_effect_on_the_next_query(enforced: AccessKb) -> None:
    akb = enforced
    i = akb.ids
    with akb.connect("alice") as alice, akb.connect("owner") as owner:
        assert i["H2"] in readable_chunks(alice)
        revoked = owner.execute(
            "select * from kb.revoke_groups(%s, array['hr'])", (akb.roles["alice"],)
        ).fetchall()
        assert revoked == [(akb.roles["alice"], "hr")]
        assert readable_chunks(alice) == {i["P1"]}
        assert search_ids(alice, "salary", [0, 1, 0]) == []
        owner.execute(
            "select * from kb.grant_groups(%s, array['hr', 'finance'])", (akb.roles["alice"],)
        )
        assert readable_chunks(alice) == akb.visible["owner"]


def test_membership_in_a_granted_role_is_inherited(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("owner") as owner:
        owner.execute(f'revoke "{akb.roles["team"]}" from "{akb.roles["bob"]}"')
    with akb.connect("bob") as conn:
        assert readable_chunks(conn) == {akb.ids["P1"]}


def test_readers_see_their_own_grants_only(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("alice") as conn:
        assert conn.execute("select role, group_name from kb.list_grants()").fetchall() == [
            (akb.roles["alice"], "hr")
        ]
        status = conn.execute(
            "select enforced, visible_groups, reads_all from kb.access_status()"
        ).fetchone()
        assert status == (True, ["hr"], False)
    with akb.connect("bob") as conn:
        assert conn.execute("select visible_groups from kb.access_status()").fetchone() == (
            ["finance"],
        )
    with akb.connect("owner") as conn:
        assert len(conn.execute("select * from kb.list_grants()").fetchall()) == 2


def test_readers_cannot_grant_enable_or_write(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("alice") as conn:
        for sql in [
            "select kb.grant_groups(current_user, array['finance'])",
            "select kb.access_disable()",
            "delete from kb.chunks",
            "select kb.access_setup(reader_role => 'kbt_new_reader_x', writer_role => 'kbt_new_writer_x')",
        ]:
            assert_sqlstate(conn, sql, "42501")
    with akb.connect("walt") as conn:  # a writer ingests, but does not hand out groups
        assert_sqlstate(conn, "select kb.grant_groups(current_user, array['finance'])", "42501")


def test_writer_sees_every_group_and_can_ingest(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("walt") as conn:
        doc = conn.execute(
            "insert into kb.documents (source, groups, content_hash) values ('new.md', '{legal}', 'h') returning id"
        ).fetchone()
        assert doc is not None
        conn.execute(
            "insert into kb.chunks (document_id, ordinal, content, groups) values (%s, 0, 'legal permit', '{legal}')",
            (doc[0],),
        )
        conn.execute("select * from kb.refresh_lexical_index()")
        assert len(chunk_ids(conn, "select id from kb.chunks")) == 7
    with akb.connect("alice") as conn:
        assert len(readable_chunks(conn)) == 4
        assert chunk_ids(conn, "select chunk_id from kb.search_lexical('legal', 10)") == []


def test_recount_counts_every_chunk_for_a_writer_and_refuses_readers(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("owner") as conn:
        conn.execute("update kb.corpus_stats set chunk_count = 1, total_tokens = 1")
        truth = conn.execute("select count(*), sum(token_count) from kb.chunks").fetchone()
    with akb.connect("alice") as conn:
        assert_sqlstate(conn, "select kb.recount_bm25_statistics()", "42501")
    with akb.connect("walt") as conn:
        row = conn.execute(
            "select chunk_count, total_tokens from kb.recount_bm25_statistics()"
        ).fetchone()
        assert row == truth
    with akb.connect("owner") as conn:
        assert conn.execute("select chunk_count, total_tokens from kb.corpus_stats").fetchone() == (
            truth
        )
        # the cache rebuilt split by visibility class, as access control needs it
        classes = {
            tuple(r[0]) for r in conn.execute("select distinct groups from kb.lexical_blocks")
        }
        assert len(classes) > 1
    with akb.connect("alice") as conn:
        found = set(search_ids(conn, "salary budget parking", None))
        assert found and found <= akb.visible["alice"]


def test_bad_grants_are_refused_clearly(enforced: AccessKb) -> None:
    with enforced.connect("owner") as conn:
        assert_sqlstate(conn, "select kb.grant_groups('no_such_role_kbpg', array['hr'])", "42704")
        assert_sqlstate(conn, "select kb.grant_groups(current_user, array[''])", "22023")


def test_disable_restores_todays_behaviour(enforced: AccessKb) -> None:
    akb = enforced
    with akb.connect("owner") as conn:
        assert conn.execute("select kb.access_disable()").fetchone() == (False,)
        assert conn.execute("select split_by_groups from kb.lexical_state").fetchone() == (False,)
        classes = {
            tuple(r[0]) for r in conn.execute("select distinct groups from kb.lexical_blocks")
        }
        assert classes == {()}
    with akb.connect("dave") as conn:
        assert readable_chunks(conn) == akb.visible["owner"]


def test_row_security_turned_on_by_hand_hides_an_unsplit_cache(akb: AccessKb) -> None:
    """ALTER TABLE ... ENABLE ROW LEVEL SECURITY without kb.access_enable's cache rebuild."""
    i = akb.ids
    with akb.connect("owner") as conn:
        for table in ("documents", "chunks", "edges", "lexical_blocks"):
            conn.execute(f"alter table kb_data.{table} enable row level security")
        assert conn.execute("select split_by_groups from kb.lexical_state").fetchone() == (False,)
    with akb.connect("alice") as conn:
        got = chunk_ids(conn, "select chunk_id from kb.search_lexical('budget salary', 10)")
        assert set(got) == {i["H1"], i["H2"]}


def test_a_readers_failed_search_shows_no_internal_statements_in_context(
    enforced: AccessKb,
) -> None:
    """A reader in psql sees an error's CONTEXT: it names kb.search at most, never the SQL and
    line numbers of kbpg's inner functions (issue 38). Cancelled by statement_timeout while the
    owner holds a lock on kb.chunks, and refused by an inner check (a NaN weight)."""
    akb = enforced
    with akb.connect("owner") as owner, akb.connect("alice") as alice:
        alice.execute("set statement_timeout = '300ms'")
        errors = []
        with owner.transaction():
            owner.execute("lock table kb.chunks in access exclusive mode")
            with pytest.raises(psycopg.Error) as cancelled:
                alice.execute("select * from kb.search('salary', %s::vector)", (vec([0, 1, 0]),))
            errors.append(cancelled.value)
        with pytest.raises(psycopg.Error) as refused:
            alice.execute("select * from kb.search('salary', lexical_weight => 'NaN')")
        errors.append(refused.value)
        assert [e.sqlstate for e in errors] == ["57014", "22023"]
        assert errors[1].diag.message_hint
        for error in errors:
            context = error.diag.context or ""
            assert context.startswith("PL/pgSQL function kb.search("), context
            assert context.count("\n") == 0 and "kb._" not in context, context
