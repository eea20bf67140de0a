"""Knowledge bases, step five: an index that finds another knowledge base's chunks.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-05

Issue 39 (docs/knowledge-bases.md, "At scale"). A knowledge base without an HNSW of its own
(under 2,000 chunks) sorts its chunks by distance, and scores them from their tsvectors: kbpg
states those statements with the knowledge base as a literal (kb._chunks_relation), but with
no index on kb_id each read every chunk of the table (beside a 200k-chunk default and 999
small ones: 570 ms for the vector arm of a 236-chunk knowledge base, 94 ms for its BM25 arm).

The index is partial, `kb_id <> 1`: default's rows are not in it, so a default-only database
keeps an empty index, and no plan for default can use it (a literal 1 contradicts the
predicate, the views' parameter cannot prove it). An index on (kb_id, id) for every row made
the planner take it for default's joins through the views (12-20x slower searches).
"""

from __future__ import annotations

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

UPGRADE = """
create index chunks_kb_id_id on kb_data.chunks (kb_id, id)
    where kb_id operator(pg_catalog.<>) 1;
comment on index kb_data.chunks_kb_id_id is
    'The chunks of every knowledge base but default, for the statements that name one as a '
    'literal (kb._chunks_relation): its exact vector path and its BM25 scoring.';
"""

DOWNGRADE = """
drop index kb_data.chunks_kb_id_id;
"""


def _run(statements: str) -> None:
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(statements)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
