"""SQL internals renamed kb._*: the public API is what a reader role is granted.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

Signature change (CHANGELOG): the lexical arm's and the checks' helpers become kb._name
(kb.bm25_rank -> kb._bm25_rank, which now also returns the rank; kb.query_terms,
kb.tsquery_lexemes, kb.lexemes_tsquery, kb.chunk_filter_sql, kb.chunk_matches_filters,
kb.check_match_count, kb.check_fusion_parameters, kb.check_max_per_doc,
kb.check_query_embedding). The old signatures are dropped here (0.1.0's function file 040
dropped a pre-release kb.bm25_rank signature itself; that drop lives here now); the new
functions are created from sql/ at head. pgvector's `vector` is named unqualified: env.py puts
the extension's schema on this session's search_path. Downgrading drops the new helpers: the
previous package's `kbpg db upgrade` creates its own again.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# query_terms before tsquery_lexemes: its SQL-standard body depends on it
UPGRADE = """
drop function if exists kb.bm25_rank(text[], double precision[], double precision, tsquery,
                                     bigint[], integer, text[], text, text[]);
drop function if exists kb.bm25_rank(text[], double precision[], double precision, tsquery,
                                     bigint[], integer, text[], text, text[], boolean);
drop function if exists kb.query_terms(text);
drop function if exists kb.tsquery_lexemes(text);
drop function if exists kb.lexemes_tsquery(text[]);
drop function if exists kb.chunk_filter_sql(text, text, text, text, text[], text, text[]);
drop function if exists kb.chunk_matches_filters(text[], text, text[], text[], text, text[]);
drop function if exists kb.check_match_count(integer);
drop function if exists kb.check_fusion_parameters(integer, double precision, double precision,
                                                   double precision);
drop function if exists kb.check_max_per_doc(integer);
drop function if exists kb.check_query_embedding(vector);
"""

DOWNGRADE = """
drop function if exists kb._bm25_rank(text[], double precision[], double precision, tsquery,
                                      bigint[], integer, text[], text, text[], boolean);
drop function if exists kb._bm25_score(tsvector, integer, text[], double precision[],
                                       double precision);
drop function if exists kb._lexical_threshold(vector[], integer, integer, bigint,
    double precision, bigint, double precision, bigint, bigint, double precision, bigint,
    integer, double precision, boolean);
drop function if exists kb._lexical_candidates(integer[], varbit[], vector[], integer, bigint,
                                               double precision);
drop function if exists kb._query_terms(text);
drop function if exists kb._tsquery_lexemes(text);
drop function if exists kb._lexemes_tsquery(text[]);
drop function if exists kb._chunk_filter_sql(text, text, text, text, text[], text, text[]);
drop function if exists kb._chunk_matches_filters(text[], text, text[], text[], text, text[]);
drop function if exists kb._check_match_count(integer);
drop function if exists kb._check_fusion_parameters(integer, double precision, double precision,
                                                    double precision);
drop function if exists kb._check_max_per_doc(integer);
drop function if exists kb._check_query_embedding(vector);
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
