-- kbpg: the embedding space — which model's vectors kb.chunks holds.
-- The HNSW index is created here, not in a migration: its dimension is the model's.

create or replace function kb.set_embedding_space(model_name text, vector_dimension integer)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    existing kb.embedding_space;
begin
    if model_name is null or model_name = '' then
        raise exception 'embedding model name must not be empty' using errcode = '22023';
    end if;
    if vector_dimension is null or vector_dimension < 1 or vector_dimension > 2000 then
        raise exception 'embedding dimension % is out of range', vector_dimension
            using errcode = '22023', hint = 'HNSW indexes vectors of 1 to 2000 dimensions';
    end if;
    -- serialise first registrations: two ingests must not both alter the column
    lock table kb.embedding_space in exclusive mode;
    select * into existing from kb.embedding_space;
    if found then
        if existing.model = model_name and existing.dimension = vector_dimension then
            return;
        end if;
        raise exception 'embedding space mismatch: this knowledge base holds % vectors (%-d), not % (%-d)',
                existing.model, existing.dimension, model_name, vector_dimension
            using errcode = 'KB001',
                  hint = format('use the %s embedder, or run `kbpg reembed` to rebuild every vector with %s',
                                existing.model, model_name);
    end if;
    insert into kb.embedding_space (model, dimension) values (model_name, vector_dimension);
    execute format('alter table kb.chunks alter column embedding type @extschema:vector@.vector(%s)',
                   vector_dimension);
    execute 'create index if not exists chunks_embedding_hnsw on kb.chunks '
            'using hnsw (embedding @extschema:vector@.vector_cosine_ops) with (m = 16, ef_construction = 64)';
end
$$;
comment on function kb.set_embedding_space(text, integer) is
    'Record the embedding model and dimension on first ingest (typing kb.chunks.embedding and '
    'creating its HNSW index); refuse another model with SQLSTATE KB001.';

create or replace function kb.reset_embedding_space(model_name text, vector_dimension integer)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if model_name is null or model_name = '' or vector_dimension is null
       or vector_dimension < 1 or vector_dimension > 2000 then
        raise exception 'invalid embedding space (%, %)', model_name, vector_dimension
            using errcode = '22023';
    end if;
    lock table kb.embedding_space in exclusive mode;
    drop index if exists kb.chunks_embedding_hnsw;
    update kb.chunks set embedding = null where embedding is not null;
    delete from kb.embedding_space;
    execute 'alter table kb.chunks alter column embedding type @extschema:vector@.vector';
    perform kb.set_embedding_space(model_name, vector_dimension);
end
$$;
comment on function kb.reset_embedding_space(text, integer) is
    'Switch the knowledge base to another embedding model: drops every vector and the HNSW '
    'index, records the new space; the caller re-embeds (kbpg reembed).';

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
