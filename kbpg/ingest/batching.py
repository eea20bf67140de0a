"""Batches of documents prepared ahead of the writer: which changed, their chunks and vectors."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kbpg.errors import EmptyDocument, IngestError, InvalidInput
from kbpg.ingest.contextual import ContextTally, contexts_for_document
from kbpg.ingest.document import Document, LoadFailure, check_filters
from kbpg.ingest.prepare import (
    PreparedDocument,
    chunk_entities,
    content_hash,
    document_vectors,
    prepare_document,
)
from kbpg.models.chat import ChatClient
from kbpg.models.embedders import Embedder
from kbpg.store import queries
from kbpg.store.sessions import Connection, Database, Principal

# One transaction per batch of whole documents; a kill loses at most the batch in flight. A batch
# closes at BATCH_CHARS of text first unless its documents are small (under ~400 characters, e.g.
# JSONL records with their embeddings): 1,024 of those rather than 256 spread a batch's round
# trips and statement-level triggers over 4x the rows (200k embedded records: 4,798-5,236 ->
# 5,870-5,877 chunks/s, load average 2.7-4.7). The CLI's --batch-size default is the same number.
BATCH_DOCUMENTS = 1024
BATCH_CHARS = 400_000


def batch_documents_for(embedder: object) -> int:
    """Documents per transaction for `embedder`: BATCH_DOCUMENTS unless the model asks for
    fewer (a slow one, e5's passages: a batch, and so a progress line, every few seconds)."""
    return int(getattr(embedder, "batch_documents", BATCH_DOCUMENTS))


@dataclass
class PreparedBatch:
    """A batch ready to write, with what happened to its documents on the way. `vectors` holds
    a row per chunk of `whole`; `sliced` documents are embedded as they are written."""

    failures: list[LoadFailure] = field(default_factory=list)
    unchanged: int = 0
    whole: list[PreparedDocument] = field(default_factory=list)
    sliced: list[PreparedDocument] = field(default_factory=list)
    vectors: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    lookup_s: float = 0.0
    prepare_s: float = 0.0
    embed_s: float = 0.0


class BatchPreparer:
    """Cuts the incoming documents into batches and prepares each: its lookup of what is stored
    already runs on `reader`, a connection of its own, so it can run ahead of the writer."""

    def __init__(
        self,
        db: Database,
        reader: Connection,
        principal: Principal | None,
        embedder: Embedder,
        chat: ChatClient | None,
        contexts: ContextTally,
        batch_documents: int = BATCH_DOCUMENTS,
        slice_chunks: int = 1024,
    ) -> None:
        if batch_documents < 1:
            raise InvalidInput("the batch size must be at least 1 document")
        self.db = db
        self.reader = reader
        self.principal = principal
        self.embedder = embedder
        self.chat = chat  # contextual retrieval: the model that situates each chunk
        self.contexts = contexts  # counted here only
        self.batch_documents = batch_documents
        self.slice_chunks = slice_chunks
        self.seen: set[str] = set()

    def batches(self, items: Iterable[Document | LoadFailure]) -> Iterator[PreparedBatch]:
        """What to write, in order; a loader's failure or a duplicate is a batch of its own so
        that it is reported when it happens."""
        batch: list[Document] = []
        chars = 0
        for item in items:
            if isinstance(item, LoadFailure):
                yield PreparedBatch(failures=[item])
                continue
            try:
                check_filters(item, item.where)
            except IngestError as exc:
                message = exc.message.removeprefix(f"{item.where}: ")
                yield PreparedBatch(failures=[LoadFailure(item.where, message)])
                continue
            if item.source in self.seen:
                duplicate = LoadFailure(
                    item.where,
                    f"duplicate source {item.source!r} in this ingest; skipped"
                    if item.origin
                    else "duplicate source in this ingest; skipped",
                )
                yield PreparedBatch(failures=[duplicate])
                continue
            self.seen.add(item.source)
            batch.append(item)
            chars += len(item.text)
            if len(batch) >= self.batch_documents or chars >= BATCH_CHARS:
                yield self.prepare(batch)
                batch, chars = [], 0
        if batch:
            yield self.prepare(batch)

    def prepare(self, documents: list[Document]) -> PreparedBatch:
        """Which documents changed, their chunks, links, contexts and (unless sliced) vectors."""
        t0 = time.perf_counter()
        out = PreparedBatch()
        digests = [content_hash(d) for d in documents]
        with self.db.transaction(self.reader, self.principal, write=True):
            found = self.reader.execute(
                queries.EXISTING_DOCUMENTS, ([d.source for d in documents],)
            ).fetchall()
        existing = {source: (int(doc_id), digest) for source, doc_id, digest in found}
        t1 = time.perf_counter()
        prepared: list[PreparedDocument] = []
        for document, digest in zip(documents, digests, strict=True):
            old = existing.get(document.source)
            if old is not None and old[1] == digest:
                out.unchanged += 1
                continue
            try:
                item = prepare_document(document, digest, self.embedder)
            except IngestError as exc:
                message = exc.message.removeprefix(f"{document.where}: ")
                empty = isinstance(exc, EmptyDocument)
                out.failures.append(LoadFailure(document.where, message, empty=empty))
                continue
            except Exception as exc:  # whatever chunking raises fails this document only
                out.failures.append(LoadFailure(document.where, f"{type(exc).__name__}: {exc}"))
                continue
            if not item.chunks:
                out.failures.append(LoadFailure(document.where, "no text to index", empty=True))
                continue
            item.document_id = old[0] if old is not None else None
            item.is_new = old is None
            prepared.append(item)
        if prepared:
            self._allocate_ids(prepared)
        if self.chat is not None:
            # model calls run outside any transaction: a slow model holds no lock or snapshot
            for item in prepared:
                item.contexts, keys = contexts_for_document(
                    self.chat,
                    item.document.title or item.document.source,
                    [c.content for c in item.chunks],
                    self.contexts,
                )
                item.context_keys = list(keys)
        out.whole = [p for p in prepared if len(p.chunks) <= self.slice_chunks]
        out.sliced = [p for p in prepared if len(p.chunks) > self.slice_chunks]
        for item in out.whole:  # here, not on the writer's thread (sliced: as they are written)
            item.entities = list(chunk_entities(item.chunks))
        t2 = time.perf_counter()
        out.vectors = document_vectors(out.whole, self.embedder)
        out.lookup_s, out.prepare_s, out.embed_s = t1 - t0, t2 - t1, time.perf_counter() - t2
        return out

    def _allocate_ids(self, prepared: list[PreparedDocument]) -> None:
        """Ids for the new documents and for every chunk, from their tables' sequences."""
        new = [p for p in prepared if p.is_new]
        with self.db.transaction(self.reader, self.principal, write=True):
            row = self.reader.execute(
                queries.ALLOCATE_IDS, (len(new), sum(len(p.chunks) for p in prepared))
            ).fetchone()
        assert row is not None
        document_ids, chunk_ids = row
        for item, document_id in zip(new, document_ids, strict=True):
            item.document_id = document_id
        start = 0
        for item in prepared:
            item.chunk_ids = chunk_ids[start : start + len(item.chunks)]
            start += len(item.chunks)
