"""Reading the catalogue of a knowledge base: its documents, one document's chunks in order,
and the statistics `kbpg stats` prints."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kbpg.errors import InvalidInput, NotFound
from kbpg.store import db as kdb
from kbpg.store import queries
from kbpg.store.sessions import Database, Principal


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
    db: Database,
    *,
    group: str | None = None,
    principal: Principal | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[DocumentInfo]:
    """The documents (of `group`), ordered by source: `limit` of them (None: all) from the
    `offset`-th on."""
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(
            queries.LIST_DOCUMENTS, {"group": group, "limit": limit, "offset": offset}
        ).fetchall()
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


def source_candidates(source: str) -> list[str]:
    """A source as given and, for a file path, its absolute form (how ingest stores paths)."""
    candidates = [source]
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        candidates.append(str(Path(source).expanduser().resolve()))
    return candidates


def document_chunks(
    db: Database, source: str, *, principal: Principal | None = None
) -> DocumentText:
    """Every chunk of the document `source`, in order; NotFound when there is none (or the
    caller may not read it: the two look the same)."""
    if not isinstance(source, str) or not source or "\x00" in source:
        raise InvalidInput("the source must be non-empty text without NUL characters")
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(
            queries.DOCUMENT_CHUNKS, {"sources": source_candidates(source)}
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


def stats(db: Database, *, principal: Principal | None = None) -> dict[str, Any]:
    """Counts, the embedding space, BM25 statistics and on-disk sizes of every kb table and index."""
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        row = conn.execute(queries.STATS).fetchone()
        assert row is not None
        may_read_keys = conn.execute(queries.MAY_READ_INDEXED_METADATA_KEYS).fetchone()
        keys = (
            [key for (key,) in conn.execute(queries.INDEXED_METADATA_KEY_NAMES).fetchall()]
            if may_read_keys and may_read_keys[0]
            else None
        )
        distributed = conn.execute(queries.DISTRIBUTED).fetchone()
        sizes = conn.execute(
            queries.RELATION_SIZES_DISTRIBUTED
            if distributed and distributed[0]
            else queries.RELATION_SIZES
        ).fetchall()
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
        # None for a role that may not read them (a reader)
        "indexed_metadata_keys": keys,
        "tables": {name: int(total) for name, kind, _, total in sizes if kind == "r"},
        "indexes": {name: int(size) for name, kind, size, _ in sizes if kind == "i"},
    }
