-- kbpg: fusion — weighted Reciprocal Rank Fusion and the per-document cap.

create or replace function kb._fuse(
    fusion text,
    vector_ids bigint[],
    vector_scores double precision[],
    lexical_ids bigint[],
    lexical_scores double precision[],
    graph_ids bigint[],
    graph_scores double precision[],
    rrf_k integer,
    vector_weight double precision,
    lexical_weight double precision,
    graph_weight double precision
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
    return query
    with hits as (
        select u.id, 'v' as arm, u.ord, u.s, _fuse.vector_weight as w
          from unnest(_fuse.vector_ids, _fuse.vector_scores) with ordinality u(id, s, ord)
        union all
        select u.id, 'l', u.ord, u.s, _fuse.lexical_weight
          from unnest(_fuse.lexical_ids, _fuse.lexical_scores) with ordinality u(id, s, ord)
        union all
        select u.id, 'g', u.ord, u.s, _fuse.graph_weight
          from unnest(_fuse.graph_ids, _fuse.graph_scores) with ordinality u(id, s, ord)
    ), parts as (
        -- what one listing adds: rrf, weight / (rrf_k + rank), ranks from 1 in each list;
        -- convex, weight x the score min-max normalised over its arm's list (best 1, worst 0;
        -- a list of one, or of equal scores: 1)
        select h.id, h.arm, h.ord,
               case when _fuse.fusion = 'rrf' then h.w / (_fuse.rrf_k + h.ord)
                    else h.w * coalesce((h.s - pg_catalog.min(h.s) over a)
                                        / nullif(pg_catalog.max(h.s) over a - pg_catalog.min(h.s) over a, 0), 1)
               end as part
          from hits h where h.id is not null
        window a as (partition by h.arm)
    ), per_chunk as (
        -- a chunk listed twice by one arm counts its best listing once
        select p.id,
               (min(p.ord) filter (where p.arm = 'v'))::integer as vr,
               (min(p.ord) filter (where p.arm = 'l'))::integer as lr,
               (min(p.ord) filter (where p.arm = 'g'))::integer as gr,
               coalesce(max(p.part) filter (where p.arm = 'v'), 0)
             + coalesce(max(p.part) filter (where p.arm = 'l'), 0)
             + coalesce(max(p.part) filter (where p.arm = 'g'), 0) as fused
          from parts p group by p.id
    )
    select (pg_catalog.row_number() over w)::integer, c.id, c.fused, c.vr, c.lr, c.gr
      from per_chunk c
    window w as (order by c.fused desc, c.vr nulls last, c.lr nulls last, c.gr nulls last, c.id)
     order by c.fused desc, c.vr nulls last, c.lr nulls last, c.gr nulls last, c.id;
end
$$;
comment on function kb._fuse(text, bigint[], double precision[], bigint[], double precision[], bigint[], double precision[], integer, double precision, double precision, double precision) is
    'The fusion of kb.fuse_rrf (fusion ''rrf'', scores unused) and kb.fuse_convex (''convex''), '
    'parameters already checked; ties go to the better vector rank, then lexical, then graph '
    'rank, then chunk id. Internal: kb.search calls it with its fusion.';

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
rows 100  -- the fused list (see kb._fuse)
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    perform kb._check_fusion_parameters(fuse_rrf.rrf_k, fuse_rrf.vector_weight,
                                       fuse_rrf.lexical_weight, fuse_rrf.graph_weight);
    return query
    select * from kb._fuse('rrf', fuse_rrf.vector_ids, '{}', fuse_rrf.lexical_ids, '{}',
                           fuse_rrf.graph_ids, '{}', fuse_rrf.rrf_k, fuse_rrf.vector_weight,
                           fuse_rrf.lexical_weight, fuse_rrf.graph_weight);
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
rows 100  -- the fused list (see kb._fuse)
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
    select * from kb._fuse('convex', fuse_convex.vector_ids, fuse_convex.vector_scores,
                           fuse_convex.lexical_ids, fuse_convex.lexical_scores,
                           fuse_convex.graph_ids, fuse_convex.graph_scores, 60,
                           fuse_convex.vector_weight, fuse_convex.lexical_weight,
                           fuse_convex.graph_weight);
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
rows 100  -- the fused list (see kb._fuse)
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
