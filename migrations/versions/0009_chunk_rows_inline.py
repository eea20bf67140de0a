"""Keep a chunk's row, its embedding included, in the table itself rather than in TOAST.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30

A 384-d chunk row is about 2.7 kB (embedding 1.5 kB, tsvector 0.6 kB, text 0.5 kB): over
PostgreSQL's default TOAST threshold of 2 kB, so the embedding, the largest value, was moved
out of line. Every exact distance then fetched it through the TOAST index: the vector arm's
exact path for a filter keeping 1% of 1M chunks read 82,000 buffers for 10,000 rows (100 ms).
`toast_tuple_target = 4080` keeps rows up to 4 kB inline (embeddings up to ~768 dimensions).

Rows already written keep their layout until rewritten (`VACUUM FULL kb.chunks`, or a
re-ingest): this revision only changes where new rows go, so it takes no time.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


UPGRADE = "alter table kb.chunks set (toast_tuple_target = 4080);"
DOWNGRADE = "alter table kb.chunks reset (toast_tuple_target);"


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
