"""Catalog checks on every kb.* function: security invoker, pinned search_path, honest volatility."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

FUNCTIONS_SQL = """
select p.oid::regprocedure::text, p.prokind, p.provolatile, p.prosecdef, p.proparallel,
       coalesce(p.proconfig, '{}'), p.prosrc, p.prorettype = 'pg_catalog.trigger'::regtype
  from pg_catalog.pg_proc p
 where p.pronamespace = 'kb'::regnamespace
 order by 1
"""

# The volatility each function must declare. Writers are volatile; readers of tables or
# settings are stable; pure functions of their arguments are immutable.
EXPECTED_VOLATILITY = {
    "kb.tsvector_token_count(tsvector)": "i",
    "kb.set_embedding_space(text,integer)": "v",
    "kb.reset_embedding_space(text,integer)": "v",
    "kb.check_query_embedding(vector)": "s",
    "kb.chunk_filter_sql(text,text,text,text,text[],text,text[])": "i",
    "kb.chunk_matches_filters(text[],text,text[],text[],text,text[])": "i",
    "kb.check_match_count(integer)": "i",
    "kb.search_vector(vector,integer,text[],text,text[],double precision,vector[])": "s",
    "kb.tsquery_lexemes(text)": "i",
    "kb.lexemes_tsquery(text[])": "i",
    "kb.query_terms(text)": "i",
    "kb.bm25_rank(text[],double precision[],double precision,tsquery,bigint[],integer,text[],"
    "text,text[],boolean)": "s",
    "kb.search_lexical(text,integer,text[],text,text[])": "s",
    "kb.refresh_lexical_index(boolean)": "v",
    "kb.expand_graph(bigint[],integer,integer,double precision,text[],text,text[])": "s",
    "kb.fuse_rrf(bigint[],bigint[],bigint[],integer,double precision,double precision,"
    "double precision)": "i",
    "kb.cap_per_document(bigint[],bigint[],integer)": "i",
    "kb.search(text,vector,integer,text[],text,text[],double precision,integer,integer,integer,"
    "double precision,double precision,double precision,boolean,boolean,integer,integer,"
    "double precision,vector[],integer)": "s",
}

WRITES = re.compile(
    r"\b(insert\s+into|update\s+kb\.|delete\s+from|truncate|alter\s+table|create\s+index"
    r"|drop\s+index|lock\s+table)\b",
    re.IGNORECASE,
)


@pytest.fixture
def functions(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    rows = conn.execute(FUNCTIONS_SQL).fetchall()
    assert rows, "no kb functions: is the database migrated?"
    return rows


@pytest.fixture
def kb_tables(conn: psycopg.Connection[Any]) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "select relname from pg_catalog.pg_class"
            " where relnamespace = 'kb'::regnamespace and relkind in ('r', 'p', 'v', 'm')"
        )
    ]


def test_every_function_is_security_invoker_with_pinned_search_path(functions):
    for name, _kind, _vol, secdef, _par, config, _src, _trigger in functions:
        assert not secdef, f"{name} is SECURITY DEFINER"
        paths = [c for c in config if c.startswith("search_path=")]
        assert paths, f"{name} has no pinned search_path"
        assert paths[0].split("=", 1)[1].split(",")[0].strip() == "pg_catalog", name


def test_known_functions_declare_the_expected_volatility(functions):
    declared = {row[0]: row[2] for row in functions}
    for name, volatility in EXPECTED_VOLATILITY.items():
        assert name in declared, f"{name} is missing"
        assert declared[name] == volatility, f"{name}: {declared[name]} != {volatility}"


def test_volatility_is_honest(functions, kb_tables):
    """Writers are volatile; immutable functions read no kb table; parallel safe ones are pure."""
    table_ref = re.compile(r"\bkb\.(" + "|".join(map(re.escape, kb_tables)) + r")\b")
    for name, _kind, volatility, _sec, parallel, _config, source, is_trigger in functions:
        if is_trigger:
            assert volatility == "v", f"trigger function {name} must be volatile"
            continue
        if WRITES.search(source or ""):
            assert volatility == "v", f"{name} writes but is declared {volatility}"
        if volatility == "i":
            assert not table_ref.search(source or ""), f"{name} reads tables but is immutable"
            assert "current_setting" not in (source or ""), f"{name} reads settings"
        if parallel == "s":
            assert volatility != "v", f"{name} is volatile yet parallel safe"
            assert "set_config" not in (source or ""), f"{name} sets GUCs yet is parallel safe"


def test_search_functions_set_the_pgvector_knobs(functions):
    config = {row[0]: row[5] for row in functions}
    vector_arm = config[
        "kb.search_vector(vector,integer,text[],text,text[],double precision,vector[])"
    ]
    assert "hnsw.iterative_scan=relaxed_order" in vector_arm
    assert any(c.startswith("hnsw.ef_search=") for c in vector_arm)


def test_every_sql_function_has_a_comment(conn):
    missing = conn.execute(
        "select p.oid::regprocedure::text from pg_catalog.pg_proc p"
        " where p.pronamespace = 'kb'::regnamespace"
        "   and p.prorettype <> 'pg_catalog.trigger'::regtype"
        "   and p.proname <> 'tsvector_token_count'"
        "   and pg_catalog.obj_description(p.oid, 'pg_proc') is null"
    ).fetchall()
    assert missing == []
