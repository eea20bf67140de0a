"""Knowledge bases, step three: each knowledge base's chunks analysed in its own language.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-04

Issue 39 (docs/knowledge-bases-design.md). The chunk trigger of revision 0012 carries the
language as its argument (no lookup per row). It stays default's; a row of another knowledge
base reads its language from kb_data.language (one index probe per row written). A language
change locks the writers of kb_data.chunks either way, so no writer analyses in a stale one.
"""

from __future__ import annotations

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def _text_search_trigger(language: str) -> str:
    """Revision 0012's trigger function, with `language` the statements setting the row's."""
    return (
        r"""
create or replace function kb._chunks_text_search_language() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    language text;
    config regconfig;
begin
    if tg_op = 'UPDATE'
       and new.section is not distinct from old.section
       and new.content is not distinct from old.content
       and new.context is not distinct from old.context
       and new.tsv is not distinct from old.tsv
       and new.token_count is not distinct from old.token_count then
        return new;  -- e.g. a new embedding: the text, and so its tsvector, is unchanged
    end if;
    """
        + language
        + r"""
    config := case when language <> 'cjk' then language::regconfig end;
    if config is null then
        new.tsv := pg_catalog.setweight(kb._cjk_tsvector(new.section), 'A')
                || pg_catalog.setweight(kb._cjk_tsvector(new.content), 'B')
                || pg_catalog.setweight(kb._cjk_tsvector(coalesce(new.context, '')), 'C');
    else
        new.tsv := pg_catalog.setweight(pg_catalog.to_tsvector(config, new.section), 'A')
                || pg_catalog.setweight(pg_catalog.to_tsvector(config, new.content), 'B')
                || pg_catalog.setweight(pg_catalog.to_tsvector(config, coalesce(new.context, '')), 'C');
    end if;
    new.token_count := kb.tsvector_token_count(new.tsv);
    return new;
end
$$;
"""
    )


# default's language is the trigger's argument (kept by kb.set_language); another knowledge
# base's is its row of kb_data.language
# (two statements: PL/pgSQL plans each when it first runs, so a Citus worker, which has no
# kb_data.language, never plans the lookup for default's rows)
UPGRADE = _text_search_trigger(
    "if new.kb_id operator(pg_catalog.=) 1 then\n"
    "        language := tg_argv[0];\n"
    "    else\n"
    "        select l.name into language from kb_data.language l\n"
    "         where l.kb_id operator(pg_catalog.=) new.kb_id;\n"
    "    end if;"
)
DOWNGRADE = r"""
do $$
begin
    if exists (select 1 from kb_data.knowledge_bases where id <> 1) then
        raise exception 'this database holds knowledge bases besides default'
            using hint = 'drop them (kbpg kb drop NAME) before downgrading below revision 0030';
    end if;
end
$$;
""" + _text_search_trigger("language := tg_argv[0];")


def _run(statements: str) -> None:
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(statements)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
