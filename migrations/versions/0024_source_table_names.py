"""Table sources remember their table's name, for when the table is dropped.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03

Issue 38, item 5: kb.table_sources.relation is a regclass, an OID. Once the table is dropped it
names nothing: `kbpg sources list` printed a bare number, `kbpg sync` and `kbpg sources resync`
failed on a syntax error, and a table re-created under the same name was never synced.
relation_name keeps the schema-qualified, quoted name the source was defined (or last
re-bound) on: the functions of sql/090 report a dropped table by it ("public.articles
(dropped)"), and kb.resync_table_source binds the source to a table re-created under it.
"""

from __future__ import annotations

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

UPGRADE = r"""
alter table kb.table_sources add column relation_name text;
update kb.table_sources s
   set relation_name = pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
  from pg_catalog.pg_class c
  join pg_catalog.pg_namespace n on n.oid = c.relnamespace
 where c.oid = s.relation;
-- a source whose table is gone already: its OID is all there is
update kb.table_sources s set relation_name = s.relation::pg_catalog.oid::text where s.relation_name is null;
alter table kb.table_sources alter column relation_name set not null;
comment on column kb.table_sources.relation_name is
    'The table''s schema-qualified name when the source was defined or last re-bound (relation '
    'follows a rename; this names a dropped table, and kb.resync_table_source binds the source '
    'to a table re-created under it).';
"""

# kb.list_table_sources (SQL-standard body) depends on the column: dropped with the functions that
# read it; the previous package's `kbpg db upgrade` applies its own again
DOWNGRADE = r"""
drop function if exists kb.list_table_sources(text);
drop function if exists kb._source_catalog_rebind(integer, regclass);
drop function if exists kb._source_table(kb.table_sources);
drop function if exists kb._source_relation_name(regclass);
alter table kb.table_sources drop column relation_name;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
