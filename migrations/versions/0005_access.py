"""Access control: group grants, row-level security policies, a lexical cache split by groups.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

Policies are created here but enforce nothing until `kb.access_enable()` (`kbpg access enable`)
turns row-level security on for the tables a reader reaches; until then every role with SELECT
sees every row, as before. A chunk is visible to a role when its groups are empty (public), when
the role may use a role granted one of its groups in kb.access_grants (pg_has_role 'USAGE', so a
login role granted a team role inherits the team's groups), or when the role may use the writer
role recorded in kb.access_settings. Table owners and superusers bypass row-level security.

The two functions the policies call are created here, frozen, for the same reason as 0001's
trigger functions: the policies below reference them. Each is evaluated once per query (the
policies wrap them in a scalar subquery, an InitPlan), not once per row.

kb.lexical_blocks gains `groups`: while access control is enforced, the BM25 impact cache keeps
one sparsevec per (lexeme, block, visibility class), so a reader's block sums add up only the
classes it may see and the cache reveals nothing about invisible chunks.

Roles are cluster-wide and need CREATEROLE: `kb.access_setup()` (sql/080-access.sql) creates
and grants them; applying the sql/ files at head calls it when the migrating role may create
roles, and says what a DBA runs otherwise.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = r"""
create table kb.access_settings (
    singleton   boolean primary key default true check (singleton),
    reader_role text check (reader_role <> ''),
    writer_role text check (writer_role <> '')
);
insert into kb.access_settings default values;
comment on table kb.access_settings is
    'The NOLOGIN roles kb.access_setup() created and granted: reader (search) and writer (ingest, '
    'sees every group).';

create table kb.access_grants (
    role       text not null check (role <> ''),
    group_name text not null check (group_name <> ''),
    granted_at timestamptz not null default now(),
    primary key (role, group_name)
);
create index access_grants_group on kb.access_grants (group_name);
comment on table kb.access_grants is
    'Which role may read which group''s chunks once access control is enforced (kb.grant_groups). '
    'Members of the role inherit its groups. Chunks without groups are visible to every reader.';

-- Readers see their own grants only (this table is always under row-level security).
alter table kb.access_grants enable row level security;
create policy access_grants_own on kb.access_grants for select to public
    using (coalesce(pg_catalog.pg_has_role(pg_catalog.to_regrole(pg_catalog.quote_ident(role)),
                                           'USAGE'), false));

create function kb._access_visible_groups() returns text[]
language sql stable security invoker parallel safe
set search_path = pg_catalog, pg_temp
return (select coalesce(pg_catalog.array_agg(distinct g.group_name), '{}')
          from kb.access_grants g
         where pg_catalog.pg_has_role(pg_catalog.to_regrole(pg_catalog.quote_ident(g.role)), 'USAGE'));
comment on function kb._access_visible_groups() is
    'The groups the current role may read (its own grants and those of roles it may use).';

create function kb._access_reads_all() returns boolean
language sql stable security invoker parallel safe
set search_path = pg_catalog, pg_temp
return coalesce((select pg_catalog.pg_has_role(
                            pg_catalog.to_regrole(pg_catalog.quote_ident(s.writer_role)), 'USAGE')
                   from kb.access_settings s), false);
comment on function kb._access_reads_all() is
    'True when the current role may use the writer role: ingest and maintenance see every group.';

create policy access_visible on kb.documents for all to public
    using (groups = '{}' or (select kb._access_reads_all())
           or groups operator(pg_catalog.&&) (select kb._access_visible_groups()))
    with check ((select kb._access_reads_all()));
create policy access_visible on kb.chunks for all to public
    using (groups = '{}' or (select kb._access_reads_all())
           or groups operator(pg_catalog.&&) (select kb._access_visible_groups()))
    with check ((select kb._access_reads_all()));
-- an edge is visible only when both of its chunks are: the graph arm never walks into or
-- through a chunk the caller may not read (the subqueries are under kb.chunks' policy)
create policy access_visible on kb.edges for all to public
    using ((select kb._access_reads_all())
           or (exists (select 1 from kb.chunks c where c.id = src_chunk_id)
               and exists (select 1 from kb.chunks c where c.id = dst_chunk_id)))
    with check ((select kb._access_reads_all()));

-- the BM25 impact cache, split by visibility class while access control is enforced
alter table kb.lexical_blocks add column groups text[] not null default '{}';
alter table kb.lexical_blocks drop constraint lexical_blocks_pkey;
alter table kb.lexical_blocks add primary key (lexeme, block_no, groups);
alter table kb.lexical_state add column split_by_groups boolean not null default false;
comment on column kb.lexical_state.split_by_groups is
    'The cache holds one row per (lexeme, block, chunk groups): set by a refresh while row-level '
    'security is on for kb.chunks, so a reader sums only the classes it may see.';
-- rows of a merged cache (not split: row-level security turned on by hand, without
-- kb.access_enable's rebuild) mix every class: readers see none of them then
create policy access_visible on kb.lexical_blocks for all to public
    using ((select kb._access_reads_all())
           or ((select l.split_by_groups from kb.lexical_state l)
               and (groups = '{}'
                    or groups operator(pg_catalog.&&) (select kb._access_visible_groups()))))
    with check ((select kb._access_reads_all()));
"""

DOWNGRADE = r"""
-- sql/080-access.sql's functions (some depend on the columns and tables dropped below)
drop function if exists kb.access_setup(text, text);
drop function if exists kb.access_enable();
drop function if exists kb.access_disable();
drop function if exists kb.access_status();
drop function if exists kb.grant_groups(text, text[]);
drop function if exists kb.revoke_groups(text, text[]);
drop function if exists kb.list_grants(text);
drop function if exists kb._access_tables();
drop function if exists kb._access_apply_grants();
drop function if exists kb._access_enforced();
drop function if exists kb._access_set(boolean);
alter table kb.documents disable row level security;
alter table kb.chunks disable row level security;
alter table kb.edges disable row level security;
alter table kb.lexical_blocks disable row level security;
drop policy if exists access_visible on kb.lexical_blocks;
drop policy if exists access_visible on kb.edges;
drop policy if exists access_visible on kb.chunks;
drop policy if exists access_visible on kb.documents;
-- split rows cannot keep the old key: empty the cache (search stays exact without it)
delete from kb.lexical_blocks;
update kb.lexical_state set watermark = 0, refreshed_at = null;
delete from kb.lexical_pending;
delete from kb.lexical_dirty_blocks;
alter table kb.lexical_state drop column split_by_groups;
alter table kb.lexical_blocks drop constraint lexical_blocks_pkey;
alter table kb.lexical_blocks drop column groups;
alter table kb.lexical_blocks add primary key (lexeme, block_no);
drop function kb._access_visible_groups();
drop function kb._access_reads_all();
drop table kb.access_grants;
drop table kb.access_settings;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
