"""Table sources' queue, claims and parked rows keyed by the hash of a row's key.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01

0014 keyed kb.source_queue, kb.source_claims and kb.source_errors by (source_id, key), key the
row's key as text[]. A btree entry holds at most 2,704 bytes: a key the application's own
unique index holds (up to about 2,700 bytes after compression, a numeric whose text is twice
its binary size, a composite key) could fail to fit the queue's entry, which carries the source
id and an array header besides, and the trigger then failed the application's INSERT or UPDATE.
From here the three tables are keyed by (source_id, key_hash), key_hash the key's SHA-256
(kb._source_key_hash, a stored generated column: every writer of the tables, the triggers
included, gets it without computing it); the key stays beside it, unindexed. The dedupe of
repeated changes (ON CONFLICT on the primary key), SKIP LOCKED claims and their order
(enqueued_at) are as they were.

kb._source_key_hash is created here (the generated columns need it) and again, the same, by
sql/090 at head. The downgrade puts the 0014 keys back (it fails if a key too long for them is
queued, claimed or parked); the sql/090 functions that read key_hash go with the column (the
previous package's `kbpg db upgrade` creates its own).
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TABLES = ("source_queue", "source_claims", "source_errors")

KEY_HASH = r"""
create or replace function kb._source_key_hash(key text[])
returns bytea
language sql
immutable
parallel safe
strict
security invoker
set search_path = pg_catalog, pg_temp
return pg_catalog.sha256(pg_catalog.convert_to(key::text, 'UTF8'));
"""

UPGRADE = KEY_HASH + "\n".join(
    f"""
alter table kb.{table} drop constraint {table}_pkey,
    add column key_hash bytea not null generated always as (kb._source_key_hash(key)) stored,
    add primary key (source_id, key_hash);
comment on column kb.{table}.key_hash is
    'SHA-256 of key (kb._source_key_hash): the primary key''s, so that any key fits it.';"""
    for table in TABLES
)

DOWNGRADE = (
    "\n".join(
        f"""
alter table kb.{table} drop column key_hash cascade;
alter table kb.{table} add primary key (source_id, key);"""
        for table in TABLES
    )
    + "\ndrop function kb._source_key_hash(text[]) cascade;\n"
)


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
