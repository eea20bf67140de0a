"""A chunk's tsvector is computed once per row, by a trigger, instead of twice by generated columns.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30

The generated columns `tsv` and `token_count` each ran the text search parser over the section,
content and context (a generated column cannot use another): two thirds of PostgreSQL's time in a
bulk load. They become plain columns (ALTER COLUMN ... DROP EXPRESSION keeps every value and
rewrites nothing), and a BEFORE INSERT OR UPDATE trigger sets both from one to_tsvector, with the
same expression as revision 0008; an update that leaves the text (and tsv, token_count) as they
were keeps them without parsing again. Whatever a row is given for tsv or token_count is
replaced, as a generated column's would be. The downgrade re-creates 0008's generated columns.
The trigger function lives here, frozen, because the trigger created here calls it.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UPGRADE = """
alter table kb.chunks alter column tsv drop expression, alter column token_count drop expression;

create function kb._chunks_text_search() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'UPDATE'
       and new.section is not distinct from old.section
       and new.content is not distinct from old.content
       and new.context is not distinct from old.context
       and new.tsv is not distinct from old.tsv
       and new.token_count is not distinct from old.token_count then
        return new;  -- e.g. a new embedding: the text, and so its tsvector, is unchanged
    end if;
    new.tsv := pg_catalog.setweight(
                   pg_catalog.to_tsvector('english'::pg_catalog.regconfig, new.section), 'A')
            || pg_catalog.setweight(
                   pg_catalog.to_tsvector('english'::pg_catalog.regconfig, new.content), 'B')
            || pg_catalog.setweight(
                   pg_catalog.to_tsvector('english'::pg_catalog.regconfig,
                                          coalesce(new.context, '')), 'C');
    new.token_count := kb.tsvector_token_count(new.tsv);
    return new;
end
$$;

create trigger chunks_text_search before insert or update on kb.chunks
    for each row execute function kb._chunks_text_search();
"""

_TEXT = (
    "pg_catalog.setweight(pg_catalog.to_tsvector('english'::pg_catalog.regconfig, section), 'A') "
    "|| pg_catalog.setweight(pg_catalog.to_tsvector('english'::pg_catalog.regconfig, content), 'B')"
    " || pg_catalog.setweight(pg_catalog.to_tsvector('english'::pg_catalog.regconfig,"
    " coalesce(context, '')), 'C')"
)

DOWNGRADE = f"""
drop trigger chunks_text_search on kb.chunks;
drop function kb._chunks_text_search();
alter table kb.chunks drop column tsv, drop column token_count;
alter table kb.chunks
    add column tsv tsvector generated always as ({_TEXT}) stored,
    add column token_count integer generated always as (kb.tsvector_token_count({_TEXT})) stored;
create index chunks_tsv_gin on kb.chunks using gin (tsv);
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
