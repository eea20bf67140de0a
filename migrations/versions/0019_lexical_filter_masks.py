"""The stored filter bitmaps cover category and labels as well as groups.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

Revision 0018 stored, per group and block of the impact cache, a bit per chunk id of the block,
so that a filter by groups alone masked the lexical arm's block sums and counted its rows
without reading the chunks. A filter by category or labels still built its mask per query from
the filtered chunks' ids (9.6 ms of a 74 ms search at 1M chunks, and the vector arm's exact path
kept every id for it). kb.lexical_filter_masks replaces kb.lexical_group_masks: a row per filter
kind ('group', 'category', 'label'), value and block; a search ORs its groups' bits per block
and ANDs in its category's and each of its labels' (labels filter as `@>`: a chunk holds them
all). lexical_state.group_masks becomes filter_masks and is cleared: the next
kb.refresh_lexical_index builds the bitmaps of every block (the chunks' filter columns read, no
impacts recomputed); until then filters mask per query, as before 0018.

A chunk whose category or labels change in place is now pending and its block dirty, as a
change of its text or groups already made it: the bitmaps hold the old values until the next
refresh, and pending chunks are scored exactly.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# the triggers as 0018 wrote them, but for what makes a chunk pending (`changed`: a row
# comparison of old o and new n) and which bitmaps a TRUNCATE empties (`masks`, `flag`)
AFTER_UPDATE = r"""
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
     where {changed}
       and n.id operator(pg_catalog.<=) state.watermark
    on conflict do nothing;
    insert into kb.lexical_dirty_blocks (block_no)
    select distinct (n.id operator(pg_catalog./) state.block_size)::integer
      from new_rows n join old_rows o on o.id operator(pg_catalog.=) n.id
     where {changed}
       and n.id operator(pg_catalog.<=) state.watermark
    on conflict do nothing;
    return null;
end $$;
"""
TRUNCATED = r"""
create or replace function kb._chunks_truncated() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    update kb.corpus_stats set chunk_count = 0, total_tokens = 0;
    truncate kb.lexeme_stats, kb.lexical_blocks, kb.lexical_pending, kb.lexical_dirty_blocks,
             {masks};
    update kb.lexical_state
       set watermark = 0, avgdl = 1, refreshed_at = null, {flag} = false;
    return null;
end
$$;
"""

UPGRADE = (
    r"""
drop function if exists kb._group_masks_serve(text[], text, text[]);
drop function if exists kb._refresh_group_masks(integer, integer);
drop table kb.lexical_group_masks;
create table kb.lexical_filter_masks (
    filter_kind text not null check (filter_kind in ('group', 'category', 'label')),
    value       text not null,
    block_no    integer not null,
    kept        bit varying not null,
    primary key (filter_kind, value, block_no)
);
create index lexical_filter_masks_block on kb.lexical_filter_masks (block_no);
comment on table kb.lexical_filter_masks is
    'Per filter value (a group, a category, a label) and block of kb.lexical_blocks, a bit per '
    'chunk id of the block (first bit: the block''s first id), set where the chunk holds the '
    'value: the filters'' mask of the block sums. Kept by kb.refresh_lexical_index; complete '
    'while lexical_state.filter_masks.';
alter table kb.lexical_state rename column group_masks to filter_masks;
update kb.lexical_state set filter_masks = false;
comment on column kb.lexical_state.filter_masks is
    'kb.lexical_filter_masks covers every block of the cache (set by kb.refresh_lexical_index).';
"""
    + AFTER_UPDATE.format(
        changed="(o.tsv, o.groups, o.category, o.labels)\n"
        "           is distinct from (n.tsv, n.groups, n.category, n.labels)"
    )
    + TRUNCATED.format(masks="kb.lexical_filter_masks", flag="filter_masks")
)

# back to 0018's table (empty: the next refresh builds the group bitmaps) and triggers
DOWNGRADE = (
    r"""
drop function if exists kb._filter_masks_serve(text[], text, text[]);
drop function if exists kb._filter_masks(text[], text, text[]);
drop function if exists kb._refresh_filter_masks(integer, integer);
drop table kb.lexical_filter_masks;
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
alter table kb.lexical_state rename column filter_masks to group_masks;
update kb.lexical_state set group_masks = false;
comment on column kb.lexical_state.group_masks is
    'kb.lexical_group_masks covers every block of the cache (set by kb.refresh_lexical_index).';
"""
    + AFTER_UPDATE.format(
        changed="(o.tsv is distinct from n.tsv or o.groups is distinct from n.groups)"
    )
    + TRUNCATED.format(masks="kb.lexical_group_masks", flag="group_masks")
)


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
