"""A selective filter value gets an impact cache of its own, over its chunks alone.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02

The stored filter bitmaps (0018, 0019) mask the lexical arm's block sums, but the sums still
add every cached term's weights over every block: a 1% group at 1M chunks keeps ~160 chunks of
each block of 16,000 and the arm sums all 63 blocks (12-15 ms of a 44 ms search on NPL
questions). Search engines answer a selective tenant filter from that tenant's own postings;
kbpg now does the same for the values the lexical arm masks (a group, a category or a label
holding between the exhaustive path's limit and 5% of the chunks): kb.lexical_filter_caches
lists them, kb.lexical_filter_slots numbers each value's chunks from 0 in id order (its slots),
and kb.lexical_filter_blocks holds the value's impacts per lexeme and block of slots, as
kb.lexical_blocks does per block of chunk ids. A search whose filter includes such a value
sums that value's blocks (one at 1M chunks for a 1% group, instead of 63) and maps the
candidates' slots back to chunk ids; the rest of the filter is applied by the exact rescoring,
as before. kb.refresh_lexical_index keeps them with the cache: every value whose chunks lie
in a rebuilt block is rebuilt. lexical_state.filter_caches says they cover every eligible
value: the next refresh after this upgrade builds them (no block's impacts recomputed).
lexical_state.build_filter_caches (default true) turns them off.

A TRUNCATE of kb.chunks empties them with the rest of the cache. The distributed layout
(Citus) and a cache split by visibility class (access control enforced) build none.
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# what a TRUNCATE of kb.chunks empties: 0019's trigger, and the value caches
TRUNCATED = r"""
create or replace function kb._chunks_truncated() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    update kb.corpus_stats set chunk_count = 0, total_tokens = 0;
    truncate kb.lexeme_stats, kb.lexical_blocks, kb.lexical_pending, kb.lexical_dirty_blocks,
             kb.lexical_filter_masks{caches};
    update kb.lexical_state
       set watermark = 0, avgdl = 1, refreshed_at = null, filter_masks = false{flag};
    return null;
end
$$;
"""

UPGRADE = r"""
create table kb.lexical_filter_caches (
    cache_id    integer generated always as identity primary key,
    filter_kind text not null check (filter_kind in ('group', 'category', 'label')),
    value       text not null,
    chunk_count bigint not null,
    block_size  integer not null,
    unique (filter_kind, value)
);
comment on table kb.lexical_filter_caches is
    'The filter values (a group, a category, a label) with an impact cache of their own '
    '(kb.lexical_filter_blocks over kb.lexical_filter_slots), how many slots it holds and how '
    'many a block of it holds. '
    'Kept by kb.refresh_lexical_index; complete while lexical_state.filter_caches.';
create table kb.lexical_filter_slots (
    cache_id integer not null,
    slot     integer not null,
    chunk_id bigint not null,
    primary key (cache_id, slot)
);
comment on table kb.lexical_filter_slots is
    'A value cache''s chunks numbered from 0, in id order when it was built and then as they '
    'came: the positions of kb.lexical_filter_blocks (a slot of a chunk since deleted, or '
    'no longer holding the value, is dropped when its block is next rewritten).';
create table kb.lexical_filter_blocks (
    cache_id integer not null,
    lexeme   text not null,
    block_no integer not null,
    impacts  sparsevec not null,
    idf      double precision not null,
    primary key (cache_id, lexeme, block_no)
);
alter table kb.lexical_filter_blocks alter column impacts set storage external;
comment on table kb.lexical_filter_blocks is
    'A value cache''s BM25 impacts: per lexeme and block of its slots, a sparsevec of idf0 * '
    'tf part at each slot (as kb.lexical_blocks per block of chunk ids).';
alter table kb.lexical_state add column filter_caches boolean not null default false;
comment on column kb.lexical_state.filter_caches is
    'Every filter value the lexical arm masks has its cache in kb.lexical_filter_caches (set by '
    'kb.refresh_lexical_index).';
alter table kb.lexical_state add column build_filter_caches boolean not null default true;
comment on column kb.lexical_state.build_filter_caches is
    'Whether kb.refresh_lexical_index builds the filter values'' own caches (about the impact '
    'cache''s size again when every chunk holds one such value, and its build time): false '
    'drops them at the next refresh, for a knowledge base whose searches filter little.';
""" + TRUNCATED.format(
    caches=",\n             kb.lexical_filter_caches, kb.lexical_filter_slots,"
    " kb.lexical_filter_blocks",
    flag=", filter_caches = false",
)

DOWNGRADE = r"""
drop function if exists kb._refresh_filter_cache(text, text, boolean, bigint, bigint, bigint, double precision,
                                                 integer);
drop function if exists kb._filter_cache_anchor(text[], text, text[]);
drop function if exists kb._chunk_filter_values(text[], text, text[]);
drop table kb.lexical_filter_blocks;
drop table kb.lexical_filter_slots;
drop table kb.lexical_filter_caches;
alter table kb.lexical_state drop column filter_caches, drop column build_filter_caches;
""" + TRUNCATED.format(caches="", flag="")


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
