"""A search run: embed the question (and its paraphrases), call kb.search in one session,
rerank when asked (then cap and cut in SQL), and type the rows."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kbpg import telemetry
from kbpg.errors import EmbeddingSpaceMismatch, InvalidInput
from kbpg.models.clients import ModelClients
from kbpg.models.embedders import Embedder, FloatArray, embed_queries, embedder_for_model
from kbpg.search.request import OPTIONS, SearchRequest, sql_types
from kbpg.search.results import Chunk, FacetCount, SearchResult, Timings
from kbpg.search.stages import SKIPPED, StageReport, cap_and_cut, paraphrases, rerank_order
from kbpg.store import queries
from kbpg.store.sessions import Cancellation, Database, Principal

__all__ = ["checked_embedding", "run_search", "run_search_across", "within_window"]


# kb.search's parameters with their SQL types (explicit casts keep function resolution
# independent of how the driver types a Python value). The query vector goes uncast: the
# pgvector dumper sends it with the type's own oid, wherever the extension lives.
_SEARCH_TYPES = {
    **sql_types(),
    "query_embedding": "",
    "extra_embeddings": "",
    "rerank_pool": "integer",
}
_SEARCH_TYPE_ITEMS = tuple(_SEARCH_TYPES.items())
# what a search across knowledge bases takes (kb.search_knowledge_bases), and the value each
# option it does not take may have (its default, or off)
_ACROSS_OPTIONS = frozenset(
    {"top", "groups", "category", "labels", "filter", "min_similarity", "fetch_multiplier",
     "max_per_doc", "rrf_k", "vector_weight", "lexical_weight", "snippet"}
)  # fmt: skip
_ACROSS_OFF: dict[str, Any] = {
    "lexical": True,
    "graph": False,
    "diversity": 0,
    "fusion": "rrf",
    "rerank": False,
    "expand": False,
}
_ACROSS_TYPE_ITEMS = (*_SEARCH_TYPE_ITEMS, ("knowledge_bases", "text[]"))
_ACROSS_SQL_NAMES = frozenset({"query_text"} | {OPTIONS[name].sql for name in _ACROSS_OPTIONS})


def _row_to_chunk(row: dict[str, Any]) -> Chunk:
    similarity = row["similarity"]
    return Chunk(
        rank=int(row["rank"]),
        chunk_id=int(row["chunk_id"]),
        document_id=int(row["document_id"]),
        document=row["title"] or row["source"],
        source=row["source"],
        section=row["section"] or "",
        content=row["content"],
        score=float(row["score"]),
        similarity=None if similarity is None else float(similarity),
        vector_rank=row["vector_rank"],
        lexical_rank=row["lexical_rank"],
        graph_rank=row["graph_rank"],
        fused_rank=row["fused_rank"],
        rerank_score=row.get("rerank_score"),
        highlights=tuple((int(a), int(b)) for a, b in row.get("highlights") or ()),
        snippet=row.get("snippet") or "",
        snippet_start=int(row.get("snippet_start") or 0),
        knowledge_base=row.get("knowledge_base"),
    )


def run_search(
    db: Database,
    models: ModelClients,
    request: SearchRequest,
    principal: Principal | None = None,
    cancel: Cancellation | None = None,
) -> SearchResult:
    """Embed the query (and its paraphrases), run kb.search in one session as `principal`,
    rerank the fused pool when asked (then cap and cut in SQL), and type the rows."""
    request = request.with_defaults(db.settings)
    assert request.top is not None  # with_defaults fills it
    embedder = models.embedder
    stages: list[StageReport] = []
    started = time.perf_counter()
    questions = [request.query]
    if request.expand:
        found, report = paraphrases(
            models.chat(), request.query, models.settings.expand_count, models.expansions
        )
        stages.append(report)
        questions += found
    windowed = [within_window(embedder, q) for q in questions]
    if len(windowed) == 1:  # batched with the questions of concurrent searches
        embeddings = [models.embed_query(windowed[0])]
    else:  # the question and its paraphrases in one batch
        embeddings = list(embed_queries(embedder, windowed))
    embedded = time.perf_counter()
    reranker = models.reranker() if request.rerank else None
    notices: list[str] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary:
            notices.append(diag.message_primary)

    with _session(db, principal, cancel) as conn:
        conn.add_notice_handler(on_notice)
        try:
            args = request.arguments()
            vector = checked_embedding(conn, embedder, embeddings[0])
            if vector is not None:
                args["query_embedding"] = vector
                if len(embeddings) > 1:
                    args["extra_embeddings"] = embeddings[1:]
            if reranker is not None:
                args["rerank_pool"] = max(models.settings.rerank_initial_k, request.top)
            statement = queries.call_search_text(_SEARCH_TYPE_ITEMS, tuple(args))
            with conn.cursor(row_factory=dict_row) as cursor:
                rows = cursor.execute(statement, args).fetchall()
            facets = _facets(conn, request, args)
            if reranker is None:
                rows = _highlighted(conn, rows, request)
        finally:
            conn.remove_notice_handler(on_notice)
    model_ms = 0.0
    if reranker is not None:
        # the model call runs outside any transaction: a slow reranker holds no connection
        order, report = rerank_order(
            reranker, request.query, rows, request.top, models.settings.rerank_max_chars
        )
        stages.append(report)
        model_ms = report.ms
        ranked = [{**rows[i], "rerank_score": score} for i, score in order]
        with _session(db, principal, cancel) as conn:
            rows = _highlighted(
                conn, cap_and_cut(conn, ranked, request.top, request.max_per_doc), request
            )
    finished = time.perf_counter()
    expand_ms = sum(s.ms for s in stages if s.stage == "expand")
    timings = Timings(
        embed_ms=(embedded - started) * 1000 - expand_ms,
        sql_ms=(finished - embedded) * 1000 - model_ms,
        total_ms=(finished - started) * 1000,
    )
    _report(timings, stages)
    return SearchResult(
        query=request.query,
        chunks=tuple(_row_to_chunk(row) for row in rows),
        timings=timings,
        notices=tuple(notices),
        stages=tuple(stages),
        facets=facets,
    )


def _facets(
    conn: psycopg.Connection[Any], request: SearchRequest, args: dict[str, Any]
) -> tuple[FacetCount, ...]:
    """kb.facets for the fields the request names (commas split them too), with the filters
    as kb.search's arguments `args` carry them."""
    if not request.facets:
        return ()
    names = [name.strip() for item in request.facets for name in item.split(",") if name.strip()]
    filters = {name: args.get(name) for name in ("groups", "category", "labels", "filter")}
    found = conn.execute(
        queries.FACETS, {"query": request.query, "facets": names, **filters}
    ).fetchall()
    return tuple(FacetCount(str(f), str(v), int(d), int(c)) for f, v, d, c in found)


def _highlighted(
    conn: psycopg.Connection[Any], rows: list[dict[str, Any]], request: SearchRequest
) -> list[dict[str, Any]]:
    """The rows with where the query's words are in each and its snippet (kb.highlight), one
    statement for all of them; as they are when no snippet is asked for."""
    if not rows or not request.snippet:
        return rows
    found = conn.execute(
        queries.HIGHLIGHT,
        {
            "contents": [r["content"] for r in rows],
            "query": request.query,
            "length": request.snippet,
        },
    ).fetchall()
    return [
        {**row, "highlights": marks, "snippet": snippet, "snippet_start": start}
        for row, (marks, snippet, start) in zip(rows, found, strict=True)
    ]


def _report(timings: Timings, stages: list[StageReport]) -> None:
    """Each stage's time and each optional stage's outcome, to kbpg.telemetry."""
    telemetry.report.search_stage("embed", timings.embed_ms / 1000)
    telemetry.report.search_stage("sql", timings.sql_ms / 1000)
    for stage in stages:
        telemetry.report.stage_outcome(stage.stage, stage.status)
        if stage.status != SKIPPED:
            telemetry.report.search_stage(stage.stage, stage.ms / 1000)


def run_search_across(
    db: Database,
    models: ModelClients,
    request: SearchRequest,
    knowledge_bases: Sequence[str],
    principal: Principal | None = None,
    cancel: Cancellation | None = None,
) -> SearchResult:
    """One ranking over several knowledge bases of one embedding space (their arms merged by
    score, fused, capped: kb.search_knowledge_bases), each chunk labelled with its knowledge
    base. The query is embedded with the model of the first, which the others must share; its
    words are marked in the first's language. No graph arm, recency, diversity, convex fusion,
    facets, reranking or expansion: InvalidInput names the one asked for."""
    refused = sorted(
        name
        for name, value in request.options().items()
        if name not in _ACROSS_OPTIONS and _ACROSS_OFF.get(name) != value
    )
    if refused:
        raise InvalidInput(
            f"a search across knowledge bases does not take {', '.join(refused)}",
            hint="search one knowledge base for them, or leave them out",
        )
    names = list(dict.fromkeys(knowledge_bases))
    request = replace(request.with_defaults(db.settings), rerank=False, expand=False)
    assert request.top is not None  # with_defaults fills it
    # the session works in the first: the query vector is checked against its model
    scope = replace(principal or Principal(), knowledge_base=names[0])
    embedder = models.embedder
    started = time.perf_counter()
    embedding = models.embed_query(within_window(embedder, request.query))
    embedded = time.perf_counter()
    with _session(db, scope, cancel) as conn:
        args = {
            name: value for name, value in request.arguments().items() if name in _ACROSS_SQL_NAMES
        }
        args["knowledge_bases"] = names
        vector = checked_embedding(conn, embedder, embedding)
        if vector is not None:
            args["query_embedding"] = vector
        statement = queries.call_search_text(_ACROSS_TYPE_ITEMS, tuple(args), across=True)
        with conn.cursor(row_factory=dict_row) as cursor:
            rows = cursor.execute(statement, args).fetchall()
        rows = _highlighted(conn, rows, request)
    finished = time.perf_counter()
    timings = Timings(
        embed_ms=(embedded - started) * 1000,
        sql_ms=(finished - embedded) * 1000,
        total_ms=(finished - started) * 1000,
    )
    _report(timings, [])
    return SearchResult(
        query=request.query,
        chunks=tuple(_row_to_chunk(row) for row in rows),
        timings=timings,
    )


@contextmanager
def _session(
    db: Database, principal: Principal | None, cancel: Cancellation | None
) -> Iterator[psycopg.Connection[Any]]:
    """db.session(principal), its statements cancellable through `cancel` when given."""
    with db.session(principal) as conn, cancel.watching(conn) if cancel else nullcontext():
        yield conn


def within_window(embedder: Embedder, query: str) -> str:
    """The longest word prefix of the query that fits the model's token window.

    Only the vector arm sees the cut; the lexical arm searches the whole query.
    """
    limit = embedder.max_tokens
    if embedder.count_tokens(query) <= limit:
        return query
    words = query.split()
    low, high = 0, len(words)  # words[:low] fits; find the largest such prefix
    while low < high:
        middle = (low + high + 1) // 2
        if embedder.count_tokens(" ".join(words[:middle])) <= limit:
            low = middle
        else:
            high = middle - 1
    if low > 0:
        return " ".join(words[:low])
    # one giant word (no spaces, e.g. CJK text): cut by characters instead
    low, high = 0, len(words[0])
    while low < high:
        middle = (low + high + 1) // 2
        if embedder.count_tokens(words[0][:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return words[0][:low]


def checked_embedding(
    conn: psycopg.Connection[Any], embedder: Embedder, embedding: FloatArray
) -> FloatArray | None:
    """The query vector, None for a knowledge base without vectors; refuses another model."""
    row = conn.execute(queries.EMBEDDING_SPACE).fetchone()
    if row is None:
        return None
    model, dimension = row
    if model != embedder.model_name or dimension != embedder.dimension:
        raise EmbeddingSpaceMismatch(
            f"this knowledge base holds {model} vectors ({dimension}-d), but queries are "
            f"embedded with {embedder.model_name} ({embedder.dimension}-d)",
            hint=f"leave --embedder and KBPG_EMBEDDER unset (kbpg then uses the recorded model), "
            f"or name it: --embedder {embedder_for_model(model)}; `kbpg reembed --embedder "
            f"{embedder_for_model(embedder.model_name)}` rebuilds the knowledge base with the other",
        )
    return embedding
