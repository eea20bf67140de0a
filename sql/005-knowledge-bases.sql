-- kbpg: knowledge bases (issue 39). The tables (schema kb_data) hold every knowledge base's
-- rows; the views of schema kb show the current one's, kb._current_kb() (revision 0028).

create or replace function kb._current_kb()
returns integer
language sql
stable
parallel safe
security invoker
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
set search_path = pg_catalog, pg_temp
return exists (select 1 from kb_data.knowledge_bases k where k.id operator(pg_catalog.<>) 1);
comment on function kb._chunks_shared() is
    'Whether kb_data.chunks holds (or may hold) another knowledge base''s rows than default''s: '
    'its statements then name their knowledge base, and each knowledge base''s HNSW index is '
    'partial. Internal.';

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
    if exists (select 1 from kb_data.knowledge_bases k where k.name operator(pg_catalog.=) kb_name) then
        raise exception 'knowledge base "%" exists already', kb_name
            using errcode = '42710', hint = 'pick another name';
    end if;
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
