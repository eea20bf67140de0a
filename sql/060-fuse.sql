-- kbpg: fusion — weighted Reciprocal Rank Fusion and the per-document cap.

create or replace function kb.fuse_rrf(
    vector_ids bigint[],
    lexical_ids bigint[],
    graph_ids bigint[] default '{}',
    rrf_k integer default 60,
    vector_weight double precision default 1,
    lexical_weight double precision default 1,
    graph_weight double precision default 1
)
returns table (
    rank integer,
    chunk_id bigint,
    score double precision,
    vector_rank integer,
    lexical_rank integer,
    graph_rank integer
)
language plpgsql
immutable
parallel safe
security invoker
-- at most three pools (of at most 1,000); PostgreSQL's default guess for a set-returning
-- function, 1,000 rows, made kb.search's join of the fused ids to a partitioned kb.chunks a
-- scan of every partition (benchmarks/bench_partitioning.py, 39 partitions)
rows 100
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    perform kb._check_fusion_parameters(fuse_rrf.rrf_k, fuse_rrf.vector_weight,
                                       fuse_rrf.lexical_weight, fuse_rrf.graph_weight);
    return query
    with hits as (
        select u.id, 'v' as arm, u.ord from pg_catalog.unnest(fuse_rrf.vector_ids) with ordinality u(id, ord)
        union all
        select u.id, 'l', u.ord from pg_catalog.unnest(fuse_rrf.lexical_ids) with ordinality u(id, ord)
        union all
        select u.id, 'g', u.ord from pg_catalog.unnest(fuse_rrf.graph_ids) with ordinality u(id, ord)
    ), per_chunk as (
        -- ranks count from 1 in each list; a chunk listed twice by one arm keeps its best rank
        select h.id,
               (min(h.ord) filter (where h.arm = 'v'))::integer as vr,
               (min(h.ord) filter (where h.arm = 'l'))::integer as lr,
               (min(h.ord) filter (where h.arm = 'g'))::integer as gr
          from hits h where h.id is not null group by h.id
    ), scored as (
        select p.*,
               coalesce(fuse_rrf.vector_weight / (fuse_rrf.rrf_k + p.vr), 0)
             + coalesce(fuse_rrf.lexical_weight / (fuse_rrf.rrf_k + p.lr), 0)
             + coalesce(fuse_rrf.graph_weight / (fuse_rrf.rrf_k + p.gr), 0) as fused
          from per_chunk p
    )
    select (pg_catalog.row_number() over w)::integer, s.id, s.fused, s.vr, s.lr, s.gr
      from scored s
    window w as (order by s.fused desc, s.vr nulls last, s.lr nulls last, s.gr nulls last, s.id)
     order by s.fused desc, s.vr nulls last, s.lr nulls last, s.gr nulls last, s.id;
end
$$;
comment on function kb.fuse_rrf(bigint[], bigint[], bigint[], integer, double precision, double precision, double precision) is
    'Weighted Reciprocal Rank Fusion of ranked id lists (rank = position, from 1): score = '
    'sum(weight / (rrf_k + rank)) over the arms that found the chunk; ties go to the better '
    'vector rank, then lexical, then graph rank, then chunk id.';

create or replace function kb.fuse_convex(
    vector_ids bigint[],
    vector_scores double precision[],
    lexical_ids bigint[],
    lexical_scores double precision[],
    graph_ids bigint[] default '{}',
    graph_scores double precision[] default '{}',
    vector_weight double precision default 1,
    lexical_weight double precision default 1,
    graph_weight double precision default 1
)
returns table (
    rank integer,
    chunk_id bigint,
    score double precision,
    vector_rank integer,
    lexical_rank integer,
    graph_rank integer
)
language plpgsql
immutable
parallel safe
security invoker
rows 100  -- the fused list (see kb.fuse_rrf)
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    perform kb._check_fusion_parameters(60, fuse_convex.vector_weight, fuse_convex.lexical_weight,
                                       fuse_convex.graph_weight);
    if coalesce(cardinality(fuse_convex.vector_ids), 0) <> coalesce(cardinality(fuse_convex.vector_scores), 0)
       or coalesce(cardinality(fuse_convex.lexical_ids), 0) <> coalesce(cardinality(fuse_convex.lexical_scores), 0)
       or coalesce(cardinality(fuse_convex.graph_ids), 0) <> coalesce(cardinality(fuse_convex.graph_scores), 0) then
        raise exception 'each arm needs one score per id'
            using errcode = '22023', hint = 'pass the ids and their scores in the same order';
    end if;
    return query
    with hits as (
        select u.id, 'v' as arm, u.ord, u.s from unnest(fuse_convex.vector_ids, fuse_convex.vector_scores) with ordinality u(id, s, ord)
        union all
        select u.id, 'l', u.ord, u.s from unnest(fuse_convex.lexical_ids, fuse_convex.lexical_scores) with ordinality u(id, s, ord)
        union all
        select u.id, 'g', u.ord, u.s from unnest(fuse_convex.graph_ids, fuse_convex.graph_scores) with ordinality u(id, s, ord)
    ), normalized as (
        -- min-max over each arm's list: its best 1, its worst 0 (a list of one, or of equal
        -- scores: 1)
        select h.id, h.arm, h.ord,
               coalesce((h.s - pg_catalog.min(h.s) over w)
                        / nullif(pg_catalog.max(h.s) over w - pg_catalog.min(h.s) over w, 0), 1) as n
          from hits h where h.id is not null
        window w as (partition by h.arm)
    ), per_chunk as (
        select n.id,
               (min(n.ord) filter (where n.arm = 'v'))::integer as vr,
               (min(n.ord) filter (where n.arm = 'l'))::integer as lr,
               (min(n.ord) filter (where n.arm = 'g'))::integer as gr,
               coalesce(max(n.n) filter (where n.arm = 'v'), 0) * fuse_convex.vector_weight
             + coalesce(max(n.n) filter (where n.arm = 'l'), 0) * fuse_convex.lexical_weight
             + coalesce(max(n.n) filter (where n.arm = 'g'), 0) * fuse_convex.graph_weight as fused
          from normalized n group by n.id
    )
    select (pg_catalog.row_number() over w)::integer, p.id, p.fused, p.vr, p.lr, p.gr
      from per_chunk p
    window w as (order by p.fused desc, p.vr nulls last, p.lr nulls last, p.gr nulls last, p.id)
     order by p.fused desc, p.vr nulls last, p.lr nulls last, p.gr nulls last, p.id;
end
$$;
comment on function kb.fuse_convex(bigint[], double precision[], bigint[], double precision[], bigint[], double precision[], double precision, double precision, double precision) is
    'Convex (linear) fusion of scored id lists: each arm''s scores min-max normalised over its '
    'list (best 1, worst 0), score = sum(weight x normalised score) over the arms that found the '
    'chunk; ties as kb.fuse_rrf. kb.search uses it with fusion => ''convex''.';

create or replace function kb.cap_per_document(
    chunk_ids bigint[],
    document_ids bigint[],
    max_per_doc integer default 3
)
returns table (rank integer, chunk_id bigint, document_id bigint, input_rank integer)
language plpgsql
immutable
parallel safe
security invoker
rows 100  -- the fused list (see kb.fuse_rrf)
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    perform kb._check_max_per_doc(cap_per_document.max_per_doc);
    if coalesce(cardinality(cap_per_document.chunk_ids), 0)
       <> coalesce(cardinality(cap_per_document.document_ids), 0) then
        raise exception 'chunk_ids and document_ids differ in length (% vs %)',
                cardinality(cap_per_document.chunk_ids), cardinality(cap_per_document.document_ids)
            using errcode = '22023', hint = 'pass one document id per chunk id, in ranked order';
    end if;
    return query
    with listed as (
        select u.cid, u.did, u.ord::integer as ord,
               pg_catalog.row_number() over (partition by u.did order by u.ord) as nth
          from unnest(cap_per_document.chunk_ids, cap_per_document.document_ids)
               with ordinality u(cid, did, ord)
    )
    select (pg_catalog.row_number() over (order by
                (cap_per_document.max_per_doc is not null and l.nth > cap_per_document.max_per_doc), l.ord))::integer,
           l.cid, l.did, l.ord
      from listed l
     order by (cap_per_document.max_per_doc is not null and l.nth > cap_per_document.max_per_doc), l.ord;
end
$$;
comment on function kb.cap_per_document(bigint[], bigint[], integer) is
    'Reorder a ranked list so no document has more than max_per_doc chunks in front: over-cap '
    'chunks move to the tail in their original order, never dropped. NULL max_per_doc: no cap.';
