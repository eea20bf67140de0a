-- kbpg: access control — which role reads which group's chunks.
--
-- A reader role has no privilege on kb's tables: it reads through the functions granted to it
-- (kb._access_reader_api()), which run with their owner's rights and apply the caller's grants
-- (sql/015: the caller is the role of SET ROLE, else the login role). Writers (and the owner)
-- keep table access, under row-level security policies that give them every row; the policies
-- also keep hidden rows from any other role a DBA grants SELECT by hand, but row-level
-- security alone is no boundary against SQL (EXPLAIN ANALYZE counts the rows a policy drops).
--
--   select kb.access_setup();                        -- NOLOGIN reader + writer roles, granted
--   grant kbpg_reader to alice;                      -- alice may search ...
--   select kb.grant_groups('alice', array['hr']);    -- ... and read group hr once enforced
--   select kb.access_enable();                       -- turn enforcement on (table owner)
--
-- Visibility, once enforced: a chunk or document with no groups is public; otherwise a role
-- sees it when it may use (pg_has_role 'USAGE') a role granted one of its groups, or the
-- writer role; the tables' owner and superusers see everything. An edge is visible when both
-- its chunks are. The BM25 impact cache keeps one row per visibility class while enforced, so
-- a reader's sums hold only what it may read. Corpus statistics (chunk count, average length,
-- document frequencies) stay global, as in every engine with document-level security: they
-- move scores by a few percent; readers see counts, never the words.

create or replace function kb._access_tables()
returns regclass[]
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a string body, here and below: a SQL-standard one would make the function depend on the
-- tables it names, which Citus cannot distribute then (migration 0015)
as $$
select array['kb_data.documents'::regclass, 'kb_data.chunks'::regclass, 'kb_data.edges'::regclass,
             'kb_data.lexical_blocks'::regclass]
$$;
comment on function kb._access_tables() is
    'The tables a reader can reach that hold per-chunk data: row-level security goes on and off '
    'on all of them together.';

create or replace function kb._access_reader_api()
returns regprocedure[]
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- by name: the signatures are the sql/ files' (a name absent here is no reader's to call)
return array(select p.oid::pg_catalog.regprocedure
               from pg_catalog.pg_proc p
              where p.pronamespace = 'kb'::pg_catalog.regnamespace
                and p.proname = any (array['search', 'search_vector', 'search_lexical',
                                           'expand_graph', 'fuse_rrf', 'fuse_convex', 'cap_per_document',
                                           'list_documents', 'get_document', 'get_chunk',
                                           'get_embedding_space', 'stats', 'list_grants',
                                           'access_status', 'model_defaults', 'highlight', 'facets',
                                           'knowledge_base_id', 'use_knowledge_base', 'knowledge_bases',
                                           'search_knowledge_bases'])
              order by 1);
comment on function kb._access_reader_api() is
    'The functions the reader role may execute: everything a reader reads goes through them.';

create or replace function kb._access_apply_grants()
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.access_settings;
    t text;
    f regprocedure;
    col record;
    version_table regclass;
    -- the recorded roles by OID, under their names of today (renamed: still them; dropped and
    -- re-created under the old name: not them, and granted nothing)
    reader_name text;
    writer_name text;
begin
    select * into s from kb.access_settings;
    select r.rolname into reader_name from pg_catalog.pg_roles r where r.oid = s.reader_oid;
    select r.rolname into writer_name from pg_catalog.pg_roles r where r.oid = s.writer_oid;
    -- SECURITY DEFINER functions run with the owner's rights: only the roles granted them below
    -- (and the owner) may call them, whoever else may reach schema kb
    for f in select p.oid::regprocedure from pg_catalog.pg_proc p
              where p.pronamespace = 'kb'::regnamespace and p.prosecdef loop
        execute format('revoke execute on function %s from public', f);
    end loop;
    if reader_name is not null then
        execute format('grant usage on schema kb to %I', reader_name);
        -- no table, column or sequence privilege at all (0.2's readers had SELECT under
        -- row-level security, which EXPLAIN ANALYZE saw through): only the reader API
        execute format('revoke all on all tables in schema kb from %I', reader_name);
        execute format('revoke all on all sequences in schema kb from %I', reader_name);
        -- (the views of schema kb read the tables of kb_data with the caller's rights)
        execute format('revoke all on all tables in schema kb_data from %I', reader_name);
        execute format('revoke all on all sequences in schema kb_data from %I', reader_name);
        for col in select a.attrelid::regclass as rel, a.attname
                     from pg_catalog.pg_attribute a
                     join pg_catalog.pg_class c on c.oid = a.attrelid
                    where c.relnamespace in ('kb'::regnamespace, 'kb_data'::regnamespace)
                      and a.attacl is not null loop
            execute format('revoke all (%I) on %s from %I', col.attname, col.rel, reader_name);
        end loop;
        execute format('revoke execute on all functions in schema kb from %I', reader_name);
        foreach f in array kb._access_reader_api() loop
            execute format('grant execute on function %s to %I', f, reader_name);
        end loop;
    end if;
    if kb._distributed() then
        -- Citus refuses policies with subqueries on distributed tables (0005's read the grants
        -- tables): there the writer role (and every role that may use it) gets a policy of its
        -- own with no subquery, and no other role reads a row while access control is
        -- enforced; readers read through the reader API, which applies their grants itself
        foreach t in array kb._access_tables()::text[] loop
            execute format('drop policy if exists access_writer on %s', t);
            if writer_name is not null then
                execute format('create policy access_writer on %s for all to %I using (true) with check (true)',
                               t, writer_name);
            end if;
        end loop;
    end if;
    if writer_name is not null then
        execute format('grant usage on schema kb to %I', writer_name);
        execute format('grant execute on all functions in schema kb to %I', writer_name);
        execute format('grant select, insert, update, delete on all tables in schema kb to %I',
                       writer_name);
        execute format('grant usage, select on all sequences in schema kb to %I', writer_name);
        -- the views are security_invoker: the writer's rights on the tables under them count
        execute format('grant select, insert, update, delete on all tables in schema kb_data to %I',
                       writer_name);
        execute format('grant usage, select on all sequences in schema kb_data to %I', writer_name);
        execute format('revoke insert, update, delete, truncate on kb_data.access_grants, '
                       'kb_data.access_settings, kb_data.language, kb_data.knowledge_bases from %I',
                       writer_name);
        -- a writer ingests; it does not decide who reads what, nor the language (only
        -- kb.set_language, the owner's, changes it: it re-analyses every chunk with it)
        execute format('revoke insert, update, delete, truncate on kb.access_grants, kb.access_settings, '
                       'kb.language from %I', writer_name);
        -- nor which table a source reads (issue 38: a writer who pointed a source at a temp table
        -- of its own ran its code as the owner): sources change through the SECURITY DEFINER
        -- helpers of sql/090, which check the caller and what they write
        if pg_catalog.to_regclass('kb_data.table_sources') is not null then
            execute format('revoke insert, update, delete, truncate on kb.table_sources, '
                           'kb_data.table_sources from %I', writer_name);
        end if;
    end if;
    -- kbpg checks the schema version before it searches or writes
    select c.oid::regclass into version_table
      from pg_catalog.pg_class c
     where c.relname = 'kbpg_alembic_version' and c.relkind = 'r'
       and pg_catalog.has_schema_privilege(c.relnamespace, 'USAGE')
     limit 1;
    if version_table is not null then
        foreach t in array array[reader_name, writer_name] loop
            if t is not null then
                execute format('grant select on %s to %I', version_table, t);
            end if;
        end loop;
    end if;
end
$$;
comment on function kb._access_apply_grants() is
    'Grant the recorded reader role the reader API (kb._access_reader_api(); no table at all) '
    'and the writer role what ingest writes; SECURITY DEFINER functions lose PUBLIC''s EXECUTE '
    '(re-run whenever the sql/ files are applied, so new tables and functions are covered).';

create or replace function kb.access_setup(
    reader_role text default null,
    writer_role text default null
)
returns table (reader text, writer text)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.access_settings;
    want_reader text;
    want_writer text;
    r text;
begin
    select * into s from kb.access_settings;
    -- role names are cluster-wide: knowledge bases on one server share kbpg_reader/kbpg_writer
    -- unless given names of their own (their grants and policies stay per database either way)
    -- the recorded roles under their names of today (a rename keeps them)
    want_reader := coalesce(access_setup.reader_role,
                            (select a.rolname from pg_catalog.pg_roles a where a.oid = s.reader_oid),
                            s.reader_role, 'kbpg_reader');
    want_writer := coalesce(access_setup.writer_role,
                            (select a.rolname from pg_catalog.pg_roles a where a.oid = s.writer_oid),
                            s.writer_role, 'kbpg_writer');
    if want_reader = want_writer then
        raise exception 'the reader and writer roles must differ (both %)', want_reader
            using errcode = '22023', hint = 'pass reader_role => ... and writer_role => ...';
    end if;
    foreach r in array array[want_reader, want_writer] loop
        if pg_catalog.to_regrole(pg_catalog.quote_ident(r)) is null then
            if not (select a.rolsuper or a.rolcreaterole from pg_catalog.pg_roles a
                     where a.rolname = current_user) then
                raise exception 'cannot create role "%": % lacks CREATEROLE', r, current_user
                    using errcode = '42501',
                          hint = format('a DBA runs: create role %I nologin; create role %I nologin; '
                                        'then select kb.access_setup(); as the schema owner',
                                        want_reader, want_writer);
            end if;
            execute format('create role %I nologin', r);
        end if;
    end loop;
    update kb_data.access_settings
       set reader_role = want_reader, writer_role = want_writer,
           reader_oid = pg_catalog.to_regrole(pg_catalog.quote_ident(want_reader)),
           writer_oid = pg_catalog.to_regrole(pg_catalog.quote_ident(want_writer)) where kb_id = (select kb._current_kb());
    perform kb._access_apply_grants();
    return query select want_reader, want_writer;
end
$$;
comment on function kb.access_setup(text, text) is
    'Create (when missing) and grant the NOLOGIN reader and writer roles (default kbpg_reader / '
    'kbpg_writer; role names are cluster-wide); grant a login role one of them to let it search or '
    'ingest. Needs CREATEROLE for missing roles; run by the schema owner.';

create or replace function kb._access_grants_prune()
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- no event trigger fires on DROP ROLE: a grant whose role is gone is deleted here, lazily
as $$
    with gone as (
        delete from kb_data.access_grants a
         where not exists (select 1 from pg_catalog.pg_roles r where r.oid = a.role_id)
           and a.kb_id = (select kb._current_kb())
        returning 1)
    select pg_catalog.count(*) from gone
$$;
comment on function kb._access_grants_prune() is
    'Delete the grants of dropped roles (grants hold the role''s OID, which no role has any more); '
    'returns how many. Called by kb.grant_groups, kb.revoke_groups, kb.list_grants and on apply.';

create or replace function kb.grant_groups(role_name text, groups text[])
returns table (role text, group_name text)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    -- the role's identity, not its name: a role re-created under the name starts with nothing
    granted constant oid := pg_catalog.to_regrole(pg_catalog.quote_ident(grant_groups.role_name));
begin
    if granted is null then
        raise exception 'role "%" does not exist', grant_groups.role_name
            using errcode = '42704', hint = 'create the role first: create role ... login';
    end if;
    if coalesce(cardinality(grant_groups.groups), 0) = 0
       or exists (select 1 from pg_catalog.unnest(grant_groups.groups) as g
                   where g is null or pg_catalog.btrim(g) = '') then
        raise exception 'groups must be a non-empty list of non-empty names'
            using errcode = '22023', hint = 'for example array[''hr'', ''finance'']';
    end if;
    perform kb._access_grants_prune();
    return query
    with added as (
        insert into kb_data.access_grants as a (role_id, group_name)
        select granted, g from pg_catalog.unnest(grant_groups.groups) as g
        on conflict do nothing
        returning a.role_id, a.group_name)
    select r.rolname::text, added.group_name
      from added join pg_catalog.pg_roles r on r.oid = added.role_id;
end
$$;
comment on function kb.grant_groups(text, text[]) is
    'Let a role (and every role that may use it) read the chunks of these groups; returns the '
    'grants that were new. The grant follows the role''s identity (its OID): a renamed role keeps '
    'it, a dropped one loses it. Takes effect on the next query.';

create or replace function kb.revoke_groups(role_name text, groups text[] default null)
returns table (role text, group_name text)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    perform kb._access_grants_prune();
    return query
    with gone as (
        delete from kb_data.access_grants a
         where a.role_id = pg_catalog.to_regrole(pg_catalog.quote_ident(revoke_groups.role_name))
           and (revoke_groups.groups is null or a.group_name = any (revoke_groups.groups))
           and a.kb_id = (select kb._current_kb())
        returning a.group_name)
    select revoke_groups.role_name, gone.group_name from gone;
end
$$;
comment on function kb.revoke_groups(text, text[]) is
    'Take groups (all of them when groups is NULL) away from a role; returns what was revoked. '
    'Takes effect on the next query.';

create or replace function kb.list_grants(role_name text default null)
returns table (role text, group_name text, granted_at timestamptz)
language plpgsql
volatile
-- a reader's way in: the owner's rights, the caller's grants (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    caller constant oid := kb._access_caller();
    -- the owner (and superusers) see every grant; anyone else those of the roles it may use
    sees_all constant boolean := coalesce(
        (select r.rolsuper from pg_catalog.pg_roles r where r.oid = caller), false)
        or coalesce(pg_catalog.pg_has_role(caller, (select c.relowner from pg_catalog.pg_class c
                                                     where c.oid = 'kb_data.access_grants'::pg_catalog.regclass),
                                           'USAGE'), false);
begin
    perform kb._access_visibility();  -- (a knowledge base the caller may not read: KB011)
    if not pg_catalog.current_setting('transaction_read_only')::boolean then
        perform kb._access_grants_prune();
    end if;
    -- the join drops the grants of dropped roles (also in a read-only transaction) and names
    -- each role as it is called now
    return query
    select r.rolname::text, a.group_name, a.granted_at
      from kb.access_grants a
      join pg_catalog.pg_roles r on r.oid = a.role_id
     where (list_grants.role_name is null or r.rolname = list_grants.role_name)
       and (sees_all or coalesce(pg_catalog.pg_has_role(caller, a.role_id, 'USAGE'), false))
     order by r.rolname, a.group_name;
end
$$;
comment on function kb.list_grants(text) is
    'The group grants of existing roles, by their current name (a reader sees its own and those '
    'of the roles it may use; the owner sees all), optionally for one role. Deletes the grants '
    'of dropped roles when the transaction may write.';

create or replace function kb.access_status()
returns table (
    enforced boolean,
    tables_enforced integer,
    tables_total integer,
    reader_role text,
    writer_role text,
    lexical_cache_split boolean,
    visible_groups text[],
    reads_all boolean
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
begin
    perform kb._access_visibility();  -- (a knowledge base the caller may not read: KB011)
    return query
    select kb._access_enforced(),
           (select pg_catalog.count(*) filter (where c.relrowsecurity)::integer
              from pg_catalog.pg_class c where c.oid = any (kb._access_tables())),
           pg_catalog.cardinality(kb._access_tables()),
           (select r.rolname::text from pg_catalog.pg_roles r where r.oid = s.reader_oid),
           (select r.rolname::text from pg_catalog.pg_roles r where r.oid = s.writer_oid),
           (select l.split_by_groups from kb.lexical_state l),
           kb._access_groups_of(kb._access_caller()),
           kb._access_reads_all_as(kb._access_caller())
      from kb.access_settings s;
end
$$;
comment on function kb.access_status() is
    'Whether access control is enforced (and on how many of its tables), the reader and writer '
    'roles, whether the lexical cache is split by groups, and what the calling role may read '
    '(its groups; reads_all: every group).';

create or replace function kb._access_set(enforce boolean)
returns boolean
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    t regclass;
begin
    if kb._access_enforced() is distinct from _access_set.enforce then
        foreach t in array kb._access_tables() loop
            execute format('alter table %s %s row level security', t,
                           case when _access_set.enforce then 'enable' else 'disable' end);
        end loop;
        -- the impact cache follows: split by visibility class while enforced (a merged row
        -- would tell a reader which invisible chunks hold which words), merged otherwise
        if (select l.watermark > 0 from kb.lexical_state l) then
            perform kb.refresh_lexical_index(full_rebuild => true);
        end if;
    end if;
    return kb._access_enforced();
end
$$;
comment on function kb._access_set(boolean) is
    'Turn row-level security on or off on every table of kb._access_tables() together and '
    'rebuild the lexical cache to match. Only the tables'' owner may.';

create or replace function kb.access_enable()
returns boolean
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
return kb._access_set(true);
comment on function kb.access_enable() is
    'Enforce access control: readers see public chunks and their granted groups only. Run by '
    'the tables'' owner; rebuilds the lexical cache by visibility class (about a minute per '
    '200k chunks).';

create or replace function kb.access_disable()
returns boolean
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
return kb._access_set(false);
comment on function kb.access_disable() is
    'Stop enforcing access control: every reader sees every chunk again (grants are kept). Run '
    'by the tables'' owner.';

-- On every apply: keep the recorded roles' grants complete (new tables, new functions); on the
-- first apply by a role that may create roles, create them with the default names.
do $$
declare
    s kb.access_settings;
begin
    select * into s from kb.access_settings;
    perform kb._access_grants_prune();
    if s.reader_role is not null then
        perform kb._access_apply_grants();
    elsif (select a.rolsuper or a.rolcreaterole from pg_catalog.pg_roles a where a.rolname = current_user) then
        perform kb.access_setup();
    else
        -- no roles yet: SECURITY DEFINER functions still lose PUBLIC's EXECUTE
        perform kb._access_apply_grants();
        raise notice 'kbpg: access control roles not created (% lacks CREATEROLE)', current_user
            using hint = 'a DBA runs: select kb.access_setup();  (kbpg access setup)';
    end if;
end
$$;
