"""Application tables as sources: their definitions, the change queue, claims and parked rows.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

`kb.add_table_source` (sql/090-table-sources.sql) records a source in kb.table_sources and puts
row triggers on the application's table; they only add (source, key, op) to kb.source_queue,
one row per key however often it changes (the primary key dedupes: the queue never holds more
than the table's rows). A `kbpg sync` worker moves entries to kb.source_claims (its session
holds an advisory lock named by `worker`: a claim whose worker is gone goes back to the
queue), writes the rows' documents and drops the claims; a row that cannot be ingested is
parked in kb.source_errors and retried with backoff.

No foreign keys point from the queue to kb.table_sources: checking one would lock the
source's row from every application write. The trigger functions live in sql/090 (no trigger
is created here); the downgrade drops them with CASCADE, which removes the triggers from the
application's tables whoever owns them.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = r"""
create table kb.table_sources (
    id                  integer generated always as identity primary key,
    name                text not null unique
                        check (name operator(pg_catalog.~) '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}$'),
    relation            pg_catalog.regclass not null,
    key_columns         text[] not null
                        check (pg_catalog.cardinality(key_columns) between 1 and 8),
    text_column         text not null,
    title_column        text,
    groups_column       text,
    category_column     text,
    labels_column       text,
    metadata_columns    text[] not null default '{}'
                        check (pg_catalog.cardinality(metadata_columns) <= 50),
    notify              boolean not null default true,
    version             integer not null default 1 check (version >= 1),
    created_at          timestamptz not null default pg_catalog.now(),
    altered_at          timestamptz not null default pg_catalog.now(),
    backfill_state      text not null default 'pending'
                        check (backfill_state in ('pending', 'running', 'done')),
    backfill_cursor     text[],
    backfill_total      bigint,
    backfill_enqueued   bigint not null default 0,
    backfill_started_at timestamptz,
    backfill_done_at    timestamptz
);
comment on table kb.table_sources is
    'Application tables whose rows kbpg keeps as documents (kb.add_table_source): the columns '
    'read, and where the backfill of the rows that existed before the source stands.';

-- Written by every change of a source's table, so as cheap as it can be: one index (the
-- dedupe), keys compared bytewise (collation "C"). Claims sort by enqueued_at without an index:
-- the queue is short while a worker runs; after a long outage a claim sorts the backlog (about
-- 0.1 s for a million entries), which costs the worker, never the application.
create table kb.source_queue (
    source_id   integer not null,
    key         text[] collate "C" not null,
    op          "char" not null check (op in ('I', 'U', 'D', 'T', 'B', 'R', 'S')),
    enqueued_at timestamptz not null default pg_catalog.now(),
    primary key (source_id, key)
);
comment on table kb.source_queue is
    'Rows of table sources to (re)read: one entry per key until a worker claims it. op is the '
    'first change since: I insert, U update, D delete, B backfill, R retry; T (truncate) and S '
    '(resync) carry the empty key and delete the documents of rows that are gone.';

create table kb.source_claims (
    source_id   integer not null,
    key         text[] collate "C" not null,
    op          "char" not null,
    enqueued_at timestamptz not null,
    worker      integer not null,
    claimed_at  timestamptz not null default pg_catalog.now(),
    primary key (source_id, key)
);
create index source_claims_worker on kb.source_claims (worker);
comment on table kb.source_claims is
    'Queue entries a kbpg sync worker is processing; `worker` names the session advisory lock '
    'the worker holds: a claim whose lock is free goes back to the queue.';

create table kb.source_errors (
    source_id       integer not null,
    key             text[] collate "C" not null,
    error           text not null,
    attempts        integer not null default 1 check (attempts >= 1),
    first_failed_at timestamptz not null default pg_catalog.now(),
    last_failed_at  timestamptz not null default pg_catalog.now(),
    retry_at        timestamptz not null,
    primary key (source_id, key)
);
create index source_errors_retry on kb.source_errors (retry_at);
comment on table kb.source_errors is
    'Rows of table sources that could not be ingested, with the reason; retried at retry_at '
    '(backoff doubling from 30 s to 1 h), and at once when the row changes again.';
"""

DOWNGRADE = r"""
-- sql/090-table-sources.sql's functions (CASCADE: the triggers on application tables go with
-- kb._source_enqueue, whoever owns the tables)
do $$
declare
    f regprocedure;
begin
    for f in select p.oid::regprocedure from pg_catalog.pg_proc p
              where p.pronamespace = 'kb'::regnamespace
                and (pg_catalog.starts_with(p.proname, '_source_') or p.proname in (
                     'add_table_source', 'alter_table_source', 'remove_table_source',
                     'resync_table_source', 'list_table_sources', 'list_source_errors',
                     'retry_source_errors'))
    loop
        -- (one dropped already goes with an earlier one whose SQL body called it)
        if exists (select 1 from pg_catalog.pg_proc p where p.oid = f) then
            execute 'drop function ' || f::text || ' cascade';
        end if;
    end loop;
end
$$;
drop table kb.source_errors;
drop table kb.source_claims;
drop table kb.source_queue;
drop table kb.table_sources;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
