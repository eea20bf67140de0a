"""`kbpg db distribute`: a knowledge base on a Citus coordinator turned into the distributed layout."""

from __future__ import annotations

from dataclasses import dataclass

from kbpg.errors import KbpgError
from kbpg.store import db as kdb

# The layout (sql/015-distributed.sql says why the statistics are kept per shard):
#   distributed by document id, co-located: documents (id), chunks, edges (the source chunk's
#   document), chunk_links, chunk_entities, and beside them bm25_shard_stats, lexical_pending,
#   lexical_dirty_blocks (written by the shards' triggers);
#   reference tables (a copy on every node): embedding_space, lexical_state, access_settings,
#   access_grants;
#   on the coordinator alone: lexical_blocks (the impact cache the lexical arm sums there),
#   lexical_filter_masks and the filter value caches (lexical_filter_caches, _slots, _blocks;
#   all empty: the distributed layout builds neither) and kbpg's alembic version table.
# Chunk ids stay global: kbpg takes them from the coordinator's identity sequence.
#
# One DO block, so that the script is one transaction that does nothing on a knowledge base
# already distributed. It is also what `kbpg db distribute --sql` prints.
SCRIPT = r"""
do $distribute$
declare
    shards constant integer := {shards};
    workers integer;
    chunks_kept integer := 0;
    t text;
begin
    if not exists (select 1 from pg_catalog.pg_extension where extname = 'citus') then
        raise exception 'this database has no Citus extension: kbpg db distribute needs a Citus coordinator'
            using errcode = '0A000',
                  hint = 'on a Citus coordinator run CREATE EXTENSION citus and add the workers '
                         '(SELECT citus_add_node(host, port)), then distribute';
    end if;
    if kb._distributed() then
        raise notice 'kbpg: the knowledge base is distributed already';
        return;
    end if;
    select pg_catalog.count(*) into workers from pg_catalog.pg_dist_node
     where noderole = 'primary' and isactive and shouldhaveshards;
    if workers = 0 then
        raise exception 'no Citus node takes shards'
            using errcode = '55000', hint = 'add workers first: SELECT citus_add_node(host, port)';
    end if;
    if kb._access_enforced() then
        raise exception 'access control is enforced: its row-level security policies read other '
                        'tables, which Citus does not allow on distributed tables'
            using errcode = '0A000',
                  hint = 'run `kbpg access disable`, `kbpg db distribute`, then `kbpg access '
                         'enable` (in SQL: kb.access_disable(), the distribution, '
                         'kb.access_enable()): the distributed layout has policies Citus accepts';
    end if;
    -- triggers run on the shards (the statistics triggers of sql/015 write only there)
    set local citus.enable_unsafe_triggers = on;
    set local citus.multi_shard_modify_mode = sequential;

    -- access control's visibility policies use subqueries (not allowed on distributed tables);
    -- kb._access_apply_grants() below gives the writer role a policy without one, and readers
    -- read through the reader API, which applies their grants itself (sql/080)
    drop policy if exists access_visible on kb_data.documents;
    drop policy if exists access_visible on kb_data.chunks;
    drop policy if exists access_visible on kb_data.edges;
    drop policy if exists access_visible on kb_data.lexical_blocks;

    -- global tables: a copy on every node, read locally on the coordinator
    foreach t in array array['kb_data.embedding_space', 'kb_data.lexical_state', 'kb_data.access_settings',
                             'kb_data.access_grants'] loop
        perform pg_catalog.create_reference_table(t::regclass);
    end loop;

    -- a unique constraint must hold the distribution column: a source is unique per knowledge
    -- base through kbpg's writers (one write lock, looked up before insert), indexed for that
    alter table kb_data.documents drop constraint documents_source_key;
    create index documents_source on kb_data.documents (source);

    -- the graph rows name their document (revision 0015; older rows are filled here)
    update kb_data.edges e set document_id = c.document_id
      from kb_data.chunks c where c.id = e.src_chunk_id and e.document_id is null;
    update kb_data.chunk_links l set document_id = c.document_id
      from kb_data.chunks c where c.id = l.chunk_id and l.document_id is null;
    update kb_data.chunk_entities x set document_id = c.document_id
      from kb_data.chunks c where c.id = x.chunk_id and x.document_id is null;
    alter table kb_data.edges drop constraint edges_src_chunk_id_fkey,
                         drop constraint edges_dst_chunk_id_fkey,
                         drop constraint edges_pkey,
                         alter column document_id set not null,
                         add primary key (src_chunk_id, dst_chunk_id, relation, document_id);
    alter table kb_data.chunk_links drop constraint chunk_links_chunk_id_fkey,
                               drop constraint chunk_links_pkey,
                               alter column document_id set not null,
                               add primary key (chunk_id, target_source, fragment, document_id);
    alter table kb_data.chunk_entities drop constraint chunk_entities_chunk_id_fkey,
                                  drop constraint chunk_entities_pkey,
                                  alter column document_id set not null,
                                  add primary key (entity, chunk_id, document_id);
    alter table kb_data.chunks drop constraint chunks_pkey, add primary key (id, document_id);

    -- the impact cache's bookkeeping, written by the shards' triggers beside their chunks
    alter table kb_data.lexical_pending add column document_id bigint;
    update kb_data.lexical_pending p set document_id = c.document_id from kb_data.chunks c where c.id = p.chunk_id;
    delete from kb_data.lexical_pending where document_id is null;
    alter table kb_data.lexical_pending drop constraint lexical_pending_pkey,
                                   alter column document_id set not null,
                                   add primary key (chunk_id, document_id);
    alter table kb_data.lexical_dirty_blocks add column document_id bigint not null default 0;
    alter table kb_data.lexical_dirty_blocks alter column document_id drop default,
                                        drop constraint lexical_dirty_blocks_pkey,
                                        add primary key (block_no, document_id);

    -- BM25 statistics per shard (sql/015), carried over from the global tables; like every
    -- table, kb_data's holds each knowledge base's rows and kb.bm25_shard_stats the current one's
    create table kb_data.bm25_shard_stats (
        anchor   bigint not null,
        lexeme   text not null,
        doc_freq bigint not null,
        tokens   bigint not null,
        reset_at timestamptz,
        kb_id    integer not null default kb._current_kb(),
        primary key (anchor, lexeme)
    );
    comment on table kb_data.bm25_shard_stats is
        'Distributed layout: each shard''s share of the BM25 statistics (lexeme '''': chunk count '
        'and total length), kept by the shards'' triggers; only the sums over all rows mean anything.';
    create view kb.bm25_shard_stats with (security_invoker = true) as
    select * from kb_data.bm25_shard_stats where kb_id = (select kb._current_kb())
      with cascaded check option;
    insert into kb_data.bm25_shard_stats (anchor, lexeme, doc_freq, tokens, kb_id)
    select 0, '', s.chunk_count, s.total_tokens, s.kb_id from kb_data.corpus_stats s
    union all
    select 0, l.lexeme, l.doc_freq, 0, l.kb_id from kb_data.lexeme_stats l;
    drop view kb.corpus_stats, kb.lexeme_stats;
    drop table kb_data.corpus_stats, kb_data.lexeme_stats;
    create view kb.corpus_stats as
    select true as singleton,
           coalesce(pg_catalog.sum(s.doc_freq), 0)::bigint as chunk_count,
           coalesce(pg_catalog.sum(s.tokens), 0)::bigint as total_tokens
      from kb.bm25_shard_stats s where s.lexeme = '';
    comment on view kb.corpus_stats is
        'Distributed layout: the chunk count and total length, summed over the shards.';
    create view kb.lexeme_stats as
    select s.lexeme, pg_catalog.sum(s.doc_freq)::integer as doc_freq
      from kb.bm25_shard_stats s where s.lexeme <> ''
     group by s.lexeme having pg_catalog.sum(s.doc_freq) > 0;
    comment on view kb.lexeme_stats is
        'Distributed layout: document frequency per lexeme, summed over the shards.';

    -- the statistics triggers of revisions 0001, 0002 and 0011 write global tables: on the
    -- shards, these write each shard's own rows instead
    drop trigger chunks_stats_insert on kb_data.chunks;
    drop trigger chunks_stats_delete on kb_data.chunks;
    drop trigger chunks_stats_update on kb_data.chunks;
    drop trigger chunks_lexical_update on kb_data.chunks;
    drop trigger chunks_lexical_delete on kb_data.chunks;
    drop trigger chunks_truncate on kb_data.chunks;
    -- (the indexed metadata keys' bitmaps, revision 0026, are single-server only)
    drop trigger if exists documents_metadata_changed on kb_data.documents;
    -- the truncation trigger before: Citus gives the shards the triggers a table has when it
    -- is distributed, but passes no later CREATE TRIGGER ... AFTER TRUNCATE on to them (and
    -- copying the rows truncates nothing)
    create trigger chunks_shard_truncate after truncate on kb_data.chunks
        for each statement execute function kb._shard_chunks_truncated();

    -- documents first (the others are co-located with it), then what references chunks
    if shards is null then
        perform pg_catalog.create_distributed_table('kb_data.documents', 'id');
    else
        perform pg_catalog.create_distributed_table('kb_data.documents', 'id', shard_count => shards);
    end if;
    foreach t in array array['kb_data.chunks', 'kb_data.edges', 'kb_data.chunk_links', 'kb_data.chunk_entities',
                             'kb_data.lexical_pending', 'kb_data.lexical_dirty_blocks'] loop
        perform pg_catalog.create_distributed_table(t::regclass, 'document_id',
                                                    colocate_with => 'kb_data.documents');
    end loop;
    perform pg_catalog.create_distributed_table('kb_data.bm25_shard_stats', 'anchor',
                                                colocate_with => 'kb_data.documents');
    -- Citus copied a populated table's rows into its shards and left them on disk in the
    -- coordinator's own table (with its indexes, HNSW's too), where nothing reads them
    foreach t in array array['kb_data.embedding_space', 'kb_data.lexical_state', 'kb_data.access_settings',
                             'kb_data.access_grants', 'kb_data.documents', 'kb_data.chunks', 'kb_data.edges',
                             'kb_data.chunk_links', 'kb_data.chunk_entities', 'kb_data.lexical_pending',
                             'kb_data.lexical_dirty_blocks', 'kb_data.bm25_shard_stats'] loop
        perform pg_catalog.truncate_local_data_after_distributing_table(t::regclass);
    end loop;
    -- the shards' statistics triggers for rows written, created once the shards hold their
    -- rows: created before, they would fire on the workers as Citus copies a populated table's
    -- rows into shards whose kb.bm25_shard_stats does not exist yet
    create trigger chunks_shard_insert after insert on kb_data.chunks
        referencing new table as new_rows
        for each statement execute function kb._shard_chunks_changed();
    create trigger chunks_shard_delete after delete on kb_data.chunks
        referencing old table as old_rows
        for each statement execute function kb._shard_chunks_changed();
    create trigger chunks_shard_update after update on kb_data.chunks
        referencing old table as old_rows new table as new_rows
        for each statement execute function kb._shard_chunks_changed();

    -- a document's graph rows go with its chunks (an edge with its source chunk; one into a
    -- deleted document is removed when kbpg refreshes the derived edges)
    alter table kb_data.edges add foreign key (document_id, src_chunk_id)
        references kb_data.chunks (document_id, id) on delete cascade;
    alter table kb_data.chunk_links add foreign key (document_id, chunk_id)
        references kb_data.chunks (document_id, id) on delete cascade;
    alter table kb_data.chunk_entities add foreign key (document_id, chunk_id)
        references kb_data.chunks (document_id, id) on delete cascade;
    -- the views name their knowledge base by a plain call, not a scalar subquery: Citus
    -- plans a subquery (an InitPlan on one server) as an intermediate result, one more round
    -- trip to every worker for every statement; the workers evaluate kb._current_kb() there
    for t in select c.relname from pg_catalog.pg_class c
              where c.relnamespace = 'kb_data'::pg_catalog.regnamespace and c.relkind in ('r', 'p')
                and pg_catalog.to_regclass(pg_catalog.format('kb.%I', c.relname)) is not null
              order by c.relname
    loop
        execute pg_catalog.format(
            'create or replace view kb.%1$I with (security_invoker = true) as '
            'select * from kb_data.%1$I where kb_id = kb._current_kb() with cascaded check option', t);
    end loop;
    -- the reader and writer roles (kb.access_setup) get the new table too
    perform kb._access_apply_grants();

    -- the vector arm's recall settings reach the workers with SET LOCAL inside a transaction
    -- block; a statement in autocommit mode (psql's) opens no transaction there and runs with
    -- the workers' defaults: iterative scans on, for this database (Citus passes ALTER
    -- DATABASE on to the workers)
    begin
        execute pg_catalog.format('alter database %I set hnsw.iterative_scan = relaxed_order',
                                  pg_catalog.current_database());
    exception when insufficient_privilege then
        raise notice 'kbpg: hnsw.iterative_scan is not the default on the workers'
            using hint = pg_catalog.format(
                'the database owner runs: ALTER DATABASE %I SET hnsw.iterative_scan = relaxed_order',
                pg_catalog.current_database());
    end;
end
$distribute$;
"""

STATUS = """
select (select pg_catalog.count(*) from pg_catalog.pg_dist_shard
         where logicalrelid = 'kb_data.documents'::pg_catalog.regclass),
       (select pg_catalog.count(distinct p.groupid) from pg_catalog.pg_dist_shard s
          join pg_catalog.pg_dist_placement p on p.shardid = s.shardid
         where s.logicalrelid = 'kb_data.documents'::pg_catalog.regclass)
"""
HAS_CITUS = "select 1 from pg_catalog.pg_extension where extname = 'citus'"
IS_DISTRIBUTED = "select kb._distributed()"


def script(shards: int | None = None) -> str:
    """The SQL `kbpg db distribute` runs (shards: Citus's citus.shard_count when None)."""
    if shards is not None and not 1 <= shards <= 64000:
        raise KbpgError(f"--shards must be between 1 and 64000, got {shards}")
    return SCRIPT.format(shards="null" if shards is None else int(shards)).strip() + "\n"


def full_script(shards: int | None = None) -> str:
    """The script as a psql file (one transaction)."""
    return "\\set ON_ERROR_STOP on\nbegin;\n" + script(shards) + "commit;\n"


@dataclass(frozen=True)
class Distribution:
    already: bool
    shards: int
    nodes: int


def distribute(url: str, shards: int | None = None) -> Distribution:
    """Turn the knowledge base at `url` (a Citus coordinator, schema at head) into the
    distributed layout; a knowledge base distributed already is left as it is."""
    with kdb.connect(url) as conn, kdb.translate_errors():
        kdb.require_schema(conn)
        if conn.execute(HAS_CITUS).fetchone() is None:
            raise KbpgError(
                "this database has no Citus extension: kbpg db distribute needs a Citus "
                "coordinator",
                hint="on a Citus coordinator run CREATE EXTENSION citus and add the workers "
                "(SELECT citus_add_node(host, port)), then distribute; a single PostgreSQL "
                "server needs no distribution",
            )
        row = conn.execute(IS_DISTRIBUTED).fetchone()
        already = bool(row and row[0])
        if not already:
            conn.execute(script(shards))
            conn.commit()
        status = conn.execute(STATUS).fetchone()
        assert status is not None
        return Distribution(already=already, shards=int(status[0]), nodes=int(status[1]))
