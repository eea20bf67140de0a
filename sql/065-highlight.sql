-- kbpg: highlights and snippets — where a query's words are in a chunk's text, from the
-- lexemes the lexical arm matched (whole words: "renewal" is marked for "renew", never half of
-- it), and the window of the text holding most of them.
--
-- A word is parsed and analysed as the chunk's text was (kb.language): PostgreSQL's parser
-- gives each token in order (a hyphenated word and a URL also come whole, before their parts,
-- which are what advance the position), the language's dictionaries its lexemes; a token is
-- marked when one of its lexemes is a query term. In the cjk language a run of Han or Kana is
-- indexed as its bigrams: each of the query's bigrams is marked where it occurs. Offsets count
-- characters (Unicode code points) from 0, end exclusive.

create or replace function kb._highlight_ranges(content text, query_text text)
returns int4range[]
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    lang constant text := coalesce((select l.name from kb.language l), 'english');
    terms constant text[] := (kb._query_terms(query_text)).terms;
    -- the markers ts_headline puts around a match: characters no text keeps (replaced below,
    -- one character for one, so the offsets stand)
    clean constant text := pg_catalog.translate(content, E'\x01\x02', '  ');
    ranges int4range[];
    term text;
    at integer;
    found integer;
begin
    if content is null or coalesce(pg_catalog.cardinality(terms), 0) = 0 then
        return '{}';
    end if;
    -- the words whose lexemes are query terms, marked by PostgreSQL's own headline code (the
    -- parser and dictionaries the chunk's text went through: whole words), then the marks'
    -- offsets: the text between them summed up
    select coalesce(pg_catalog.array_agg(pg_catalog.int4range(m.start_at, m.start_at + m.width) order by m.ord), '{}')
      into ranges
      from (select p.ord, pg_catalog.char_length(pg_catalog.split_part(p.piece, E'\x02', 1)) as width,
                   (coalesce(pg_catalog.sum(pg_catalog.char_length(pg_catalog.replace(p.piece, E'\x02', '')))
                        over (order by p.ord rows between unbounded preceding and 1 preceding), 0))::integer as start_at
              from pg_catalog.unnest(pg_catalog.string_to_array(
                       pg_catalog.ts_headline(
                           (case when lang = 'cjk' then 'simple' else lang end)::pg_catalog.regconfig,
                           clean, kb._lexemes_tsquery(terms),
                           E'StartSel=\x01, StopSel=\x02, HighlightAll=true'),
                       E'\x01')) with ordinality as p(piece, ord)) m
     where m.ord > 1;
    if lang = 'cjk' then
        -- a run of Han or Kana is indexed as its bigrams: each query bigram where it occurs
        foreach term in array terms loop
            continue when term operator(pg_catalog.!~) '^[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]{2}$';
            at := 0;
            loop
                found := pg_catalog.strpos(pg_catalog.substr(clean, at + 1), term);
                exit when found = 0;
                ranges := ranges || pg_catalog.int4range(at + found - 1, at + found + 1);
                at := at + found;
            end loop;
        end loop;
    end if;
    -- overlapping and touching ones merged, in order
    return coalesce((select pg_catalog.array_agg(r order by r)
                       from pg_catalog.unnest((select pg_catalog.range_agg(u) from pg_catalog.unnest(ranges) u)) r), '{}');
end
$$;
comment on function kb._highlight_ranges(text, text) is
    'Where the query''s terms are in content: the character ranges (from 0, end exclusive) of '
    'the words whose lexemes are query terms (cjk: also each query bigram where it occurs), '
    'merged, in order. Internal to kb.highlight.';

create or replace function kb.highlight(
    content text,
    query_text text,
    snippet_length integer default 200
)
returns table (highlights jsonb, snippet text, snippet_start integer, snippet_end integer)
language plpgsql
stable
parallel safe
-- a reader's way in (as kb.search): the owner's rights read kb.language alone; the text is the
-- caller's own
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    ranges int4range[];
    total constant integer := pg_catalog.char_length(content);
    best_start integer := 0;
    best_marks integer := -1;
    start_at integer;
    marks integer;
    j integer;
    stop_at integer;
    boundary integer;
begin
    perform kb._access_visibility();  -- (a knowledge base the caller may not read: KB011)
    if snippet_length is null or snippet_length not between 20 and 10000 then
        raise exception 'snippet_length must be between 20 and 10000, got %',
                coalesce(snippet_length::text, 'NULL')
            using errcode = '22023', hint = 'a snippet of 200 characters is the default';
    end if;
    ranges := kb._highlight_ranges(content, query_text);
    if total <= snippet_length then
        start_at := 0;
    else
        -- the window holding the most marks, each window starting a quarter of its length
        -- before a mark (one pass: the marks are in order)
        j := 1;
        for i in 1..coalesce(pg_catalog.cardinality(ranges), 0) loop
            start_at := greatest(0, least(pg_catalog.lower(ranges[i]) - snippet_length / 4, total - snippet_length));
            j := greatest(j, i);
            while j < pg_catalog.cardinality(ranges)
                  and pg_catalog.upper(ranges[j + 1]) <= start_at + snippet_length loop
                j := j + 1;
            end loop;
            marks := j - i + 1;
            if marks > best_marks then
                best_marks := marks;
                best_start := start_at;
            end if;
        end loop;
        start_at := best_start;
        -- a whole word first: back to just after a space within 20 characters, when there is one
        if start_at > 0 then
            boundary := pg_catalog.strpos(pg_catalog.reverse(pg_catalog.substr(content, greatest(1, start_at - 19), least(start_at, 20))), ' ');
            if boundary > 0 then
                start_at := start_at - boundary + 1;
            end if;
        end if;
    end if;
    stop_at := least(total, start_at + snippet_length);
    if stop_at < total then
        -- ... and a whole word last: back to a space within the last 20 characters
        boundary := pg_catalog.strpos(pg_catalog.reverse(pg_catalog.substr(content, stop_at - 19, 20)), ' ');
        if boundary > 0 then
            stop_at := stop_at - boundary;
        end if;
    end if;
    return query
    select coalesce((select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(pg_catalog.lower(r), pg_catalog.upper(r)) order by r)
                       from pg_catalog.unnest(ranges) r), '[]'::jsonb),
           pg_catalog.substr(content, start_at + 1, stop_at - start_at),
           start_at, stop_at;
end
$$;
comment on function kb.highlight(text, text, integer) is
    'Where a query''s words are in a text, as the lexical arm matched them (whole words, in the '
    'knowledge base''s language; cjk bigrams): highlights, a JSON list of [start, end) character '
    'offsets (from 0), and the snippet of at most snippet_length characters holding most of '
    'them (cut at spaces) with its offsets in the text. Example: SELECT s.rank, h.snippet FROM '
    'kb.search(''renew permit'') s, kb.highlight(s.content, ''renew permit'') h.';
