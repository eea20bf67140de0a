-- kbpg: the embedding space — which model's vectors kb.chunks holds, and how they are indexed.
-- The HNSW index is created here, not in a migration: its dimension is the model's.
-- Index layouts (kb.embedding_space.layout), all on kb.chunks.embedding (full precision, any
-- dimension pgvector stores, up to 16,000):
--   vector   HNSW on the vectors themselves (vector_cosine_ops): up to 2,000 dimensions
--   halfvec  HNSW on embedding::halfvec(n) (halfvec_cosine_ops): up to 4,000, half the memory
--   binary   HNSW on binary_quantize(embedding)::bit(n) (bit_hamming_ops): up to 16,000,
--            1/32 of the memory; kb.search_vector over-fetches by Hamming distance and re-ranks
--            the candidates by exact cosine
-- Every layout returns exact cosine similarities: the index only chooses the candidates.

create or replace function kb.default_vector_layout(vector_dimension integer)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- halfvec: same recall@32 as vector at 200k chunks, half the index (benchmarks/bench_vector_layouts.py)
return case when vector_dimension <= 4000 then 'halfvec' else 'binary' end;
comment on function kb.default_vector_layout(integer) is
    'The index layout a new knowledge base gets for vectors of this dimension: halfvec up to '
    '4,000 dimensions, binary quantization with exact re-rank above.';

create or replace function kb._check_vector_layout(layout text, vector_dimension integer)
returns void
language plpgsql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if vector_dimension is null or vector_dimension < 1 or vector_dimension > 16000 then
        raise exception 'embedding dimension % is out of range', vector_dimension
            using errcode = '22023', hint = 'pgvector stores vectors of 1 to 16,000 dimensions';
    end if;
    if layout is null or layout not in ('vector', 'halfvec', 'binary') then
        raise exception 'unknown vector index layout %', coalesce(layout, 'NULL')
            using errcode = '22023', hint = 'use vector, halfvec or binary';
    end if;
    if layout = 'vector' and vector_dimension > 2000 then
        raise exception 'the vector layout indexes at most 2,000 dimensions, not %', vector_dimension
            using errcode = '22023',
                  hint = 'use halfvec (up to 4,000 dimensions) or binary (with exact re-rank)';
    end if;
    if layout = 'halfvec' and vector_dimension > 4000 then
        raise exception 'the halfvec layout indexes at most 4,000 dimensions, not %', vector_dimension
            using errcode = '22023', hint = 'use binary (binary quantization with exact re-rank)';
    end if;
end
$$;
comment on function kb._check_vector_layout(text, integer) is
    'Raise 22023 unless the layout can index vectors of this dimension.';

create or replace function kb._vector_index_definition(layout text, vector_dimension integer)
returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
-- m 16 / ef_construction 64: pgvector's defaults (build 65 s for 200k 384-d vectors, 2 cores)
return 'using hnsw ('
    || case layout
           when 'vector' then format('(embedding::@extschema:vector@.vector(%s)) @extschema:vector@.vector_cosine_ops',
                                     vector_dimension)
           when 'halfvec' then format('(embedding::@extschema:vector@.halfvec(%s)) @extschema:vector@.halfvec_cosine_ops',
                                      vector_dimension)
           when 'binary' then format('(@extschema:vector@.binary_quantize(embedding)::bit(%s)) @extschema:vector@.bit_hamming_ops',
                                     vector_dimension)
       end
    || ') with (m = 16, ef_construction = 128)';
comment on function kb._vector_index_definition(text, integer) is
    'The HNSW index clause of a layout (the expressions kb.search_vector orders by).';

create or replace function kb._vector_index_name(knowledge_base integer)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- default keeps the name it had before knowledge bases (revision 0028): tools and ops scripts
-- that name it go on working
return case when knowledge_base operator(pg_catalog.=) 1 then 'chunks_embedding_hnsw'
            else 'chunks_embedding_hnsw_' operator(pg_catalog.||) knowledge_base::text end;
comment on function kb._vector_index_name(integer) is
    'The name of a knowledge base''s HNSW index in schema kb_data: chunks_embedding_hnsw for '
    'default, chunks_embedding_hnsw_<id> for another. Internal.';

create or replace function kb._vector_index(knowledge_base integer)
returns pg_catalog.regclass
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
return pg_catalog.to_regclass('kb_data.' operator(pg_catalog.||) kb._vector_index_name(knowledge_base));
comment on function kb._vector_index(integer) is
    'A knowledge base''s HNSW index, NULL when it has none (no vectors yet, or a load that '
    'builds it after its rows). Internal.';

create or replace function kb._build_vector_index(index_name text, layout text, vector_dimension integer)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    -- partial once kb_data.chunks holds another knowledge base's rows: each its own graph (a
    -- search in one never walks another's vectors: pgvector #479) in its own dimension; the
    -- vector arm's statements name their knowledge base as a literal (kb._chunks_relation),
    -- which implies the predicate
    execute pg_catalog.format('create index %I on kb_data.chunks ', index_name)
            operator(pg_catalog.||) kb._vector_index_definition(layout, vector_dimension)
            operator(pg_catalog.||) case when kb._chunks_shared()
                                         then pg_catalog.format(' where kb_id operator(pg_catalog.=) %s',
                                                                kb._current_kb())
                                         else '' end;
end
$$;
comment on function kb._build_vector_index(text, text, integer) is
    'Build the current knowledge base''s HNSW index under this name, in this layout and '
    'dimension: on the whole of kb_data.chunks while default is its only knowledge base, partial '
    '(where kb_id = <id>) otherwise. Internal.';

create or replace function kb._wants_vector_index()
returns boolean
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    -- default always has its HNSW (as every database had). Another knowledge base from 2,000
    -- chunks on: below, the vector arm's exact path (its rows sorted by distance) is exact,
    -- while each partial index costs a scan of the whole shared table to build and a relation
    -- every statement on kb_data.chunks plans with (docs/knowledge-bases-design.md)
    return kb._current_kb() = 1
        or coalesce((select s.chunk_count from kb.corpus_stats s), 0) >= 2000;
end
$$;
comment on function kb._wants_vector_index() is
    'Whether the current knowledge base should have an HNSW index: default always, another '
    'from 2,000 chunks (kbpg builds it after the ingest that gets it there; '
    'kb.set_embedding_layout builds one at any size). Internal.';

create or replace function kb._drop_vector_index()
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    execute pg_catalog.format('drop index if exists kb_data.%I', kb._vector_index_name(kb._current_kb()));
end
$$;
comment on function kb._drop_vector_index() is
    'Drop the current knowledge base''s HNSW index, if it has one (a bulk load builds it again '
    'after its rows: kbpg.store.indexing). Internal.';

create or replace function kb._shared_default_vector_index()
returns text
language plpgsql
volatile  -- (reads only; its result is a statement to run)
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    whole pg_catalog.regclass;
begin
    select i.indexrelid::pg_catalog.regclass into whole
      from pg_catalog.pg_index i
     where i.indexrelid operator(pg_catalog.=) kb._vector_index(1) and i.indpred is null;
    -- the same index (layout, dimension, the parameters it was built with) on default's rows
    return pg_catalog.regexp_replace(pg_catalog.pg_get_indexdef(whole),
                                     '^CREATE INDEX chunks_embedding_hnsw ON (ONLY )?',
                                     'CREATE INDEX chunks_embedding_hnsw_new ON ')
           operator(pg_catalog.||) ' WHERE (kb_id = 1)';
end
$$;
comment on function kb._shared_default_vector_index() is
    'The CREATE INDEX statement of default''s HNSW index limited to default''s rows, named '
    'chunks_embedding_hnsw_new; NULL unless default''s index covers the whole table (none, or '
    'partial already). Internal.';

create or replace function kb._share_default_vector_index()
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    statement constant text := kb._shared_default_vector_index();
begin
    if statement is null then
        return;
    end if;
    -- built already, concurrently, by kbpg kb create (searches went on meanwhile)? else now,
    -- beside the whole one (searches keep reading it until this commits)
    if not exists (select 1 from pg_catalog.pg_index i
                    where i.indexrelid operator(pg_catalog.=) pg_catalog.to_regclass('kb_data.chunks_embedding_hnsw_new')
                      and i.indisvalid
                      and pg_catalog.pg_get_indexdef(i.indexrelid) operator(pg_catalog.=) statement) then
        drop index if exists kb_data.chunks_embedding_hnsw_new;
        execute statement;
    end if;
    drop index kb_data.chunks_embedding_hnsw;
    alter index kb_data.chunks_embedding_hnsw_new rename to chunks_embedding_hnsw;
end
$$;
comment on function kb._share_default_vector_index() is
    'Limit default''s HNSW index to default''s rows (where kb_id = 1) when it covers the whole '
    'table, before another knowledge base stores vectors beside them: the index '
    'kb._shared_default_vector_index() describes, taken as built when valid, else built now. '
    'Internal.';

create or replace function kb.set_embedding_layout(layout text)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    space kb.embedding_space;
    index_name constant text := kb._vector_index_name(kb._current_kb());
begin
    lock table kb.embedding_space in exclusive mode;
    select * into space from kb.embedding_space;
    if not found then
        raise exception 'embedding space not set: no vectors have been ingested yet'
            using errcode = 'KB002', hint = 'ingest documents first; the layout is chosen then';
    end if;
    perform kb._check_vector_layout(set_embedding_layout.layout, space.dimension);
    -- build the new index beside the old one (searches keep using the old index and layout until
    -- this transaction commits: CREATE INDEX blocks writers, not readers), then swap
    execute format('drop index if exists kb_data.%I', index_name || '_new');
    perform kb._build_vector_index(index_name || '_new', set_embedding_layout.layout, space.dimension);
    perform kb._drop_vector_index();
    execute format('alter index kb_data.%I rename to %I', index_name || '_new', index_name);
    update kb_data.embedding_space set layout = set_embedding_layout.layout where kb_id = (select kb._current_kb());
end
$$;
comment on function kb.set_embedding_layout(text) is
    'Index kb.chunks.embedding with another layout (vector, halfvec or binary): builds the new '
    'HNSW index, then replaces the old one; also rebuilds the index when the layout is the same.';

create or replace function kb._model_languages(model_languages text[])
returns text[]
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    resolved text[];
begin
    if model_languages is null then
        return null;  -- every language
    end if;
    if cardinality(model_languages) = 0 or array_position(model_languages, null) is not null then
        raise exception 'model_languages must name at least one language, and no NULL'
            using errcode = '22023',
                  hint = 'e.g. array[''english''] for an English-only model; NULL: every language';
    end if;
    select array_agg(distinct kb._resolve_language(l) order by kb._resolve_language(l))
      into resolved from unnest(model_languages) l;
    return resolved;
end
$$;
comment on function kb._model_languages(text[]) is
    'The languages a model knows as kb.embedding_space records them (each resolved as '
    'kb.set_language resolves it); NULL stays NULL (every language).';

create or replace function kb.set_embedding_space(
    model_name text,
    vector_dimension integer,
    layout text default null,
    model_languages text[] default null
)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    existing kb.embedding_space;
    chosen text := coalesce(set_embedding_space.layout,
                            kb.default_vector_layout(set_embedding_space.vector_dimension));
begin
    if model_name is null or model_name = '' then
        raise exception 'embedding model name must not be empty' using errcode = '22023';
    end if;
    perform kb._check_vector_layout(chosen, vector_dimension);
    -- serialise first registrations: two ingests must not both alter the column
    lock table kb.embedding_space in exclusive mode;
    select * into existing from kb.embedding_space;
    if found then
        if existing.model = model_name and existing.dimension = vector_dimension then
            return;  -- the layout of an existing space changes only by kb.set_embedding_layout
        end if;
        raise exception 'embedding space mismatch: this knowledge base holds % vectors (%-d), not % (%-d)',
                existing.model, existing.dimension, model_name, vector_dimension
            using errcode = 'KB001',
                  hint = format('use the %s embedder, or run `kbpg reembed` to rebuild every vector with %s',
                                existing.model, model_name);
    end if;
    insert into kb_data.embedding_space (model, dimension, layout, languages)
    values (model_name, vector_dimension, chosen, kb._model_languages(model_languages));
    if kb._vector_index(kb._current_kb()) is null and kb._wants_vector_index() then
        perform kb._build_vector_index(kb._vector_index_name(kb._current_kb()), chosen, vector_dimension);
    end if;
end
$$;
comment on function kb.set_embedding_space(text, integer, text, text[]) is
    'Record the embedding model and dimension on first ingest (typing kb.chunks.embedding and '
    'creating its HNSW index in the given layout, default kb.default_vector_layout) and the '
    'languages the model knows (NULL: every language; kb.model_defaults); refuse '
    'another model with SQLSTATE KB001.';

create or replace function kb.reset_embedding_space(
    model_name text,
    vector_dimension integer,
    layout text default null,
    model_languages text[] default null
)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    chosen text;
begin
    if model_name is null or model_name = '' or vector_dimension is null
       or vector_dimension < 1 or vector_dimension > 16000 then
        raise exception 'invalid embedding space (%, %)', model_name, vector_dimension
            using errcode = '22023';
    end if;
    chosen := coalesce(reset_embedding_space.layout, kb.default_vector_layout(vector_dimension));
    perform kb._check_vector_layout(chosen, vector_dimension);
    lock table kb.embedding_space in exclusive mode;
    perform kb._drop_vector_index();
    update kb_data.chunks set embedding = null where embedding is not null
                                                 and kb_id = (select kb._current_kb());
    delete from kb_data.embedding_space where kb_id = (select kb._current_kb());
    insert into kb_data.embedding_space (model, dimension, layout, languages)
    values (model_name, vector_dimension, chosen, kb._model_languages(model_languages));
    -- no index yet: one built now would hold the old vectors' row versions, which this
    -- transaction still sees (an index on another dimension fails on them); the caller builds
    -- it in bulk once the new vectors are committed
end
$$;
comment on function kb.reset_embedding_space(text, integer, text, text[]) is
    'Switch the knowledge base to another embedding model: drops every vector and the HNSW '
    'index, records the new space (layout and languages as in kb.set_embedding_space); the '
    'caller re-embeds and, once that is committed, builds the index (kbpg reembed does both; '
    'in psql: select kb.set_embedding_layout(layout)).';

create or replace function kb._check_query_embedding(query_embedding @extschema:vector@.vector)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    space_dimension integer;
begin
    if query_embedding is null then
        return;
    end if;
    select dimension into space_dimension from kb.embedding_space;
    if space_dimension is null then
        raise exception 'embedding space not set: no vectors have been ingested yet'
            using errcode = 'KB002', hint = 'ingest documents first, or pass a NULL embedding';
    end if;
    if @extschema:vector@.vector_dims(query_embedding) <> space_dimension then
        raise exception 'embedding space mismatch: query vector has % dimensions, the knowledge base holds %-d vectors',
                @extschema:vector@.vector_dims(query_embedding), space_dimension
            using errcode = 'KB001',
                  hint = 'embed the query with the model recorded in kb.embedding_space';
    end if;
end
$$;
comment on function kb._check_query_embedding(@extschema:vector@.vector) is
    'Raise SQLSTATE KB002 when no embedding space is set, KB001 when the query vector''s '
    'dimension differs from it.';
