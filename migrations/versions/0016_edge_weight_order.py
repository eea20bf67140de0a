"""The graph arm reads each chunk's heaviest edges from an index in that order.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01

The graph arm (kb.expand_graph, kb.search's graph arm) follows the 32 heaviest edges of a chunk
in each direction. With the primary key (src_chunk_id, dst_chunk_id, relation) and edges_dst
(dst_chunk_id) it read every edge of the chunk and sorted them: a chunk with 100,000 incoming
links cost 100,000 rows each time a walk expanded it, and the incoming side fetched each edge
from a heap page of its own. Two indexes in the order the walk reads, (src_chunk_id, weight
desc, dst_chunk_id) and (dst_chunk_id, weight desc, src_chunk_id), give the 32 heaviest
without a sort, from the index alone once the table is vacuumed (benchmarks/bench_query_cost.py
--dense: a 1,000-seed walk ~40% faster at 50k chunks). The second one replaces edges_dst (its
leading column serves the same lookups and the foreign key's cascades).
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = """
create index edges_src_weight on kb.edges (src_chunk_id, weight desc, dst_chunk_id);
create index edges_dst_weight on kb.edges (dst_chunk_id, weight desc, src_chunk_id);
drop index kb.edges_dst;
"""

DOWNGRADE = """
create index edges_dst on kb.edges (dst_chunk_id);
drop index kb.edges_dst_weight;
drop index kb.edges_src_weight;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
