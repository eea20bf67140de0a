-- kbpg: the distributed layout (Citus), set up by `kbpg db distribute` (kbpg/distribute.py).
--
-- Documents, chunks and the graph rows (edges, links, entities) are distributed by document id
-- and co-located: a document's rows live on one shard. BM25 needs corpus-wide statistics
-- (chunk count, total length, document frequency per lexeme) exact after every write, and a
-- statement trigger on a worker's shard cannot update a table every node shares (that would be
-- a distributed query inside a shard's command, which Citus refuses). So each shard keeps its
-- own share of the statistics in kb.bm25_shard_stats, a table co-located with kb.chunks that
-- the shard's triggers write directly (the co-located shard is on the same node, in the same
-- worker transaction): whatever writes the chunks (COPY, INSERT, UPDATE, a cascaded DELETE,
-- TRUNCATE) keeps the sums exact. A search reads the sums of the rows it needs in one
-- statement; kb.corpus_stats and kb.lexeme_stats become views of the same sums.
--
-- A shard's rows carry an anchor (a distribution value that hashes into the shard's range), so
-- that they sit where Citus expects them; the sums are exact whichever shard a row is in (a
-- split or kb.recount_bm25_statistics() may gather them elsewhere), so a shard's own counts
-- may go negative and are summed, never read alone. The lexeme '' (no tsvector holds an empty
-- lexeme) carries the chunk count (doc_freq) and the total length (tokens).
--
-- These functions exist on every knowledge base; only a distributed one calls them.

create or replace function kb._distributed()
returns boolean
language sql
stable
parallel safe
security invoker
-- the shard statistics table exists only in the distributed layout (kbpg db distribute). No SET
-- clause: every arm asks, and inlined the question costs 2 us instead of 9 (a call with a SET
-- clause); the body names nothing to look up (a qualified name given as text)
return pg_catalog.to_regclass('kb_data.bm25_shard_stats') is not null;
comment on function kb._distributed() is
    'True when this knowledge base has the distributed (Citus) layout of kbpg db distribute.';

create or replace function kb._set_local_on_workers(names text[], setting_values text[])
returns void
language plpgsql
-- SET is refused in a stable function's statements: the arms call this one
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    previous constant text := pg_catalog.current_setting('citus.propagate_set_commands');
begin
    -- set_config() and a function's SET clause change the coordinator's session alone; SET
    -- LOCAL with citus.propagate_set_commands = local is also sent to every worker this
    -- transaction uses (in a transaction block: autocommit statements open no transaction on
    -- the workers, which then keep their own defaults)
    perform pg_catalog.set_config('citus.propagate_set_commands', 'local', true);
    for i in 1..coalesce(cardinality(names), 0) loop
        execute pg_catalog.format('set local %s = %L', names[i], setting_values[i]);
    end loop;
    perform pg_catalog.set_config('citus.propagate_set_commands', previous, true);
end
$$;
comment on function kb._set_local_on_workers(text[], text[]) is
    'Distributed layout: SET LOCAL the given settings on the coordinator and on the workers of '
    'this transaction (the vector arm''s recall settings). Internal.';

create or replace function kb._is_shard(relation oid)
returns boolean
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    found boolean;
begin
    -- the distributed table itself (the coordinator's shell, whose triggers a truncation fires)
    -- is no shard: its triggers have nothing to count
    execute 'select not exists (select 1 from pg_catalog.pg_dist_partition p
                                 where p.logicalrelid operator(pg_catalog.=) $1)'
       into found
      using relation;
    return found;
end
$$;
comment on function kb._is_shard(oid) is
    'On a Citus node: false for a distributed table''s own relation (its shell), true for its '
    'shards. Internal to the distributed layout''s triggers.';

create or replace function kb._shard_peer(shard_relation oid, peer regclass)
returns text
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    peer_shard text;
begin
    -- a shard's relation is named <table>_<shard id>; the peer is the shard of `peer` with the
    -- same hash range (co-located), or the one shard of a reference table
    execute 'select pg_catalog.shard_name($2, p.shardid)
               from pg_catalog.pg_dist_shard s
               join pg_catalog.pg_dist_shard p
                 on p.logicalrelid = $2
                and (p.shardminvalue is null or p.shardminvalue = s.shardminvalue)
              where s.shardid = pg_catalog.substring(
                        (select c.relname from pg_catalog.pg_class c where c.oid = $1),
                        ''_(\d+)$'')::bigint'
       into peer_shard
      using shard_relation, peer;
    if peer_shard is null then
        raise exception 'kbpg: no shard of % beside shard relation %', peer, shard_relation::regclass
            using errcode = '55000',
                  hint = 'kb.bm25_shard_stats and kb.lexical_pending must be co-located with '
                         'kb.chunks (run kbpg db distribute again)';
    end if;
    return peer_shard;
end
$$;
comment on function kb._shard_peer(oid, regclass) is
    'On a worker: the qualified name of the shard of `peer` co-located with the given shard '
    'relation (for a reference table, its shard). Internal to the distributed layout''s triggers.';

create or replace function kb._shard_anchor(shard_relation oid)
returns bigint
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    low integer;
    high integer;
    anchor bigint := 0;
begin
    execute 'select s.shardminvalue::integer, s.shardmaxvalue::integer
               from pg_catalog.pg_dist_shard s
              where s.shardid = pg_catalog.substring(
                        (select c.relname from pg_catalog.pg_class c where c.oid = $1),
                        ''_(\d+)$'')::bigint'
       into low, high
      using shard_relation;
    -- the smallest id that hashes into the shard's range (about shard-count tries)
    loop
        exit when pg_catalog.worker_hash(anchor) between low and high;
        anchor := anchor + 1;
    end loop;
    return anchor;
end
$$;
comment on function kb._shard_anchor(oid) is
    'On a worker: the smallest bigint whose Citus hash falls in the given shard''s range, the '
    'distribution value of that shard''s kb.bm25_shard_stats rows. Internal.';

create or replace function kb._shard_chunks_changed() returns trigger
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    -- the chunks whose text changed (re-embedding and context-key updates change none)
    changed constant text := 'new_rows n join old_rows o on o.id operator(pg_catalog.=) n.id '
                             'where o.tsv is distinct from n.tsv';
    deltas text;
    stats_shard text;
    anchor bigint;
    zeros text[];
    any_changed boolean;
    state record;
begin
    if not kb._is_shard(tg_relid) then
        return null;
    end if;
    if tg_op = 'UPDATE' then
        execute 'select exists (select 1 from ' || changed || ')' into any_changed;
        if not any_changed then
            return null;
        end if;
    end if;
    -- (lexeme, doc_freq, tokens) changes; lexeme '' carries the chunk count and total length
    deltas := case tg_op
        when 'INSERT' then
            'select '''' as lexeme, pg_catalog.count(*) as doc_freq, '
            '       coalesce(pg_catalog.sum(n.token_count), 0) as tokens from new_rows n '
            'union all '
            'select l, pg_catalog.count(*), 0 from new_rows n, '
            '       pg_catalog.unnest(pg_catalog.tsvector_to_array(n.tsv)) as l group by l'
        when 'DELETE' then
            'select '''' as lexeme, -pg_catalog.count(*) as doc_freq, '
            '       -coalesce(pg_catalog.sum(o.token_count), 0) as tokens from old_rows o '
            'union all '
            'select l, -pg_catalog.count(*), 0 from old_rows o, '
            '       pg_catalog.unnest(pg_catalog.tsvector_to_array(o.tsv)) as l group by l'
        else
            'select '''' as lexeme, 0::bigint as doc_freq, '
            '       (select coalesce(pg_catalog.sum(n.token_count), 0) from new_rows n) '
            '     - (select coalesce(pg_catalog.sum(o.token_count), 0) from old_rows o) as tokens '
            'union all '
            'select x.l, pg_catalog.sum(x.n), 0 from ('
            '    select l, 1 as n from new_rows n, '
            '           pg_catalog.unnest(pg_catalog.tsvector_to_array(n.tsv)) as l '
            '    union all '
            '    select l, -1 from old_rows o, '
            '           pg_catalog.unnest(pg_catalog.tsvector_to_array(o.tsv)) as l'
            ') x group by x.l'
        end;
    stats_shard := kb._shard_peer(tg_relid, 'kb_data.bm25_shard_stats');
    anchor := kb._shard_anchor(tg_relid);
    execute pg_catalog.format(
        'with d as (%1$s), '
        '  up as (insert into %2$s as s (anchor, lexeme, doc_freq, tokens) '
        '         select $1, d.lexeme, d.doc_freq, d.tokens from d '
        '          where d.doc_freq operator(pg_catalog.<>) 0 or d.tokens operator(pg_catalog.<>) 0 '
        '          order by d.lexeme '
        '         on conflict (anchor, lexeme) do update '
        '            set doc_freq = s.doc_freq operator(pg_catalog.+) excluded.doc_freq, '
        '                tokens = s.tokens operator(pg_catalog.+) excluded.tokens '
        '         returning s.lexeme, s.doc_freq, s.tokens) '
        'select pg_catalog.array_agg(up.lexeme) filter (where up.doc_freq operator(pg_catalog.=) 0 '
        '           and up.tokens operator(pg_catalog.=) 0 and up.lexeme operator(pg_catalog.<>) '''') '
        '  from up',
        deltas, stats_shard)
       into zeros
      using anchor;
    if coalesce(cardinality(zeros), 0) > 0 then
        execute pg_catalog.format(
            'delete from %s s where s.anchor operator(pg_catalog.=) $1 '
            'and s.lexeme operator(pg_catalog.=) any ($2)', stats_shard)
        using anchor, zeros;
    end if;
    if tg_op = 'INSERT' then
        return null;
    end if;
    -- the impact cache (on the coordinator) as the single-server triggers of revision 0002
    -- keep it: cached chunks whose text changed are scored exactly until the next refresh,
    -- which rebuilds the blocks holding changed or deleted chunks
    execute pg_catalog.format('select s.watermark, s.block_size from %s s',
                              kb._shard_peer(tg_relid, 'kb_data.lexical_state'))
       into state;
    if tg_op = 'UPDATE' then
        execute pg_catalog.format(
            'insert into %s (document_id, chunk_id) '
            'select n.document_id, n.id from %s and n.id operator(pg_catalog.<=) $1 '
            'on conflict do nothing',
            kb._shard_peer(tg_relid, 'kb_data.lexical_pending'), changed)
        using state.watermark;
    end if;
    execute pg_catalog.format(
        'insert into %s (document_id, block_no) '
        'select distinct o.document_id, (o.id operator(pg_catalog./) $2)::integer from %s '
        '   and o.id operator(pg_catalog.<=) $1 '
        'on conflict do nothing',
        kb._shard_peer(tg_relid, 'kb_data.lexical_dirty_blocks'),
        case when tg_op = 'UPDATE' then changed else 'old_rows o where true' end)
    using state.watermark, state.block_size;
    return null;
end
$$;
comment on function kb._shard_chunks_changed() is
    'Statement trigger (insert, delete, update) on a shard of kb.chunks (distributed layout): '
    'the change in the shard''s BM25 statistics, written to its co-located shard of '
    'kb.bm25_shard_stats, and the impact cache''s bookkeeping (kb.lexical_pending, '
    'kb.lexical_dirty_blocks) beside it.';

create or replace function kb._shard_chunks_truncated() returns trigger
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    stats_shard text;
begin
    if not kb._is_shard(tg_relid) then
        return null;
    end if;
    stats_shard := kb._shard_peer(tg_relid, 'kb_data.bm25_shard_stats');
    execute pg_catalog.format('truncate %s, %s, %s', stats_shard,
                              kb._shard_peer(tg_relid, 'kb_data.lexical_pending'),
                              kb._shard_peer(tg_relid, 'kb_data.lexical_dirty_blocks'));
    -- the impact cache lives on the coordinator, out of reach: the reset time tells the lexical
    -- arm that the cache predates it (ids may restart below the watermark), until a refresh
    execute pg_catalog.format(
        'insert into %s (anchor, lexeme, doc_freq, tokens, reset_at) values ($1, '''', 0, 0, pg_catalog.now())',
        stats_shard)
    using kb._shard_anchor(tg_relid);
    return null;
end
$$;
comment on function kb._shard_chunks_truncated() is
    'Truncate trigger on a shard of kb.chunks (distributed layout): the shard''s statistics are '
    'emptied and the reset recorded, so the coordinator''s impact cache is not trusted until '
    'the next refresh.';

create or replace function kb._refresh_derived_edges(
    link_weight real,
    max_docs integer,
    out added bigint,
    out removed bigint,
    out reweighted bigint
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    target_sources text[];
    target_ids bigint[];
begin
    -- the single-server statement (kbpg.queries.REFRESH_EDGES) joins links to documents by
    -- source and entities across documents: joins Citus cannot run across shards. Here each
    -- distributed table is read by a query Citus runs shard by shard (the links, the target
    -- documents and their chunks, each document's first mention of each entity), the derived
    -- edges are worked out on the coordinator exactly as there, and applied as a difference
    drop table if exists pg_temp.kbpg_links, pg_temp.kbpg_targets, pg_temp.kbpg_target_chunks,
                         pg_temp.kbpg_mentions, pg_temp.kbpg_derived_now, pg_temp.kbpg_desired;
    create temporary table kbpg_links on commit drop as
        select l.document_id, l.chunk_id, l.target_source, l.fragment from kb.chunk_links l;
    select pg_catalog.array_agg(distinct l.target_source) into target_sources from pg_temp.kbpg_links l;
    create temporary table kbpg_targets on commit drop as
        select d.id, d.source from kb.documents d where d.source = any (target_sources);
    select pg_catalog.array_agg(t.id) into target_ids from pg_temp.kbpg_targets t;
    create temporary table kbpg_target_chunks on commit drop as
        select c.document_id, c.id, c.ordinal, c.section from kb.chunks c
         where c.document_id = any (target_ids);
    create temporary table kbpg_mentions on commit drop as
        select distinct on (e.entity, c.document_id) e.entity, c.document_id, c.id
          from kb.chunk_entities e
          join kb.chunks c on c.document_id = e.document_id and c.id = e.chunk_id
         order by e.entity, c.document_id, c.ordinal;
    create temporary table kbpg_derived_now on commit drop as
        select e.src_chunk_id as src, e.dst_chunk_id as dst, e.relation, e.weight
          from kb.edges e where e.relation in ('link', 'entity');
    create temporary table kbpg_desired on commit drop as
    with link_edges as (
        select l.chunk_id as src,
               coalesce(
                   (select c.id from pg_temp.kbpg_target_chunks c
                     where c.document_id = d.id and l.fragment <> ''
                       and pg_catalog.btrim(pg_catalog.regexp_replace(pg_catalog.lower(
                             pg_catalog.regexp_replace(c.section, '^.* > ', '')), '[^a-z0-9]+', '-', 'g'), '-')
                           = pg_catalog.lower(l.fragment)
                     order by c.ordinal limit 1),
                   (select c.id from pg_temp.kbpg_target_chunks c where c.document_id = d.id
                     order by c.ordinal limit 1)) as dst,
               'link'::text as relation,
               _refresh_derived_edges.link_weight as weight,
               l.document_id
          from pg_temp.kbpg_links l
          join pg_temp.kbpg_targets d on d.source = l.target_source
    ), rare as (
        select m.entity, m.document_id, m.id, pg_catalog.count(*) over (partition by m.entity) as df
          from pg_temp.kbpg_mentions m
    ), entity_edges as (
        select least(a.id, b.id) as src, greatest(a.id, b.id) as dst, 'entity'::text as relation,
               pg_catalog.max(2.0 / a.df)::real as weight,
               pg_catalog.min(case when a.id < b.id then a.document_id else b.document_id end) as document_id
          from rare a join rare b on a.entity = b.entity and a.document_id < b.document_id
         where a.df between 2 and _refresh_derived_edges.max_docs
         group by 1, 2
    )
    select x.src, x.dst, x.relation, pg_catalog.max(x.weight) as weight,
           pg_catalog.min(x.document_id) as document_id
      from (select * from link_edges union all select * from entity_edges) x
     where x.dst is not null and x.src <> x.dst
     group by x.src, x.dst, x.relation;

    delete from kb_data.edges e
     where e.relation in ('link', 'entity')
       and (e.src_chunk_id, e.dst_chunk_id, e.relation) in (
               select n.src, n.dst, n.relation from pg_temp.kbpg_derived_now n
                where not exists (select 1 from pg_temp.kbpg_desired d
                                   where d.src = n.src and d.dst = n.dst and d.relation = n.relation))
       and e.kb_id = (select kb._current_kb());
    get diagnostics removed = row_count;
    update kb_data.edges e set weight = d.weight
      from (select d.src, d.dst, d.relation, d.weight
              from pg_temp.kbpg_desired d
              join pg_temp.kbpg_derived_now n
                on n.src = d.src and n.dst = d.dst and n.relation = d.relation and n.weight <> d.weight) d
     where e.src_chunk_id = d.src and e.dst_chunk_id = d.dst and e.relation = d.relation
       and e.kb_id = (select kb._current_kb());
    get diagnostics reweighted = row_count;
    insert into kb_data.edges (src_chunk_id, dst_chunk_id, relation, weight, document_id)
    select d.src, d.dst, d.relation, d.weight, d.document_id
      from pg_temp.kbpg_desired d
     where not exists (select 1 from pg_temp.kbpg_derived_now n
                        where n.src = d.src and n.dst = d.dst and n.relation = d.relation);
    get diagnostics added = row_count;
end
$$;
comment on function kb._refresh_derived_edges(real, integer) is
    'Distributed layout: bring link and entity edges in line with kb.chunk_links and '
    'kb.chunk_entities, as kbpg''s single-server statement does, reading each distributed '
    'table shard by shard; returns how many edges were added, removed and reweighted.';

create or replace function kb._bm25_statistics_distributed(
    lexemes text[],
    out chunk_count bigint,
    out total_tokens bigint,
    out reset_at timestamptz,
    out found_lexemes text[],
    out doc_freqs integer[]
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    stat record;
begin
    found_lexemes := '{}';
    doc_freqs := '{}';
    -- one statement (a task per shard): the totals and the given lexemes' frequencies
    for stat in
        select s.lexeme, pg_catalog.sum(s.doc_freq) as df, pg_catalog.sum(s.tokens) as tokens,
               pg_catalog.max(s.reset_at) as reset_at
          from kb.bm25_shard_stats s
         where s.lexeme = any (pg_catalog.array_append(_bm25_statistics_distributed.lexemes, ''))
         group by s.lexeme
         order by s.lexeme
    loop
        if stat.lexeme = '' then
            chunk_count := stat.df;
            total_tokens := stat.tokens;
            reset_at := stat.reset_at;
        elsif stat.df > 0 then
            found_lexemes := found_lexemes || stat.lexeme;
            doc_freqs := doc_freqs || stat.df::integer;
        end if;
    end loop;
    chunk_count := coalesce(chunk_count, 0);
    total_tokens := coalesce(total_tokens, 0);
end
$$;
comment on function kb._bm25_statistics_distributed(text[]) is
    'Distributed layout: the chunk count, total length and last TRUNCATE time, and the document '
    'frequency of each given lexeme the corpus holds, summed over the shards in one statement. '
    'Internal to the lexical arm.';

create or replace function kb._bm25_rank_distributed(
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
    uncached_since bigint default null,
    rare tsquery default null,
    visible_groups text[] default null,
    filter_metadata jsonb default null
)
returns table (rank integer, chunk_id bigint, document_id bigint, score double precision)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    filter_sql constant text := kb._chunk_filter_sql(
        'c', '$1', '$2', '$3', '$13', filter_groups, filter_category, filter_labels, visible_groups,
        filter_metadata);
    -- kb._bm25_rank's sources; with uncached_since (the impact cache's watermark) the
    -- candidates also take, in the same statement, what the single-server arm reads first: the
    -- chunks above the watermark, those changed since the cache was built (kb.lexical_pending,
    -- beside their chunks on each shard) and those holding a rare term (GIN)
    from_sql constant text := case
        when uncached_since is not null then
            'kb.chunks c join (select x.document_id, x.id from kb.chunks x '
            '                   where x.id operator(pg_catalog.=) any ($9) '
            '                      or x.id operator(pg_catalog.>) $11 '
            || case when rare is not null then ' or x.tsv operator(pg_catalog.@@) $12 ' else '' end
            || '                  union '
            '                  select p.document_id, p.chunk_id from kb.lexical_pending p) k '
            '  on k.document_id operator(pg_catalog.=) c.document_id '
            ' and k.id operator(pg_catalog.=) c.id'
        else 'kb.chunks c' end;
    source_sql constant text := case
        when candidate_ids is not null and uncached_since is null
            then 'c.id operator(pg_catalog.=) any ($9) and c.tsv operator(pg_catalog.@@) $8'
        when filter_first and filter_sql <> 'true'
            then 'coalesce(c.tsv operator(pg_catalog.@@) $8, false)'
        else 'c.tsv operator(pg_catalog.@@) $8' end;
    found record;
    ranked integer := 0;
begin
    -- kb._bm25_rank without its window function: each shard sorts and cuts its own matches
    -- (ORDER BY ... LIMIT reaches the shards; a row_number() over every match would bring every
    -- match to the coordinator), and the rank is counted here
    for found in execute format(
        'select c.id, c.document_id, s.score from %s '
        'cross join lateral kb._bm25_score(c.tsv, c.token_count, $4, $5, $6) s '
        'where %s and %s %s '
        'order by s.score desc, c.id limit $10',
        from_sql, source_sql, filter_sql,
        case when excluded is null then '' else 'and not c.tsv operator(pg_catalog.@@) $7' end)
    using filter_groups, filter_category, filter_labels, terms, idfs, avgdl, excluded,
          kb._lexemes_tsquery(terms), candidate_ids, limit_count, uncached_since, rare,
          visible_groups
    loop
        ranked := ranked + 1;
        rank := ranked;
        chunk_id := found.id;
        document_id := found.document_id;
        score := found.score;
        return next;
    end loop;
end
$$;
comment on function kb._bm25_rank_distributed(text[], double precision[], double precision, tsquery, bigint[], integer, text[], text, text[], boolean, bigint, tsquery, text[], jsonb) is
    'Distributed layout: kb._bm25_rank with the sort and cut on each shard, among the chunks '
    'visible_groups lets the caller read (NULL: all); uncached_since (the cache''s watermark) '
    'also rescores the chunks above it, in kb.lexical_pending and holding a rare term, in the '
    'same statement. Internal to the lexical arm.';

create or replace function kb._search_results_distributed(
    rrf_k integer,
    vector_weight double precision,
    lexical_weight double precision,
    graph_weight double precision,
    max_per_doc integer,
    cut_count integer,
    vector_only boolean,
    embeddings @extschema:vector@.vector[],
    found_ids bigint[],
    found_docs bigint[],
    vector_ids bigint[],
    lexical_ids bigint[],
    graph_ids bigint[]
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    source text,
    title text,
    section text,
    content text,
    score double precision,
    similarity double precision,
    vector_rank integer,
    lexical_rank integer,
    graph_rank integer,
    fused_rank integer
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    fused_ids bigint[];
    fused_docs bigint[];
    fused_scores double precision[];
    fused_vector_ranks integer[];
    fused_lexical_ranks integer[];
    fused_graph_ranks integer[];
    cut_ids bigint[];
    cut_docs bigint[];
    cut_inputs integer[];
begin
    -- (vector_only is no longer read: score is always the fused score; the parameter stays so
    -- that the signature does not change)
    -- kb.search's fusion and cut, with each chunk's document taken from the arm that found it
    -- (the single-server statement joins the fused ids to kb.chunks for them, and the cut to
    -- kb.chunks and kb.documents for the rows: a join to a function's rows, which Citus runs
    -- by shipping them to every worker first)
    select array_agg(f.chunk_id order by f.rank), array_agg(m.doc order by f.rank),
           array_agg(f.score order by f.rank), array_agg(f.vector_rank order by f.rank),
           array_agg(f.lexical_rank order by f.rank), array_agg(f.graph_rank order by f.rank)
      into fused_ids, fused_docs, fused_scores, fused_vector_ranks, fused_lexical_ranks,
           fused_graph_ranks
      from kb.fuse_rrf(vector_ids, lexical_ids, graph_ids, rrf_k, vector_weight,
                       lexical_weight, graph_weight) f
      join (select distinct on (u.id) u.id, u.doc
              from unnest(found_ids, found_docs) as u(id, doc)) m on m.id = f.chunk_id;
    if fused_ids is null then
        return;
    end if;
    select array_agg(p.chunk_id order by p.rank), array_agg(p.document_id order by p.rank),
           array_agg(p.input_rank order by p.rank)
      into cut_ids, cut_docs, cut_inputs
      from kb.cap_per_document(fused_ids, fused_docs, max_per_doc) p
     where cut_count is null or p.rank <= cut_count;
    -- one statement, on the shards holding the cut's documents; the rank is the chunk's place
    -- in the cut
    return query
    select pg_catalog.array_position(cut_ids, c.id), c.id, c.document_id, d.source, d.title,
           c.section, c.content,
           fused_scores[cut_inputs[pg_catalog.array_position(cut_ids, c.id)]],
           b.similarity,
           fused_vector_ranks[cut_inputs[pg_catalog.array_position(cut_ids, c.id)]],
           fused_lexical_ranks[cut_inputs[pg_catalog.array_position(cut_ids, c.id)]],
           fused_graph_ranks[cut_inputs[pg_catalog.array_position(cut_ids, c.id)]],
           cut_inputs[pg_catalog.array_position(cut_ids, c.id)]
      from kb.chunks c
      join kb.documents d on d.id = c.document_id
      cross join lateral (
          select pg_catalog.max(1 - (c.embedding operator(@extschema:vector@.<=>) q.e)) as similarity
            from pg_catalog.unnest(embeddings) q(e)) b
     where c.document_id = any (cut_docs) and c.id = any (cut_ids)
     order by pg_catalog.array_position(cut_ids, c.id);
end
$$;
comment on function kb._search_results_distributed(integer, double precision, double precision, double precision, integer, integer, boolean, @extschema:vector@.vector[], bigint[], bigint[], bigint[], bigint[], bigint[]) is
    'Distributed layout: kb.search''s fusion, per-document cap, cut and result rows (read in one '
    'statement). Internal to kb.search.';

create or replace function kb._recount_bm25_distributed(chunks_now bigint, tokens_now bigint)
returns bigint
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    corrected bigint;
begin
    -- kb.recount_bm25_statistics() on the distributed layout (the caller holds the lock on
    -- kb.chunks): each lexeme counted on the shards, compared with the shards' sums (wrong,
    -- missing and left-behind ones: the count of them), then the shards' rows replaced by the
    -- counts, all on one anchor (only the sums mean anything; the triggers add to them as before)
    drop table if exists pg_temp.kbpg_counted, pg_temp.kbpg_summed;
    create temporary table kbpg_counted on commit drop as
        select u.lexeme, pg_catalog.count(*) as doc_freq
          from kb.chunks c
         cross join lateral pg_catalog.unnest(pg_catalog.tsvector_to_array(c.tsv)) as u(lexeme)
         group by u.lexeme;
    create temporary table kbpg_summed on commit drop as
        select s.lexeme, pg_catalog.sum(s.doc_freq) as doc_freq
          from kb.bm25_shard_stats s where s.lexeme <> ''
         group by s.lexeme having pg_catalog.sum(s.doc_freq) <> 0;
    select pg_catalog.count(*) into corrected
      from pg_temp.kbpg_counted t full join pg_temp.kbpg_summed m on m.lexeme = t.lexeme
     where t.doc_freq is distinct from m.doc_freq;
    delete from kb_data.bm25_shard_stats where kb_id = kb._current_kb();
    insert into kb_data.bm25_shard_stats (anchor, lexeme, doc_freq, tokens)
    select 0, '', chunks_now, tokens_now
    union all
    select 0, t.lexeme, t.doc_freq, 0 from pg_temp.kbpg_counted t;
    return corrected;
end
$$;
comment on function kb._recount_bm25_distributed(bigint, bigint) is
    'Distributed layout: kb.recount_bm25_statistics()''s recount (the caller locks kb.chunks): '
    'kb.bm25_shard_stats replaced by counts from the shards; returns how many lexemes were '
    'wrong, missing or left behind. Internal.';
