-- kbpg: the graph arm — chunks reached from seed chunks over kb.edges.
-- A path's score is the product of its edge weights (weights are in [0, 1], so deeper is
-- never better); a chunk keeps its best path. Each step reads the two indexed directions
-- separately, heaviest first (edges_src_weight, edges_dst_weight: revision 0016, so a chunk
-- with many edges costs its 32 heaviest, not all of them): one recursive CTE that OR-ed both
-- ends in its join was measured ~400x slower. Cycle-safe and linear in what it reads: a chunk
-- is expanded again only when its best score improved (at most max_depth times), bounded in
-- depth, in fan-out (the 32 heaviest edges per chunk and direction), per level (the 10,000
-- best-scoring chunks a level improves) and in all (at most 1,000 seeds, else SQLSTATE KB003,
-- and 1,000 chunks expanded over the walk, the best-scoring first).
-- Seeds are never returned. Filters apply to the chunks returned; paths may pass through
-- chunks the filters exclude (nothing of theirs is returned).
-- Access control is different: an edge is visible only when both its chunks are (the
-- caller may read them: kb._access_visibility()), so no path starts at, enters or crosses a
-- chunk the caller may not read, and hidden edges take no place in the fan-out.

create or replace function kb._expand_graph(
    seed_chunk_ids bigint[],
    max_depth integer,
    max_returned integer,
    min_score double precision,
    groups text[],
    category text,
    labels text[],
    visible_groups text[],
    metadata_filter jsonb default null
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    score double precision,
    depth integer,
    via_chunk_id bigint
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    best_ids bigint[];
    best_scores double precision[];
    best_hops integer[];
    best_via bigint[];
    frontier_ids bigint[];
    frontier_scores double precision[];
    frontier_via bigint[];
    -- the distributed layout (Citus): a hop's edges read in one statement, then picked here
    distributed constant boolean := kb._distributed();
    edge_src bigint[];
    edge_dst bigint[];
    edge_weight double precision[];
    found_ids bigint[];
    found_docs bigint[];
    visible_ids bigint[];
    -- a reader's walk: far ends of the hop's heaviest edges checked (and the chunks reached
    -- before), and those of them the caller may not read
    checked_ids bigint[] := '{}';
    hidden_ids bigint[] := '{}';
    restricted constant boolean := _expand_graph.visible_groups is not null;
    -- chunks expanded over the whole walk, at most (benchmarks/bench_query_cost.py: at depth 5
    -- on a graph of 64 edges a chunk, 1,000 seeds read 64,000 edges a level, 10-17 s, before
    -- this bound; at 1,000 chunks 0.25 s for the owner and 0.5-0.7 s for a reader, at 50k and
    -- at 200k chunks alike, on 2 loaded cores); each expanded chunk reads at most 64 edges
    -- (the weight-ordered indexes) and, for a reader, the visibility of their far ends, so the
    -- walk's work does not grow with the corpus; kb.graph_walk_budget lowers it (tests), and
    -- only the owner may raise it
    budget constant integer := coalesce(kb._tuning('kb.graph_walk_budget', 1, 1000), 1000);
    expanded integer := 0;
    -- the metadata filter compiled once (sql/018), tested per chunk reached
    metadata_path constant text := kb._metadata_jsonpath(_expand_graph.metadata_filter);
begin
    if _expand_graph.max_depth is null or _expand_graph.max_depth not between 1 and 5 then
        raise exception 'max_depth must be between 1 and 5, got %', coalesce(_expand_graph.max_depth::text, 'NULL')
            using errcode = '22023', hint = 'the graph arm walks 1 hop by default';
    end if;
    if _expand_graph.max_returned is null or _expand_graph.max_returned not between 0 and 1000 then
        raise exception 'max_returned must be between 0 and 1000, got %', coalesce(_expand_graph.max_returned::text, 'NULL')
            using errcode = '22023', hint = 'the graph arm returns at most 3 chunks by default';
    end if;
    if _expand_graph.min_score is null or _expand_graph.min_score not between 0 and 1 then
        raise exception 'min_score must be between 0 and 1, got %', coalesce(_expand_graph.min_score::text, 'NULL')
            using errcode = '22023', hint = 'path scores are products of edge weights in [0, 1]';
    end if;
    -- the cost bound: seeds and chunks expanded (each reads up to 64 edges)
    if cardinality(_expand_graph.seed_chunk_ids) > 1000 then
        raise exception 'the graph walk starts from % seed chunks, over the limit of 1000',
                cardinality(_expand_graph.seed_chunk_ids)
            using errcode = 'KB003', hint = 'walk from at most 1000 chunks (kb.search passes its vector or lexical hits)';
    end if;
    perform kb._check_filter_lists(_expand_graph.groups, _expand_graph.labels);
    if coalesce(cardinality(_expand_graph.seed_chunk_ids), 0) = 0 or _expand_graph.max_returned = 0 then
        return;
    end if;
    -- level by level (Bellman-Ford bounded by the depth): a chunk is expanded again only when
    -- its best score improved, so each level reads at most 64 edges per chunk reached; the
    -- recursive CTE of 0.1.0 followed every path (a 70-chunk clique at depth 4: 10 s)
    -- seeds the caller may not read start nothing
    if distributed and restricted then
        -- the seeds the caller may read, in one statement (Citus plans no correlated subquery
        -- over the function's arrays)
        visible_ids := array(select c.id from kb.chunks c
                              where c.id = any (_expand_graph.seed_chunk_ids)
                                and (c.groups = '{}'
                                     or c.groups operator(pg_catalog.&&) _expand_graph.visible_groups));
    end if;
    select array_agg(s.id), array_agg(1.0::float8), array_agg(0), array_agg(null::bigint)
      into best_ids, best_scores, best_hops, best_via
      from (select distinct x.id from pg_catalog.unnest(_expand_graph.seed_chunk_ids) as x(id)
             where x.id is not null
               and (not restricted
                    or (distributed and x.id = any (visible_ids))
                    or (not distributed
                        and exists (select 1 from kb.chunks c
                                     where c.id = x.id
                                       and (c.groups = '{}'
                                            or c.groups operator(pg_catalog.&&) _expand_graph.visible_groups))))) s;
    frontier_ids := best_ids;
    frontier_scores := best_scores;
    for hop in 1.._expand_graph.max_depth loop
        exit when coalesce(cardinality(frontier_ids), 0) = 0 or expanded >= budget;
        -- the walk's budget: the best-scoring chunks of the frontier, as many as it has left
        if cardinality(frontier_ids) > budget - expanded then
            select array_agg(f.id order by f.score desc, f.id), array_agg(f.score order by f.score desc, f.id)
              into frontier_ids, frontier_scores
              from (select u.id, u.score from unnest(frontier_ids, frontier_scores) as u(id, score)
                     order by u.score desc, u.id limit budget - expanded) f;
        end if;
        expanded := expanded + cardinality(frontier_ids);
        if distributed then
            -- Citus pushes no LATERAL ... LIMIT down: every edge touching the frontier comes
            -- in one statement (a task per shard), and each chunk's 32 heaviest per direction
            -- are picked here, as the single-server statement below picks them
            select pg_catalog.array_agg(e.src_chunk_id), pg_catalog.array_agg(e.dst_chunk_id),
                   pg_catalog.array_agg(e.weight::float8)
              into edge_src, edge_dst, edge_weight
              from kb.edges e
             where e.src_chunk_id = any (frontier_ids) or e.dst_chunk_id = any (frontier_ids);
            if restricted then
                -- an edge is visible when both its chunks are: the far ends the caller may
                -- read, in one more statement (the frontier's chunks are readable already)
                visible_ids := array(select c.id from kb.chunks c
                                      where c.id = any (edge_src || edge_dst)
                                        and (c.groups = '{}'
                                             or c.groups operator(pg_catalog.&&) _expand_graph.visible_groups));
                select pg_catalog.array_agg(x.src), pg_catalog.array_agg(x.dst),
                       pg_catalog.array_agg(x.weight)
                  into edge_src, edge_dst, edge_weight
                  from unnest(edge_src, edge_dst, edge_weight) as x(src, dst, weight)
                 where x.src = any (visible_ids) and x.dst = any (visible_ids);
            end if;
            select coalesce(array_agg(c.next_id), '{}'), coalesce(array_agg(c.score), '{}'),
                   coalesce(array_agg(c.via), '{}')
              into frontier_ids, frontier_scores, frontier_via
              from (select c.next_id, c.score, c.via
                      from (select distinct on (n.next_id) n.next_id, n.score * n.weight as score,
                                   n.id as via
                              from (select f.id, f.score, x.dst as next_id, x.weight,
                                           pg_catalog.row_number() over (
                                               partition by f.id order by x.weight desc, x.dst) as nth
                                      from unnest(frontier_ids, frontier_scores) as f(id, score)
                                      join unnest(edge_src, edge_dst, edge_weight) as x(src, dst, weight)
                                        on x.src = f.id
                                    union all
                                    select f.id, f.score, x.src, x.weight,
                                           pg_catalog.row_number() over (
                                               partition by f.id order by x.weight desc, x.src)
                                      from unnest(frontier_ids, frontier_scores) as f(id, score)
                                      join unnest(edge_src, edge_dst, edge_weight) as x(src, dst, weight)
                                        on x.dst = f.id) n
                             where n.nth <= 32 and n.score * n.weight >= _expand_graph.min_score
                             order by n.next_id, n.score * n.weight desc, n.id) c
                      left join unnest(best_ids, best_scores) as b(id, score) on b.id = c.next_id
                     where b.id is null or c.score > b.score
                     order by c.score desc, c.next_id
                     limit 10000) c;
        else
        if restricted then
            -- a reader: an edge counts only when the caller may read its far end (a hidden one
            -- takes no place in the fan-out). The far ends of each chunk's 32 heaviest edges a
            -- direction that the walk has not reached before (every chunk in best_ids is
            -- readable) are checked once per hop, in one index scan over the distinct ones,
            -- instead of an EXISTS per edge (~2.3x the owner's walk). The hop below skips the
            -- hidden ones by a hash lookup; only an edge past a chunk's first 32, read because
            -- some of those were hidden, is checked on its own
            checked_ids := array(
                select distinct x.next_id
                  from unnest(frontier_ids) as f(id)
                 cross join lateral (
                     (select e.dst_chunk_id as next_id from kb.edges e
                       where e.src_chunk_id = f.id
                       order by e.weight desc, e.dst_chunk_id limit 32)
                     union all
                     (select e.src_chunk_id from kb.edges e
                       where e.dst_chunk_id = f.id
                       order by e.weight desc, e.src_chunk_id limit 32)) x
                 where x.next_id not in (select b.id from unnest(best_ids) as b(id)));
            hidden_ids := array(
                select c.id from kb.chunks c
                 where c.id = any (checked_ids)
                   and not (c.groups = '{}' or c.groups operator(pg_catalog.&&) _expand_graph.visible_groups));
            checked_ids := checked_ids || best_ids;
        end if;
        -- the best path into each chunk this level (ties: the smaller via), where it beats the
        -- chunk's best so far (an equal score keeps the shorter path); the budget keeps the
        -- best-scoring chunks when a level would reach more
        select coalesce(array_agg(c.next_id), '{}'), coalesce(array_agg(c.score), '{}'),
               coalesce(array_agg(c.via), '{}')
          into frontier_ids, frontier_scores, frontier_via
          from (select c.next_id, c.score, c.via
                  from (select distinct on (n.next_id) n.next_id, f.score * n.weight as score,
                               f.id as via
                          from unnest(frontier_ids, frontier_scores) as f(id, score)
                          cross join lateral (
                              (select e.dst_chunk_id as next_id, e.weight::float8 as weight
                                 from kb.edges e where e.src_chunk_id = f.id
                                  and (not restricted
                                       or (e.dst_chunk_id not in (select h.id from unnest(hidden_ids) as h(id))
                                           and (e.dst_chunk_id in (select k.id from unnest(checked_ids) as k(id))
                                                or exists (select 1 from kb.chunks c where c.id = e.dst_chunk_id
                                                             and (c.groups = '{}' or c.groups operator(pg_catalog.&&) _expand_graph.visible_groups)))))
                                order by e.weight desc, e.dst_chunk_id limit 32)
                              union all
                              (select e.src_chunk_id, e.weight::float8
                                 from kb.edges e where e.dst_chunk_id = f.id
                                  and (not restricted
                                       or (e.src_chunk_id not in (select h.id from unnest(hidden_ids) as h(id))
                                           and (e.src_chunk_id in (select k.id from unnest(checked_ids) as k(id))
                                                or exists (select 1 from kb.chunks c where c.id = e.src_chunk_id
                                                             and (c.groups = '{}' or c.groups operator(pg_catalog.&&) _expand_graph.visible_groups)))))
                                order by e.weight desc, e.src_chunk_id limit 32)
                          ) n
                         where f.score * n.weight >= _expand_graph.min_score
                         order by n.next_id, f.score * n.weight desc, f.id) c
                  left join unnest(best_ids, best_scores) as b(id, score) on b.id = c.next_id
                 where b.id is null or c.score > b.score
                 order by c.score desc, c.next_id
                 limit 10000) c;
        end if;
        -- merge the improvements into the best paths (one hash join, not a scan per chunk)
        select array_agg(coalesce(n.id, b.id)), array_agg(coalesce(n.score, b.score)),
               array_agg(case when n.id is null then b.hops else hop end),
               array_agg(case when n.id is null then b.via else n.via end)
          into best_ids, best_scores, best_hops, best_via
          from unnest(best_ids, best_scores, best_hops, best_via) as b(id, score, hops, via)
          full join unnest(frontier_ids, frontier_scores, frontier_via) as n(id, score, via)
            on n.id = b.id;
    end loop;

    if distributed then
        -- the reached chunks' documents and filters, read in one statement (a join to the
        -- arrays' rows would be shipped to every worker first)
        found_ids := array(select b.id from unnest(best_ids, best_hops) as b(id, hops)
                            where b.hops > 0 and b.id <> all (_expand_graph.seed_chunk_ids));
        -- without a metadata filter the statement names no kb._metadata_holds: Citus ships
        -- it to the workers as written, and a function that reads a table reaches them only
        -- when created after the distribution (kbpg db upgrade then)
        if metadata_path is null then
            select pg_catalog.array_agg(c.id), pg_catalog.array_agg(c.document_id)
              into found_ids, found_docs
              from kb.chunks c
             where c.id = any (found_ids)
               and kb._chunk_matches_filters(c.groups, c.category, c.labels, _expand_graph.groups,
                                             _expand_graph.category, _expand_graph.labels);
        else
            select pg_catalog.array_agg(c.id), pg_catalog.array_agg(c.document_id)
              into found_ids, found_docs
              from kb.chunks c
             where c.id = any (found_ids)
               and kb._chunk_matches_filters(c.groups, c.category, c.labels, _expand_graph.groups,
                                             _expand_graph.category, _expand_graph.labels)
               and kb._metadata_holds(c.document_id, metadata_path);
        end if;
        return query
        select (pg_catalog.row_number() over (order by b.score desc, b.hops, b.id))::integer,
               b.id, f.document_id, b.score, b.hops, b.via
          from unnest(best_ids, best_scores, best_hops, best_via) as b(id, score, hops, via)
          join unnest(found_ids, found_docs) as f(id, document_id) on f.id = b.id
         order by b.score desc, b.hops, b.id
         limit _expand_graph.max_returned;
        return;
    end if;
    -- the reached chunks best first, each looked up (document, filters) only until
    -- max_returned pass: a nested loop in that order under the limit (a join of every reached
    -- chunk, ~20,000 at the bounds, read them all)
    return query
    select (pg_catalog.row_number() over (order by b.score desc, b.hops, b.id))::integer,
           b.id, c.document_id, b.score, b.hops, b.via
      from (select u.id, u.score, u.hops, u.via
              from unnest(best_ids, best_scores, best_hops, best_via) as u(id, score, hops, via)
             where u.hops > 0 and u.id <> all (_expand_graph.seed_chunk_ids)
             order by u.score desc, u.hops, u.id) b
     cross join lateral (
         select c.document_id from kb.chunks c
          where c.id = b.id
            and kb._chunk_matches_filters(c.groups, c.category, c.labels, _expand_graph.groups,
                                          _expand_graph.category, _expand_graph.labels)
            and kb._metadata_holds(c.document_id, metadata_path)
         offset 0) c
     order by b.score desc, b.hops, b.id
     limit _expand_graph.max_returned;
end
$$;
comment on function kb._expand_graph(bigint[], integer, integer, double precision, text[], text, text[], text[], jsonb) is
    'The graph arm (kb.expand_graph) over the edges whose both chunks visible_groups lets the '
    'caller read (NULL: all). Internal to kb.expand_graph and kb.search.';

create or replace function kb.expand_graph(
    seed_chunk_ids bigint[],
    max_depth integer default 1,
    max_returned integer default 3,
    min_score double precision default 0.5,
    groups text[] default null,
    category text default null,
    labels text[] default null,
    filter jsonb default null
)
returns table (
    rank integer,
    chunk_id bigint,
    document_id bigint,
    score double precision,
    depth integer,
    via_chunk_id bigint
)
language sql
stable
-- a reader's way in: the owner's rights, the caller's grants (sql/015)
security definer
set search_path = pg_catalog, pg_temp
set client_min_messages = notice
begin atomic
    select g.rank, g.chunk_id, g.document_id, g.score, g.depth, g.via_chunk_id
      from kb._expand_graph(seed_chunk_ids, max_depth, max_returned, min_score, groups, category,
                            labels, kb._access_visibility(), expand_graph.filter) g;
end;
comment on function kb.expand_graph(bigint[], integer, integer, double precision, text[], text, text[], jsonb) is
    'Graph arm: chunks within max_depth hops of the seeds over kb.edges (both directions), '
    'scored by the product of edge weights, at least min_score, best max_returned first, '
    'filtered (filter => a metadata filter, as kb.search); returns the hop count and the chunk each was reached from. Only edges between '
    'chunks the caller may read are walked.';
