-- kbpg: facets — how many documents (and chunks) of a search's match set hold each value of a
-- field: what a sidebar shows beside the results. The match set is every chunk the lexical arm
-- could return (holding one of the query's terms; every chunk for an empty query) under the
-- same filters and the caller's visibility as kb.search, counted exactly.

create or replace function kb.facets(
    query_text text,
    facets text[],
    groups text[] default null,
    category text default null,
    labels text[] default null,
    filter jsonb default null,
    top_values integer default 10
)
returns table (facet text, value text, documents bigint, chunks bigint)
language plpgsql
stable
-- a reader's way in (as kb.search): the owner's rights, the caller's grants
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
#variable_conflict use_column
declare
    visible constant text[] := kb._access_visibility();
    has_text constant boolean := facets.query_text is not null and pg_catalog.btrim(facets.query_text) <> '';
    match_sql text;
    values_sql text;
    name text;
    terms text[];
begin
    perform kb._check_filter_lists(facets.groups, facets.labels);
    perform kb._metadata_jsonpath(facets.filter);
    if coalesce(pg_catalog.cardinality(facets.facets), 0) = 0 or pg_catalog.cardinality(facets.facets) > 20 then
        raise exception 'facets takes 1 to 20 field names, got %', coalesce(pg_catalog.cardinality(facets.facets), 0)
            using errcode = '22023', hint = 'category, labels, groups or metadata.KEY (dotted for nested keys)';
    end if;
    if facets.top_values is null or facets.top_values not between 1 and 1000 then
        raise exception 'top_values must be between 1 and 1000, got %', coalesce(facets.top_values::text, 'NULL')
            using errcode = '22023', hint = 'the values with most documents first; 10 is the default';
    end if;
    if has_text then
        terms := (kb._query_terms(facets.query_text)).terms;
        if coalesce(pg_catalog.cardinality(terms), 0) = 0 then
            return;  -- only words the corpus lacks or stop words: nothing matches
        end if;
    end if;
    match_sql := kb._chunk_filter_sql('c', '$1', '$2', '$3', '$4', facets.groups, facets.category,
                                      facets.labels, visible, facets.filter)
                 || case when has_text then ' and c.tsv operator(pg_catalog.@@) $5' else '' end;
    foreach name in array facets.facets loop
        values_sql := case
            when name = 'category' then 'select c.category as v from ' || kb._chunks_relation() || ' c where c.category is not null and '
            when name = 'labels' then 'select l.v from ' || kb._chunks_relation() || ' c cross join pg_catalog.unnest(c.labels) as l(v) where '
            -- the chunks without groups are the ones every reader reads: the group public
            when name = 'groups' then
                'select g.v from ' || kb._chunks_relation() || ' c cross join pg_catalog.unnest(case when c.groups operator(pg_catalog.=) ''{}''::text[] '
                'then array[''public''] else c.groups end) as g(v) where '
            when pg_catalog.starts_with(name, 'metadata.') then pg_catalog.format(
                'select m.v #>> ''{}'' as v from ' || kb._chunks_relation() || ' c join kb_data.documents md on md.id operator(pg_catalog.=) c.document_id '
                'cross join lateral pg_catalog.jsonb_path_query(md.metadata, %L::pg_catalog.jsonpath) as m(v) '
                'where pg_catalog.jsonb_typeof(m.v) not in (''object'', ''array'', ''null'') and ',
                kb._metadata_key_path(pg_catalog.substr(name, 10), 'facets') || '[*]')
            end;
        if values_sql is null then
            raise exception 'unknown facet %', name
                using errcode = '22023', hint = 'category, labels, groups or metadata.KEY (dotted for nested keys)';
        end if;
        -- the chunk's document and id ride along for the counts (a value twice in one
        -- chunk, as an array's element, counts once)
        values_sql := pg_catalog.regexp_replace(values_sql, '^select ', 'select c.document_id as d, c.id as i, ');
        return query execute pg_catalog.format(
            'select %L::text, x.v, pg_catalog.count(distinct x.d), pg_catalog.count(distinct x.i) '
            '  from (%s %s) x group by x.v '
            ' order by 3 desc, 4 desc, 2 limit %s',
            name, values_sql, match_sql, facets.top_values)
          using facets.groups, facets.category, facets.labels, visible,
                kb._lexemes_tsquery(terms);
    end loop;
end
$$;
comment on function kb.facets(text, text[], text[], text, text[], jsonb, integer) is
    'Facet counts for a search: for each field named (category, labels, groups, or '
    'metadata.KEY), its values with the number of documents and chunks of the match set holding '
    'them, most documents first, top_values of each. The match set: the chunks holding one of '
    'the query''s terms (every chunk for an empty query) under the filters (as kb.search) and '
    'what the caller may read; exact. Example: SELECT * FROM kb.facets(''permit'', '
    '''{category,labels}'').';
