"""Schema kb: documents, chunks, edges, embedding space, BM25 statistics.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

The HNSW index is not created here: its dimension is the embedding space's, which is known
only when the first model registers (kb.set_embedding_space creates it then).
Trigger functions live in this revision, frozen, because the triggers created here call them.
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = r"""
create extension if not exists vector;
create schema if not exists kb;

create table kb.embedding_space (
    singleton  boolean primary key default true check (singleton),
    model      text not null check (model <> ''),
    dimension  integer not null check (dimension between 1 and 16000),
    distance   text not null default 'cosine' check (distance = 'cosine'),
    created_at timestamptz not null default now()
);
comment on table kb.embedding_space is
    'The one embedding model whose vectors kb.chunks holds; other models are refused.';

create table kb.documents (
    id           bigint generated always as identity primary key,
    source       text not null unique check (source <> ''),
    title        text not null default '',
    category     text,
    groups       text[] not null default '{}',
    labels       text[] not null default '{}',
    metadata     jsonb not null default '{}',
    content_hash text not null,
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now()
);
create index documents_groups_gin on kb.documents using gin (groups);
create index documents_category on kb.documents (category);

-- Total token count of a tsvector (sum of positions), the document length BM25 needs.
-- length(tsvector) counts distinct lexemes, not tokens.
create function kb.tsvector_token_count(doc tsvector) returns integer
language sql immutable strict parallel safe
set search_path = pg_catalog
return coalesce((select sum(coalesce(array_length(u.positions, 1), 1))::integer
                 from pg_catalog.unnest(doc) as u), 0);

create table kb.chunks (
    id          bigint generated always as identity primary key,
    document_id bigint not null references kb.documents (id) on delete cascade,
    ordinal     integer not null check (ordinal >= 0),
    section     text not null default '',
    content     text not null,
    -- filter columns copied from the document so every arm filters inside its own scan
    groups      text[] not null default '{}',
    category    text,
    labels      text[] not null default '{}',
    embedding   vector,
    tsv         tsvector generated always as (
                    setweight(to_tsvector('english'::regconfig, section), 'A')
                    || setweight(to_tsvector('english'::regconfig, content), 'B')) stored,
    token_count integer generated always as (kb.tsvector_token_count(
                    setweight(to_tsvector('english'::regconfig, section), 'A')
                    || setweight(to_tsvector('english'::regconfig, content), 'B'))) stored,
    unique (document_id, ordinal)
);
create index chunks_tsv_gin on kb.chunks using gin (tsv);
create index chunks_groups_gin on kb.chunks using gin (groups);
create index chunks_labels_gin on kb.chunks using gin (labels);
create index chunks_category on kb.chunks (category);

create table kb.edges (
    src_chunk_id bigint not null references kb.chunks (id) on delete cascade,
    dst_chunk_id bigint not null references kb.chunks (id) on delete cascade,
    relation     text not null check (relation <> ''),
    weight       real not null check (weight >= 0 and weight <= 1),
    primary key (src_chunk_id, dst_chunk_id, relation),
    check (src_chunk_id <> dst_chunk_id)
);
create index edges_dst on kb.edges (dst_chunk_id);

-- BM25 statistics, kept exact by the triggers below for every writer (COPY, INSERT,
-- cascaded deletes), not only by kbpg's own ingest.
create table kb.corpus_stats (
    singleton    boolean primary key default true check (singleton),
    chunk_count  bigint not null default 0 check (chunk_count >= 0),
    total_tokens bigint not null default 0 check (total_tokens >= 0)
);
insert into kb.corpus_stats default values;

create table kb.lexeme_stats (
    lexeme   text primary key,
    doc_freq integer not null check (doc_freq >= 0)
);

create function kb.chunks_stats_after_insert() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, kb
as $$
begin
    update kb.corpus_stats
       set chunk_count = chunk_count + d.n, total_tokens = total_tokens + d.t
      from (select count(*) as n, coalesce(sum(token_count), 0) as t from new_rows) d;
    insert into kb.lexeme_stats as s (lexeme, doc_freq)
    select l, count(*)::integer
      from new_rows, unnest(tsvector_to_array(new_rows.tsv)) as l
     group by l
     order by l
    on conflict (lexeme) do update set doc_freq = s.doc_freq + excluded.doc_freq;
    return null;
end $$;

create function kb.chunks_stats_after_delete() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, kb
as $$
declare
    lowered text[];
begin
    update kb.corpus_stats
       set chunk_count = chunk_count - d.n, total_tokens = total_tokens - d.t
      from (select count(*) as n, coalesce(sum(token_count), 0) as t from old_rows) d;
    with gone as (
        select l, count(*)::integer as n
          from old_rows, unnest(tsvector_to_array(old_rows.tsv)) as l
         group by l
    ), upd as (
        update kb.lexeme_stats s set doc_freq = s.doc_freq - gone.n
          from gone where s.lexeme = gone.l
        returning s.lexeme, s.doc_freq
    )
    select array_agg(lexeme) filter (where doc_freq <= 0) into lowered from upd;
    delete from kb.lexeme_stats where lexeme = any (lowered);
    return null;
end $$;

create function kb.chunks_stats_after_update() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, kb
as $$
declare
    lowered text[];
begin
    -- Only rows whose lexemes changed matter (re-embedding updates no text).
    if not exists (select 1 from old_rows o join new_rows n on n.id = o.id
                    where o.tsv is distinct from n.tsv) then
        return null;
    end if;
    update kb.corpus_stats
       set total_tokens = total_tokens
           - (select coalesce(sum(token_count), 0) from old_rows)
           + (select coalesce(sum(token_count), 0) from new_rows);
    insert into kb.lexeme_stats as s (lexeme, doc_freq)
    select l, sum(n)::integer from (
        select l, 1 as n from new_rows, unnest(tsvector_to_array(new_rows.tsv)) as l
        union all
        select l, -1 from old_rows, unnest(tsvector_to_array(old_rows.tsv)) as l
    ) x group by l having sum(n) > 0
    order by l
    on conflict (lexeme) do update set doc_freq = s.doc_freq + excluded.doc_freq;
    with delta as (
        select l, sum(n)::integer as n from (
            select l, 1 as n from new_rows, unnest(tsvector_to_array(new_rows.tsv)) as l
            union all
            select l, -1 from old_rows, unnest(tsvector_to_array(old_rows.tsv)) as l
        ) x group by l having sum(n) < 0
    ), upd as (
        update kb.lexeme_stats s set doc_freq = s.doc_freq + delta.n
          from delta where s.lexeme = delta.l
        returning s.lexeme, s.doc_freq
    )
    select array_agg(lexeme) filter (where doc_freq <= 0) into lowered from upd;
    delete from kb.lexeme_stats where lexeme = any (lowered);
    return null;
end $$;

create trigger chunks_stats_insert after insert on kb.chunks
    referencing new table as new_rows
    for each statement execute function kb.chunks_stats_after_insert();
create trigger chunks_stats_delete after delete on kb.chunks
    referencing old table as old_rows
    for each statement execute function kb.chunks_stats_after_delete();
create trigger chunks_stats_update after update on kb.chunks
    referencing old table as old_rows new table as new_rows
    for each statement execute function kb.chunks_stats_after_update();
"""

DOWNGRADE = r"""
drop schema if exists kb cascade;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
