"""How bench_partitioning.py partitions kb.chunks by tenant: the tenants, the schema rebuild, and
kb._filtered_rows_estimate sized by partitions (none of it is part of kbpg)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import psycopg
from bench_search import build_indexes

from kbpg.store import db as kdb

SMALL, BIG = "t00", "t01"


def tenant_shares(n: int) -> dict[str, int]:
    """n tenants -> share of the documents, in thousandths: t00 1%, t01 25%, the others equal
    shares of the rest (n - 2 must divide 740: 12, 22, 39, 76 tenants)."""
    if n < 3 or 740 % (n - 2):
        raise SystemExit(f"--tenants {n}: n - 2 must divide 740 (12, 22, 39 or 76 tenants)")
    return {SMALL: 10, BIG: 250, **{f"t{i:02d}": 740 // (n - 2) for i in range(2, n)}}


def assigner(tenants: dict[str, int]) -> Callable[[int], tuple[str, str]]:
    """Document d's (group, category): its tenant for both. Slots of 1,000 consecutive
    documents hold each tenant's share."""

    def assign(d: int) -> tuple[str, str]:
        slot = d * 7919 % 1000  # 7919 is prime: every 1,000 documents cover each slot once
        for tenant, share in tenants.items():
            if slot < share:
                return tenant, tenant
            slot -= share
        raise AssertionError("shares add up to 1000")

    return assign


# (table, chunk id column, the tenant column added beside it)
REFERENCES = [
    ("edges", "src_chunk_id", "src_category"),
    ("edges", "dst_chunk_id", "dst_category"),
    ("chunk_links", "chunk_id", "category"),
    ("chunk_entities", "chunk_id", "category"),
]


def rows(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> list[Any]:
    return conn.execute(sql, params or None).fetchall()


class Extras(NamedTuple):
    """What kb_data.chunks (kb.chunks: a view of it) carries besides its columns (definitions as
    SQL text)."""

    triggers: list[str]
    indexes: list[tuple[str, str]]  # name, definition (the non-unique ones)
    policies: list[tuple[str, str, str, str | None, str | None]]  # also kb.edges' on kb.chunks
    grants: list[tuple[str, str, str, str]]  # relation (the view too), relkind, grantee, privileges
    options: str  # reloptions (toast_tuple_target)


def read_extras(conn: psycopg.Connection[Any]) -> Extras:
    """Read while the table is still named kb_data.chunks, so the definitions name it so."""
    return Extras(
        [
            r[0]
            for r in rows(
                conn,
                "select pg_get_triggerdef(oid) from pg_trigger"
                " where tgrelid = 'kb_data.chunks'::regclass and not tgisinternal order by tgname",
            )
        ],
        rows(
            conn,
            "select i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) from pg_index i"
            " where i.indrelid = 'kb_data.chunks'::regclass and not i.indisunique",
        ),
        rows(
            conn,
            "select tablename, policyname, cmd, qual, with_check from pg_policies"
            " where schemaname = 'kb_data' and (tablename = 'chunks' or qual ~ 'kb(_data)?\\.chunks\\M')",
        ),
        rows(
            conn,
            "select c.oid::regclass::text, c.relkind::text, a.grantee::regrole::text,"
            " string_agg(a.privilege_type, ', ') from pg_class c cross join aclexplode(c.relacl) a"
            " where c.oid in ('kb.chunks'::regclass, 'kb_data.chunks'::regclass,"
            " 'kb_data.chunks_id_seq'::regclass)"
            " and a.grantee not in (0, c.relowner) group by 1, 2, 3",
        ),
        rows(
            conn,
            "select coalesce(array_to_string(reloptions, ', '), '') from pg_class"
            " where oid = 'kb_data.chunks'::regclass",
        )[0][0],
    )


def swap_in_partitioned(
    conn: psycopg.Connection[Any], extras: Extras, tenants: Sequence[str]
) -> None:
    """The old table becomes kb_data.chunks_unpartitioned; a partitioned kb_data.chunks (same columns,
    the partition key in its keys, one partition a tenant) takes its name and triggers."""
    for name, _ in extras.indexes:
        conn.execute(f"drop index {name}")
    conn.execute("alter table kb_data.chunks rename to chunks_unpartitioned")
    conn.execute("alter index kb_data.chunks_pkey rename to chunks_unpartitioned_pkey")
    conn.execute(
        "alter index kb_data.chunks_document_id_ordinal_key"
        " rename to chunks_unpartitioned_document_id_ordinal_key"
    )
    conn.execute("alter sequence kb_data.chunks_id_seq rename to chunks_unpartitioned_id_seq")
    conn.execute(
        "create table kb_data.chunks (like kb_data.chunks_unpartitioned including defaults"
        " including identity including constraints including storage including compression"
        " including comments) partition by list (category)"
    )
    conn.execute(
        "alter table kb_data.chunks add constraint chunks_pkey primary key (id, category),"
        " add constraint chunks_document_id_ordinal_key unique (document_id, ordinal, category),"
        " add constraint chunks_document_id_fkey foreign key (document_id)"
        " references kb_data.documents (id) on delete cascade"
    )
    # a partitioned table takes no storage parameters: each partition does
    with_options = f" with ({extras.options})" if extras.options else ""
    for tenant in tenants:
        conn.execute(
            f"create table kb_data.chunks_{tenant} partition of kb_data.chunks"
            f" for values in ('{tenant}'){with_options}"
        )
    conn.execute(
        "select setval('kb_data.chunks_id_seq', (select max(id) from kb_data.chunks_unpartitioned))"
    )
    for trigger in extras.triggers:
        conn.execute(trigger)
    # the statistics are counted again by the triggers on the parent, the cache rebuilt
    conn.execute("update kb.corpus_stats set chunk_count = 0, total_tokens = 0")
    conn.execute("delete from kb.lexeme_stats")
    conn.execute("delete from kb.lexical_blocks")
    conn.execute("delete from kb.lexical_pending")
    conn.execute("delete from kb.lexical_dirty_blocks")
    conn.execute("update kb.lexical_state set watermark = 0, avgdl = 1, refreshed_at = null")


def copy_rows(conn: psycopg.Connection[Any]) -> float:
    """Insert the old table's rows through the parent, 20,000 a statement; seconds taken."""
    columns = ", ".join(
        r[0]
        for r in rows(
            conn,
            "select quote_ident(attname) from pg_attribute where attrelid = 'kb_data.chunks'::regclass"
            " and attnum > 0 and not attisdropped order by attnum",
        )
    )
    (max_id,) = rows(conn, "select coalesce(max(id), 0) from kb_data.chunks_unpartitioned")[0]
    started = time.perf_counter()
    for low in range(0, max_id + 1, 20000):
        conn.execute(
            f"insert into kb_data.chunks ({columns}) overriding system value select {columns}"
            " from kb_data.chunks_unpartitioned where id >= %s and id < %s order by id",
            (low, low + 20000),
        )
    return time.perf_counter() - started


def add_reference_tenants(conn: psycopg.Connection[Any]) -> None:
    """Each table referencing a chunk gets the chunk's tenant beside its id."""
    for table, id_column, tenant_column in REFERENCES:
        conn.execute(f"alter table kb_data.{table} add column {tenant_column} text")
        conn.execute(
            f"update kb_data.{table} r set {tenant_column} = c.category"
            f" from kb_data.chunks c where c.id = r.{id_column}"
        )
        conn.execute(f"alter table kb_data.{table} alter column {tenant_column} set not null")


def add_reference_keys(conn: psycopg.Connection[Any]) -> None:
    """Foreign keys on (chunk id, tenant), and a trigger filling the tenant for writers that
    copy chunk ids only (kbpg's ingest)."""
    tables: dict[str, list[tuple[str, str]]] = {}
    for table, id_column, tenant_column in REFERENCES:
        tables.setdefault(table, []).append((id_column, tenant_column))
    for table, pairs in tables.items():
        fill = ""
        for id_column, tenant_column in pairs:
            conn.execute(
                f"alter table kb_data.{table} add foreign key ({id_column}, {tenant_column})"
                " references kb_data.chunks (id, category) on delete cascade on update cascade"
            )
            fill += (
                f"if new.{tenant_column} is null then select c.category into new.{tenant_column}"
                f" from kb_data.chunks c where c.id = new.{id_column}; end if;\n"
            )
        conn.execute(
            f"create function kb._{table}_tenant() returns trigger language plpgsql"
            f" set search_path = pg_catalog, pg_temp as $$ begin {fill} return new; end $$"
        )
        conn.execute(
            f"create trigger {table}_tenant before insert on kb_data.{table}"
            f" for each row execute function kb._{table}_tenant()"
        )


def partition_chunks(
    conn: psycopg.Connection[Any], url: str, tenants: Sequence[str], build: bool = True
) -> dict[str, Any]:
    """Rebuild kb.chunks as a table partitioned by LIST (category), one partition a tenant (see
    bench_partitioning's docstring), and (`build`) its GIN, HNSW and impact cache as after a
    first load; timings and what the drop took with it (`dropped`) returned."""
    timings: dict[str, Any] = {}
    conn.autocommit = False
    extras = read_extras(conn)
    swap_in_partitioned(conn, extras, tenants)
    timings["insert_s"] = copy_rows(conn)
    add_reference_tenants(conn)
    dropped: list[str] = []
    conn.add_notice_handler(lambda d: dropped.append(d.message_detail or ""))
    conn.execute("set client_min_messages = notice")
    conn.execute("drop table kb_data.chunks_unpartitioned cascade")
    conn.execute("reset client_min_messages")
    timings["dropped"] = [line for text in dropped for line in text.splitlines()]
    # the view of the current knowledge base's chunks (revision 0028) went with the old table
    conn.execute(
        "create view kb.chunks with (security_invoker = true) as select * from kb_data.chunks"
        " where kb_id = (select kb._current_kb()) with cascaded check option"
    )
    add_reference_keys(conn)
    for table, name, cmd, qual, check in extras.policies:
        conn.execute(
            f"create policy {name} on kb_data.{table} for {cmd} to public"
            + (f" using ({qual})" if qual else "")
            + (f" with check ({check})" if check else "")
        )
    for relation, kind, grantee, privileges in extras.grants:
        sequence = "sequence " if kind == "S" else ""
        conn.execute(f"grant {privileges} on {sequence}{relation} to {grantee}")
    conn.commit()
    # the functions the drop took with it (SQL-standard bodies bound to the old table)
    kdb.upgrade(url)
    started = time.perf_counter()
    for name, definition in extras.indexes:
        if not build or name not in ("kb_data.chunks_tsv_gin", "kb_data.chunks_embedding_hnsw"):
            conn.execute(definition)
    conn.commit()
    timings["filter_indexes_s"] = time.perf_counter() - started
    if build:
        build_indexes(conn, url, timings)
    return timings
