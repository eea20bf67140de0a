"""The embedding space records its index layout: vector, halfvec or binary (any dimension).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

`kb.embedding_space.layout` says how kb.chunks.embedding is indexed (sql/010): `vector`
(HNSW on the vectors, up to 2,000 dimensions), `halfvec` (HNSW on `embedding::halfvec(n)`, up to
4,000) or `binary` (HNSW on `binary_quantize(embedding)::bit(n)` with an exact re-rank, up to
16,000). An existing space keeps its `vector` index. Signature change (CHANGELOG):
`kb.set_embedding_space` and `kb.reset_embedding_space` gain `layout text`; the old signatures
are dropped here, the new functions are created from sql/ at head. Downgrading puts a `vector`
index back where the dimension allows one.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = r"""
alter table kb.embedding_space
    add column layout text not null default 'vector'
        check (layout in ('vector', 'halfvec', 'binary'));
comment on column kb.embedding_space.layout is
    'How kb.chunks.embedding is indexed: vector, halfvec or binary (binary_quantize + exact re-rank).';
drop function if exists kb.set_embedding_space(text, integer);
drop function if exists kb.reset_embedding_space(text, integer);
"""

DOWNGRADE = r"""
drop function if exists kb.set_embedding_space(text, integer, text);
drop function if exists kb.reset_embedding_space(text, integer, text);
drop function if exists kb.set_embedding_layout(text);
drop function if exists kb.default_vector_layout(integer);
drop function if exists kb._check_vector_layout(text, integer);
drop function if exists kb._vector_index_definition(text, integer);
do $$
declare
    space record;
begin
    select dimension, layout into space from kb.embedding_space;
    if found and space.layout <> 'vector' then
        drop index if exists kb.chunks_embedding_hnsw;
        if space.dimension <= 2000 then
            create index chunks_embedding_hnsw on kb.chunks
                using hnsw (embedding vector_cosine_ops) with (m = 16, ef_construction = 64);
        end if;
    end if;
end
$$;
alter table kb.embedding_space drop column layout;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
