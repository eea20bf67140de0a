"""Catalog checks on every kb.* function: pinned search_path, honest volatility, and SECURITY
DEFINER only on the reader API, owned by the tables' owner and executable by no one else."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kbpg.store import db as kdb
from tests.sqldata import vec

FUNCTIONS_SQL = """
select p.oid::regprocedure::text, p.prokind, p.provolatile, p.prosecdef, p.proparallel,
       coalesce(p.proconfig, '{}'), p.prosrc, p.prorettype = 'pg_catalog.trigger'::regtype,
       p.prosqlbody is not null
  from pg_catalog.pg_proc p
 where p.pronamespace = 'kb'::regnamespace
 order by 1
"""

# The volatility each function must declare. Writers are volatile; readers of tables or
# settings are stable; pure functions of their arguments are immutable.
EXPECTED_VOLATILITY = {
    "kb.tsvector_token_count(tsvector)": "i",
    "kb.default_vector_layout(integer)": "i",
    "kb._check_vector_layout(text,integer)": "i",
    "kb._vector_index_definition(text,integer)": "i",
    "kb.set_embedding_layout(text)": "v",
    "kb.set_embedding_space(text,integer,text,text[])": "v",
    "kb.reset_embedding_space(text,integer,text,text[])": "v",
    "kb._model_languages(text[])": "s",
    "kb._check_query_embedding(vector)": "s",
    "kb._chunk_filter_sql(text,text,text,text,text,text[],text,text[],text[],jsonb)": "i",
    "kb._metadata_jsonpath(jsonb)": "i",
    "kb._metadata_filter_sql(text,jsonb)": "i",
    "kb._metadata_match_sql(text,text)": "i",
    "kb._metadata_holds(bigint,text)": "s",
    "kb._metadata_row_filter_sql(text,jsonb)": "i",
    "kb._metadata_mask_value(text,jsonb)": "i",
    "kb._metadata_mask_prefix(text)": "i",
    "kb._drop_filter_caches(integer[])": "v",
    "kb._metadata_anchors(jsonb)": "i",
    "kb._metadata_masks(jsonb)": "s",
    "kb._metadata_same_filter(jsonb,jsonb)": "i",
    "kb._metadata_filter_values(jsonb)": "s",
    "kb._highlight_ranges(text,text)": "s",
    "kb.highlight(text,text,integer)": "s",
    "kb.facets(text,text[],text[],text,text[],jsonb,integer)": "s",
    "kb._chunk_matches_filters(text[],text,text[],text[],text,text[])": "i",
    "kb._check_match_count(integer)": "i",
    "kb._check_search_input(text,vector,integer)": "i",
    "kb.search_vector(vector,integer,text[],text,text[],double precision,vector[],jsonb)": "s",
    "kb._tsquery_lexemes(text)": "i",
    "kb._lexemes_tsquery(text[])": "i",
    "kb._query_terms(text)": "s",
    "kb._lexemes_all_tsquery(text[])": "i",
    "kb._cjk_lexemes(text[])": "i",
    "kb._cjk_exclusion(text[],boolean)": "s",
    "kb._cjk_tsvector(text)": "i",
    "kb._language_tsvector(text,text)": "s",
    "kb.languages()": "s",
    "kb._resolve_language(text)": "s",
    "kb.text_tsvector(text,text)": "s",
    "kb._language_change_begin(text)": "v",
    "kb._check_language_change()": "s",
    "kb._language_reanalyse(integer)": "v",
    "kb._language_change_finish()": "v",
    "kb.set_language(text)": "v",
    "kb._language_is_english(text)": "s",
    "kb._default_vector_weight()": "s",
    "kb.model_defaults()": "s",
    "kb._bm25_score(tsvector,integer,text[],double precision[],double precision)": "i",
    "kb._bm25_rank(text[],double precision[],double precision,tsquery,bigint[],integer,text[],"
    "text,text[],boolean,text[],jsonb)": "s",
    "kb._lexical_threshold(vector[],integer,integer,bigint,double precision,bigint,"
    "double precision,bigint,bigint,double precision,bigint,integer,double precision,boolean,"
    "bit varying[])": "i",
    "kb._lexical_candidates(integer[],bit varying[],vector[],integer,bigint,double precision)": "i",
    "kb.search_lexical(text,integer,text[],text,text[],jsonb)": "s",
    "kb.refresh_lexical_index(boolean)": "v",
    "kb._refresh_filter_masks(integer,integer)": "v",
    "kb._filter_masks_serve(text[],text,text[],text[])": "s",
    "kb._filter_masks(text[],text,text[],text[],integer[])": "s",
    "kb._refresh_filter_cache(text,text,boolean,bigint,bigint,bigint,double precision,integer)": "v",
    "kb._filter_cache_anchor(text[],text,text[],text[],integer[])": "s",
    "kb.index_metadata_key(text)": "v",
    "kb.unindex_metadata_key(text)": "v",
    "kb.list_indexed_metadata_keys()": "s",
    "kb._documents_metadata_changed()": "v",
    "kb._chunk_filter_values(text[],text,text[])": "i",
    "kb.expand_graph(bigint[],integer,integer,double precision,text[],text,text[],jsonb)": "s",
    "kb._expand_graph(bigint[],integer,integer,double precision,text[],text,text[],text[],jsonb)": "s",
    "kb._access_caller()": "s",
    "kb._access_visibility()": "s",
    "kb._visible_to(text[],text[])": "i",
    "kb.list_documents(text)": "s",
    "kb.get_document(text[])": "s",
    "kb.get_chunk(bigint)": "s",
    "kb.get_embedding_space()": "s",
    "kb.stats()": "s",
    "kb.fuse_rrf(bigint[],bigint[],bigint[],integer,double precision,double precision,"
    "double precision)": "i",
    "kb.cap_per_document(bigint[],bigint[],integer)": "i",
    "kb.search(text,vector,integer,text[],text,text[],double precision,integer,integer,integer,"
    "double precision,double precision,double precision,boolean,boolean,integer,integer,"
    "double precision,vector[],integer,jsonb,interval,text,double precision,text)": "s",
    "kb._fuse(text,bigint[],double precision[],bigint[],double precision[],bigint[],"
    "double precision[],integer,double precision,double precision,double precision)": "i",
    "kb.fuse_convex(bigint[],double precision[],bigint[],double precision[],bigint[],"
    "double precision[],double precision,double precision,double precision)": "i",
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


# What a kb function may resolve unqualified names through: nothing others can write.
# `kb` only in the frozen trigger functions of revisions 0001-0002 (they name kb tables bare).
PINNED_SCHEMAS = {"pg_catalog", "pg_temp", "kb"}


# A reader role has no privilege on kb's tables: it reads through these, which run with their
# owner's rights and apply the caller's grants (sql/015).
READER_API = {
    "kb.search",
    "kb.search_vector",
    "kb.search_lexical",
    "kb.expand_graph",
    "kb.list_documents",
    "kb.get_document",
    "kb.get_chunk",
    "kb.get_embedding_space",
    "kb.model_defaults",
    "kb.stats",
    "kb.list_grants",
    "kb.access_status",
    "kb.highlight",
    "kb.facets",
    "kb.knowledge_base_id",
    "kb.search_knowledge_bases",
    "kb.use_knowledge_base",
    "kb.knowledge_bases",
}
# The other SECURITY DEFINER functions: the triggers a table source puts on an application's
# table, so that the application's roles need no grant on schema kb; they write one table,
# kb_data.source_queue (the statement kb._source_change_sql builds, executed), and no reader may
# execute them. Nothing else may be SECURITY DEFINER.
SOURCE_TRIGGERS = {"kb._source_enqueue()", "kb._source_enqueue_truncate()"}
# The catalog's writers (issue 38): kb.table_sources is the owner's, writers change it through
# these, each checking its caller and its arguments (tests/sql/test_definer_functions.py says
# what each evaluates). No reader may execute them.
SOURCE_CATALOG = {
    "kb._source_catalog_insert(text,regclass,text,text,text,text,text,text,text[],boolean)",
    "kb._source_catalog_define(integer,text,text,text,text,text,text[],boolean)",
    "kb._source_catalog_reset(integer)",
    "kb._source_catalog_delete(integer)",
    "kb._source_catalog_rebind(integer,regclass)",
    "kb._source_catalog_compile(integer)",
    "kb._source_backfill_lock(integer)",
    "kb._source_backfill_save(integer,text,text[],bigint,bigint)",
}


def test_every_function_pins_search_path_and_only_the_reader_api_is_security_definer(functions):
    for name, _kind, _vol, secdef, _par, config, source, trigger, sqlbody in functions:
        if name in SOURCE_TRIGGERS:
            assert secdef and trigger, name
            written = set(re.findall(r"insert\s+into\s+([\w.]+)", source, re.IGNORECASE))
            assert written <= {"kb_data.source_queue"}, (name, written)
            code = re.sub(r"'(?:[^']|'')*'", "''", re.sub(r"--[^\n]*", "", source))
            assert not re.search(r"\b(update\s|delete\s+from)", code, re.I), name
            executed = re.findall(r"\bexecute\s+(\w+)", code, re.I)
            assert set(executed) <= {"statement"}, (name, executed)
            assert ("statement := kb._source_change_sql(" in source) == bool(executed), name
        elif name in SOURCE_CATALOG:
            assert secdef, name
            code = re.sub(r"'(?:[^']|'')*'", "''", re.sub(r"--[^\n]*", "", source))
            # first of all: who calls
            assert (
                code.split("begin", 1)[1].lstrip().startswith("perform kb._source_check_writer();")
            ), name
            # what the catalog helpers EXECUTE: the compiled trigger function's CREATE (built by
            # kb._source_compile_sql from the catalog), its DROP, its grants
            executed = re.findall(r"\bexecute\s+([^;]+);", code, re.I)
            assert set(executed) <= {
                "kb._source_compile_sql(s.id)",
                "format('', name)",
                "format('', compiled)",
                "format('', compiled, writer)",
                "format('', kb._source_compiled_name(source_id))",
            }, (name, executed)
            written = set(
                re.findall(r"(?:insert\s+into|update|delete\s+from)\s+(kb\.\w+)", code, re.I)
            )
            assert written <= {"kb.table_sources"}, (name, written)
        else:
            assert bool(secdef) == (name.split("(")[0] in READER_API), (
                f"{name}: SECURITY DEFINER {secdef}"
            )
        if secdef:
            # what a SECURITY DEFINER function resolves by name: nothing a caller can create
            assert "search_path=pg_catalog, pg_temp" in config, f"{name}: {config}"
        paths = [c for c in config if c.startswith("search_path=")]
        if not config and sqlbody:
            # A SQL-standard body is bound when created (under pg_catalog, pg_temp: kbpg.db
            # applies the files so) and looks nothing up when it runs; any SET clause would stop
            # PostgreSQL from inlining these per-row helpers.
            continue
        assert paths, f"{name} has no pinned search_path"
        schemas = [s.strip() for s in paths[0].split("=", 1)[1].split(",")]
        assert schemas[0] == "pg_catalog", name
        assert set(schemas) <= PINNED_SCHEMAS, f"{name}: search_path {schemas}"


def test_sql_file_functions_pin_only_pg_catalog_and_pg_temp(functions):
    frozen = {
        "tsvector_token_count",
        "chunks_stats_after_insert",
        "chunks_stats_after_delete",
        "chunks_stats_after_update",
        "chunks_lexical_after_update",
        "chunks_lexical_after_delete",
    }
    for name, _kind, _vol, _sec, _par, config, _src, _trigger, sqlbody in functions:
        if name.split("(")[0].removeprefix("kb.") in frozen or (sqlbody and not config):
            continue
        assert "search_path=pg_catalog, pg_temp" in config, f"{name}: {config}"


@pytest.fixture
def planter(admin_url: str, db_url: str) -> Iterator[str]:
    """A role with CREATE on public (the default of databases from PostgreSQL <= 14)."""
    role = f"kbpg_t_planter_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"create role {role} nologin")
    yield role
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"drop owned by {role}")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"drop role if exists {role}")


# Exact-type overloads beat pg_catalog's polymorphic cardinality(anyarray) wherever `public`
# is on the path; each records that it ran.
PLANTED = """
create function public.cardinality(a {type}) returns integer language sql volatile
as $$ select pg_catalog.length(pg_catalog.set_config('kbpg_test.planted', 'ran', false)) * 0
             + pg_catalog.cardinality(a::anyarray) $$
"""


def test_a_function_planted_in_public_is_never_called(db_url: str, planter: str) -> None:
    with kdb.connect(db_url) as conn:
        conn.execute(f"grant create on schema public to {planter}")
        conn.execute(f"set role {planter}")
        for type_ in ("bigint[]", "text[]", "integer[]"):
            conn.execute(PLANTED.format(type=type_))
        conn.execute("reset role")
        conn.execute("select kb.set_embedding_space('planted-model', 3)")
        doc = conn.execute(
            "insert into kb.documents (source, content_hash, groups) values ('p', 'h', '{team}')"
            " returning id"
        ).fetchone()[0]
        chunks = [
            conn.execute(
                "insert into kb.chunks (document_id, ordinal, content, groups, embedding)"
                " values (%s, %s, %s, '{team}', %s::vector) returning id",
                (doc, i, text, vec(v)),
            ).fetchone()[0]
            for i, (text, v) in enumerate(
                [
                    ("renew parking permit", [1, 0, 0]),
                    ("permit office", [0.9, 0.1, 0]),
                    ("bicycle storage", [0, 1, 0]),
                ]
            )
        ]
        conn.execute(
            "insert into kb.edges values (%s, %s, 'link', 0.9), (%s, %s, 'link', 0.8)",
            (chunks[0], chunks[2], chunks[1], chunks[2]),
        )
        conn.execute("select kb.refresh_lexical_index()")
        conn.commit()

        conn.execute("set search_path = public, pg_catalog")
        conn.execute("select cardinality('{1,2}'::bigint[])")  # the trap is live
        assert conn.execute("select current_setting('kbpg_test.planted')").fetchone() == ("ran",)
        conn.execute("set kbpg_test.planted = ''")
        conn.execute("set kb.lexical_exhaustive_limit = 0")  # through the impact cache too
        emb = vec([1, 0, 0])
        calls = [
            (
                "select * from kb.search('renew permit', %s::vector, use_graph => true,"
                " groups => '{team}', labels => '{}')",
                (emb,),
            ),
            ("select * from kb.search('permit -bicycle', use_graph => true)", None),
            ("select * from kb.search_vector(%s::vector, 5, groups => '{team}')", (emb,)),
            ("select * from kb.search_lexical('renew permit storage', 5)", None),
            ("select * from kb.search_lexical('permit', 5, groups => '{team}')", None),
            (
                "select * from kb.expand_graph(%s::bigint[], 3, 10, 0.1, groups => '{team}')",
                ([chunks[0]],),
            ),
            (
                "select * from kb.search_knowledge_bases('{default}', 'renew permit', %s::vector,"
                " groups => '{team}')",
                (emb,),
            ),
            ("select * from kb.fuse_rrf('{1,2}', '{2,3}', '{3}')", None),
            ("select * from kb.cap_per_document('{1,2}', '{1,1}', 1)", None),
        ]
        for sql, params in calls:
            assert conn.execute(sql, params).fetchall(), sql
            assert conn.execute("select current_setting('kbpg_test.planted')").fetchone() == (
                "",
            ), f"a function planted in public ran inside: {sql}"


def test_known_functions_declare_the_expected_volatility(functions):
    declared = {row[0]: row[2] for row in functions}
    for name, volatility in EXPECTED_VOLATILITY.items():
        assert name in declared, f"{name} is missing"
        assert declared[name] == volatility, f"{name}: {declared[name]} != {volatility}"


def test_volatility_is_honest(functions, kb_tables):
    """Writers are volatile; immutable functions read no kb table; parallel safe ones are pure."""
    table_ref = re.compile(r"\bkb\.(" + "|".join(map(re.escape, kb_tables)) + r")\b")
    for name, _kind, volatility, _sec, parallel, _config, source, is_trigger, _body in functions:
        if is_trigger:
            assert volatility == "v", f"trigger function {name} must be volatile"
            continue
        # statements inside string literals (a hint naming the ALTER TABLE to run) write nothing;
        # one run by EXECUTE in a non-volatile function fails in PostgreSQL itself
        if WRITES.search(re.sub(r"'(?:[^']|'')*'", "''", source or "")):
            assert volatility == "v", f"{name} writes but is declared {volatility}"
        if volatility == "i":
            # a table named in a string literal is SQL text built for a caller (the metadata
            # filter's predicate, sql/018), not a read
            code = re.sub(r"'(?:[^']|'')*'", "''", source or "")
            assert not table_ref.search(code), f"{name} reads tables but is immutable"
            assert "current_setting" not in (source or ""), f"{name} reads settings"
        if parallel == "s":
            assert volatility != "v", f"{name} is volatile yet parallel safe"
            assert "set_config" not in (source or ""), f"{name} sets GUCs yet is parallel safe"


def test_search_functions_set_the_pgvector_knobs(functions):
    config = {row[0]: row[5] for row in functions}
    vector_arm = config[
        "kb._search_vector(vector,integer,text[],text,text[],double precision,vector[],boolean,"
        "text[],jsonb)"
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


def test_security_definer_functions_belong_to_the_owner_and_not_to_public(conn):
    """Owned by the tables' owner (its rights are what the functions read with), executable by
    the reader and writer roles and the owner, never by PUBLIC; their messages stay inside
    (client_min_messages: a reader's debug_print_plan would print the plans of their statements,
    estimates made from every row's statistics)."""
    rows = conn.execute(
        "select p.oid::regprocedure::text, p.proowner = c.relowner, p.proconfig,"
        "       has_function_privilege('public', p.oid, 'EXECUTE'),"
        "       has_function_privilege(s.reader_role, p.oid, 'EXECUTE'),"
        "       has_function_privilege(s.writer_role, p.oid, 'EXECUTE'), p.prolang"
        "  from pg_proc p, pg_class c, kb.access_settings s"
        " where p.pronamespace = 'kb'::regnamespace and p.prosecdef"
        "   and c.oid = 'kb_data.chunks'::regclass"
    ).fetchall()
    sources = SOURCE_TRIGGERS | SOURCE_CATALOG
    assert {r[0].split("(")[0] for r in rows if r[0] not in sources} == READER_API
    assert {r[0] for r in rows if r[0] in sources} == sources
    languages = dict(conn.execute("select oid, lanname from pg_language").fetchall())
    for name, owned, config, public, reader, writer, lang in rows:
        assert owned, name
        assert not public, f"{name}: PUBLIC may execute it"
        # the source triggers: the writer role (whose members add sources) creates them
        assert (reader, writer) == (name not in sources, True), name
        assert languages[lang] in ("sql", "plpgsql"), name
        assert "client_min_messages=notice" in config, name


def test_the_reader_role_executes_the_reader_api_and_reads_no_table(conn):
    reader = conn.execute("select reader_role from kb.access_settings").fetchone()[0]
    tables = conn.execute(
        "select c.oid::regclass::text from pg_class c"
        " where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'p', 'S')"
        "   and (has_table_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE,"
        " REFERENCES, TRIGGER') or has_any_column_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE,"
        " REFERENCES'))",
        (reader, reader),
    ).fetchall()
    assert tables == []
    api = {
        r[0]
        for r in conn.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace = 'kb'::regnamespace and p.prosecdef"
            "   and has_function_privilege(%s, p.oid, 'EXECUTE')",
            (reader,),
        )
    }
    assert {name.split("(")[0] for name in api} == READER_API
