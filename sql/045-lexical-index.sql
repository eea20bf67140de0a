-- kbpg: the lexical arm's impact cache (kb.lexical_blocks, read by sql/040) brought up to date.

create or replace function kb._chunk_filter_values(
    chunk_groups text[],
    chunk_category text,
    chunk_labels text[]
)
returns table (filter_kind text, value text)
language sql
immutable
parallel safe
security invoker
-- no SET clause: inlined into the caller's query (see kb._bm25_score)
begin atomic
    select 'group', g from pg_catalog.unnest(chunk_groups) as g where g is not null
    union all
    select 'category', chunk_category where chunk_category is not null
    union all
    select 'label', l from pg_catalog.unnest(chunk_labels) as l where l is not null;
end;
comment on function kb._chunk_filter_values(text[], text, text[]) is
    'A chunk''s filter values (filter_kind ''group'', ''category'', ''label''), as the filter '
    'bitmaps and the filter value caches key them. Internal to sql/045.';

create or replace function kb._refresh_filter_masks(block integer, block_size integer)
returns void
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- a string body: a SQL-standard one would depend on kb.chunks, which Citus then could not
-- distribute (see sql/080)
as $$
    delete from kb_data.lexical_filter_masks m where m.block_no = $1
                                                 and m.kb_id = (select kb._current_kb());
    -- a value's bits: its chunks' offsets in the block (from 1) as runs of '0' each ended by
    -- a '1', padded with '0' to the block's size
    insert into kb_data.lexical_filter_masks (filter_kind, value, block_no, kept)
    select x.filter_kind, x.value, $1,
           (pg_catalog.string_agg(pg_catalog.repeat('0', (x.offset_no - x.previous - 1)::integer) || '1', ''
                                  order by x.offset_no)
            || pg_catalog.repeat('0', ($2 - pg_catalog.max(x.offset_no))::integer))::varbit
      from (select f.filter_kind, f.value, f.id - $1::bigint * $2 + 1 as offset_no,
                   coalesce(pg_catalog.lag(f.id) over (partition by f.filter_kind, f.value order by f.id)
                            - $1::bigint * $2 + 1, 0) as previous
              -- a value listed twice in a chunk's groups or labels is one bit
              from (select distinct c.id, v.filter_kind, v.value
                      from kb.chunks c
                     cross join lateral kb._chunk_filter_values(c.groups, c.category, c.labels) v
                     where c.id >= $1::bigint * $2 and c.id < ($1 + 1)::bigint * $2
                    union
                    -- the indexed metadata keys' values, read once per document of the block
                    select c.id, 'metadata', v.value
                      from kb.chunks c
                      join (select d.id, v.value
                              from kb.documents d
                             cross join lateral kb._metadata_filter_values(d.metadata) v(value)
                             where d.id in (select c.document_id from kb.chunks c
                                             where c.id >= $1::bigint * $2 and c.id < ($1 + 1)::bigint * $2)
                               and exists (select from kb.indexed_metadata_keys)) v
                        on v.id = c.document_id
                     where c.id >= $1::bigint * $2 and c.id < ($1 + 1)::bigint * $2) f) x
     group by x.filter_kind, x.value;
$$;
comment on function kb._refresh_filter_masks(integer, integer) is
    'Rewrite one block''s rows of kb.lexical_filter_masks (its groups'', categories'', '
    'labels'' and indexed metadata keys'' values'' bitmaps) from kb.chunks and their documents. '
    'Internal to kb.refresh_lexical_index.';

create or replace function kb._refresh_filter_cache(
    kind text,
    filter_value text,
    fresh boolean,
    new_since bigint,
    max_id bigint,
    n_chunks bigint,
    use_avgdl double precision,
    block_size integer
)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    cache integer;
    last_slot integer;
    pending bigint[];
    appended bigint;
    dropped bigint;
    rewrite integer[];
    appended_to integer[];
    first_slot integer;
    -- an indexed metadata key's value as the filter {"key": value} (kb._metadata_mask_value)
    metadata_filter constant jsonb := case when kind = 'metadata' then
        pg_catalog.jsonb_build_object(filter_value::jsonb ->> 0, filter_value::jsonb -> 1) end;
    metadata_path constant text := kb._metadata_jsonpath(metadata_filter);
    -- the value's filter, indexable (groups && / category = / labels @> / metadata @@)
    value_sql constant text := kb._chunk_filter_sql(
        'c', '$1', '$2', '$3', null,
        case when kind = 'group' then array[filter_value] end,
        case when kind = 'category' then filter_value end,
        case when kind = 'label' then array[filter_value] end, null, metadata_filter);
begin
    select f.cache_id into cache from kb.lexical_filter_caches f
     where f.filter_kind = kind and f.value = filter_value;
    if fresh and cache is not null then
        delete from kb_data.lexical_filter_blocks b where b.cache_id = cache
                                                      and b.kb_id = (select kb._current_kb());
        delete from kb_data.lexical_filter_slots s where s.cache_id = cache
                                                     and s.kb_id = (select kb._current_kb());
        update kb_data.lexical_filter_caches f set block_size = _refresh_filter_cache.block_size
         where f.cache_id = cache
           and f.kb_id = (select kb._current_kb());
    elsif cache is null then
        fresh := true;
        insert into kb_data.lexical_filter_caches (filter_kind, value, chunk_count, block_size)
        values (kind, filter_value, 0, _refresh_filter_cache.block_size)
        returning cache_id into cache;
    end if;
    select f.block_size into block_size from kb.lexical_filter_caches f where f.cache_id = cache;
    select coalesce(max(s.slot), -1) into last_slot from kb.lexical_filter_slots s where s.cache_id = cache;
    -- the value's chunks up to max_id without a slot (fresh: all of them; else those added since
    -- the last refresh and those updated in place, kb.lexical_pending) take the next slots, in
    -- id order
    pending := coalesce((select pg_catalog.array_agg(p.chunk_id) from kb.lexical_pending p), '{}');
    execute pg_catalog.format(
        'insert into kb_data.lexical_filter_slots (cache_id, slot, chunk_id) '
        'select $4, ($5 operator(pg_catalog.+) pg_catalog.row_number() over (order by c.id))::integer, c.id '
        '  from ' || kb._chunks_relation() || ' c '
        ' where %s and c.id operator(pg_catalog.<=) $6 and %s',
        value_sql,
        -- an id range, and the pending ids not in the cache yet (a scan of the value's every
        -- chunk, or of its every slot, cost a few ms each)
        case when fresh then 'true'
             when cardinality(pending) = 0 then 'c.id operator(pg_catalog.>) $7'
             else '(c.id operator(pg_catalog.>) $7 or (c.id operator(pg_catalog.=) any ($8) '
                  'and not exists (select 1 from kb.lexical_filter_slots s '
                  '                 where s.cache_id operator(pg_catalog.=) $4 '
                  '                   and s.chunk_id operator(pg_catalog.=) c.id)))' end)
      using case when kind = 'group' then array[filter_value] end,
            case when kind = 'category' then filter_value end,
            case when kind = 'label' then array[filter_value] end,
            cache, last_slot, max_id, new_since, pending;
    get diagnostics appended = row_count;
    -- the blocks rewritten from their chunks: every block (fresh), else those holding a slot
    -- of a chunk updated in place; the others the new slots fall in are appended to: their
    -- rows gain the new slots' weights (the last block of a value otherwise rewrote up to a
    -- block of chunks for each new one)
    select coalesce(array_agg(distinct x.g order by x.g), '{}') into rewrite
      from (select pg_catalog.generate_series(0, ((appended - 1) / block_size)::integer) as g
             where fresh
            union all
            select s.slot / block_size from kb.lexical_filter_slots s
             where cardinality(pending) > 0 and s.cache_id = cache and s.chunk_id = any (pending)) x;
    select coalesce(array_agg(g order by g), '{}') into appended_to
      from pg_catalog.generate_series((last_slot + 1) / block_size,
                                      ((last_slot + appended) / block_size)::integer) as g
     where not fresh and appended > 0 and g <> all (rewrite);
    if cardinality(rewrite) + cardinality(appended_to) = 0 then
        return;
    end if;
    -- (the statements below read the slots from the first of those blocks on: a cache's every
    -- slot, read for its last block, cost ~1 ms a statement)
    first_slot := least(rewrite[1], appended_to[1]) * block_size;
    -- a rewritten block drops the slots of chunks deleted or no longer holding the value
    delete from kb_data.lexical_filter_slots s
     where s.cache_id = cache and s.slot >= first_slot and s.slot / block_size = any (rewrite)
       and not exists (select 1 from kb.chunks c
                        where c.id = s.chunk_id
                          and case kind when 'group' then c.groups @> array[filter_value]
                                        when 'category' then c.category = filter_value
                                        when 'metadata' then kb._metadata_holds(c.document_id, metadata_path)
                                        else c.labels @> array[filter_value] end)
       and s.kb_id = (select kb._current_kb());
    get diagnostics dropped = row_count;
    delete from kb_data.lexical_filter_blocks b where b.cache_id = cache and b.block_no = any (rewrite)
                                                  and b.kb_id = (select kb._current_kb());
    -- the impacts per block of slots, as kb.refresh_lexical_index writes a block of chunk ids;
    -- an appended block's rows keep the idf0 their weights were computed with (the search's
    -- drift bound reads it), and the new slots come after the old in each
    insert into kb_data.lexical_filter_blocks as b (cache_id, lexeme, block_no, impacts, idf)
    select cache, n.lexeme, n.block_no, ('{' || n.entries || '}/' || block_size)::@extschema:vector@.sparsevec, n.idf
      from (select u.lexeme, s.slot / block_size as block_no, w.idf,
                   string_agg((s.slot % block_size + 1)::text || ':'
                              || (w.idf * u.tf / (u.tf + 1.2 * (1 - 0.75 + 0.75 * c.token_count / use_avgdl)))::real::text,
                              ',' order by s.slot) as entries
              from kb.lexical_filter_slots s
              join kb.chunks c on c.id = s.chunk_id
              cross join lateral (select x.lexeme, coalesce(pg_catalog.array_length(x.positions, 1), 1)::float8 as tf
                                    from pg_catalog.unnest(c.tsv) as x) u
              join (select t.lexeme,
                           pg_catalog.ln(1 + (n_chunks - t.doc_freq + 0.5::float8) / (t.doc_freq + 0.5::float8)) as idf
                      from kb.lexeme_stats t) l on l.lexeme = u.lexeme
              cross join lateral (select coalesce(case when s.slot / block_size = any (appended_to)
                                                       then (select o.idf from kb.lexical_filter_blocks o
                                                              where o.cache_id = cache and o.lexeme = u.lexeme
                                                                and o.block_no = s.slot / block_size) end,
                                                  l.idf) as idf) w
             where s.cache_id = cache and s.slot >= first_slot
               and (s.slot / block_size = any (rewrite)
                    or (s.slot > last_slot and s.slot / block_size = any (appended_to)))
             group by u.lexeme, 2, 3) n
    on conflict (cache_id, lexeme, block_no) do update
       set impacts = ('{' || pg_catalog.btrim(pg_catalog.split_part(b.impacts::text, '/', 1), '{}')
                      || ',' || pg_catalog.btrim(pg_catalog.split_part(excluded.impacts::text, '/', 1), '{}')
                      || '}/' || block_size)::@extschema:vector@.sparsevec;
    update kb_data.lexical_filter_caches f
       set chunk_count = case when fresh then appended else f.chunk_count + appended end - dropped
     where f.cache_id = cache
       and f.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._refresh_filter_cache(text, text, boolean, bigint, bigint, bigint, double precision, integer) is
    'Bring one filter value''s own impact cache (kb.lexical_filter_caches, _slots, _blocks) up '
    'to date with kb.chunks up to max_id: fresh, numbered anew; else the chunks added since '
    'new_since and those updated in place take the next slots, and only the blocks of slots '
    'they touch are rewritten. Internal to kb.refresh_lexical_index.';

create or replace function kb._drop_filter_caches(cache_ids integer[])
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    delete from kb_data.lexical_filter_blocks b where b.cache_id = any (_drop_filter_caches.cache_ids)
                                                  and b.kb_id = (select kb._current_kb());
    delete from kb_data.lexical_filter_slots s where s.cache_id = any (_drop_filter_caches.cache_ids)
                                                 and s.kb_id = (select kb._current_kb());
    delete from kb_data.lexical_filter_caches f where f.cache_id = any (_drop_filter_caches.cache_ids)
                                                  and f.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._drop_filter_caches(integer[]) is
    'Drop filter value caches (kb.lexical_filter_caches) with their blocks and slots. Internal: '
    'kb.refresh_lexical_index drops the values no longer worth a cache, '
    'kb.unindex_metadata_key those of its key.';

create or replace function kb.refresh_lexical_index(full_rebuild boolean default false)
returns table (blocks_rebuilt integer, chunks_covered bigint, watermark bigint, avgdl double precision)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    state kb.lexical_state;
    n_chunks bigint;
    live_avgdl double precision;
    use_avgdl double precision;
    max_id bigint;
    rebuild integer[];
    b integer;
    -- while access control is enforced, one row per visibility class (the chunk's groups)
    split constant boolean := kb._access_enforced();
    -- the distributed layout (Citus, sql/015): statistics per shard, chunks on the workers
    distributed constant boolean := kb._distributed();
    stats record;
    truncated boolean := false;
    rebuilt_all boolean := false;
    mask_blocks integer[];
    touched_kinds text[];
    touched_values text[];
    eligible_kinds text[];
    eligible_values text[];
    low bigint;
    high bigint;
    v record;
begin
    -- writers wait while the cache is rebuilt, so the new watermark covers every visible chunk
    lock table kb.chunks in share mode;
    lock table kb.lexical_state in exclusive mode;
    select * into state from kb.lexical_state;
    if distributed then
        perform pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
        stats := kb._bm25_statistics_distributed('{}');
        n_chunks := stats.chunk_count;
        live_avgdl := stats.total_tokens::float8 / greatest(stats.chunk_count, 1);
        -- a TRUNCATE since the last refresh (which the shards could not clear the cache for)
        truncated := stats.reset_at >= coalesce(state.refreshed_at, '-infinity');
    else
        select s.chunk_count, s.total_tokens::float8 / greatest(s.chunk_count, 1)
          into n_chunks, live_avgdl from kb.corpus_stats s;
    end if;
    -- the newest id of every knowledge base's (ids are shared; writers wait, above): the
    -- watermark covers this one's chunks up to it, so a search's "anything past the watermark?"
    -- reads only chunks written since this refresh, not every other knowledge base's newer ones
    select coalesce(max(c.id), 0) into max_id from kb_data.chunks c;
    live_avgdl := greatest(live_avgdl, 1e-9);

    if full_rebuild or state.watermark = 0 or state.split_by_groups <> split or truncated
       or pg_catalog.abs(live_avgdl / state.avgdl - 1) > 0.05 then
        -- impacts drift with the average length: past 5% rebuild them all with the live one
        delete from kb_data.lexical_blocks where kb_id = (select kb._current_kb());
        delete from kb_data.lexical_filter_masks where kb_id = (select kb._current_kb());
        rebuilt_all := true;
        use_avgdl := live_avgdl;
        -- the blocks that hold this knowledge base's chunks (ids are numbered across every
        -- knowledge base: a small one's are a few blocks of the whole range)
        select coalesce(array_agg(distinct g order by g), '{}') into rebuild
          from (select (c.id / state.block_size)::integer as g from kb.chunks c) x;
    elsif distributed then
        use_avgdl := state.avgdl;
        -- the dirty blocks first (a distributed table), then the blocks past the watermark
        select coalesce(array_agg(distinct d.block_no), '{}') into rebuild
          from kb.lexical_dirty_blocks d;
        select coalesce(array_agg(distinct g order by g), '{}') into rebuild
          from (select unnest(rebuild) as g
                union all
                select (c.id / state.block_size)::integer from kb.chunks c
                 where c.id > state.watermark) x;
    else
        use_avgdl := state.avgdl;
        select coalesce(array_agg(distinct g order by g), '{}') into rebuild
          from (select d.block_no as g from kb.lexical_dirty_blocks d
                union all
                select (c.id / state.block_size)::integer from kb.chunks c
                 where c.id > state.watermark) x;
    end if;

    if distributed and cardinality(rebuild) > 0 then
        -- every lexeme's idf, once: the shards' counts summed (a join of kb.chunks to the
        -- kb.lexeme_stats view would be planned per block)
        drop table if exists pg_temp.kbpg_idf;
        create temporary table kbpg_idf on commit drop as
            select s.lexeme,
                   pg_catalog.ln(1 + (n_chunks - pg_catalog.sum(s.doc_freq) + 0.5::float8)
                                     / (pg_catalog.sum(s.doc_freq) + 0.5::float8)) as idf
              from kb.bm25_shard_stats s
             where s.lexeme <> ''
             group by s.lexeme
            having pg_catalog.sum(s.doc_freq) > 0;
        create unique index on pg_temp.kbpg_idf (lexeme);
        analyze pg_temp.kbpg_idf;
    end if;
    foreach b in array rebuild loop
        delete from kb_data.lexical_blocks lb where lb.block_no = b
                                                and lb.kb_id = (select kb._current_kb());
        if distributed then
            -- the block's (chunk, lexeme, tf) rows from the workers, then the same sums as below
            drop table if exists pg_temp.kbpg_block_terms;
            create temporary table kbpg_block_terms on commit drop as
                select c.id, c.token_count, case when split then c.groups else '{}'::text[] end as groups,
                       x.lexeme, coalesce(pg_catalog.array_length(x.positions, 1), 1)::float8 as tf
                  from kb.chunks c
                 cross join lateral pg_catalog.unnest(c.tsv) as x
                 where c.id >= b::bigint * state.block_size and c.id < (b + 1)::bigint * state.block_size;
            insert into kb_data.lexical_blocks (lexeme, block_no, groups, impacts, idf)
            select u.lexeme, b, u.groups,
                   ('{' || string_agg((u.id - b::bigint * state.block_size + 1)::text || ':'
                                      || (l.idf * u.tf / (u.tf + 1.2 * (1 - 0.75 + 0.75 * u.token_count / use_avgdl)))::real::text,
                                      ',' order by u.id)
                    || '}/' || state.block_size)::@extschema:vector@.sparsevec,
                   l.idf
              from pg_temp.kbpg_block_terms u
              join pg_temp.kbpg_idf l on l.lexeme = u.lexeme
             group by u.lexeme, l.idf, u.groups;
            continue;
        end if;
        insert into kb_data.lexical_blocks (lexeme, block_no, groups, impacts, idf)
        select u.lexeme, b, case when split then c.groups else '{}'::text[] end,
               ('{' || string_agg((c.id - b::bigint * state.block_size + 1)::text || ':'
                                  || (l.idf * u.tf / (u.tf + 1.2 * (1 - 0.75 + 0.75 * c.token_count / use_avgdl)))::real::text,
                                  ',' order by c.id)
                || '}/' || state.block_size)::@extschema:vector@.sparsevec,
               l.idf
          from kb.chunks c
          cross join lateral (select x.lexeme, coalesce(pg_catalog.array_length(x.positions, 1), 1)::float8 as tf
                                from pg_catalog.unnest(c.tsv) as x) u
          join (select s.lexeme,
                       pg_catalog.ln(1 + (n_chunks - s.doc_freq + 0.5::float8) / (s.doc_freq + 0.5::float8)) as idf
                  from kb.lexeme_stats s) l on l.lexeme = u.lexeme
         where c.id >= b::bigint * state.block_size and c.id < (b + 1)::bigint * state.block_size
         group by u.lexeme, l.idf, 3;
    end loop;

    -- the filters' bitmaps (kb.lexical_filter_masks), single server only: the rebuilt
    -- blocks', or every block's when they do not cover the cache yet (after the upgrade that
    -- added them: the chunks' filter columns read, no impacts recomputed)
    if not distributed then
        mask_blocks := rebuild;
        if not state.filter_masks then
            delete from kb_data.lexical_filter_masks where kb_id = (select kb._current_kb());
            select coalesce(array_agg(distinct g order by g), '{}') into mask_blocks
              from (select (c.id / state.block_size)::integer as g from kb.chunks c) x;
        end if;
        foreach b in array mask_blocks loop
            perform kb._refresh_filter_masks(b, state.block_size);
        end loop;

        -- the filter values' own caches (sql/040): every value the lexical arm masks (between
        -- the exhaustive path's limit and 5% of the chunks, as it decides), over a cache not
        -- split by visibility, unless lexical_state.build_filter_caches is off; built when it
        -- has none yet, brought up to date when a chunk added since the last refresh or
        -- updated in place (pending) holds it (a chunk deleted, or that left the value, keeps
        -- its slot until its block is next rewritten: the rescoring drops it)
        low := coalesce(kb._tuning('kb.lexical_exhaustive_limit', 0, 100000),
                        300 + 40 * (max_id / state.block_size + 1));
        high := coalesce(kb._tuning('kb.lexical_mask_limit', 0, 200000), greatest(20000, n_chunks / 20));
        select coalesce(array_agg(e.filter_kind), '{}'), coalesce(array_agg(e.value), '{}')
          into eligible_kinds, eligible_values
          from (select m.filter_kind, m.value from kb.lexical_filter_masks m
                 where not split and state.build_filter_caches
                 group by m.filter_kind, m.value
                having pg_catalog.sum(pg_catalog.bit_count(m.kept)) between low and high) e;
        perform kb._drop_filter_caches(array(
            select f.cache_id from kb.lexical_filter_caches f
             where (f.filter_kind, f.value) not in (select * from unnest(eligible_kinds, eligible_values))));
        -- (two scans, by id range and by the pending ids: as one OR it read every chunk)
        select coalesce(array_agg(t.filter_kind), '{}'), coalesce(array_agg(t.value), '{}')
          into touched_kinds, touched_values
          from (select distinct x.filter_kind, x.value
                  from (select c.groups, c.category, c.labels from kb.chunks c
                         where c.id > state.watermark and c.id <= max_id
                        union all
                        select c.groups, c.category, c.labels from kb.chunks c
                          join kb.lexical_pending p on p.chunk_id = c.id) c
                 cross join lateral kb._chunk_filter_values(c.groups, c.category, c.labels) x
                 where cardinality(eligible_kinds) > 0
                union
                -- the indexed metadata keys' values of their documents, read once per document
                select 'metadata', mv.value
                  from kb.documents d
                 cross join lateral kb._metadata_filter_values(d.metadata) mv(value)
                 where 'metadata' = any (eligible_kinds)
                   and d.id in (select c.document_id from kb.chunks c
                                 where c.id > state.watermark and c.id <= max_id
                                union
                                select c.document_id from kb.chunks c
                                  join kb.lexical_pending p on p.chunk_id = c.id)) t;
        for v in
            select e.filter_kind, e.value,
                   rebuilt_all or not state.filter_caches
                   or not exists (select 1 from kb.lexical_filter_caches f
                                   where f.filter_kind = e.filter_kind and f.value = e.value) as fresh
              from unnest(eligible_kinds, eligible_values) as e(filter_kind, value)
             where rebuilt_all or not state.filter_caches
                or (e.filter_kind, e.value) in (select * from unnest(touched_kinds, touched_values))
                or not exists (select 1 from kb.lexical_filter_caches f
                                where f.filter_kind = e.filter_kind and f.value = e.value)
             order by e.filter_kind, e.value
        loop
            -- blocks of 2,000 slots at the default 16,000 (a block holding a chunk updated in
            -- place is rewritten whole: at most 2,000 chunks' impacts recomputed for it)
            perform kb._refresh_filter_cache(v.filter_kind, v.value, v.fresh, state.watermark,
                                             max_id, n_chunks, use_avgdl,
                                             greatest(state.block_size / 8, 100));
        end loop;
    end if;

    update kb_data.lexical_state s
       set watermark = max_id, avgdl = use_avgdl, refreshed_at = pg_catalog.now(),
           split_by_groups = split, filter_masks = not distributed, filter_caches = not distributed where s.kb_id = (select kb._current_kb());
    delete from kb_data.lexical_pending where kb_id = (select kb._current_kb());
    delete from kb_data.lexical_dirty_blocks where kb_id = (select kb._current_kb());
    return query select coalesce(cardinality(rebuild), 0), n_chunks, max_id, use_avgdl;
end
$$;
comment on function kb.refresh_lexical_index(boolean) is
    'Bring the BM25 impact cache (kb.lexical_blocks) up to date: rebuilds the blocks holding '
    'new, updated or deleted chunks, or every block when asked or when the average chunk '
    'length drifted over 5%. Search is exact without it; this keeps it fast. Call after ingest.';

create or replace function kb.recount_bm25_statistics()
returns table (chunk_count bigint, total_tokens bigint, lexemes bigint, lexemes_corrected bigint,
               blocks_rebuilt integer)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    chunks_now bigint;
    tokens_now bigint;
    corrected bigint;
begin
    -- writers wait, so the counts and the rebuilt cache describe one state of kb.chunks
    lock table kb.chunks in share mode;
    select count(*), coalesce(sum(c.token_count), 0) into chunks_now, tokens_now from kb.chunks c;
    if kb._distributed() then
        perform pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
        corrected := kb._recount_bm25_distributed(chunks_now, tokens_now);
        return query
        select chunks_now, tokens_now, (select count(*) from kb.lexeme_stats), corrected,
               r.blocks_rebuilt
          from kb.refresh_lexical_index(full_rebuild => true) r;
        return;
    end if;
    update kb_data.corpus_stats s set chunk_count = chunks_now, total_tokens = tokens_now where s.kb_id = (select kb._current_kb());
    -- every lexeme's count set right: wrong, missing and left-behind ones (the count of them)
    with counted as (
        select u.lexeme, count(*)::integer as doc_freq
          from kb.chunks c
         cross join lateral pg_catalog.unnest(pg_catalog.tsvector_to_array(c.tsv)) as u(lexeme)
         group by u.lexeme
    ), left_behind as (
        delete from kb_data.lexeme_stats s
         where not exists (select 1 from counted t where t.lexeme = s.lexeme)
           and s.kb_id = (select kb._current_kb())
        returning 1
    ), set_right as (
        insert into kb_data.lexeme_stats as s (lexeme, doc_freq)
        select t.lexeme, t.doc_freq from counted t order by t.lexeme
        on conflict (kb_id, lexeme) do update set doc_freq = excluded.doc_freq
         where s.doc_freq is distinct from excluded.doc_freq
        returning 1
    )
    select (select count(*) from left_behind) + (select count(*) from set_right) into corrected;
    -- whatever the triggers missed (a chunk's text changed, ids reused) may be cached: rebuild
    return query
    select chunks_now, tokens_now, (select count(*) from kb.lexeme_stats), corrected, r.blocks_rebuilt
      from kb.refresh_lexical_index(full_rebuild => true) r;
end
$$;
comment on function kb.recount_bm25_statistics() is
    'Recount the BM25 statistics (kb.corpus_stats, kb.lexeme_stats) from kb.chunks and rebuild '
    'the impact cache: the repair after changes the triggers did not see (a partition detached '
    'or truncated on its own, triggers disabled during a restore or on a logical replica). '
    'Writers wait while it runs.';

create or replace function kb.index_metadata_key(key text)
returns boolean
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    path constant text := kb._metadata_key_path(index_metadata_key.key, 'kb.index_metadata_key');
begin
    if kb._distributed() then
        raise exception 'indexed metadata keys are for a single server: the distributed layout has no filter bitmaps'
            using errcode = '0A000', hint = 'metadata filters work as they are, scored from the filtered chunks';
    end if;
    insert into kb_data.indexed_metadata_keys (key, path) values (index_metadata_key.key, path::pg_catalog.jsonpath)
    on conflict do nothing;
    if not found then
        return false;
    end if;
    -- every block's bitmaps rewritten with the key's values, their caches built
    update kb_data.lexical_state set filter_masks = false where kb_id = (select kb._current_kb());
    perform kb.refresh_lexical_index();
    return true;
end
$$;
comment on function kb.index_metadata_key(text) is
    'Index a metadata key (dotted for a nested one, as filters name it): its values get filter '
    'bitmaps and value caches of their own, as groups have, so that a filter''s equalities on '
    'it ({"product": "p7"}) serve the lexical arm as fast as a group filter. Builds them now (a '
    'refresh of every block''s bitmaps); false when the key was indexed already. For keys with '
    'a few to a few thousand values: every value costs a bitmap per block it occurs in.';

create or replace function kb.unindex_metadata_key(key text)
returns boolean
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    prefix constant text := kb._metadata_mask_prefix(unindex_metadata_key.key);
begin
    delete from kb_data.indexed_metadata_keys k where k.key = unindex_metadata_key.key
                                                  and k.kb_id = (select kb._current_kb());
    if not found then
        return false;
    end if;
    perform kb._drop_filter_caches(array(
        select f.cache_id from kb.lexical_filter_caches f
         where f.filter_kind = 'metadata' and pg_catalog.starts_with(f.value, prefix)));
    delete from kb_data.lexical_filter_masks m
     where m.filter_kind = 'metadata' and pg_catalog.starts_with(m.value, prefix)
       and m.kb_id = (select kb._current_kb());
    return true;
end
$$;
comment on function kb.unindex_metadata_key(text) is
    'Stop indexing a metadata key: its bitmaps and value caches are dropped (its filters still '
    'work, scored from the filtered chunks); false when it was not indexed.';

create or replace function kb.list_indexed_metadata_keys()
returns table (key text, indexed_at timestamptz, "values" bigint, cached_values bigint)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a string body (see kb._metadata_masks)
as $$
    select k.key, k.indexed_at,
           (select pg_catalog.count(distinct m.value) from kb.lexical_filter_masks m
             where m.filter_kind = 'metadata' and pg_catalog.starts_with(m.value, kb._metadata_mask_prefix(k.key))),
           (select pg_catalog.count(*) from kb.lexical_filter_caches f
             where f.filter_kind = 'metadata' and pg_catalog.starts_with(f.value, kb._metadata_mask_prefix(k.key)))
      from kb.indexed_metadata_keys k
     order by k.key
$$;
comment on function kb.list_indexed_metadata_keys() is
    'The indexed metadata keys (kb.index_metadata_key), how many of their values the filter '
    'bitmaps hold and how many have a value cache of their own.';
