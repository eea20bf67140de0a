-- kbpg: kb.search_knowledge_bases — one hybrid search across several knowledge bases that
-- share an embedding space (issue 39):
--   SELECT * FROM kb.search_knowledge_bases('{handbook,faq}', 'renew permit', match_count => 5);
-- Each knowledge base runs its own arms, under the caller's grants in it, BM25 with its own
-- statistics (exact, as kb.search in it alone). The arms are then merged as one index split
-- in shards would be: the vector hits by cosine similarity (comparable: one embedding space),
-- the lexical hits by BM25 score, each merged list cut to the pool; then weighted RRF and the
-- per-document cap, as kb.search. Searching one knowledge base so gives kb.search's ranking
-- (without its graph arm, recency, diversity, convex fusion and rerank pool).

create or replace function kb.search_knowledge_bases(
    knowledge_bases text[],
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
    filter jsonb default null
)
returns table (
    rank integer,
    knowledge_base text,
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
    fused_rank integer
)
language plpgsql
stable
-- a reader's way in: the owner's rights, the caller's grants in each knowledge base (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    caller_kb constant text := pg_catalog.current_setting('kbpg.kb_id', true);
    has_text constant boolean := query_text is not null and pg_catalog.btrim(query_text) <> '';
    names text[];
    kb_ids integer[] := '{}';
    kb_id integer;
    visible text[];
    space_model text;
    space_dimension integer;
    space_of text;
    this_model text;
    this_dimension integer;
    pool integer;
    -- every knowledge base's hits of each arm, one after the other, each in its own order: the
    -- chunk, its document, its score, and the knowledge base's position in names
    vector_ids bigint[] := '{}';
    vector_docs bigint[] := '{}';
    vector_scores double precision[] := '{}';
    vector_from integer[] := '{}';
    lexical_ids bigint[] := '{}';
    lexical_docs bigint[] := '{}';
    lexical_scores double precision[] := '{}';
    lexical_from integer[] := '{}';
    found_ids bigint[];
    found_docs bigint[];
    found_scores double precision[];
    fused_ids bigint[];
    fused_docs bigint[];
    fused_scores double precision[];
    fused_vector_ranks integer[];
    fused_lexical_ranks integer[];
begin
    if knowledge_bases is null or cardinality(knowledge_bases) = 0
       or array_position(knowledge_bases, null) is not null then
        raise exception 'name at least one knowledge base, and no NULL'
            using errcode = '22023', hint = 'for example array[''handbook'', ''faq'']';
    end if;
    -- each once, in the order first given (it breaks ties between equal scores)
    names := array(select u.name from unnest(knowledge_bases) with ordinality u(name, ord)
                    group by u.name order by min(u.ord));
    if cardinality(names) > 100 then
        raise exception 'at most 100 knowledge bases in one search, got %', cardinality(names)
            using errcode = '22023', hint = 'search fewer at once';
    end if;
    if kb._distributed() then
        raise exception 'a search across knowledge bases is not available on a distributed database yet'
            using errcode = '0A000', hint = 'search each knowledge base with kb.search';
    end if;
    perform kb._check_match_count(match_count);
    perform kb._check_search_input(query_text, query_embedding, fetch_multiplier);
    perform kb._check_fusion_parameters(rrf_k, coalesce(vector_weight, 1), lexical_weight, 1);
    perform kb._check_max_per_doc(max_per_doc);
    if min_similarity in ('NaN', 'Infinity', '-Infinity') then
        raise exception 'min_similarity must be a finite number, got %', min_similarity
            using errcode = '22023', hint = 'min_similarity is in [-1, 1] (0.30 by default)';
    end if;
    perform kb._metadata_jsonpath(filter);
    pool := least(match_count * fetch_multiplier, 1000);

    for i in 1 .. cardinality(names) loop
        -- KB011 for one the caller may not read, as for one that does not exist
        kb_id := kb.knowledge_base_id(names[i]);
        kb_ids := kb_ids || kb_id;
        perform pg_catalog.set_config('kbpg.kb_id', kb_id::text, true);
        visible := kb._access_visibility();
        select e.model, e.dimension into this_model, this_dimension from kb.embedding_space e;
        if this_model is not null then
            if space_model is null then
                space_model := this_model;
                space_dimension := this_dimension;
                space_of := names[i];
            elsif (this_model, this_dimension) is distinct from (space_model, space_dimension) then
                raise exception 'knowledge bases % and % hold different embedding spaces (% %-d, % %-d)',
                        space_of, names[i], space_model, space_dimension, this_model, this_dimension
                    using errcode = 'KB001',
                          hint = 'search them one at a time, or re-embed one with the other''s model (kbpg reembed --kb NAME --embedder ...)';
            end if;
        end if;
        if query_embedding is not null and this_model is not null then
            perform kb._check_query_embedding(query_embedding);
            -- a knowledge base whose language its model does not know (kb._default_vector_weight
            -- 0) adds no vector hits unless a weight is given, as kb.search leaves its arm out
            if vector_weight is not null or kb._default_vector_weight() > 0 then
                select coalesce(v.chunk_ids, '{}'), coalesce(v.document_ids, '{}'),
                       coalesce(array(select 1 - d from unnest(v.distances) with ordinality as u(d, o) order by u.o), '{}')
                  into found_ids, found_docs, found_scores
                  from kb._search_vector(search_knowledge_bases.query_embedding, pool,
                                         search_knowledge_bases.groups, search_knowledge_bases.category,
                                         search_knowledge_bases.labels, search_knowledge_bases.min_similarity,
                                         null, false, visible, search_knowledge_bases.filter) v;
                vector_ids := vector_ids || found_ids;
                vector_docs := vector_docs || found_docs;
                vector_scores := vector_scores || found_scores;
                vector_from := vector_from || array_fill(i, array[cardinality(found_ids)]);
            end if;
        end if;
        if has_text then
            select coalesce(array_agg(l.chunk_id order by l.rank), '{}'),
                   coalesce(array_agg(l.document_id order by l.rank), '{}'),
                   coalesce(array_agg(l.score order by l.rank), '{}')
              into found_ids, found_docs, found_scores
              from kb._search_lexical(search_knowledge_bases.query_text, pool,
                                      search_knowledge_bases.groups, search_knowledge_bases.category,
                                      search_knowledge_bases.labels, null, visible,
                                      search_knowledge_bases.filter) l;
            lexical_ids := lexical_ids || found_ids;
            lexical_docs := lexical_docs || found_docs;
            lexical_scores := lexical_scores || found_scores;
            lexical_from := lexical_from || array_fill(i, array[cardinality(found_ids)]);
        end if;
    end loop;
    perform pg_catalog.set_config('kbpg.kb_id', coalesce(caller_kb, ''), true);

    -- each arm merged by its score (ties: the knowledge bases' order, then each one's own)
    select array_agg(f.chunk_id order by f.rank), array_agg(h.doc order by f.rank),
           array_agg(f.score order by f.rank), array_agg(f.vector_rank order by f.rank),
           array_agg(f.lexical_rank order by f.rank)
      into fused_ids, fused_docs, fused_scores, fused_vector_ranks, fused_lexical_ranks
      from kb._fuse('rrf',
                    array(select u.id from unnest(vector_ids, vector_scores, vector_from)
                                           with ordinality as u(id, s, k, o)
                           order by u.s desc, u.k, u.o limit pool), '{}',
                    array(select u.id from unnest(lexical_ids, lexical_scores, lexical_from)
                                           with ordinality as u(id, s, k, o)
                           order by u.s desc, u.k, u.o limit pool), '{}',
                    '{}', '{}', rrf_k, coalesce(vector_weight, 1), lexical_weight, 1) f
      join (select distinct on (u.id) u.id, u.doc
              from unnest(vector_ids || lexical_ids, vector_docs || lexical_docs) u(id, doc)) h
        on h.id = f.chunk_id;
    if fused_ids is null then
        return;
    end if;
    return query
    select p.rank, k.name, c.id, c.document_id, d.source, d.title, c.section, c.content,
           fused_scores[p.input_rank],
           case when search_knowledge_bases.query_embedding is not null and space_model is not null
                then 1 - (c.embedding operator(@extschema:vector@.<=>) search_knowledge_bases.query_embedding) end,
           fused_vector_ranks[p.input_rank], fused_lexical_ranks[p.input_rank], p.input_rank
      from kb.cap_per_document(fused_ids, fused_docs, search_knowledge_bases.max_per_doc) p
      join kb_data.chunks c on c.id = p.chunk_id and c.kb_id = any (kb_ids)
      join kb_data.documents d on d.id = c.document_id and d.kb_id = c.kb_id
      join kb_data.knowledge_bases k on k.id = c.kb_id
     where p.rank <= search_knowledge_bases.match_count
     order by p.rank;
end
$$;
comment on function kb.search_knowledge_bases(text[], text, @extschema:vector@.vector, integer, text[], text, text[], double precision, integer, integer, integer, double precision, double precision, jsonb) is
    'One hybrid search across several knowledge bases of one embedding space (KB001 when their '
    'models or dimensions differ; KB011 for one the caller may not read): each runs its vector '
    'and BM25 arms (its own statistics) under the caller''s grants in it; the vector hits are '
    'merged by similarity, the lexical ones by BM25 score, then weighted RRF and the per-document '
    'cap as kb.search, whose ranking it gives for one knowledge base (no graph arm, recency, '
    'diversity or convex fusion). knowledge_base names where each chunk comes from.';
