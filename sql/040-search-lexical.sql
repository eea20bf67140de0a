-- kbpg: the lexical arm — exact Okapi BM25 top-k (the formula and the query's parsing: sql/035)
-- over kb.lexical_blocks, the impact cache (kept up to date by sql/045).
--
-- Speed. ts_rank* and any exact scoring from the tsvector cost O(matching rows), hopeless
-- when a term is in a third of the chunks. So:
--   * few postings in all (sum of df small): exact scoring from the tsvector (kb._bm25_rank);
--   * otherwise a cache, kb.lexical_blocks, holds per lexeme and block of 16,000 chunk ids a
--     sparsevec of weights idf0 * tf part (idf0, avgdl0: as of the block's refresh). The
--     query's frequent terms' vectors are summed per block by pgvector's C arithmetic; a
--     threshold theta is searched so a few times match_count cached scores exceed it
--     (binary_quantize + bit_count); the best of those by cached score (match_count + 2 on a
--     fresh cache without filters, up to 1.5 x (match_count + 8) otherwise; theta then rises
--     to the best one left out), every chunk holding one of the query's
--     rare terms (read from GIN), chunks above the cache's watermark and chunks updated
--     since (kb.lexical_pending) are rescored exactly.
--   * a filter holding a selective value (a group, category or label with a cache of its own,
--     kb.lexical_filter_blocks: the same weights over the value's chunks alone, numbered as
--     slots) sums that value's blocks instead of every block masked to the filter;
--   * exactness: with r = avgdl / avgdl0 and rho = max live idf / idf0 over the terms summed,
--     any chunk left unread scores at most max(1, r) * rho * theta, so the search stops only
--     when the k-th exact score beats that (else theta is lowered); deleted chunks in the
--     cache are dropped by the rescoring join. Results are exact whatever the cache's age;
--     kb.refresh_lexical_index() (ingest calls it after a batch) only restores speed.
--
-- Helpers (internal, kb._*): _lexical_threshold searches theta over the block sums (one probe
-- loop, on a sample of blocks or all); _lexical_candidates reads the chunk ids above theta off
-- the bits; _filled_vector builds a vector of one value (theta's).

create or replace function kb._filled_vector(fill real, dims integer)
returns @extschema:vector@.vector
language plpgsql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    filled @extschema:vector@.vector;
begin
    -- 125 copies concatenated with itself up to dims (array_fill of 16,000 and its cast to
    -- vector took 60 us, this 5 us)
    filled := pg_catalog.array_fill(fill, array[least(dims, 125)])::@extschema:vector@.vector;
    while @extschema:vector@.vector_dims(filled) < dims loop
        filled := filled operator(@extschema:vector@.||) @extschema:vector@.subvector(filled, 1, least(
            @extschema:vector@.vector_dims(filled), dims - @extschema:vector@.vector_dims(filled)));
    end loop;
    return filled;
end
$$;
comment on function kb._filled_vector(real, integer) is
    'A vector of dims elements, each fill. Internal to the lexical arm.';

create or replace function kb._lexical_threshold(
    block_scores @extschema:vector@.vector[],
    block_size integer,
    stride integer,
    n_chunks bigint,
    hi double precision,
    hi_count bigint,
    target double precision,
    floor_count bigint,
    accept_count bigint,
    guess double precision,
    guess_accept bigint,
    max_probes integer,
    min_width double precision,
    keep_bits boolean,
    masks varbit[],
    out theta double precision,
    out theta_count bigint,
    out bits varbit[]
)
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    lo double precision := 0;  -- count >= floor_count there (theta 0: every cached match)
    lo_count bigint := n_chunks;
    lo_bits varbit[];
    probe double precision;
    probe_count bigint;
    probe_bits varbit[];
    block_bits varbit;
    guessed boolean;
    theta_vec @extschema:vector@.vector;
    scale constant double precision := cardinality(block_scores)::float8
        / greatest(pg_catalog.ceil(cardinality(block_scores)::float8 / stride), 1);
begin
    -- interpolation on log(count), which falls roughly linearly in theta near the top
    for probe_no in 1..max_probes loop
        exit when hi - lo <= min_width;
        guessed := guess is not null and guess > lo and guess < hi;
        if guessed then
            probe := guess;
        else
            probe := lo + (hi - lo) * (pg_catalog.ln(lo_count + 1) - pg_catalog.ln(target))
                                    / greatest(pg_catalog.ln(lo_count + 1) - pg_catalog.ln(hi_count + 1), 1e-9);
            probe := least(greatest(probe, lo + 0.02 * (hi - lo)), hi - 0.02 * (hi - lo));
        end if;
        guess := null;
        theta_vec := kb._filled_vector(probe::real, block_size);
        -- simple expressions read the array in place (unnest() in a query copies every 64 kB
        -- vector); a sample (stride > 1) scales its count up
        probe_count := 0;
        probe_bits := '{}';
        for j in 1..cardinality(block_scores) by stride loop
            block_bits := @extschema:vector@.binary_quantize(block_scores[j] operator(@extschema:vector@.-) theta_vec);
            if masks is not null then
                block_bits := block_bits & masks[j];
            end if;
            probe_count := probe_count + pg_catalog.bit_count(block_bits);
            if keep_bits then
                probe_bits := probe_bits || block_bits;
            end if;
        end loop;
        if stride > 1 then
            probe_count := pg_catalog.round(probe_count * scale);
        end if;
        if probe_count < floor_count then
            hi := probe;
            hi_count := probe_count;
        else
            lo := probe;
            lo_count := probe_count;
            lo_bits := probe_bits;
            -- a wider window costs more in reading the candidates' ids than another probe
            exit when probe_count <= case when guessed then guess_accept else accept_count end;
        end if;
    end loop;
    theta := lo;
    theta_count := lo_count;
    if keep_bits and lo_bits is null then
        -- theta 0: every cached match (read in place, as above)
        lo_bits := '{}';
        for j in 1..cardinality(block_scores) loop
            block_bits := @extschema:vector@.binary_quantize(block_scores[j]);
            if masks is not null then
                block_bits := block_bits & masks[j];
            end if;
            lo_bits := lo_bits || block_bits;
        end loop;
    end if;
    if keep_bits then
        bits := lo_bits;
    end if;
end
$$;
comment on function kb._lexical_threshold(@extschema:vector@.vector[], integer, integer, bigint, double precision, bigint, double precision, bigint, bigint, double precision, bigint, integer, double precision, boolean, varbit[]) is
    'Threshold search over the lexical arm''s block sums: the highest probed theta whose count of '
    'cached scores above it reaches floor_count (0 if none), stopping once a count is at most '
    'accept_count; stride > 1 probes a sample of the blocks; masks (NULL: none): per block, the '
    'chunks counted. keep_bits: also the bits above theta.';

create or replace function kb._lexical_candidates(
    block_nos integer[],
    block_bits varbit[],
    block_scores @extschema:vector@.vector[],
    block_size integer,
    keep_count bigint,
    theta double precision
)
returns table (candidate_ids bigint[], theta_left double precision)
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    slots integer[];      -- each set bit's block: its index in the arrays
    positions integer[];  -- and its position in that block, from 1
    ids bigint[] := '{}';
    scores real[] := '{}';
begin
    -- the '1' bits, found by splitting their text on '1' (C string code; the pieces are the gaps
    -- between set bits; octet_length, as length() counts the characters of every piece); only
    -- the bits (2 kB a block) go through a query: one over the sums would copy every 64 kB sum
    -- (4 MB at 1M chunks), which the loop below reads in place, one element per set bit
    select pg_catalog.array_agg(p.slot order by p.slot, p.pos),
           pg_catalog.array_agg(p.pos order by p.slot, p.pos)
      into slots, positions
      from (select x.slot::integer as slot,
                   pg_catalog.sum(pg_catalog.octet_length(u.piece) + 1)
                       over (partition by x.slot order by u.ord)::integer as pos
              from pg_catalog.unnest(block_bits) with ordinality as x(b, slot)
              cross join lateral pg_catalog.unnest(pg_catalog.string_to_array(x.b::text, '1'))
                   with ordinality as u(piece, ord)
             where pg_catalog.bit_count(x.b) > 0) p
     where p.pos <= block_size;
    for i in 1..coalesce(cardinality(slots), 0) loop
        ids[i] := block_nos[slots[i]]::bigint * block_size + positions[i] - 1;
        scores[i] := (@extschema:vector@.subvector(block_scores[slots[i]], positions[i], 1)::real[])[1];
    end loop;
    return query
    select coalesce(pg_catalog.array_agg(y.id order by y.v desc, y.id) filter (where y.r <= keep_count), '{}'),
           coalesce(pg_catalog.max(y.v) filter (where y.r > keep_count), theta)
      from (select u.id, u.v, pg_catalog.rank() over (order by u.v desc) as r
              from unnest(ids, scores) as u(id, v)) y;
end
$$;
comment on function kb._lexical_candidates(integer[], varbit[], @extschema:vector@.vector[], integer, bigint, double precision) is
    'The chunk ids whose cached score is above theta (their bits), the best keep_count of them, '
    'and theta raised to the best cached score left out (else theta). Internal to the lexical arm.';

create or replace function kb._search_lexical(
    query_text text,
    match_count integer,
    groups text[],
    category text,
    labels text[],
    filtered_ids bigint[],
    visible_groups text[],
    metadata_filter jsonb default null
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    score double precision
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- every statement below is safe with a generic plan (see the extra_ids query), and planning
-- them afresh on each call cost 0.3 ms of the 2.2 ms a frequent-term query took
set plan_cache_mode = force_generic_plan
-- no parallel workers (see kb._search_vector): the filtered chunks scored one by one ran as a
-- parallel seq scan of the documents too
set max_parallel_workers_per_gather = 0
as $$
#variable_conflict use_column
declare
    qt record;
    terms text[];
    idfs double precision[];
    dfs integer[];
    df_total bigint;
    rare_terms text[];
    idf_ratio double precision;
    n_chunks bigint;
    avgdl double precision;
    excluded tsquery;
    all_terms tsquery;
    state kb.lexical_state;
    drift double precision;
    cached_blocks bigint;
    exhaustive_limit bigint;
    exhaustive boolean;
    filter_first boolean := false;
    -- the caller's filters (the caller's visibility is applied apart: below)
    filter_sql constant text := kb._chunk_filter_sql(
        'c', '$1', '$2', '$3', '$4', _search_lexical.groups, _search_lexical.category,
        _search_lexical.labels, null, _search_lexical.metadata_filter);
    filtered_rows bigint;
    filtered_limit bigint;
    mask_limit bigint;
    estimated_rows bigint;
    masked boolean := false;
    stored_masks boolean;
    -- the metadata filter's equalities on indexed keys: bitmaps and value caches of their own
    -- (sql/018), which mask the arm as a group's do
    metadata_values text[];
    metadata_sets integer[];
    -- summing a filter value's own cache (kb._filter_cache_anchor) instead of the masked blocks
    compact boolean := false;
    anchor_cache integer;
    anchor_chunks bigint;
    anchor_block_size integer;
    summed_chunks bigint;
    summed_blocks bigint;
    summed_block_size integer;
    mask_nos integer[];
    mask_bits varbit[];
    block_masks varbit[];
    block record;
    block_nos integer[];
    block_scores @extschema:vector@.vector[];
    extra_ids bigint[];
    candidate_ids bigint[];
    probe record;
    picked record;
    theta double precision;
    hi double precision;
    hi_start double precision;
    hi_count bigint;
    guess double precision;
    keep_count bigint;
    need bigint;
    slack bigint;
    ranked_ids bigint[];
    ranked_docs bigint[];
    ranked_scores double precision[];
    -- under row-level security (kb.access_enable) GIN cannot serve `tsv @@ q` (the operator is
    -- not leakproof, so the planner filters after the policy: a scan of every chunk): rare
    -- terms and small queries go through the impact cache too, whose rows are split by
    -- visibility class, so its sums hold only the chunks this role may read
    rls constant boolean := pg_catalog.row_security_active('kb_data.chunks'::pg_catalog.regclass);
    -- the distributed layout (Citus, sql/015): statistics summed over the shards in one
    -- statement, and the chunks the cache does not cover read with the candidates
    distributed constant boolean := kb._distributed();
    stats record;
    -- a reader's call (kb._access_visibility()): the impact cache, split by visibility class
    -- while access control is enforced, sums only the classes it may read, and every chunk
    -- read otherwise (past the watermark, pending, rare terms) is rescored under its visibility
    restricted constant boolean := _search_lexical.visible_groups is not null;
begin
    perform kb._check_match_count(_search_lexical.match_count);
    perform kb._check_filter_lists(_search_lexical.groups, _search_lexical.labels);
    select * into qt from kb._query_terms(_search_lexical.query_text);
    if distributed then
        -- Citus plans no generic plan of a statement over distributed tables ("could not
        -- create distributed plan"): these statements are planned with their values
        perform pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
        stats := kb._bm25_statistics_distributed(qt.terms || qt.excluded);
        n_chunks := stats.chunk_count;
        avgdl := stats.total_tokens::float8 / greatest(stats.chunk_count, 1);
        select array_agg(l.lexeme order by l.lexeme),
               array_agg(pg_catalog.ln(1 + (n_chunks - l.doc_freq + 0.5::float8) / (l.doc_freq + 0.5::float8))
                         order by l.lexeme),
               array_agg(l.doc_freq order by l.lexeme),
               sum(l.doc_freq)
          into terms, idfs, dfs, df_total
          from (select u.lexeme, u.doc_freq
                  from unnest(stats.found_lexemes, stats.doc_freqs) as u(lexeme, doc_freq)
                 where u.lexeme = any (qt.terms)
                 order by u.doc_freq, u.lexeme limit 64) l;
    else
        select s.chunk_count, s.total_tokens::float8 / greatest(s.chunk_count, 1)
          into n_chunks, avgdl from kb.corpus_stats s;
        -- the cost bound: of the query's lexemes the corpus holds, the 64 rarest are scored
        select array_agg(l.lexeme order by l.lexeme),
               array_agg(pg_catalog.ln(1 + (n_chunks - l.doc_freq + 0.5::float8) / (l.doc_freq + 0.5::float8))
                         order by l.lexeme),
               array_agg(l.doc_freq order by l.lexeme),
               sum(l.doc_freq)
          into terms, idfs, dfs, df_total
          from (select s.lexeme, s.doc_freq from kb.lexeme_stats s
                 where s.lexeme = any (qt.terms) and s.doc_freq > 0
                 order by s.doc_freq, s.lexeme limit 64) l;
    end if;
    if terms is null then
        return;
    end if;
    -- past 64, kb._query_terms kept only what the corpus holds (words it lacks exclude nothing)
    if cardinality(qt.excluded) > 64 then
        raise exception 'the query excludes % words, over the limit of 64', cardinality(qt.excluded)
            using errcode = 'KB003', hint = 'exclude at most 64 words with "-word"';
    end if;
    excluded := qt.exclusion;
    all_terms := kb._lexemes_tsquery(terms);
    select * into state from kb.lexical_state;
    if distributed then
        -- kb.chunks was truncated since the cache was built (a shard cannot reset the cache on
        -- the coordinator): ids may restart below its watermark, so it is not used until a refresh
        if stats.reset_at >= coalesce(state.refreshed_at, '-infinity') then
            state := pg_catalog.jsonb_populate_record(state, '{"watermark": 0}');
        end if;
    end if;
    -- the blocks the sums would read: every block up to the watermark while the ids are dense;
    -- they need not be (a re-ingested document's chunks take new ids: 100k chunks re-ingested
    -- 10% a day span ~230 blocks after a year and fill 7, and the id range sent every query
    -- under ~9,000 postings down the exhaustive path, 8 us a posting), so past twice as many
    -- ids as chunks, the blocks the cache holds the query's most frequent term in (0.3 ms)
    cached_blocks := state.watermark / state.block_size + 1;
    if state.watermark > 2 * n_chunks then
        select greatest(pg_catalog.count(distinct b.block_no), 1) into cached_blocks
          from kb.lexical_blocks b
         where b.lexeme = (select u.lexeme from unnest(terms, dfs) as u(lexeme, df)
                            order by u.df desc, u.lexeme limit 1);
    end if;
    -- below this many postings exact scoring from the tsvector (~8 us a row) beats summing
    -- every block (~0.4 ms a block); kb.lexical_exhaustive_limit overrides it (tests)
    exhaustive_limit := coalesce(
        kb._tuning('kb.lexical_exhaustive_limit', 0, 100000),
        300 + 40 * cached_blocks);

    -- exact scoring straight from the tsvector when it reads few rows (or with no usable cache)
    exhaustive := state.watermark = 0 or ((rls or restricted) and not state.split_by_groups)
                  or (df_total <= exhaustive_limit and not rls);
    if not exhaustive and filter_sql <> 'true' and not rls then
        -- a selective filter hides most cached candidates (k / selectivity of them would be
        -- rescored): below a few thousand chunks, score the filtered chunks directly; with the
        -- filters' stored bitmaps (below) the mask costs nothing to build, so the cache serves
        -- any filter whose rows cost more to score one by one than its blocks to sum, the same
        -- crossover as for the terms' postings (at 200k chunks a 1% group, 2,000 rows, scored
        -- directly before: kb.search took 0.57-0.62 of the time through the cache, paired)
        select m.mask_values, m.mask_sets into metadata_values, metadata_sets
          from kb._metadata_masks(_search_lexical.metadata_filter) m;
        stored_masks := kb._filter_masks_serve(_search_lexical.groups, _search_lexical.category,
                                               _search_lexical.labels, metadata_values);
        filtered_limit := coalesce(
            kb._tuning('kb.lexical_exhaustive_limit', 0, 100000),
            case when stored_masks then exhaustive_limit else greatest(exhaustive_limit, 5000) end);
        -- up to 5% of the chunks (at least 20,000): a mask per block, a bit per chunk set where
        -- the filter keeps it, ANDed into the bits the threshold search counts and reads the
        -- candidates from, so that it sees only the kept chunks and the cache serves a 1%
        -- filter as fast as no filter (without it, 99 in 100 cached candidates were rescored
        -- only to be filtered out: 100-300 ms at 1M chunks)
        mask_limit := coalesce(
            kb._tuning('kb.lexical_mask_limit', 0, 200000),
            greatest(20000, n_chunks / 20));
        if stored_masks then
            -- the filters' stored bitmaps (kb.lexical_filter_masks, kept by the refresh),
            -- combined per block, are the mask and count the filtered chunks the cache holds
            -- (the mask built below from the chunks' ids cost 9.6 ms of a 74 ms search at 1M
            -- chunks)
            select coalesce(pg_catalog.sum(pg_catalog.bit_count(m.kept)), 0),
                   pg_catalog.array_agg(m.block_no order by m.block_no),
                   pg_catalog.array_agg(m.kept order by m.block_no)
              into filtered_rows, mask_nos, mask_bits
              from kb._filter_masks(_search_lexical.groups, _search_lexical.category,
                                    _search_lexical.labels, metadata_values, metadata_sets) m;
            masked := filtered_rows < mask_limit and filtered_rows >= filtered_limit;
            -- a value of the filter with a cache of its own (sql/045): its blocks are summed
            -- instead of every block masked (5 of 2,000 slots instead of 63 of 16,000 ids for
            -- a 1% group at 1M chunks: the arm took 3.2 ms instead of ~20), unless the rest of
            -- the filter keeps under an eighth of its chunks (most of its candidates would then
            -- be rescored only to be dropped)
            if masked and not state.split_by_groups and not restricted then
                select a.cache_id, a.chunk_count, a.block_size
                  into anchor_cache, anchor_chunks, anchor_block_size
                  from kb._filter_cache_anchor(_search_lexical.groups, _search_lexical.category,
                                               _search_lexical.labels, metadata_values, metadata_sets) a;
                compact := anchor_cache is not null and anchor_chunks <= 8 * filtered_rows;
                masked := not compact;
            end if;
        else
            -- the filtered chunks' ids when the caller read them (kb.search, from the vector
            -- arm's exact path): counted, and the mask built from them, without reading them again
            if _search_lexical.filtered_ids is not null then
                filtered_rows := cardinality(_search_lexical.filtered_ids);
                estimated_rows := filtered_rows;
            else
                estimated_rows := kb._filtered_rows_estimate(_search_lexical.groups, _search_lexical.category,
                                                             _search_lexical.labels, null,
                                                             filter_metadata => _search_lexical.metadata_filter);
            end if;
            -- few (scored directly, below) or many (an unselective filter hides few candidates:
            -- the loop below copes): counted up to filtered_limit
            if filtered_rows is null
               and (estimated_rows < 2 * filtered_limit or estimated_rows > 2 * mask_limit) then
                execute format('select pg_catalog.count(*) from (select 1 from ' || kb._chunks_relation() || ' c where %s limit %s) s',
                               filter_sql, filtered_limit)
                   into filtered_rows
                  using _search_lexical.groups, _search_lexical.category, _search_lexical.labels;
            end if;
            -- in between: the mask, which also counts them: per block a sparsevec of 1 at the
            -- kept chunks (its text in any order: pgvector sorts the indices), its bits
            if coalesce(filtered_rows, filtered_limit) >= filtered_limit
               and (case when _search_lexical.filtered_ids is null then estimated_rows <= 2 * mask_limit
                         else filtered_rows < mask_limit end) then
                execute format(
                    'select coalesce(pg_catalog.sum(m.n), 0)::bigint, '
                    '       pg_catalog.array_agg(m.block_no order by m.block_no), '
                    '       pg_catalog.array_agg(@extschema:vector@.binary_quantize(m.kept) order by m.block_no) '
                    '  from (select (f.id operator(pg_catalog./) $4)::integer as block_no, '
                    '               pg_catalog.count(*) as n, '
                    '               (''{'' operator(pg_catalog.||) pg_catalog.string_agg( '
                    '                   ((f.id operator(pg_catalog.%%) $4) operator(pg_catalog.+) 1)::text '
                    '                   operator(pg_catalog.||) '':1'', '','') '
                    '                operator(pg_catalog.||) ''}/'' operator(pg_catalog.||) $4::text)'
                    '                   ::@extschema:vector@.sparsevec::@extschema:vector@.vector as kept '
                    '          from %s f(id) group by 1) m',
                    case when _search_lexical.filtered_ids is null
                         then format('(select c.id from ' || kb._chunks_relation() || ' c where %s limit %s)', filter_sql, mask_limit)
                         else 'pg_catalog.unnest($5)' end)
                   into filtered_rows, mask_nos, mask_bits
                  using _search_lexical.groups, _search_lexical.category, _search_lexical.labels,
                        state.block_size::bigint, _search_lexical.filtered_ids;
                masked := filtered_rows < mask_limit and filtered_rows >= filtered_limit;
            end if;
        end if;
        exhaustive := filtered_rows < filtered_limit;
        filter_first := filtered_rows < df_total;
    end if;

    if not exhaustive then
        -- chunks the cache does not cover (new since the watermark, or updated): always
        -- candidates (the exists is one index probe past the watermark; max(id) was one too,
        -- except under row-level security, where it walked back over every chunk the reader
        -- may not see: 0.7 s at 200k for a reader of the first group; should plpgsql pick a
        -- generic plan, with the watermark unknown, the two-sided id range and the coalesce
        -- keep the second query an id range scan, never a GIN scan of every chunk holding a
        -- frequent term)
        -- (distributed: read in the rescoring statement, kb._bm25_rank_distributed)
        extra_ids := '{}';
        if not distributed then
            if exists (select 1 from kb.chunks c where c.id > state.watermark) then
                select coalesce(array_agg(c.id), '{}') into extra_ids
                  from kb.chunks c
                 where c.id between state.watermark + 1 and pg_catalog.int8 '9223372036854775807'
                   and coalesce(c.tsv @@ all_terms, false);
            end if;
            select extra_ids || coalesce(array_agg(p.chunk_id), '{}') into extra_ids
              from kb.lexical_pending p;
        end if;

        -- rare terms: reading all their chunks is cheaper than summing their blocks, so those
        -- chunks become candidates and the terms leave the sums (an unread chunk has none);
        -- a term costs ~25 us a block in the sums and a candidate ~8 us to rescore, so up to
        -- 4 postings a block in all (at 1M chunks, 50 a block rescored up to 3,000 chunks: the
        -- arm's p95 on NPL questions was 50.9 ms, 33.8 ms with 4, in a paired run)
        summed_chunks := case when compact then anchor_chunks else n_chunks end;
        summed_block_size := case when compact then anchor_block_size else state.block_size end;
        summed_blocks := case when compact then anchor_chunks / anchor_block_size + 1 else cached_blocks end;
        rare_terms := '{}';
        if not rls then
            select coalesce(array_agg(x.lexeme), '{}') into rare_terms
              from (select u.lexeme, sum(u.df) over (order by u.df, u.lexeme) as running
                      from unnest(terms, dfs) as u(lexeme, df)) x
             where x.running <= 4 * summed_blocks;
        end if;
        if cardinality(rare_terms) > 0 and not distributed then
            select extra_ids || coalesce(array_agg(c.id), '{}') into extra_ids
              from kb.chunks c
             where c.tsv @@ kb._lexemes_tsquery(rare_terms);
        end if;

        -- cached scores per block: the sum of the other terms' weight vectors, in pgvector's C
        -- arithmetic, in lexeme order (equal impacts give equal sums in every block); stored
        -- one element at a time (array_agg copied each 64 kB sum three times: 0.1 ms a query);
        -- idf_ratio bounds how much the live idf outgrew the cached one
        block_nos := '{}';
        block_scores := '{}';
        block_masks := case when masked then '{}'::varbit[] end;
        -- (compact: the filter value's cache, over its slots, in place of the impact cache)
        for block in
            select b.block_no,
                   @extschema:vector@.sum(b.impacts::@extschema:vector@.vector order by b.lexeme) as scores,
                   max(b.ratio) as ratio
              from (select b.block_no, b.lexeme, b.impacts, t.idf / b.idf as ratio
                      from unnest(terms, idfs) as t(lexeme, idf)
                      join kb.lexical_blocks b on b.lexeme = t.lexeme
                     where not compact
                       and t.lexeme <> all (rare_terms)
                       -- a split cache: the groups filter picks the classes (a class is a chunk's groups)
                       and (not state.split_by_groups or coalesce(cardinality(_search_lexical.groups), 0) = 0
                            or b.groups operator(pg_catalog.&&) _search_lexical.groups
                            or (b.groups = '{}' and 'public' = any (_search_lexical.groups)))
                       -- a reader's call: the classes it may read (the cache is split: see exhaustive)
                       and (not restricted or b.groups = '{}'
                            or b.groups operator(pg_catalog.&&) _search_lexical.visible_groups)
                       -- masked: only the blocks holding chunks the filters keep
                       and (not masked or b.block_no = any (mask_nos))
                    union all
                    select f.block_no, f.lexeme, f.impacts, t.idf / f.idf
                      from unnest(terms, idfs) as t(lexeme, idf)
                      join kb.lexical_filter_blocks f on f.cache_id = anchor_cache and f.lexeme = t.lexeme
                     where compact
                       and t.lexeme <> all (rare_terms)) b
             group by b.block_no
             order by b.block_no
        loop
            block_nos[cardinality(block_nos) + 1] := block.block_no;
            block_scores[cardinality(block_scores) + 1] := block.scores;
            if masked then
                block_masks[cardinality(block_masks) + 1] := mask_bits[pg_catalog.array_position(mask_nos, block.block_no)];
            end if;
            idf_ratio := greatest(idf_ratio, block.ratio);
        end loop;
        idf_ratio := coalesce(idf_ratio, 1);

        drift := greatest(1.0, avgdl / state.avgdl) * idf_ratio;
        need := _search_lexical.match_count + 8;
        -- above every cached score (each tf part is < 1)
        hi := (select sum(u.idf) from unnest(terms, idfs) as u(lexeme, idf)
                where u.lexeme <> all (rare_terms)) * 1.001 / least(idf_ratio, 1) + 1e-9;
        hi := coalesce(hi, 0);
        hi_start := hi;
        hi_count := 0;

        -- a first guess at theta from a sample of about 15% of the blocks (at least 2): at the
        -- target count (2 x need) it expects a dozen hits, enough for a guess within ~30%
        if cardinality(block_scores) > 3 then
            probe := kb._lexical_threshold(
                block_scores, summed_block_size,
                pg_catalog.ceil(cardinality(block_scores)::float8
                                / greatest(2, pg_catalog.ceil(0.15 * cardinality(block_scores))))::integer,
                summed_chunks, hi, hi_count, target => 2.0 * need, floor_count => 3 * need / 2,
                accept_count => 3 * need, guess => null, guess_accept => null, max_probes => 12,
                min_width => 0, keep_bits => false, masks => block_masks);
            guess := nullif(probe.theta, 0);  -- the highest theta whose estimated count reached need
        end if;

        loop
            -- a threshold theta leaving between need and need + slack cached candidates above
            -- it (slack: 2x need while small, +50% once rescoring them costs more than probing);
            -- a sampled guess is accepted with a narrower window than a probe for more
            slack := greatest(2 * (_search_lexical.match_count + 8), need / 2);
            probe := kb._lexical_threshold(
                block_scores, summed_block_size, 1, summed_chunks, hi, hi_count,
                target => (need + slack / 2)::float8, floor_count => need,
                accept_count => need + 3 * slack, guess => guess, guess_accept => need + 2 * slack,
                -- too few chunks in all to be worth a threshold: theta 0, every cached match
                max_probes => case when summed_chunks <= need + slack or cardinality(block_scores) = 0
                                   then 0 else 30 end,
                min_width => 1e-9 * hi_start, keep_bits => true, masks => block_masks);
            guess := null;

            -- only the best keep_count cached candidates are rescored: theta rises to the best
            -- cached score left out, so every chunk left unread still scores at most theta
            -- (cached); a fresh cache (drift 1) scores as exactly as float32 allows: unfiltered,
            -- its best match_count and two more suffice on the first round, filtered (or on a
            -- later round, after too few survived) its best need; a stale one keeps half as
            -- many again for the stop test's drift factor
            keep_count := case
                when drift <> 1 then need + need / 2
                when (filter_sql = 'true' or masked or compact) and need = _search_lexical.match_count + 8
                    then _search_lexical.match_count + 2
                else need end;
            -- an assignment, like the threshold search's: the sums go in place (in a query's
            -- FROM they were copied, 4 MB at 1M chunks)
            picked := kb._lexical_candidates(block_nos, probe.bits, block_scores, summed_block_size,
                                             keep_count, probe.theta);
            candidate_ids := picked.candidate_ids;
            theta := picked.theta_left;
            if compact then
                -- the value cache's positions are its slots: their chunks' ids
                select coalesce(array_agg(s.chunk_id), '{}') into candidate_ids
                  from kb.lexical_filter_slots s
                 where s.cache_id = anchor_cache and s.slot = any (candidate_ids);
            end if;

            -- exact BM25 of the candidates: without filters as static SQL (its plan is cached;
            -- EXECUTE in kb._bm25_rank plans anew), with them through kb._bm25_rank
            if distributed then
                -- one statement (a task per shard) for the candidates and the uncovered chunks
                select array_agg(r.chunk_id order by r.rank), array_agg(r.document_id order by r.rank),
                       array_agg(r.score order by r.rank)
                  into ranked_ids, ranked_docs, ranked_scores
                  from kb._bm25_rank_distributed(terms, idfs, avgdl, excluded, candidate_ids,
                                                 _search_lexical.match_count, _search_lexical.groups,
                                                 _search_lexical.category, _search_lexical.labels,
                                                 uncached_since => state.watermark,
                                                 rare => kb._lexemes_tsquery(rare_terms),
                                                 visible_groups => _search_lexical.visible_groups,
                                                 filter_metadata => _search_lexical.metadata_filter) r;
            else
                select array_agg(b.chunk_id order by b.score desc, b.chunk_id),
                       array_agg(b.document_id order by b.score desc, b.chunk_id),
                       array_agg(b.score order by b.score desc, b.chunk_id)
                  into ranked_ids, ranked_docs, ranked_scores
                  from ((select c.id as chunk_id, c.document_id, s.score
                           from kb.chunks c
                           cross join lateral kb._bm25_score(c.tsv, c.token_count, terms, idfs, avgdl) s
                          where filter_sql = 'true'
                            and c.id = any (candidate_ids || extra_ids)
                            and (not restricted or c.groups = '{}'
                                 or c.groups operator(pg_catalog.&&) _search_lexical.visible_groups)
                            and c.tsv @@ all_terms
                            and (excluded is null or not c.tsv @@ excluded)
                          order by s.score desc, c.id
                          limit _search_lexical.match_count)
                        union all
                        select r.chunk_id, r.document_id, r.score
                          from kb._bm25_rank(terms, idfs, avgdl, excluded, candidate_ids || extra_ids,
                                             _search_lexical.match_count, _search_lexical.groups,
                                             _search_lexical.category, _search_lexical.labels,
                                             visible_groups => _search_lexical.visible_groups,
                                             filter_metadata => _search_lexical.metadata_filter) r
                         where filter_sql <> 'true') b;
            end if;

            -- exact once the k-th score beats every chunk left below theta (float32 slack)
            exit when theta = 0
                   or (coalesce(cardinality(ranked_ids), 0) >= _search_lexical.match_count
                       and ranked_scores[_search_lexical.match_count] >= theta * drift * (1 + 1e-5) + 1e-9);
            -- too few survived the filters (or deletions): aim at enough candidates for the
            -- observed survival rate, at least four times as many as this round
            need := greatest(need * 4,
                             pg_catalog.ceil(2.0 * (_search_lexical.match_count + 8)
                                             * cardinality(candidate_ids || extra_ids)
                                             / greatest(coalesce(cardinality(ranked_ids), 0), 1)));
            hi := theta;
            hi_count := cardinality(candidate_ids);  -- the count at theta
            -- filters or deletions hide too many cached candidates: score exhaustively
            exhaustive := need > 4 * exhaustive_limit + _search_lexical.match_count;
            exit when exhaustive;
        end loop;
    end if;

    if exhaustive and distributed then
        return query select * from kb._bm25_rank_distributed(
                                       terms, idfs, avgdl, excluded, null,
                                       _search_lexical.match_count, _search_lexical.groups,
                                       _search_lexical.category, _search_lexical.labels,
                                       filter_first => filter_first,
                                       visible_groups => _search_lexical.visible_groups,
                                       filter_metadata => _search_lexical.metadata_filter);
        return;
    end if;
    if exhaustive then
        return query select * from kb._bm25_rank(terms, idfs, avgdl, excluded, null,
                                                 _search_lexical.match_count, _search_lexical.groups,
                                                 _search_lexical.category, _search_lexical.labels,
                                                 filter_first => filter_first,
                                                 visible_groups => _search_lexical.visible_groups,
                                                 filter_metadata => _search_lexical.metadata_filter);
        return;
    end if;
    return query select u.ord::integer, u.id, u.doc, u.sc
                   from unnest(ranked_ids, ranked_docs, ranked_scores)
                        with ordinality as u(id, doc, sc, ord);
end
$$;
comment on function kb._search_lexical(text, integer, text[], text, text[], bigint[], text[], jsonb) is
    'The lexical arm (kb.search_lexical) over the chunks visible_groups lets the caller read '
    '(NULL: all) and the filters keep (metadata_filter: sql/018); filtered_ids: the ids of every chunk the filters keep, when the caller has '
    'read them (else NULL). Internal to kb.search_lexical and kb.search.';

create or replace function kb.search_lexical(
    query_text text,
    match_count integer default 8,
    groups text[] default null,
    category text default null,
    labels text[] default null,
    filter jsonb default null
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    score double precision
)
language sql
stable
-- a reader's way in: the owner's rights, the caller's grants (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
begin atomic
    select l.rank, l.chunk_id, l.document_id, l.score
      from kb._search_lexical(query_text, match_count, groups, category, labels, null,
                              kb._access_visibility(), search_lexical.filter) l;
end;
comment on function kb.search_lexical(text, integer, text[], text, text[], jsonb) is
    'Lexical arm: exact Okapi BM25 (k1 1.2, b 0.75) top match_count chunks for a '
    'websearch_to_tsquery query in the knowledge base''s language (kb.language) with OR '
    'semantics, filters applied (filter => a metadata filter, as kb.search), among the chunks the caller may read; fast on '
    'frequent terms through the kb.lexical_blocks impact cache, exact whatever its age. Cost '
    'bound: at most 100,000 characters and 64 excluded words (else SQLSTATE KB003); the 64 '
    'rarest distinct terms the corpus holds are scored.';
