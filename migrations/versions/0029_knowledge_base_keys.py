"""Knowledge bases, step two: every key that names a thing of one knowledge base holds kb_id.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-04

Issue 39 (docs/knowledge-bases-design.md). A document's source, a lexeme's statistics, an impact
block, a filter mask or value cache, an indexed metadata key, a table source's name and a grant
are unique within their knowledge base, not the database; the singletons (embedding space,
corpus statistics, lexical state, access settings, language) become one row per knowledge base.
Keys on global ids (documents, chunks, caches and sources by id) are unchanged. The statistics
triggers of revision 0001 are created again with `on conflict (kb_id, lexeme)`.

On a distributed database (kbpg db distribute) the distributed and reference tables keep their
keys (a key of a distributed table must hold its distribution column; the layout serves the
knowledge base `default` only, docs/citus.md); the coordinator's own tables are re-keyed.
"""

from __future__ import annotations

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

# (table, constraint, its columns today): each becomes (kb_id, columns)
KEYS = [
    ("embedding_space", "embedding_space_pkey", "primary key", "singleton"),
    ("corpus_stats", "corpus_stats_pkey", "primary key", "singleton"),
    ("lexical_state", "lexical_state_pkey", "primary key", "singleton"),
    ("access_settings", "access_settings_pkey", "primary key", "singleton"),
    ("language", "language_pkey", "primary key", "singleton"),
    ("documents", "documents_source_key", "unique", "source"),
    ("lexeme_stats", "lexeme_stats_pkey", "primary key", "lexeme"),
    ("lexical_blocks", "lexical_blocks_pkey", "primary key", "lexeme, block_no, groups"),
    ("lexical_dirty_blocks", "lexical_dirty_blocks_pkey", "primary key", "block_no"),
    ("access_grants", "access_grants_pkey", "primary key", "role_id, group_name"),
    ("table_sources", "table_sources_name_key", "unique", "name"),
    (
        "lexical_filter_masks",
        "lexical_filter_masks_pkey",
        "primary key",
        "filter_kind, value, block_no",
    ),
    (
        "lexical_filter_caches",
        "lexical_filter_caches_filter_kind_value_key",
        "unique",
        "filter_kind, value",
    ),
    ("indexed_metadata_keys", "indexed_metadata_keys_pkey", "primary key", "key"),
]


def _rekey(with_kb: bool) -> str:
    """One DO block: each constraint of KEYS replaced, with kb_id in front or without it; a
    table Citus distributed (or holds on every node) and a constraint that is not there (the
    distributed layout drops some) are left alone."""
    statements = []
    for table, name, kind, columns in KEYS:
        new = f"kb_id, {columns}" if with_kb else columns
        statements.append(
            f"""
    if pg_catalog.to_regclass('kb_data.{table}') is not null
       and not kb._citus_table('kb_data.{table}')
       and exists (select 1 from pg_catalog.pg_constraint
                    where conrelid = 'kb_data.{table}'::pg_catalog.regclass and conname = '{name}')
    then
        alter table kb_data.{table} drop constraint {name}, add constraint {name} {kind} ({new});
    end if;"""
        )
    return "do $$\nbegin" + "".join(statements) + "\nend\n$$;\n"


CITUS_TABLE = r"""
create or replace function kb._citus_table(relation regclass)
returns boolean
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    found boolean := false;
begin
    if pg_catalog.to_regclass('pg_catalog.pg_dist_partition') is not null then
        execute 'select exists (select 1 from pg_catalog.pg_dist_partition p
                                 where p.logicalrelid operator(pg_catalog.=) $1)'
           into found using relation;
    end if;
    return found;
end
$$;
comment on function kb._citus_table(regclass) is
    'Whether Citus distributes the table (or holds it on every node): its keys stay as they are.';
"""

# Revision 0001's statistics triggers, the same but for the conflict target (the statement's
# rows are the writer's knowledge base, which the views and the column default name)
STATISTICS_TRIGGERS = r"""
create or replace function kb.chunks_stats_after_insert() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, pg_temp
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
    on conflict ({target}) do update set doc_freq = s.doc_freq + excluded.doc_freq;
    return null;
end $$;

create or replace function kb.chunks_stats_after_update() returns trigger
language plpgsql security invoker
set search_path = pg_catalog, pg_temp
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
    on conflict ({target}) do update set doc_freq = s.doc_freq + excluded.doc_freq;
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
"""

UPGRADE = CITUS_TABLE + _rekey(True) + STATISTICS_TRIGGERS.replace("{target}", "kb_id, lexeme")

DOWNGRADE = (
    r"""
do $$
begin
    if exists (select 1 from kb_data.knowledge_bases where id <> 1) then
        raise exception 'this database holds knowledge bases besides default'
            using hint = 'drop them (kbpg kb drop NAME) before downgrading below revision 0029';
    end if;
end
$$;
"""
    + STATISTICS_TRIGGERS.replace("{target}", "lexeme")
    + _rekey(False)
    + "drop function kb._citus_table(regclass);\n"
)


def _run(statements: str) -> None:
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(statements)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
