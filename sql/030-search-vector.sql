-- kbpg: the vector arm — cosine top-k over kb.chunks.embedding.
-- Filters are applied inside the HNSW scan with pgvector's iterative scan (relaxed order,
-- re-sorted here), so a filter matching 1% of chunks still fills the top-k. When the filter
-- keeps fewer chunks than ~sqrt(180·N) (the measured crossover; estimated from a sample of the
-- table's pages), the exact path (filtered rows sorted by distance) is both faster and exact.
-- Several query embeddings (query expansion: the question and its paraphrases) run one index
-- scan each (the exact path reads the filtered rows once), and a chunk ranks by its best
-- (maximum) similarity. kb.search reads the exact path's filtered chunk ids from
-- kb._search_vector too: the lexical arm masks its cached sums with them.
-- The index scan orders by the expression of the space's layout (kb.embedding_space.layout, see
-- sql/010): the vectors themselves, their halfvec cast, or their binary quantization; its
-- candidates are then ranked by exact cosine distance on the full vectors. The binary layout
-- over-fetches (kb.vector_rerank_factor x the pool, default 16) since Hamming distance on 1 bit
-- a dimension is a coarse guide (recall@32 at 200k chunks of 4,096-d: .935 at 8x, 1.000 at 16x;
-- docs/scaling.md section 1).
-- Without a filter, a scan that brings back fewer than match_count chunks at or above the
-- similarity floor runs once more at ef_search 1000: that is how a search stranded in the
-- wrong region of the graph shows, and the wider search finds its neighbours.

create or replace function kb._search_vector(
    query_embedding @extschema:vector@.vector,
    match_count integer,
    groups text[],
    category text,
    labels text[],
    min_similarity double precision,
    extra_embeddings @extschema:vector@.vector[],
    keep_filtered boolean,
    visible_groups text[],
    metadata_filter jsonb default null,
    out chunk_ids bigint[],
    out document_ids bigint[],
    out distances double precision[],
    out filtered_ids bigint[]
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- the function's own values, restored on exit; ef_search is raised below to fit the pool
set hnsw.iterative_scan = relaxed_order
set hnsw.ef_search = 40
set hnsw.max_scan_tuples = 20000
-- no parallel workers: a metadata filter's exact path (1% at 1M chunks) ran 37 ms as a parallel
-- seq scan of the documents, 18 ms reading them through their GIN index in one process; a
-- search is milliseconds, and on a small machine the other searches want the other cores
set max_parallel_workers_per_gather = 0
as $$
#variable_conflict use_column
declare
    filter_sql constant text := kb._chunk_filter_sql(
        'c', '$1', '$2', '$3', '$9', _search_vector.groups, _search_vector.category,
        _search_vector.labels, _search_vector.visible_groups, _search_vector.metadata_filter);
    -- the caller's own filters (what the caller may read is none): a scan short of the floor
    -- with one of them is explained by it and does not scan again (see the loops below)
    caller_filters constant boolean := coalesce(pg_catalog.cardinality(_search_vector.groups), 0) > 0
        or _search_vector.category is not null
        or coalesce(pg_catalog.cardinality(_search_vector.labels), 0) > 0
        or kb._metadata_jsonpath(_search_vector.metadata_filter) is not null;
    -- {q} stands for a query embedding: $8 (the only one), e.q (one index scan each) or $4[i]
    exact_sql constant text := 'c.embedding operator(@extschema:vector@.<=>) {q}';
    order_sql text;
    cut_sql text;
    candidates integer := _search_vector.match_count;
    space_layout text;
    space_dimension integer;
    embeddings @extschema:vector@.vector[];
    extra @extschema:vector@.vector;
    exact_limit bigint;
    filtered_rows bigint;
    q text := '$8';
    distance_sql text;
    distributed constant boolean := kb._distributed();
    ef_search integer;
    scan_tuples integer;
    scan_ids bigint[];
    scan_docs bigint[];
    scan_distances double precision[];
    scan_sql text;
    rls constant boolean := pg_catalog.row_security_active('kb_data.chunks'::pg_catalog.regclass);
begin
    perform kb._check_match_count(_search_vector.match_count);
    if _search_vector.min_similarity is null
       or _search_vector.min_similarity not between -1 and 1 then
        raise exception 'min_similarity must be between -1 and 1, got %',
                coalesce(_search_vector.min_similarity::text, 'NULL')
            using errcode = '22023', hint = 'cosine similarity floors are in [-1, 1]; 0.30 is the default';
    end if;
    perform kb._check_filter_lists(_search_vector.groups, _search_vector.labels);
    -- the cost bound: each extra embedding is one more scan of the vector index (1,000 of them
    -- held a backend a minute)
    if coalesce(cardinality(_search_vector.extra_embeddings), 0) > 8 then
        raise exception 'extra_embeddings holds % vectors, over the limit of 8',
                cardinality(_search_vector.extra_embeddings)
            using errcode = 'KB003',
                  hint = 'each extra embedding (a paraphrase of the question) is one more scan of '
                         'the vector index: pass at most 8';
    end if;
    if _search_vector.query_embedding is null then
        if coalesce(cardinality(_search_vector.extra_embeddings), 0) > 0 then
            raise exception 'extra_embeddings given without query_embedding'
                using errcode = '22023', hint = 'extra embeddings (paraphrases) add to the query embedding; pass it too';
        end if;
        return;
    end if;
    perform kb._check_query_embedding(_search_vector.query_embedding);
    embeddings := array[_search_vector.query_embedding];
    foreach extra in array coalesce(_search_vector.extra_embeddings, '{}') loop
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
    -- 4x and .96-.99 with 8x, by build. What varies with the build (and the index's size) is
    -- whether a query strands in another region of the graph and finds none of its
    -- neighbours; a wider ef_search makes that rarer for every query's cost, the second scan
    -- below catches it for the stranded query's (benchmarks/bench_hnsw_recall.py)
    select e.layout, e.dimension into space_layout, space_dimension from kb.embedding_space e;
    order_sql := case space_layout
        when 'halfvec' then pg_catalog.format(
            '(c.embedding::@extschema:vector@.halfvec(%1$s)) operator(@extschema:vector@.<=>) ({q}::@extschema:vector@.halfvec(%1$s))',
            space_dimension)
        when 'binary' then pg_catalog.format(
            '(@extschema:vector@.binary_quantize(c.embedding)::bit(%1$s)) operator(@extschema:vector@.<~>) '
            '(@extschema:vector@.binary_quantize({q})::bit(%1$s))', space_dimension)
        else pg_catalog.format(
            '(c.embedding::@extschema:vector@.vector(%1$s)) operator(@extschema:vector@.<=>) ({q}::@extschema:vector@.vector(%1$s))',
            space_dimension) end;
    -- the index's candidates: with the chunks tied at the cut (a duplicated text's vectors),
    -- so that the ranking below picks among them by id, as every other cut does (LIMIT keeps
    -- whichever of them a plan meets first: one server and a cluster, or two plans, picked
    -- different ones); Hamming distances tie by the hundred, so the binary layout cuts at the
    -- count (it over-fetches 16x)
    cut_sql := case when space_layout = 'binary' then 'limit $7' else 'fetch first $7 rows with ties' end;
    if space_layout = 'binary' then
        candidates := _search_vector.match_count * coalesce(
            kb._tuning('kb.vector_rerank_factor', 1, 32)::integer, 16);
    end if;
    ef_search := least(1000, greatest(40, 8 * _search_vector.match_count, candidates));
    scan_tuples := greatest(20000, 50 * candidates);
    if distributed then
        -- the SET clauses above and set_config() change the coordinator alone; SET LOCAL with
        -- citus.propagate_set_commands = local goes to the workers with each shard's query
        -- (inside a transaction block: in autocommit mode the workers keep their defaults,
        -- which kbpg db distribute sets to iterative scans)
        perform kb._set_local_on_workers(array['hnsw.ef_search', 'hnsw.max_scan_tuples',
                                               'hnsw.iterative_scan'],
                                         array[ef_search::text, scan_tuples::text, 'relaxed_order']);
    else
        perform pg_catalog.set_config('hnsw.ef_search', ef_search::text, true);
        perform pg_catalog.set_config('hnsw.max_scan_tuples', scan_tuples::text, true);
    end if;
    -- under row-level security (kb.access_enable) no filter can use an index (&& is not
    -- leakproof: the planner applies it after the policy), so counting the filtered rows and
    -- sorting them exactly would each read every chunk: the HNSW scan filters instead,
    -- bounded by hnsw.max_scan_tuples
    if filter_sql <> 'true' and not rls then
        -- kb.vector_exact_limit overrides the crossover (tests force either path with it)
        if distributed then
            -- the chunk count in one flat statement (the kb.corpus_stats view is planned in two)
            select coalesce(kb._tuning('kb.vector_exact_limit', 0, 100000),
                            greatest(1000, pg_catalog.ceil(pg_catalog.sqrt(180.0 * s.chunk_count)))::bigint)
              into exact_limit from kb._bm25_statistics_distributed('{}') s;
        else
            select coalesce(kb._tuning('kb.vector_exact_limit', 0, 100000),
                            greatest(1000, pg_catalog.ceil(pg_catalog.sqrt(180.0 * s.chunk_count)))::bigint)
              into exact_limit from kb.corpus_stats s;
        end if;
        -- estimated (counting the rows of a 1% filter at 1M chunks took 14 ms of its 100)
        filtered_rows := kb._filtered_rows_estimate(
            _search_vector.groups, _search_vector.category, _search_vector.labels,
            _search_vector.visible_groups, also_sql => 'c.embedding is not null',
            filter_metadata => _search_vector.metadata_filter);
        if filtered_rows < exact_limit then
            -- the filtered rows sorted exactly, read once: keep_filtered also returns their
            -- ids (those without an embedding too), which the lexical arm then masks its
            -- cached sums with instead of reading the same rows again; distance: a row's best
            -- to the query embeddings (NULL without an embedding)
            distance_sql := case when cardinality(embeddings) = 1
                then pg_catalog.replace(exact_sql, '{q}', '$8')
                else 'least(' || (select pg_catalog.string_agg(
                                      pg_catalog.replace(exact_sql, '{q}', '$4[' || i || ']'), ', ')
                                    from pg_catalog.generate_series(1, cardinality(embeddings)) i)
                     || ')' end;
            -- (without keep_filtered a plain top-N: materializing the rows for their ids cost
            -- 5 of the 21 ms this query took over a 1% group at 1M chunks)
            execute pg_catalog.format(
                case when _search_vector.keep_filtered then
                    'with f as materialized ( '
                    '    select c.id, c.document_id, %1$s as distance from ' || kb._chunks_relation() || ' c where %2$s), '
                    '  h as (select f.id, f.document_id, f.distance from f '
                    '         where f.distance is not null order by f.distance, f.id limit $5) '
                    'select pg_catalog.array_agg(h.id order by h.distance, h.id), '
                    '       pg_catalog.array_agg(h.document_id order by h.distance, h.id), '
                    '       pg_catalog.array_agg(h.distance order by h.distance, h.id), '
                    '       case when $7 then (select pg_catalog.array_agg(f.id) from f) end '
                    '  from h where 1 operator(pg_catalog.-) h.distance >= $6'
                else
                    'select pg_catalog.array_agg(h.id order by h.distance, h.id), '
                    '       pg_catalog.array_agg(h.document_id order by h.distance, h.id), '
                    '       pg_catalog.array_agg(h.distance order by h.distance, h.id), '
                    '       null::bigint[] '
                    '  from (select c.id, c.document_id, %1$s as distance from ' || kb._chunks_relation() || ' c '
                    '         where %2$s and c.embedding is not null order by 3, 1 limit $5) h '
                    ' where 1 operator(pg_catalog.-) h.distance >= $6'
                end,
                distance_sql, filter_sql)
               into chunk_ids, document_ids, distances, filtered_ids
              using _search_vector.groups, _search_vector.category, _search_vector.labels,
                    embeddings, _search_vector.match_count, _search_vector.min_similarity,
                    _search_vector.keep_filtered, _search_vector.query_embedding,
                    _search_vector.visible_groups;
            filtered_ids := coalesce(filtered_ids, case when _search_vector.keep_filtered then '{}'::bigint[] end);
            return;
        end if;
    end if;
    if distributed then
        -- Citus cannot push a LATERAL ... LIMIT per embedding down to the shards: one
        -- statement per embedding (each shard returns its best), merged here as below; a
        -- result short of the floor scans once more at ef_search 1000, as below
        for attempt in 1..2 loop
            chunk_ids := null;
            document_ids := null;
            distances := null;
            for i in 1..cardinality(embeddings) loop
                execute pg_catalog.format(
                    'select pg_catalog.array_agg(x.id), pg_catalog.array_agg(x.document_id), '
                    '       pg_catalog.array_agg(x.distance) '
                    '  from (select c.id, c.document_id, %1$s as distance from ' || kb._chunks_relation() || ' c '
                    '         where %3$s and c.embedding is not null order by %2$s %4$s) x',
                    pg_catalog.replace(exact_sql, '{q}', '$8'), pg_catalog.replace(order_sql, '{q}', '$8'),
                    filter_sql, cut_sql)
                   into scan_ids, scan_docs, scan_distances
                  using _search_vector.groups, _search_vector.category, _search_vector.labels,
                        embeddings, _search_vector.match_count, _search_vector.min_similarity,
                        candidates, embeddings[i], _search_vector.visible_groups;
                select pg_catalog.array_agg(h.id order by h.distance, h.id),
                       pg_catalog.array_agg(h.document_id order by h.distance, h.id),
                       pg_catalog.array_agg(h.distance order by h.distance, h.id)
                  into chunk_ids, document_ids, distances
                  from (select u.id, u.document_id, pg_catalog.min(u.distance) as distance
                          from (select * from unnest(chunk_ids, document_ids, distances)
                                union all
                                select * from (select * from unnest(scan_ids, scan_docs, scan_distances)
                                                      as s(id, document_id, distance)
                                                order by 3, 1 limit _search_vector.match_count) s
                               ) u(id, document_id, distance)
                         group by u.id, u.document_id
                         order by distance, u.id limit _search_vector.match_count) h
                 where 1 - h.distance >= _search_vector.min_similarity or i < cardinality(embeddings);
            end loop;
            exit when attempt = 2 or caller_filters
                   or coalesce(pg_catalog.cardinality(chunk_ids), 0) >= _search_vector.match_count
                   or ef_search >= 1000;
            -- the workers' ef_search too (set_config would widen the coordinator's alone)
            perform kb._set_local_on_workers(array['hnsw.ef_search'], array['1000']);
        end loop;
        return;
    end if;
    -- h: the index's candidates (ordered by the layout's expression), ranked by exact
    -- distance; several embeddings: one index scan each, and a chunk several of them found
    -- keeps its best distance
    if cardinality(embeddings) > 1 then
        q := 'e.q';
    end if;
    scan_sql := pg_catalog.format(
        'select pg_catalog.array_agg(b.id order by b.distance, b.id), '
        '       pg_catalog.array_agg(b.document_id order by b.distance, b.id), '
        '       pg_catalog.array_agg(b.distance order by b.distance, b.id) '
        '  from (select h.id, h.document_id, pg_catalog.min(h.distance) as distance '
        '          from %4$s '
        '               lateral (select x.id, x.document_id, x.distance '
        '                  from (select c.id, c.document_id, %1$s as distance from ' || kb._chunks_relation() || ' c '
        '                         where %3$s and c.embedding is not null order by %2$s %5$s) x '
        '                 order by x.distance, x.id limit $5) h '
        '         group by h.id, h.document_id '
        '         order by distance, h.id limit $5) b '
        ' where 1 operator(pg_catalog.-) b.distance >= $6',
        pg_catalog.replace(exact_sql, '{q}', q), pg_catalog.replace(order_sql, '{q}', q),
        filter_sql, case when q = 'e.q' then 'pg_catalog.unnest($4) e(q),' else '' end, cut_sql);
    for attempt in 1..2 loop
        execute scan_sql
           into chunk_ids, document_ids, distances
          using _search_vector.groups, _search_vector.category, _search_vector.labels,
                embeddings, _search_vector.match_count, _search_vector.min_similarity, candidates,
                _search_vector.query_embedding, _search_vector.visible_groups;
        -- a search whose greedy descent through the graph's upper layers ends in the wrong
        -- region finds none of its neighbours: it comes back with the pool filled from far
        -- away, under the similarity floor (at 1M chunks 1 query in 20-70 at ef_search 256,
        -- which ones by build; a wider ef_search only makes it rarer: 384-448 were
        -- needed for none in 280 queries, at twice the time of every search). So a scan that
        -- brings back fewer than match_count chunks at or above the floor, with no filter of
        -- the caller's to explain it, runs once more at the widest ef_search pgvector allows:
        -- the stranded query then finds all it can, a query with little that is similar pays
        -- one more scan, every other pays nothing (docs/scaling.md section 1). What the caller
        -- may read (visible_groups, row-level security) is no filter here: hnsw.max_scan_tuples
        -- bounds the scan
        exit when attempt = 2 or caller_filters
               or coalesce(pg_catalog.cardinality(chunk_ids), 0) >= _search_vector.match_count
               or pg_catalog.current_setting('hnsw.ef_search')::integer >= 1000;
        perform pg_catalog.set_config('hnsw.ef_search', '1000', true);
    end loop;
end
$$;
comment on function kb._search_vector(@extschema:vector@.vector, integer, text[], text, text[], double precision, @extschema:vector@.vector[], boolean, text[], jsonb) is
    'The vector arm (kb.search_vector) as arrays, best first: chunk ids, their documents and '
    'cosine distances, among the chunks visible_groups lets the caller read (NULL: all) and '
    'the filters keep (metadata_filter: sql/018). '
    'keep_filtered: with filters selective enough for the exact path, also the ids of every '
    'chunk the filters keep (else NULL). Internal to kb.search_vector and kb.search.';

create or replace function kb.search_vector(
    query_embedding @extschema:vector@.vector,
    match_count integer default 8,
    groups text[] default null,
    category text default null,
    labels text[] default null,
    min_similarity double precision default 0.30,
    extra_embeddings @extschema:vector@.vector[] default null,
    filter jsonb default null
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    score double precision,
    similarity double precision
)
language sql
stable
-- a reader's way in: the owner's rights, the caller's grants (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
begin atomic
    select u.ord::integer, u.id, u.doc, 1 - u.distance, 1 - u.distance
      from kb._search_vector(query_embedding, match_count, groups, category, labels,
                             min_similarity, extra_embeddings, false, kb._access_visibility(),
                             search_vector.filter) v
     cross join lateral unnest(v.chunk_ids, v.document_ids, v.distances)
           with ordinality as u(id, doc, distance, ord)
     order by u.ord;
end;
comment on function kb.search_vector(@extschema:vector@.vector, integer, text[], text, text[], double precision, @extschema:vector@.vector[], jsonb) is
    'Vector arm: top match_count chunks by cosine similarity (score = similarity = 1 - cosine '
    'distance) at or above min_similarity, filters (filter => a metadata filter, as kb.search) applied inside the HNSW scan (iterative '
    'scan) or, for very selective filters, by an exact scan; only chunks the caller may read. '
    'NULL embedding: no rows. '
    'extra_embeddings (e.g. paraphrases of the question): one scan each, a chunk ranked by its '
    'best similarity to any of them.';
