-- kbpg: what every retrieval arm shares — the chunk filters and argument checks.
-- Filter semantics (the same on every arm):
--   groups   — the chunk shares at least one group with the list (overlap, &&); the name
--              'public' also keeps the chunks without groups, which every reader may read
--              (kb._visible_to): public documents have one name, grouped or not;
--   category — the chunk's category equals it;
--   labels   — the chunk carries every listed label (containment, @>);
--   metadata — the chunk's document's metadata matches the filter (sql/018).
-- NULL or an empty list means "no filter" for that field.

create or replace function kb._chunk_filter_sql(
    chunk_alias text,
    groups_param text,
    category_param text,
    labels_param text,
    visible_param text,
    filter_groups text[],
    filter_category text,
    filter_labels text[],
    visible_groups text[],
    filter_metadata jsonb default null
)
returns text
language sql
immutable
parallel safe
security invoker
-- no SET clause: PostgreSQL inlines a SQL function only without one; the body is SQL-standard,
-- so its names were bound when it was created (search_path pg_catalog, pg_temp), none at run time
return concat_ws(' and ', 'true',
    case when coalesce(cardinality(filter_groups), 0) > 0
              and pg_catalog.array_position(filter_groups, 'public') is null
         then format('%I.groups operator(pg_catalog.&&) %s', chunk_alias, groups_param)
         when coalesce(cardinality(filter_groups), 0) > 0
         then format('(%1$I.groups operator(pg_catalog.&&) %2$s or %1$I.groups operator(pg_catalog.=) ''{}''::text[])',
                     chunk_alias, groups_param) end,
    case when filter_category is not null
         then format('%I.category operator(pg_catalog.=) %s', chunk_alias, category_param) end,
    case when coalesce(cardinality(filter_labels), 0) > 0
         then format('%I.labels operator(pg_catalog.@>) %s', chunk_alias, labels_param) end,
    -- the metadata filter compiled to a constant (kb._metadata_jsonpath validated it)
    kb._metadata_filter_sql(chunk_alias, filter_metadata),
    -- the caller's visibility (kb._access_visibility(): NULL reads everything)
    case when visible_groups is not null
         then format('(%1$I.groups operator(pg_catalog.=) ''{}''::text[] or %1$I.groups operator(pg_catalog.&&) %2$s)',
                     chunk_alias, visible_param) end);
comment on function kb._chunk_filter_sql(text, text, text, text, text, text[], text, text[], text[], jsonb) is
    'The WHERE predicate (for EXECUTE ... USING) that applies the groups/category/labels '
    'filters (group ''public'' also keeps chunks without groups), the metadata filter (its '
    'compiled path a literal, sql/018) and the caller''s visibility (chunks without groups, or sharing one of '
    'visible_groups; none when NULL) to a kb.chunks alias; only the filters actually given '
    'appear, so the planner sees a plain indexable predicate.';

create or replace function kb._filter_masks_serve(
    filter_groups text[],
    filter_category text,
    filter_labels text[],
    metadata_values text[] default null
)
returns boolean
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a string body (kb.lexical_state is a Citus reference table: see sql/080)
as $$
    select (coalesce(cardinality(filter_groups), 0) > 0 or filter_category is not null
            or coalesce(cardinality(filter_labels), 0) > 0
            or coalesce(cardinality(metadata_values), 0) > 0)
           -- a NULL label matches no chunk (labels @> '{NULL}' is never true): not a bitmap's
           and pg_catalog.array_position(filter_labels, null) is null
           -- 'public' keeps the chunks without groups, which no group's bitmap holds
           and pg_catalog.array_position(filter_groups, 'public') is null
           and not kb._distributed()
           and coalesce((select l.filter_masks from kb.lexical_state l), false)
$$;
comment on function kb._filter_masks_serve(text[], text, text[], text[]) is
    'Whether kb.lexical_filter_masks serves these filters (kb._filter_masks): at least one '
    'given (not the group ''public'', which keeps chunks without groups too; metadata_values: '
    'a metadata filter''s equalities on indexed keys, kb._metadata_masks), on a single '
    'server, with the bitmaps covering the impact cache (sql/045).';

create or replace function kb._filter_masks(
    filter_groups text[],
    filter_category text,
    filter_labels text[],
    metadata_values text[] default null,
    metadata_sets integer[] default null
)
returns table (block_no integer, kept varbit)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- one plan for every call: the plan cache kept planning it anew (0.19 ms a filtered search,
-- three times its run), and every branch below is an index probe in any plan (the metadata
-- one by its values too, not only by the join)
set plan_cache_mode = force_generic_plan
-- a string body (see kb._filter_masks_serve)
as $$
    -- per block: any of the groups (their bits ORed), and the category, and every label (ANDed);
    -- a block lacking a row of one of them keeps no chunk
    select p.block_no, pg_catalog.bit_and(p.kept)
      from (select m.block_no, pg_catalog.bit_or(m.kept) as kept
              from kb.lexical_filter_masks m
             where m.filter_kind = 'group' and m.value = any (filter_groups)
             group by m.block_no
            union all
            select m.block_no, m.kept
              from kb.lexical_filter_masks m
             where (m.filter_kind = 'category' and m.value = filter_category)
                or (m.filter_kind = 'label' and m.value = any (filter_labels))
            union all
            -- each metadata anchor: its values' bits ORed (kb._metadata_masks)
            select m.block_no, pg_catalog.bit_or(m.kept)
              from kb.lexical_filter_masks m
              join unnest(metadata_values, metadata_sets) as a(value, set_no)
                on m.filter_kind = 'metadata' and m.value = a.value
             where m.value = any (metadata_values)
             group by m.block_no, a.set_no) p
     group by p.block_no
    having pg_catalog.count(*) = (coalesce(cardinality(filter_groups), 0) > 0)::integer
                                 + (filter_category is not null)::integer
                                 + (select pg_catalog.count(distinct l) from pg_catalog.unnest(filter_labels) l)
                                 + (select pg_catalog.count(distinct n) from pg_catalog.unnest(metadata_sets) n)
$$;
comment on function kb._filter_masks(text[], text, text[], text[], integer[]) is
    'Per block of the impact cache holding chunks the filters keep, their bits (from '
    'kb.lexical_filter_masks: the groups'' ORed, ANDed with the category''s, each label''s and '
    'each metadata anchor''s, its metadata_values of one metadata_sets number ORed, '
    'kb._metadata_masks). '
    'Only where kb._filter_masks_serve says so; internal to the search arms.';

create or replace function kb._filter_cache_anchor(
    filter_groups text[],
    filter_category text,
    filter_labels text[],
    metadata_values text[] default null,
    metadata_sets integer[] default null
)
returns table (cache_id integer, chunk_count bigint, block_size integer)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a string body (see kb._filter_masks_serve)
as $$
    -- a chunk the filters keep holds the category, every label, and one of the groups: so the
    -- group when there is one, the category, or a label, whichever has a cache and fewest chunks
    select f.cache_id, f.chunk_count, f.block_size
      from kb.lexical_filter_caches f
     where (f.filter_kind = 'group' and f.value = filter_groups[1] and f.value <> 'public'
            and (select pg_catalog.count(distinct g) from pg_catalog.unnest(filter_groups) g) = 1)
        or (f.filter_kind = 'category' and f.value = filter_category)
        or (f.filter_kind = 'label' and f.value = any (filter_labels))
        -- a metadata anchor of one value
        or (f.filter_kind = 'metadata'
            and f.value in (select a.value from unnest(metadata_values, metadata_sets) as a(value, set_no)
                             where (select pg_catalog.count(*) from pg_catalog.unnest(metadata_sets) n
                                     where n = a.set_no) = 1))
     order by f.chunk_count, f.cache_id
     limit 1
$$;
comment on function kb._filter_cache_anchor(text[], text, text[], text[], integer[]) is
    'Of the filter values every chunk the filters keep must hold (the only group, the '
    'category, each label, each metadata anchor of one value), the one whose own impact cache (kb.lexical_filter_caches) covers '
    'fewest chunks, their count and its block size; no row if none has one. Internal to the '
    'lexical arm.';

create or replace function kb._filtered_rows_estimate(
    filter_groups text[],
    filter_category text,
    filter_labels text[],
    visible_groups text[],
    also_sql text default null,
    filter_metadata jsonb default null
)
returns bigint
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    -- the table's size now (pg_class.relpages lags until the next ANALYZE: right after a bulk
    -- load it may still say 0, which would sample every page); should kb.chunks be
    -- partitioned, its own size is 0 and its partitions' count (pg_partition_tree lists
    -- nothing for a plain table)
    pages double precision := greatest(
        (pg_catalog.pg_relation_size('kb_data.chunks'::pg_catalog.regclass)
         + coalesce((select pg_catalog.sum(pg_catalog.pg_relation_size(t.relid))
                       from pg_catalog.pg_partition_tree('kb_data.chunks'::pg_catalog.regclass) t
                      where t.isleaf), 0))
        / pg_catalog.current_setting('block_size')::bigint, 1);
    share double precision;
    filter_sql constant text := kb._chunk_filter_sql(
        'c', '$1', '$2', '$3', '$4', filter_groups, filter_category, filter_labels, visible_groups,
        filter_metadata);
    sampled bigint;
    state kb.lexical_state;
    -- a metadata filter the bitmaps of indexed keys count exactly (kb._metadata_masks)
    metadata_masks record;
begin
    -- the chunks' bits in the filters' stored bitmaps (sql/045), when every chunk is in the
    -- cache (the bitmaps cover the chunks up to its watermark); 0.2 ms, not a sample
    select * into metadata_masks from kb._metadata_masks(filter_metadata);
    if visible_groups is null and metadata_masks.exact
       and kb._filter_masks_serve(filter_groups, filter_category, filter_labels,
                                  metadata_masks.mask_values) then
        select * into state from kb.lexical_state;
        if not exists (select 1 from kb.chunks c where c.id > state.watermark) then
            return (select coalesce(pg_catalog.sum(pg_catalog.bit_count(m.kept)), 0)
                      from kb._filter_masks(filter_groups, filter_category, filter_labels,
                                            metadata_masks.mask_values, metadata_masks.mask_sets) m);
        end if;
    end if;
    if kb._distributed() then
        -- the coordinator's kb.chunks is an empty shell (size 0: a sample of 100%, every row
        -- read); its shards' sizes would take a command to every worker, so the pages are
        -- reckoned from the chunk count at a row of 4 bytes a dimension plus ~1 kB (the share
        -- only sets the sample's size; the count is scaled by the share actually sampled)
        select greatest(s.chunk_count * (4 * coalesce(
                   (select e.dimension from kb.embedding_space e), 384) + 1000) / 8192.0, 1)
          into pages from kb._bm25_statistics_distributed('{}') s;
    end if;
    -- about 256 of the table's pages, the same ones every time (~1 ms; counting the rows of a
    -- 1% filter at 1M chunks read 2,600 pages: 14 ms, and a 0.5% sample 2,000: 10 ms)
    share := least(100, 25600 / pages);
    -- also_sql: a condition of the caller's own, a constant of kbpg's code (never input)
    execute format('select pg_catalog.count(*) from kb_data.chunks c tablesample system (%s) repeatable (0) '
                   'where c.kb_id operator(pg_catalog.=) %s and %s and %s',
                   share, kb._current_kb(), filter_sql, coalesce(also_sql, 'true'))
       into sampled
      using filter_groups, filter_category, filter_labels, visible_groups;
    return pg_catalog.round(sampled * 100 / share);
end
$$;
comment on function kb._filtered_rows_estimate(text[], text, text[], text[], text, jsonb) is
    'An estimate of how many chunks the filters (the metadata filter too) and the caller''s visibility (see '
    'kb._chunk_filter_sql) keep, and also_sql when given, from a fixed sample of about 256 of '
    'the table''s pages (all of a small table): for choosing a path, never a result.';

create or replace function kb._chunk_matches_filters(
    chunk_groups text[],
    chunk_category text,
    chunk_labels text[],
    filter_groups text[],
    filter_category text,
    filter_labels text[]
)
returns boolean
language sql
immutable
parallel safe
security invoker
-- no SET clause, so that it is inlined per row (see kb._chunk_filter_sql)
return (coalesce(cardinality(filter_groups), 0) = 0 or chunk_groups && filter_groups
        or (chunk_groups = '{}' and 'public' = any (filter_groups)))
   and (filter_category is null or chunk_category = filter_category)
   and (coalesce(cardinality(filter_labels), 0) = 0 or chunk_labels @> filter_labels);
comment on function kb._chunk_matches_filters(text[], text, text[], text[], text, text[]) is
    'Row-wise form of the chunk filters (groups overlap or ''public'' for none, category '
    'equality, all labels), '
    'for the few rows an arm has already narrowed down.';

create or replace function kb._check_match_count(match_count integer)
returns void
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if match_count is null or match_count < 1 or match_count > 1000 then
        raise exception 'match_count must be between 1 and 1000, got %', coalesce(match_count::text, 'NULL')
            using errcode = '22023', hint = 'ask for 1 to 1000 results';
    end if;
end
$$;
comment on function kb._check_match_count(integer) is
    'Raise SQLSTATE 22023 unless 1 <= match_count <= 1000.';

create or replace function kb._check_search_input(
    query_text text,
    query_embedding @extschema:vector@.vector,
    fetch_multiplier integer
)
returns void
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if fetch_multiplier is null or fetch_multiplier not between 1 and 100 then
        raise exception 'fetch_multiplier must be between 1 and 100, got %',
                coalesce(fetch_multiplier::text, 'NULL')
            using errcode = '22023', hint = 'each arm fetches match_count * fetch_multiplier candidates; 4 is the default';
    end if;
    if (query_text is null or pg_catalog.btrim(query_text) = '') and query_embedding is null then
        raise exception 'nothing to search: the query text is empty and no embedding was given'
            using errcode = '22023', hint = 'pass query text, a query embedding, or both';
    end if;
end
$$;
comment on function kb._check_search_input(text, @extschema:vector@.vector, integer) is
    'Raise SQLSTATE 22023 unless there is something to search (query text or an embedding) and '
    '1 <= fetch_multiplier <= 100: kb.search''s and kb.search_knowledge_bases''s.';

create or replace function kb._check_fusion_parameters(
    rrf_k integer,
    vector_weight double precision,
    lexical_weight double precision,
    graph_weight double precision
)
returns void
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if rrf_k is null or rrf_k < 0 then
        raise exception 'rrf_k must be >= 0, got %', coalesce(rrf_k::text, 'NULL')
            using errcode = '22023', hint = 'the usual constant is 60';
    end if;
    if vector_weight is null or vector_weight < 0
       or lexical_weight is null or lexical_weight < 0
       or graph_weight is null or graph_weight < 0 then
        raise exception 'fusion weights must be >= 0 (vector %, lexical %, graph %)',
                vector_weight, lexical_weight, graph_weight
            using errcode = '22023', hint = 'use weight 0 to silence an arm';
    end if;
    -- NaN sorts above every number and Infinity passes ">= 0": either made every score NaN
    if vector_weight in ('NaN', 'Infinity') or lexical_weight in ('NaN', 'Infinity')
       or graph_weight in ('NaN', 'Infinity') then
        raise exception 'fusion weights must be finite numbers (vector %, lexical %, graph %)',
                vector_weight, lexical_weight, graph_weight
            using errcode = '22023', hint = 'a weight is a finite number >= 0; 1 is the default, 0 silences an arm';
    end if;
end
$$;
comment on function kb._check_fusion_parameters(integer, double precision, double precision, double precision) is
    'Raise SQLSTATE 22023 unless rrf_k >= 0 and every fusion weight is a finite number >= 0.';

create or replace function kb._check_max_per_doc(max_per_doc integer)
returns void
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if max_per_doc is not null and max_per_doc < 1 then
        raise exception 'max_per_doc must be >= 1 (or NULL for no cap), got %', max_per_doc
            using errcode = '22023', hint = 'the default keeps 3 chunks per document in front';
    end if;
end
$$;
comment on function kb._check_max_per_doc(integer) is
    'Raise SQLSTATE 22023 unless max_per_doc is NULL (no cap) or >= 1.';

create or replace function kb._check_filter_lists(groups text[], labels text[])
returns void
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    -- each listed name is an index lookup on every arm
    if coalesce(cardinality(groups), 0) > 1000 or coalesce(cardinality(labels), 0) > 1000 then
        raise exception 'a filter lists % groups and % labels, over the limit of 1000 each',
                coalesce(cardinality(groups), 0), coalesce(cardinality(labels), 0)
            using errcode = 'KB003', hint = 'filter by at most 1000 groups and 1000 labels';
    end if;
end
$$;
comment on function kb._check_filter_lists(text[], text[]) is
    'Raise SQLSTATE KB003 (query cost bound) when a groups or labels filter lists over 1000 names.';
