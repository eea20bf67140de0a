"""Metadata filters: every search function takes `filter`, a JSON filter on documents' metadata.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04

Issue 40: kb.search, kb.search_vector, kb.search_lexical and kb.expand_graph gain
`filter jsonb`; kb.search also `recency interval` and `recency_key text` (a half-life applied
after fusion), `diversity double precision` (maximal marginal relevance over the pool) and
`fusion text` ('rrf' or 'convex': kb.fuse_convex, new) (langchain-postgres's operators, compiled by kb._metadata_jsonpath in sql/018
into a SQL/JSON path predicate every arm applies before ranking). Signature change
(CHANGELOG): the old signatures of those functions and of the internal ones the filter threads
through are dropped here, the new ones are created from sql/ at head (the callers first: a
SQL-standard body depends on the function it calls). A GIN index (jsonb_path_ops) on
kb.documents.metadata serves the equality parts of a filter (`@@`): a 1% filter finds its
documents through it instead of testing every document's metadata.
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

UPGRADE = r"""
drop function if exists kb.search(text, vector, integer, text[], text, text[], double precision,
    integer, integer, integer, double precision, double precision, double precision, boolean,
    boolean, integer, integer, double precision, vector[], integer);
drop function if exists kb.search_vector(vector, integer, text[], text, text[], double precision,
    vector[]);
drop function if exists kb.search_lexical(text, integer, text[], text, text[]);
drop function if exists kb.expand_graph(bigint[], integer, integer, double precision, text[], text,
    text[]);
drop function if exists kb._search_vector(vector, integer, text[], text, text[], double precision,
    vector[], boolean, text[]);
drop function if exists kb._search_lexical(text, integer, text[], text, text[], bigint[], text[]);
drop function if exists kb._expand_graph(bigint[], integer, integer, double precision, text[],
    text, text[], text[]);
drop function if exists kb._bm25_rank(text[], double precision[], double precision, tsquery,
    bigint[], integer, text[], text, text[], boolean, text[]);
drop function if exists kb._bm25_rank_distributed(text[], double precision[], double precision,
    tsquery, bigint[], integer, text[], text, text[], boolean, bigint, tsquery, text[]);
drop function if exists kb._filtered_rows_estimate(text[], text, text[], text[], text);
drop function if exists kb._chunk_filter_sql(text, text, text, text, text, text[], text, text[],
    text[]);
create index if not exists documents_metadata_idx on kb.documents
    using gin (metadata jsonb_path_ops);
"""

# the previous package's `kbpg db upgrade` creates its own signatures again
DOWNGRADE = r"""
drop function if exists kb.search(text, vector, integer, text[], text, text[], double precision,
    integer, integer, integer, double precision, double precision, double precision, boolean,
    boolean, integer, integer, double precision, vector[], integer, jsonb, interval, text,
    double precision, text);
drop function if exists kb.search_vector(vector, integer, text[], text, text[], double precision,
    vector[], jsonb);
drop function if exists kb.search_lexical(text, integer, text[], text, text[], jsonb);
drop function if exists kb.expand_graph(bigint[], integer, integer, double precision, text[], text,
    text[], jsonb);
drop function if exists kb._search_vector(vector, integer, text[], text, text[], double precision,
    vector[], boolean, text[], jsonb);
drop function if exists kb._search_lexical(text, integer, text[], text, text[], bigint[], text[],
    jsonb);
drop function if exists kb._expand_graph(bigint[], integer, integer, double precision, text[],
    text, text[], text[], jsonb);
drop function if exists kb._bm25_rank(text[], double precision[], double precision, tsquery,
    bigint[], integer, text[], text, text[], boolean, text[], jsonb);
drop function if exists kb._bm25_rank_distributed(text[], double precision[], double precision,
    tsquery, bigint[], integer, text[], text, text[], boolean, bigint, tsquery, text[], jsonb);
drop function if exists kb._filtered_rows_estimate(text[], text, text[], text[], text, jsonb);
drop function if exists kb._chunk_filter_sql(text, text, text, text, text, text[], text, text[],
    text[], jsonb);
drop function if exists kb.fuse_convex(bigint[], double precision[], bigint[], double precision[],
    bigint[], double precision[], double precision, double precision, double precision);
drop function if exists kb.highlight(text, text, integer);
drop function if exists kb.facets(text, text[], text[], text, text[], jsonb, integer);
drop function if exists kb._highlight_ranges(text, text);
drop function if exists kb._metadata_holds(bigint, text);
drop function if exists kb._metadata_filter_sql(text, jsonb);
drop function if exists kb._metadata_match_sql(text, text);
drop function if exists kb._metadata_jsonpath(jsonb);
drop function if exists kb._metadata_predicate(jsonb, text, integer);
drop function if exists kb._metadata_condition(text, text, jsonb, text);
drop function if exists kb._metadata_comparison(text, text, jsonb, text);
drop function if exists kb._metadata_date(jsonb);
drop function if exists kb._metadata_literal(jsonb, text, text, text[]);
drop function if exists kb._metadata_key_path(text, text);
drop index if exists kb.documents_metadata_idx;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
