-- kbpg: kb.search — the whole retrieval pipeline in one call, callable by hand from psql:
--   SELECT * FROM kb.search('renew permit', match_count => 5);
-- Arms: vector (when an embedding is given), lexical BM25 (on by default), graph (off by
-- default; seeds are the vector hits, or the lexical hits when there is no embedding).
-- Each arm fetches a pool of match_count * fetch_multiplier candidates (at most 1000) under
-- the same filters; the lists are fused with weighted RRF, capped per document (over-cap
-- chunks move to the tail), and the top match_count returned. score is always the fused RRF
-- score (with no lexical and no graph hits, RRF over the vector arm alone: the vector order
-- stands, score 1/(rrf_k + rank) times its weight). A lexical arm that fails
-- leaves the vector arm alone, with a NOTICE. similarity is the cosine similarity of every
-- returned chunk when an embedding is given (also of chunks only other arms found), else NULL;
-- vector_rank / lexical_rank / graph_rank are each arm's rank (from 1), NULL where it missed;
-- fused_rank is the rank after fusion (and recency), before the per-document cap.
-- recency => '30 days' (a half-life): after fusion, each fused score times 0.5 per half-life of
-- its document's age (its date under recency_key in the metadata, else its updated_at).
-- diversity => λ (0: off): after that, the pool re-ranked by maximal marginal relevance.
-- fusion => 'convex': the arms' scores min-max normalised and summed with the weights
-- (kb.fuse_convex) instead of RRF; score is then that sum.
-- vector_weight NULL (the default) is kb._default_vector_weight(): 1, or 0 when the embedding
-- model does not know the knowledge base's language (an English-only model on Russian text);
-- any weight given overrides it.
-- extra_embeddings (query expansion: paraphrases of the question) join the vector arm, which
-- ranks each chunk by its best similarity to any query embedding; similarity is that best one.
-- rerank_pool => N returns the fused pool for an external reranker instead: each arm fetches
-- greatest(N, match_count) candidates and every fused chunk comes back in fused order, neither
-- capped per document nor cut; the caller reranks them and then applies
-- kb.cap_per_document and the cut to match_count itself.

create or replace function kb.search(
    query_text text,
    query_embedding @extschema:vector@.vector default null,
    match_count integer default 8,
    groups text[] default null,
    category text default null,
    labels text[] default null,
    min_similarity double precision default 0.30,
    fetch_multiplier integer default 4,
    max_per_doc integer default 3,
    rrf_k integer default 60,
    vector_weight double precision default null,
    lexical_weight double precision default 1,
    graph_weight double precision default 1,
    use_lexical boolean default true,
    use_graph boolean default false,
    graph_max_depth integer default 1,
    graph_max_returned integer default 3,
    graph_min_score double precision default 0.5,
    extra_embeddings @extschema:vector@.vector[] default null,
    rerank_pool integer default null,
    filter jsonb default null,
    recency interval default null,
    recency_key text default null,
    diversity double precision default 0,
    fusion text default 'rrf'
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    source text,
    title text,
    section text,
    content text,
    score double precision,
    similarity double precision,
    vector_rank integer,
    lexical_rank integer,
    graph_rank integer,
    fused_rank integer
)
language plpgsql
stable
-- a reader's way in: the owner's rights, the caller's grants (sql/015); caller input reaches
-- SQL only as parameters, and the messages of the statements inside stay inside
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    -- what the caller may read (NULL: everything), for every arm
    visible constant text[] := kb._access_visibility();
    has_text constant boolean := search.query_text is not null and pg_catalog.btrim(search.query_text) <> '';
    pool integer;
    vector_ids bigint[] := '{}';
    lexical_ids bigint[] := '{}';
    graph_ids bigint[] := '{}';
    -- each arm's own scores, for fusion => 'convex' (cosine similarity, BM25, path score)
    vector_scores double precision[] := '{}';
    lexical_scores double precision[] := '{}';
    graph_scores double precision[] := '{}';
    vector_docs bigint[] := '{}';
    lexical_docs bigint[] := '{}';
    graph_docs bigint[] := '{}';
    -- the distributed layout (Citus): the result rows read in one statement (sql/015)
    distributed constant boolean := kb._distributed();
    fused_ids bigint[];
    fused_docs bigint[];
    fused_scores double precision[];
    fused_vector_ranks integer[];
    fused_lexical_ranks integer[];
    fused_graph_ranks integer[];
    vector_only boolean;
    filtered_ids bigint[];
    embeddings @extschema:vector@.vector[];
    err_state text;
    err_message text;
    err_detail text;
    err_hint text;
    -- NULL: 1, or 0 when the embedding model does not know the knowledge base's language
    vector_w constant double precision := coalesce(search.vector_weight, kb._default_vector_weight());
    -- recency: the path of a document's date in its metadata (a date or a timestamp), else
    -- its updated_at
    recency_path text;
    -- diversity (MMR): the pool's embeddings, each chunk's relevance and its highest
    -- similarity to a chunk already picked, the picked order
    pool_embeddings @extschema:vector@.vector[];
    relevance double precision[];
    nearest double precision[];
    picked integer[];
    pool_size integer;
    picks integer;
    -- the rows returned: match_count, or the whole capped pool for a rerank (kbpg reranks
    -- outside and cuts to match_count itself)
    shown constant integer := case when search.rerank_pool is null then search.match_count
                                   else 2147483647 end;
    best integer;
begin
    perform kb._check_match_count(search.match_count);
    perform kb._check_search_input(search.query_text, search.query_embedding, search.fetch_multiplier);
    perform kb._check_fusion_parameters(search.rrf_k, vector_w,
                                       search.lexical_weight, search.graph_weight);
    perform kb._check_max_per_doc(search.max_per_doc);
    -- checked here too: an arm that does not run (no embedding, no graph) checks nothing
    if search.min_similarity in ('NaN', 'Infinity', '-Infinity')
       or search.graph_min_score in ('NaN', 'Infinity', '-Infinity') then
        raise exception 'min_similarity and graph_min_score must be finite numbers, got % and %',
                search.min_similarity, search.graph_min_score
            using errcode = '22023', hint = 'min_similarity is in [-1, 1] (0.30 by default), graph_min_score in [0, 1]';
    end if;
    perform kb._check_query_embedding(search.query_embedding);
    -- a bad metadata filter is the caller's error (KB004), said before any arm runs
    perform kb._metadata_jsonpath(search.filter);
    if search.recency is not null
       and (search.recency <= interval '0' or pg_catalog.isfinite(search.recency) is not true) then
        raise exception 'recency must be a positive half-life, got %', search.recency
            using errcode = '22023', hint = 'a half-life such as ''30 days'': a chunk that old counts half';
    end if;
    if search.recency_key is not null then
        if search.recency is null then
            raise exception 'recency_key given without recency'
                using errcode = '22023', hint = 'pass recency => ''30 days'' (a half-life) too';
        end if;
        recency_path := kb._metadata_key_path(search.recency_key, 'recency_key')
            || '.datetime() ? (@.type() == "date" || @.type() starts with "timestamp")';
    end if;
    if search.diversity is null or search.diversity not between 0 and 1 then
        raise exception 'diversity must be between 0 and 1, got %', coalesce(search.diversity::text, 'NULL')
            using errcode = '22023', hint = '0 (the default) is off; 0.3 trades a little relevance for variety';
    end if;
    if search.fusion is null or search.fusion not in ('rrf', 'convex') then
        raise exception 'fusion must be rrf or convex, got %', coalesce(search.fusion, 'NULL')
            using errcode = '22023', hint = 'rrf (the default) fuses ranks; convex fuses min-max normalised scores with the weights';
    end if;
    if (search.recency is not null or search.diversity > 0 or search.fusion = 'convex') and distributed then
        raise exception 'recency, diversity and convex fusion are not available on a distributed knowledge base yet'
            using errcode = '0A000', hint = 'search without them, or re-rank the results yourself';
    end if;
    if search.vector_weight is null and vector_w = 0
       and (search.query_embedding is not null or search.extra_embeddings is not null) then
        raise notice 'kbpg: % does not know the knowledge base''s language (%): its vector arm is left out of the fusion',
                (select e.model from kb.embedding_space e), (select l.name from kb.language l)
            using hint = 'pass vector_weight (--vector-weight) to fuse it anyway, or re-embed with a model that knows the language (kbpg reembed --embedder e5-multilingual)';
    end if;
    if search.rerank_pool is not null and search.rerank_pool not between 1 and 1000 then
        raise exception 'rerank_pool must be between 1 and 1000, got %', search.rerank_pool
            using errcode = '22023', hint = 'each arm fetches greatest(rerank_pool, match_count) candidates for a reranker; 20 is usual';
    end if;
    pool := case when search.rerank_pool is null
                 then least(search.match_count * search.fetch_multiplier, 1000)
                 else greatest(search.rerank_pool, search.match_count) end;
    embeddings := pg_catalog.array_prepend(search.query_embedding, search.extra_embeddings);

    if search.query_embedding is not null or search.extra_embeddings is not null then
        -- a filter selective enough for the vector arm's exact path: the ids of the chunks it
        -- keeps come back with the vector hits, and the lexical arm takes them from there
        -- (it reads the filters' stored bitmaps instead when they serve, sql/040)
        select coalesce(v.chunk_ids, '{}'), coalesce(v.document_ids, '{}'), v.filtered_ids,
               coalesce(array(select 1 - d from unnest(v.distances) with ordinality as u(d, o) order by u.o), '{}')
          into vector_ids, vector_docs, filtered_ids, vector_scores
          from kb._search_vector(search.query_embedding, pool, search.groups, search.category,
                                 search.labels, search.min_similarity, search.extra_embeddings,
                                 keep_filtered => search.use_lexical and has_text
                                     and not kb._filter_masks_serve(
                                         search.groups, search.category, search.labels,
                                         (select m.mask_values from kb._metadata_masks(search.filter) m)),
                                 visible_groups => visible, metadata_filter => search.filter) v;
    end if;

    if search.use_lexical and has_text then
        begin
            select coalesce(array_agg(l.chunk_id order by l.rank), '{}'),
                   coalesce(array_agg(l.document_id order by l.rank), '{}'),
                   coalesce(array_agg(l.score order by l.rank), '{}')
              into lexical_ids, lexical_docs, lexical_scores
              from kb._search_lexical(search.query_text, pool, search.groups, search.category,
                                      search.labels, filtered_ids, visible, search.filter) l;
        exception when others then
            -- a query over the cost bound (KB003) is the caller's to fix, not a broken arm
            if sqlstate = 'KB003' then
                raise;
            end if;
            -- fail-soft: a broken lexical arm must not take the vector arm down with it
            raise notice 'kbpg: lexical arm failed (SQLSTATE %: %); ranking without it', sqlstate, sqlerrm;
            lexical_ids := '{}';
            lexical_docs := '{}';
            lexical_scores := '{}';
        end;
    end if;

    if search.use_graph then
        select coalesce(array_agg(g.chunk_id order by g.rank), '{}'),
               coalesce(array_agg(g.document_id order by g.rank), '{}'),
               coalesce(array_agg(g.score order by g.rank), '{}')
          into graph_ids, graph_docs, graph_scores
          from kb._expand_graph(case when cardinality(vector_ids) > 0 then vector_ids else lexical_ids end,
                                search.graph_max_depth, search.graph_max_returned,
                                search.graph_min_score, search.groups, search.category,
                                search.labels, visible, search.filter) g;
    end if;

    vector_only := cardinality(lexical_ids) = 0 and cardinality(graph_ids) = 0;
    if distributed then
        return query select * from kb._search_results_distributed(
            search.rrf_k, vector_w, search.lexical_weight, search.graph_weight,
            case when search.rerank_pool is null then search.max_per_doc end,
            case when search.rerank_pool is null then search.match_count end,
            vector_only, embeddings, vector_ids || lexical_ids || graph_ids,
            vector_docs || lexical_docs || graph_docs, vector_ids, lexical_ids, graph_ids);
        return;
    end if;
    select array_agg(f.chunk_id order by f.rank), array_agg(c.document_id order by f.rank),
           array_agg(f.score order by f.rank), array_agg(f.vector_rank order by f.rank),
           array_agg(f.lexical_rank order by f.rank), array_agg(f.graph_rank order by f.rank)
      into fused_ids, fused_docs, fused_scores, fused_vector_ranks, fused_lexical_ranks,
           fused_graph_ranks
      from kb._fuse(search.fusion, vector_ids, vector_scores, lexical_ids, lexical_scores,
                    graph_ids, graph_scores, search.rrf_k, vector_w, search.lexical_weight,
                    search.graph_weight) f
      join kb.chunks c on c.id = f.chunk_id;
    if fused_ids is null then
        return;
    end if;
    if search.recency is not null then
        -- recency, after fusion and never inside an arm: each fused score times 0.5 per
        -- half-life of its document's age (its date under recency_key, else updated_at; a
        -- date in the future counts as today), the order then taken again (ties: the fused
        -- order) before the per-document cap
        select array_agg(r.id order by r.score desc, r.ord), array_agg(r.doc order by r.score desc, r.ord),
               array_agg(r.score order by r.score desc, r.ord), array_agg(r.vr order by r.score desc, r.ord),
               array_agg(r.lr order by r.score desc, r.ord), array_agg(r.gr order by r.score desc, r.ord)
          into fused_ids, fused_docs, fused_scores, fused_vector_ranks, fused_lexical_ranks,
               fused_graph_ranks
          from (select u.id, u.doc, u.vr, u.lr, u.gr, u.ord,
                       u.score * pg_catalog.power(0.5::float8,
                           greatest(pg_catalog.date_part('epoch', pg_catalog.now() - coalesce(
                               (pg_catalog.jsonb_path_query_first_tz(
                                    d.metadata, recency_path::pg_catalog.jsonpath, '{}', true)
                                #>> '{}')::timestamptz,
                               d.updated_at)), 0)
                           / pg_catalog.date_part('epoch', search.recency)) as score
                  from unnest(fused_ids, fused_docs, fused_scores, fused_vector_ranks,
                              fused_lexical_ranks, fused_graph_ranks)
                       with ordinality as u(id, doc, score, vr, lr, gr, ord)
                  join kb.documents d on d.id = u.doc) r;
    end if;
    if search.diversity > 0 and cardinality(fused_ids) > 1 then
        -- maximal marginal relevance over the fused pool, before the per-document cap: picked
        -- one at a time, each the chunk with the best (1 - diversity) x relevance (its score over
        -- the best score) - diversity x its highest cosine similarity to a chunk already picked
        -- (a chunk without an embedding is like none); the first match_count + 10 so, the rest
        -- after them in fused order. Each pick is two statements over the pool's arrays (C
        -- arithmetic): k x n, not a plpgsql loop per pair
        pool_size := cardinality(fused_ids);
        select array_agg(c.embedding order by u.ord) into pool_embeddings
          from unnest(fused_ids) with ordinality as u(id, ord)
          join kb.chunks c on c.id = u.id;
        relevance := array(select u.s / greatest(fused_scores[1], 1e-300)
                             from unnest(fused_scores) with ordinality as u(s, ord) order by u.ord);
        nearest := pg_catalog.array_fill(0::float8, array[pool_size]);
        picked := '{}';
        picks := least(pool_size, search.match_count + 10);
        for step in 1..picks loop
            select u.i into best
              from unnest(relevance, nearest) with ordinality as u(r, m, i)
             where u.i <> all (picked)
             order by (1 - search.diversity) * u.r - search.diversity * u.m desc, u.i
             limit 1;
            picked := picked || best;
            nearest := array(
                select greatest(u.m, coalesce(1 - (u.e operator(@extschema:vector@.<=>) pool_embeddings[best]), 0))
                  from unnest(nearest, pool_embeddings) with ordinality as u(m, e, i)
                 order by u.i);
        end loop;
        picked := picked || array(select i from pg_catalog.generate_series(1, pool_size) i
                                  where i <> all (picked) order by i);
        select array_agg(fused_ids[p.i] order by p.o), array_agg(fused_docs[p.i] order by p.o),
               array_agg(fused_scores[p.i] order by p.o), array_agg(fused_vector_ranks[p.i] order by p.o),
               array_agg(fused_lexical_ranks[p.i] order by p.o), array_agg(fused_graph_ranks[p.i] order by p.o)
          into fused_ids, fused_docs, fused_scores, fused_vector_ranks, fused_lexical_ranks,
               fused_graph_ranks
          from unnest(picked) with ordinality as p(i, o);
    end if;

    return query
    select p.rank, c.id, c.document_id, d.source, d.title, c.section, c.content,
           fused_scores[p.input_rank],
           b.similarity,
           fused_vector_ranks[p.input_rank], fused_lexical_ranks[p.input_rank],
           fused_graph_ranks[p.input_rank], p.input_rank
      from kb.cap_per_document(fused_ids, fused_docs,
                               case when search.rerank_pool is null then search.max_per_doc end) p
      join kb.chunks c on c.id = p.chunk_id
      join kb.documents d on d.id = c.document_id
      cross join lateral (
          select pg_catalog.max(1 - (c.embedding operator(@extschema:vector@.<=>) q.e)) as similarity
            from pg_catalog.unnest(embeddings) q(e)) b
     -- one comparison, not `rerank_pool is not null or rank <= match_count`: the plan cache
     -- then keeps one generic plan for this statement (with the OR its estimate stayed above
     -- the custom plans', and every search planned it again: 0.25-0.33 ms of each)
     where p.rank <= shown
     order by p.rank;
exception when others or query_canceled then
    -- a caller (a reader in psql) gets the error's code, message, detail and hint, not the
    -- CONTEXT of kbpg's inner functions (their statements and line numbers): re-raised here,
    -- the context names kb.search alone (issue 38)
    get stacked diagnostics err_state = returned_sqlstate, err_message = message_text,
                            err_detail = pg_exception_detail, err_hint = pg_exception_hint;
    if err_detail <> '' and err_hint <> '' then
        raise exception using errcode = err_state, message = err_message, detail = err_detail,
                              hint = err_hint;
    elsif err_detail <> '' then
        raise exception using errcode = err_state, message = err_message, detail = err_detail;
    elsif err_hint <> '' then
        raise exception using errcode = err_state, message = err_message, hint = err_hint;
    end if;
    raise exception using errcode = err_state, message = err_message;
end
$$;
comment on function kb.search(text, @extschema:vector@.vector, integer, text[], text, text[], double precision, integer, integer, integer, double precision, double precision, double precision, boolean, boolean, integer, integer, double precision, @extschema:vector@.vector[], integer, jsonb, interval, text, double precision, text) is
    'Hybrid search: vector + BM25 lexical (+ graph) arms under the same filters, weighted RRF '
    '(rrf_k 60), at most max_per_doc chunks per document in front, top match_count. Filters: '
    'groups => chunks in any of the groups, category => that category, labels => chunks '
    'carrying all of the labels, filter => a metadata filter on the documents'' metadata '
    '(langchain-postgres''s operators: {"year": {"$gte": 2020}, "author.name": {"$ilike": '
    '"ann%"}, "$or": [...]}; a bad one: SQLSTATE KB004). recency => ''30 days'': after '
    'fusion, each score halves per half-life of its document''s age (its date under '
    'recency_key in the metadata, else updated_at); score and fused_rank are then the decayed '
    'ones. diversity => 0.3 (0: off): the pool re-ranked by maximal marginal relevance over the '
    'chunks'' embeddings, before the per-document cap; fused_rank is then that order. '
    'fusion => ''convex'': each arm''s scores min-max normalised and summed with the weights '
    '(kb.fuse_convex) instead of RRF. NULL '
    'embedding: lexical (+ graph) only. vector_weight NULL: kb._default_vector_weight() (0 when '
    'the embedding model does not know the knowledge base''s language). extra_embeddings: more query vectors for the vector '
    'arm (best similarity wins). rerank_pool => N: the whole fused pool (N candidates an arm), '
    'uncapped and uncut, for a reranker. A reader finds only the chunks it may read. Example: SELECT * FROM kb.search(''renew permit'', match_count => 5).';
