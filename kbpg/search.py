"""Search: embed the query, call kb.search, return typed results and the LLM context block."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from kbpg import queries
from kbpg.app import Cancellation, KnowledgeBase, Principal
from kbpg.embedding import embed_queries
from kbpg.errors import EmbeddingSpaceMismatch
from kbpg.request import SearchRequest, sql_types, validate_query
from kbpg.stages import StageReport, cap_and_cut, paraphrases, rerank_order

if TYPE_CHECKING:
    from kbpg.embedding import Embedder, FloatArray

__all__ = [
    "Chunk",
    "Retriever",
    "SearchResult",
    "Source",
    "Timings",
    "build_context",
    "display_sources",
    "run_search",
    "validate_query",
]


@dataclass(frozen=True)
class Chunk:
    """One ranked chunk; the arm ranks are None where that arm did not find it."""

    rank: int
    chunk_id: int
    document_id: int
    document: str
    source: str
    section: str
    content: str
    score: float
    similarity: float | None
    vector_rank: int | None
    lexical_rank: int | None
    graph_rank: int | None
    fused_rank: int | None = None  # the rank after fusion, before the per-document cap
    rerank_score: float | None = None  # the reranker's score, when it ranked this chunk


@dataclass(frozen=True)
class Source:
    """A document cited by the context block, with the numbers of its chunks there."""

    source: str
    document: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Timings:
    embed_ms: float
    sql_ms: float
    total_ms: float


@dataclass(frozen=True)
class SearchResult:
    """The ranked chunks of one query, their sources and the context block built from them."""

    query: str
    chunks: tuple[Chunk, ...]
    timings: Timings
    notices: tuple[str, ...] = ()
    stages: tuple[StageReport, ...] = ()  # what each optional stage asked for did, and why
    sources: tuple[Source, ...] = field(init=False)
    context: str = field(init=False)

    def __post_init__(self) -> None:
        sources = collect_sources(self.chunks)
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "context", build_context(self.chunks, sources))

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self.chunks)

    def for_display(self, root: str | None = None) -> SearchResult:
        """The result with each source as `display_sources` shows it to end users."""
        shown = display_sources([c.source for c in self.chunks], root)
        chunks = tuple(replace(c, source=shown[c.source]) for c in self.chunks)
        return replace(self, chunks=chunks)

    def to_json(self) -> dict[str, Any]:
        """The payload of `kbpg search --json` and of the HTTP API (one shape for both)."""
        return {
            "context": self.context,
            "sources": [asdict(s) for s in self.sources],
            "chunks": [asdict(c) for c in self.chunks],
            "stages": [asdict(s) for s in self.stages],
        }

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per stage that failed (the plain result stands in for it)."""
        return tuple(s.warning for s in self.stages if s.warning)


def display_sources(sources: Sequence[str], root: str | None = None) -> dict[str, str]:
    """How sources are shown where end users read them (HTTP, the search page).

    A source is the document's key: for files, the absolute path ingest resolved. Paths under
    `root` are shown relative to it; other absolute paths by their shortest distinct tail of
    path components (the file name, unless two sources of the result share it); URIs and
    external ids as stored. The server's directory layout never reaches a client.
    """
    prefix = root.rstrip("/") + "/" if root else None
    shown: dict[str, str] = {}
    paths: list[str] = []
    for source in dict.fromkeys(sources):
        if prefix is not None and source.startswith(prefix) and len(source) > len(prefix):
            shown[source] = source[len(prefix) :]
        elif source.startswith("/"):
            paths.append(source)
        else:
            shown[source] = source
    depth = 1
    while paths:
        tails = {p: "/".join(PurePosixPath(p).parts[1:][-depth:]) for p in paths}
        counts = Counter(tails.values())
        for path, tail in tails.items():
            if counts[tail] == 1 or tail == path.lstrip("/"):
                shown[path] = tail
        paths = [p for p in paths if p not in shown]
        depth += 1
    return shown


def collect_sources(chunks: Sequence[Chunk]) -> tuple[Source, ...]:
    """Distinct documents in order of first appearance, each with the ranks citing it."""
    order: dict[str, tuple[str, list[int]]] = {}
    for chunk in chunks:
        order.setdefault(chunk.source, (chunk.document, []))[1].append(chunk.rank)
    return tuple(
        Source(source=source, document=document, ranks=tuple(ranks))
        for source, (document, ranks) in order.items()
    )


def build_context(chunks: Sequence[Chunk], sources: Sequence[Source] | None = None) -> str:
    """The block an LLM prompt takes as is: numbered chunks, then the deduplicated sources.

    The one producer of the context block for the CLI, the Python API and HTTP.
    Empty when there are no chunks.
    """
    if not chunks:
        return ""
    if sources is None:
        sources = collect_sources(chunks)
    parts = []
    for chunk in chunks:
        # A heading path usually starts with the document's own title: say it once.
        if chunk.section.startswith(chunk.document):
            heading = f"[{chunk.rank}] {chunk.section}"
        elif chunk.section:
            heading = f"[{chunk.rank}] {chunk.document} — {chunk.section}"
        else:
            heading = f"[{chunk.rank}] {chunk.document}"
        parts.append(f"{heading}\n{chunk.content.strip()}")
    lines = ["Sources:"]
    for source in sources:
        cited = ", ".join(str(rank) for rank in source.ranks)
        lines.append(f"- {source.document}: {source.source} [{cited}]")
    parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# kb.search's parameters with their SQL types (explicit casts keep function resolution
# independent of how the driver types a Python value). The query vector goes uncast: the
# pgvector dumper sends it with the type's own oid, wherever the extension lives.
_SEARCH_TYPES = {
    **sql_types(),
    "query_embedding": "",
    "extra_embeddings": "",
    "rerank_pool": "integer",
}


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
    )


def run_search(
    kb: KnowledgeBase,
    request: SearchRequest,
    principal: Principal | None = None,
    cancel: Cancellation | None = None,
) -> SearchResult:
    """Embed the query (and its paraphrases), run kb.search in one session as `principal`,
    rerank the fused pool when asked (then cap and cut in SQL), and type the rows."""
    request = request.with_defaults(kb.settings)
    assert request.top is not None  # with_defaults fills it
    embedder = kb.embedder
    stages: list[StageReport] = []
    started = time.perf_counter()
    questions = [request.query]
    if request.expand:
        found, report = paraphrases(
            kb.models.chat(), request.query, kb.settings.models.expand_count, kb.models.expansions
        )
        stages.append(report)
        questions += found
    windowed = [within_window(embedder, q) for q in questions]
    if len(windowed) == 1:
        embeddings = [embedder.embed_query(windowed[0])]
    else:  # the question and its paraphrases in one batch
        embeddings = list(embed_queries(embedder, windowed))
    embedded = time.perf_counter()
    reranker = kb.models.reranker() if request.rerank else None
    notices: list[str] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary:
            notices.append(diag.message_primary)

    with _session(kb, principal, cancel) as conn:
        conn.add_notice_handler(on_notice)
        try:
            args = request.arguments()
            vector = checked_embedding(conn, embedder, embeddings[0])
            if vector is not None:
                args["query_embedding"] = vector
                if len(embeddings) > 1:
                    args["extra_embeddings"] = embeddings[1:]
            if reranker is not None:
                args["rerank_pool"] = max(kb.settings.models.rerank_initial_k, request.top)
            statement = queries.call_search(_SEARCH_TYPES, list(args))
            with conn.cursor(row_factory=dict_row) as cursor:
                rows = cursor.execute(statement, args).fetchall()
        finally:
            conn.remove_notice_handler(on_notice)
    model_ms = 0.0
    if reranker is not None:
        # the model call runs outside any transaction: a slow reranker holds no connection
        order, report = rerank_order(
            reranker, request.query, rows, request.top, kb.settings.models.rerank_max_chars
        )
        stages.append(report)
        model_ms = report.ms
        ranked = [{**rows[i], "rerank_score": score} for i, score in order]
        with _session(kb, principal, cancel) as conn:
            rows = cap_and_cut(conn, ranked, request.top, request.max_per_doc)
    finished = time.perf_counter()
    expand_ms = sum(s.ms for s in stages if s.stage == "expand")
    timings = Timings(
        embed_ms=(embedded - started) * 1000 - expand_ms,
        sql_ms=(finished - embedded) * 1000 - model_ms,
        total_ms=(finished - started) * 1000,
    )
    return SearchResult(
        query=request.query,
        chunks=tuple(_row_to_chunk(row) for row in rows),
        timings=timings,
        notices=tuple(notices),
        stages=tuple(stages),
    )


@contextmanager
def _session(
    kb: KnowledgeBase, principal: Principal | None, cancel: Cancellation | None
) -> Iterator[psycopg.Connection[Any]]:
    """kb.session(principal), its statements cancellable through `cancel` when given."""
    with kb.session(principal) as conn, cancel.watching(conn) if cancel else nullcontext():
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
            hint=f"set KBPG_EMBEDDER to the model the knowledge base was built with "
            f"({model}), or run `kbpg reembed` to rebuild it",
        )
    return embedding


class Retriever(KnowledgeBase):
    """The README's name for the application object (kbpg.app.KnowledgeBase).

    `with Retriever.from_env() as kb: kb.search("...", top=8, groups=[...])`.
    """
