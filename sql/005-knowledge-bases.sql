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
