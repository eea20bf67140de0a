"""TRUNCATE of kb.chunks resets the BM25 statistics and the impact cache with it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

The statistics (kb.corpus_stats, kb.lexeme_stats) and the impact cache's bookkeeping follow
kb.chunks through statement-level INSERT, UPDATE and DELETE triggers; TRUNCATE fires none of
them. `TRUNCATE kb.documents CASCADE` (or of kb.chunks) left the old chunk count, document
frequencies and average length in place, so every later score used the wrong idf and avgdl;
with RESTART IDENTITY, new chunks took ids at or below the cache's watermark and were read as
cached under the old chunks' impacts: missed by the lexical arm until a full rebuild. An AFTER
TRUNCATE trigger now empties the statistics and the cache (watermark 0: exact scoring from the
tsvector until the next kb.refresh_lexical_index(), which ingest calls). Its function lives
here, frozen, because the trigger created here calls it. Truncating one partition of a
partitioned kb.chunks fires only that partition's triggers: kb.recount_bm25_statistics()
(sql/045) repairs that case and any other the triggers did not see.
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = """
create function kb._chunks_truncated() returns trigger
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

create trigger chunks_truncate after truncate on kb.chunks
    for each statement execute function kb._chunks_truncated();
"""

DOWNGRADE = """
drop trigger chunks_truncate on kb.chunks;
drop function kb._chunks_truncated();
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
