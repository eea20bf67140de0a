-- kbpg: application tables as sources — rows kept as documents by `kbpg sync`.
--
--   select * from kb.add_table_source('articles', 'public.articles', text => 'body',
--       title => 'title', groups => 'visible_to', category => 'section', labels => 'tags',
--       metadata => '{author, updated_at}');
--   -- then run the worker: kbpg sync --watch
--
-- Change capture without an extension: statement triggers on the application's table (row
-- triggers on a partitioned one) add (source, key, op) to kb.source_queue and do nothing else —
-- no model call, no lock beyond the queue rows, no error of their own; an UPDATE queues a row
-- only when a column the source reads has another value. The queue is a log without an index
-- (revision 0027: a 50,000-row UPDATE paid more for a per-key dedupe than for the rest of its
-- capture): an entry per changing statement and row, each key taken once by the claim that
-- reads it (the INSERTs keep ON CONFLICT DO NOTHING, a no-op here, for a database downgraded to
-- 0026's keyed queue). Claims and parked rows are keyed by the key's SHA-256
-- (kb._source_key_hash, a generated column), the key itself kept beside it unindexed: any key
-- the application's own index holds is queued.
-- A worker claims entries (kb._source_claim: FOR UPDATE SKIP LOCKED, moved to
-- kb.source_claims in a statement of their own, so an application write never waits on a
-- worker that embeds), reads the current rows (kb._source_rows) and writes their documents
-- through the ingest pipeline; `table:<source>/<key>` is a row's document. The worker's session
-- holds the advisory lock (1801613427, worker): a claim whose lock is free is back in the queue
-- for the next worker (kb._source_reclaim). A row that cannot be ingested is parked in
-- kb.source_errors and retried with backoff (kb._source_settle, kb._source_requeue_errors).
-- The rows that existed before the source are enqueued a page at a time by the worker
-- (kb._source_backfill), resumable from kb.table_sources.backfill_cursor.
--
-- Privileges: adding a source needs TRIGGER on the table and kbpg's writer role; the worker
-- needs SELECT on the table and must see every row (it reads with row_security off: a policy
-- hiding rows is an error, not deleted documents). The two trigger functions are SECURITY
-- DEFINER: they let any role that writes the table add to the queue, without a grant on
-- schema kb. The catalog, kb.table_sources, is the owner's: writers read it and change it only
-- through the narrow SECURITY DEFINER helpers below (kb._source_catalog_*, kb._source_backfill_*),
-- each checking its caller is a writer (or the owner) and validating what it writes, so that a
-- source names only a permanent table its definer had TRIGGER on (issue 38: a writer who could
-- point a source at a temp table of its own made the trigger run its code as the owner).
-- Readers get nothing here: no table privilege (sql/080), no EXECUTE on the triggers.

-- -- names, keys and documents ------------------------------------------------------------

create or replace function kb._source_key_hash(key text[])
returns bytea
language sql
immutable
parallel safe
strict
security invoker
set search_path = pg_catalog, pg_temp
-- (a text[]'s text form is the same whatever the settings: immutable)
return pg_catalog.sha256(pg_catalog.convert_to(key::text, 'UTF8'));
comment on function kb._source_key_hash(text[]) is
    'SHA-256 of a table source''s key: what kb.source_queue, kb.source_claims and kb.source_errors '
    'are keyed by (a key as long as the application''s own index allows does not fit theirs), and '
    'how the document of a row whose key is too long to name it is named.';

create or replace function kb._source_document(source_name text, key text[])
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- `/` separates the key's columns: inside a value it is %2F (and % is %25). A name longer than
-- 2,600 bytes would not fit kb.documents' unique index (2,704 bytes an entry): such a row's
-- document is named by its key's hash, %sha256:<hex> (no escaped value starts with %s).
return (select case when pg_catalog.octet_length(n.name) <= 2600 then n.name
                    else 'table:' || source_name || '/%sha256:'
                         || pg_catalog.encode(kb._source_key_hash(key), 'hex') end
          from (select 'table:' || source_name || '/'
                       || pg_catalog.array_to_string(
                              array(select pg_catalog.replace(pg_catalog.replace(k.v, '%', '%25'), '/', '%2F')
                                      from pg_catalog.unnest(key) with ordinality as k(v, n) order by k.n),
                              '/')) as n(name));
comment on function kb._source_document(text, text[]) is
    'The document source of a row of a table source: table:<source>/<key column values>, / and % '
    'escaped inside a value; table:<source>/%sha256:<hex of kb._source_key_hash> when that would '
    'be over 2,600 bytes.';

create or replace function kb._source_document_key(prefix text, document_source text)
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
return array(select pg_catalog.replace(pg_catalog.replace(k.v, '%2F', '/'), '%25', '%')
               from pg_catalog.unnest(pg_catalog.string_to_array(
                        pg_catalog.substr(document_source, pg_catalog.length(prefix) + 1), '/'))
                    with ordinality as k(v, n)
              order by k.n);
comment on function kb._source_document_key(text, text) is
    'The key values of a table source''s document source (kb._source_document read back).';

create or replace function kb._source_keys(keys jsonb)
returns table (key text[])
language sql
immutable
parallel safe
rows 100
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select array(select x.v from pg_catalog.jsonb_array_elements_text(e.k) with ordinality as x(v, n)
                  order by x.n)
      from pg_catalog.jsonb_array_elements(keys) as e(k);
end;
comment on function kb._source_keys(jsonb) is
    'Keys passed as a JSON array of arrays of strings, as text[] (how the worker hands them over).';

create or replace function kb._source_backoff(attempts integer)
returns interval
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
return least(interval '1 hour',
                        interval '30 seconds' * pg_catalog.power(2, least(greatest(attempts, 1), 8) - 1));
comment on function kb._source_backoff(integer) is
    'How long a parked row waits before its next retry: 30 s after the first failure, doubling '
    'up to 1 h.';

create or replace function kb._source_by_name(source_name text)
returns kb.table_sources
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    found_source kb.table_sources;
begin
    select * into found_source from kb.table_sources s where s.name = _source_by_name.source_name;
    if not found then
        raise exception 'no table source named "%"', source_name
            using errcode = '42704', hint = 'kbpg sources list (select * from kb.list_table_sources()) shows them';
    end if;
    return found_source;
end
$$;
comment on function kb._source_by_name(text) is
    'The table source of this name; 42704 when there is none.';

create or replace function kb._source_relation_name(relation regclass)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
      from pg_catalog.pg_class c
      join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where c.oid = relation;
end;
comment on function kb._source_relation_name(regclass) is
    'A table''s schema-qualified, quoted name, whatever the search_path; NULL when it is gone.';

create or replace function kb._source_table(s kb.table_sources)
returns regclass
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pg_catalog.pg_class c where c.oid = s.relation) then
        raise exception 'the table of table source "%" was dropped (it was %)', s.name, s.relation_name
            using errcode = 'KB010',
                  hint = format('re-create %s and run: kbpg sources resync %s;  or: kbpg sources remove %s '
                                '(its documents stay searchable until then; --drop-documents deletes them)',
                                s.relation_name, s.name, s.name);
    end if;
    return s.relation;
end
$$;
comment on function kb._source_table(kb.table_sources) is
    'The source''s table; SQLSTATE KB010 naming it and what to run when it was dropped.';

-- -- checking a definition against the table ----------------------------------------------

create or replace function kb._source_attribute(relation regclass, column_name text)
returns table (type_name text, category "char", element_category "char", base_type oid,
               element_type oid)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select pg_catalog.format_type(a.atttypid, a.atttypmod), t.typcategory, e.typcategory,
           case when t.typtype = 'd' then t.typbasetype else t.oid end, e.oid
      from pg_catalog.pg_attribute a
      join pg_catalog.pg_type t on t.oid = a.atttypid
      left join pg_catalog.pg_type e on e.oid = t.typelem and t.typcategory = 'A'
     where a.attrelid = relation and a.attname = column_name and a.attnum > 0
       and not a.attisdropped;
end;
comment on function kb._source_attribute(regclass, text) is
    'A column''s type, its type category and (for an array) its element''s category; no row '
    'when the table has no such column.';

create or replace function kb._source_check_column(
    relation regclass,
    column_name text,
    parameter text,
    kind text
)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    found_type text;
    found_category "char";
    found_element "char";
    found_base oid;
    found_element_type oid;
begin
    select a.type_name, a.category, a.element_category, a.base_type, a.element_type
      into found_type, found_category, found_element, found_base, found_element_type
      from kb._source_attribute(relation, column_name) a;
    if not found then
        raise exception 'column "%" of % does not exist (%)', column_name, relation, parameter
            using errcode = '42703',
                  hint = 'its columns: ' || (select pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' order by a.attnum)
                                                from pg_catalog.pg_attribute a
                                               where a.attrelid = relation and a.attnum > 0 and not a.attisdropped);
    end if;
    if kind = 'text' and found_category <> 'S' then
        raise exception 'column "%" of % is %, not text (%)', column_name, relation, found_type, parameter
            using errcode = '42804',
                  hint = 'the text column must be text, varchar or char; for another type add one, e.g. '
                         'alter table ... add column body_text text generated always as (...) stored';
    elsif kind = 'list'
          and not (found_category in ('S', 'N', 'E') or found_base = 'pg_catalog.uuid'::regtype
                   or (found_category = 'A' and (found_element in ('S', 'N', 'E')
                                                 or found_element_type = 'pg_catalog.uuid'::regtype))) then
        raise exception 'column "%" of % is %, not a list of names (%)', column_name, relation, found_type, parameter
            using errcode = '42804',
                  hint = 'use a text[] column (several names) or a column of one name (text, a number, '
                         'a uuid or an enum)';
    elsif kind = 'scalar' and found_category = 'A' then
        raise exception 'column "%" of % is %, an array (%)', column_name, relation, found_type, parameter
            using errcode = '42804', hint = 'use a column that holds one value';
    elsif kind = 'key' and not (found_category in ('S', 'D', 'B', 'E')
                                or (found_category = 'N' and found_base not in ('pg_catalog.float4'::regtype,
                                                                                'pg_catalog.float8'::regtype))
                                or found_base = 'pg_catalog.uuid'::regtype) then
        raise exception 'column "%" of % is %, which cannot be a table source''s key (%)',
                column_name, relation, found_type, parameter
            using errcode = '42804',
                  hint = 'a key column holds integers, numerics, text, uuids, dates, times, booleans or enums';
    end if;
end
$$;
comment on function kb._source_check_column(regclass, text, text, text) is
    'Raise 42703 (with the table''s columns) when the column is missing, 42804 when its type '
    'cannot serve as kind: text (string types), list (text[] or text), scalar (no array) or key.';

create or replace function kb._source_key_columns(relation regclass, id text)
returns text[]
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    keys text[];
    k text;
    key_set text[];
begin
    if id is null then
        select array(select a.attname::text
                       from pg_catalog.unnest(i.indkey) with ordinality as u(attnum, n)
                       join pg_catalog.pg_attribute a on a.attrelid = i.indrelid and a.attnum = u.attnum
                      order by u.n)
          into keys
          from pg_catalog.pg_index i where i.indrelid = relation and i.indisprimary;
        if keys is null then
            raise exception '% has no primary key', relation
                using errcode = '42P10',
                      hint = 'name a unique, NOT NULL column: id => ''column'' (or several: id => ''a, b'')';
        end if;
        if pg_catalog.cardinality(keys) > 1 then
            raise exception '% has a composite primary key (%)', relation, pg_catalog.array_to_string(keys, ', ')
                using errcode = '42P10',
                      hint = format('name its columns explicitly: id => %L', pg_catalog.array_to_string(keys, ', '));
        end if;
    else
        keys := array(select pg_catalog.btrim(k.v, ' "')
                        from pg_catalog.unnest(pg_catalog.string_to_array(pg_catalog.btrim(id, '{} '), ','))
                             with ordinality as k(v, n)
                       order by k.n);
        if pg_catalog.cardinality(keys) = 0 or '' = any (keys) then
            raise exception 'id => % names no column', pg_catalog.quote_literal(id)
                using errcode = '22023', hint = 'id => ''id'', or several columns: id => ''tenant_id, id''';
        end if;
        if (select pg_catalog.count(distinct v) from pg_catalog.unnest(keys) as v) <> pg_catalog.cardinality(keys) then
            raise exception 'id => % names a column twice', pg_catalog.quote_literal(id) using errcode = '22023';
        end if;
    end if;
    foreach k in array keys loop
        perform kb._source_check_column(relation, k, 'id', 'key');
        if not (select a.attnotnull from pg_catalog.pg_attribute a
                 where a.attrelid = relation and a.attname = k) then
            raise exception 'key column "%" of % may be NULL', k, relation
                using errcode = '42P10',
                      hint = format('a row is found by its key: alter table %s alter column %I set not null', relation, k);
        end if;
    end loop;
    select array(select v from pg_catalog.unnest(keys) as v order by v) into key_set;
    if not exists (
        select 1 from pg_catalog.pg_index i
         where i.indrelid = relation and i.indisunique and i.indpred is null and i.indexprs is null
           and i.indnkeyatts = pg_catalog.cardinality(keys)
           and array(select a.attname::text
                       from pg_catalog.unnest(i.indkey[0:i.indnkeyatts - 1]) as u(attnum)
                       join pg_catalog.pg_attribute a on a.attrelid = i.indrelid and a.attnum = u.attnum
                      order by 1) = key_set) then
        raise exception '% has no unique index on (%)', relation, pg_catalog.array_to_string(keys, ', ')
            using errcode = '42P10',
                  hint = format('a key identifies one row: alter table %s add unique (%s)', relation,
                                (select pg_catalog.string_agg(pg_catalog.quote_ident(v), ', ') from pg_catalog.unnest(keys) as v));
    end if;
    return keys;
end
$$;
comment on function kb._source_key_columns(regclass, text) is
    'The key columns of a table source: `id` (one column, or several separated by commas) or the '
    'single-column primary key; each NOT NULL, of a key type, with a unique index on exactly '
    'them. 42P10 (with the statement to fix it) otherwise.';

create or replace function kb._source_check_definition(
    relation regclass,
    text_column text,
    title_column text,
    groups_column text,
    category_column text,
    labels_column text,
    metadata_columns text[]
)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    m text;
begin
    if text_column is null or text_column = '' then
        raise exception 'a table source needs a text column' using errcode = '22023',
            hint = 'text => ''body'' (the column whose text is chunked, embedded and indexed)';
    end if;
    perform kb._source_check_column(relation, text_column, 'text', 'text');
    if title_column is not null then
        perform kb._source_check_column(relation, title_column, 'title', 'scalar');
    end if;
    if groups_column is not null then
        perform kb._source_check_column(relation, groups_column, 'groups', 'list');
    end if;
    if category_column is not null then
        perform kb._source_check_column(relation, category_column, 'category', 'scalar');
    end if;
    if labels_column is not null then
        perform kb._source_check_column(relation, labels_column, 'labels', 'list');
    end if;
    if pg_catalog.cardinality(metadata_columns) > 50 then
        raise exception 'metadata => names % columns, over 50', pg_catalog.cardinality(metadata_columns)
            using errcode = '22023';
    end if;
    foreach m in array coalesce(metadata_columns, '{}') loop
        if m is null or m = '' then
            raise exception 'metadata => holds an empty column name' using errcode = '22023',
                hint = 'metadata => ''{author, updated_at}''';
        end if;
        perform kb._source_check_column(relation, m, 'metadata', 'any');
    end loop;
end
$$;
comment on function kb._source_check_definition(regclass, text, text, text, text, text, text[]) is
    'Check a table source''s columns against its table: 42703 for a missing column, 42804 for a '
    'type the column cannot serve as, 22023 for no text column.';

-- -- the triggers -----------------------------------------------------------------------------

create or replace function kb._source_builtin_type(type_oid oid)
returns boolean
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
-- a domain's base type and an array's element, down to a type that is neither
return (with recursive t(oid, n) as (
            select type_oid, 0
            union all
            select case when y.typtype = 'd' then y.typbasetype else y.typelem end, t.n + 1
              from t join pg_catalog.pg_type y on y.oid = t.oid
             where (y.typtype = 'd' or (y.typcategory = 'A' and y.typelem <> 0)) and t.n < 20)
        select t.oid < 16384 from t order by t.n desc limit 1);
comment on function kb._source_builtin_type(oid) is
    'Whether a type is built in (OID below 16384, FirstNormalObjectId) once its domains and array '
    'elements are looked through: to_jsonb of such a value runs only PostgreSQL''s own code.';

create or replace function kb._source_text_sql(relation regclass, column_name text, alias text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- No application code, ever (issue 38): to_jsonb looks up a cast to json for a type that is not
-- built in (json_categorize_type: `typoid >= FirstNormalObjectId` after getBaseType) and runs
-- the function the application wrote, so it is used only for built-in types (whose text it
-- keeps as queued before: a timestamp's ISO form, whatever DateStyle). Any other type's text
-- comes from format('%s', v), which calls the type's OUTPUT function and looks up no cast
-- (varlena.c text_format_string_conversion: getTypeOutputInfo + OutputFunctionCall). An output
-- function is a base type's typoutput (enum_out, record_out, array_out, range_out call their
-- parts' output functions in turn) and a base type can only be created by a superuser with C
-- functions (CREATE TYPE: "you must be a superuser to create a new base type"): nothing an
-- application role wrote.
-- (integers, text, varchar and uuid: their own output text, the text to_jsonb gives them,
-- without a jsonb made and taken apart for every row)
return (select case when a.atttypid in ('int2'::regtype::oid, 'int4'::regtype::oid, 'int8'::regtype::oid,
                                        'text'::regtype::oid, 'varchar'::regtype::oid, 'uuid'::regtype::oid)
                    then format('pg_catalog.textin(pg_catalog.%s(%I.%I))',
                                (select y.typoutput::text from pg_catalog.pg_type y where y.oid = a.atttypid),
                                alias, column_name)
                    when kb._source_builtin_type(a.atttypid)
                    then format('(pg_catalog.to_jsonb(%I.%I) operator(pg_catalog.#>>) ''{}''::text[])',
                                alias, column_name)
                    else format('pg_catalog.format(''%%s'', %I.%I)', alias, column_name) end
          from pg_catalog.pg_attribute a
         where a.attrelid = relation and a.attname = column_name and a.attnum > 0
           and not a.attisdropped);
comment on function kb._source_text_sql(regclass, text, text) is
    'SQL for a column''s value as text that runs none of the application''s code: to_jsonb ->> '
    'for a built-in type, format(''%s'') (the type''s output function) for any other.';

create or replace function kb._source_base_type(relation regclass, column_name text)
returns oid
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
return (with recursive d(oid, n) as (
            select a.atttypid, 0 from pg_catalog.pg_attribute a
             where a.attrelid = relation and a.attname = column_name and a.attnum > 0 and not a.attisdropped
            union all
            select y.typbasetype, d.n + 1 from d join pg_catalog.pg_type y on y.oid = d.oid
             where y.typtype = 'd' and d.n < 20)
        select d.oid from d order by d.n desc limit 1);
comment on function kb._source_base_type(regclass, text) is
    'A column''s type, or its domain''s base type (through domains over domains).';

create or replace function kb._source_read_columns(source_id integer)
returns text[]
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
return (select array(select distinct c
                       from pg_catalog.unnest(array[s.text_column, s.title_column, s.groups_column,
                                                    s.category_column, s.labels_column]
                                              || s.metadata_columns) as c
                      where c is not null and c <> all (s.key_columns)
                      order by c)
          from kb.table_sources s where s.id = _source_read_columns.source_id);
comment on function kb._source_read_columns(integer) is
    'The columns a table source reads besides its key, by name: what an UPDATE is compared by.';

create or replace function kb._source_types_changed_sql(source_id integer)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- by attribute number and type OID: a static query on pg_attribute's index, planned once
return (select format('(select pg_catalog.array_agg(a.atttypid order by a.attnum) from pg_catalog.pg_attribute a '
                      'where a.attrelid operator(pg_catalog.=) %s::pg_catalog.oid '
                      'and a.attnum operator(pg_catalog.=) any (%L::pg_catalog.int2[]) and not a.attisdropped) '
                      'is distinct from %L::pg_catalog.oid[]',
                      s.relation::oid,
                      pg_catalog.array_agg(a.attnum order by a.attnum)::text,
                      pg_catalog.array_agg(a.atttypid order by a.attnum)::text)
          from kb.table_sources s
          join pg_catalog.pg_attribute a
            on a.attrelid = s.relation and a.attnum > 0 and not a.attisdropped
           and a.attname = any (s.key_columns || kb._source_read_columns(s.id))
         where s.id = _source_types_changed_sql.source_id
         group by s.relation);
comment on function kb._source_types_changed_sql(integer) is
    'SQL that is true once a column a table source reads (its key included) has another type, or '
    'is gone, since this was built: a compiled trigger''s statements are built for those types.';

create or replace function kb._source_compare_sql(relation regclass, column_name text, ordinal integer)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- Whether the value in column v<ordinal> of o (old rows) and n (new rows) differs. For a type
-- whose built-in equality holds exactly when the output text is the same (no 1.0 = 1.00, no
-- '1 day' = '24 hours', no -0 = 0), its operator, found in pg_catalog (operators are never looked
-- up in pg_temp) and, for text, under the "C" collation (a nondeterministic collation of the
-- application's could call 'A' and 'a' equal). Any other type by its output text, format('%s').
return (select case
                   when b in ('text'::regtype::oid, 'varchar'::regtype::oid, 'text[]'::regtype::oid,
                              'varchar[]'::regtype::oid)
                   then format('n.v%1$s collate pg_catalog."C" is distinct from o.v%1$s collate pg_catalog."C"', ordinal)
                   when b in ('int2'::regtype::oid, 'int4'::regtype::oid, 'int8'::regtype::oid,
                              'bool'::regtype::oid, 'uuid'::regtype::oid, 'date'::regtype::oid,
                              'timestamp'::regtype::oid, 'timestamptz'::regtype::oid,
                              'int4[]'::regtype::oid, 'int8[]'::regtype::oid)
                   then format('n.v%1$s is distinct from o.v%1$s', ordinal)
                   else format('(case when n.v%1$s is null then null else pg_catalog.format(''%%s'', n.v%1$s) end) '
                               'is distinct from (case when o.v%1$s is null then null else pg_catalog.format(''%%s'', o.v%1$s) end)',
                               ordinal) end
          from (select kb._source_base_type(relation, column_name) as b) as t);
comment on function kb._source_compare_sql(regclass, text, integer) is
    'SQL for "column v<ordinal> of o and n differ": the built-in equality of a type whose equal '
    'values have the same output text (text under "C"), else the output texts compared.';

create or replace function kb._source_change_template(
    source_id integer,
    new_rows text,
    old_rows text,
    id_sql text,
    op_sql text
)
returns text
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.table_sources;
    read_columns text[];
    single boolean;
    new_key text;
    old_key text;
begin
    select * into s from kb.table_sources t where t.id = _source_change_template.source_id;
    read_columns := kb._source_read_columns(s.id);
    -- one key column: its text pairs the rows (hashed or sorted as text), made an array to queue
    single := pg_catalog.cardinality(s.key_columns) = 1;
    new_key := (select case when single then pg_catalog.min(kb._source_text_sql(s.relation, k.c, 'n'))
                            else 'array[' || pg_catalog.string_agg(kb._source_text_sql(s.relation, k.c, 'n'), ', ' order by k.n)
                                 || ']::text[]' end
                  from pg_catalog.unnest(s.key_columns) with ordinality as k(c, n));
    old_key := (select case when single then pg_catalog.min(kb._source_text_sql(s.relation, k.c, 'o'))
                            else 'array[' || pg_catalog.string_agg(kb._source_text_sql(s.relation, k.c, 'o'), ', ' order by k.n)
                                 || ']::text[]' end
                  from pg_catalog.unnest(s.key_columns) with ordinality as k(c, n));
    if new_rows is not null and old_rows is null then
        return format('insert into kb_data.source_queue (source_id, key, op) select %s, %s, %s from %s as n '
                      'on conflict do nothing', id_sql,
                      case when single then 'array[' || new_key || ']::text[]' else new_key end, op_sql, new_rows);
    elsif old_rows is not null and new_rows is null then
        return format('insert into kb_data.source_queue (source_id, key, op) select %s, %s, ''D'' from %s as o '
                      'on conflict do nothing', id_sql,
                      case when single then 'array[' || old_key || ']::text[]' else old_key end, old_rows);
    end if;
    -- an update: rows paired by the text of their keys; a key only the old rows have is deleted,
    -- one only the new rows have is new, one both have is queued when a column the source reads
    -- differs (kb._source_compare_sql: built-in equality or the output text; no operator or cast
    -- of the application is called)
    return format(
        'insert into kb_data.source_queue (source_id, key, op) '
        'select %1$s, %2$s, case when n.key is null then ''D'' else ''U'' end '
        '  from (select %3$s as key%4$s from %5$s as o) as o '
        '  full join (select %6$s as key%7$s from %8$s as n) as n '
        '    on n.key operator(pg_catalog.=) o.key '
        ' where n.key is null or o.key is null%9$s '
        'on conflict do nothing',
        id_sql,
        case when single then 'array[coalesce(n.key, o.key)]::text[]' else 'coalesce(n.key, o.key)' end,
        old_key,
        coalesce((select pg_catalog.string_agg(format(', o.%I as v%s', c.name, c.n), '' order by c.n)
                    from pg_catalog.unnest(read_columns) with ordinality as c(name, n)), ''),
        old_rows,
        new_key,
        coalesce((select pg_catalog.string_agg(format(', n.%I as v%s', c.name, c.n), '' order by c.n)
                    from pg_catalog.unnest(read_columns) with ordinality as c(name, n)), ''),
        new_rows,
        coalesce((select pg_catalog.string_agg(' or ' || kb._source_compare_sql(s.relation, c.name, c.n::integer), '' order by c.n)
                    from pg_catalog.unnest(read_columns) with ordinality as c(name, n)), ''));
end
$$;
comment on function kb._source_change_template(integer, text, text, text, text) is
    'The INSERT that queues a statement''s changed rows of a table source, new_rows and old_rows '
    'the row sets (transition tables) it reads, id_sql and op_sql the SQL of the source''s id and '
    'of a new row''s op: keys as kb._source_text_sql gives them, an UPDATE''s rows paired by key '
    'and compared by kb._source_compare_sql, for the column types of this moment.';

create or replace function kb._source_change_sql(source_id integer, new_rows text, old_rows text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
return kb._source_change_template(source_id, new_rows, old_rows, '$1', '$4');
comment on function kb._source_change_sql(integer, text, text) is
    'The INSERT that queues a statement''s changed rows of a table source, new_rows and old_rows '
    'the row sets (transition tables) it reads ($1 the source''s id, $4 the op of a new row); '
    'keys and compared values taken as text by kb._source_text_sql and format(''%s'') only.';

create or replace function kb._source_enqueue()
returns trigger
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
-- as every SECURITY DEFINER function of kbpg's: the plans of its statements are not the caller's
-- to print (debug_print_plan)
set client_min_messages = notice
as $$
-- Runs as kbpg's owner: it evaluates no value of the application's rows with anything but
-- built-in code (kb._source_text_sql: to_jsonb of built-in types, output functions otherwise;
-- text comparisons), and queues only for the source's own table.
declare
    s kb.table_sources;
    statement text;
    n bigint;
begin
    select * into s from kb.table_sources t where t.id = tg_argv[0]::integer;
    -- a removed source (its triggers left by a role that may not drop them): nothing to do
    if not found then
        return null;
    end if;
    if s.relation <> tg_relid and pg_catalog.pg_partition_root(tg_relid) is distinct from s.relation then
        raise exception 'trigger % on % does not belong to table source "%" (table %)',
                tg_name, tg_relid::regclass, s.name, s.relation::oid
            using errcode = '42501',
                  hint = 'kbpg''s triggers are created by kb.add_table_source and queue only their own table''s rows';
    end if;
    perform kb._source_check_persistence(tg_relid);
    if tg_level = 'STATEMENT' then
        statement := kb._source_change_sql(s.id, case when tg_op <> 'DELETE' then 'kbpg_new' end,
                                           case when tg_op <> 'INSERT' then 'kbpg_old' end);
        execute statement using s.id, null::text, null::text, case tg_op when 'INSERT' then 'I' else 'U' end;
    else
        -- a row trigger (a partitioned table's, or one made before revision 0022 that the owner
        -- could not replace): the same statement over the one row, passed as a value
        statement := kb._source_change_sql(s.id, case when tg_op <> 'DELETE' then '(select ($2).*)' end,
                                           case when tg_op <> 'INSERT' then '(select ($3).*)' end);
        if tg_op = 'INSERT' then
            execute statement using s.id, new, new, 'I';
        elsif tg_op = 'DELETE' then
            execute statement using s.id, old, old, 'I';
        else
            execute statement using s.id, new, old, 'U';
        end if;
    end if;
    get diagnostics n = row_count;
    -- a NOTIFY fails a commit when the notification queue is full: skip it well before (the
    -- worker polls as well). No payload: anyone may LISTEN, and the source's name is not theirs
    -- to learn (that some source changed, at that moment, is all a listener is told)
    if n > 0 and s.notify and pg_catalog.pg_notification_queue_usage() < 0.5 then
        perform pg_catalog.pg_notify('kbpg_sync', '');
    end if;
    return null;
end
$$;
comment on function kb._source_enqueue() is
    'Statement trigger of a table source (argument: its id; transition tables kbpg_new / '
    'kbpg_old): adds the changed rows'' keys to kb.source_queue in one INSERT and notifies '
    'kbpg_sync. Security definer so that the application''s roles need no grant on schema kb; it '
    'evaluates the rows with built-in code only, raises 42501 when fired on a table that is not '
    'its source''s, and writes nothing else.';

create or replace function kb._source_enqueue_truncate()
returns trigger
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
begin
    select * into s from kb.table_sources t where t.id = tg_argv[0]::integer;
    if not found then
        return null;
    end if;
    if s.relation <> tg_relid and pg_catalog.pg_partition_root(tg_relid) is distinct from s.relation then
        raise exception 'trigger % on % does not belong to table source "%" (table %)',
                tg_name, tg_relid::regclass, s.name, s.relation::oid
            using errcode = '42501',
                  hint = 'kbpg''s triggers are created by kb.add_table_source and queue only their own table''s rows';
    end if;
    perform kb._source_check_persistence(tg_relid);
    insert into kb_data.source_queue (source_id, key, op) values (s.id, '{}', 'T')
    on conflict do nothing;
    if found and s.notify and pg_catalog.pg_notification_queue_usage() < 0.5 then
        perform pg_catalog.pg_notify('kbpg_sync', '');
    end if;
    return null;
end
$$;
comment on function kb._source_enqueue_truncate() is
    'Statement trigger of a table source on TRUNCATE: queues the source''s empty key, whose worker '
    'deletes the documents of rows that are gone (42501 on a table that is not its source''s).';

-- -- compiled triggers ------------------------------------------------------------------------
--
-- kb._source_enqueue builds its INSERT for every statement and EXECUTEs it, planned each time:
-- ~0.4 ms of a single-row UPDATE's ~0.5 ms overhead (issue 38). A source on a plain table gets
-- a trigger function of its own instead, kb._source_enqueue_<id>(), whose statements are static
-- SQL that PL/pgSQL plans once per session. kb._source_catalog_compile generates it from the
-- catalog only (identifiers through %I, the body passed as one quoted literal). It runs the same
-- statements kb._source_enqueue would build (kb._source_change_template) while the columns keep
-- the types they were built for (one look at pg_attribute a statement), and builds them anew
-- when an ALTER TABLE changed one; it raises when fired on another table or per row. A
-- partitioned table (row triggers) keeps kb._source_enqueue.

create or replace function kb._source_compiled_name(source_id integer)
returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
return '_source_enqueue_' || source_id;
comment on function kb._source_compiled_name(integer) is
    'The name in schema kb of a table source''s compiled trigger function.';

create or replace function kb._source_compile_sql(source_id integer)
returns text
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.table_sources;
    body text;
begin
    select * into s from kb.table_sources t where t.id = _source_compile_sql.source_id;
    body := pg_catalog.concat_ws(E'\n',
        '-- generated by kb._source_catalog_compile for table source ' || pg_catalog.quote_literal(s.name)
            || ' (its table''s OID ' || s.relation::oid || '); see sql/090-table-sources.sql',
        'declare',
        '    queued bigint;',
        'begin',
        '    if tg_relid operator(pg_catalog.<>) ' || s.relation::oid || '::pg_catalog.oid'
            || ' or tg_level operator(pg_catalog.<>) ''STATEMENT'' then',
        '        raise exception ''trigger % on % does not belong to table source %'', tg_name,'
            || ' tg_relid::pg_catalog.regclass, ' || pg_catalog.quote_literal(pg_catalog.quote_ident(s.name)),
        '            using errcode = ''42501'','
            || ' hint = ''kbpg''''s triggers are created by kb.add_table_source and queue only their own table''''s rows'';',
        '    end if;',
        -- the statements below were built for these column types; once one has another type,
        -- the statement is built for the types of now, as kb._source_enqueue does
        '    if ' || kb._source_types_changed_sql(s.id) || ' then',
        '        execute kb._source_change_sql(' || s.id || ', case when tg_op operator(pg_catalog.<>) ''DELETE'''
            || ' then ''kbpg_new'' end, case when tg_op operator(pg_catalog.<>) ''INSERT'' then ''kbpg_old'' end)',
        '            using ' || s.id || ', null::text, null::text,'
            || ' case tg_op when ''INSERT'' then ''I'' else ''U'' end;',
        '    elsif tg_op operator(pg_catalog.=) ''INSERT'' then',
        '        ' || kb._source_change_template(s.id, 'kbpg_new', null, s.id::text, '''I''') || ';',
        '    elsif tg_op operator(pg_catalog.=) ''DELETE'' then',
        '        ' || kb._source_change_template(s.id, null, 'kbpg_old', s.id::text, null) || ';',
        '    else',
        '        ' || kb._source_change_template(s.id, 'kbpg_new', 'kbpg_old', s.id::text, '''U''') || ';',
        '    end if;',
        '    get diagnostics queued = row_count;',
        -- as kb._source_enqueue: no payload, and no NOTIFY near a full notification queue
        '    if queued > 0 and ' || s.notify::text
            || ' and pg_catalog.pg_notification_queue_usage() < 0.5 then',
        '        perform pg_catalog.pg_notify(''kbpg_sync'', '''');',
        '    end if;',
        '    return null;',
        'end');
    -- enable_mergejoin off: an UPDATE pairs its old and new rows by hashing their keys (the
    -- transition tables have no statistics; sorting both was the slower plan)
    return format('create or replace function kb.%I() returns trigger language plpgsql volatile '
                  'security definer set search_path = pg_catalog, pg_temp set client_min_messages = notice '
                  'set enable_mergejoin = off as %L', kb._source_compiled_name(s.id), body);
end
$$;
comment on function kb._source_compile_sql(integer) is
    'The CREATE FUNCTION of a table source''s compiled trigger function: static statements from '
    'kb._source_change_template, run while the columns keep the types they were built for '
    '(kb._source_types_changed_sql), else built as kb._source_enqueue builds them; NOTIFY as '
    'the source says.';

create or replace function kb._source_trigger_names(source_name text)
returns text[]
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
-- _change and _rekey: the row triggers made before revision 0022
return array['kbpg_' || source_name || '_insert', 'kbpg_' || source_name || '_update',
             'kbpg_' || source_name || '_delete', 'kbpg_' || source_name || '_truncate',
             'kbpg_' || source_name || '_change', 'kbpg_' || source_name || '_rekey'];
comment on function kb._source_trigger_names(text) is
    'The names a table source''s triggers have (and had before revision 0022) on its table.';

create or replace function kb._source_triggers(source_id integer)
returns text[]
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.table_sources;
    prefix text;
    t text;
    compiled regprocedure;
    call text;
begin
    select * into s from kb.table_sources t where t.id = _source_triggers.source_id;
    prefix := 'kbpg_' || s.name;
    foreach t in array kb._source_trigger_names(s.name) loop
        execute format('drop trigger if exists %I on %s', t, s.relation);
    end loop;
    if (select c.relkind from pg_catalog.pg_class c where c.oid = s.relation) = 'p' then
        -- a partition written directly fires its own statement triggers, not the parent's: row
        -- triggers, which every partition inherits (no transition tables on those)
        execute format('create trigger %I after insert on %s for each row execute function kb._source_enqueue(%L)',
                       prefix || '_insert', s.relation, s.id);
        execute format('create trigger %I after update on %s for each row execute function kb._source_enqueue(%L)',
                       prefix || '_update', s.relation, s.id);
        execute format('create trigger %I after delete on %s for each row execute function kb._source_enqueue(%L)',
                       prefix || '_delete', s.relation, s.id);
    else
        -- one trigger an event: PostgreSQL takes transition tables neither with several events
        -- nor with UPDATE OF (an update that changed nothing the source reads queues nothing).
        -- The source's compiled function where it has one, else kb._source_enqueue(id)
        compiled := kb._source_catalog_compile(s.id);
        call := coalesce(compiled::text, format('kb._source_enqueue(%L)', s.id));
        execute format('create trigger %I after insert on %s referencing new table as kbpg_new '
                       'for each statement execute function %s',
                       prefix || '_insert', s.relation, call);
        execute format('create trigger %I after update on %s referencing old table as kbpg_old '
                       'new table as kbpg_new for each statement execute function %s',
                       prefix || '_update', s.relation, call);
        execute format('create trigger %I after delete on %s referencing old table as kbpg_old '
                       'for each statement execute function %s',
                       prefix || '_delete', s.relation, call);
    end if;
    execute format('create trigger %I after truncate on %s for each statement '
                   'execute function kb._source_enqueue_truncate(%L)',
                   prefix || '_truncate', s.relation, s.id);
    return array[prefix || '_insert', prefix || '_update', prefix || '_delete', prefix || '_truncate'];
end
$$;
comment on function kb._source_triggers(integer) is
    'Create (or re-create) a table source''s four triggers on its table: statement triggers with '
    'transition tables on insert, update and delete (row triggers on a partitioned table), and '
    'truncate; drops the row triggers made before revision 0022. Needs TRIGGER on the table.';

-- -- defining sources -------------------------------------------------------------------------

create or replace function kb._source_check_persistence(relation regclass)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    -- a temporary table is one session's: no worker could read it, and only its session's code
    -- (its temp types, casts, functions) could act on its rows
    if exists (select 1 from pg_catalog.pg_class c where c.oid = relation and c.relpersistence = 't') then
        raise exception 'table % is temporary: a table source reads a permanent table', relation
            using errcode = '42809',
                  hint = 'kbpg sync reads the table from a session of its own: create it without TEMPORARY '
                         '(an UNLOGGED table will do)';
    end if;
end
$$;
comment on function kb._source_check_persistence(regclass) is
    'Raise 42809 when the table is temporary (relpersistence t): no table source reads one, and '
    'no trigger of kbpg''s queues its rows.';

create or replace function kb._source_check_writer()
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    -- the role the session acts as, also inside the SECURITY DEFINER helpers below (where
    -- current_user is the owner): SET ROLE's, else the login role (sql/015)
    caller constant oid := kb._access_caller();
    writer oid;
    writer_name text := 'kbpg_writer';
begin
    -- a role that may not read kb's settings is no writer (writers read every kb table)
    if pg_catalog.has_table_privilege('kb.access_settings', 'SELECT') then
        select a.writer_oid,
               coalesce((select r.rolname::text from pg_catalog.pg_roles r where r.oid = a.writer_oid),
                        a.writer_role, writer_name)
          into writer, writer_name
          from kb.access_settings a;
    end if;
    -- a superuser, the catalog's owner (or a role that may use it), the writer role by its OID
    if coalesce((select r.rolsuper from pg_catalog.pg_roles r where r.oid = caller), false)
       or coalesce(pg_catalog.pg_has_role(caller, (select c.relowner from pg_catalog.pg_class c
                                                    where c.oid = 'kb_data.table_sources'::pg_catalog.regclass),
                                          'USAGE'), false)
       or coalesce(pg_catalog.pg_has_role(caller, writer, 'USAGE'), false) then
        return;
    end if;
    raise exception 'role % may not define table sources',
            coalesce((select r.rolname::text from pg_catalog.pg_roles r where r.oid = caller), session_user)
        using errcode = '42501',
              hint = format('kbpg''s writer role may: grant %I to %I;  (run by the owner of schema kb)',
                            writer_name,
                            coalesce((select r.rolname::text from pg_catalog.pg_roles r where r.oid = caller),
                                     session_user));
end
$$;
comment on function kb._source_check_writer() is
    'Raise 42501 (naming the grant) unless the calling role (kb._access_caller(): right inside a '
    'SECURITY DEFINER function too) is a superuser, may use the catalog''s owner or kbpg''s writer '
    'role: who may define, change and remove table sources.';

create or replace function kb._source_check_trigger_privilege(relation regclass)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    caller constant oid := kb._access_caller();
    kind "char";
    owner_name text;
begin
    select c.relkind, c.relowner::regrole::text into kind, owner_name
      from pg_catalog.pg_class c where c.oid = relation;
    if kind is null then
        raise exception 'table % does not exist', relation using errcode = '42P01';
    end if;
    if kind not in ('r', 'p') then
        raise exception '% is not a table', relation
            using errcode = '42809', hint = 'a table source reads a table (or a partitioned table)';
    end if;
    perform kb._source_check_persistence(relation);
    -- the caller's privilege, not current_user's (the owner's, inside the catalog helpers)
    if not coalesce(pg_catalog.has_table_privilege(caller, relation, 'TRIGGER'), false) then
        raise exception 'role % may not create triggers on %',
                coalesce((select r.rolname::text from pg_catalog.pg_roles r where r.oid = caller), session_user),
                relation
            using errcode = '42501',
                  hint = format('its owner runs: grant trigger on %s to %I;  (or add the source as %s)',
                                relation,
                                coalesce((select r.rolname::text from pg_catalog.pg_roles r where r.oid = caller),
                                         session_user),
                                owner_name);
    end if;
end
$$;
comment on function kb._source_check_trigger_privilege(regclass) is
    'Raise unless the relation is a permanent table (42P01 gone, 42809 not a table or temporary) '
    'on which the calling role (kb._access_caller()) may create triggers (42501, naming the grant).';

create or replace function kb._source_check_privileges(relation regclass)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    perform kb._source_check_writer();
    perform kb._source_check_trigger_privilege(relation);
end
$$;
comment on function kb._source_check_privileges(regclass) is
    'Raise 42501, naming the grant to ask for, unless the calling role is kbpg''s writer (or the '
    'owner) and may create triggers on the table; 42809 unless it is a permanent table.';

-- -- the catalog: the owner's table, written through these helpers only -------------------------
--
-- Each is SECURITY DEFINER (writers have no INSERT, UPDATE or DELETE on kb.table_sources,
-- sql/080), does one job, checks its caller (kb._source_check_writer) and validates every
-- argument before it writes: a source names only a permanent table its definer may put
-- triggers on, with columns kb._source_check_definition accepts. They evaluate the caller's
-- arguments with built-in code only (regclass, text, text[] and pg_catalog lookups).

create or replace function kb._source_catalog_insert(
    source_name text,
    relation regclass,
    id text,
    text_column text,
    title_column text,
    groups_column text,
    category_column text,
    labels_column text,
    metadata_columns text[],
    notify boolean
)
returns integer
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    keys text[];
    new_id integer;
begin
    perform kb._source_check_writer();
    if source_name is null or source_name operator(pg_catalog.!~) '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}$' then
        raise exception 'invalid table source name %', coalesce(pg_catalog.quote_literal(source_name), 'NULL')
            using errcode = '22023',
                  hint = 'up to 40 letters, digits, _ . or -, e.g. ''articles'' (documents are table:<name>/<key>)';
    end if;
    if relation is null then
        raise exception 'source_table is NULL' using errcode = '22023', hint = 'e.g. ''public.articles''';
    end if;
    perform kb._source_check_trigger_privilege(relation);
    if exists (select 1 from kb.table_sources s where s.name operator(pg_catalog.=) source_name) then
        raise exception 'table source "%" already exists', source_name
            using errcode = '42710', hint = 'change it with kb.alter_table_source, or remove it first';
    end if;
    keys := kb._source_key_columns(relation, id);
    perform kb._source_check_definition(relation, text_column, title_column, groups_column,
                                        category_column, labels_column, coalesce(metadata_columns, '{}'));
    insert into kb_data.table_sources as s (name, relation, relation_name, key_columns, text_column, title_column,
                                       groups_column, category_column, labels_column, metadata_columns, notify)
    values (source_name, relation, kb._source_relation_name(relation), keys, text_column, title_column,
            groups_column, category_column, labels_column, coalesce(metadata_columns, '{}'),
            coalesce(notify, true))
    returning s.id into new_id;
    return new_id;
end
$$;
comment on function kb._source_catalog_insert(text, regclass, text, text, text, text, text, text, text[], boolean) is
    'Record a new table source (kb.add_table_source''s write; the owner''s rights): checks the '
    'caller is a writer, the name, that the table is a permanent one the caller may put triggers '
    'on, its key (id: column names, default the primary key) and columns; returns its id.';

create or replace function kb._source_catalog_define(
    source_id integer,
    text_column text,
    title_column text,
    groups_column text,
    category_column text,
    labels_column text,
    metadata_columns text[],
    notify boolean
)
returns void
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
begin
    perform kb._source_check_writer();
    select * into s from kb.table_sources t where t.id = _source_catalog_define.source_id for update;
    if not found then
        raise exception 'no table source with id %', coalesce(source_id::text, 'NULL') using errcode = '42704';
    end if;
    perform kb._source_check_trigger_privilege(kb._source_table(s));
    perform kb._source_check_definition(s.relation, text_column, title_column, groups_column,
                                        category_column, labels_column, coalesce(metadata_columns, '{}'));
    -- every row is read again (a document whose text and fields come out the same is not
    -- rewritten: ingest compares content hashes)
    update kb_data.table_sources t
       set text_column = _source_catalog_define.text_column,
           title_column = _source_catalog_define.title_column,
           groups_column = _source_catalog_define.groups_column,
           category_column = _source_catalog_define.category_column,
           labels_column = _source_catalog_define.labels_column,
           metadata_columns = coalesce(_source_catalog_define.metadata_columns, '{}'),
           relation_name = kb._source_relation_name(s.relation),
           notify = coalesce(_source_catalog_define.notify, t.notify),
           version = t.version + 1, altered_at = pg_catalog.now(),
           backfill_state = 'pending', backfill_cursor = null, backfill_total = null,
           backfill_enqueued = 0, backfill_started_at = null, backfill_done_at = null
     where t.id = s.id
       and t.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._source_catalog_define(integer, text, text, text, text, text, text[], boolean) is
    'Change a table source''s columns and notify (NULL keeps it) and start its backfill over '
    '(kb.alter_table_source''s write; the owner''s rights): checks the caller is a writer who may '
    'put triggers on the table and the columns against it.';

create or replace function kb._source_catalog_reset(source_id integer)
returns void
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
begin
    perform kb._source_check_writer();
    select * into s from kb.table_sources t where t.id = _source_catalog_reset.source_id for update;
    if not found then
        raise exception 'no table source with id %', coalesce(source_id::text, 'NULL') using errcode = '42704';
    end if;
    perform kb._source_check_trigger_privilege(kb._source_table(s));
    update kb_data.table_sources t
       set relation_name = kb._source_relation_name(s.relation),
           backfill_state = 'pending', backfill_cursor = null, backfill_total = null,
           backfill_enqueued = 0, backfill_started_at = null, backfill_done_at = null
     where t.id = s.id
       and t.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._source_catalog_reset(integer) is
    'Start a table source''s backfill over (kb.resync_table_source''s write; the owner''s rights): '
    'checks the caller is a writer who may put triggers on the table.';

create or replace function kb._source_catalog_rebind(source_id integer, relation regclass)
returns void
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
begin
    perform kb._source_check_writer();
    select * into s from kb.table_sources t where t.id = _source_catalog_rebind.source_id for update;
    if not found then
        raise exception 'no table source with id %', coalesce(source_id::text, 'NULL') using errcode = '42704';
    end if;
    if exists (select 1 from pg_catalog.pg_class c where c.oid = s.relation) then
        raise exception 'the table of table source "%" is still there (%)', s.name, s.relation
            using errcode = '55000', hint = 'a source is bound to another table only once its own is dropped';
    end if;
    if relation is null then
        raise exception 'source_table is NULL' using errcode = '22023';
    end if;
    perform kb._source_check_trigger_privilege(relation);
    -- the same key columns and columns, checked against the new table
    perform kb._source_key_columns(relation, pg_catalog.array_to_string(s.key_columns, ','));
    perform kb._source_check_definition(relation, s.text_column, s.title_column, s.groups_column,
                                        s.category_column, s.labels_column, s.metadata_columns);
    update kb_data.table_sources t
       set relation = _source_catalog_rebind.relation,
           relation_name = kb._source_relation_name(_source_catalog_rebind.relation),
           version = t.version + 1, altered_at = pg_catalog.now()
     where t.id = s.id
       and t.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._source_catalog_rebind(integer, regclass) is
    'Bind a table source whose table was dropped to the table re-created in its place '
    '(kb.resync_table_source''s write; the owner''s rights): checks the caller is a writer who '
    'may put triggers on that permanent table, and the source''s key and columns against it.';

create or replace function kb._source_catalog_delete(source_id integer)
returns void
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
begin
    perform kb._source_check_writer();
    delete from kb_data.table_sources t where t.id = _source_catalog_delete.source_id
                                          and t.kb_id = (select kb._current_kb());
    if not found then
        raise exception 'no table source with id %', coalesce(source_id::text, 'NULL') using errcode = '42704';
    end if;
    -- its compiled trigger function, and with it any trigger its table's owner left on it
    execute format('drop function if exists kb.%I() cascade', kb._source_compiled_name(source_id));
end
$$;
comment on function kb._source_catalog_delete(integer) is
    'Delete a table source''s catalog row (kb.remove_table_source''s write; the owner''s rights): '
    'checks the caller is a writer.';

create or replace function kb._source_catalog_compile(source_id integer)
returns regprocedure
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
    name text := kb._source_compiled_name(source_id);
    writer text;
    compiled regprocedure;
begin
    perform kb._source_check_writer();
    select * into s from kb.table_sources t where t.id = _source_catalog_compile.source_id;
    if not found then
        raise exception 'no table source with id %', coalesce(source_id::text, 'NULL') using errcode = '42704';
    end if;
    -- whoever calls (kb._source_triggers) may put triggers on the table, a permanent one
    perform kb._source_check_trigger_privilege(kb._source_table(s));
    if (select c.relkind from pg_catalog.pg_class c where c.oid = s.relation) <> 'r' then
        -- kb._source_enqueue serves it; a compiled function of an earlier definition goes, with
        -- any trigger left on it
        execute format('drop function if exists kb.%I() cascade', name);
        return null;
    end if;
    execute kb._source_compile_sql(s.id);
    compiled := format('kb.%I()', name)::regprocedure;
    -- creating a trigger takes EXECUTE: the writer role's (whose members add sources) and the owner's
    execute format('revoke execute on function %s from public', compiled);
    select r.rolname into writer
      from kb.access_settings a join pg_catalog.pg_roles r on r.oid = a.writer_oid;
    if writer is not null then
        execute format('grant execute on function %s to %I', compiled, writer);
    end if;
    return compiled;
end
$$;
comment on function kb._source_catalog_compile(integer) is
    'Create (or replace) a table source''s compiled trigger function from the catalog and return '
    'it, or drop it and return NULL when kb._source_enqueue is to serve the source (a partitioned '
    'table); the owner''s rights, for a writer who may put triggers on the table.';

create or replace function kb._source_backfill_lock(source_id integer)
returns kb.table_sources
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
begin
    perform kb._source_check_writer();
    -- one worker at a time moves a source's cursor (the row lock, held to the caller's commit)
    select * into s from kb.table_sources t where t.id = _source_backfill_lock.source_id
       for update skip locked;
    return s;
end
$$;
comment on function kb._source_backfill_lock(integer) is
    'Lock a table source''s row for the caller''s backfill page (SKIP LOCKED: all NULL while '
    'another worker holds it, or when there is no such source); the owner''s rights, for writers.';

create or replace function kb._source_backfill_save(
    source_id integer,
    state text,
    cursor_key text[],
    total bigint,
    enqueued bigint
)
returns void
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
as $$
declare
    s kb.table_sources;
begin
    perform kb._source_check_writer();
    select * into s from kb.table_sources t where t.id = _source_backfill_save.source_id for update;
    if not found then
        raise exception 'no table source with id %', coalesce(source_id::text, 'NULL') using errcode = '42704';
    end if;
    if state is null or state not in ('pending', 'running', 'done') then
        raise exception 'invalid backfill state %', coalesce(pg_catalog.quote_literal(state), 'NULL')
            using errcode = '22023', hint = 'pending, running or done';
    end if;
    if cursor_key is not null
       and (state <> 'running' or pg_catalog.cardinality(cursor_key) <> pg_catalog.cardinality(s.key_columns)) then
        raise exception 'a backfill cursor is one value per key column (%), and only while running',
                pg_catalog.cardinality(s.key_columns)
            using errcode = '22023';
    end if;
    if total < 0 or enqueued is null or enqueued < 0 then
        raise exception 'backfill counts must not be negative' using errcode = '22023';
    end if;
    update kb_data.table_sources t
       set backfill_state = state, backfill_cursor = cursor_key, backfill_total = total,
           backfill_enqueued = enqueued,
           backfill_started_at = case when state = 'pending' then null
                                      when s.backfill_state = 'pending' or s.backfill_started_at is null
                                      then pg_catalog.now() else s.backfill_started_at end,
           backfill_done_at = case when state <> 'done' then null
                                   when s.backfill_state = 'done' then s.backfill_done_at
                                   else pg_catalog.now() end
     where t.id = s.id
       and t.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._source_backfill_save(integer, text, text[], bigint, bigint) is
    'Save where a table source''s backfill stands (state, cursor: one value per key column, rows '
    'counted, rows paged; start and end times follow the state); the owner''s rights, for writers.';

create or replace function kb._source_warn_reader(relation regclass)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    worker text := current_user;
begin
    if pg_catalog.has_table_privilege('kb.access_settings', 'SELECT') then
        select coalesce(a.writer_role, worker) into worker from kb.access_settings a;
    end if;
    -- kbpg sync reads as the role it logs in as: a role that reads the table itself (the
    -- embedded default's superuser) runs it fine whatever the writer role may read
    if pg_catalog.to_regrole(pg_catalog.quote_ident(worker)) is not null
       and not pg_catalog.has_table_privilege(worker, relation, 'SELECT')
       and not pg_catalog.has_table_privilege(relation, 'SELECT') then
        raise warning 'kbpg sync running as % cannot read %', worker, relation
            using hint = format('grant select on %s to %I;', relation, worker);
    end if;
    if (select c.relrowsecurity from pg_catalog.pg_class c where c.oid = relation) then
        raise warning '% has row-level security: kbpg sync must see every row', relation
            using hint = 'run the worker as the table''s owner or as a role with BYPASSRLS; under a '
                         'policy it stops with an error rather than read rows as deleted';
    end if;
end
$$;
comment on function kb._source_warn_reader(regclass) is
    'Warn (with the grant) when neither kbpg''s writer role nor the current role can read the '
    'table, or when row-level '
    'security could hide rows from the worker.';

create or replace function kb.add_table_source(
    source_name text,
    source_table regclass,
    id text default null,
    text text default null,
    title text default null,
    groups text default null,
    category text default null,
    labels text default null,
    metadata text[] default '{}',
    notify boolean default true
)
returns table (name text, table_name text, key_columns text[], triggers text[])
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    keys text[];
    new_id integer;
    made text[];
begin
    if add_table_source.source_name is null
       or add_table_source.source_name !~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}$' then
        raise exception 'invalid table source name %', coalesce(pg_catalog.quote_literal(add_table_source.source_name), 'NULL')
            using errcode = '22023',
                  hint = 'up to 40 letters, digits, _ . or -, e.g. ''articles'' (documents are table:<name>/<key>)';
    end if;
    if add_table_source.source_table is null then
        raise exception 'source_table is NULL' using errcode = '22023', hint = 'e.g. ''public.articles''';
    end if;
    perform kb._source_check_privileges(add_table_source.source_table);
    if exists (select 1 from kb.table_sources s where s.name = add_table_source.source_name) then
        raise exception 'table source "%" already exists', add_table_source.source_name
            using errcode = '42710', hint = 'change it with kb.alter_table_source, or remove it first';
    end if;
    keys := kb._source_key_columns(add_table_source.source_table, add_table_source.id);
    perform kb._source_check_definition(add_table_source.source_table, add_table_source.text,
                                        nullif(add_table_source.title, ''), nullif(add_table_source.groups, ''),
                                        nullif(add_table_source.category, ''), nullif(add_table_source.labels, ''),
                                        coalesce(add_table_source.metadata, '{}'));
    -- the owner's table, written by its helper (which checks all of the above again as the owner)
    new_id := kb._source_catalog_insert(add_table_source.source_name, add_table_source.source_table,
                                        add_table_source.id, add_table_source.text,
                                        nullif(add_table_source.title, ''), nullif(add_table_source.groups, ''),
                                        nullif(add_table_source.category, ''), nullif(add_table_source.labels, ''),
                                        coalesce(add_table_source.metadata, '{}'),
                                        coalesce(add_table_source.notify, true));
    made := kb._source_triggers(new_id);
    perform kb._source_warn_reader(add_table_source.source_table);
    -- a running worker starts the backfill now rather than at its next poll
    perform pg_catalog.pg_notify('kbpg_sync', '');  -- no name: any role may LISTEN
    return query select add_table_source.source_name, add_table_source.source_table::text, keys, made;
end
$$;
comment on function kb.add_table_source(text, regclass, text, text, text, text, text, text, text[], boolean) is
    'Keep the rows of a table as documents (table:<name>/<key>): checks the columns, creates the '
    'triggers that queue changed rows; `kbpg sync` then backfills the existing rows and follows '
    'changes. id: key column(s), default the primary key; text: the column to index; title, groups '
    '(text[] or text), category, labels (text[] or text), metadata (columns kept as JSON); notify: '
    'wake the worker at commit (false for very high commit rates or two-phase commit).';

create or replace function kb.alter_table_source(
    source_name text,
    text text default null,
    title text default null,
    groups text default null,
    category text default null,
    labels text default null,
    metadata text[] default null,
    notify boolean default null
)
returns table (name text, table_name text, key_columns text[], triggers text[])
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    s kb.table_sources;
    made text[];
begin
    s := kb._source_by_name(alter_table_source.source_name);
    perform kb._source_check_privileges(s.relation);
    -- NULL keeps a setting, '' (or '{}' for metadata) clears an optional one
    s.text_column := coalesce(alter_table_source.text, s.text_column);
    s.title_column := case when alter_table_source.title is null then s.title_column
                           else nullif(alter_table_source.title, '') end;
    s.groups_column := case when alter_table_source.groups is null then s.groups_column
                            else nullif(alter_table_source.groups, '') end;
    s.category_column := case when alter_table_source.category is null then s.category_column
                              else nullif(alter_table_source.category, '') end;
    s.labels_column := case when alter_table_source.labels is null then s.labels_column
                            else nullif(alter_table_source.labels, '') end;
    s.metadata_columns := coalesce(alter_table_source.metadata, s.metadata_columns);
    perform kb._source_check_definition(s.relation, s.text_column, s.title_column, s.groups_column,
                                        s.category_column, s.labels_column, s.metadata_columns);
    perform kb._source_catalog_define(s.id, s.text_column, s.title_column, s.groups_column,
                                      s.category_column, s.labels_column, s.metadata_columns,
                                      alter_table_source.notify);
    made := kb._source_triggers(s.id);
    perform kb._source_warn_reader(s.relation);
    perform pg_catalog.pg_notify('kbpg_sync', '');
    return query select s.name, s.relation::text, s.key_columns, made;
end
$$;
comment on function kb.alter_table_source(text, text, text, text, text, text, text[], boolean) is
    'Change a table source''s columns (NULL keeps one, '''' clears an optional one) or notify; the '
    'triggers follow and every row is read again by the next kbpg sync (documents that come out '
    'the same are not rewritten).';

create or replace function kb.remove_table_source(source_name text, drop_documents boolean default false)
returns table (name text, documents_deleted bigint, triggers_left text[])
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    s kb.table_sources;
    t text;
    left_behind text[] := '{}';
    deleted bigint := 0;
begin
    s := kb._source_by_name(remove_table_source.source_name);
    -- a writer's (no TRIGGER on the table needed: triggers it may not drop are named below)
    perform kb._source_check_writer();
    if exists (select 1 from pg_catalog.pg_class c where c.oid = s.relation) then
        foreach t in array kb._source_trigger_names(s.name) loop
            begin
                execute format('drop trigger if exists %I on %s', t, s.relation);
            exception when insufficient_privilege then
                -- only the table's owner may drop a trigger; left alone it does nothing
                left_behind := left_behind || t;
            end;
        end loop;
        if pg_catalog.cardinality(left_behind) > 0 then
            raise warning 'triggers % on % stay until its owner drops them (they no longer queue anything)',
                    pg_catalog.array_to_string(left_behind, ', '), s.relation
                using hint = (select pg_catalog.string_agg(format('drop trigger %I on %s;', x, s.relation), ' ')
                                from pg_catalog.unnest(left_behind) as x);
        end if;
    end if;
    delete from kb_data.source_queue q where q.source_id = s.id
                                         and q.kb_id = (select kb._current_kb());
    delete from kb_data.source_claims c where c.source_id = s.id
                                          and c.kb_id = (select kb._current_kb());
    delete from kb_data.source_errors e where e.source_id = s.id
                                          and e.kb_id = (select kb._current_kb());
    perform kb._source_catalog_delete(s.id);
    if remove_table_source.drop_documents then
        delete from kb_data.documents d where pg_catalog.starts_with(d.source, 'table:' || s.name || '/')
                                          and d.kb_id = (select kb._current_kb());
        get diagnostics deleted = row_count;
    end if;
    return query select s.name, deleted, left_behind;
end
$$;
comment on function kb.remove_table_source(text, boolean) is
    'Stop keeping a table''s rows: drops the triggers (the table''s owner only; otherwise they are '
    'named in a warning and do nothing), the queue, claims and parked rows; with drop_documents, '
    'its documents too.';

create or replace function kb.resync_table_source(source_name text)
returns boolean
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.table_sources;
    replacement regclass;
begin
    s := kb._source_by_name(resync_table_source.source_name);
    if not exists (select 1 from pg_catalog.pg_class c where c.oid = s.relation) then
        -- its table was dropped: a table re-created under the same name takes its place
        replacement := pg_catalog.to_regclass(s.relation_name);
        -- (a name recorded as a bare OID, of a table dropped before revision 0024, names none)
        if replacement is null
           or not exists (select 1 from pg_catalog.pg_class c where c.oid = replacement) then
            perform kb._source_table(s);  -- raises, naming what to run
        end if;
        perform kb._source_catalog_rebind(s.id, replacement);
        s := kb._source_by_name(resync_table_source.source_name);
        raise notice 'table source "%" now reads % (oid %), re-created in place of the one dropped',
                s.name, s.relation_name, s.relation::oid;
    end if;
    perform kb._source_check_privileges(s.relation);
    -- the triggers too, in case some were dropped (around an ALTER TABLE of a column they read)
    perform kb._source_triggers(s.id);
    perform kb._source_catalog_reset(s.id);
    insert into kb_data.source_queue (source_id, key, op) values (s.id, '{}', 'S') on conflict do nothing;
    perform pg_catalog.pg_notify('kbpg_sync', '');
    return true;
end
$$;
comment on function kb.resync_table_source(text) is
    'Re-create a table source''s triggers, read every row again and delete the documents of rows '
    'that are gone: after changes its triggers did not see (dropped around an ALTER TABLE, a '
    'restore with triggers disabled, a logical replica).';

create or replace function kb.list_table_sources(source_name text default null)
returns table (
    name text, source_table text, key_columns text[], text_column text, title_column text,
    groups_column text, category_column text, labels_column text, metadata_columns text[],
    notify boolean, version integer, created_at timestamptz, altered_at timestamptz,
    queued bigint, claimed bigint, errors bigint, oldest_queued_at timestamptz,
    backfill_state text, backfill_enqueued bigint, backfill_total bigint,
    backfill_done_at timestamptz, documents bigint
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select s.name, coalesce(kb._source_relation_name(s.relation), s.relation_name || ' (dropped)'),
           s.key_columns, s.text_column, s.title_column,
           s.groups_column, s.category_column, s.labels_column, s.metadata_columns,
           s.notify, s.version, s.created_at, s.altered_at,
           -- rows waiting (the queue is a log: a row changed twice has two entries)
           (select pg_catalog.count(distinct q.key) from kb.source_queue q where q.source_id = s.id),
           (select pg_catalog.count(*) from kb.source_claims c where c.source_id = s.id),
           (select pg_catalog.count(*) from kb.source_errors e where e.source_id = s.id),
           (select pg_catalog.min(q.enqueued_at) from kb.source_queue q where q.source_id = s.id),
           s.backfill_state, s.backfill_enqueued, s.backfill_total, s.backfill_done_at,
           coalesce(d.documents, 0)
      from kb.table_sources s
      left join (select pg_catalog.split_part(pg_catalog.substr(x.source, 7), '/', 1) as name,
                        pg_catalog.count(*) as documents
                   from kb.documents x
                  where pg_catalog.starts_with(x.source, 'table:')
                  group by 1) d on d.name = s.name
     where list_table_sources.source_name is null or s.name = list_table_sources.source_name
     order by s.name;
end;
comment on function kb.list_table_sources(text) is
    'The table sources (or one): their columns, queue, claims, parked rows, backfill and '
    'documents.';

create or replace function kb.list_source_errors(source_name text default null)
returns table (
    source_name text, key text[], document text, error text, attempts integer,
    first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    select s.name, e.key, kb._source_document(s.name, e.key), e.error, e.attempts,
           e.first_failed_at, e.last_failed_at, e.retry_at
      from kb.source_errors e
      join kb.table_sources s on s.id = e.source_id
     where list_source_errors.source_name is null or s.name = list_source_errors.source_name
     order by s.name, e.first_failed_at, e.key;
end;
comment on function kb.list_source_errors(text) is
    'Rows of table sources that could not be ingested: why, how often, when they are retried.';

create or replace function kb.retry_source_errors(source_name text default null)
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    with due as (
        update kb_data.source_errors e set retry_at = pg_catalog.now()
          from kb.table_sources s
         where s.id = e.source_id
           and (retry_source_errors.source_name is null or s.name = retry_source_errors.source_name)
           and e.kb_id = (select kb._current_kb())
        returning e.source_id, e.key
    ), queued as (
        insert into kb_data.source_queue (source_id, key, op)
        select due.source_id, due.key, 'R' from due
        on conflict do nothing
    )
    select pg_catalog.count(*) from due;
end;
comment on function kb.retry_source_errors(text) is
    'Queue every parked row (of one source) for its next try now; returns how many.';

-- -- reading rows -----------------------------------------------------------------------------

create or replace function kb._source_key_sql(source_id integer, alias text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- the same text as the triggers queue (kb._source_text_sql): no cast of the application's runs
return (select 'array[' || pg_catalog.string_agg(kb._source_text_sql(s.relation, k.c, alias),
                                                 ', ' order by k.n) || ']::text[]'
          from kb.table_sources s, pg_catalog.unnest(s.key_columns) with ordinality as k(c, n)
         where s.id = _source_key_sql.source_id);
comment on function kb._source_key_sql(integer, text) is
    'SQL for a row''s key as text[] (the text the triggers queue), for table alias `alias`.';



create or replace function kb._source_column_sql(relation regclass, column_name text, alias text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a domain to its base type is a relabelling (find_coercion_pathway: "Domains are always
-- coercible to and from their base type"), no cast looked up, no constraint checked
return (select case when t.typtype = 'd'
                    then format('(%I.%I)::%s', alias, column_name, pg_catalog.format_type(kb._source_base_type(relation, column_name), null))
                    else format('%I.%I', alias, column_name) end
          from pg_catalog.pg_attribute a join pg_catalog.pg_type t on t.oid = a.atttypid
         where a.attrelid = relation and a.attname = column_name and a.attnum > 0 and not a.attisdropped);
comment on function kb._source_column_sql(regclass, text, text) is
    'SQL for a column of table alias `alias` as its domain''s base type (as itself when it is no '
    'domain): compared with kb._source_value_sql.';

create or replace function kb._source_value_sql(relation regclass, column_name text, text_expr text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- A value of the column's type from its text without the application's code: a cast to a
-- built-in type (only the owner of one of its types may create a cast: the application owns
-- neither); a domain's base type instead of the domain (a cast to a domain runs its CHECK
-- constraints, which may call the application's functions); an enum's value picked from
-- enum_range by its output text (a cast from text to the application's enum may be its own)
return (select case when b.typtype = 'e'
                    then format('(select v from pg_catalog.unnest(pg_catalog.enum_range(null::%1$s)) as v '
                                'where pg_catalog.format(''%%s'', v) operator(pg_catalog.=) %2$s)',
                                pg_catalog.format_type(b.oid, null), text_expr)
                    else format('(%s)::%s', text_expr, pg_catalog.format_type(b.oid, null)) end
          from pg_catalog.pg_type b where b.oid = kb._source_base_type(relation, column_name));
comment on function kb._source_value_sql(regclass, text, text) is
    'SQL for a value of a column''s type (its domain''s base type) from the text expression '
    'text_expr, running no cast or constraint of the application''s.';

create or replace function kb._source_key_equals(source_id integer, alias text, key_expr text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
return (select pg_catalog.string_agg(format('%s operator(pg_catalog.=) %s', kb._source_column_sql(s.relation, k.c, alias),
                                            kb._source_value_sql(s.relation, k.c, format('%s[%s]', key_expr, k.n))),
                                     ' and ' order by k.n)
          from kb.table_sources s
         cross join pg_catalog.unnest(s.key_columns) with ordinality as k(c, n)
         where s.id = _source_key_equals.source_id);
comment on function kb._source_key_equals(integer, text, text) is
    'SQL that is true for the row of `alias` whose key is the text[] expression key_expr.';

create or replace function kb._source_scalar_sql(column_name text)
returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
-- format('%s') calls the type's output function and no cast (a cast to text of the
-- application's type is the application's code: the worker must not run it)
return format('case when t.%1$I is null then null else pg_catalog.format(''%%s'', t.%1$I) end', column_name);
comment on function kb._source_scalar_sql(text) is
    'SQL for a column of table alias t as text through its type''s output function (NULL stays '
    'NULL), never a cast.';

create or replace function kb._source_select(source_id integer)
returns text
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.table_sources;
    key_sql text := kb._source_key_sql(source_id, 't');
begin
    select * into s from kb.table_sources t where t.id = _source_select.source_id;
    perform kb._source_table(s);
    return format(
        'select %1$s as key, kb._source_document(%2$L, %1$s) as document, %3$s as body, '
        'coalesce(%4$s, '''') as title, %5$s as groups, %6$s as category, %7$s as labels, '
        '%8$s as metadata from %9$s as t',
        key_sql, s.name, kb._source_scalar_sql(s.text_column),
        case when s.title_column is null then 'null' else kb._source_scalar_sql(s.title_column) end,
        kb._source_list_sql(s.relation, s.groups_column),
        case when s.category_column is null then 'null::text' else kb._source_scalar_sql(s.category_column) end,
        kb._source_list_sql(s.relation, s.labels_column),
        case when pg_catalog.cardinality(s.metadata_columns) = 0 then '''{}''::jsonb'
             else 'pg_catalog.jsonb_build_object('
                  || (select pg_catalog.string_agg(
                                 case when kb._source_builtin_type(a.atttypid) then format('%L, t.%I', m.c, m.c)
                                      -- not built in: to_jsonb would run the application's cast to json
                                      else format('%L, %s', m.c, kb._source_scalar_sql(m.c)) end,
                                 ', ' order by m.n)
                        from pg_catalog.unnest(s.metadata_columns) with ordinality as m(c, n)
                        join pg_catalog.pg_attribute a on a.attrelid = s.relation and a.attname = m.c
                                                      and a.attnum > 0 and not a.attisdropped)
                  || ')' end,
        s.relation);
end
$$;
comment on function kb._source_select(integer) is
    'The SELECT (over table alias t) that turns a table source''s rows into key, document, body, '
    'title, groups, category, labels and metadata.';

create or replace function kb._source_list_sql(relation regclass, column_name text)
returns text
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
return case
    when column_name is null then '''{}''::text[]'
    when (select a.category from kb._source_attribute(relation, column_name) a) = 'A'
        then format('coalesce(array(select case when e.v is null then null else pg_catalog.format(''%%s'', e.v) end '
                    'from pg_catalog.unnest(t.%I) with ordinality as e(v, n) order by e.n), ''{}'')',
                    column_name)
    else format('case when t.%1$I is null then ''{}''::text[] else array[pg_catalog.format(''%%s'', t.%1$I)] end',
                column_name)
end;
comment on function kb._source_list_sql(regclass, text) is
    'SQL for a list column of a table source (groups, labels): an array as text[], one value as a '
    'list of one, NULL as an empty list.';

create or replace function kb._source_rows(source_id integer, keys jsonb)
returns table (
    key text[], document text, present boolean, body text, title text, groups text[],
    category text, labels text[], metadata jsonb
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
-- a policy that hid rows from the worker would make them look deleted: an error instead
set row_security = off
as $$
declare
    s kb.table_sources;
begin
    select * into s from kb.table_sources t where t.id = _source_rows.source_id;
    if not found then
        raise exception 'no table source with id %', source_id using errcode = '42704';
    end if;
    -- one index probe per key (lateral), whatever the planner would estimate for the keys
    return query execute format(
        'select k.v, kb._source_document(%L, k.v), r.key is not null, r.body, r.title, r.groups, '
        '       r.category, r.labels, r.metadata '
        '  from kb._source_keys($1) as k(v) '
        '  left join lateral (%s where %s) as r on true',
        s.name, kb._source_select(source_id), kb._source_key_equals(source_id, 't', 'k.v'))
        using keys;
end
$$;
comment on function kb._source_rows(integer, jsonb) is
    'For each key (a JSON array of arrays of key values): its document source, whether its row '
    'exists and the row as a document-to-be. Read with row_security off: the worker must see '
    'every row.';

create or replace function kb._source_missing(source_id integer, keys jsonb)
returns table (key text[])
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set row_security = off
as $$
declare
    s kb.table_sources;
begin
    select * into s from kb.table_sources t where t.id = _source_missing.source_id;
    return query execute format(
        'select k.key from kb._source_keys($1) as k where not exists (select 1 from %s as t where %s)',
        s.relation, kb._source_key_equals(source_id, 't', 'k.key'))
        using keys;
end
$$;
comment on function kb._source_missing(integer, jsonb) is
    'Which of these keys (JSON array of arrays) have no row in the table source''s table.';

create or replace function kb._source_hashed_documents(source_id integer)
returns table (document text)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set row_security = off
as $$
declare
    s kb.table_sources;
begin
    select * into s from kb.table_sources t where t.id = _source_hashed_documents.source_id;
    return query execute format(
        'select n.document from (select kb._source_document(%L, %s) as document from %s as t) n '
        ' where pg_catalog.starts_with(n.document, %L)',
        s.name, kb._source_key_sql(source_id, 't'), s.relation, 'table:' || s.name || '/%sha256:');
end
$$;
comment on function kb._source_hashed_documents(integer) is
    'The documents of a table source''s rows whose keys are too long to name them (named by the '
    'key''s hash): a scan of the table.';

create or replace function kb._source_orphans(source_id integer)
returns table (document text)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s kb.table_sources;
    prefix text;
    keys jsonb;
begin
    select * into s from kb.table_sources t where t.id = _source_orphans.source_id;
    prefix := 'table:' || s.name || '/';
    -- the documents under the caller's own row security, then the table without it
    select coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(x.key)), '[]')
      into keys
      from kb.documents d
     cross join lateral (select kb._source_document_key(prefix, d.source) as key) x
     where pg_catalog.starts_with(d.source, prefix)
       and not pg_catalog.starts_with(d.source, prefix || '%sha256:')
       and pg_catalog.cardinality(x.key) = pg_catalog.cardinality(s.key_columns);
    return query
    select kb._source_document(s.name, m.key) from kb._source_missing(source_id, keys) m;
    -- a name the row no longer has (a key over 2,600 bytes named in full before revision 0017)
    return query
    select d.source
      from kb.documents d
     cross join lateral (select kb._source_document_key(prefix, d.source) as key) x
     where pg_catalog.starts_with(d.source, prefix)
       and not pg_catalog.starts_with(d.source, prefix || '%sha256:')
       and pg_catalog.octet_length(d.source) > 2600
       and kb._source_document(s.name, x.key) <> d.source;
    -- documents named by their key's hash: those no row of the table has now (a full scan, only
    -- when there are such documents)
    if exists (select 1 from kb.documents d where pg_catalog.starts_with(d.source, prefix || '%sha256:')) then
        return query
        select d.source
          from kb.documents d
         where pg_catalog.starts_with(d.source, prefix || '%sha256:')
           and d.source not in (select l.document from kb._source_hashed_documents(source_id) l);
    end if;
end
$$;
comment on function kb._source_orphans(integer) is
    'Documents of a table source whose row is gone (after a TRUNCATE, or changes the triggers did '
    'not see).';

-- -- the worker's queue -------------------------------------------------------------------------

create or replace function kb._source_backfill(source_id integer, max_rows integer,
                                               worker integer default null)
returns table (enqueued integer, state text, total bigint, done bigint)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set row_security = off
as $$
#variable_conflict use_column
declare
    s kb.table_sources;
    key_sql text;
    after text;
    page_rows integer;
    added integer;
    last_key text[];
    estimate double precision;
begin
    -- one worker at a time moves a source's cursor; the others go on with the queue
    s := kb._source_backfill_lock(source_id);
    if s.id is null or s.backfill_state = 'done' then
        return;
    end if;
    perform kb._source_table(s);
    if s.backfill_state = 'pending' then
        select c.reltuples into estimate from pg_catalog.pg_class c where c.oid = s.relation;
        if estimate is null or estimate < 1000000 then
            execute format('select pg_catalog.count(*) from %s', s.relation) into s.backfill_total;
        else
            s.backfill_total := estimate::bigint;
        end if;
        s.backfill_state := 'running';
        s.backfill_cursor := null;
        s.backfill_enqueued := 0;
        s.backfill_started_at := pg_catalog.now();
    end if;
    key_sql := kb._source_key_sql(s.id, 't');
    -- keyset order on the key's unique index: (a, b) > (cursor a, cursor b)
    after := case when s.backfill_cursor is null then 'true' else (
        select format('(%s) > (%s)',
                      pg_catalog.string_agg(kb._source_column_sql(s.relation, k.c, 't'), ', ' order by k.n),
                      pg_catalog.string_agg(kb._source_value_sql(s.relation, k.c, format('$2[%s]', k.n)),
                                            ', ' order by k.n))
          from pg_catalog.unnest(s.key_columns) with ordinality as k(c, n)) end;
    execute format(
        'with page as (select %1$s as key, pg_catalog.row_number() over (order by %2$s) as n '
        '                from %3$s as t where %4$s order by %2$s limit $3), '
        '     added as (insert into kb_data.source_queue (source_id, key, op) '
        '               select $1, p.key, ''B'' from page p '
        -- a key this worker claimed a moment ago is read after this page: once is enough
        '                where not exists (select 1 from kb.source_claims c where c.source_id = $1 '
        '                                     and c.key_hash = kb._source_key_hash(p.key) and c.worker = $4) '
        '               on conflict do nothing returning 1) '
        'select (select pg_catalog.count(*) from page)::integer, (select pg_catalog.count(*) from added)::integer, '
        '       (select p.key from page p order by p.n desc limit 1)',
        key_sql,
        (select pg_catalog.string_agg(kb._source_column_sql(s.relation, k.c, 't'), ', ' order by k.n)
           from pg_catalog.unnest(s.key_columns) with ordinality as k(c, n)),
        s.relation, after)
        into page_rows, added, last_key
        using s.id, s.backfill_cursor, max_rows, worker;
    s.backfill_enqueued := s.backfill_enqueued + page_rows;
    if page_rows < max_rows then
        s.backfill_state := 'done';
        s.backfill_cursor := null;
        s.backfill_done_at := pg_catalog.now();
    else
        s.backfill_cursor := last_key;
    end if;
    perform kb._source_backfill_save(s.id, s.backfill_state, s.backfill_cursor, s.backfill_total,
                                     s.backfill_enqueued);
    return query select page_rows, s.backfill_state, s.backfill_total, s.backfill_enqueued;
end
$$;
comment on function kb._source_backfill(integer, integer, integer) is
    'Queue the next max_rows rows of a table source''s backfill (keyset order after the saved '
    'cursor), except keys `worker` holds already; returns how many rows the page held, the state '
    '(done after the last page), the rows counted at its start and the rows paged so far. Nothing '
    'while another worker pages the same source.';

create or replace function kb._source_claim(worker integer, source_ids integer[], max_rows integer)
returns table (source_id integer, key text[], op "char", enqueued_at timestamptz)
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    -- the queue is a log (revision 0027): a key changed by several statements has an entry for
    -- each; the batch takes the key once, with its earliest entry's op and time
    with picked as (
        select q.source_id, q.key
          from kb.source_queue q
         where (_source_claim.source_ids is null or q.source_id = any (_source_claim.source_ids))
           -- one worker per key at a time: a key changed again while claimed waits its turn
           -- (compared as keys: the claims are few, a backlog's entries are not hashed one by one)
           and not exists (select 1 from kb.source_claims c
                            where c.source_id = q.source_id and c.key = q.key)
         order by q.enqueued_at
         limit _source_claim.max_rows
         for update of q skip locked
    ), entries as (
        -- every entry of the picked keys this statement sees: the worker reads the rows after
        -- the claim commits, which covers them all (a backlog's key is read once, not per
        -- entry); one another worker has locked is left to it (waiting for it could deadlock
        -- with its own claim of our entries)
        select q.ctid as entry
          from kb_data.source_queue q
         where q.kb_id = (select kb._current_kb())
           and (q.source_id, q.key) in (select p.source_id, p.key from picked p)
         for update of q skip locked
    ), taken as (
        delete from kb_data.source_queue q
         using entries e
         where q.kb_id = (select kb._current_kb()) and q.ctid = e.entry
        returning q.ctid as entry, q.source_id, q.key, q.op, q.enqueued_at
    ), firsts as (
        -- (entries of one transaction share their time: the first written, which an
        -- append-only heap places first, breaks the tie)
        select distinct on (t.source_id, t.key) t.source_id, t.key, t.op, t.enqueued_at
          from taken t
         order by t.source_id, t.key, t.enqueued_at, t.entry
    ), claimed as (
        -- a key another worker claimed since this statement began (its entries were not locked:
        -- an older or newer change of the same key) is its; those entries go back to the queue
        insert into kb_data.source_claims (source_id, key, op, enqueued_at, worker)
        select f.source_id, f.key, f.op, f.enqueued_at, _source_claim.worker from firsts f
        on conflict do nothing
        returning source_id, key, op, enqueued_at
    ), requeued as (
        insert into kb_data.source_queue (source_id, key, op, enqueued_at)
        select f.source_id, f.key, f.op, f.enqueued_at
          from firsts f
         where not exists (select 1 from claimed c
                            where c.source_id = f.source_id and c.key = f.key)
    )
    select c.source_id, c.key, c.op, c.enqueued_at from claimed c;
end;
comment on function kb._source_claim(integer, integer[], integer) is
    'Move up to max_rows queue entries (oldest first, of these sources or all) to the worker''s '
    'claims, each key once (its earliest entry''s op and time); entries locked by another '
    'worker, or whose key another worker holds, are skipped (or put back, when claimed meanwhile).';

create or replace function kb._source_release(worker integer, keys jsonb default null)
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    with released as (
        delete from kb_data.source_claims c
         where c.worker = _source_release.worker
           and (_source_release.keys is null
                or (c.source_id, c.key_hash) in (select (e operator(pg_catalog.->>) 0)::integer,
                                                        kb._source_key_hash(array(
                                                            select x.v from pg_catalog.jsonb_array_elements_text(e operator(pg_catalog.->) 1)
                                                                   with ordinality as x(v, n) order by x.n))
                                              from pg_catalog.jsonb_array_elements(_source_release.keys) as e))
           and c.kb_id = (select kb._current_kb())
        returning c.source_id, c.key, c.op, c.enqueued_at
    ), queued as (
        insert into kb_data.source_queue (source_id, key, op, enqueued_at)
        select r.source_id, r.key, r.op, r.enqueued_at from released r
        on conflict do nothing
    )
    select pg_catalog.count(*) from released;
end;
comment on function kb._source_release(integer, jsonb) is
    'Put a worker''s claims (all, or those listed as [[source_id, [key...]], ...]) back in the '
    'queue, untouched: a model that is down, a worker stopping.';

create or replace function kb._source_settle(worker integer, source_id integer, done jsonb, failed jsonb)
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    -- done: [[key...], ...] written, unchanged or deleted; failed: [{"key": [...], "error": "..."}]
    delete from kb_data.source_claims c
     where c.worker = _source_settle.worker and c.source_id = _source_settle.source_id
       and c.key_hash in (select kb._source_key_hash(k.key) from kb._source_keys(done) k)
       and c.kb_id = (select kb._current_kb());
    delete from kb_data.source_errors e
     where e.source_id = _source_settle.source_id
       and e.key_hash in (select kb._source_key_hash(k.key) from kb._source_keys(done) k)
       and e.kb_id = (select kb._current_kb());
    insert into kb_data.source_errors as e (source_id, key, error, retry_at)
    select _source_settle.source_id, f.key, f.error, pg_catalog.now() + kb._source_backoff(1)
      from (select array(select x.v from pg_catalog.jsonb_array_elements_text(i operator(pg_catalog.->) 'key')
                                  with ordinality as x(v, n) order by x.n) as key,
                   i operator(pg_catalog.->>) 'error' as error
              from pg_catalog.jsonb_array_elements(failed) as i) f
    on conflict (source_id, key_hash) do update
       set error = excluded.error, attempts = e.attempts + 1, last_failed_at = pg_catalog.now(),
           retry_at = pg_catalog.now() + kb._source_backoff(e.attempts + 1);
    delete from kb_data.source_claims c
     where c.worker = _source_settle.worker and c.source_id = _source_settle.source_id
       and c.key_hash in (select kb._source_key_hash(array(
                                     select x.v from pg_catalog.jsonb_array_elements_text(i operator(pg_catalog.->) 'key')
                                            with ordinality as x(v, n) order by x.n))
                            from pg_catalog.jsonb_array_elements(failed) as i)
       and c.kb_id = (select kb._current_kb());
end
$$;
comment on function kb._source_settle(integer, integer, jsonb, jsonb) is
    'A worker is done with claimed keys: the done ones leave the claims (and kb.source_errors), the '
    'failed ones are parked with their error, attempts counted, retried after a backoff.';

create or replace function kb._source_reclaim(worker integer)
returns bigint
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    w integer;
    n bigint;
    total bigint := 0;
begin
    for w in select distinct c.worker from kb.source_claims c where c.worker <> _source_reclaim.worker loop
        -- a live worker's session holds this lock; a free one means the worker is gone
        if pg_catalog.pg_try_advisory_xact_lock(1801613427, w) then
            insert into kb_data.source_queue (source_id, key, op, enqueued_at)
            select c.source_id, c.key, c.op, c.enqueued_at from kb.source_claims c where c.worker = w
            on conflict do nothing;
            delete from kb_data.source_claims c where c.worker = w
                                                  and c.kb_id = (select kb._current_kb());
            get diagnostics n = row_count;
            total := total + n;
        end if;
    end loop;
    return total;
end
$$;
comment on function kb._source_reclaim(integer) is
    'Put the claims of workers that are gone (their session advisory lock is free) back in the '
    'queue; returns how many.';

create or replace function kb._source_requeue_errors(source_ids integer[] default null)
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
begin atomic
    with due as (
        -- the next retry stands until this one settles (a lease, should the worker die)
        update kb_data.source_errors e set retry_at = pg_catalog.now() + kb._source_backoff(e.attempts)
         where e.retry_at <= pg_catalog.now()
           and (_source_requeue_errors.source_ids is null or e.source_id = any (_source_requeue_errors.source_ids))
           and e.kb_id = (select kb._current_kb())
        returning e.source_id, e.key
    ), queued as (
        insert into kb_data.source_queue (source_id, key, op)
        select due.source_id, due.key, 'R' from due
        on conflict do nothing
    )
    select pg_catalog.count(*) from due;
end;
comment on function kb._source_requeue_errors(integer[]) is
    'Queue the parked rows whose retry is due; returns how many.';

-- -- compiled triggers, brought up to date ----------------------------------------------------------

-- Each apply (kbpg db upgrade) generates every plain-table source's trigger function again from
-- this file's functions (CREATE OR REPLACE: the application's table is not touched). A source
-- whose triggers still call kb._source_enqueue (made before its compiled function existed) is
-- switched to it where the role applying this may put triggers on its table; elsewhere it stays
-- on kb._source_enqueue, as correct and slower, until `kbpg sources resync` by a role that may.
do $$
declare
    s record;
begin
    for s in select x.id, x.relation, x.name
               from kb.table_sources x
               join pg_catalog.pg_class c on c.oid = x.relation and c.relkind = 'r'
              order by x.id loop
        if exists (select 1 from pg_catalog.pg_trigger t
                    where t.tgrelid = s.relation and t.tgfoid = 'kb._source_enqueue()'::regprocedure)
           and pg_catalog.has_table_privilege(s.relation, 'TRIGGER') then
            perform kb._source_triggers(s.id);
        elsif pg_catalog.to_regprocedure(format('kb.%I()', kb._source_compiled_name(s.id))) is not null then
            execute kb._source_compile_sql(s.id);
        end if;
    end loop;
end
$$;

-- -- privileges -------------------------------------------------------------------------------

-- The trigger functions and the catalog helpers run with their owner's rights. Firing a
-- trigger checks no privilege on its function, so the application's roles need none; creating
-- one takes EXECUTE, which only kbpg's writer role (whose members add sources) and the owner
-- keep: no one else can hang kb.source_queue's writer on a table of their own (and the trigger
-- queues only its source's table, a permanent one). The catalog helpers are the writer's way to
-- change kb.table_sources, which it may only read. (sql/080 applies the roles' grants before this
-- file's functions exist; on the first apply they are granted here, and PUBLIC's EXECUTE, which
-- CREATE FUNCTION gives, taken away.)
do $$
declare
    s kb.access_settings;
    f regprocedure;
    writer text;
    reader text;
begin
    select * into s from kb.access_settings;
    select r.rolname into writer from pg_catalog.pg_roles r where r.oid = s.writer_oid;
    select r.rolname into reader from pg_catalog.pg_roles r where r.oid = s.reader_oid;
    for f in select p.oid::regprocedure from pg_catalog.pg_proc p
              where p.pronamespace = 'kb'::regnamespace and p.prosecdef
                and pg_catalog.starts_with(p.proname, '_source_') loop
        execute format('revoke execute on function %s from public', f);
        if writer is not null then
            execute format('grant execute on function %s to %I', f, writer);
        end if;
        if reader is not null then
            -- readers search; the sources' definitions, queue and parked rows are not theirs
            execute format('revoke execute on function %s from %I', f, reader);
        end if;
    end loop;
end
$$;
