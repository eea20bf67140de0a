-- kbpg: the vector arm — cosine top-k over kb.chunks.embedding.
-- Filters are applied inside the HNSW scan with pgvector's iterative scan (relaxed order,
-- re-sorted here), so a filter matching 1% of chunks still fills the top-k. When the filter
-- keeps fewer chunks than ~sqrt(180·N) (the measured crossover; estimated from a sample of the
-- table's pages), the exact path (filtered rows sorted by distance) is both faster and exact.
-- Several query embeddings (query expansion: the question and its paraphrases) run one scan
-- each, and the hits are unioned by each chunk's best (maximum) similarity.
-- The index scan orders by the expression of the space's layout (kb.embedding_space.layout, see
-- sql/010): the vectors themselves, their halfvec cast, or their binary quantization; its
-- candidates are then ranked by exact cosine distance on the full vectors. The binary layout
-- over-fetches (kb.vector_rerank_factor x the pool, default 8) since Hamming distance on 1 bit
-- a dimension is a coarse guide.

create or replace function kb.search_vector(
    query_embedding @extschema:vector@.vector,
    match_count integer default 8,
    groups text[] default null,
    category text default null,
    labels text[] default null,
    min_similarity double precision default 0.30,
    extra_embeddings @extschema:vector@.vector[] default null
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    score double precision,
    similarity double precision
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- the function's own values, restored on exit; ef_search is raised below to fit the pool
set hnsw.iterative_scan = relaxed_order
set hnsw.ef_search = 40
set hnsw.max_scan_tuples = 20000
as $$
#variable_conflict use_column
declare
    filter_sql constant text := kb._chunk_filter_sql(
        'c', '$1', '$2', '$3', search_vector.groups, search_vector.category, search_vector.labels);
    -- {q} stands for the query embedding ($4, or e.q when there are several)
    exact_sql constant text := 'c.embedding operator(@extschema:vector@.<=>) {q}';
    order_sql text;
    candidates integer := search_vector.match_count;
    space_layout text;
    space_dimension integer;
    embeddings @extschema:vector@.vector[];
    extra @extschema:vector@.vector;
    exact_limit bigint;
    filtered_rows bigint;
begin
    perform kb._check_match_count(search_vector.match_count);
    if search_vector.min_similarity is null
       or search_vector.min_similarity not between -1 and 1 then
        raise exception 'min_similarity must be between -1 and 1, got %',
                coalesce(search_vector.min_similarity::text, 'NULL')
            using errcode = '22023', hint = 'cosine similarity floors are in [-1, 1]; 0.30 is the default';
    end if;
    if search_vector.query_embedding is null then
        if coalesce(cardinality(search_vector.extra_embeddings), 0) > 0 then
            raise exception 'extra_embeddings given without query_embedding'
                using errcode = '22023', hint = 'extra embeddings (paraphrases) add to the query embedding; pass it too';
        end if;
        return;
    end if;
    perform kb._check_query_embedding(search_vector.query_embedding);
    embeddings := array[search_vector.query_embedding];
    foreach extra in array coalesce(search_vector.extra_embeddings, '{}') loop
        if extra is null then
            raise exception 'extra_embeddings holds a NULL'
                using errcode = '22023', hint = 'pass only vectors of the embedding space';
        end if;
        perform kb._check_query_embedding(extra);
        embeddings := pg_catalog.array_append(embeddings, extra);
    end loop;
    -- without this a pool of 80 would come back as the default ef_search of 40 rows; and the
    -- pool must be the right rows: recall@32 against an exact scan at 200k chunks was .868 with
    -- ef 2x the pool, .941 with 3x, .992 with 4x; at 1M chunks (ef_construction 128) .951 with
    -- 4x (one query in 40 stranded in another cluster of the graph) and .988 with 8x, at about
    -- twice the vector arm's time (benchmarks/bench_search.py prints it)
    select e.layout, e.dimension into space_layout, space_dimension from kb.embedding_space e;
    order_sql := case space_layout
        when 'halfvec' then pg_catalog.format(
            '(c.embedding::@extschema:vector@.halfvec(%1$s)) operator(@extschema:vector@.<=>) ({q}::@extschema:vector@.halfvec(%1$s))',
            space_dimension)
        when 'binary' then pg_catalog.format(
            '(@extschema:vector@.binary_quantize(c.embedding)::bit(%1$s)) operator(@extschema:vector@.<~>) '
            '(@extschema:vector@.binary_quantize({q})::bit(%1$s))', space_dimension)
        else exact_sql end;
    if space_layout = 'binary' then
        candidates := search_vector.match_count * coalesce(
            nullif(pg_catalog.current_setting('kb.vector_rerank_factor', true), '')::integer, 8);
    end if;
    perform pg_catalog.set_config('hnsw.ef_search',
        least(1000, greatest(40, 8 * search_vector.match_count, candidates))::text, true);
    perform pg_catalog.set_config('hnsw.max_scan_tuples',
        greatest(20000, 50 * candidates)::text, true);
    -- under row-level security (kb.access_enable) no filter can use an index (&& is not
    -- leakproof: the planner applies it after the policy), so counting the filtered rows and
    -- sorting them exactly would each read every chunk: the HNSW scan filters instead,
    -- bounded by hnsw.max_scan_tuples
    if filter_sql <> 'true'
       and not pg_catalog.row_security_active('kb.chunks'::pg_catalog.regclass) then
        -- kb.vector_exact_limit overrides the crossover (tests force either path with it)
        select coalesce(nullif(pg_catalog.current_setting('kb.vector_exact_limit', true), '')::bigint,
                        greatest(1000, pg_catalog.ceil(pg_catalog.sqrt(180.0 * s.chunk_count)))::bigint)
          into exact_limit from kb.corpus_stats s;
        -- estimated (counting the rows of a 1% filter at 1M chunks took 14 ms of its 100)
        filtered_rows := kb._filtered_rows_estimate(
            filter_sql || ' and c.embedding is not null',
            search_vector.groups, search_vector.category, search_vector.labels);
        if filtered_rows < exact_limit then
            -- an expression the HNSW index cannot order by: the filtered rows are sorted exactly
            order_sql := '(' || exact_sql || ') operator(pg_catalog.+) 0';
            candidates := search_vector.match_count;
        end if;
    end if;
    -- h: the index's candidates (ordered by the layout's expression), ranked by exact distance
    if cardinality(embeddings) = 1 then
        return query execute pg_catalog.format(
            'select (pg_catalog.row_number() over (order by h.distance, h.id))::integer, '
            '       h.id, h.document_id, 1 - h.distance, 1 - h.distance '
            '  from (select x.id, x.document_id, x.distance '
            '          from (select c.id, c.document_id, %1$s as distance from kb.chunks c '
            '                 where %3$s and c.embedding is not null order by %2$s limit $7) x '
            '         order by x.distance, x.id limit $5) h '
            ' where 1 - h.distance >= $6 '
            ' order by h.distance, h.id',
            pg_catalog.replace(exact_sql, '{q}', '$4'), pg_catalog.replace(order_sql, '{q}', '$4'),
            filter_sql)
        using search_vector.groups, search_vector.category, search_vector.labels,
              search_vector.query_embedding, search_vector.match_count, search_vector.min_similarity,
              candidates;
        return;
    end if;
    -- one index scan per embedding; a chunk several of them found keeps its best distance
    return query execute pg_catalog.format(
        'select (pg_catalog.row_number() over (order by b.distance, b.id))::integer, '
        '       b.id, b.document_id, 1 - b.distance, 1 - b.distance '
        '  from (select h.id, h.document_id, pg_catalog.min(h.distance) as distance '
        '          from pg_catalog.unnest($4) e(q), '
        '               lateral (select x.id, x.document_id, x.distance '
        '                  from (select c.id, c.document_id, %1$s as distance from kb.chunks c '
        '                         where %3$s and c.embedding is not null order by %2$s limit $7) x '
        '                 order by x.distance, x.id limit $5) h '
        '         group by h.id, h.document_id) b '
        ' where 1 - b.distance >= $6 '
        ' order by b.distance, b.id limit $5',
        pg_catalog.replace(exact_sql, '{q}', 'e.q'), pg_catalog.replace(order_sql, '{q}', 'e.q'),
        filter_sql)
    using search_vector.groups, search_vector.category, search_vector.labels,
          embeddings, search_vector.match_count, search_vector.min_similarity, candidates;
end
$$;
comment on function kb.search_vector(@extschema:vector@.vector, integer, text[], text, text[], double precision, @extschema:vector@.vector[]) is
    'Vector arm: top match_count chunks by cosine similarity (score = similarity = 1 - cosine '
    'distance) at or above min_similarity, filters applied inside the HNSW scan (iterative '
    'scan) or, for very selective filters, by an exact scan. NULL embedding: no rows. '
    'extra_embeddings (e.g. paraphrases of the question): one scan each, a chunk ranked by its '
    'best similarity to any of them.';
