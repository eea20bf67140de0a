"""The table sources' queue is a log: no key index, a worker takes each key once.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04

Issue 38: a 50,000-row UPDATE of a source table cost 2.9x the same statement without a source
(vacuumed tables, paired), and its queue INSERT was more than half of that: each row's
SHA-256 through an SQL function (the generated key_hash: immutable in name, stable in body, so
never inlined), a speculative insertion into the (source_id, key_hash) primary key and its
confirmation. The dedupe it paid for happens later, once per batch, where it costs the worker
instead of the application: kb._source_claim takes a key once however many entries it has (the
earliest's op and time), and puts back what another worker claimed at the same moment. Without
the index the same UPDATE costs 1.8x. The queue now holds an entry per changing statement per
row until a worker runs (about 60 bytes each), not one per key.

kb._source_claim (whose body names key_hash) is dropped here and created again by sql/090 at
head. The downgrade keeps each key's earliest entry and puts the key and index back (the sql/090
functions of this revision work on either layout; their INSERTs keep ON CONFLICT DO NOTHING).
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

UPGRADE = r"""
drop function if exists kb._source_claim(integer, integer[], integer);
alter table kb.source_queue drop column key_hash;
comment on table kb.source_queue is
    'Rows of table sources to (re)read: an entry per change (per statement and row) until a '
    'worker claims the key, which it takes once with its earliest op. op: I insert, U update, '
    'D delete, B backfill, R retry; T (truncate) and S (resync) carry the empty key and delete '
    'the documents of rows that are gone.';
"""

DOWNGRADE = r"""
delete from kb.source_queue
 where ctid in (select d.ctid
                  from (select q.ctid, pg_catalog.row_number() over (
                                   partition by q.source_id, q.key order by q.enqueued_at, q.ctid) as n
                          from kb.source_queue q) d
                 where d.n > 1);
alter table kb.source_queue
    add column key_hash bytea not null generated always as (kb._source_key_hash(key)) stored,
    add primary key (source_id, key_hash);
comment on column kb.source_queue.key_hash is
    'SHA-256 of key (kb._source_key_hash): the primary key''s, so that any key fits it.';
comment on table kb.source_queue is
    'Rows of table sources to (re)read: one entry per key until a worker claims it. op is the '
    'first change since: I insert, U update, D delete, B backfill, R retry; T (truncate) and S '
    '(resync) carry the empty key and delete the documents of rows that are gone.';
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
