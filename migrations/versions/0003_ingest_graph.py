"""Ingest graph sources: the links and entities each chunk mentions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

`link` and `entity` edges depend on other documents (a link's target may be ingested
later; an entity is "rare" only relative to the whole knowledge base), so ingest records
what each chunk points at here and derives those edges from these tables after every run.
Rows go with their chunk (on delete cascade), like the chunk's edges.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
create table kb.chunk_links (
    chunk_id      bigint not null references kb.chunks (id) on delete cascade,
    target_source text not null check (target_source <> ''),
    fragment      text not null default '',
    primary key (chunk_id, target_source, fragment)
);
create index chunk_links_target on kb.chunk_links (target_source);
comment on table kb.chunk_links is
    'Links found in a chunk (Markdown/HTML) to another source, resolved to link edges when '
    'that source is ingested.';

create table kb.chunk_entities (
    entity   text not null check (entity <> ''),
    chunk_id bigint not null references kb.chunks (id) on delete cascade,
    primary key (entity, chunk_id)
);
create index chunk_entities_chunk on kb.chunk_entities (chunk_id);
comment on table kb.chunk_entities is
    'Entities (codes, identifiers, capitalised names) a chunk mentions; chunks of different '
    'documents sharing a rare one get entity edges.';
"""

DOWNGRADE = r"""
drop table if exists kb.chunk_entities;
drop table if exists kb.chunk_links;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
