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
set search_path = pg_catalog, pg_temp
-- a role set and since dropped: oid 0, no role (pg_has_role then answers NULL: no grants)
return case when pg_catalog.current_setting('role') = 'none'
            then (select r.oid from pg_catalog.pg_roles r where r.rolname = session_user)
            else coalesce(pg_catalog.to_regrole(pg_catalog.quote_ident(pg_catalog.current_setting('role')))::oid,
                          0::oid) end;
comment on function kb._access_caller() is
    'The role the calling session acts as (SET ROLE''s, else the login role), also inside a '
    'SECURITY DEFINER function, where current_user is the function''s owner.';

create or replace function kb._access_reads_all_as(caller oid)
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
    -- the writer role by its OID: a role dropped and re-created under its name is not it
    or coalesce((select pg_catalog.pg_has_role(caller, r.oid, 'USAGE')
                   from kb.access_settings s join pg_catalog.pg_roles r on r.oid = s.writer_oid), false) $$;
comment on function kb._access_reads_all_as(oid) is
    'True when the role reads every group: a superuser, a role with BYPASSRLS, the kb tables'' '
    'owner or a role that may use it, or a role that may use the writer role.';

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

create or replace function kb._access_visibility()
returns text[]
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
return case when not (select c.relrowsecurity from pg_catalog.pg_class c
                       where c.oid = pg_catalog.to_regclass('kb_data.chunks'))
                 or kb._access_reads_all_as(kb._access_caller())
            then null
            else kb._access_groups_of(kb._access_caller()) end;
comment on function kb._access_visibility() is
    'What the caller may read: NULL for every chunk (access control off, or a caller that '
    'reads all), else its groups: it reads chunks without groups and chunks sharing one of '
    'them. Every function a reader calls passes this to the arms.';

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
