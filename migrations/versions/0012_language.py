"""A language per knowledge base: chunks and queries analysed with its configuration, or `cjk`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

`kb.language` records the one language of the knowledge base: the name of a text search
configuration the server has (`english`, the default and what every existing database keeps;
`russian`, `simple`, a DBA's own such as `public.ru_unaccent`) or `cjk`. The chunk trigger
takes it as its argument, so the analysis costs no lookup per row and a change reaches every
writer at once (kb.set_language, sql/015, re-creates the trigger, re-analyses every chunk and
rebuilds the BM25 statistics and impact cache in the caller's transaction); the query side
reads the table (sql/035). For `english` the trigger computes exactly what 0010's did, so
nothing is re-analysed here.

`cjk`: text NFKC-normalised, runs of Han, Hiragana, Katakana and Hangul become overlapping
character bigrams (a run of one character stays itself), everything else is analysed as
`simple` words. Plain SQL on core PostgreSQL (pg_bigm, zhparser, pgroonga are extensions most
managed services lack); the same function analyses queries (each query word re-analysed).

What analyses stored text lives here, frozen: the trigger calls it, and changing it changes
every stored tsvector (a new analysis is a new revision that re-analyses the chunks). The old
trigger function (0010) is left as it was; the downgrade points the trigger back at it, and
refuses while the knowledge base is in another language than english.

Signature change (CHANGELOG): kb._query_terms(text) gains an `exclusion` tsquery (a CJK word
excluded with "-word" excludes chunks holding all its bigrams, not any one of them); the old
one is dropped here and the new one created from sql/ at head.
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# The scripts CJK analysis covers: Han (U+3400-4DBF, 4E00-9FFF, F900-FAFF, 20000-3134F, and
# 々〆〇 U+3005-3007), Hiragana and Katakana (U+3041-30FF but the middle dot U+30FB, which
# separates names like punctuation), Hangul syllables (U+AC00-D7AF). Punctuation, digits,
# Latin and every other script fall outside and are analysed as `simple` words.
CJK_CLASS = (
    r"[\u3005-\u3007\u3041-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
    r"\uf900-\ufaff\U00020000-\U0003134f]"
)

UPGRADE = rf"""
create table kb.language (
    singleton  boolean primary key default true check (singleton),
    name       text not null default 'english' check (name <> ''),
    changed_at timestamptz not null default now()
);
comment on table kb.language is
    'The knowledge base''s language: the text search configuration (or cjk) that analyses its '
    'chunks and its queries alike. Changed only by kb.set_language(), which re-analyses every '
    'chunk; the chunk trigger carries the same name as its argument.';
insert into kb.language default values;

create function kb._cjk_tsvector(body text) returns tsvector
language sql
immutable
strict
parallel safe
set search_path = pg_catalog, pg_temp
begin atomic
    -- each run's bigrams at even offsets, then those at odd offsets (BM25 reads no order from a
    -- tsvector, only each lexeme's count); a run of one or two characters is its own lexeme
    select pg_catalog.to_tsvector('pg_catalog.simple'::pg_catalog.regconfig,
               pg_catalog.regexp_replace(n.t, '{CJK_CLASS}+', ' ', 'g')
               || ' '
               || coalesce((select pg_catalog.string_agg(
                                case when pg_catalog.length(m.r[1]) < 3 then m.r[1]
                                     else pg_catalog.regexp_replace(
                                              case when pg_catalog.length(m.r[1]) % 2 = 1
                                                   then pg_catalog.left(m.r[1], -1) else m.r[1] end,
                                              '(..)', '\1 ', 'g')
                                          || ' '
                                          || pg_catalog.regexp_replace(
                                              case when pg_catalog.length(m.r[1]) % 2 = 0
                                                   then pg_catalog.substr(m.r[1], 2, pg_catalog.length(m.r[1]) - 2)
                                                   else pg_catalog.substr(m.r[1], 2) end,
                                              '(..)', '\1 ', 'g') end, ' ')
                              from pg_catalog.regexp_matches(n.t, '{CJK_CLASS}+', 'g') as m(r)),
                           ''))
      from (select pg_catalog.normalize(body, 'NFKC') as t) as n;
end;
comment on function kb._cjk_tsvector(text) is
    'The cjk analysis of a text: NFKC, runs of Han, Kana and Hangul as overlapping character '
    'bigrams (one character alone as itself), the rest as simple words.';

create function kb._language_tsvector(language text, body text) returns tsvector
language sql
stable
parallel safe
set search_path = pg_catalog, pg_temp
begin atomic
    select case when language = 'cjk' then kb._cjk_tsvector(coalesce(body, ''))
                else pg_catalog.to_tsvector(language::pg_catalog.regconfig, coalesce(body, ''))
           end;
end;
comment on function kb._language_tsvector(text, text) is
    'A text analysed in the given language (a text search configuration, or cjk).';

create function kb._chunks_text_search_language() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    -- the knowledge base's language (kb.language), kept as the trigger's argument by
    -- kb.set_language: no lookup per row, and no writer can use a stale one
    config constant regconfig := case when tg_argv[0] <> 'cjk' then tg_argv[0]::regconfig end;
begin
    if tg_op = 'UPDATE'
       and new.section is not distinct from old.section
       and new.content is not distinct from old.content
       and new.context is not distinct from old.context
       and new.tsv is not distinct from old.tsv
       and new.token_count is not distinct from old.token_count then
        return new;  -- e.g. a new embedding: the text, and so its tsvector, is unchanged
    end if;
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

create or replace trigger chunks_text_search before insert or update on kb.chunks
    for each row execute function kb._chunks_text_search_language('english');

drop function if exists kb._query_terms(text);
"""

DOWNGRADE = """
do $$
begin
    if (select l.name from kb.language l) <> 'english' then
        raise exception 'this knowledge base is in %: revision 0011 analyses english only',
                (select l.name from kb.language l)
            using errcode = '55000',
                  hint = 'run select kb.set_language(''english''); first (it re-analyses every chunk)';
    end if;
end
$$;
create or replace trigger chunks_text_search before insert or update on kb.chunks
    for each row execute function kb._chunks_text_search();
-- the functions sql/ created on them (the previous package's `kbpg db upgrade` creates its own)
drop function if exists kb.set_language(text);
drop function if exists kb._language_change_begin(text);
drop function if exists kb._language_reanalyse(integer);
drop function if exists kb._language_change_finish();
drop function if exists kb._check_language_change();
drop function if exists kb.text_tsvector(text, text);
drop function if exists kb._resolve_language(text);
drop function if exists kb.languages();
drop function if exists kb._query_terms(text);
drop function if exists kb._cjk_exclusion(text[], boolean);
drop function if exists kb._cjk_lexemes(text[]);
drop function if exists kb._lexemes_all_tsquery(text[]);
drop function kb._chunks_text_search_language();
drop function kb._language_tsvector(text, text);
drop function kb._cjk_tsvector(text);
drop table kb.language;
"""


def _run(statements: str) -> None:
    # `%` is SQL here (modulo, RAISE's placeholders), not a driver parameter
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(statements)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
