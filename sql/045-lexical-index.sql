-- kbpg: the lexical arm's impact cache (kb.lexical_blocks, read by sql/040) brought up to date.

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
begin
    -- writers wait while the cache is rebuilt, so the new watermark covers every visible chunk
    lock table kb.chunks in share mode;
    lock table kb.lexical_state in exclusive mode;
    select * into state from kb.lexical_state;
    select s.chunk_count, s.total_tokens::float8 / greatest(s.chunk_count, 1)
      into n_chunks, live_avgdl from kb.corpus_stats s;
    select coalesce(max(c.id), 0) into max_id from kb.chunks c;
    live_avgdl := greatest(live_avgdl, 1e-9);

    if full_rebuild or state.watermark = 0 or state.split_by_groups <> split
       or pg_catalog.abs(live_avgdl / state.avgdl - 1) > 0.05 then
        -- impacts drift with the average length: past 5% rebuild them all with the live one
        delete from kb.lexical_blocks;
        use_avgdl := live_avgdl;
        select coalesce(array_agg(g order by g), '{}') into rebuild
          from pg_catalog.generate_series(0, (max_id / state.block_size)::integer) as g;
    else
        use_avgdl := state.avgdl;
        select coalesce(array_agg(distinct g order by g), '{}') into rebuild
          from (select d.block_no as g from kb.lexical_dirty_blocks d
                union all
                select pg_catalog.generate_series((state.watermark / state.block_size)::integer,
                                                  (max_id / state.block_size)::integer)
                 where max_id > state.watermark) x;
    end if;

    foreach b in array rebuild loop
        delete from kb.lexical_blocks lb where lb.block_no = b;
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

    update kb.lexical_state s
       set watermark = max_id, avgdl = use_avgdl, refreshed_at = pg_catalog.now(),
           split_by_groups = split;
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
