-- kbpg: what a reader may read besides searching — the documents, one document's chunks, one
-- chunk, the embedding space, counts. Readers have no privilege on kb's tables (sql/015): these
-- functions run with their owner's rights and show only what the caller may read, so a hidden
-- document, chunk or group looks exactly like one that does not exist.
--   SELECT * FROM kb.list_documents();              -- or (group_name => 'hr')
--   SELECT * FROM kb.get_document('/docs/handbook.md');
--   SELECT * FROM kb.get_chunk(42);
--   SELECT * FROM kb.stats();

create or replace function kb._visible_to(chunk_groups text[], visible_groups text[])
returns boolean
language sql
immutable
parallel safe
security invoker
-- no SET clause, so that it is inlined per row (see kb._chunk_filter_sql)
return visible_groups is null or chunk_groups = '{}' or chunk_groups && visible_groups;
comment on function kb._visible_to(text[], text[]) is
    'Whether a row with these groups is readable under kb._access_visibility()''s answer '
    '(NULL: everything; else rows without groups and rows sharing a group).';

create or replace function kb.list_documents(group_name text default null)
returns table (
    source text,
    title text,
    category text,
    groups text[],
    labels text[],
    chunks bigint,
    updated_at timestamptz
)
language plpgsql
stable
-- a reader's way in: the owner's rights, the caller's grants (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    visible constant text[] := kb._access_visibility();
begin
    return query
    select d.source, d.title, d.category, d.groups, d.labels,
           (select pg_catalog.count(*) from kb.chunks c
             where c.document_id = d.id and kb._visible_to(c.groups, visible)),
           d.updated_at
      from kb.documents d
     where (list_documents.group_name is null or list_documents.group_name = any (d.groups)
            -- 'public' names the documents without groups too, as the search filter does
            or (list_documents.group_name = 'public' and d.groups = '{}'))
       and kb._visible_to(d.groups, visible)
     order by d.source;
end
$$;
comment on function kb.list_documents(text) is
    'The documents the caller may read (of one group when group_name is given; ''public'' also '
    'lists those without groups), by source, with '
    'their chunk counts.';

create or replace function kb.get_document(variadic sources text[])
returns table (
    source text,
    title text,
    category text,
    groups text[],
    labels text[],
    chunk_id bigint,
    ordinal integer,
    section text,
    content text
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    visible constant text[] := kb._access_visibility();
    doc_id bigint;
begin
    -- the first of the given sources that names a document the caller may read
    select d.id into doc_id
      from pg_catalog.unnest(get_document.sources) with ordinality as s(source, n)
      join kb.documents d on d.source = s.source
     where kb._visible_to(d.groups, visible)
     order by s.n
     limit 1;
    return query
    select d.source, d.title, d.category, d.groups, d.labels, c.id, c.ordinal, c.section, c.content
      from kb.documents d
      join kb.chunks c on c.document_id = d.id
     where d.id = doc_id and kb._visible_to(c.groups, visible)
     order by c.ordinal;
end
$$;
comment on function kb.get_document(text[]) is
    'One document''s chunks in reading order: the first of the given sources (e.g. a path as '
    'typed and its absolute form) that names a document the caller may read; no rows otherwise.';

create or replace function kb.get_chunk(chunk bigint)
returns table (
    chunk_id bigint,
    document_id bigint,
    source text,
    title text,
    ordinal integer,
    section text,
    content text,
    category text,
    groups text[],
    labels text[]
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    visible constant text[] := kb._access_visibility();
begin
    return query
    select c.id, c.document_id, d.source, d.title, c.ordinal, c.section, c.content, c.category,
           c.groups, c.labels
      from kb.chunks c
      join kb.documents d on d.id = c.document_id
     where c.id = get_chunk.chunk and kb._visible_to(c.groups, visible);
end
$$;
comment on function kb.get_chunk(bigint) is
    'One chunk with its document''s source and title, when the caller may read it (else no row).';

create or replace function kb.get_embedding_space()
returns table (model text, dimension integer, layout text, indexed boolean)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
begin
    -- (a knowledge base the caller may not read: KB011)
    perform kb._access_visibility();
    return query
    select e.model, e.dimension, e.layout,
           kb._vector_index(kb._current_kb()) is not null
      from kb.embedding_space e;
end
$$;
comment on function kb.get_embedding_space() is
    'The model and dimension of the knowledge base''s vectors, the vector index''s layout and '
    'whether it exists; no row before the first vector is stored.';

create or replace function kb.stats()
returns table (
    documents bigint,
    chunks bigint,
    chunks_without_embedding bigint,
    edges jsonb,
    model text,
    dimension integer,
    layout text,
    indexed boolean,
    bm25_chunks bigint,
    bm25_tokens bigint,
    bm25_lexemes bigint,
    language text
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    visible constant text[] := kb._access_visibility();
begin
    -- documents, chunks and edges: those the caller may read (an edge: both its chunks);
    -- the BM25 statistics are global, and counts only (never the words)
    return query
    select (select pg_catalog.count(*) from kb.documents d where kb._visible_to(d.groups, visible)),
           (select pg_catalog.count(*) from kb.chunks c where kb._visible_to(c.groups, visible)),
           (select pg_catalog.count(*) from kb.chunks c
             where c.embedding is null and kb._visible_to(c.groups, visible)),
           (select coalesce(pg_catalog.jsonb_object_agg(x.relation, x.n), '{}')
              from (select e.relation, pg_catalog.count(*) as n
                      from kb.edges e
                     where visible is null
                        or (exists (select 1 from kb.chunks c where c.id = e.src_chunk_id
                                       and kb._visible_to(c.groups, visible))
                            and exists (select 1 from kb.chunks c where c.id = e.dst_chunk_id
                                           and kb._visible_to(c.groups, visible)))
                     group by e.relation) x),
           s.model, s.dimension, s.layout, s.indexed,
           (select t.chunk_count from kb.corpus_stats t),
           (select t.total_tokens from kb.corpus_stats t),
           (select pg_catalog.count(*) from kb.lexeme_stats),
           (select l.name from kb.language l)
      from (select 1) one
      left join kb.get_embedding_space() s on true;
end
$$;
comment on function kb.stats() is
    'Counts the caller may see: its readable documents, chunks (and those without an embedding) '
    'and edges by relation; the embedding space; the global BM25 statistics (chunk count, '
    'total length, number of distinct lexemes: never the lexemes themselves); the knowledge '
    'base''s language (kb.language).';
