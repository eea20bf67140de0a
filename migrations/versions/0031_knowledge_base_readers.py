"""Knowledge bases, step four: which readers may read each one.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-04

Issue 39 (docs/knowledge-bases.md, "Who reads which knowledge base"). A reader selects its
knowledge base with a setting anyone may SET (kbpg.kb_id): while access control is enforced,
every function of the reader API now first asks kb._access_admits whether the caller may read
it at all. `readers` says who may: 'all' (every reader role reads its chunks without groups,
and those of its groups: what default always did) or 'granted' (only roles holding a group
grant in it). The knowledge bases that exist keep 'all', so no reader loses what it read;
new ones start 'granted'. kb.knowledge_bases() gains the column (its result type changes: it
is dropped here and made again from sql/).
"""

from __future__ import annotations

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

UPGRADE = """
alter table kb_data.knowledge_bases
    add column readers text not null default 'all' check (readers in ('all', 'granted'));
alter table kb_data.knowledge_bases alter column readers set default 'granted';
comment on column kb_data.knowledge_bases.readers is
    'Who reads it while access control is enforced: all reader roles, or those granted a group in it.';
drop function if exists kb.knowledge_bases();
drop function if exists kb._knowledge_base_row(integer);
"""
# revision 0030's functions again: those of sql/ that name the column go, or read no column
DOWNGRADE = (
    """
drop function if exists kb.set_knowledge_base_readers(text, text);
drop function if exists kb.knowledge_bases();
drop function if exists kb._knowledge_base_row(integer);
create or replace function kb._access_admits(knowledge_base integer, caller oid)
returns boolean
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select exists (select 1 from kb_data.knowledge_bases k where k.id = knowledge_base) $$;
alter table kb_data.knowledge_bases drop column readers;
"""
    + r"""
create or replace function kb._knowledge_base_row(knowledge_base integer)
returns table (name text, language text, model text, dimension integer, documents bigint,
               chunks bigint, created_at timestamptz)
language plpgsql
volatile  -- (reads only; it selects the knowledge base for its statement)
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    caller_kb constant text := pg_catalog.current_setting('kbpg.kb_id', true);
begin
    -- through the views, as a search in it reads them: the same on a distributed database,
    -- whose statistics are views over the shards' (kbpg db distribute)
    perform pg_catalog.set_config('kbpg.kb_id', knowledge_base::text, true);
    return query
    select k.name, (select l.name from kb.language l), e.model, e.dimension,
           (select pg_catalog.count(*) from kb.documents),
           coalesce((select s.chunk_count from kb.corpus_stats s), 0), k.created_at
      from kb_data.knowledge_bases k left join kb.embedding_space e on true
     where k.id = knowledge_base;
    perform pg_catalog.set_config('kbpg.kb_id', coalesce(caller_kb, ''), true);
end
$$;
comment on function kb._knowledge_base_row(integer) is
    'One row of kb.knowledge_bases(), of the knowledge base with this id. Internal.';

create or replace function kb.knowledge_bases()
returns table (name text, language text, model text, dimension integer, documents bigint,
               chunks bigint, created_at timestamptz)
language sql
volatile  -- (reads only; kb._knowledge_base_row selects each knowledge base in turn)
security invoker
set search_path = pg_catalog, pg_temp
as $$
    select r.* from kb_data.knowledge_bases b
     cross join lateral kb._knowledge_base_row(b.id) r
     order by b.id
$$;
comment on function kb.knowledge_bases() is
    'The knowledge bases of this database, default first: name, language, embedding model and '
    'dimension (NULL before the first vector), documents, chunks, when created.';
"""
)


def _run(statements: str) -> None:
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(statements)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
