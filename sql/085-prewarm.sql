-- kbpg: warming a just-started server with kbpg's relations, through pg_prewarm (contrib,
-- optional: kbpg never requires it). After a restart every page a search touches is read from
-- disk, or copied from the OS cache, the first time: at 1M chunks the first searches were
-- several times slower than the same searches a minute later (docs/performance.md).
--   create extension if not exists pg_prewarm;   -- once, as a superuser or the service's admin
--   select * from kb.prewarm();                  -- after each start, as the tables' owner
-- `kbpg db start --prewarm` does both for the embedded server.

create or replace function kb.prewarm(buffer_share double precision default 0.75)
returns table (relation text, mode text, bytes bigint)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    prewarm_schema name;
    block_bytes constant bigint := pg_catalog.current_setting('block_size')::bigint;
    budget bigint;
    used bigint := 0;
    r record;
    chosen text;
begin
    if buffer_share is null or buffer_share not between 0 and 1 then
        raise exception 'buffer_share must be between 0 and 1, got %', coalesce(buffer_share::text, 'NULL')
            using errcode = '22023', hint = 'the share of shared_buffers kbpg''s relations may fill; 0.75 is the default';
    end if;
    select n.nspname into prewarm_schema
      from pg_catalog.pg_extension e
      join pg_catalog.pg_namespace n on n.oid = e.extnamespace
     where e.extname = 'pg_prewarm';
    if prewarm_schema is null then
        if exists (select 1 from pg_catalog.pg_available_extensions a where a.name = 'pg_prewarm') then
            raise exception 'pg_prewarm is not installed in this database'
                using errcode = '55000',
                      hint = 'run CREATE EXTENSION pg_prewarm (a superuser or the service''s admin role); prewarming is optional';
        end if;
        raise exception 'this server does not ship pg_prewarm'
            using errcode = '55000',
                  hint = 'pg_prewarm is in PostgreSQL''s contrib package; without it the first searches after a start read from disk, nothing else changes';
    end if;
    budget := pg_catalog.floor(buffer_share * pg_catalog.pg_size_bytes(pg_catalog.current_setting('shared_buffers'))
                               / block_bytes);
    -- what searches read, most used first: the HNSW graph, the BM25 impact cache and the
    -- filter values' own caches (and their TOAST, where the vectors live), every other index
    -- and the small tables, then the documents, then the chunks themselves (read by
    -- rescoring, filters and the output); a
    -- relation that no longer fits the budget goes to the OS cache instead ('read': a
    -- restarted server's kernel may still hold it, a rebooted one reads it sequentially now
    -- rather than page by page in the first searches)
    for r in
        -- kb's tables with storage (a partitioned table's partitions), each with the table
        -- searches name (its partition root), then their TOAST tables and indexes
        with heap as (
            select c.oid, coalesce(pg_catalog.pg_partition_root(c.oid), c.oid) as owner, c.reltoastrelid
              from pg_catalog.pg_class c
             where c.relnamespace = 'kb_data'::pg_catalog.regnamespace and c.relkind = 'r'
        ), rels as (
            select h.oid, h.owner, 'table' as kind from heap h
            union all
            select h.reltoastrelid, h.owner, 'toast' from heap h where h.reltoastrelid <> 0
            union all
            select i.indexrelid, h.owner,
                   case when i.indrelid = h.reltoastrelid then 'toast'
                        when ic.relam = (select a.oid from pg_catalog.pg_am a where a.amname = 'hnsw')
                            then 'hnsw'
                        else 'index' end
              from heap h
              join pg_catalog.pg_index i on i.indrelid in (h.oid, h.reltoastrelid)
              join pg_catalog.pg_class ic on ic.oid = i.indexrelid
        )
        select rels.oid, pg_catalog.pg_relation_size(rels.oid) / block_bytes as blocks,
               case when rels.kind = 'hnsw' then 1
                    when rels.owner in ('kb_data.lexical_blocks'::pg_catalog.regclass,
                                        'kb_data.lexical_filter_blocks'::pg_catalog.regclass,
                                        'kb_data.lexical_filter_slots'::pg_catalog.regclass) then 2
                    when rels.kind = 'index' then 3
                    when rels.owner = 'kb_data.chunks'::pg_catalog.regclass then 6
                    when rels.owner = 'kb_data.documents'::pg_catalog.regclass then 5
                    else 3 end as priority
          from rels
         where pg_catalog.pg_relation_size(rels.oid) > 0
         order by 3, 2, 1
    loop
        chosen := case when used + r.blocks <= budget then 'buffer' else 'read' end;
        if chosen = 'buffer' then
            used := used + r.blocks;
        end if;
        execute pg_catalog.format('select %I.pg_prewarm($1, $2)', prewarm_schema) using r.oid::pg_catalog.regclass, chosen;
        relation := r.oid::pg_catalog.regclass::text;
        mode := chosen;
        bytes := r.blocks * block_bytes;
        return next;
    end loop;
end
$$;
comment on function kb.prewarm(double precision) is
    'Load kbpg''s relations into memory after a server start (needs the pg_prewarm extension): '
    'the HNSW index, the BM25 impact cache, the other indexes and small tables, the documents, '
    'then the chunks, into shared buffers while they fill at most buffer_share of them, the rest '
    'into the OS cache; one row per relation with its mode (buffer or read) and size in bytes. Run as '
    'the owner of kbpg''s tables. Example: SELECT * FROM kb.prewarm().';
