-- kbpg: BM25 for the lexical arm — the query parsed into lexemes, and exact Okapi BM25 of chunks
-- from their tsvector (the lexical arm itself, over the impact cache: sql/040).
--
-- score(chunk) = sum over distinct query lexemes t in the chunk of
--     idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl)),   k1 = 1.2, b = 0.75,
--     idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
-- (the Lucene form bm25s computes; the (k1 + 1) numerator of the classic form only scales
-- every score and changes no ranking). tf counts every occurrence of the lexeme in the chunk,
-- section (weight A) and body (weight B) alike; dl = kb.chunks.token_count; N, df and avgdl
-- come live from kb.corpus_stats / kb.lexeme_stats, exact after every insert and delete.
-- Query syntax is websearch_to_tsquery's, in the knowledge base's language (kb.language, sql/015:
-- its text search configuration; cjk: `simple`, then each word analysed as chunks are, a word of
-- Han or Kana becoming its bigrams); terms are OR-ed (a long question still matches), "-term"
-- excludes chunks containing that lexeme (a negated phrase excludes each of its words; a negated
-- CJK word, the chunks holding all its bigrams), quoted phrases count as their words.
--
-- Cost bound (what one query may make the arm read): query text of at most 100,000
-- characters (longer: SQLSTATE KB003), parsed once (linear in its length); of its distinct
-- lexemes the corpus holds, the 64 rarest (lowest df: highest idf) are scored, and at most
-- 64 may be excluded with "-word" (more: KB003). So a query sums at most 64 cached vectors
-- per block of 16,000 chunks.
--
-- Helpers (internal, kb._*): _query_terms parses the query; _bm25_score is the BM25 formula
-- for one chunk (inlined by the planner: no call per row); _bm25_rank ranks chunks exactly by
-- it (the exhaustive path, and the rescoring under filters).

create or replace function kb._tsquery_lexemes(tsquery_text text)
returns text[]
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select coalesce(array_agg(distinct replace(replace(m[1], '''''', ''''), '\\', '\')), '{}')
      from pg_catalog.regexp_matches(tsquery_text, '''((?:[^'']|'''')+)''', 'g') as m;
end;
comment on function kb._tsquery_lexemes(text) is
    'The distinct lexemes quoted in the text form of a tsquery (or of querytree()).';

create or replace function kb._lexemes_tsquery(lexemes text[])
returns tsquery
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select nullif(string_agg('''' || replace(replace(l, '\', '\\'), '''', '''''') || '''', ' | '),
                  '')::pg_catalog.tsquery
      from pg_catalog.unnest(lexemes) as l;
end;
comment on function kb._lexemes_tsquery(text[]) is
    'The OR tsquery of the given lexemes (NULL for none): the GIN-indexable form of a query.';

create or replace function kb._lexemes_all_tsquery(lexemes text[])
returns tsquery
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select nullif(string_agg('''' || replace(replace(l, '\', '\\'), '''', '''''') || '''', ' & '),
                  '')::pg_catalog.tsquery
      from pg_catalog.unnest(lexemes) as l;
end;
comment on function kb._lexemes_all_tsquery(text[]) is
    'The AND tsquery of the given lexemes (NULL for none).';

create or replace function kb._cjk_lexemes(words text[])
returns text[]
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    -- query words hold no space: analysed together, they give what each gives alone
    select coalesce(array_agg(x.lexeme order by x.lexeme), '{}')
      from pg_catalog.unnest(pg_catalog.tsvector_to_array(
               kb._cjk_tsvector(pg_catalog.array_to_string(words, ' ')))) as x(lexeme);
end;
comment on function kb._cjk_lexemes(text[]) is
    'The distinct lexemes of query words under the cjk analysis (a word of Han, Kana or Hangul: '
    'its character bigrams).';

create or replace function kb._cjk_exclusion(
    words text[],
    known_only boolean,
    out excluded text[],
    out exclusion tsquery
)
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- a string body: a SQL-standard one would make the function depend on kb.lexeme_stats, which
-- kbpg db distribute (Citus) replaces by a view of the shards' sums
as $$
    -- each excluded word excludes the chunks holding all of its lexemes (a Han word: all its
    -- bigrams, not any one of them); known_only: a word with a lexeme the corpus lacks excludes
    -- nothing and is dropped
    with w as (
        select kb._cjk_lexemes(array[u.word]) as lexemes
          from pg_catalog.unnest(words) as u(word)
    ), kept as (
        select w.lexemes from w
         where cardinality(w.lexemes) > 0
           and (not known_only
                or not exists (select 1 from pg_catalog.unnest(w.lexemes) as l(lexeme)
                                where not exists (select 1 from kb.lexeme_stats s
                                                   where s.lexeme = l.lexeme and s.doc_freq > 0)))
    )
    select coalesce((select array_agg(distinct l.lexeme order by l.lexeme)
                       from kept, pg_catalog.unnest(kept.lexemes) as l(lexeme)), '{}'),
           (select pg_catalog.string_agg('(' || kb._lexemes_all_tsquery(kept.lexemes)::text || ')', ' | ')
              from kept)::pg_catalog.tsquery
$$;
comment on function kb._cjk_exclusion(text[], boolean) is
    'What "-word" query words exclude under the cjk analysis: their lexemes, and the tsquery '
    'matching chunks that hold all the lexemes of one of them; known_only: only words whose '
    'lexemes the corpus holds.';

create or replace function kb._query_terms(
    query_text text,
    out terms text[],
    out excluded text[],
    out exclusion tsquery
)
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    lang text;
    full_query tsquery;
    every text[];
    words text[];
    negated text[];
begin
    if pg_catalog.length(query_text) > 100000 then
        raise exception 'query text of % characters is over the limit of 100000',
                pg_catalog.length(query_text)
            using errcode = 'KB003',
                  hint = 'shorten the query: the lexical arm scores its 64 rarest words, the '
                         'vector arm reads its first 256 tokens';
    end if;
    select l.name into lang from kb.language l;
    -- parsed once, each lexeme extracted once (0.1.0 re-parsed the query for every lexeme:
    -- 2,000 words took 15 s)
    if lang = 'cjk' then
        full_query := pg_catalog.websearch_to_tsquery('pg_catalog.simple'::pg_catalog.regconfig,
                          pg_catalog.normalize(coalesce(query_text, ''), 'NFKC'));
    else
        full_query := pg_catalog.websearch_to_tsquery(
                          coalesce(lang, 'english')::pg_catalog.regconfig, coalesce(query_text, ''));
    end if;
    every := kb._tsquery_lexemes(full_query::text);
    -- without a negation ('!') every lexeme scores: one pass of the regular expression
    words := case when pg_catalog.strpos(full_query::text, '!') = 0 then every
                  else kb._tsquery_lexemes(pg_catalog.querytree(full_query)) end;
    negated := coalesce(array(select e from pg_catalog.unnest(every) as e
                              except
                              select t from pg_catalog.unnest(words) as t
                              order by 1), '{}');
    if lang = 'cjk' then
        -- each word analysed as a chunk's text is: a run of Han or Kana becomes its bigrams
        terms := kb._cjk_lexemes(words);
        select x.excluded, x.exclusion into excluded, exclusion
          from kb._cjk_exclusion(negated, known_only => false) x;
        if cardinality(excluded) > 64 then
            -- words the corpus lacks exclude nothing, and do not count against the limit
            select x.excluded, x.exclusion into excluded, exclusion
              from kb._cjk_exclusion(negated, known_only => true) x;
        end if;
    else
        terms := words;
        excluded := negated;
        if cardinality(excluded) > 64 then
            excluded := array(select s.lexeme from kb.lexeme_stats s
                               where s.lexeme = any (negated) and s.doc_freq > 0 order by 1);
        end if;
        exclusion := kb._lexemes_tsquery(excluded);
    end if;
end
$$;
comment on function kb._query_terms(text) is
    'The distinct lexemes a query scores with (terms, OR-ed), the lexemes it excludes ("-word"; '
    'past 64, only those the corpus holds) and the tsquery of the chunks it excludes, parsed once '
    'with websearch_to_tsquery in the knowledge base''s language (cjk: simple, each word then '
    'analysed into bigrams); over 100,000 characters: SQLSTATE KB003.';

create or replace function kb._bm25_score(
    tsv tsvector,
    token_count integer,
    terms text[],
    idfs double precision[],
    avgdl double precision
)
returns table (score double precision)
language sql
immutable
parallel safe
security invoker
-- no SET clause: PostgreSQL inlines this into the caller's query only without one (else a call
-- per scored row); the body is SQL-standard, so every name in it was bound when it was created
-- (under search_path pg_catalog, pg_temp) and nothing is looked up when it runs
begin atomic
    select pg_catalog.sum(idfs[pg_catalog.array_position(terms, u.lexeme)] * u.tf
                          / (u.tf + 1.2 * (1 - 0.75 + 0.75 * token_count / avgdl)))
      from (select x.lexeme, coalesce(pg_catalog.array_length(x.positions, 1), 1)::float8 as tf
              from pg_catalog.unnest(pg_catalog.ts_delete(tsv, pg_catalog.tsvector_to_array(
                       pg_catalog.ts_delete(tsv, terms)))) as x) as u;
end;
comment on function kb._bm25_score(tsvector, integer, text[], double precision[], double precision) is
    'BM25 (k1 1.2, b 0.75) of one chunk (its tsvector and length) for the given terms and their '
    'idfs; the chunk''s other lexemes are ignored. Inlined into the caller''s query.';

create or replace function kb._bm25_rank(
    terms text[],
    idfs double precision[],
    avgdl double precision,
    excluded tsquery,
    candidate_ids bigint[],
    limit_count integer,
    filter_groups text[] default null,
    filter_category text default null,
    filter_labels text[] default null,
    filter_first boolean default false,
    visible_groups text[] default null,
    filter_metadata jsonb default null
)
returns table (rank integer, chunk_id bigint, document_id bigint, score double precision)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    -- (candidates: the metadata filter tested on each, kb._metadata_row_filter_sql)
    filter_sql constant text := pg_catalog.concat_ws(' and ',
        kb._chunk_filter_sql('c', '$1', '$2', '$3', '$11', filter_groups, filter_category,
                             filter_labels, visible_groups,
                             case when candidate_ids is null then filter_metadata end),
        case when candidate_ids is not null then kb._metadata_row_filter_sql('c', filter_metadata) end);
    -- filter_first: the filters keep few chunks, so match the terms on those rows rather than
    -- AND a GIN bitmap of every chunk holding a frequent term (coalesce hides @@ from GIN)
    source_sql constant text := case
        when candidate_ids is not null
            then 'c.id operator(pg_catalog.=) any ($9) and c.tsv operator(pg_catalog.@@) $8'
        when filter_first and filter_sql <> 'true'
            then 'coalesce(c.tsv operator(pg_catalog.@@) $8, false)'
        else 'c.tsv operator(pg_catalog.@@) $8' end;
begin
    return query execute format(
        'select (pg_catalog.row_number() over (order by s.score desc, c.id))::integer, '
        '       c.id, c.document_id, s.score from ' || kb._chunks_relation() || ' c '
        'cross join lateral kb._bm25_score(c.tsv, c.token_count, $4, $5, $6) s '
        'where %s and %s %s '
        'order by s.score desc, c.id limit $10',
        source_sql, filter_sql,
        case when excluded is null then '' else 'and not c.tsv operator(pg_catalog.@@) $7' end)
    using filter_groups, filter_category, filter_labels, terms, idfs, avgdl, excluded,
          kb._lexemes_tsquery(terms), candidate_ids, limit_count, visible_groups;
end
$$;
comment on function kb._bm25_rank(text[], double precision[], double precision, tsquery, bigint[], integer, text[], text, text[], boolean, text[], jsonb) is
    'Exact BM25 ranking of chunks (all chunks matching any term when candidate_ids is NULL, else '
    'those candidates), filtered (the metadata filter too; filter_first: read the filtered rows first) and among those '
    'visible_groups lets the caller read (NULL: all), best limit_count first (ties by chunk '
    'id), ranked from 1. Internal to the lexical arm.';
