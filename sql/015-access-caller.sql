-- kbpg: who is calling, and which chunks that caller may read (access control, sql/080).
--
-- Readers have no privilege on kb's tables: they read only through the functions granted to
-- the reader role (kb.search and its arms, kb.list_documents, kb.get_document, kb.get_chunk,
-- kb.stats, kb.list_grants, kb.access_status, ...), which run with their owner's rights
-- (SECURITY DEFINER, so no row-level security and every index usable) and apply the caller's
-- grants themselves through kb._access_visibility(). Row-level security alone is no boundary
-- against a reader with SQL: leakproof operators (text equality, starts_with) run before the
-- policy, and EXPLAIN ANALYZE's "Rows Removed by Filter" then counts the hidden rows.
--
-- The caller is the role the session acts as: the role of SET ROLE (what kbpg's sessions do
-- per transaction for a principal or an HTTP token), else the login role. Inside a SECURITY
-- DEFINER function current_user is the owner, but the `role` setting and session_user are the
-- caller's: PostgreSQL lets a session SET ROLE only to roles its login role is a member of
-- (and refuses it inside a SECURITY DEFINER function), so a caller can act only as a role it
-- could use anyway.

create or replace function kb._access_caller()
returns oid
language sql
stable
security invoker
-- no SET clause, as kb._access_enforced
-- a role set and since dropped: oid 0, no role (pg_has_role then answers NULL: no grants)
return case when pg_catalog.current_setting('role') operator(pg_catalog.=) 'none'
            then (select r.oid from pg_catalog.pg_roles r where r.rolname operator(pg_catalog.=) session_user)
            else coalesce(pg_catalog.to_regrole(pg_catalog.quote_ident(pg_catalog.current_setting('role')))::oid,
                          0::oid) end;
comment on function kb._access_caller() is
    'The role the calling session acts as (SET ROLE''s, else the login role), also inside a '
    'SECURITY DEFINER function, where current_user is the function''s owner.';

create or replace function kb._access_enforced()
returns boolean
language sql
stable
security invoker
-- no SET clause (every search asks: a SET clause would save and restore the setting around
-- each call); a SQL-standard body, bound when created
return (select c.relrowsecurity from pg_catalog.pg_class c
         where c.oid operator(pg_catalog.=) 'kb_data.chunks'::pg_catalog.regclass);
comment on function kb._access_enforced() is
    'True while row-level security is on for kb.chunks (kb.access_enable()).';

create or replace function kb._access_reads_all_in(knowledge_base integer, caller oid)
returns boolean
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a string body: Citus runs a statement on its tables from the statement's text, which a
-- SQL-standard body does not have ("syntax error at or near RETURN"; docs/scaling.md section 5)
as $$ select coalesce((select r.rolsuper or r.rolbypassrls from pg_catalog.pg_roles r where r.oid = caller), false)
    -- the tables' owner, and every role that may use it (as for row-level security)
    or coalesce(pg_catalog.pg_has_role(caller, (select c.relowner from pg_catalog.pg_class c
                                                 where c.oid = pg_catalog.to_regclass('kb_data.chunks')),
                                       'USAGE'), false)
    -- the knowledge base's writer role by its OID: a role dropped and re-created under its
    -- name is not it
    or coalesce((select pg_catalog.pg_has_role(caller, r.oid, 'USAGE')
                   from kb_data.access_settings s join pg_catalog.pg_roles r on r.oid = s.writer_oid
                  where s.kb_id = knowledge_base), false) $$;
comment on function kb._access_reads_all_in(integer, oid) is
    'True when the role reads every group of the knowledge base with this id: a superuser, a '
    'role with BYPASSRLS, the kb tables'' owner or a role that may use it, or a role that may '
    'use the knowledge base''s writer role.';

create or replace function kb._access_reads_all_as(caller oid)
returns boolean
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select kb._access_reads_all_in(kb._current_kb(), caller) $$;
comment on function kb._access_reads_all_as(oid) is
    'True when the role reads every group of the current knowledge base '
    '(kb._access_reads_all_in).';

create or replace function kb._access_groups_of(caller oid)
returns text[]
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a string body: Citus runs a statement on its tables from the statement's text, which a
-- SQL-standard body does not have ("syntax error at or near RETURN"; docs/scaling.md section 5)
as $$ select (select coalesce(pg_catalog.array_agg(distinct g.group_name order by g.group_name), '{}')
          from kb.access_grants g
         -- by OID (revision 0021): a dropped role's grants name no role, pg_has_role is NULL
         where coalesce(pg_catalog.pg_has_role(caller, g.role_id, 'USAGE'), false)) $$;
comment on function kb._access_groups_of(oid) is
    'The groups granted to the role or to any role it may use (pg_has_role ''USAGE'').';

create or replace function kb._access_admits(knowledge_base integer, caller oid)
returns boolean
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select coalesce((
    select k.readers = 'all'
        -- access control off: every role reads everything (as kb._access_visibility says)
        or not kb._access_enforced()
        or kb._access_reads_all_in(k.id, caller)
        -- a grant in it, to the role or to a role it may use (by OID, as kb._access_groups_of)
        or exists (select 1 from kb_data.access_grants g
                    where g.kb_id = k.id
                      and coalesce(pg_catalog.pg_has_role(caller, g.role_id, 'USAGE'), false))
      from kb_data.knowledge_bases k where k.id = knowledge_base), false) $$;
comment on function kb._access_admits(integer, oid) is
    'Whether the role may read the knowledge base with this id at all: it exists, and access '
    'control is off, or every reader reads it (readers ''all'': default''s way), or the role '
    'reads all of it, or it holds a group grant in it (directly or through a role it may use). '
    'False for a knowledge base that does not exist: a hidden one looks the same.';

create or replace function kb._access_visibility()
returns text[]
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    current_kb constant integer := kb._current_kb();
    caller oid;
begin
    -- the current knowledge base comes from a setting anyone may SET (kbpg.kb_id): every
    -- function a reader calls starts here, so one it may not read is refused, and told apart
    -- from none. With access control off everyone reads every knowledge base there is: the
    -- caller is not looked up (every search pays this function)
    if kb._access_enforced() then
        caller := kb._access_caller();
        if kb._access_admits(current_kb, caller) then
            if kb._access_reads_all_in(current_kb, caller) then
                return null;
            end if;
            return kb._access_groups_of(caller);
        end if;
    elsif exists (select 1 from kb_data.knowledge_bases k where k.id = current_kb) then
        return null;
    end if;
    raise exception 'no knowledge base with id %', current_kb
        using errcode = 'KB011',
              hint = 'kb.knowledge_base_id(name) gives the id of a knowledge base this role may read';
end
$$;
comment on function kb._access_visibility() is
    'What the caller may read of the current knowledge base: NULL for every chunk (access '
    'control off, or a caller that reads all), else its groups: it reads chunks without groups '
    'and chunks sharing one of them. SQLSTATE KB011 when the caller may not read the knowledge '
    'base at all (kb._access_admits), or it does not exist. Every function a reader calls '
    'passes this to the arms.';

create or replace function kb._tuning(setting_name text, low bigint, high bigint)
returns bigint
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    value constant text := nullif(pg_catalog.current_setting(setting_name, true), '');
begin
    if value is null then
        return null;
    end if;
    -- the owner's tests and benchmarks may force any path; a reader (who may SET any kb.*
    -- setting in psql) stays within the documented cost bound
    if kb._access_reads_all_as(kb._access_caller()) then
        return value::bigint;
    end if;
    return least(greatest(value::numeric, low), high)::bigint;
end
$$;
comment on function kb._tuning(text, bigint, bigint) is
    'A kb.* tuning setting (kb.vector_exact_limit, ...) as a number, NULL when unset: as set for '
    'a caller that reads everything (the owner, a writer), else kept between low and high, so '
    'a reader cannot SET its way past the query cost bound.';
