"""A search's result: the ranked chunks, the sources they cite and the LLM context block."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import PurePosixPath
from typing import Any

from kbpg.search.stages import StageReport
from kbpg.text import printable

__all__ = ["Chunk", "SearchResult", "Source", "Timings", "build_context", "display_sources"]


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
    score: float  # the fused RRF score, sum of weight / (rrf_k + arm rank), whatever arms found it
    similarity: float | None  # cosine similarity to the question (None without an embedding)
    vector_rank: int | None
    lexical_rank: int | None
    graph_rank: int | None
    fused_rank: int | None = None  # the rank after fusion, before the per-document cap
    rerank_score: float | None = None  # the reranker's score, when it ranked this chunk
    # where the query's words are in content: [start, end) character offsets (kb.highlight)
    highlights: tuple[tuple[int, int], ...] = ()
    snippet: str = ""  # the window of content holding most of them (empty: none asked for)
    snippet_start: int = 0  # its offset in content
    knowledge_base: str | None = None  # where it comes from, in a search across several


@dataclass(frozen=True)
class Source:
    """A document cited by the context block, with the numbers of its chunks there."""

    source: str
    document: str
    ranks: tuple[int, ...]
    knowledge_base: str | None = None  # its knowledge base, in a search across several


@dataclass(frozen=True)
class FacetCount:
    """How many documents (and chunks) of the search's match set hold a value of a field."""

    facet: str  # category, labels, groups or metadata.KEY
    value: str
    documents: int
    chunks: int


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
    facets: tuple[FacetCount, ...] = ()  # the counts asked for (kb.facets), by field
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
            "sources": [_record(s) for s in self.sources],
            "chunks": [_record(c) for c in self.chunks],
            "stages": [_record(s) for s in self.stages],
            "facets": [_record(f) for f in self.facets],
        }

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per stage that failed (the plain result stands in for it)."""
        return tuple(s.warning for s in self.stages if s.warning)


def _record(item: Chunk | Source | StageReport | FacetCount) -> dict[str, Any]:
    """dataclasses.asdict for these flat records (their fields hold no dataclass), without its
    recursive deep copy: 10x faster, and the HTTP API converts every result."""
    names = _FIELD_NAMES.get(type(item))
    if names is None:
        names = _FIELD_NAMES[type(item)] = tuple(f.name for f in fields(item))
    record = {name: getattr(item, name) for name in names}
    if record.get("knowledge_base", "") is None:  # said in a search across knowledge bases only
        del record["knowledge_base"]
    return record


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


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
    # (a search across knowledge bases: a source of each knowledge base is a document of its own)
    order: dict[tuple[str | None, str], tuple[str, list[int]]] = {}
    for chunk in chunks:
        key = (chunk.knowledge_base, chunk.source)
        order.setdefault(key, (chunk.document, []))[1].append(chunk.rank)
    return tuple(
        Source(source=source, document=document, ranks=tuple(ranks), knowledge_base=kb)
        for (kb, source), (document, ranks) in order.items()
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
        # A heading path usually starts with the document's own title: say it once. Names go
        # on one line (a file name with a newline must not forge a line of the block).
        document, section = printable(chunk.document), printable(chunk.section)
        if section.startswith(document):
            heading = f"[{chunk.rank}] {section}"
        elif section:
            heading = f"[{chunk.rank}] {document} — {section}"
        else:
            heading = f"[{chunk.rank}] {document}"
        parts.append(f"{heading}\n{chunk.content.strip()}")
    lines = ["Sources:"]
    for source in sources:
        cited = ", ".join(str(rank) for rank in source.ranks)
        where = f" ({printable(source.knowledge_base)})" if source.knowledge_base else ""
        lines.append(f"- {printable(source.document)}: {printable(source.source)}{where} [{cited}]")
    parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
