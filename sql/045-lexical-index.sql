-- kbpg: the lexical arm's impact cache (kb.lexical_blocks, read by sql/040) brought up to date.

create or replace function kb._refresh_filter_masks(block integer, block_size integer)
returns void
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- a string body: a SQL-standard one would depend on kb.chunks, which Citus then could not
-- distribute (see sql/080)
as $$
    delete from kb.lexical_filter_masks m where m.block_no = $1;
    -- a value's bits: its chunks' offsets in the block (from 1) as runs of '0' each ended by
    -- a '1', padded with '0' to the block's size
    insert into kb.lexical_filter_masks (filter_kind, value, block_no, kept)
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
                     cross join lateral (select 'group', g from pg_catalog.unnest(c.groups) as g
                                         union all
                                         select 'category', c.category where c.category is not null
                                         union all
                                         select 'label', l from pg_catalog.unnest(c.labels) as l)
                                        as v(filter_kind, value)
                     where c.id >= $1::bigint * $2 and c.id < ($1 + 1)::bigint * $2
                       and v.value is not null) f) x
     group by x.filter_kind, x.value;
$$;
comment on function kb._refresh_filter_masks(integer, integer) is
    'Rewrite one block''s rows of kb.lexical_filter_masks (its groups'', categories'' and '
    'labels'' bitmaps) from kb.chunks. Internal to kb.refresh_lexical_index.';

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
    mask_blocks integer[];
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
    select coalesce(max(c.id), 0) into max_id from kb.chunks c;
    live_avgdl := greatest(live_avgdl, 1e-9);

    if full_rebuild or state.watermark = 0 or state.split_by_groups <> split or truncated
       or pg_catalog.abs(live_avgdl / state.avgdl - 1) > 0.05 then
        -- impacts drift with the average length: past 5% rebuild them all with the live one
        delete from kb.lexical_blocks;
        delete from kb.lexical_filter_masks;
        use_avgdl := live_avgdl;
        select coalesce(array_agg(g order by g), '{}') into rebuild
          from pg_catalog.generate_series(0, (max_id / state.block_size)::integer) as g;
    elsif distributed then
        use_avgdl := state.avgdl;
        -- the dirty blocks first (a distributed table), then the blocks past the watermark
        select coalesce(array_agg(distinct d.block_no), '{}') into rebuild
          from kb.lexical_dirty_blocks d;
        select coalesce(array_agg(distinct g order by g), '{}') into rebuild
          from (select unnest(rebuild) as g
                union all
                select pg_catalog.generate_series((state.watermark / state.block_size)::integer,
                                                  (max_id / state.block_size)::integer)
                 where max_id > state.watermark) x;
    else
        use_avgdl := state.avgdl;
        select coalesce(array_agg(distinct g order by g), '{}') into rebuild
          from (select d.block_no as g from kb.lexical_dirty_blocks d
                union all
                select pg_catalog.generate_series((state.watermark / state.block_size)::integer,
                                                  (max_id / state.block_size)::integer)
                 where max_id > state.watermark) x;
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
        delete from kb.lexical_blocks lb where lb.block_no = b;
        if distributed then
            -- the block's (chunk, lexeme, tf) rows from the workers, then the same sums as below
            drop table if exists pg_temp.kbpg_block_terms;
            create temporary table kbpg_block_terms on commit drop as
                select c.id, c.token_count, case when split then c.groups else '{}'::text[] end as groups,
                       x.lexeme, coalesce(pg_catalog.array_length(x.positions, 1), 1)::float8 as tf
                  from kb.chunks c
                 cross join lateral pg_catalog.unnest(c.tsv) as x
                 where c.id >= b::bigint * state.block_size and c.id < (b + 1)::bigint * state.block_size;
            insert into kb.lexical_blocks (lexeme, block_no, groups, impacts, idf)
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
        insert into kb.lexical_blocks (lexeme, block_no, groups, impacts, idf)
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
            delete from kb.lexical_filter_masks;
            select coalesce(array_agg(g order by g), '{}') into mask_blocks
              from pg_catalog.generate_series(0, (max_id / state.block_size)::integer) as g;
        end if;
        foreach b in array mask_blocks loop
            perform kb._refresh_filter_masks(b, state.block_size);
        end loop;
    end if;

    update kb.lexical_state s
       set watermark = max_id, avgdl = use_avgdl, refreshed_at = pg_catalog.now(),
           split_by_groups = split, filter_masks = not distributed;
    delete from kb.lexical_pending;
    delete from kb.lexical_dirty_blocks;
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
    update kb.corpus_stats s set chunk_count = chunks_now, total_tokens = tokens_now;
    -- every lexeme's count set right: wrong, missing and left-behind ones (the count of them)
    with counted as (
        select u.lexeme, count(*)::integer as doc_freq
          from kb.chunks c
         cross join lateral pg_catalog.unnest(pg_catalog.tsvector_to_array(c.tsv)) as u(lexeme)
         group by u.lexeme
    ), left_behind as (
        delete from kb.lexeme_stats s
         where not exists (select 1 from counted t where t.lexeme = s.lexeme)
        returning 1
    ), set_right as (
        insert into kb.lexeme_stats as s (lexeme, doc_freq)
        select t.lexeme, t.doc_freq from counted t order by t.lexeme
        on conflict (lexeme) do update set doc_freq = excluded.doc_freq
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
