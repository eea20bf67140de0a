"""Maintenance of a knowledge base: list, delete, statistics, re-embedding."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kbpg import db as kdb
from kbpg import queries
from kbpg.app import KnowledgeBase, Principal
from kbpg.chunking import SECTION_SEPARATOR, embed_text, heading_prefix
from kbpg.contextual import with_context
from kbpg.embedding import Embedder
from kbpg.entities import refresh_edges
from kbpg.errors import InvalidInput, NotFound
from kbpg.ingest import IngestProgress, IngestSummary, ProgressCallback
from kbpg.writer import writer


@dataclass(frozen=True)
class DocumentInfo:
    source: str
    title: str
    category: str | None
    groups: list[str]
    labels: list[str]
    chunks: int
    updated_at: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_documents(
    kb: KnowledgeBase, *, group: str | None = None, principal: Principal | None = None
) -> list[DocumentInfo]:
    """The documents (of `group`), ordered by source."""
    with kb.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(queries.LIST_DOCUMENTS, {"group": group}).fetchall()
    return [
        DocumentInfo(
            source=r[0],
            title=r[1],
            category=r[2],
            groups=list(r[3]),
            labels=list(r[4]),
            chunks=int(r[5]),
            updated_at=r[6].isoformat(timespec="seconds"),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class DocumentChunk:
    ordinal: int
    section: str
    content: str


@dataclass(frozen=True)
class DocumentText:
    """One document with its chunks in reading order."""

    source: str
    title: str
    category: str | None
    groups: list[str]
    labels: list[str]
    chunks: tuple[DocumentChunk, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the chunks as a list of objects."""
        return asdict(self)


def _source_candidates(source: str) -> list[str]:
    """A source as given and, for a file path, its absolute form (how ingest stores paths)."""
    candidates = [source]
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        candidates.append(str(Path(source).expanduser().resolve()))
    return candidates


def document_chunks(
    kb: KnowledgeBase, source: str, *, principal: Principal | None = None
) -> DocumentText:
    """Every chunk of the document `source`, in order; NotFound when there is none (or the
    caller may not read it: the two look the same)."""
    if not isinstance(source, str) or not source or "\x00" in source:
        raise InvalidInput("the source must be non-empty text without NUL characters")
    with kb.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(
            queries.DOCUMENT_CHUNKS, {"sources": _source_candidates(source), "source": source}
        ).fetchall()
    if not rows:
        raise NotFound(
            f"no such document: {source}",
            hint="list_documents / `kbpg documents list` shows the sources",
        )
    first = rows[0]
    return DocumentText(
        source=first[0],
        title=first[1],
        category=first[2],
        groups=list(first[3]),
        labels=list(first[4]),
        chunks=tuple(DocumentChunk(int(r[5]), r[6] or "", r[7]) for r in rows),
    )


def delete_documents(
    kb: KnowledgeBase, sources: Sequence[str], *, principal: Principal | None = None
) -> tuple[list[str], list[str]]:
    """Delete documents by source (a path also matches its absolute form); (deleted, missing).

    One transaction: the documents, their chunks and edges, and the derived edges and
    lexical cache change together.
    """
    deleted: list[str] = []
    missing: list[str] = []
    with writer(kb, principal) as conn, kb.transaction(conn, principal, write=True):
        for source in sources:
            row = conn.execute(
                queries.DELETE_DOCUMENT_BY_SOURCE, (_source_candidates(source),)
            ).fetchone()
            (deleted if row else missing).append(row[0] if row else source)
        if deleted:
            refresh_edges(conn)
            conn.execute(queries.REFRESH_LEXICAL_INDEX)
    return deleted, missing


def stats(kb: KnowledgeBase, *, principal: Principal | None = None) -> dict[str, Any]:
    """Counts, the embedding space, BM25 statistics and on-disk sizes of every kb table and index."""
    with kb.session(principal) as conn:
        kdb.require_schema(conn)
        row = conn.execute(queries.STATS).fetchone()
        assert row is not None
        sizes = conn.execute(queries.RELATION_SIZES).fetchall()
    docs, chunks, unembedded, edges, model, dim, layout, indexed, chunk_count, tokens, lexemes = (
        row[:11]
    )
    return {
        "language": str(row[11]),
        "documents": int(docs),
        "chunks": int(chunks),
        "chunks_without_embedding": int(unembedded),
        "edges": {str(k): int(v) for k, v in sorted(edges.items())},
        "embedding_space": (
            {"model": model, "dimension": dim, "layout": layout, "indexed": indexed}
            if model
            else None
        ),
        "bm25": {
            "chunks": int(chunk_count),
            "average_length": round(tokens / chunk_count, 2) if chunk_count else 0.0,
            "lexemes": int(lexemes),
        },
        "tables": {name: int(total) for name, kind, _, total in sizes if kind == "r"},
        "indexes": {name: int(size) for name, kind, size, _ in sizes if kind == "i"},
    }


# -- re-embedding -----------------------------------------------------------------------------

REEMBED_BATCH = 1024


def reembed(
    kb: KnowledgeBase,
    embedder: Embedder,
    *,
    principal: Principal | None = None,
    progress: ProgressCallback | None = None,
) -> IngestSummary:
    """Switch the knowledge base to `embedder`'s space and rebuild every vector, in one
    transaction: an interrupted re-embed leaves the old vectors and space in place."""
    summary = IngestSummary()
    started = time.perf_counter()
    prefixes: dict[str, str] = {}
    with writer(kb, principal) as conn, kb.transaction(conn, principal, write=True):
        conn.execute(queries.RESET_EMBEDDING_SPACE, (embedder.model_name, embedder.dimension))
        conn.execute(queries.REEMBED_TABLE)
        with conn.cursor(name="kbpg_reembed_read") as read:
            read.itersize = REEMBED_BATCH
            read.execute(queries.REEMBED_READ)
            while rows := read.fetchmany(REEMBED_BATCH):
                texts = []
                for _, section, content, context in rows:
                    if section not in prefixes:
                        path = tuple(section.split(SECTION_SEPARATOR)) if section else ()
                        prefixes[section] = heading_prefix(path, embedder)
                    texts.append(
                        with_context(embedder, context, embed_text(prefixes[section], content))
                    )
                t0 = time.perf_counter()
                vectors = embedder.embed_documents(texts)
                t1 = time.perf_counter()
                with conn.cursor() as cur, cur.copy(queries.REEMBED_COPY) as copy:
                    copy.set_types(["int8", "vector"])
                    for (chunk_id, *_), vector in zip(rows, vectors, strict=True):
                        copy.write_row((chunk_id, vector))
                summary.embed_s += t1 - t0
                summary.database_s += time.perf_counter() - t1
                summary.chunks += len(rows)
                if progress is not None:
                    progress(IngestProgress(0, summary.chunks, time.perf_counter() - started))
        t0 = time.perf_counter()
        conn.execute(queries.REEMBED_APPLY)
        summary.database_s += time.perf_counter() - t0
    summary.total_s = time.perf_counter() - started
    return summary
