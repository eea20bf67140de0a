"""Access grants name their role by OID, as PostgreSQL's own ACLs do; so do the reader and
writer role settings.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

kb.access_grants kept the role's name (revision 0005): after `drop role bob` (also after
`drop owned by bob`) the row stayed, and a role with CREATEROLE that re-created `bob` read
what the old `bob` was granted; a renamed role lost its grants to whichever role took the old
name. A grant now holds the role's OID (`role_id`): a dropped role's grants apply to no role at
once, a role re-created under the same name has a new OID and starts with none, and a renamed
role keeps its grants (kb.list_grants shows its current name). No event trigger fires on DROP
ROLE: the rows of dropped roles are deleted by kb._access_grants_prune(), which kb.grant_groups,
kb.revoke_groups, kb.list_grants (outside a read-only transaction) and every apply of the sql/
files call; no function ever returns them.

Existing rows: a name that resolves to a role becomes its OID; the grants of names that resolve
to no role are dropped, with a notice naming them.

kb._access_visible_groups(), called by 0005's row-level security policies, is frozen like
0015's copy: redefined here to read the OID.
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

UPGRADE = r"""
alter table kb.access_grants add column role_id oid;
update kb.access_grants g set role_id = r.oid from pg_catalog.pg_roles r where r.rolname = g.role;
do $$
declare
    dropped text;
begin
    select pg_catalog.string_agg(pg_catalog.format('%s (%s)', g.role, g.groups), ', ' order by g.role)
      into dropped
      from (select a.role, pg_catalog.string_agg(a.group_name, ', ' order by a.group_name) as groups
              from kb.access_grants a where a.role_id is null group by a.role) g;
    if dropped is not null then
        raise notice 'kbpg: grants of roles that no longer exist dropped: %', dropped;
    end if;
end
$$;
delete from kb.access_grants where role_id is null;
drop policy access_grants_own on kb.access_grants;
alter table kb.access_grants drop constraint access_grants_pkey;
alter table kb.access_grants drop column role;
alter table kb.access_grants alter column role_id set not null;
alter table kb.access_grants add primary key (role_id, group_name);
comment on column kb.access_grants.role_id is
    'The granted role''s OID (pg_roles.oid): a dropped role''s grants apply to no role, a '
    're-created one starts with none, a renamed one keeps its grants.';
create policy access_grants_own on kb.access_grants for select to public
    using (coalesce(pg_catalog.pg_has_role(role_id, 'USAGE'), false));

create or replace function kb._access_visible_groups() returns text[]
language sql stable security invoker parallel safe
set search_path = pg_catalog, pg_temp
as $body$ select (select coalesce(pg_catalog.array_agg(distinct g.group_name), '{}')
          from kb.access_grants g
         where coalesce(pg_catalog.pg_has_role(g.role_id, 'USAGE'), false)) $body$;

-- the reader and writer roles by OID too: a dropped and re-created kbpg_writer must not read
-- every group through the reader API (kb._access_reads_all_as)
alter table kb.access_settings add column reader_oid oid, add column writer_oid oid;
update kb.access_settings s
   set reader_oid = pg_catalog.to_regrole(pg_catalog.quote_ident(s.reader_role)),
       writer_oid = pg_catalog.to_regrole(pg_catalog.quote_ident(s.writer_role));
comment on column kb.access_settings.writer_oid is
    'The writer role''s OID: the role that reads every group is this one, not whatever role '
    'bears its name (reader_role and writer_role keep the names kb.access_setup creates).';
"""

DOWNGRADE = r"""
alter table kb.access_grants add column role text;
update kb.access_grants g set role = r.rolname from pg_catalog.pg_roles r where r.oid = g.role_id;
delete from kb.access_grants where role is null;
drop policy access_grants_own on kb.access_grants;
alter table kb.access_grants drop constraint access_grants_pkey;
alter table kb.access_grants drop column role_id;
alter table kb.access_grants alter column role set not null;
alter table kb.access_grants add constraint access_grants_role_check check (role <> '');
alter table kb.access_grants add primary key (role, group_name);
create policy access_grants_own on kb.access_grants for select to public
    using (coalesce(pg_catalog.pg_has_role(pg_catalog.to_regrole(pg_catalog.quote_ident(role)),
                                           'USAGE'), false));
create or replace function kb._access_visible_groups() returns text[]
language sql stable security invoker parallel safe
set search_path = pg_catalog, pg_temp
as $body$ select (select coalesce(pg_catalog.array_agg(distinct g.group_name), '{}')
          from kb.access_grants g
         where pg_catalog.pg_has_role(pg_catalog.to_regrole(pg_catalog.quote_ident(g.role)), 'USAGE')) $body$;
alter table kb.access_settings drop column reader_oid, drop column writer_oid;
"""


def _run(statements: str) -> None:
    # `%` is SQL here (format's and RAISE's placeholders), not a driver parameter
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(statements)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
