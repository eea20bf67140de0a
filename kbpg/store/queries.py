"""kbpg's SQL, named and kept in one place (migrations and the sql/ files live elsewhere)."""

from __future__ import annotations

import functools
import re
from typing import Final

from psycopg import sql

# -- search -----------------------------------------------------------------------------------

# readers hold no table privilege: what they read comes from kb functions (sql/075)
EMBEDDING_SPACE: Final = "select model, dimension from kb.get_embedding_space()"
SEARCH_COLUMNS: Final = (
    "rank, chunk_id, document_id, source, title, section, content, score, similarity, "
    "vector_rank, lexical_rank, graph_rank, fused_rank"
)
# kb.search_knowledge_bases has no graph arm
SEARCH_ACROSS_COLUMNS: Final = (
    "rank, knowledge_base, chunk_id, document_id, source, title, section, content, score, "
    "similarity, vector_rank, lexical_rank, null::integer as graph_rank, fused_rank"
)
# Where the query's words are in each result's text, and its snippet, in the results' order.
HIGHLIGHT: Final = (
    "select h.highlights, h.snippet, h.snippet_start"
    " from pg_catalog.unnest(%(contents)s::text[]) with ordinality as c(content, ord)"
    " cross join lateral kb.highlight(c.content, %(query)s, %(length)s) h order by c.ord"
)

# Facet counts over the search's match set, with the same filters (kb.facets).
FACETS: Final = (
    "select facet, value, documents, chunks from kb.facets(%(query)s, %(facets)s::text[],"
    " %(groups)s::text[], %(category)s::text, %(labels)s::text[], %(filter)s::jsonb)"
)

# After a reranker: its order through the per-document cap and the cut, as 1-based positions
# into that order ({max_per_doc} is empty for kb.cap_per_document's own default).
CAP_AND_CUT: Final = (
    "select p.input_rank from kb.cap_per_document(%(ids)s::bigint[], %(docs)s::bigint[]"
    "{max_per_doc}) p where p.rank <= %(top)s order by p.rank"
)


def call_search(types: dict[str, str], names: list[str], across: bool = False) -> sql.Composed:
    """`select <columns> from kb.search(name => %(name)s::type, ...)` for the given names
    (no cast where the type is empty); `across`: kb.search_knowledge_bases, the same columns
    and the knowledge base of each chunk."""
    named = [
        sql.SQL("{} => {}").format(sql.Identifier(name), sql.Placeholder(name))
        + (sql.SQL("::" + types[name]) if types[name] else sql.SQL(""))
        for name in names
    ]
    return sql.SQL("select {} from kb.{}({})").format(
        sql.SQL(SEARCH_ACROSS_COLUMNS if across else SEARCH_COLUMNS),
        sql.SQL("search_knowledge_bases" if across else "search"),
        sql.SQL(", ").join(named),
    )


def call_ranked_documents(function: str, names: list[str]) -> sql.Composed:
    """`select document_id from kb.<function>(name => %(name)s, ...) order by rank` (eval)."""
    named = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(name), sql.Placeholder(name)) for name in names
    )
    return sql.SQL("select document_id from kb.{}({}) order by rank").format(
        sql.Identifier(function), named
    )


# -- sessions ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def call_search_text(
    types: tuple[tuple[str, str], ...], names: tuple[str, ...], across: bool = False
) -> str:
    """call_search as text, composed once per set of arguments (every search runs it)."""
    return call_search(dict(types), list(names), across).as_string(None)


# the knowledge base of the session (a connection opened before it was known)
SELECT_KNOWLEDGE_BASE: Final = "select pg_catalog.set_config('kbpg.kb_id', %s, false)"


@functools.lru_cache(maxsize=1024)
def local_settings_text(
    role: str | None, timeouts: tuple[tuple[str, int], ...], knowledge_base: str | None = None
) -> str:
    """local_settings as text, composed once per role, timeouts and knowledge base (every
    session runs it)."""
    return local_settings(role, dict(timeouts), knowledge_base).as_string(None)


def local_settings(
    role: str | None, timeouts: dict[str, int], knowledge_base: str | None = None
) -> sql.Composed:
    """One round trip: SET LOCAL ROLE (when a role is given), the knowledge base looked up by
    name as that role (KB011 when it may not read it), and the local timeouts (ms)."""
    statements = []
    if role is not None:
        statements.append(sql.SQL("set local role {}").format(sql.Identifier(role)))
    if knowledge_base is not None:
        statements.append(
            sql.SQL(
                "select pg_catalog.set_config('kbpg.kb_id', kb.knowledge_base_id({})::text, true)"
            ).format(sql.Literal(knowledge_base))
        )
    statements += [
        sql.SQL("set local {} = {}").format(sql.Identifier(name), sql.Literal(str(value)))
        for name, value in timeouts.items()
    ]
    return sql.SQL("; ").join(statements)


# -- ingest -----------------------------------------------------------------------------------

# Serialises kbpg writers (ingest, delete, reembed) on one database; a session-level lock,
# released when the connection ends, even on kill.
WRITE_LOCK: Final = "select pg_catalog.pg_advisory_lock(%s)"
WRITE_TRY_LOCK: Final = "select pg_catalog.pg_try_advisory_lock(%s)"
# Waiting for the write lock gives up after this (ms); local to the transaction that waits.
WRITE_LOCK_WAIT: Final = "select pg_catalog.set_config('lock_timeout', %s, true)"
# Who holds it (a bigint key below 2^32 is classid 0, objid key, objsubid 1).
WRITE_LOCK_HOLDER: Final = """
select a.pid, a.application_name, a.backend_start
  from pg_catalog.pg_locks l
  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
 where l.locktype = 'advisory' and l.granted and l.classid = 0 and l.objid = %s
   and l.objsubid = 1
 limit 1
"""
WRITE_UNLOCK: Final = "select pg_catalog.pg_advisory_unlock(%s)"
# The same lock for one transaction (a sync worker writes batch by batch).
WRITE_XACT_LOCK: Final = "select pg_catalog.pg_advisory_xact_lock(%s)"
WRITE_XACT_TRY_LOCK: Final = "select pg_catalog.pg_try_advisory_xact_lock(%s)"
LOCK_TIMEOUT: Final = "select pg_catalog.current_setting('lock_timeout')"
SET_EMBEDDING_SPACE: Final = (
    "select kb.set_embedding_space(model_name => %s, vector_dimension => %s, model_languages => %s)"
)
EXISTING_DOCUMENTS: Final = (
    "select source, id, content_hash from kb.documents where source = any(%s)"
)
# Ids for a batch's new documents and all its chunks, taken ahead of the write (on the
# preparer's connection): the writer then copies rows with their ids and never looks them up
# (looking up the chunks' ids after each COPY was planned as a scan of kb.chunks at times).
# A sequence is not transactional: ids of a batch that fails are skipped, as on any rollback.
ALLOCATE_IDS: Final = """
select array(select pg_catalog.nextval(s.documents) from pg_catalog.generate_series(1, %s)),
       array(select pg_catalog.nextval(s.chunks) from pg_catalog.generate_series(1, %s))
  from (select pg_catalog.pg_get_serial_sequence('kb_data.documents', 'id')::pg_catalog.regclass,
               pg_catalog.pg_get_serial_sequence('kb_data.chunks', 'id')::pg_catalog.regclass)
       as s(documents, chunks)
"""
ALL_DOCUMENTS: Final = "select id, source from kb.documents"
UPDATE_DOCUMENT: Final = """
update kb_data.documents
   set title = %s, category = %s, groups = %s, labels = %s, metadata = %s,
       content_hash = %s, updated_at = now()
 where id = %s
   and kb_id = (select kb._current_kb())
"""
DELETE_CHUNKS_OF: Final = (
    "delete from kb_data.chunks where kb_id = (select kb._current_kb()) and document_id = any(%s)"
)
DELETE_DOCUMENTS_BY_ID: Final = (
    "delete from kb_data.documents where kb_id = (select kb._current_kb()) and id = any(%s)"
)
# COPY writes the given ids into the identity columns (as OVERRIDING SYSTEM VALUE would)
COPY_DOCUMENTS: Final = (
    "copy kb_data.documents (id, source, title, category, groups, labels, metadata, content_hash)"
    " from stdin"
)
COPY_CHUNKS: Final = (
    "copy kb_data.chunks (id, document_id, ordinal, section, content, groups, category, labels,"
    " embedding, context, context_key) from stdin (format binary)"
)
CHUNK_TYPES: Final = [
    "int8", "int8", "int4", "text", "text", "text[]", "text", "text[]", "vector", "text", "text"
]  # fmt: skip
COPY_EDGES: Final = (
    "copy kb_data.edges (src_chunk_id, dst_chunk_id, relation, weight, document_id) from stdin"
)
COPY_LINKS: Final = (
    "copy kb_data.chunk_links (chunk_id, target_source, fragment, document_id) from stdin"
)
COPY_ENTITIES: Final = "copy kb_data.chunk_entities (entity, chunk_id, document_id) from stdin"
REFRESH_LEXICAL_INDEX: Final = "select * from kb.refresh_lexical_index()"
# COPY FROM is refused on a table whose row-level security applies to the role (kbpg access
# enable; a writer role is subject to it, its policy admits every row): copy into a temporary
# table instead and INSERT from it, which the policies check
ROW_SECURITY_ACTIVE: Final = "select pg_catalog.row_security_active('kb_data.chunks'::regclass)"
_COPY = re.compile(r"copy kb_data\.(\w+) \(([^)]*)\) from stdin(.*)", re.DOTALL)


def staged_copy(copy_sql: str) -> tuple[str, str, str, str]:
    """For one of the COPY_* statements: create a stage, copy into it, insert, drop it."""
    match = _COPY.fullmatch(copy_sql)
    if match is None:
        raise ValueError(f"not a COPY_* statement: {copy_sql!r}")
    table, columns, options = match.groups()
    stage = f"kbpg_stage_{table}"
    # an identity column's value is only taken from an INSERT that says so
    overriding = " overriding system value" if columns.split(",")[0] == "id" else ""
    return (
        f"create temp table {stage} on commit drop as select {columns} from kb.{table} with no data",
        f"copy {stage} ({columns}) from stdin{options}",
        f"insert into kb_data.{table} ({columns}){overriding} select {columns} from {stage}",
        f"drop table {stage}",
    )


# Link and entity edges, derived from kb.chunk_links / kb.chunk_entities over the whole
# knowledge base and applied as a difference: a run that changes nothing writes nothing.
REFRESH_EDGES: Final = """
with link_edges as (
    select l.chunk_id as src,
           coalesce(
               (select c.id from kb.chunks c
                 where c.document_id = d.id and l.fragment <> ''
                   and trim(both '-' from regexp_replace(lower(
                         regexp_replace(c.section, '^.* > ', '')), '[^a-z0-9]+', '-', 'g'))
                       = lower(l.fragment)
                 order by c.ordinal limit 1),
               (select c.id from kb.chunks c where c.document_id = d.id
                 order by c.ordinal limit 1)) as dst,
           'link'::text as relation,
           %(link_weight)s::real as weight,
           l.document_id
      from kb.chunk_links l
      join kb.documents d on d.source = l.target_source
), first_mention as (
    select distinct on (e.entity, c.document_id) e.entity, c.document_id, c.id
      from kb.chunk_entities e join kb.chunks c on c.id = e.chunk_id
     order by e.entity, c.document_id, c.ordinal
), rare as (
    select entity, document_id, id, count(*) over (partition by entity) as df
      from first_mention
), entity_edges as (
    select least(a.id, b.id) as src, greatest(a.id, b.id) as dst, 'entity'::text as relation,
           max(2.0 / a.df)::real as weight,
           min(case when a.id < b.id then a.document_id else b.document_id end) as document_id
      from rare a join rare b on a.entity = b.entity and a.document_id < b.document_id
     where a.df between 2 and %(max_docs)s
     group by 1, 2
), desired as (
    select src, dst, relation, max(weight) as weight, min(document_id) as document_id
      from (select * from link_edges union all select * from entity_edges) x
     where dst is not null and src <> dst
     group by src, dst, relation
), removed as (
    delete from kb_data.edges e
     where e.relation in ('link', 'entity')
       and not exists (select 1 from desired d where d.src = e.src_chunk_id
                          and d.dst = e.dst_chunk_id and d.relation = e.relation)
       and e.kb_id = (select kb._current_kb())
    returning 1
), reweighted as (
    update kb_data.edges e set weight = d.weight
      from desired d
     where d.src = e.src_chunk_id and d.dst = e.dst_chunk_id and d.relation = e.relation
       and e.weight <> d.weight
       and e.kb_id = (select kb._current_kb())
    returning 1
), added as (
    insert into kb_data.edges (src_chunk_id, dst_chunk_id, relation, weight, document_id)
    select d.src, d.dst, d.relation, d.weight, d.document_id from desired d
     where not exists (select 1 from kb.edges e where e.src_chunk_id = d.src
                          and e.dst_chunk_id = d.dst and e.relation = d.relation)
    returning 1
)
select (select count(*) from added), (select count(*) from removed),
       (select count(*) from reweighted)
"""

# On a distributed knowledge base (kbpg db distribute) the same edges, worked out shard by shard.
REFRESH_EDGES_DISTRIBUTED: Final = (
    "select added, removed from kb._refresh_derived_edges("
    "link_weight => %(link_weight)s::real, max_docs => %(max_docs)s::integer)"
)
# what kb._distributed() asks, without calling it: a reader may execute only the reader API
DISTRIBUTED: Final = "select pg_catalog.to_regclass('kb_data.bm25_shard_stats') is not null"

# -- maintenance ------------------------------------------------------------------------------

# What the caller may read only (sql/075: readers hold no table privilege).
LIST_DOCUMENTS: Final = (
    "select source, title, category, groups, labels, chunks, updated_at"
    " from kb.list_documents(group_name => %(group)s)"
    " order by source limit %(limit)s offset %(offset)s"
)
# One document's chunks in reading order: the first of the sources that names one (a path as
# given, then its absolute form).
DOCUMENT_CHUNKS: Final = (
    "select source, title, category, groups, labels, ordinal, section, content"
    " from kb.get_document(variadic %(sources)s::text[])"
)
DELETE_DOCUMENT_BY_SOURCE: Final = (
    "delete from kb_data.documents where kb_id = (select kb._current_kb()) and source = any(%s)"
    " returning source"
)
# a source as given or resolved, or a folder: the documents ingested from under it
DELETE_DOCUMENTS_BY_PATH: Final = """
delete from kb_data.documents d
 where d.kb_id = (select kb._current_kb()) and (d.source = any(%(sources)s)
    or exists (select 1 from pg_catalog.unnest(%(folders)s::text[]) f
                where pg_catalog.starts_with(d.source, f)))
returning d.source
"""
DELETE_ALL_DOCUMENTS: Final = (
    "delete from kb_data.documents where kb_id = (select kb._current_kb())"
)
STATS: Final = (
    "select documents, chunks, chunks_without_embedding, edges, model, dimension, layout,"
    " coalesce(indexed, false), bm25_chunks, bm25_tokens, bm25_lexemes, language from kb.stats()"
)
# a partitioned table or index (kind p, I: no storage of its own) counts as the sum of its
# partitions, which are not listed on their own
RELATION_SIZES: Final = """
select c.relname, case c.relkind when 'p' then 'r' when 'I' then 'i' else c.relkind::text end,
       coalesce(sum(pg_catalog.pg_relation_size(t.relid)), 0),
       coalesce(sum(pg_catalog.pg_total_relation_size(t.relid)), 0)
  from pg_catalog.pg_class c
 cross join lateral (select c.oid as relid where c.relkind in ('r', 'i')
                     union all
                     select p.relid from pg_catalog.pg_partition_tree(c.oid) p
                      where c.relkind in ('p', 'I') and p.isleaf) t
 where c.relnamespace = 'kb_data'::regnamespace and c.relkind in ('r', 'i', 'p', 'I')
   and not c.relispartition
 group by c.relname, c.relkind
 order by 2 desc, 1
"""
# The same on a distributed knowledge base (kbpg db distribute): the shell tables on the
# coordinator are empty, so distributed and reference tables count their shards (every
# placement: a reference table once per node) and their indexes the shards' indexes.
RELATION_SIZES_DISTRIBUTED: Final = r"""
select c.relname, c.relkind::text, s.size, s.total
  from pg_catalog.pg_class c
  left join pg_catalog.pg_dist_partition p on p.logicalrelid = c.oid
 cross join lateral (
     select case when p.logicalrelid is null then pg_catalog.pg_relation_size(c.oid)
                 else pg_catalog.citus_relation_size(c.oid) end as size,
            case when p.logicalrelid is null then pg_catalog.pg_total_relation_size(c.oid)
                 else pg_catalog.citus_total_relation_size(c.oid) end as total) s
 where c.relnamespace = 'kb_data'::regnamespace and c.relkind = 'r'
union all
select i.relname, 'i', s.size, s.size
  from pg_catalog.pg_index x
  join pg_catalog.pg_class i on i.oid = x.indexrelid
  left join pg_catalog.pg_dist_partition p on p.logicalrelid = x.indrelid
 cross join lateral (
     select case when p.logicalrelid is null then pg_catalog.pg_relation_size(i.oid)
                 else (select coalesce(pg_catalog.sum(r.result::bigint), 0)
                         from pg_catalog.run_command_on_shards(p.logicalrelid, pg_catalog.format(
                              'select pg_catalog.pg_relation_size(''kb_data.%s_'' || '
                              'pg_catalog.substring(''%%s'', ''_(\d+)$''))', i.relname)) r
                        where r.success) end as size) s
 where i.relnamespace = 'kb_data'::regnamespace
 order by 2 desc, 1
"""
RESET_EMBEDDING_SPACE: Final = (
    "select kb.reset_embedding_space(model_name => %s, vector_dimension => %s,"
    " model_languages => %s)"
)
# what a command embeds with when not told (the recorded model, else the language's default),
# and the vector arm's weight kb.search uses when given none (0: the model does not know it)
MODEL_DEFAULTS: Final = (
    "select model, language, language_is_english, vector_weight from kb.model_defaults()"
)
# the embedding column's own type, wherever the vector extension lives
REEMBED_TABLE: Final = (
    "create temporary table kbpg_reembed on commit drop"
    " as select id, embedding from kb.chunks with no data"
)
REEMBED_READ: Final = "select id, section, content, context from kb.chunks order by id"
REEMBED_COPY: Final = "copy kbpg_reembed (id, embedding) from stdin (format binary)"
REEMBED_APPLY: Final = (
    "update kb_data.chunks c set embedding = r.embedding from kbpg_reembed r"
    " where c.kb_id = (select kb._current_kb()) and r.id = c.id"
)

# -- eval and status --------------------------------------------------------------------------

HAS_EDGES: Final = "select exists (select 1 from kb.edges)"
SERVER_VERSION: Final = "show server_version"
VECTOR_VERSION: Final = "select extversion from pg_catalog.pg_extension where extname = 'vector'"

# -- prewarming (sql/085-prewarm.sql) ---------------------------------------------------------

PREWARM_AVAILABLE: Final = (
    "select exists (select 1 from pg_catalog.pg_available_extensions where name = 'pg_prewarm'),"
    " pg_catalog.to_regprocedure('kb.prewarm(double precision)') is not null"
)
CREATE_PREWARM: Final = "create extension if not exists pg_prewarm"
PREWARM: Final = "select mode, sum(bytes) from kb.prewarm() group by mode"


def create_database(name: str) -> sql.Composed:
    return sql.SQL("create database {}").format(sql.Identifier(name))


def drop_database(name: str) -> sql.Composed:
    return sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))


# -- access control (sql/080-access.sql) -------------------------------------------------------

ACCESS_SETUP: Final = "select reader, writer from kb.access_setup(reader_role => %(reader)s, writer_role => %(writer)s)"
ACCESS_GRANT: Final = (
    "select role, group_name from kb.grant_groups(role_name => %(role)s, groups => %(groups)s)"
)
ACCESS_REVOKE: Final = (
    "select role, group_name from kb.revoke_groups(role_name => %(role)s, groups => %(groups)s)"
)
ACCESS_LIST: Final = (
    "select role, group_name, granted_at from kb.list_grants(role_name => %(role)s)"
)
ACCESS_STATUS: Final = (
    "select enforced, tables_enforced, tables_total, reader_role, writer_role,"
    " lexical_cache_split, visible_groups, reads_all from kb.access_status()"
)
ACCESS_ENABLE: Final = "select kb.access_enable()"
ACCESS_DISABLE: Final = "select kb.access_disable()"

# -- contextual retrieval ---------------------------------------------------------------------

CONTEXT_READ: Final = (
    "select c.document_id, coalesce(nullif(d.title, ''), d.source), c.id, c.section, c.content,"
    " c.context, c.context_key from kb.chunks c join kb.documents d on d.id = c.document_id"
    " order by c.document_id, c.ordinal"
)
# the document id too: on a distributed knowledge base it names the one shard to update
CONTEXT_WRITE: Final = (
    "update kb_data.chunks set context = %s, context_key = %s, embedding = %s"
    " where kb_id = (select kb._current_kb()) and id = %s and document_id = %s"
)


# -- the vector index (kbpg.indexing) ---------------------------------------------------------

INDEX_BUILD_INPUTS: Final = """
select e.layout, e.dimension, s.chunk_count,
       pg_catalog.pg_size_bytes(pg_catalog.current_setting('maintenance_work_mem'))
  from kb.embedding_space e, kb.corpus_stats s
"""
INDEX_PROGRESS: Final = (
    "select phase, tuples_done, tuples_total, partitions_done, partitions_total"
    " from pg_catalog.pg_stat_progress_create_index where pid = %s"
)
SPACE_LAYOUT_AND_CHUNKS: Final = (
    "select e.layout, s.chunk_count from kb.embedding_space e, kb.corpus_stats s"
)
SET_LOCAL: Final = "select pg_catalog.set_config(%s, %s, true)"
SET_EMBEDDING_LAYOUT: Final = "select kb.set_embedding_layout(%s)"
VECTOR_INDEX_PRESENT: Final = "select kb._vector_index(kb._current_kb()) is not null"
DROP_VECTOR_INDEX: Final = "select kb._drop_vector_index()"
# other sessions holding a lock on kb.chunks (its state and start: visible to the same role or
# pg_read_all_stats only, NULL otherwise)
CHUNKS_LOCK_HOLDERS: Final = """
select distinct a.pid, a.usename, a.application_name, a.state, a.xact_start
  from pg_catalog.pg_locks l
  join pg_catalog.pg_stat_activity a on a.pid = l.pid
 where l.locktype = 'relation' and l.relation = 'kb_data.chunks'::pg_catalog.regclass
   and l.granted and l.pid <> pg_catalog.pg_backend_pid()
 order by a.pid
"""
# dropping or building the index takes its owner's privileges (those of kb.chunks' owner)
MAY_REBUILD_VECTOR_INDEX: Final = (
    "select pg_catalog.pg_has_role(c.relowner, 'USAGE') from pg_catalog.pg_class c"
    " where c.oid = 'kb_data.chunks'::pg_catalog.regclass"
)
HAS_EMBEDDING_SPACE: Final = "select 1 from kb.embedding_space"
WANTS_VECTOR_INDEX: Final = "select kb._wants_vector_index()"


# -- readiness ------------------------------------------------------------------------------

# where the primary's WAL is (a primary that is itself a standby: what it has replayed)
WAL_POSITION: Final = """
select case when pg_catalog.pg_is_in_recovery() then pg_catalog.pg_last_wal_replay_lsn()
            else pg_catalog.pg_current_wal_lsn() end::text
"""
# a standby's replay: position, seconds since the last replayed transaction, paused (when the
# role may ask: pg_is_wal_replay_paused is not granted to PUBLIC on every version)
REPLAY_STATE: Final = """
select pg_catalog.pg_is_in_recovery(),
       pg_catalog.pg_last_wal_replay_lsn()::text,
       extract(epoch from pg_catalog.now() - pg_catalog.pg_last_xact_replay_timestamp())::float8,
       case when pg_catalog.pg_is_in_recovery() and pg_catalog.has_function_privilege(
                 'pg_catalog.pg_is_wal_replay_paused()', 'execute')
            then pg_catalog.pg_is_wal_replay_paused() end
"""

# -- table sources (sql/090-table-sources.sql) ------------------------------------------------

SOURCE_COLUMNS: Final = (
    "name, source_table, key_columns, text_column, title_column, groups_column, category_column,"
    " labels_column, metadata_columns, notify, version, created_at, altered_at, queued, claimed,"
    " errors, oldest_queued_at, backfill_state, backfill_enqueued, backfill_total,"
    " backfill_done_at, documents"
)
SOURCE_ADD: Final = (
    "select name, table_name, key_columns, triggers from kb.add_table_source("
    "%(name)s, %(table)s::regclass, id => %(id)s, text => %(text)s, title => %(title)s,"
    " groups => %(groups)s, category => %(category)s, labels => %(labels)s,"
    " metadata => %(metadata)s::text[], notify => %(notify)s)"
)
SOURCE_ALTER: Final = (
    "select name, table_name, key_columns, triggers from kb.alter_table_source("
    "%(name)s, text => %(text)s, title => %(title)s, groups => %(groups)s,"
    " category => %(category)s, labels => %(labels)s, metadata => %(metadata)s::text[],"
    " notify => %(notify)s)"
)
SOURCE_REMOVE: Final = (
    "select name, documents_deleted, triggers_left"
    " from kb.remove_table_source(%(name)s, drop_documents => %(drop)s)"
)
SOURCE_RESYNC: Final = "select kb.resync_table_source(%(name)s)"
SOURCE_LIST: Final = f"select {SOURCE_COLUMNS} from kb.list_table_sources(%(name)s)"
SOURCE_ERRORS: Final = (
    "select source_name, key, document, error, attempts, first_failed_at, last_failed_at,"
    " retry_at from kb.list_source_errors(%(name)s)"
)
SOURCE_RETRY: Final = "select kb.retry_source_errors(%(name)s)"

# The sync worker. Its session holds the advisory lock (SYNC_LOCK_CLASS, worker) while it has
# claims: a claim whose lock is free belongs to a worker that is gone (kb._source_reclaim).
SYNC_LOCK_CLASS: Final = 0x6B627073  # "kbps"
SYNC_CHANNEL: Final = "kbpg_sync"
SYNC_LOCK: Final = "select pg_catalog.pg_try_advisory_lock(%s, %s)"
SYNC_UNLOCK: Final = "select pg_catalog.pg_advisory_unlock(%s, %s)"
SYNC_LISTEN: Final = f"listen {SYNC_CHANNEL}"
SYNC_UNLISTEN: Final = f"unlisten {SYNC_CHANNEL}"
# dropped: the table is gone (kb._source_table raises, naming it and what to run)
SYNC_SOURCES: Final = """
select s.id, s.name, s.backfill_state, s.key_columns,
       not exists (select 1 from pg_catalog.pg_class c where c.oid = s.relation) as dropped
  from kb.table_sources s
 order by s.name
"""
SYNC_CHECK_TABLE: Final = "select kb._source_table(s) from kb.table_sources s where s.id = %s"
# a source's table (schema-qualified) and the role to grant it to: kbpg's writer role, or this one
SYNC_SOURCE_TABLE: Final = """
select pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
       coalesce((select a.writer_role from kb.access_settings a), current_user)
  from kb.table_sources s
  join pg_catalog.pg_class c on c.oid = s.relation
  join pg_catalog.pg_namespace n on n.oid = c.relnamespace
 where s.id = %s
"""
SYNC_RECLAIM: Final = "select kb._source_reclaim(%s)"
SYNC_REQUEUE_ERRORS: Final = "select kb._source_requeue_errors(%s)"
SYNC_BACKFILL: Final = (
    "select enqueued, state, total, done from kb._source_backfill(%s, %s, worker => %s)"
)
SYNC_PENDING: Final = "select count(*) from kb.source_queue where source_id = any(%s) and op = 'B'"
SYNC_CLAIM: Final = "select source_id, key, op, enqueued_at from kb._source_claim(%s, %s, %s)"
SYNC_ROWS: Final = (
    "select key, document, present, body, title, groups, category, labels, metadata"
    " from kb._source_rows(%s, %s)"
)
SYNC_ORPHANS: Final = "select document from kb._source_orphans(%s)"
SYNC_SETTLE: Final = "select kb._source_settle(%s, %s, %s, %s)"
SYNC_RELEASE: Final = "select kb._source_release(%s, %s)"
SYNC_QUEUED: Final = (
    "select exists (select 1 from kb.source_queue q where q.source_id = any(%(ids)s)"
    " and not exists (select 1 from kb.source_claims c"
    " where c.source_id = q.source_id and c.key = q.key))"
    " or exists (select 1 from kb.source_errors e where e.source_id = any(%(ids)s)"
    " and e.retry_at <= now())"
    " or exists (select 1 from kb.table_sources s where s.id = any(%(ids)s)"
    " and s.backfill_state <> 'done')"
)

# -- the knowledge base's language (sql/015) ---------------------------------------------------

LANGUAGE: Final = "select name from kb.language"
LANGUAGE_CHANGE_BEGIN: Final = (
    "select language_before, language_after, chunks"
    " from kb._language_change_begin(language => %(language)s)"
)
LANGUAGE_REANALYSE: Final = "select kb._language_reanalyse(batch_size => %(batch)s)"
LANGUAGE_CHANGE_FINISH: Final = (
    "select chunks, lexemes, blocks_rebuilt from kb._language_change_finish()"
)
# whether a configuration's words are English to the model (sql/015)
LANGUAGE_IS_ENGLISH: Final = "select kb._language_is_english(%(language)s)"
RESOLVE_LANGUAGE: Final = "select kb._resolve_language(%(language)s)"

# indexed metadata keys (sql/045): filter bitmaps and value caches for a key's values
INDEX_METADATA_KEY: Final = "select kb.index_metadata_key(%s)"
UNINDEX_METADATA_KEY: Final = "select kb.unindex_metadata_key(%s)"
# `kbpg stats`: the indexed keys' names, for a role that may read them (a reader may not; a
# query naming the table fails for it however it is guarded, so the privilege is asked first)
MAY_READ_INDEXED_METADATA_KEYS: Final = (
    "select pg_catalog.has_table_privilege('kb.indexed_metadata_keys', 'select')"
)
INDEXED_METADATA_KEY_NAMES: Final = "select key from kb.indexed_metadata_keys order by key"
LIST_INDEXED_METADATA_KEYS: Final = (
    "select key, indexed_at, values, cached_values from kb.list_indexed_metadata_keys()"
)


# -- knowledge bases --------------------------------------------------------------------------

KNOWLEDGE_BASES: Final = (
    "select name, language, model, dimension, documents, chunks, readers, created_at"
    " from kb.knowledge_bases()"
)
KNOWLEDGE_BASE: Final = (
    "select name, language, model, dimension, documents, chunks, readers, created_at"
    " from kb._knowledge_base_row(%s)"
)
KNOWLEDGE_BASE_ID: Final = "select kb.knowledge_base_id(%s)"
CHECK_KNOWLEDGE_BASE_NAME: Final = "select kb._check_knowledge_base_name(%s)"
CREATE_KNOWLEDGE_BASE: Final = "select kb.create_knowledge_base(%s, %s, %s, %s)"
RENAME_KNOWLEDGE_BASE: Final = "select kb.rename_knowledge_base(%s, %s)"
SET_KNOWLEDGE_BASE_READERS: Final = "select kb.set_knowledge_base_readers(%s, %s)"
DROP_KNOWLEDGE_BASE: Final = "select documents, chunks from kb.drop_knowledge_base(%s)"
# default's HNSW limited to its rows, built before the second knowledge base is created
SHARED_DEFAULT_VECTOR_INDEX: Final = "select kb._shared_default_vector_index()"
DROP_SHARED_DEFAULT_VECTOR_INDEX: Final = (
    "drop index concurrently if exists kb_data.chunks_embedding_hnsw_new"
)
SET_SESSION: Final = "select pg_catalog.set_config(%s, %s, false)"
RESET_SESSION: Final = "select pg_catalog.set_config(%s, null, false)"
