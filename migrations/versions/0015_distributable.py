"""What a distributed (Citus) knowledge base needs of the schema: graph rows that name their document.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01

`kbpg db distribute` spreads kb.documents, kb.chunks and the per-chunk graph rows over Citus
workers by document id, co-located, so that a document's chunks, edges, links and entities
live on one shard and go with it on delete. A distributed table's rows are placed by a column
of their own: kb.edges, kb.chunk_links and kb.chunk_entities gain `document_id` (an edge's is
its source chunk's document), which kbpg's writers fill from here on. The column is nullable
and rows written before this revision keep NULL on a single server, where nothing reads it
(`kbpg db distribute` fills them), so the upgrade rewrites no table.

The two access functions the row-level security policies call had SQL-standard bodies (bound
at creation). Such a body makes the function depend on the tables it reads, and the policy on
a table depends on the function: Citus refuses to distribute or replicate a table caught in
that cycle ("circularly depends itself"). They get the same body as a string, run with the
same pinned search_path and fully qualified names; the functions in sql/080 that had such
bodies change the same way.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

GRAPH_TABLES = ("edges", "chunk_links", "chunk_entities")

VISIBLE_GROUPS = """
    (select coalesce(pg_catalog.array_agg(distinct g.group_name), '{}')
          from kb.access_grants g
         where pg_catalog.pg_has_role(pg_catalog.to_regrole(pg_catalog.quote_ident(g.role)), 'USAGE'))"""
READS_ALL = """
    coalesce((select pg_catalog.pg_has_role(
                            pg_catalog.to_regrole(pg_catalog.quote_ident(s.writer_role)), 'USAGE')
                   from kb.access_settings s), false)"""


def _access_functions(standard_bodies: bool) -> str:
    def body(expression: str) -> str:
        if standard_bodies:
            return f"return{expression};"
        return f"as $$ select{expression} $$;"

    return f"""
create or replace function kb._access_visible_groups() returns text[]
language sql stable security invoker parallel safe
set search_path = pg_catalog, pg_temp
{body(VISIBLE_GROUPS)}
create or replace function kb._access_reads_all() returns boolean
language sql stable security invoker parallel safe
set search_path = pg_catalog, pg_temp
{body(READS_ALL)}
"""


UPGRADE = "\n".join(
    f"alter table kb.{table} add column document_id bigint;\n"
    f"comment on column kb.{table}.document_id is "
    f"'The document of the row''s {'source ' if table == 'edges' else ''}chunk: where a "
    "distributed knowledge base keeps the row (NULL on a single server for rows written "
    "before revision 0015).';"
    for table in GRAPH_TABLES
) + _access_functions(standard_bodies=False)

DOWNGRADE = "\n".join(
    f"alter table kb.{table} drop column document_id;" for table in GRAPH_TABLES
) + _access_functions(standard_bodies=True)


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
