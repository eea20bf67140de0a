"""kb.search and kb.search_vector take extra query embeddings; kb.search returns the fused pool.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Signature change (CHANGELOG): `kb.search_vector` gains `extra_embeddings vector[]` (query
expansion: one scan per embedding, best similarity wins); `kb.search` gains
`extra_embeddings` and `rerank_pool integer` (the uncut, uncapped fused pool for a reranker)
and returns a `fused_rank` column. The old signatures are dropped here; the new functions are
created from sql/ at head. Downgrading drops the new signatures: the 0.1.0 package's
`kbpg db upgrade` creates its own again.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD_SEARCH = (
    "text, public.vector, integer, text[], text, text[], double precision, integer, integer, "
    "integer, double precision, double precision, double precision, boolean, boolean, integer, "
    "integer, double precision"
)
OLD_SEARCH_VECTOR = "public.vector, integer, text[], text, text[], double precision"

UPGRADE = f"""
drop function if exists kb.search({OLD_SEARCH});
drop function if exists kb.search_vector({OLD_SEARCH_VECTOR});
"""

DOWNGRADE = f"""
drop function if exists kb.search({OLD_SEARCH}, public.vector[], integer);
drop function if exists kb.search_vector({OLD_SEARCH_VECTOR}, public.vector[]);
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
