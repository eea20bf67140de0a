-- kbpg: knowledge bases (issue 39). The tables (schema kb_data) hold every knowledge base's
-- rows; the views of schema kb show the current one's, kb._current_kb() (revision 0028).

create or replace function kb._current_kb()
returns integer
language sql
stable
parallel safe
security invoker
-- a SET clause keeps it from being inlined, on purpose: inlined, the COALESCE of a non-immutable
-- function lands in statements on Citus's distributed tables, which refuse it ("non-IMMUTABLE
-- functions are not allowed in CASE or COALESCE statements"), where the call is evaluated once
set search_path = pg_catalog, pg_temp
return coalesce(nullif(pg_catalog.current_setting('kbpg.kb_id', true), ''), '1')::integer;
comment on function kb._current_kb() is
    'The current knowledge base''s id (the setting kbpg.kb_id; 1, default, when unset): the one '
    'the views of schema kb show. Internal.';

create or replace function kb._chunks_shared()
returns boolean
language sql
stable
parallel safe
security invoker
-- no SET clause: every search asks (through kb._chunks_relation), and a SQL-standard body
-- is bound when created
-- or did: default's index stays limited to its rows once another knowledge base was made
return exists (select 1 from kb_data.knowledge_bases k where k.id operator(pg_catalog.<>) 1)
    or exists (select 1 from pg_catalog.pg_index i
                where i.indexrelid operator(pg_catalog.=) pg_catalog.to_regclass('kb_data.chunks_embedding_hnsw')
                  and i.indpred is not null);
comment on function kb._chunks_shared() is
    'Whether kb_data.chunks holds (or may hold) another knowledge base''s rows than default''s, '
    'or did (default''s HNSW index is limited to its rows): statements then name their '
    'knowledge base, and each knowledge base''s HNSW index is partial. Internal.';

create or replace function kb._chunks_relation()
returns text
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- the table alone while it holds one knowledge base: kb_id is its last column, and reading it
-- deforms every row to its end (0.3-0.6 ms over a 1% group's 2,000 rows at 200k chunks)
return case when kb._chunks_shared()
            then '(select * from kb_data.chunks where kb_id operator(pg_catalog.=) '
                 || kb._current_kb()::text || ')'
            else 'kb_data.chunks' end;
comment on function kb._chunks_relation() is
    'The current knowledge base''s chunks as text for a statement kbpg EXECUTEs: the table with '
    'the knowledge base as a literal, which the planner pulls up (one plan, a partial index per '
    'knowledge base usable), not the view kb.chunks, whose expansion every such plan would pay. '
    'Internal.';

create or replace function kb._create_knowledge_base(kb_name text)
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    made integer;
begin
    perform kb._check_knowledge_base_name(kb_name);
    insert into kb_data.knowledge_bases (name) values (kb_name) returning id into made;
    -- before the new knowledge base stores a vector: default's index, whole while default was
    -- alone, would take the new rows into its graph (or fail them: another dimension)
    perform kb._share_default_vector_index();
    -- its singletons: empty statistics and impact cache state; the language and the access
    -- roles are the database's (default's) until they are set per knowledge base
    insert into kb_data.corpus_stats (kb_id) values (made);
    insert into kb_data.lexical_state (kb_id) values (made);
    insert into kb_data.language (kb_id, name)
    select made, l.name from kb_data.language l where l.kb_id operator(pg_catalog.=) 1;
    insert into kb_data.access_settings (kb_id, reader_role, writer_role, reader_oid, writer_oid)
    select made, a.reader_role, a.writer_role, a.reader_oid, a.writer_oid
      from kb_data.access_settings a where a.kb_id operator(pg_catalog.=) 1;
    return made;
end
$$;
comment on function kb._create_knowledge_base(text) is
    'A new, empty knowledge base (its statistics, impact cache state, the database''s language '
    'and access roles); its id. Internal until each knowledge base has its own vector index, '
    'language and grants (issue 39): tests and benchmarks select it with kbpg.kb_id.';

create or replace function kb.knowledge_base_id(kb_name text)
returns integer
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    found_id integer;
begin
    select k.id into found_id from kb_data.knowledge_bases k where k.name = kb_name;
    -- one the caller may not read is one it does not know of (readers may call this)
    if found_id is null or not kb._access_admits(found_id, kb._access_caller()) then
        raise exception 'no knowledge base "%"', coalesce(kb_name, 'NULL')
            using errcode = 'KB011',
                  hint = 'kbpg kb list (select * from kb.knowledge_bases()) names them; kbpg kb create makes one';
    end if;
    return found_id;
end
$$;
comment on function kb.knowledge_base_id(text) is
    'The id of the knowledge base of this name (SQLSTATE KB011 when there is none, or the '
    'caller may not read it): '
    'select set_config(''kbpg.kb_id'', kb.knowledge_base_id(''hr'')::text, true) makes it the '
    'current one for the transaction, as kbpg''s own connections do.';

create or replace function kb.use_knowledge_base(kb_name text, for_transaction boolean default false)
returns integer
language plpgsql
volatile
-- a reader's way in (readers call it): kb.knowledge_base_id decides what the caller may name
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    chosen constant integer := kb.knowledge_base_id(kb_name);
begin
    perform pg_catalog.set_config('kbpg.kb_id', chosen::text, for_transaction);
    return chosen;
end
$$;
comment on function kb.use_knowledge_base(text, boolean) is
    'Make the knowledge base of this name the current one of the session (for_transaction: of '
    'the transaction), for every kb function and view: select kb.use_knowledge_base(''ru''). '
    'Its id; SQLSTATE KB011 when there is none, or the caller may not read it.';

create or replace function kb._check_knowledge_base_name(kb_name text)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if kb_name is null or kb_name !~ '^[a-z0-9][a-z0-9_.-]{0,62}$' then
        raise exception 'invalid knowledge base name "%"', coalesce(kb_name, 'NULL')
            using errcode = '22023',
                  hint = 'lower-case letters, digits, ".", "_" and "-", starting with a letter or a digit, at most 63';
    end if;
    if exists (select 1 from kb_data.knowledge_bases k where k.name operator(pg_catalog.=) kb_name) then
        raise exception 'knowledge base "%" exists already', kb_name
            using errcode = '42710', hint = 'pick another name';
    end if;
end
$$;
comment on function kb._check_knowledge_base_name(text) is
    'Raise 22023 unless the name is one kb_data.knowledge_bases accepts, 42710 when a knowledge '
    'base has it already: a name for a new one, or a renamed one. Internal.';

create or replace function kb.create_knowledge_base(
    kb_name text,
    language text default null,
    model_name text default null,
    vector_dimension integer default null
)
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    made integer;
    caller_kb constant text := pg_catalog.current_setting('kbpg.kb_id', true);
begin
    if (model_name is null) <> (vector_dimension is null) then
        raise exception 'give the model and its dimension together, or neither'
            using errcode = '22023', hint = 'without them the first ingest records its model';
    end if;
    made := kb._create_knowledge_base(kb_name);
    -- the new knowledge base is the current one until this function returns
    perform pg_catalog.set_config('kbpg.kb_id', made::text, true);
    if create_knowledge_base.language is not null then
        update kb_data.language set name = kb._resolve_language(create_knowledge_base.language)
         where kb_id = made;
    end if;
    if model_name is not null then
        perform kb.set_embedding_space(model_name, vector_dimension);
    end if;
    perform pg_catalog.set_config('kbpg.kb_id', coalesce(caller_kb, ''), true);
    return made;
end
$$;
comment on function kb.create_knowledge_base(text, text, text, integer) is
    'A new, empty knowledge base: its name, its language (default: default''s), optionally its '
    'embedding model and dimension (default: recorded by its first ingest); its id. The first '
    'one beside default limits default''s HNSW index to default''s rows (built again: minutes at '
    'a million chunks; kbpg kb create builds it concurrently first).';

create or replace function kb._knowledge_base_row(knowledge_base integer)
returns table (name text, language text, model text, dimension integer, documents bigint,
               chunks bigint, readers text, created_at timestamptz)
language plpgsql
volatile  -- (reads only; it selects the knowledge base for its statement)
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    caller_kb constant text := pg_catalog.current_setting('kbpg.kb_id', true);
    visible text[];
begin
    if not kb._access_admits(knowledge_base, kb._access_caller()) then
        return;  -- one the caller may not read is not listed (nor one that does not exist)
    end if;
    -- through the views, as a search in it reads them: the same on a distributed database,
    -- whose statistics are views over the shards' (kbpg db distribute)
    perform pg_catalog.set_config('kbpg.kb_id', knowledge_base::text, true);
    visible := kb._access_visibility();
    -- the documents the caller may read, as kb.stats counts them; the chunks are the BM25
    -- statistics' count, which kb.stats shows every reader too
    return query
    select k.name, (select l.name from kb.language l), e.model, e.dimension,
           (select pg_catalog.count(*) from kb.documents d where kb._visible_to(d.groups, visible)),
           coalesce((select s.chunk_count from kb.corpus_stats s), 0), k.readers, k.created_at
      from kb_data.knowledge_bases k left join kb.embedding_space e on true
     where k.id = knowledge_base;
    perform pg_catalog.set_config('kbpg.kb_id', coalesce(caller_kb, ''), true);
end
$$;
comment on function kb._knowledge_base_row(integer) is
    'One row of kb.knowledge_bases(), of the knowledge base with this id; no row when the '
    'caller may not read it. Internal.';

create or replace function kb.knowledge_bases()
returns table (name text, language text, model text, dimension integer, documents bigint,
               chunks bigint, readers text, created_at timestamptz)
language sql
volatile  -- (reads only; kb._knowledge_base_row selects each knowledge base in turn)
-- a reader's way in: the owner's rights, the knowledge bases the caller may read (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
    select r.* from kb_data.knowledge_bases b
     cross join lateral kb._knowledge_base_row(b.id) r
     order by b.id
$$;
comment on function kb.knowledge_bases() is
    'The knowledge bases of this database the caller may read, default first: name, language, '
    'embedding model and dimension (NULL before the first vector), the documents the caller may '
    'read, chunks, which readers may read it (all, or granted: those with a group grant in it; '
    'kb.set_knowledge_base_readers), when created.';

create or replace function kb.set_knowledge_base_readers(kb_name text, readers text)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    changed constant integer := kb.knowledge_base_id(kb_name);
begin
    if readers is null or readers not in ('all', 'granted') then
        raise exception 'readers must be all or granted, not "%"', coalesce(readers, 'NULL')
            using errcode = '22023',
                  hint = 'all: every reader role reads its chunks without groups; granted: only roles with a group grant in it';
    end if;
    update kb_data.knowledge_bases k set readers = set_knowledge_base_readers.readers
     where k.id = changed;
end
$$;
comment on function kb.set_knowledge_base_readers(text, text) is
    'Which reader roles may read a knowledge base once access control is enforced: ''all'' '
    '(each reads its chunks without groups and those of its groups; default''s way, as before '
    'knowledge bases) or ''granted'' (only roles with a group grant in it, kb.grant_groups; '
    'every other role is told it does not exist). New knowledge bases start ''granted''.';

create or replace function kb.rename_knowledge_base(kb_name text, new_name text)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    renamed constant integer := kb.knowledge_base_id(kb_name);
begin
    perform kb._check_knowledge_base_name(new_name);
    if renamed = 1 then
        raise exception 'the knowledge base default keeps its name'
            using errcode = '55000',
                  hint = 'every connection without a knowledge base named (no --kb, no KBPG_KB) uses it by that name';
    end if;
    update kb_data.knowledge_bases set name = new_name where id = renamed;
end
$$;
comment on function kb.rename_knowledge_base(text, text) is
    'Give a knowledge base another name (not default: it keeps its own).';

create or replace function kb.drop_knowledge_base(kb_name text)
returns table (documents bigint, chunks bigint)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    dropped constant integer := kb.knowledge_base_id(kb_name);
    caller_kb constant text := pg_catalog.current_setting('kbpg.kb_id', true);
    counted record;
    t record;
begin
    if dropped = 1 then
        raise exception 'the knowledge base default cannot be dropped'
            using errcode = '55000', hint = 'kbpg documents delete --all empties it';
    end if;
    -- kbpg's writers (ingest, sync, delete) hold this lock for their whole job
    -- (kbpg.ingest.writer.WRITE_LOCK_KEY, "kbpg")
    perform pg_catalog.pg_advisory_xact_lock(1801613415);
    if exists (select 1 from kb_data.table_sources s where s.kb_id = dropped) then
        raise exception 'the knowledge base "%" has table sources', kb_name
            using errcode = '55000',
                  hint = format('remove them first (kbpg sources remove NAME --kb %s): their capture triggers write into it', kb_name);
    end if;
    perform pg_catalog.set_config('kbpg.kb_id', dropped::text, true);
    select (select count(*) from kb.documents) as documents, s.chunk_count as chunks
      into counted from kb.corpus_stats s;
    perform kb._drop_vector_index();
    -- every row by an index: the big tables that lead no index with kb_id are reached through
    -- their parents' keys (filter caches, chunks) or go with the documents (foreign keys:
    -- chunks, edges, links, entities); then every other table by its kb_id-first key
    delete from kb_data.lexical_filter_blocks b using kb_data.lexical_filter_caches f
     where b.cache_id = f.cache_id and f.kb_id = (select kb._current_kb())
       and b.kb_id = (select kb._current_kb());
    delete from kb_data.lexical_filter_slots b using kb_data.lexical_filter_caches f
     where b.cache_id = f.cache_id and f.kb_id = (select kb._current_kb())
       and b.kb_id = (select kb._current_kb());
    delete from kb_data.lexical_pending p using kb_data.chunks c
     where p.chunk_id = c.id and c.kb_id = (select kb._current_kb())
       and p.kb_id = (select kb._current_kb());
    delete from kb_data.documents where kb_id = (select kb._current_kb());
    for t in select c.relname
               from pg_catalog.pg_class c
               join pg_catalog.pg_attribute a on a.attrelid = c.oid and a.attname = 'kb_id'
              where c.relnamespace = 'kb_data'::pg_catalog.regnamespace and c.relkind in ('r', 'p')
                and c.relname not in ('knowledge_bases', 'documents', 'lexical_filter_blocks',
                                      'lexical_filter_slots', 'lexical_pending')
                and not exists (select 1 from pg_catalog.pg_constraint f
                                 where f.conrelid = c.oid and f.contype = 'f' and f.confdeltype = 'c')
              order by c.relname
    loop
        execute format('delete from kb_data.%I where kb_id = (select kb._current_kb())', t.relname);
    end loop;
    delete from kb_data.knowledge_bases where id = dropped;
    perform pg_catalog.set_config('kbpg.kb_id', coalesce(caller_kb, ''), true);
    return query select counted.documents, coalesce(counted.chunks, 0);
end
$$;
comment on function kb.drop_knowledge_base(text) is
    'Delete a knowledge base: its documents, chunks, edges, statistics, caches, grants, vector '
    'index and name (not default; not while it has table sources); waits for kbpg''s writers. '
    'What it held.';
