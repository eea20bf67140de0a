"""Indexed metadata keys: a metadata filter's equalities mask the lexical arm as a group does.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04

Issue 40: a 1% metadata filter ({"product": "p7"}) cost 2.8-3x the 1% group filter keeping the
same chunks, because the lexical arm scored the filtered chunks one by one while a group's
stored bitmaps (0019) and value cache (0020) let it sum a few blocks. kb.indexed_metadata_keys
lists the metadata keys (kb.index_metadata_key) whose values get the same bitmaps and caches:
kb.lexical_filter_masks and kb.lexical_filter_caches take the filter kind 'metadata', the value
'["key", value]'; a filter's equalities on such keys (a scalar, $eq, a $in of one value, down
$and lists) then mask the arm, and the rest of the filter applies when candidates are rescored,
as before. A document's metadata lives on kb.documents, so updating it makes its chunks pending
and their blocks dirty (a statement trigger; nothing when no key is indexed): the bitmaps are
rewritten by the next kb.refresh_lexical_index, and pending chunks are scored exactly until then.
Internal signatures change (kb._filter_masks_serve, kb._filter_masks, kb._filter_cache_anchor
gain a metadata filter's anchors on indexed keys): the old ones are dropped here.
kb._fuse (new, internal) is the fusion kb.fuse_rrf, kb.fuse_convex and kb.search share.
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

UPGRADE = r"""
drop function if exists kb._filter_masks_serve(text[], text, text[]);
drop function if exists kb._filter_masks(text[], text, text[]);
drop function if exists kb._filter_cache_anchor(text[], text, text[]);
create table kb.indexed_metadata_keys (
    key        text primary key,
    path       jsonpath not null,
    indexed_at timestamptz not null default now()
);
comment on table kb.indexed_metadata_keys is
    'Metadata keys whose values have filter bitmaps and value caches of their own (filter '
    'kind ''metadata'' in kb.lexical_filter_masks / _caches), so that a filter''s equalities on '
    'them mask the lexical arm; path: the key''s SQL/JSON path. Changed by '
    'kb.index_metadata_key and kb.unindex_metadata_key.';
alter table kb.lexical_filter_masks drop constraint lexical_filter_masks_filter_kind_check;
alter table kb.lexical_filter_masks add constraint lexical_filter_masks_filter_kind_check
    check (filter_kind in ('group', 'category', 'label', 'metadata'));
alter table kb.lexical_filter_caches drop constraint lexical_filter_caches_filter_kind_check;
alter table kb.lexical_filter_caches add constraint lexical_filter_caches_filter_kind_check
    check (filter_kind in ('group', 'category', 'label', 'metadata'));
create or replace function kb._documents_metadata_changed() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    state kb.lexical_state;
begin
    if not exists (select from kb.indexed_metadata_keys) then
        return null;
    end if;
    select * into state from kb.lexical_state;
    -- the chunks of documents whose metadata changed: pending (scored exactly), their blocks
    -- dirty (the bitmaps rewritten at the next refresh)
    with changed as (
        select c.id
          from new_rows n join old_rows o on o.id operator(pg_catalog.=) n.id
          join kb.chunks c on c.document_id operator(pg_catalog.=) n.id
         where n.metadata is distinct from o.metadata
           and c.id operator(pg_catalog.<=) state.watermark
    ), pending as (
        insert into kb.lexical_pending (chunk_id) select id from changed on conflict do nothing
    )
    insert into kb.lexical_dirty_blocks (block_no)
    select distinct (id operator(pg_catalog./) state.block_size)::integer from changed
    on conflict do nothing;
    return null;
end $$;
comment on function kb._documents_metadata_changed() is
    'Statement trigger (update of kb.documents): while a metadata key is indexed, the chunks of '
    'documents whose metadata changed become pending and their blocks dirty, so that the next '
    'kb.refresh_lexical_index rewrites the bitmaps of their values.';
create trigger documents_metadata_changed after update on kb.documents
    referencing old table as old_rows new table as new_rows
    for each statement execute function kb._documents_metadata_changed();
"""

# the previous package's `kbpg db upgrade` creates its own signatures again
DOWNGRADE = r"""
drop trigger if exists documents_metadata_changed on kb.documents;
drop function if exists kb._documents_metadata_changed();
drop function if exists kb.index_metadata_key(text);
drop function if exists kb.unindex_metadata_key(text);
drop function if exists kb.list_indexed_metadata_keys();
drop function if exists kb._filter_masks_serve(text[], text, text[], text[]);
drop function if exists kb._filter_masks(text[], text, text[], text[], integer[]);
drop function if exists kb._filter_cache_anchor(text[], text, text[], text[], integer[]);
drop function if exists kb._filtered_rows_estimate(text[], text, text[], text[], text, jsonb);
drop function if exists kb._refresh_filter_masks(integer, integer);
drop function if exists kb._metadata_filter_values(jsonb);
drop function if exists kb._metadata_masks(jsonb);
drop function if exists kb._metadata_same_filter(jsonb, jsonb);
drop function if exists kb._metadata_anchors(jsonb);
drop function if exists kb._metadata_mask_value(text, jsonb);
drop function if exists kb._metadata_mask_prefix(text);
drop function if exists kb._metadata_row_filter_sql(text, jsonb);
drop function if exists kb._fuse(text, bigint[], double precision[], bigint[], double precision[],
    bigint[], double precision[], integer, double precision, double precision, double precision);
delete from kb.lexical_filter_blocks b using kb.lexical_filter_caches f
 where b.cache_id = f.cache_id and f.filter_kind = 'metadata';
delete from kb.lexical_filter_slots s using kb.lexical_filter_caches f
 where s.cache_id = f.cache_id and f.filter_kind = 'metadata';
delete from kb.lexical_filter_caches where filter_kind = 'metadata';
delete from kb.lexical_filter_masks where filter_kind = 'metadata';
alter table kb.lexical_filter_masks drop constraint lexical_filter_masks_filter_kind_check;
alter table kb.lexical_filter_masks add constraint lexical_filter_masks_filter_kind_check
    check (filter_kind in ('group', 'category', 'label'));
alter table kb.lexical_filter_caches drop constraint lexical_filter_caches_filter_kind_check;
alter table kb.lexical_filter_caches add constraint lexical_filter_caches_filter_kind_check
    check (filter_kind in ('group', 'category', 'label'));
drop table kb.indexed_metadata_keys;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
