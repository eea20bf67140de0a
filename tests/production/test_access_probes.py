"""A reader with psql replays the second audit's probes and learns nothing about hidden chunks.

Each probe runs twice as reader alice (granted hr): once with a value that exists only in
finance's documents (hidden from her) and once with a value that exists nowhere. Whatever the
probe prints (rows, EXPLAIN ANALYZE's plan and row counts, errors, messages) must be the same
for both: otherwise the difference tells her something about a chunk she may not read. Only
the timings and EXPLAIN's buffer counts are left out of the comparison: they measure the work
a call did, which docs/access-control.md lists as the residual side channel.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.accessdata import AccessKb, build, login_roles
from tests.sqldata import add_chunk, add_doc

ABSENT_ID = 10**12
HIDDEN_WORD = "budget"  # only in finance's chunks F1 and F2
ABSENT_WORD = "zqxjkv"
HIDDEN_CATEGORY = "mergers"  # the finance document's category (set below)


@pytest.fixture
def kb(admin_url: str, new_database: Callable[..., str]) -> Iterator[AccessKb]:
    """The access-control knowledge base, enforced, with a hidden category and a hidden chunk
    waiting in kb.lexical_pending (updated after the last refresh), statistics analyzed."""
    with login_roles(admin_url, ["alice", "bob", "dave", "walt"]) as roles:
        akb = build(new_database(), roles)
        with akb.connect("owner") as conn:
            conn.execute("select kb.access_enable()")
            conn.execute(
                "update kb.documents set category = %s where id = %s",
                (HIDDEN_CATEGORY, akb.ids["fin"]),
            )
            conn.execute(
                "update kb.chunks set category = %s, content = content || ' forecast'"
                " where document_id = %s",
                (HIDDEN_CATEGORY, akb.ids["fin"]),
            )
            # a group no reader may read any document of
            legal = add_doc(conn, "legal.md", groups=["legal"], category=HIDDEN_CATEGORY)
            add_chunk(conn, legal, "permit for the merger budget", [0.9, 0, 0.1])
            pending = conn.execute("select chunk_id from kb.lexical_pending").fetchall()
            assert {r[0] for r in pending} >= {akb.ids["F1"], akb.ids["F2"]}
            conn.execute("analyze")
        yield akb


_NOISE = [
    re.compile(r"(actual )?time=[0-9.]+\.\.[0-9.]+ ?"),
    re.compile(r"^\s*(Planning|Execution) Time: .*$"),
    re.compile(r"^\s*Buffers: .*$"),
    re.compile(r"^\s*Planning:$"),
    re.compile(r"^\s*I/O Timings: .*$"),
    re.compile(r"^\s*Memory: .*$"),
]


def _normalized(lines: list[str], value: Any) -> list[str]:
    # the value as the statement shows it: a literal ('x'), in an array ({1}) or a row
    quoted = re.compile(r"(?<=['{(])" + re.escape(str(value)) + r"(?=['},)])")
    out = []
    for line in lines:
        line = (
            quoted.sub("<value>", line)
            if isinstance(value, int)
            else line.replace(value, "<value>")
        )
        for pattern in _NOISE:
            line = pattern.sub("", line)
        if line.strip():
            out.append(line.rstrip())
    return out


def observe(akb: AccessKb, setup: list[str], sql: str, value: Any) -> list[str]:
    """Everything the reader sees from one statement: its rows (or error) and its messages."""
    messages: list[str] = []
    with akb.connect("alice") as conn:
        conn.add_notice_handler(lambda d: messages.append(f"{d.severity}: {d.message_primary}"))
        for statement in setup:
            conn.execute(statement)
        try:
            rows = [" | ".join(map(str, r)) for r in conn.execute(sql, (value,)).fetchall()]
        except psycopg.Error as exc:
            rows = [f"error {exc.sqlstate}: {exc.diag.message_primary}"]
    return _normalized(rows + messages, value)


PLAN_PROBES = [
    # the audit's: an index condition runs before the row-security filter, whose "Rows
    # Removed by Filter" then counts the hidden rows it dropped
    ("select 1 from kb.documents where source = %s", "finance.md", "nowhere.md"),
    ("select 1 from kb.documents where starts_with(source, %s)", "financ", "zzz"),
    ("select 1 from kb.documents where category = %s", HIDDEN_CATEGORY, "nocategory"),
    ("select 1 from kb.chunks where category = %s", HIDDEN_CATEGORY, "nocategory"),
    ("select 1 from kb.chunks where id = %s", "F1", ABSENT_ID),
    ("select 1 from kb.access_grants where role = %s", "team", "kbt_nobody"),
    ("select 1 from kb.access_grants where group_name = %s", "finance", "nogroup"),
    ("select 1 from kb.documents where %s = any (groups)", "legal", "nogroup"),
    ("select 1 from kb.lexical_blocks where lexeme = %s", HIDDEN_WORD, ABSENT_WORD),
    ("select 1 from kb.lexical_pending where chunk_id = %s", "F2", ABSENT_ID),
    ("select 1 from kb.edges where dst_chunk_id = %s", "F1", ABSENT_ID),
    ("select 1 from kb.lexeme_stats where lexeme = %s", "forecast", ABSENT_WORD),
]

FUNCTION_PROBES = [
    # the reader's API: hidden documents, chunks, grants and filter values look like absent ones
    ("select * from kb.get_document(%s)", "finance.md", "nowhere.md"),
    ("select * from kb.get_chunk(%s)", "F1", ABSENT_ID),
    ("select * from kb.list_documents(group_name => %s)", "legal", "nogroup"),
    ("select * from kb.list_grants(role_name => %s)", "team", "kbt_nobody"),
    ("select * from kb.expand_graph(array[%s]::bigint[], 3, 10, 0.1)", "F1", ABSENT_ID),
    ("select chunk_id from kb.search('permit budget', category => %s)", HIDDEN_CATEGORY, "nocat"),
    ("select chunk_id from kb.search('permit', groups => array[%s])", "legal", "nogroup"),
    ("select chunk_id from kb.search_lexical(%s, 50)", "forecast", ABSENT_WORD),
    (
        "select chunk_id from kb.search_vector('[0.95,0,0.05]', 10, category => %s)",
        HIDDEN_CATEGORY,
        "nocat",
    ),
    (
        "explain (analyze, verbose) select * from kb.search('permit', category => %s)",
        HIDDEN_CATEGORY,
        "nocat",
    ),
]


def _value(akb: AccessKb, value: Any) -> Any:
    if value in akb.ids:
        return akb.ids[value]
    if value in akb.roles:
        return akb.roles[value]
    return value


@pytest.mark.parametrize(("sql", "hidden", "absent"), PLAN_PROBES)
def test_explain_analyze_probes_on_the_tables_find_nothing(
    kb: AccessKb, sql: str, hidden: Any, absent: Any
) -> None:
    setup = ["set enable_seqscan = off", "set enable_bitmapscan = off"]
    probe = "explain (analyze, verbose) " + sql
    seen_hidden = observe(kb, setup, probe, _value(kb, hidden))
    seen_absent = observe(kb, setup, probe, _value(kb, absent))
    assert seen_hidden == seen_absent


@pytest.mark.parametrize(("sql", "hidden", "absent"), FUNCTION_PROBES)
def test_probes_through_the_readers_functions_find_nothing(
    kb: AccessKb, sql: str, hidden: Any, absent: Any
) -> None:
    # the planner's messages too: plans carry estimates made from every row's statistics
    setup = ["set client_min_messages = debug5", "set debug_print_plan = on", "set trace_sort = on"]
    seen_hidden = observe(kb, setup, sql, _value(kb, hidden))
    seen_absent = observe(kb, setup, sql, _value(kb, absent))
    assert not any(line.startswith("error") for line in seen_absent), seen_absent
    assert seen_hidden == seen_absent


def test_readers_have_no_privilege_on_any_kb_table(kb: AccessKb) -> None:
    """Statistics, the pending list, the grants, the cache: a reader reads none of them."""
    with kb.connect("owner") as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "select c.oid::regclass::text from pg_class c"
                " where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'p', 'v', 'm', 'S')"
            )
        ]
        assert {"kb.lexeme_stats", "kb.lexical_pending", "kb.access_grants"} <= set(tables)
        for who in ("alice", "dave"):
            role = kb.roles[who]
            granted = conn.execute(
                "select t from unnest(%s::text[]) t"
                " where has_any_column_privilege(%s, t, 'SELECT, INSERT, UPDATE, REFERENCES')"
                "    or (select relkind from pg_class where oid = t::regclass) <> 'S'"
                "       and has_table_privilege(%s, t, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE,"
                " REFERENCES, TRIGGER')",
                (tables, role, role),
            ).fetchall()
            assert granted == [], who
    with kb.connect("alice") as conn:
        for table in tables:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"select * from {table} limit 1")


def test_statistics_stay_global_but_list_no_word(kb: AccessKb) -> None:
    """Counts a reader may see (chunk count, average length, how many lexemes); never the
    words themselves: kb.lexeme_stats listed every word of the hidden chunks."""
    with kb.connect("owner") as conn:
        owner = conn.execute("select bm25_chunks, bm25_lexemes from kb.stats()").fetchone()
    with kb.connect("alice") as conn:
        alice = conn.execute(
            "select documents, chunks, bm25_chunks, bm25_lexemes from kb.stats()"
        ).fetchone()
        assert alice is not None and owner is not None
        assert alice[:2] == (3, 4)  # public, hr, both; P1 H1 H2 B1
        assert alice[2:] == owner
