"""Contextual retrieval: a chunk's situating context, embedded and in the BM25 text.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30

`kb.chunks.context` holds the one or two sentences a chat model wrote to situate the chunk in
its document (NULL: none). `context_key` says what it was made from (a hash of the chunk's
content, the document's content hash, the model and the prompt version): a chunk whose key
differs from the one the current settings give is stale, and a chunk with a key but no
context is missing it (the model was down during ingest) — `kbpg recontextualize` redoes both.

The context joins the tsvector (weight C, after section A and content B), so BM25 finds the
words it adds. The generated columns `tsv` and `token_count` are re-created with the new
expression (PostgreSQL 15 and 16 have no ALTER COLUMN ... SET EXPRESSION), which rewrites
the table once; every context is NULL at this point, so each row's tsvector, and with it the
BM25 statistics the triggers keep, is unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _generated(with_context: bool) -> str:
    text = (
        "pg_catalog.setweight(pg_catalog.to_tsvector('english'::pg_catalog.regconfig, section), 'A') "
        "|| pg_catalog.setweight(pg_catalog.to_tsvector('english'::pg_catalog.regconfig, content), 'B')"
    )
    if with_context:
        text += (
            " || pg_catalog.setweight(pg_catalog.to_tsvector('english'::pg_catalog.regconfig,"
            " coalesce(context, '')), 'C')"
        )
    return f"""
alter table kb.chunks drop column tsv, drop column token_count;
alter table kb.chunks
    add column tsv tsvector generated always as ({text}) stored,
    add column token_count integer generated always as (kb.tsvector_token_count({text})) stored;
create index chunks_tsv_gin on kb.chunks using gin (tsv);
"""


UPGRADE = """
alter table kb.chunks add column context text, add column context_key text;
comment on column kb.chunks.context is
    'Contextual retrieval: sentences situating the chunk in its document (NULL: none); part of '
    'the embedded text and of tsv.';
comment on column kb.chunks.context_key is
    'What the context was made from (chunk content, document hash, model, prompt version); '
    'set with a NULL context when the model failed (missing).';
""" + _generated(with_context=True)

DOWNGRADE = (
    _generated(with_context=False)
    + """
alter table kb.chunks drop column context, drop column context_key;
"""
)


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
