-- kbpg: metadata filters — a JSON filter over the documents' metadata (kb.documents.metadata:
-- loaders' front matter, JSONL fields, table sources' metadata columns), compiled once per call
-- into a SQL/JSON path predicate that every arm applies before ranking (sql/020).
--
-- The operator set is langchain-postgres's PGVector filter, so its users' filters work unchanged:
--   {"year": 2020}                          equality (a scalar value is $eq)
--   {"year": {"$gte": 2020, "$lt": 2024}}   several operators on a key: all hold
--   {"author.name": {"$ilike": "ann%"}}     nested keys, dotted
--   {"$or": [{"lang": "de"}, {"lang": "fr"}]}, {"$and": [...]}, {"$not": {...}} or {"$not": [...]}
--   $eq $ne $gt $gte $lt $lte $in $nin $between $exists $like $ilike
-- Several keys in one object: all hold. Values compare as what they are: numbers as numbers,
-- strings as strings (code point order), booleans, null; a string in ISO 8601 date form
-- ("2024-01-15", "2024-01-15T10:00:00+02:00") compares as a date or timestamp (a value with a
-- time zone against one without: in the session's TimeZone). A value of another type never
-- matches (the string "2021" is not greater than the number 2020). A key holding an array
-- matches when one of its elements does ({"tags": "faq"} finds "tags": ["faq", "howto"]).
-- $ne and $nin hold only where the key exists (as langchain-postgres's, whose SQL compares NULL).
-- Errors: SQLSTATE KB004 naming the operator or key and the place in the filter, with an
-- example; KB003 over the cost bound (64 kB of JSON, 16 levels, 1,000 values in a list).

create or replace function kb._metadata_key_path(key text, at text)
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    parts constant text[] := pg_catalog.string_to_array(key, '.');
    part text;
    path text := '$';
begin
    if key = '' or pg_catalog.array_position(parts, '') is not null then
        raise exception 'the key "%" at % has an empty part', key, at
            using errcode = 'KB004',
                  hint = 'keys are metadata fields, nested ones dotted: {"author.name": "Ann"}';
    end if;
    if pg_catalog.cardinality(parts) > 16 then
        raise exception 'the key "%" at % is nested % deep, over the limit of 16',
                key, at, pg_catalog.cardinality(parts)
            using errcode = 'KB003', hint = 'name a field at most 16 levels down';
    end if;
    foreach part in array parts loop
        -- each part a quoted JSON string: any character a key may hold
        path := path || '.' || pg_catalog.to_jsonb(part)::text;
    end loop;
    return path;
end
$$;
comment on function kb._metadata_key_path(text, text) is
    'The SQL/JSON path of a metadata filter''s key ("author.name" -> $."author"."name"), or '
    'KB004 naming the key. Internal to kb._metadata_jsonpath.';

create or replace function kb._metadata_literal(arg jsonb, op text, at text, allow text[])
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    kind constant text := pg_catalog.jsonb_typeof(arg);
begin
    if kind <> all (allow) then
        raise exception 'metadata filter: % at % takes %, not %', op, at,
                pg_catalog.array_to_string(allow, ' or '), arg::text
            using errcode = 'KB004',
                  hint = case op
                      when '$in' then 'a list of values: {"lang": {"$in": ["de", "fr"]}}'
                      when '$nin' then 'a list of values: {"lang": {"$nin": ["de", "fr"]}}'
                      when '$between' then 'two values, low and high: {"year": {"$between": [2020, 2023]}}'
                      when '$exists' then 'true or false: {"reviewed": {"$exists": true}}'
                      when '$like' then 'a LIKE pattern: {"source": {"$like": "%.md"}}'
                      when '$ilike' then 'a LIKE pattern: {"title": {"$ilike": "%install%"}}'
                      else 'a number, a string or an ISO date: {"year": {"$gte": 2020}}' end;
    end if;
    -- jsonb's text of a scalar is a valid SQL/JSON path literal (strings with JSON escapes)
    return arg::text;
end
$$;
comment on function kb._metadata_literal(jsonb, text, text, text[]) is
    'A filter value as a SQL/JSON path literal, or KB004 when its JSON type is not one of '
    'allow (with an example of the operator). Internal to kb._metadata_jsonpath.';

create or replace function kb._metadata_date(arg jsonb)
returns boolean
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    -- ISO 8601 as SQL/JSON .datetime() reads it: a date, or a date and a time with seconds
    -- (and fraction, time zone)
    return pg_catalog.jsonb_typeof(arg) = 'string'
       and (arg #>> '{}') operator(pg_catalog.~)
           '^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}(:?\d{2})?)?)?$';
end
$$;
comment on function kb._metadata_date(jsonb) is
    'Whether a filter value is a string in ISO 8601 date form (compared as a date). Internal.';

create or replace function kb._metadata_comparison(path text, op text, arg jsonb, at text)
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    symbol constant text := case op when '$gt' then '>' when '$gte' then '>=' when '$lt' then '<'
                                    when '$lte' then '<=' end;
    literal constant text := kb._metadata_literal(arg, op, at, '{number,string}');
begin
    if kb._metadata_date(arg) then
        begin
            perform pg_catalog.jsonb_path_query_first_tz('{}', (literal || '.datetime()')::pg_catalog.jsonpath);
        exception when others then
            raise exception 'metadata filter: % at % is not a valid date: %', op, at, literal
                using errcode = 'KB004', hint = 'ISO 8601: "2024-01-15" or "2024-01-15T10:00:00+02:00"';
        end;
        return pg_catalog.format('%s.datetime() %s %s.datetime()', path, symbol, literal);
    end if;
    return pg_catalog.format('%s %s %s', path, symbol, literal);
end
$$;
comment on function kb._metadata_comparison(text, text, jsonb, text) is
    'One $gt/$gte/$lt/$lte comparison as SQL/JSON path (an ISO date string: as dates). Internal '
    'to kb._metadata_jsonpath.';

create or replace function kb._metadata_condition(path text, op text, arg jsonb, at text)
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    scalars constant text[] := '{string,number,boolean,null}';
    items text[];
    item jsonb;
    pattern text;
begin
    case op
    when '$eq' then
        return pg_catalog.format('%s == %s', path, kb._metadata_literal(arg, op, at, scalars));
    when '$ne' then
        return pg_catalog.format('(exists(%1$s) && !(%1$s == %2$s))', path,
                                 kb._metadata_literal(arg, op, at, scalars));
    when '$gt', '$gte', '$lt', '$lte' then
        return kb._metadata_comparison(path, op, arg, at);
    when '$in', '$nin' then
        perform kb._metadata_literal(arg, op, at, '{array}');
        if pg_catalog.jsonb_array_length(arg) = 0 or pg_catalog.jsonb_array_length(arg) > 1000 then
            raise exception 'metadata filter: % at % holds % values; it takes 1 to 1,000', op, at,
                    pg_catalog.jsonb_array_length(arg)
                using errcode = case when pg_catalog.jsonb_array_length(arg) = 0 then 'KB004' else 'KB003' end,
                      hint = 'a list of values: {"lang": {"$in": ["de", "fr"]}}';
        end if;
        items := '{}';
        for item in select e from pg_catalog.jsonb_array_elements(arg) e loop
            items := items || pg_catalog.format('%s == %s', path,
                                                kb._metadata_literal(item, op || ' item', at, scalars));
        end loop;
        if op = '$in' then
            return '(' || pg_catalog.array_to_string(items, ' || ') || ')';
        end if;
        return pg_catalog.format('(exists(%s) && !(%s))', path, pg_catalog.array_to_string(items, ' || '));
    when '$between' then
        if pg_catalog.jsonb_typeof(arg) <> 'array' or pg_catalog.jsonb_array_length(arg) <> 2
           or pg_catalog.jsonb_typeof(arg -> 0) <> pg_catalog.jsonb_typeof(arg -> 1)
           or kb._metadata_date(arg -> 0) <> kb._metadata_date(arg -> 1) then
            raise exception 'metadata filter: $between at % takes two values of one type, low and high, not %',
                    at, arg::text
                using errcode = 'KB004',
                      hint = 'two values, low and high: {"year": {"$between": [2020, 2023]}}';
        end if;
        -- one element of the value (an array's) holds both bounds
        return pg_catalog.format('exists(%s ? (%s && %s))', path,
                                 kb._metadata_comparison('@', '$gte', arg -> 0, at),
                                 kb._metadata_comparison('@', '$lte', arg -> 1, at));
    when '$exists' then
        perform kb._metadata_literal(arg, op, at, '{boolean}');
        return pg_catalog.format(case when arg = 'true' then 'exists(%s)' else '!exists(%s)' end, path);
    when '$like', '$ilike' then
        perform kb._metadata_literal(arg, op, at, '{string}');
        -- a LIKE pattern as an anchored regular expression: % any text, _ one character, \
        -- takes the next character as it is; a character other than a letter, a digit or a
        -- space is escaped (\ before a letter or digit would be a class: \d)
        select '^' || coalesce(pg_catalog.string_agg(
                   case when x.m = '%' then '.*'
                        when x.m = '_' then '.'
                        when x.ch operator(pg_catalog.~) '^[[:alnum:][:space:]]$'
                             or pg_catalog.ascii(x.ch) > 127 then x.ch
                        else '\' || x.ch end, '' order by x.n), '') || '$'
          into pattern
          from (select r.m[1] as m, r.n,
                       case when r.m[1] operator(pg_catalog.~) '^\\.$' then pg_catalog.substr(r.m[1], 2)
                            else r.m[1] end as ch
                  from pg_catalog.regexp_matches(arg #>> '{}', '\\.|.', 'g') with ordinality as r(m, n)) x;
        return pg_catalog.format('%s like_regex %s flag "%s"', path, pg_catalog.to_jsonb(pattern)::text,
                                 case op when '$ilike' then 'is' else 's' end);
    else
        raise exception 'metadata filter: unknown operator % at %', op, at
            using errcode = 'KB004',
                  hint = 'operators: $eq $ne $gt $gte $lt $lte $in $nin $between $exists $like '
                         '$ilike, and $and $or $not over filters: {"year": {"$gte": 2020}}';
    end case;
end
$$;
comment on function kb._metadata_condition(text, text, jsonb, text) is
    'One operator of a metadata filter on a key''s path, as SQL/JSON path, or KB004 naming an '
    'unknown operator or a value of the wrong type. Internal to kb._metadata_jsonpath.';

create or replace function kb._metadata_predicate(node jsonb, at text, depth integer)
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    entry record;
    op record;
    parts text[] := '{}';
    alternatives text[];
begin
    if depth > 16 then
        raise exception 'metadata filter: nested over 16 levels deep at %', at
            using errcode = 'KB003', hint = 'flatten the $and / $or / $not nesting';
    end if;
    if pg_catalog.jsonb_typeof(node) is distinct from 'object' or node = '{}' then
        raise exception 'metadata filter: % must be an object of conditions, not %', at,
                coalesce(node::text, 'nothing')
            using errcode = 'KB004', hint = 'for example {"year": {"$gte": 2020}, "lang": "de"}';
    end if;
    for entry in select e.key, e.value from pg_catalog.jsonb_each(node) e loop
        if entry.key in ('$and', '$or', '$not') then
            if entry.key = '$not' and pg_catalog.jsonb_typeof(entry.value) = 'object' then
                parts := parts || ('!(' || kb._metadata_predicate(entry.value, at || '.$not', depth + 1) || ')');
                continue;
            end if;
            if pg_catalog.jsonb_typeof(entry.value) <> 'array' or pg_catalog.jsonb_array_length(entry.value) = 0 then
                raise exception 'metadata filter: % at % takes a list of filters, not %', entry.key, at,
                        entry.value::text
                    using errcode = 'KB004',
                          hint = 'for example {"$or": [{"lang": "de"}, {"year": {"$gte": 2020}}]}';
            end if;
            select pg_catalog.array_agg(kb._metadata_predicate(
                       x.f, pg_catalog.format('%s.%s[%s]', at, entry.key, x.i - 1), depth + 1) order by x.i)
              into alternatives
              from pg_catalog.jsonb_array_elements(entry.value) with ordinality as x(f, i);
            parts := parts || case entry.key
                when '$and' then '(' || pg_catalog.array_to_string(alternatives, ' && ') || ')'
                when '$or' then '(' || pg_catalog.array_to_string(alternatives, ' || ') || ')'
                -- a list: none of them holds (langchain-postgres's reading)
                else '!(' || pg_catalog.array_to_string(alternatives, ' || ') || ')' end;
        elsif pg_catalog.starts_with(entry.key, '$') then
            raise exception 'metadata filter: % at % is not a logical operator ($and, $or, $not)', entry.key, at
                using errcode = 'KB004',
                      hint = 'comparisons go under a key: {"year": {"$gte": 2020}}, not {"$gte": ...}';
        elsif pg_catalog.jsonb_typeof(entry.value) = 'object' then
            if entry.value = '{}' then
                raise exception 'metadata filter: the key "%" at % has no condition', entry.key, at
                    using errcode = 'KB004', hint = 'for example {"year": {"$gte": 2020}}';
            end if;
            for op in select e.key, e.value from pg_catalog.jsonb_each(entry.value) e loop
                if not pg_catalog.starts_with(op.key, '$') then
                    raise exception 'metadata filter: the key "%" at % holds "%", not an operator', entry.key, at, op.key
                        using errcode = 'KB004',
                              hint = pg_catalog.format('a nested key is dotted: {"%s.%s": ...}; operators start with $: {"year": {"$gte": 2020}}',
                                                       entry.key, op.key);
                end if;
                parts := parts || kb._metadata_condition(kb._metadata_key_path(entry.key, at), op.key, op.value,
                                                         at || '.' || entry.key);
            end loop;
        elsif pg_catalog.jsonb_typeof(entry.value) = 'array' then
            raise exception 'metadata filter: the key "%" at % is given a list', entry.key, at
                using errcode = 'KB004',
                      hint = pg_catalog.format('any of several values: {"%s": {"$in": %s}}', entry.key, entry.value::text);
        else
            parts := parts || kb._metadata_condition(kb._metadata_key_path(entry.key, at), '$eq', entry.value,
                                                     at || '.' || entry.key);
        end if;
    end loop;
    if pg_catalog.cardinality(parts) = 1 then
        return parts[1];
    end if;
    return '(' || pg_catalog.array_to_string(parts, ' && ') || ')';
end
$$;
comment on function kb._metadata_predicate(jsonb, text, integer) is
    'A metadata filter object as a SQL/JSON path predicate (recursively through $and, $or, '
    '$not), or KB004/KB003 naming the place (at) of what is wrong. Internal to '
    'kb._metadata_jsonpath.';

create or replace function kb._metadata_jsonpath(metadata_filter jsonb)
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    compiled text;
begin
    -- no filter: NULL, JSON null or {}
    if metadata_filter is null or metadata_filter in ('null', '{}') then
        return null;
    end if;
    if pg_catalog.octet_length(metadata_filter::text) > 65536 then
        raise exception 'metadata filter: % bytes of JSON, over the limit of 64 kB',
                pg_catalog.octet_length(metadata_filter::text)
            using errcode = 'KB003', hint = 'a long $in list is a label or a group: filter by those instead';
    end if;
    compiled := kb._metadata_predicate(metadata_filter, 'filter', 1);
    -- checked: a compiled path that did not parse would be kbpg's bug, said here, not in an arm
    perform compiled::pg_catalog.jsonpath;
    return compiled;
end
$$;
comment on function kb._metadata_jsonpath(jsonb) is
    'A metadata filter (langchain-postgres''s operators, see sql/018) compiled into a SQL/JSON '
    'path predicate over kb.documents.metadata; NULL for no filter (NULL, null or {}); KB004 '
    'naming a bad operator, key or value, KB003 over the cost bound.';

create or replace function kb._metadata_match_sql(metadata_sql text, compiled text)
returns text
language sql
immutable
parallel safe
security invoker
-- no SET clause: inlined (see kb._chunk_filter_sql)
-- @@ is what a GIN index (jsonb_path_ops) serves; dates compare in the _tz form (@@ refuses a
-- date against a timestamp with a time zone); a filter's string holding the word merely takes
-- the _tz form too, whose answers are the same
return case when pg_catalog.strpos(compiled, '.datetime()') > 0
            then pg_catalog.format('pg_catalog.jsonb_path_match_tz(%s, %L::pg_catalog.jsonpath, ''{}''::jsonb, true)',
                                   metadata_sql, compiled)
            else pg_catalog.format('%s operator(pg_catalog.@@) %L::pg_catalog.jsonpath', metadata_sql, compiled) end;
comment on function kb._metadata_match_sql(text, text) is
    'The SQL that tests a jsonb expression (metadata_sql) against a compiled metadata filter. '
    'Internal to kb._chunk_filter_sql.';

create or replace function kb._metadata_filter_sql(chunk_alias text, metadata_filter jsonb)
returns text
language sql
immutable
parallel safe
security invoker
-- no SET clause: inlined (see kb._chunk_filter_sql)
return (select pg_catalog.format(
                   'exists (select from kb_data.documents md where md.id operator(pg_catalog.=) %I.document_id and %s)',
                   chunk_alias, kb._metadata_match_sql('md.metadata', p.compiled))
          from kb._metadata_jsonpath(metadata_filter) as p(compiled)
         where p.compiled is not null);
comment on function kb._metadata_filter_sql(text, jsonb) is
    'The WHERE predicate keeping the chunks (alias chunk_alias) whose document''s metadata '
    'matches the filter; NULL without one. Internal to kb._chunk_filter_sql.';

create or replace function kb._metadata_row_filter_sql(chunk_alias text, metadata_filter jsonb)
returns text
language sql
immutable
parallel safe
security invoker
-- no SET clause: inlined (see kb._chunk_filter_sql)
-- the document's metadata read by its key for each row: a scalar subquery, which the planner
-- keeps per row (an EXISTS becomes a join, which it drove from the filter's documents: 40
-- candidates rescored read all 2,000 chunks of a 1% filter at 200k chunks, 4.6 ms against 0.3)
return (select kb._metadata_match_sql(
                   pg_catalog.format('(select md.metadata from kb_data.documents md where md.id operator(pg_catalog.=) %I.document_id)',
                                     chunk_alias),
                   p.compiled)
          from kb._metadata_jsonpath(metadata_filter) as p(compiled)
         where p.compiled is not null);
comment on function kb._metadata_row_filter_sql(text, jsonb) is
    'The metadata filter as a WHERE predicate tested row by row on chunks already chosen (a '
    'lexical arm''s candidates); NULL without one. Internal to kb._bm25_rank.';

create or replace function kb._metadata_holds(document_id bigint, compiled text)
returns boolean
language sql
stable
parallel safe
security invoker
-- no SET clause: inlined per row
return compiled is null
    or exists (select from kb.documents d
                where d.id = document_id
                  and pg_catalog.jsonb_path_match_tz(d.metadata, compiled::pg_catalog.jsonpath, '{}'::jsonb, true));
comment on function kb._metadata_holds(bigint, text) is
    'Row-wise form of a compiled metadata filter (kb._metadata_jsonpath; NULL: none) for the '
    'few chunks an arm has already narrowed down: whether the document''s metadata matches.';

-- Indexed metadata keys (kb.indexed_metadata_keys, kb.index_metadata_key): the filter bitmaps
-- and value caches of sql/045 hold a row per (key, value) of such a key as they do per group,
-- category and label, filter kind 'metadata', the value '["key", value]' (jsonb text; a number
-- without trailing zeros, as SQL/JSON's == compares numbers: 2020 and 2020.0 are one value).
-- A filter's equalities on indexed keys that every chunk it keeps must hold (its anchors) then
-- mask the lexical arm as a group does.

create or replace function kb._metadata_mask_value(key text, value jsonb)
returns text
language sql
immutable
parallel safe
security invoker
-- no SET clause: inlined per row (see kb._metadata_match_sql)
return pg_catalog.jsonb_build_array(
           key,
           case when pg_catalog.jsonb_typeof(value) = 'number'
                then pg_catalog.to_jsonb(pg_catalog.trim_scale(value::numeric))
                else value end)::text;
comment on function kb._metadata_mask_value(text, jsonb) is
    'The bitmaps'' and value caches'' name for a scalar of an indexed metadata key: '
    '''["key", value]'' (numbers without trailing zeros). Internal to the metadata filter.';

create or replace function kb._metadata_mask_prefix(key text)
returns text
language sql
immutable
parallel safe
security invoker
-- no SET clause: inlined
return '[' || pg_catalog.to_jsonb(key)::text || ', ';
comment on function kb._metadata_mask_prefix(text) is
    'How the names of a key''s values begin (kb._metadata_mask_value): ''["key", ''. Tells '
    'them from other filter values without reading any as JSON. Internal.';

create or replace function kb._metadata_anchors(metadata_filter jsonb)
returns jsonb
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    entry record;
    found jsonb := '[]';
    alternatives jsonb;
begin
    -- a filter is ANDed across its keys and down $and lists; $or and $not imply no equality
    if pg_catalog.jsonb_typeof(metadata_filter) is distinct from 'object' then
        return found;
    end if;
    for entry in select e.key, e.value from pg_catalog.jsonb_each(metadata_filter) e loop
        if entry.key = '$and' and pg_catalog.jsonb_typeof(entry.value) = 'array' then
            found := found || (select coalesce(pg_catalog.jsonb_agg(a), '[]')
                                 from pg_catalog.jsonb_array_elements(entry.value) f,
                                      pg_catalog.jsonb_array_elements(kb._metadata_anchors(f)) a);
            continue;
        end if;
        continue when pg_catalog.starts_with(entry.key, '$');
        alternatives := case
            when pg_catalog.jsonb_typeof(entry.value) <> 'object' then pg_catalog.jsonb_build_array(entry.value)
            when entry.value ? '$eq' then pg_catalog.jsonb_build_array(entry.value -> '$eq')
            when pg_catalog.jsonb_typeof(entry.value -> '$in') = 'array' then entry.value -> '$in' end;
        -- only strings, numbers and booleans have bitmaps: an alternative of another type (a
        -- null matching documents without the key) would drop documents the filter keeps
        if pg_catalog.jsonb_array_length(alternatives) = 1 then
            -- (one value, the common case, without a query)
            if pg_catalog.jsonb_typeof(alternatives -> 0) in ('string', 'number', 'boolean') then
                found := found || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                    'key', entry.key,
                    'values', pg_catalog.jsonb_build_array(kb._metadata_mask_value(entry.key, alternatives -> 0))));
            end if;
        elsif pg_catalog.jsonb_array_length(alternatives) > 1
           and not exists (select from pg_catalog.jsonb_array_elements(alternatives) v
                            where pg_catalog.jsonb_typeof(v) not in ('string', 'number', 'boolean')) then
            found := found || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                'key', entry.key,
                'values', (select pg_catalog.jsonb_agg(distinct kb._metadata_mask_value(entry.key, v))
                             from pg_catalog.jsonb_array_elements(alternatives) v)));
        end if;
    end loop;
    return found;
end
$$;
comment on function kb._metadata_anchors(jsonb) is
    'What every document a metadata filter keeps must hold, as a JSON list of {"key", "values"}: '
    'one of the values of the key (a scalar, $eq, or $in of strings, numbers and booleans), at '
    'the top or down $and lists; values named as kb._metadata_mask_value names them. Internal '
    'to the metadata filter.';

create or replace function kb._metadata_masks(metadata_filter jsonb)
returns table (mask_values text[], mask_sets integer[], exact boolean)
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    anchors jsonb;
    keys text[];
    anchor jsonb;
    sets integer;
    several boolean := false;
    conjunction jsonb := '{}';
begin
    mask_values := '{}';
    mask_sets := '{}';
    -- no filter: nothing to mask, and the bitmaps count what the other filters keep
    if metadata_filter is null or metadata_filter in ('null', '{}') then
        exact := true;
        return next;
        return;
    end if;
    anchors := kb._metadata_anchors(metadata_filter);
    exact := pg_catalog.jsonb_array_length(anchors) > 0;
    if exact then
        keys := array(select k.key from kb.indexed_metadata_keys k);
    end if;
    -- the anchors on indexed keys mask the lexical arm (every chunk the filter keeps holds one
    -- of each anchor's values: set n's values ORed, the sets ANDed); exact when the filter says
    -- nothing else (the bitmaps then count its chunks)
    for n in 0 .. pg_catalog.jsonb_array_length(anchors) - 1 loop
        anchor := anchors -> n;
        sets := pg_catalog.jsonb_array_length(anchor -> 'values');
        if (anchor ->> 'key') = any (keys) then
            for i in 0 .. sets - 1 loop
                mask_values := mask_values || (anchor -> 'values' ->> i);
                mask_sets := mask_sets || (n + 1);
            end loop;
        else
            exact := false;
        end if;
        several := several or sets > 1;
        conjunction := conjunction || pg_catalog.jsonb_build_object(
            anchor ->> 'key',
            case when sets = 1
                 then (anchor -> 'values' ->> 0)::jsonb -> 1
                 else pg_catalog.jsonb_build_object('$in', (select pg_catalog.jsonb_agg(v::jsonb -> 1)
                                                              from pg_catalog.jsonb_array_elements_text(anchor -> 'values') v))
            end);
    end loop;
    -- (a $in compares as a set: the same values in another order are the same filter)
    exact := exact and case when several then kb._metadata_same_filter(conjunction, metadata_filter)
                            else conjunction = metadata_filter end;
    return next;
end
$$;
comment on function kb._metadata_masks(jsonb) is
    'Of a metadata filter''s anchors (kb._metadata_anchors), the values on indexed keys '
    '(kb.indexed_metadata_keys: their bitmaps exist) with the number of their anchor (a set''s '
    'values ORed, the sets ANDed), and whether the filter is exactly the anchors'' conjunction '
    '(the bitmaps then count the chunks it keeps). Internal to the search arms.';

create or replace function kb._metadata_same_filter(a jsonb, b jsonb)
returns boolean
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- key by key: equal values, or two $in lists holding the same values
return (select pg_catalog.count(*) = (select pg_catalog.count(*) from pg_catalog.jsonb_object_keys(b))
               and pg_catalog.bool_and(
                   x.value = b -> x.key
                   or (pg_catalog.jsonb_typeof(x.value -> '$in') = 'array'
                       and pg_catalog.jsonb_typeof(b -> x.key -> '$in') = 'array'
                       and (select pg_catalog.count(*) from pg_catalog.jsonb_object_keys(b -> x.key)) = 1
                       and (x.value -> '$in') @> (b -> x.key -> '$in')
                       and (b -> x.key -> '$in') @> (x.value -> '$in')))
          from pg_catalog.jsonb_each(a) x);
comment on function kb._metadata_same_filter(jsonb, jsonb) is
    'Whether two metadata filters of keys with equalities or $in lists say the same. Internal '
    'to kb._metadata_masks.';

create or replace function kb._metadata_filter_values(metadata jsonb)
returns setof text
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- a string body (see kb._metadata_masks)
as $$
    -- each indexed key's scalars as its equality finds them: the path's items (lax, as the
    -- filter's), an array's elements (SQL/JSON's == unwraps one level)
    select distinct kb._metadata_mask_value(k.key, e.value)
      from kb.indexed_metadata_keys k
     cross join lateral pg_catalog.jsonb_path_query(metadata, k.path) i(item)
     cross join lateral (select x from pg_catalog.jsonb_array_elements(i.item) x
                          where pg_catalog.jsonb_typeof(i.item) = 'array'
                         union all
                         select i.item where pg_catalog.jsonb_typeof(i.item) <> 'array') e(value)
     where pg_catalog.jsonb_typeof(e.value) in ('string', 'number', 'boolean')
$$;
comment on function kb._metadata_filter_values(jsonb) is
    'A document''s values of the indexed metadata keys, named as the filter bitmaps name them '
    '(kb._metadata_mask_value). Internal to sql/045.';
