"""Preparing documents for the writer: content hashes, chunks, links, entities, vectors."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kbpg.errors import IngestError
from kbpg.ingest.chunking import Chunk, chunk_sections
from kbpg.ingest.contextual import with_context
from kbpg.ingest.document import Document
from kbpg.ingest.entities import extract_entities
from kbpg.models.embedders import Embedder

# Bump when chunking or entity extraction changes: every document is then re-ingested.
PIPELINE_VERSION = 1
_HASH_PIECE_CHARS = 1 << 20
# json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str), without building an
# encoder for every document
_PAYLOAD = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)


def content_hash(document: Document) -> str:
    """What makes a document "unchanged": its text, structure, filters and the pipeline version.

    The SHA-256 of a JSON payload; texts over _HASH_PIECE_CHARS are hashed piece by piece
    (the same digest), so a 50 MB text is not held twice more as JSON and as UTF-8 bytes."""
    sections = document.section_list()
    big = {i for i, s in enumerate(sections) if len(s.text) > _HASH_PIECE_CHARS}
    token = uuid.uuid4().hex if big else ""
    payload = {
        "v": PIPELINE_VERSION,
        "title": document.title,
        "category": document.category,
        "groups": sorted(set(document.groups)),
        "labels": sorted(set(document.labels)),
        "metadata": document.metadata,
        "sections": [
            [
                list(s.path),
                f"\x00{token}:{i}\x00" if i in big else s.text,
                [[k.offset, k.target, k.fragment] for k in s.links],
            ]
            for i, s in enumerate(sections)
        ],
    }
    if document.embedding is not None:
        payload["embedding"] = hashlib.sha256(document.embedding.tobytes()).hexdigest()
    encoded = _PAYLOAD.encode(payload)
    if not big:
        return hashlib.sha256(encoded.encode()).hexdigest()
    # each placeholder (JSON-encoded) stands for its section's text, encoded piece by piece:
    # JSON escapes character by character, so the pieces' escapes join into the whole one's
    digest = hashlib.sha256()
    done = 0
    for mark in re.finditer(rf'"\\u0000{token}:(\d+)\\u0000"', encoded):
        digest.update(encoded[done : mark.start()].encode())
        text = sections[int(mark.group(1))].text
        digest.update(b'"')
        for start in range(0, len(text), _HASH_PIECE_CHARS):
            piece = json.encoder.encode_basestring(text[start : start + _HASH_PIECE_CHARS])
            digest.update(piece[1:-1].encode())
        digest.update(b'"')
        done = mark.end()
    digest.update(encoded[done:].encode())
    return digest.hexdigest()


@dataclass
class PreparedDocument:
    """A document cut into chunks, with what its chunks link to, before writing."""

    document: Document
    digest: str
    chunks: list[Chunk]
    # its row's id: the stored document's, or (is_new) one taken for it ahead of the write
    document_id: int | None = None
    is_new: bool = True
    chunk_ids: list[int] = field(default_factory=list)  # by ordinal, taken ahead of the write
    links: list[tuple[int, str, str]] = field(default_factory=list)  # ordinal, target, fragment
    contexts: list[str | None] = field(default_factory=list)  # contextual retrieval, by ordinal
    context_keys: list[str | None] = field(default_factory=list)
    # (ordinal, entity) found ahead of the write (kbpg.batching); None: found as chunks are written
    entities: list[tuple[int, str]] | None = None


def prepare_document(document: Document, digest: str, embedder: Embedder) -> PreparedDocument:
    """Chunk a document (or take its precomputed vector) and find what its chunks link to."""
    sections = document.section_list()
    if document.embedding is None:
        chunks = chunk_sections(sections, embedder)
    else:
        chunks = precomputed_chunk(document, embedder)
    prepared = PreparedDocument(document, digest, chunks)
    by_section: dict[int, list[Chunk]] = {}
    for chunk in chunks:
        by_section.setdefault(chunk.section_index, []).append(chunk)
    seen_links: set[tuple[int, str, str]] = set()
    for index, section in enumerate(sections):
        members = by_section.get(index, [])
        for link in section.links:
            holders = (
                [c for c in members if c.start <= link.offset < c.end]
                or [c for c in members if c.start <= link.offset][-1:]
                or members[:1]
            )
            for chunk in holders:
                key = (chunk.ordinal, link.target, link.fragment)
                if key not in seen_links:
                    seen_links.add(key)
                    prepared.links.append(key)
    return prepared


def chunk_entities(chunks: Sequence[Chunk]) -> Iterator[tuple[int, str]]:
    """(ordinal, entity) for what each chunk mentions; found as the chunks are written, so a
    huge document's entities are never all held at once."""
    for chunk in chunks:
        for entity in sorted(extract_entities(chunk.content)):
            yield chunk.ordinal, entity


def entities_of(item: PreparedDocument, start: int, stop: int) -> Iterable[tuple[int, str]]:
    """(ordinal, entity) for chunks `start:stop` of a document: found ahead, or found now."""
    if item.entities is None:
        return chunk_entities(item.chunks[start:stop])
    return [found for found in item.entities if start <= found[0] < stop]


def precomputed_chunk(document: Document, embedder: Embedder) -> list[Chunk]:
    """A record embedded elsewhere is one chunk: its vector stands for its whole text."""
    assert document.embedding is not None
    if len(document.embedding) != embedder.dimension:
        raise IngestError(
            f"`embedding` has {len(document.embedding)} dimensions; this knowledge base holds "
            f"{embedder.dimension}-d vectors ({embedder.model_name})"
        )
    if not document.text.strip():
        return []
    section = document.title
    return [Chunk(0, section, document.text, "", 0, 0, 0, len(document.text))]


def document_vectors(
    prepared: Sequence[PreparedDocument], embedder: Embedder
) -> np.ndarray[Any, Any]:
    """One row per chunk, in order: precomputed vectors as given, the others embedded now."""
    texts = [
        text
        for p in prepared
        if p.document.embedding is None
        for text in embed_texts(p, embedder, 0, len(p.chunks))
    ]
    if all(p.document.embedding is None for p in prepared):  # no copy of 100k rows to stack
        return embedder.embed_documents(texts)
    embedded = iter(embedder.embed_documents(texts))
    rows = [
        p.document.embedding if p.document.embedding is not None else next(embedded)
        for p in prepared
        for _ in p.chunks
    ]
    return np.stack(rows) if rows else np.zeros((0, embedder.dimension), dtype=np.float32)


def embed_texts(item: PreparedDocument, embedder: Embedder, start: int, stop: int) -> list[str]:
    """What the model sees for chunks `start:stop` of a document: each one's context (when
    contextual retrieval wrote one), heading path and content."""
    contexts = item.contexts
    return [
        with_context(embedder, contexts[i] if contexts else None, item.chunks[i].embed_text)
        for i in range(start, stop)
    ]
