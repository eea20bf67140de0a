"""Lexical index: BM25 term weights per (lexeme, block of chunk ids) as sparsevec.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

The lexical arm (sql/040-search-lexical.sql) scores a query by summing, per block of
16,000 chunk ids, each query term's weight vector (idf x tf part) with pgvector's C
arithmetic, reads the best candidates off the sums, and rescores them exactly from the
tsvector. The weights are a cache: the search stays exact whatever state they are in
(chunks above the watermark, updated chunks, a drifted average length or idf are all
bounded at query time); refreshing them (kb.refresh_lexical_index) only restores speed.

The triggers here record what a refresh must redo: updated chunks (scored exactly until
then) and blocks holding deleted chunks. Their functions are frozen in this revision.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = r"""
create table kb.lexical_blocks (
    lexeme   text not null,
    block_no integer not null check (block_no >= 0),
    -- idf * tf / (tf + k1*(1-b+b*dl/avgdl)) per chunk (index = chunk id mod block size),
    -- with lexical_state.avgdl and the idf below, both as of the block's last refresh
    impacts  sparsevec not null,
    idf      double precision not null check (idf > 0),
    primary key (lexeme, block_no)
);
comment on table kb.lexical_blocks is
    'Cache of BM25 term weights idf*tf/(tf + k1*(1-b+b*dl/avgdl)) per lexeme and block of chunk '
    'ids; maintained by kb.refresh_lexical_index(), never needed for exactness.';

create table kb.lexical_state (
    singleton   boolean primary key default true check (singleton),
    block_size  integer not null default 16000 check (block_size between 1 and 16000),
    -- chunks with id <= watermark are in kb.lexical_blocks (unless pending)
    watermark   bigint not null default 0 check (watermark >= 0),
    -- average chunk length the stored impacts were computed with
    avgdl       double precision not null default 1 check (avgdl > 0),
    refreshed_at timestamptz
);
insert into kb.lexical_state default values;
comment on table kb.lexical_state is
    'What kb.lexical_blocks covers: chunk ids up to watermark, impacts computed with avgdl.';

create table kb.lexical_pending (
    chunk_id bigint primary key
);
comment on table kb.lexical_pending is
    'Chunks below the watermark whose text changed since the last refresh: scored exactly.';

create table kb.lexical_dirty_blocks (
    block_no integer primary key
);
comment on table kb.lexical_dirty_blocks is
    'Blocks holding impacts of deleted or updated chunks: rebuilt by the next refresh.';

create function kb.chunks_lexical_after_update() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, kb
as $$
declare
    state kb.lexical_state;
begin
    select * into state from kb.lexical_state;
    insert into kb.lexical_pending (chunk_id)
    select n.id from new_rows n join old_rows o on o.id = n.id
     where o.tsv is distinct from n.tsv and n.id <= state.watermark
    on conflict do nothing;
    insert into kb.lexical_dirty_blocks (block_no)
    select distinct (n.id / state.block_size)::integer
      from new_rows n join old_rows o on o.id = n.id
     where o.tsv is distinct from n.tsv and n.id <= state.watermark
    on conflict do nothing;
    return null;
end $$;

create function kb.chunks_lexical_after_delete() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, kb
as $$
declare
    state kb.lexical_state;
begin
    select * into state from kb.lexical_state;
    insert into kb.lexical_dirty_blocks (block_no)
    select distinct (o.id / state.block_size)::integer from old_rows o
     where o.id <= state.watermark
    on conflict do nothing;
    return null;
end $$;

create trigger chunks_lexical_update after update on kb.chunks
    referencing old table as old_rows new table as new_rows
    for each statement execute function kb.chunks_lexical_after_update();
create trigger chunks_lexical_delete after delete on kb.chunks
    referencing old table as old_rows
    for each statement execute function kb.chunks_lexical_after_delete();
"""

DOWNGRADE = r"""
drop trigger if exists chunks_lexical_delete on kb.chunks;
drop trigger if exists chunks_lexical_update on kb.chunks;
drop function if exists kb.chunks_lexical_after_delete();
drop function if exists kb.chunks_lexical_after_update();
drop table if exists kb.lexical_dirty_blocks;
drop table if exists kb.lexical_pending;
drop table if exists kb.lexical_state;
drop table if exists kb.lexical_blocks;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
