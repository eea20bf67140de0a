"""Readers read through SECURITY DEFINER functions only: no privilege on kb's tables; blank
group, label and category names are refused by the tables themselves.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

Row-level security was no boundary against a reader with psql: text equality and starts_with
are leakproof, so an index condition ran before the policy, and EXPLAIN ANALYZE's "Rows
Removed by Filter" counted the hidden rows it dropped (a hidden document's path came back in
421 probes); kb.lexeme_stats listed every word of the hidden chunks, kb.lexical_pending held
hidden chunk ids without any policy, and EXPLAIN on kb.access_grants found every granted role
and group. From here the reader role holds no privilege on any kb table, column or sequence:
it executes the reader API (kb.search and its arms, kb.list_documents, kb.get_document,
kb.get_chunk, kb.get_embedding_space, kb.stats, kb.list_grants, kb.access_status), which runs
with its owner's rights and applies the caller's grants itself (sql/015: the caller is the
SET ROLE role, else the login role). Writers and the owner keep table access; kb.language
(0012) a writer reads but no longer writes: only kb.set_language, the owner's, changes it,
re-analysing every chunk (an UPDATE alone left the chunks in the old language, the queries in
the new one). A reader learns the language from kb.stats().

Signature changes (CHANGELOG; internal functions only): the arms and their helpers take the
caller's visibility (kb._search_vector, kb._search_lexical, kb._bm25_rank, kb._chunk_filter_sql,
kb._filtered_rows_estimate gain `visible_groups`; the graph arm's body moves to
kb._expand_graph). The old signatures are dropped here, with kb.search_vector and
kb.search_lexical, whose SQL-standard bodies depend on them; the sql/ files at head create
every function again and _access_apply_grants revokes the reader's table privileges.
Downgrading drops what the files at head added: the previous package's `kbpg db upgrade`
creates its own functions and grants again.

Blank names: a group list holding "" (or " ") made ingest store no groups at all, i.e. a
public document, and `--group ""` stored {""}, readable by no one. Ingest refuses them now,
naming the file or line; these CHECK constraints refuse them for every other writer (SQL, table
sources). NOT VALID: rows stored before are not scanned (a 1M-chunk table would be read in the
migration) and stay as they are; `SELECT source FROM kb.documents WHERE NOT
kb._no_blank_names(groups)` finds them. kb._no_blank_names is frozen here: the constraints call
it.
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = """
drop function if exists kb.search_vector(vector, integer, text[], text, text[], double precision,
                                         vector[]);
drop function if exists kb.search_lexical(text, integer, text[], text, text[]);
drop function if exists kb._search_vector(vector, integer, text[], text, text[], double precision,
                                          vector[], boolean);
drop function if exists kb._search_lexical(text, integer, text[], text, text[], bigint[]);
drop function if exists kb._bm25_rank(text[], double precision[], double precision, tsquery,
                                      bigint[], integer, text[], text, text[], boolean);
drop function if exists kb._chunk_filter_sql(text, text, text, text, text[], text, text[]);
drop function if exists kb._filtered_rows_estimate(text, text[], text, text[]);

create function kb._no_blank_names(names text[]) returns boolean
language sql
immutable
parallel safe
set search_path = pg_catalog, pg_temp
return not exists (select 1 from pg_catalog.unnest(names) as n
                    where n is null or n operator(pg_catalog.~) '^[[:space:]]*$');
comment on function kb._no_blank_names(text[]) is
    'True unless a name in the list is NULL, empty or only white space (CHECK on groups, labels).';

alter table kb.documents
    add constraint documents_names_not_blank
    check (kb._no_blank_names(groups) and kb._no_blank_names(labels)
           and (category is null or category operator(pg_catalog.!~) '^[[:space:]]*$')) not valid;
alter table kb.chunks
    add constraint chunks_names_not_blank
    check (kb._no_blank_names(groups) and kb._no_blank_names(labels)
           and (category is null or category operator(pg_catalog.!~) '^[[:space:]]*$')) not valid;
"""

DOWNGRADE = """
alter table kb.chunks drop constraint chunks_names_not_blank;
alter table kb.documents drop constraint documents_names_not_blank;
drop function kb._no_blank_names(text[]);
-- SQL-standard bodies first: they depend on the functions dropped after them
drop function if exists kb.search_vector(vector, integer, text[], text, text[], double precision,
                                         vector[]);
drop function if exists kb.search_lexical(text, integer, text[], text, text[]);
drop function if exists kb.expand_graph(bigint[], integer, integer, double precision, text[], text,
                                        text[]);
drop function if exists kb.access_status();
drop function if exists kb.get_embedding_space();
drop function if exists kb.stats();
drop function if exists kb.list_documents(text);
drop function if exists kb.get_document(text[]);
drop function if exists kb.get_chunk(bigint);
drop function if exists kb._visible_to(text[], text[]);
drop function if exists kb._search_vector(vector, integer, text[], text, text[], double precision,
                                          vector[], boolean, text[]);
drop function if exists kb._search_lexical(text, integer, text[], text, text[], bigint[], text[]);
drop function if exists kb._bm25_rank(text[], double precision[], double precision, tsquery,
                                      bigint[], integer, text[], text, text[], boolean, text[]);
drop function if exists kb._expand_graph(bigint[], integer, integer, double precision, text[],
                                         text, text[], text[]);
drop function if exists kb._chunk_filter_sql(text, text, text, text, text, text[], text, text[],
                                             text[]);
drop function if exists kb._filtered_rows_estimate(text[], text, text[], text[], text);
drop function if exists kb._access_reader_api();
drop function if exists kb._access_visibility();
drop function if exists kb._access_groups_of(oid);
drop function if exists kb._access_reads_all_as(oid);
drop function if exists kb._access_caller();
-- kept, replaced by the previous package's files: callable by every role again, as they were
-- (kb.search's signature of this revision: a later revision's downgrade may have dropped it,
-- its package's files create it again)
do $do$
begin
    if pg_catalog.to_regprocedure('kb.search(text, vector, integer, text[], text, text[], '
            'double precision, integer, integer, integer, double precision, double precision, '
            'double precision, boolean, boolean, integer, integer, double precision, vector[], '
            'integer)') is not null then
        alter function kb.search(text, vector, integer, text[], text, text[], double precision,
                                 integer, integer, integer, double precision, double precision,
                                 double precision, boolean, boolean, integer, integer,
                                 double precision, vector[], integer)
            security invoker;
        grant execute on function kb.search(text, vector, integer, text[], text, text[],
                                            double precision, integer, integer, integer,
                                            double precision, double precision, double precision,
                                            boolean, boolean, integer, integer, double precision,
                                            vector[], integer) to public;
    end if;
end
$do$;
alter function kb.list_grants(text) security invoker;
grant execute on function kb.list_grants(text) to public;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
