"""The lexical arm's group filter reads a stored bitmap per group and block of the impact cache.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

A selective filter needs the block sums of kb.lexical_blocks restricted to the chunks it keeps
(else 99 in 100 cached candidates of a 1% filter are rescored only to be dropped). The search
built that mask per query from the filtered chunks' ids, as text parsed into a sparsevec per
block: 9.6 ms of a 74 ms search at 1M chunks with a 1% group filter (auto_explain), and the
vector arm sampled 256 of the table's pages to estimate the filter's rows (3.2 ms). For the
common filter, groups alone, kb.lexical_group_masks now holds, per group and block of the
cache, a bit per chunk id of the block (1: the chunk holds the group), written by
kb.refresh_lexical_index with the block's impacts; a search ORs its groups' bitmaps and ANDs
them into the bits its threshold search reads, and counts the filter's rows from them.
lexical_state.group_masks says they cover the cache: the next refresh builds them for every
block when it is false (reading each chunk's groups once, without recomputing impacts).

A chunk whose groups change in place (UPDATE of kb.chunks.groups: kbpg's writers replace a
document's chunks, other writers may not) is now pending and its block dirty, as when its text
changes: the stored bitmaps, and the split cache's visibility classes, hold the old groups
until the next refresh, and pending chunks are scored exactly. TRUNCATE of kb.chunks empties the
bitmaps with the rest of the cache. The distributed layout (Citus) builds none: its searches
keep the per-query mask.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# kb._lexical_threshold gains `masks` (sql/040 creates it at head)
OLD_THRESHOLD = """kb._lexical_threshold(vector[], integer, integer, bigint, double precision, bigint,
    double precision, bigint, bigint, double precision, bigint, integer, double precision, boolean)"""
NEW_THRESHOLD = """kb._lexical_threshold(vector[], integer, integer, bigint, double precision, bigint,
    double precision, bigint, bigint, double precision, bigint, integer, double precision, boolean,
    varbit[])"""

UPGRADE = rf"""
drop function if exists {OLD_THRESHOLD};
create table kb.lexical_group_masks (
    group_name text not null,
    block_no   integer not null,
    kept       bit varying not null,
    primary key (group_name, block_no)
);
create index lexical_group_masks_block on kb.lexical_group_masks (block_no);
comment on table kb.lexical_group_masks is
    'Per group and block of kb.lexical_blocks, a bit per chunk id of the block (first bit: the '
    'block''s first id), set where the chunk holds the group: a group filter''s mask of the '
    'block sums. Kept by kb.refresh_lexical_index; complete while lexical_state.group_masks.';
alter table kb.lexical_state add column group_masks boolean not null default false;
comment on column kb.lexical_state.group_masks is
    'kb.lexical_group_masks covers every block of the cache (set by kb.refresh_lexical_index).';

create or replace function kb.chunks_lexical_after_update() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    state kb.lexical_state;
begin
    select * into state from kb.lexical_state;
    insert into kb.lexical_pending (chunk_id)
    select n.id from new_rows n join old_rows o on o.id operator(pg_catalog.=) n.id
     where (o.tsv is distinct from n.tsv or o.groups is distinct from n.groups)
       and n.id operator(pg_catalog.<=) state.watermark
    on conflict do nothing;
    insert into kb.lexical_dirty_blocks (block_no)
    select distinct (n.id operator(pg_catalog./) state.block_size)::integer
      from new_rows n join old_rows o on o.id operator(pg_catalog.=) n.id
     where (o.tsv is distinct from n.tsv or o.groups is distinct from n.groups)
       and n.id operator(pg_catalog.<=) state.watermark
    on conflict do nothing;
    return null;
end $$;

create or replace function kb._chunks_truncated() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    update kb.corpus_stats set chunk_count = 0, total_tokens = 0;
    truncate kb.lexeme_stats, kb.lexical_blocks, kb.lexical_pending, kb.lexical_dirty_blocks,
             kb.lexical_group_masks;
    update kb.lexical_state
       set watermark = 0, avgdl = 1, refreshed_at = null, group_masks = false;
    return null;
end
$$;
"""

DOWNGRADE = rf"""
drop function if exists {NEW_THRESHOLD};
drop function if exists kb._group_masks_serve(text[], text, text[]);
drop function if exists kb._refresh_group_masks(integer, integer);
create or replace function kb._chunks_truncated() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    update kb.corpus_stats set chunk_count = 0, total_tokens = 0;
    truncate kb.lexeme_stats, kb.lexical_blocks, kb.lexical_pending, kb.lexical_dirty_blocks;
    update kb.lexical_state set watermark = 0, avgdl = 1, refreshed_at = null;
    return null;
end
$$;

create or replace function kb.chunks_lexical_after_update() returns trigger
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

alter table kb.lexical_state drop column group_masks;
drop table kb.lexical_group_masks;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
