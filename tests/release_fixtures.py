"""Helpers for the production tests: catalog snapshots of schema kb, and 0.1.0's frozen data."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

REPO = Path(__file__).resolve().parent.parent
V0_1_0 = Path(__file__).resolve().parent / "fixtures" / "v0_1_0"

# What a DBA would diff between two databases: every object of schema kb with its definition,
# grants and comments; functions with their signature, volatility, security, config (the
# pinned search_path and SET hnsw.* knobs) and body.
CATALOG_QUERIES: dict[str, str] = {
    "relations": """
        select c.relname, c.relkind, c.relpersistence, c.relacl::text,
               pg_catalog.obj_description(c.oid, 'pg_class')
          from pg_catalog.pg_class c
         where c.relnamespace = 'kb'::regnamespace and c.relkind <> 'S'
         order by 1""",
    "columns": """
        select c.relname, a.attnum, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, a.attgenerated,
               pg_catalog.pg_get_expr(d.adbin, d.adrelid)
          from pg_catalog.pg_attribute a
          join pg_catalog.pg_class c on c.oid = a.attrelid
          left join pg_catalog.pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
         where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'p', 'v', 'm')
           and a.attnum > 0 and not a.attisdropped
         order by 1, 2""",
    "indexes": """
        select i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid)
          from pg_catalog.pg_index i
          join pg_catalog.pg_class c on c.oid = i.indrelid
         where c.relnamespace = 'kb'::regnamespace
         order by 1""",
    "constraints": """
        select conrelid::regclass::text, conname, pg_catalog.pg_get_constraintdef(oid)
          from pg_catalog.pg_constraint
         where connamespace = 'kb'::regnamespace
         order by 1, 2""",
    "triggers": """
        select tgname, pg_catalog.pg_get_triggerdef(t.oid)
          from pg_catalog.pg_trigger t
          join pg_catalog.pg_class c on c.oid = t.tgrelid
         where c.relnamespace = 'kb'::regnamespace and not t.tgisinternal
         order by 1""",
    "functions": """
        select p.oid::regprocedure::text, p.prokind, p.provolatile, p.prosecdef, p.proparallel,
               p.proisstrict, p.proconfig::text, pg_catalog.pg_get_function_result(p.oid),
               pg_catalog.pg_get_function_arguments(p.oid), case when p.prokind in ('f', 'p')
                    then pg_catalog.md5(pg_catalog.pg_get_functiondef(p.oid)) end,
               p.proacl::text, pg_catalog.obj_description(p.oid, 'pg_proc')
          from pg_catalog.pg_proc p
         where p.pronamespace = 'kb'::regnamespace
         order by 1""",
    "types": """
        select t.typname, t.typtype
          from pg_catalog.pg_type t
         where t.typnamespace = 'kb'::regnamespace and t.typtype not in ('b')
           and not exists (select 1 from pg_catalog.pg_class c
                            where c.oid = t.typrelid and c.relkind <> 'c')
         order by 1""",
    "schema": """
        select n.nspname, n.nspacl::text, pg_catalog.obj_description(n.oid, 'pg_namespace')
          from pg_catalog.pg_namespace n where n.nspname = 'kb'""",
}


def catalog_snapshot(conn: psycopg.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Schema kb as the catalog describes it (no data, no oids)."""
    return {name: conn.execute(query).fetchall() for name, query in CATALOG_QUERIES.items()}


def catalog_differences(
    left: dict[str, list[tuple[Any, ...]]], right: dict[str, list[tuple[Any, ...]]]
) -> list[str]:
    """Readable lines for what one snapshot has and the other lacks ('-' left, '+' right)."""
    lines = []
    for name in CATALOG_QUERIES:
        only_left = sorted(set(left[name]) - set(right[name]), key=repr)
        only_right = sorted(set(right[name]) - set(left[name]), key=repr)
        lines += [f"{name} - {row}" for row in only_left]
        lines += [f"{name} + {row}" for row in only_right]
    return lines


# -- kbpg 0.1.0 -------------------------------------------------------------------------------

# Released in 0.1.0 (commit e6764ec): never edited again. A schema change is a new revision.
FROZEN_REVISIONS = {
    "0001_schema.py": "669749a42a0b0c8b4d481d37cc7cc43814d1d5adbd56d627704b345ee698ce21",
    "0002_lexical_index.py": "dcaa5ab18270f72439faa99f7cb547ae33c787024b1e4529b78cbafb4bd2642d",
    "0003_ingest_graph.py": "1bfcc2bf3fd7027c2b1d59b3c5b74b0c032574d1fd4c8bb1c1877d4b75ca8cc5",
}
# 0.1.0's sql/ files as released (`git show e6764ec:sql/...`), kept to build a 0.1.0 database.
FROZEN_SQL = {
    "010-embedding-space.sql": "39ddf22f444142db822aca76a05495fbaf64829191d1808c8e9d497199b6a7ba",
    "020-search-common.sql": "db62e076ed07a7bfb3f02165f0c42022dcfc9aaf9765e2356513597fa428180a",
    "030-search-vector.sql": "66b190250168443aee72187ffb96629f531f651bf49895806959176ea36d51c6",
    "040-search-lexical.sql": "5f13cbc8f70193136c077cec30d6ac0bba73f3e8448a2eab40576259839fa4a0",
    "050-expand-graph.sql": "a2103c54346dfe6d05982e2ee4ef0d9007ece9983111610cd08393d65348cd08",
    "060-fuse.sql": "c3b82ae92ecfa2cf6796bb380daaea83bcc4180b501240b72a10b7479acd6377",
    "070-search.sql": "54f4f78ded8475bd76f749a8506e42502f2a5379a503833afbb9fe52b223c8f1",
}
# alembic's own DDL for the version table, as 0.1.0's `kbpg db upgrade` left it
_VERSION_TABLE_DDL = """
create table kbpg_alembic_version (
    version_num varchar(32) not null,
    constraint kbpg_alembic_version_pkc primary key (version_num)
);
insert into kbpg_alembic_version (version_num) values ('0003');
"""


def _revision_sql(filename: str) -> str:
    spec = importlib.util.spec_from_file_location(
        f"kbpg_frozen_{filename[:4]}", REPO / "migrations" / "versions" / filename
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.UPGRADE)


def build_v0_1_0_schema(conn: psycopg.Connection[Any]) -> None:
    """Schema kb exactly as kbpg 0.1.0's `kbpg db upgrade` made it: revisions 0001-0003, its
    version table, then 0.1.0's sql/ files (not today's: an upgrade must replace them)."""
    for filename in FROZEN_REVISIONS:
        conn.execute(_revision_sql(filename))
    conn.execute(_VERSION_TABLE_DDL)
    for filename in FROZEN_SQL:
        conn.execute((V0_1_0 / "sql" / filename).read_text())


def v0_1_0_rows() -> dict[str, list[dict[str, Any]]]:
    """What 0.1.0's ingest wrote for samples/kb (see fixtures/v0_1_0/export_data.py)."""
    with gzip.open(V0_1_0 / "data.json.gz", "rt", encoding="utf-8") as handle:
        data: dict[str, list[dict[str, Any]]] = json.load(handle)
    return data


_LOADS = {
    "documents": """
        insert into kb.documents
               (id, source, title, category, groups, labels, metadata, content_hash)
        overriding system value
        select * from pg_catalog.jsonb_to_recordset(%s) as r(
               id bigint, source text, title text, category text, groups text[],
               labels text[], metadata jsonb, content_hash text)
         order by id""",
    "chunks": """
        insert into kb.chunks
               (id, document_id, ordinal, section, content, groups, category, labels, embedding)
        overriding system value
        select r.id, r.document_id, r.ordinal, r.section, r.content, r.groups, r.category,
               r.labels, r.embedding::vector
          from pg_catalog.jsonb_to_recordset(%s) as r(
               id bigint, document_id bigint, ordinal integer, section text, content text,
               groups text[], category text, labels text[], embedding text)
         order by id""",
    "edges": """
        insert into kb.edges (src_chunk_id, dst_chunk_id, relation, weight)
        select * from pg_catalog.jsonb_to_recordset(%s) as r(
               src_chunk_id bigint, dst_chunk_id bigint, relation text, weight real)""",
    "chunk_links": """
        insert into kb.chunk_links (chunk_id, target_source, fragment)
        select * from pg_catalog.jsonb_to_recordset(%s) as r(
               chunk_id bigint, target_source text, fragment text)""",
    "chunk_entities": """
        insert into kb.chunk_entities (entity, chunk_id)
        select * from pg_catalog.jsonb_to_recordset(%s) as r(entity text, chunk_id bigint)""",
}


def load_rows(conn: psycopg.Connection[Any], data: dict[str, list[dict[str, Any]]]) -> None:
    """Write the rows as ingest would (same ids), then let the schema derive the rest:
    statistics by its triggers, the lexical cache by kb.refresh_lexical_index()."""
    (space,) = data["embedding_space"]
    # 0.1.0 indexed every space with the vector layout (revision 0007 keeps it on upgrade);
    # at head a space records its layout: the same one, so both catalogs compare equal
    # (by the parameter's name: later revisions add parameters after it)
    layouts = conn.execute(
        "select pg_catalog.count(*) from pg_catalog.pg_proc p"
        " where p.proname = 'set_embedding_space' and p.pronamespace = 'kb'::regnamespace"
        " and 'layout' = any (p.proargnames)"
    ).fetchone()
    layout = ", layout => 'vector'" if layouts is not None and layouts[0] > 0 else ""
    conn.execute(
        f"select kb.set_embedding_space(model_name => %s, vector_dimension => %s{layout})",
        (space["model"], space["dimension"]),
    )
    for table, query in _LOADS.items():
        conn.execute(query, (Jsonb(data[table]),))
    for table in ("documents", "chunks"):
        conn.execute(
            # the table: kb_data's from revision 0028, kb.{table} a view of it
            f"select pg_catalog.setval(pg_catalog.pg_get_serial_sequence(coalesce("
            f"pg_catalog.to_regclass('kb_data.{table}'), 'kb.{table}'::regclass)::text, 'id'),"
            f" (select max(id) from kb.{table}))"
        )
    conn.execute("select * from kb.refresh_lexical_index()")


DATA_SNAPSHOT = {
    "documents": "select id, source, title, category, groups, labels, metadata, content_hash"
    " from kb.documents order by id",
    "chunks": "select id, document_id, ordinal, section, content, groups, category, labels,"
    " embedding::text, tsv::text, token_count from kb.chunks order by id",
    "edges": "select * from kb.edges order by 1, 2, 3",
    "corpus_stats": "select chunk_count, total_tokens from kb.corpus_stats",
    "lexeme_stats": "select lexeme, doc_freq from kb.lexeme_stats order by 1",
    "embedding_space": "select model, dimension, distance from kb.embedding_space",
}


def data_snapshot(conn: psycopg.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    return {name: conn.execute(query).fetchall() for name, query in DATA_SNAPSHOT.items()}
