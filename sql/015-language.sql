-- kbpg: the knowledge base's language — the text search configuration (or `cjk`) that analyses
-- its chunks (the trigger of revision 0012) and its queries (kb._query_terms, sql/035) alike.
--
--   select kb.set_language('russian');      -- re-analyses every chunk, in this transaction
--   select name from kb.language;           -- what it is
--   select * from kb.languages();           -- what it may be
--
-- A change re-analyses every chunk (the tsvector and its length), which keeps kb.corpus_stats
-- and kb.lexeme_stats exact through their triggers, then rebuilds the impact cache: all in the
-- caller's transaction, so a failure or a kill leaves the old language whole. Writers wait for
-- it; searches go on with the old language until it commits. kbpg shows progress by running
-- the steps itself: kb._language_change_begin, kb._language_reanalyse until it returns 0,
-- kb._language_change_finish (each refuses to run outside a change begun in its transaction,
-- and the last one refuses while a chunk is left unanalysed).

create or replace function kb.languages()
returns table (language text, description text)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select 'cjk'::text,
           'Chinese, Japanese, Korean: Han, Kana and Hangul as overlapping character bigrams, '
           'other text as simple words'::text
    union all
    -- regconfig's text form under this search_path: unqualified for pg_catalog's own
    select c.oid::pg_catalog.regconfig::text, pg_catalog.obj_description(c.oid, 'pg_ts_config')
      from pg_catalog.pg_ts_config c
    order by 1;
end;
comment on function kb.languages() is
    'The languages a knowledge base may have: cjk and every text search configuration of this '
    'server (pg_catalog''s by name, others schema-qualified).';

create or replace function kb._resolve_language(language text)
returns text
language plpgsql
stable
strict
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    config regconfig;
    parts text[];
    candidates text[];
begin
    if pg_catalog.btrim(language) = '' then
        raise exception 'the language must not be empty'
            using errcode = '22023', hint = 'e.g. english, russian, simple or cjk: select * from kb.languages()';
    end if;
    if pg_catalog.lower(pg_catalog.btrim(language)) = 'cjk' then
        if pg_catalog.getdatabaseencoding() <> 'UTF8' then
            raise exception 'cjk needs a UTF8 database, this one is %', pg_catalog.getdatabaseencoding()
                using errcode = '22023', hint = 'create the database with ENCODING ''UTF8''';
        end if;
        return 'cjk';
    end if;
    begin
        parts := pg_catalog.parse_ident(pg_catalog.btrim(language));
    exception when invalid_parameter_value then
        parts := null;  -- not a name: unknown, below
    end;
    if cardinality(parts) = 2 then
        select c.oid into config from pg_catalog.pg_ts_config c
         where c.cfgnamespace = (select n.oid from pg_catalog.pg_namespace n where n.nspname = parts[1])
           and c.cfgname = parts[2];
    elsif cardinality(parts) = 1 then
        -- pg_catalog's own first, else one a DBA made in another schema, named without it
        select c.oid into config from pg_catalog.pg_ts_config c
         where c.cfgnamespace = 'pg_catalog'::pg_catalog.regnamespace and c.cfgname = parts[1];
        if config is null then
            select array_agg(c.oid::pg_catalog.regconfig::text order by c.oid::pg_catalog.regconfig::text)
              into candidates
              from pg_catalog.pg_ts_config c
             where c.cfgname = parts[1];
            if cardinality(candidates) > 1 then
                raise exception 'language % is ambiguous', language
                    using errcode = '42725',
                          hint = 'name it with its schema: ' || pg_catalog.array_to_string(candidates, ', ');
            end if;
            config := candidates[1]::pg_catalog.regconfig;
        end if;
    end if;
    if config is null then
        raise exception 'unknown language %', language
            using errcode = '22023',
                  hint = 'use cjk or a text search configuration of this server: '
                         || (select pg_catalog.string_agg(l.language, ', ') from kb.languages() l);
    end if;
    return config::text;
end
$$;
comment on function kb._resolve_language(text) is
    'A language as kb.language records it: cjk, or the text search configuration''s name '
    '(schema-qualified outside pg_catalog); unknown: SQLSTATE 22023 with the choices.';

create or replace function kb.text_tsvector(body text, language text default null)
returns tsvector
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select kb._language_tsvector(
               coalesce(kb._resolve_language(text_tsvector.language), (select l.name from kb.language l)),
               body);
end;
comment on function kb.text_tsvector(text, text) is
    'A text as a chunk''s text is analysed: in the knowledge base''s language, or the one given '
    '(before weights: a chunk''s tsvector weights section A, content B, context C).';

create or replace function kb._language_change_begin(language text)
returns table (language_before text, language_after text, chunks bigint)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    chosen constant text := kb._resolve_language(language);
    before text;
begin
    if chosen is null then
        raise exception 'the language must not be NULL'
            using errcode = '22023', hint = 'e.g. english, russian, simple or cjk';
    end if;
    -- writers wait (they would analyse in the old language or the new one); searches go on
    -- with the old one until this transaction commits
    lock table kb.chunks in share row exclusive mode;
    lock table kb.language in exclusive mode;
    select l.name into before from kb.language l;
    perform pg_catalog.set_config('kb.language_change', chosen, true);
    perform pg_catalog.set_config('kb.language_change_after', '0', true);
    if before is distinct from chosen then
        update kb_data.language set name = chosen, changed_at = pg_catalog.now() where kb_id = (select kb._current_kb());
        -- the trigger carries default's language (no lookup per row; another knowledge base's
        -- rows read theirs, revision 0030); CREATE OR REPLACE TRIGGER takes the same lock as
        -- above, never one that blocks searches
        if kb._current_kb() = 1 then
            execute format('create or replace trigger chunks_text_search before insert or update on kb_data.chunks '
                           'for each row execute function kb._chunks_text_search_language(%L)', chosen);
        end if;
    else
        -- nothing to re-analyse
        perform pg_catalog.set_config('kb.language_change_after', '9223372036854775807', true);
    end if;
    return query select before, chosen, s.chunk_count from kb.corpus_stats s;
end
$$;
comment on function kb._language_change_begin(text) is
    'First step of kb.set_language: record the language and point the chunk trigger at it '
    '(writers wait until the transaction ends). Then kb._language_reanalyse, then '
    'kb._language_change_finish, in the same transaction.';

create or replace function kb._check_language_change()
returns bigint
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if pg_catalog.current_setting('kb.language_change', true) is distinct from
       (select l.name from kb.language l) then
        raise exception 'no language change is under way in this transaction'
            using errcode = '55000', hint = 'call kb.set_language(...)';
    end if;
    return pg_catalog.current_setting('kb.language_change_after')::bigint;
end
$$;
comment on function kb._check_language_change() is
    'The id up to which this transaction''s language change has re-analysed the chunks; '
    'SQLSTATE 55000 when no change was begun in it.';

create or replace function kb._language_reanalyse(batch_size integer default 10000)
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    after_id constant bigint := kb._check_language_change();
    done integer;
    last_id bigint;
begin
    if batch_size is null or batch_size < 1 then
        raise exception 'batch_size must be at least 1' using errcode = '22023';
    end if;
    -- a NULL tsv is new text to the trigger: it analyses the row again, in the new language;
    -- the statement triggers move kb.corpus_stats and kb.lexeme_stats by the difference
    with batch as (
        select c.id from kb.chunks c where c.id > after_id order by c.id limit batch_size
    ), updated as (
        update kb_data.chunks c set tsv = null from batch b where c.id = b.id
                                                              and c.kb_id = (select kb._current_kb()) returning c.id
    )
    select count(*)::integer, max(u.id) into done, last_id from updated u;
    if done > 0 then
        perform pg_catalog.set_config('kb.language_change_after', last_id::text, true);
    end if;
    return done;
end
$$;
comment on function kb._language_reanalyse(integer) is
    'Second step of kb.set_language: re-analyse the next batch_size chunks (by id) in the new '
    'language; returns how many (0 once every chunk is done).';

create or replace function kb._language_change_finish()
returns table (chunks bigint, lexemes bigint, blocks_rebuilt integer)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    after_id constant bigint := kb._check_language_change();
    left_over bigint;
begin
    select count(*) into left_over from kb.chunks c where c.id > after_id;
    if left_over > 0 then
        raise exception '% chunks are not re-analysed yet', left_over
            using errcode = '55000',
                  hint = 'call kb._language_reanalyse() until it returns 0, or roll back';
    end if;
    perform pg_catalog.set_config('kb.language_change', '', true);
    if after_id = 9223372036854775807 then  -- the language was the one asked for already
        return query select s.chunk_count, (select count(*) from kb.lexeme_stats), 0
                       from kb.corpus_stats s;
        return;
    end if;
    -- every impact changed with the lexemes (none to rebuild when there are no chunks)
    return query
    select s.chunk_count, (select count(*) from kb.lexeme_stats), r.blocks_rebuilt
      from kb.corpus_stats s
     cross join lateral kb.refresh_lexical_index(full_rebuild => after_id > 0) r;
end
$$;
comment on function kb._language_change_finish() is
    'Last step of kb.set_language: refuse while a chunk is left unanalysed, then rebuild the '
    'BM25 impact cache from the new lexemes.';

create or replace function kb.set_language(language text)
returns table (language_before text, language_after text, chunks bigint, lexemes bigint,
               blocks_rebuilt integer)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    began record;
    finished record;
begin
    select * into began from kb._language_change_begin(set_language.language);
    loop
        exit when kb._language_reanalyse(10000) = 0;
    end loop;
    select * into finished from kb._language_change_finish();
    return query select began.language_before, began.language_after, finished.chunks,
                        finished.lexemes, finished.blocks_rebuilt;
end
$$;
comment on function kb.set_language(text) is
    'Set the knowledge base''s language (cjk or a text search configuration: kb.languages()) and '
    're-analyse every chunk, the BM25 statistics and the impact cache with it, in the caller''s '
    'transaction (writers wait; searches use the old language until it commits). Same language: '
    'nothing to do.';

create or replace function kb._language_is_english(language text)
returns boolean
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a configuration's words are English to a model when both kinds of word (ASCII and other
-- letters) go to an english* or simple dictionary (english, simple, a DBA's english_unaccent)
return case when language = 'cjk' then false else not exists (
    select 1
      from pg_catalog.ts_token_type('default') t
     where t.alias in ('asciiword', 'word')
       and not exists (select 1
                         from pg_catalog.pg_ts_config_map m
                         join pg_catalog.pg_ts_dict d on d.oid = m.mapdict
                        where m.mapcfg = language::pg_catalog.regconfig
                          and m.maptokentype = t.tokid
                          and (d.dictname like 'english%' or d.dictname = 'simple'))) end;
comment on function kb._language_is_english(text) is
    'Whether a knowledge-base language analyses words as English (english, simple, or a '
    'configuration built on their dictionaries); cjk is not.';

create or replace function kb._default_vector_weight()
returns double precision
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    known text[];
    language text;
begin
    select e.languages into known from kb.embedding_space e;
    if known is null then
        return 1;  -- no vectors yet, or a model that knows every language
    end if;
    select l.name into language from kb.language l;
    language := coalesce(language, 'english');
    if language = any (known)
       or ('english' = any (known) and kb._language_is_english(language)) then
        return 1;
    end if;
    -- a model that does not know the language: its vector arm is noise that RRF mixes in
    -- (XQuAD Russian with all-MiniLM-L6-v2: hybrid .624, lexical .948)
    return 0;
end
$$;
comment on function kb._default_vector_weight() is
    'The vector arm''s RRF weight when kb.search is given none: 1, or 0 when the knowledge '
    'base''s language is not one its embedding model knows (kb.embedding_space.languages).';

create or replace function kb.model_defaults()
returns table (model text, model_languages text[], language text, language_is_english boolean,
               vector_weight double precision)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    chosen text;
begin
    perform kb._access_visibility();  -- (a knowledge base the caller may not read: KB011)
    chosen := coalesce((select l.name from kb.language l), 'english');
    return query
    select e.model, e.languages, chosen, kb._language_is_english(chosen), kb._default_vector_weight()
      from (select 1) one
      left join kb.embedding_space e on true;
end
$$;
comment on function kb.model_defaults() is
    'What a client embeds with when not told: the recorded model (NULL before the first '
    'vector) and the languages it knows, the knowledge base''s language and whether it is '
    'English to a model, and the vector arm''s default weight in kb.search.';
