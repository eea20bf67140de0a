"""Search: embed the query, call kb.search, return typed results and the LLM context block."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from kbpg import db as kdb
from kbpg.config import Settings
from kbpg.errors import EmbeddingSpaceMismatch, InvalidInput, KbpgError

if TYPE_CHECKING:
    from kbpg.embedding import Embedder, FloatArray


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

    def to_json(self) -> dict[str, Any]:
        """The payload of `kbpg search --json` and of the HTTP API (one shape for both)."""
        return {
            "context": self.context,
            "sources": [asdict(s) for s in self.sources],
            "chunks": [asdict(c) for c in self.chunks],
        }


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


# kb.search's named parameters that a caller may set, with the SQL type of each (explicit
# casts keep function resolution independent of how the driver types a Python value).
_SEARCH_PARAMS: dict[str, str] = {
    "query_embedding": "public.vector",
    "match_count": "integer",
    "groups": "text[]",
    "category": "text",
    "labels": "text[]",
    "min_similarity": "double precision",
    "use_lexical": "boolean",
    "use_graph": "boolean",
}
_SEARCH_COLUMNS = (
    "rank, chunk_id, document_id, source, title, section, content, score, similarity, "
    "vector_rank, lexical_rank, graph_rank"
)
_SPACE_QUERY = "select model, dimension from kb.embedding_space"


def _search_statement(args: dict[str, Any]) -> sql.Composed:
    named = [
        sql.SQL("{} => {}::{}").format(
            sql.Identifier(name), sql.Placeholder(name), sql.SQL(_SEARCH_PARAMS[name])
        )
        for name in _SEARCH_PARAMS
        if name in args
    ]
    return sql.SQL("select {} from kb.search({})").format(
        sql.SQL(_SEARCH_COLUMNS),
        sql.SQL(", ").join([sql.SQL("%(query_text)s::text"), *named]),
    )


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
    )


def _clean_filter(values: Sequence[str] | None, name: str) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise InvalidInput(f"{name} must be a list of strings, not a string")
    cleaned = [v for v in values if v]
    return cleaned or None


def validate_query(query: str) -> str:
    """The query as given, or InvalidInput when it cannot be searched for."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("the query must not be empty", hint="pass some words to search for")
    if "\x00" in query:
        raise InvalidInput("the query contains a NUL character")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: undecodable argv bytes, or JSON "\ud800"
        raise InvalidInput(
            "the query is not valid UTF-8 text", hint="check the terminal's encoding (LANG)"
        ) from None
    return query


class Retriever:
    """Embeds queries once per process and runs kb.search over pooled connections.

    `pool_size=1` keeps one connection (a one-shot CLI); larger sizes open a pool shared by
    threads. Thread-safe; use as a context manager or call close().
    """

    def __init__(
        self,
        url: str,
        embedder: Embedder,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.embedder = embedder
        self.url = url
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._pool: ConnectionPool | None = None
        # Fails fast when the database is down (a pool would keep retrying until its timeout).
        probe = kdb.connect(url, autocommit=True)
        if pool_size <= 1:
            self._conn = probe
        else:
            probe.close()
            self._pool = kdb.create_pool(url, min_size=1, max_size=pool_size)

    @classmethod
    def from_env(
        cls, settings: Settings | None = None, *, embedder: str | None = None, pool_size: int = 4
    ) -> Retriever:
        """A retriever on KBPG_DATABASE_URL (or the embedded server) with KBPG_EMBEDDER."""
        from kbpg.embedding import get_embedder

        settings = settings or Settings.from_env()
        url = kdb.resolve_url(settings)
        retriever = cls(
            url, get_embedder(settings, embedder), settings=settings, pool_size=pool_size
        )
        load = getattr(retriever.embedder, "load", None)
        if callable(load):  # load now, so that search timings do not include it
            load()
        return retriever

    # -- connections ---------------------------------------------------------------------

    @contextmanager
    def connection(self, timeout: float = 10.0) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one unit of work; errors come out as KbpgError."""
        with kdb.translate_errors():
            if self._pool is not None:
                with self._pool.connection(timeout=timeout) as conn:
                    yield conn
                return
            with self._lock:
                if self._conn is None or self._conn.closed:
                    self._conn = kdb.connect(self.url, autocommit=True)
                yield self._conn

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> Retriever:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- search --------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        top: int | None = None,
        groups: Sequence[str] | None = None,
        category: str | None = None,
        labels: Sequence[str] | None = None,
        min_similarity: float | None = None,
        graph: bool = False,
        lexical: bool | None = None,
    ) -> SearchResult:
        """The `top` best chunks for `query` (default KBPG_DEFAULT_MAX_CHUNKS), ranked by SQL."""
        validate_query(query)
        top = self.settings.default_max_chunks if top is None else top
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InvalidInput(f"top must be a positive integer, not {top!r}")
        started = time.perf_counter()
        embedding = self.embedder.embed_query(self._within_window(query))
        embedded = time.perf_counter()
        args: dict[str, Any] = {
            "query_text": query,
            "match_count": top,
            "groups": _clean_filter(groups, "groups"),
            "category": category or None,
            "labels": _clean_filter(labels, "labels"),
            "min_similarity": min_similarity,
            "use_lexical": self.settings.lexical_enabled if lexical is None else lexical,
            "use_graph": graph,
        }
        notices: list[str] = []

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            if diag.message_primary:
                notices.append(diag.message_primary)

        with self.connection() as conn:
            conn.add_notice_handler(on_notice)
            try:
                args["query_embedding"] = self._checked_embedding(conn, embedding)
                args = {k: v for k, v in args.items() if v is not None}
                with conn.cursor(row_factory=dict_row) as cursor:
                    rows = cursor.execute(_search_statement(args), args).fetchall()
            finally:
                conn.remove_notice_handler(on_notice)
        finished = time.perf_counter()
        timings = Timings(
            embed_ms=(embedded - started) * 1000,
            sql_ms=(finished - embedded) * 1000,
            total_ms=(finished - started) * 1000,
        )
        return SearchResult(
            query=query,
            chunks=tuple(_row_to_chunk(row) for row in rows),
            timings=timings,
            notices=tuple(notices),
        )

    def _within_window(self, query: str) -> str:
        """The longest word prefix of the query that fits the model's token window.

        Only the vector arm sees the cut; the lexical arm searches the whole query.
        """
        limit = self.embedder.max_tokens
        if self.embedder.count_tokens(query) <= limit:
            return query
        words = query.split()
        low, high = 0, len(words)  # words[:low] fits; find the largest such prefix
        while low < high:
            middle = (low + high + 1) // 2
            if self.embedder.count_tokens(" ".join(words[:middle])) <= limit:
                low = middle
            else:
                high = middle - 1
        if low > 0:
            return " ".join(words[:low])
        # one giant word (no spaces, e.g. CJK text): cut by characters instead
        low, high = 0, len(words[0])
        while low < high:
            middle = (low + high + 1) // 2
            if self.embedder.count_tokens(words[0][:middle]) <= limit:
                low = middle
            else:
                high = middle - 1
        return words[0][:low]

    def _checked_embedding(
        self, conn: psycopg.Connection[Any], embedding: FloatArray
    ) -> FloatArray | None:
        """The query vector, None for a knowledge base without vectors; refuses another model."""
        row = conn.execute(_SPACE_QUERY).fetchone()
        if row is None:
            return None
        model, dimension = row
        if model != self.embedder.model_name or dimension != self.embedder.dimension:
            raise EmbeddingSpaceMismatch(
                f"this knowledge base holds {model} vectors ({dimension}-d), but queries are "
                f"embedded with {self.embedder.model_name} ({self.embedder.dimension}-d)",
                hint=f"set KBPG_EMBEDDER to the model the knowledge base was built with "
                f"({model}), or run `kbpg reembed` to rebuild it",
            )
        return embedding

    def warm_up(self) -> None:
        """Run the model once so that the first real query does not pay for lazy set-up."""
        self.embedder.embed_query("warm up")

    # -- health --------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Database reachable, schema at head, model loaded — what /healthz reports."""
        report: dict[str, Any] = {
            "database": "ok",
            "schema": "ok",
            "model": self.embedder.model_name,
        }
        try:
            with self.connection(timeout=3.0) as conn:
                status = kdb.schema_status(conn)
            if not status.at_head:
                report["schema"] = f"at {status.current or 'none'}, head is {status.head}"
        except KbpgError as exc:
            report["database"] = exc.message
            report["schema"] = "unknown"
        report["ok"] = report["database"] == "ok" and report["schema"] == "ok"
        return report
