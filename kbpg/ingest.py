"""Ingest: documents -> chunks -> vectors -> COPY into kb.*, idempotent, atomic per batch of documents."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from kbpg import db as kdb
from kbpg.chunking import SECTION_SEPARATOR, Chunk, chunk_sections, embed_text, heading_prefix
from kbpg.embedding import Embedder
from kbpg.errors import IngestError, InvalidInput
from kbpg.loaders import Document, LoadFailure
from kbpg.sources import iter_documents

__all__ = [
    "Document",
    "IngestProgress",
    "IngestSummary",
    "LoadFailure",
    "delete_documents",
    "ingest_documents",
    "ingest_paths",
    "list_documents",
    "reembed",
    "refresh_edges",
    "stats",
]

# Bump when chunking or entity extraction changes: every document is then re-ingested.
PIPELINE_VERSION = 1
# One transaction per batch of whole documents; a kill loses at most the batch in flight.
BATCH_DOCUMENTS = 256
BATCH_CHARS = 400_000
# Edge weights in [0, 1]: an explicit link is the author's own pointer; reading order is
# a weaker relation; an entity edge is stronger the fewer documents share the entity.
WEIGHT_LINK = 0.9
WEIGHT_NEXT = 0.8
MAX_ENTITY_DOCUMENTS = 5
# Serialises kbpg writers (ingest, delete, reembed) on one database.
_WRITE_LOCK_KEY = 0x6B627067  # "kbpg"


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestProgress:
    documents: int
    chunks: int
    elapsed_s: float
    failures: tuple[LoadFailure, ...] = ()

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class IngestSummary:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    chunks: int = 0
    edges: int = 0
    failures: list[LoadFailure] = field(default_factory=list)
    prepare_s: float = 0.0
    embed_s: float = 0.0
    database_s: float = 0.0
    total_s: float = 0.0

    @property
    def documents(self) -> int:
        return self.added + self.updated + self.unchanged

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed)

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "failed": self.failed,
            "chunks": self.chunks,
            "edges": self.edges,
            "seconds": {
                "total": round(self.total_s, 3),
                "prepare": round(self.prepare_s, 3),
                "embedding": round(self.embed_s, 3),
                "database": round(self.database_s, 3),
            },
            "failures": [{"where": f.where, "reason": f.reason} for f in self.failures],
        }


ProgressCallback = Callable[[IngestProgress], None]


# -- entities ---------------------------------------------------------------------------------

_CODE = re.compile(r"(?<![\w-])[A-Za-z0-9]+(?:[-/][A-Za-z0-9]+)*(?![\w-])")
_ACRONYM = re.compile(r"\b[A-Z]{3,}\b")
_NAME = re.compile(
    r"\b[A-Z][a-zA-Z'\u2019]+(?:(?:\s+(?:of|the|and|for|de|van|von|du|la))*\s+[A-Z][a-zA-Z'\u2019]+)+\b"
)
_NAME_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "as",
        "at",
        "but",
        "by",
        "for",
        "from",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "of",
        "on",
        "or",
        "our",
        "so",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "this",
        "those",
        "to",
        "we",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "with",
        "you",
        "your",
        "please",
        "note",
        "see",
        "all",
        "any",
        "each",
        "every",
        "no",
        "not",
        "yes",
    ]
)


def extract_entities(text: str) -> set[str]:
    """Identifiers and codes (PRK-204, ISO 9001 parts), acronyms and capitalised multi-word names.

    Whether an entity links chunks is decided later by how few documents mention it.
    """
    found: set[str] = set()
    for match in _CODE.finditer(text):
        token = match.group()
        if len(token) >= 3 and any(c.isdigit() for c in token) and any(c.isupper() for c in token):
            found.add(token.upper())
    for match in _ACRONYM.finditer(text):
        found.add(match.group())
    for match in _NAME.finditer(text):
        words = match.group().split()
        # sentence-initial "The", "When", ... are not part of a name; "IT" in "IT Service" is
        while words and words[0].lower() in _NAME_STOP and not words[0].isupper():
            words.pop(0)
        while words and words[-1].lower() in _NAME_STOP and not words[-1].isupper():
            words.pop()
        if len(words) >= 2:
            found.add(" ".join(words).lower())
    return found


# -- preparing documents ----------------------------------------------------------------------


def content_hash(document: Document) -> str:
    """What makes a document "unchanged": its text, structure, filters and the pipeline version."""
    payload = {
        "v": PIPELINE_VERSION,
        "title": document.title,
        "category": document.category,
        "groups": sorted(set(document.groups)),
        "labels": sorted(set(document.labels)),
        "metadata": document.metadata,
        "sections": [
            [list(s.path), s.text, [[k.offset, k.target, k.fragment] for k in s.links]]
            for s in document.section_list()
        ],
    }
    encoded = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()


@dataclass
class _Prepared:
    document: Document
    digest: str
    chunks: list[Chunk]
    existing_id: int | None = None
    is_new: bool = True
    links: list[tuple[int, str, str]] = field(default_factory=list)  # ordinal, target, fragment
    entities: list[tuple[int, str]] = field(default_factory=list)  # ordinal, entity


def _prepare(document: Document, digest: str, embedder: Embedder) -> _Prepared:
    sections = document.section_list()
    chunks = chunk_sections(sections, embedder)
    prepared = _Prepared(document, digest, chunks)
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
    for chunk in chunks:
        prepared.entities.extend(
            (chunk.ordinal, e) for e in sorted(extract_entities(chunk.content))
        )
    return prepared


# -- SQL --------------------------------------------------------------------------------------

_EXISTING = "select source, id, content_hash from kb.documents where source = any(%s)"
_UPDATE_DOCUMENT = """
update kb.documents
   set title = %s, category = %s, groups = %s, labels = %s, metadata = %s,
       content_hash = %s, updated_at = now()
 where id = %s
"""
_COPY_DOCUMENTS = (
    "copy kb.documents (source, title, category, groups, labels, metadata, content_hash) from stdin"
)
_COPY_CHUNKS = (
    "copy kb.chunks (document_id, ordinal, section, content, groups, category, labels, embedding)"
    " from stdin (format binary)"
)
_CHUNK_TYPES = ["int8", "int4", "text", "text", "text[]", "text", "text[]", "vector"]
_CHUNK_IDS = "select document_id, ordinal, id from kb.chunks where document_id = any(%s)"

# Link and entity edges, derived from kb.chunk_links / kb.chunk_entities over the whole
# knowledge base and applied as a difference: a run that changes nothing writes nothing.
_REFRESH_EDGES = """
with link_edges as (
    select l.chunk_id as src,
           coalesce(
               (select c.id from kb.chunks c
                 where c.document_id = d.id and l.fragment <> ''
                   and trim(both '-' from regexp_replace(lower(
                         regexp_replace(c.section, '^.* > ', '')), '[^a-z0-9]+', '-', 'g'))
                       = lower(l.fragment)
                 order by c.ordinal limit 1),
               (select c.id from kb.chunks c where c.document_id = d.id
                 order by c.ordinal limit 1)) as dst,
           'link'::text as relation,
           %(link_weight)s::real as weight
      from kb.chunk_links l
      join kb.documents d on d.source = l.target_source
), first_mention as (
    select distinct on (e.entity, c.document_id) e.entity, c.document_id, c.id
      from kb.chunk_entities e join kb.chunks c on c.id = e.chunk_id
     order by e.entity, c.document_id, c.ordinal
), rare as (
    select entity, document_id, id, count(*) over (partition by entity) as df
      from first_mention
), entity_edges as (
    select least(a.id, b.id) as src, greatest(a.id, b.id) as dst, 'entity'::text as relation,
           max(2.0 / a.df)::real as weight
      from rare a join rare b on a.entity = b.entity and a.document_id < b.document_id
     where a.df between 2 and %(max_docs)s
     group by 1, 2
), desired as (
    select src, dst, relation, max(weight) as weight
      from (select * from link_edges union all select * from entity_edges) x
     where dst is not null and src <> dst
     group by src, dst, relation
), removed as (
    delete from kb.edges e
     where e.relation in ('link', 'entity')
       and not exists (select 1 from desired d where d.src = e.src_chunk_id
                          and d.dst = e.dst_chunk_id and d.relation = e.relation)
    returning 1
), reweighted as (
    update kb.edges e set weight = d.weight
      from desired d
     where d.src = e.src_chunk_id and d.dst = e.dst_chunk_id and d.relation = e.relation
       and e.weight <> d.weight
    returning 1
), added as (
    insert into kb.edges (src_chunk_id, dst_chunk_id, relation, weight)
    select d.src, d.dst, d.relation, d.weight from desired d
     where not exists (select 1 from kb.edges e where e.src_chunk_id = d.src
                          and e.dst_chunk_id = d.dst and e.relation = d.relation)
    returning 1
)
select (select count(*) from added), (select count(*) from removed),
       (select count(*) from reweighted)
"""


@contextlib.contextmanager
def _writer(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection holding kbpg's write lock (released when the session ends, even on kill)."""
    with kdb.translate_errors(), kdb.connect(url, autocommit=True) as conn:
        kdb.require_schema(conn)
        conn.execute("select pg_catalog.pg_advisory_lock(%s)", (_WRITE_LOCK_KEY,))
        yield conn


def _refresh_lexical_index(conn: psycopg.Connection[Any]) -> None:
    """Keep the lexical arm's impact cache fresh (speed only: the arm is exact either way)."""
    with conn.transaction():
        conn.execute("select * from kb.refresh_lexical_index()")


def refresh_edges(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Bring link and entity edges in line with the knowledge base; returns (added, removed)."""
    with conn.transaction():
        row = conn.execute(
            _REFRESH_EDGES, {"link_weight": WEIGHT_LINK, "max_docs": MAX_ENTITY_DOCUMENTS}
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _register_space(conn: psycopg.Connection[Any], embedder: Embedder) -> None:
    """Record (or check) the embedding space; a different model is refused with a hint."""
    with conn.transaction():
        conn.execute(
            "select kb.set_embedding_space(model_name => %s, vector_dimension => %s)",
            (embedder.model_name, embedder.dimension),
        )


# -- writing ----------------------------------------------------------------------------------


class _Run:
    """One ingest run: batches documents, embeds them together, writes each batch atomically."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        embedder: Embedder,
        progress: ProgressCallback | None,
        batch_documents: int = BATCH_DOCUMENTS,
    ) -> None:
        if batch_documents < 1:
            raise InvalidInput("the batch size must be at least 1 document")
        self.batch_documents = batch_documents
        self.conn = conn
        self.embedder = embedder
        self.progress = progress
        self.summary = IngestSummary()
        self.seen: set[str] = set()
        self.started = time.perf_counter()
        self._pending_failures: list[LoadFailure] = []

    def fail(self, failure: LoadFailure) -> None:
        self.summary.failed += 1
        self.summary.failures.append(failure)
        self._pending_failures.append(failure)

    def report(self) -> None:
        if self.progress is not None:
            self.progress(
                IngestProgress(
                    documents=self.summary.documents,
                    chunks=self.summary.chunks,
                    elapsed_s=time.perf_counter() - self.started,
                    failures=tuple(self._pending_failures),
                )
            )
        self._pending_failures = []

    def run(self, items: Iterable[Document | LoadFailure]) -> None:
        batch: list[Document] = []
        chars = 0
        for item in items:
            if isinstance(item, LoadFailure):
                self.fail(item)
                self.report()
                continue
            if item.source in self.seen:
                self.fail(LoadFailure(item.source, "duplicate source in this ingest; skipped"))
                continue
            self.seen.add(item.source)
            batch.append(item)
            chars += len(item.text)
            if len(batch) >= self.batch_documents or chars >= BATCH_CHARS:
                self.write_batch(batch)
                batch, chars = [], 0
        if batch:
            self.write_batch(batch)

    def write_batch(self, documents: list[Document]) -> None:
        t0 = time.perf_counter()
        digests = [content_hash(d) for d in documents]
        existing = {
            source: (int(doc_id), digest)
            for source, doc_id, digest in self.conn.execute(
                _EXISTING, ([d.source for d in documents],)
            ).fetchall()
        }
        t1 = time.perf_counter()
        prepared: list[_Prepared] = []
        for document, digest in zip(documents, digests, strict=True):
            old = existing.get(document.source)
            if old is not None and old[1] == digest:
                self.summary.unchanged += 1
                continue
            try:
                item = _prepare(document, digest, self.embedder)
            except IngestError as exc:
                self.fail(LoadFailure(document.source, exc.message))
                continue
            if not item.chunks:
                self.fail(LoadFailure(document.source, "no text to index"))
                continue
            item.existing_id = old[0] if old is not None else None
            item.is_new = old is None
            prepared.append(item)
        t2 = time.perf_counter()
        vectors = self.embedder.embed_documents(
            [c.embed_text for item in prepared for c in item.chunks]
        )
        t3 = time.perf_counter()
        if prepared:
            with kdb.translate_errors(), self.conn.transaction():
                self._write(prepared, vectors)
        t4 = time.perf_counter()
        self.summary.prepare_s += t2 - t1
        self.summary.embed_s += t3 - t2
        self.summary.database_s += (t1 - t0) + (t4 - t3)
        for item in prepared:
            if item.is_new:
                self.summary.added += 1
            else:
                self.summary.updated += 1
            self.summary.chunks += len(item.chunks)
        self.report()

    def _write(self, prepared: list[_Prepared], vectors: np.ndarray[Any, Any]) -> None:
        conn = self.conn
        updated = [p for p in prepared if not p.is_new]
        new = [p for p in prepared if p.is_new]
        if updated:
            # cascades to the chunks' edges, links and entities
            conn.execute(
                "delete from kb.chunks where document_id = any(%s)",
                ([p.existing_id for p in updated],),
            )
            with conn.cursor() as cur:
                cur.executemany(
                    _UPDATE_DOCUMENT,
                    [
                        (
                            p.document.title,
                            p.document.category,
                            list(p.document.groups),
                            list(p.document.labels),
                            Jsonb(dict(p.document.metadata)),
                            p.digest,
                            p.existing_id,
                        )
                        for p in updated
                    ],
                )
        if new:
            with conn.cursor() as cur, cur.copy(_COPY_DOCUMENTS) as copy:
                for p in new:
                    d = p.document
                    copy.write_row(
                        (
                            d.source,
                            d.title,
                            d.category,
                            list(d.groups),
                            list(d.labels),
                            Jsonb(dict(d.metadata)),
                            p.digest,
                        )
                    )
            ids = dict(
                conn.execute(
                    "select source, id from kb.documents where source = any(%s)",
                    ([p.document.source for p in new],),
                ).fetchall()
            )
            for p in new:
                p.existing_id = int(ids[p.document.source])
        row = 0
        with conn.cursor() as cur, cur.copy(_COPY_CHUNKS) as copy:
            copy.set_types(_CHUNK_TYPES)
            for p in prepared:
                d = p.document
                groups, labels = sorted(set(d.groups)), sorted(set(d.labels))
                for chunk in p.chunks:
                    copy.write_row(
                        (
                            p.existing_id,
                            chunk.ordinal,
                            chunk.section,
                            chunk.content,
                            groups,
                            d.category,
                            labels,
                            vectors[row],
                        )
                    )
                    row += 1
        by_key: dict[tuple[int, int], int] = {
            (int(doc), int(ordinal)): int(cid)
            for doc, ordinal, cid in conn.execute(
                _CHUNK_IDS, ([p.existing_id for p in prepared],)
            ).fetchall()
        }
        # chunk ids of each prepared document, indexed by ordinal
        per_doc = [[by_key[p.existing_id or 0, c.ordinal] for c in p.chunks] for p in prepared]
        with conn.cursor() as cur:
            with cur.copy(
                "copy kb.edges (src_chunk_id, dst_chunk_id, relation, weight) from stdin"
            ) as copy:
                for chunk_ids in per_doc:
                    for src, dst in itertools.pairwise(chunk_ids):
                        copy.write_row((src, dst, "next", WEIGHT_NEXT))
                        self.summary.edges += 1
            with cur.copy(
                "copy kb.chunk_links (chunk_id, target_source, fragment) from stdin"
            ) as copy:
                for p, chunk_ids in zip(prepared, per_doc, strict=True):
                    for ordinal, target, fragment in p.links:
                        copy.write_row((chunk_ids[ordinal], target, fragment))
            with cur.copy("copy kb.chunk_entities (entity, chunk_id) from stdin") as copy:
                for p, chunk_ids in zip(prepared, per_doc, strict=True):
                    for ordinal, entity in p.entities:
                        copy.write_row((entity, chunk_ids[ordinal]))

    def delete(self, document_ids: Sequence[int]) -> int:
        if not document_ids:
            return 0
        with kdb.translate_errors(), self.conn.transaction():
            cur = self.conn.execute(
                "delete from kb.documents where id = any(%s)", (list(document_ids),)
            )
            removed = cur.rowcount
        self.summary.removed += removed
        return removed

    def finish(self) -> IngestSummary:
        """Derived edges and the lexical cache, then the totals."""
        t0 = time.perf_counter()
        with kdb.translate_errors():
            added, _ = refresh_edges(self.conn)
            if self.summary.changed:
                _refresh_lexical_index(self.conn)
        self.summary.edges += added
        self.summary.database_s += time.perf_counter() - t0
        self.summary.total_s = time.perf_counter() - self.started
        self.report()
        return self.summary


def ingest_documents(
    url: str,
    documents: Iterable[Document | LoadFailure],
    embedder: Embedder,
    *,
    prune: bool = False,
    progress: ProgressCallback | None = None,
    batch_documents: int = BATCH_DOCUMENTS,
) -> IngestSummary:
    """Ingest documents keyed by source: new ones added, changed ones replaced, unchanged skipped.

    Documents are embedded in batches across documents and written with COPY, one transaction
    per batch of whole documents. With `prune`, documents not in `documents` are removed (the
    knowledge base becomes exactly this collection).
    """
    with _writer(url) as conn:
        _register_space(conn, embedder)
        run = _Run(conn, embedder, progress, batch_documents)
        run.run(documents)
        if prune:
            gone = [
                int(doc_id)
                for doc_id, source in conn.execute("select id, source from kb.documents")
                if source not in run.seen
            ]
            run.delete(gone)
        return run.finish()


def ingest_paths(
    url: str,
    paths: Sequence[str | os.PathLike[str]],
    embedder: Embedder,
    *,
    recursive: bool = False,
    glob: str | None = None,
    groups: Sequence[str] = (),
    category: str | None = None,
    labels: Sequence[str] = (),
    prune: bool = False,
    progress: ProgressCallback | None = None,
    batch_documents: int = BATCH_DOCUMENTS,
) -> IngestSummary:
    """Ingest files and directories. With `prune`, documents whose files under these paths are
    gone are removed (JSONL records are keyed by their ids and never pruned by path)."""
    roots = [Path(p).expanduser() for p in paths]
    if not roots:
        raise InvalidInput("nothing to ingest", hint="give files or directories")

    with _writer(url) as conn:
        _register_space(conn, embedder)
        run = _Run(conn, embedder, progress, batch_documents)
        run.run(
            iter_documents(
                roots,
                recursive=recursive,
                glob=glob,
                groups=groups,
                category=category,
                labels=labels,
            )
        )
        if prune:
            scopes = [str(r.resolve()) for r in roots if r.exists()]
            gone = []
            for doc_id, source in conn.execute("select id, source from kb.documents"):
                inside = any(source == s or source.startswith(s.rstrip("/") + "/") for s in scopes)
                if inside and source not in run.seen and not Path(source).exists():
                    gone.append(int(doc_id))
            run.delete(gone)
        return run.finish()


# -- maintenance ------------------------------------------------------------------------------


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
        return {
            "source": self.source,
            "title": self.title,
            "category": self.category,
            "groups": self.groups,
            "labels": self.labels,
            "chunks": self.chunks,
            "updated_at": self.updated_at,
        }


_LIST_DOCUMENTS = """
select d.source, d.title, d.category, d.groups, d.labels,
       (select count(*) from kb.chunks c where c.document_id = d.id) as chunks,
       d.updated_at
  from kb.documents d
 where %(group)s::text is null or %(group)s = any(d.groups)
 order by d.source
"""


def list_documents(url: str, *, group: str | None = None) -> list[DocumentInfo]:
    with kdb.translate_errors(), kdb.connect(url) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(_LIST_DOCUMENTS, {"group": group}).fetchall()
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


def delete_documents(url: str, sources: Sequence[str]) -> tuple[list[str], list[str]]:
    """Delete documents by source (a path also matches its absolute form); (deleted, missing)."""
    deleted: list[str] = []
    missing: list[str] = []
    with _writer(url) as conn:
        with conn.transaction():
            for source in sources:
                candidates = [source]
                with contextlib.suppress(OSError, RuntimeError):
                    candidates.append(str(Path(source).expanduser().resolve()))
                row = conn.execute(
                    "delete from kb.documents where source = any(%s) returning source",
                    (candidates,),
                ).fetchone()
                (deleted if row else missing).append(row[0] if row else source)
        if deleted:
            refresh_edges(conn)
            _refresh_lexical_index(conn)
    return deleted, missing


_STATS = """
select (select count(*) from kb.documents),
       (select count(*) from kb.chunks),
       (select count(*) from kb.chunks where embedding is null),
       (select coalesce(jsonb_object_agg(relation, n), '{}') from
           (select relation, count(*) as n from kb.edges group by relation) e),
       (select model from kb.embedding_space),
       (select dimension from kb.embedding_space),
       (select chunk_count from kb.corpus_stats),
       (select total_tokens from kb.corpus_stats),
       (select count(*) from kb.lexeme_stats)
"""
_SIZES = """
select c.relname, c.relkind::text, pg_catalog.pg_relation_size(c.oid),
       pg_catalog.pg_total_relation_size(c.oid)
  from pg_catalog.pg_class c
 where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'i')
 order by c.relkind desc, c.relname
"""


def stats(url: str) -> dict[str, Any]:
    """Counts, the embedding space, BM25 statistics and on-disk sizes of every kb table and index."""
    with kdb.translate_errors(), kdb.connect(url) as conn:
        kdb.require_schema(conn)
        row = conn.execute(_STATS).fetchone()
        assert row is not None
        sizes = conn.execute(_SIZES).fetchall()
    docs, chunks, unembedded, edges, model, dim, chunk_count, tokens, lexemes = row
    return {
        "documents": int(docs),
        "chunks": int(chunks),
        "chunks_without_embedding": int(unembedded),
        "edges": {str(k): int(v) for k, v in sorted(edges.items())},
        "embedding_space": {"model": model, "dimension": dim} if model else None,
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
    url: str, embedder: Embedder, *, progress: ProgressCallback | None = None
) -> IngestSummary:
    """Switch the knowledge base to `embedder`'s space and rebuild every vector, in one
    transaction: an interrupted re-embed leaves the old vectors and space in place."""
    summary = IngestSummary()
    started = time.perf_counter()
    prefixes: dict[str, str] = {}
    with _writer(url) as conn, kdb.translate_errors(), conn.transaction():
        conn.execute(
            "select kb.reset_embedding_space(model_name => %s, vector_dimension => %s)",
            (embedder.model_name, embedder.dimension),
        )
        conn.execute(
            "create temporary table kbpg_reembed (id bigint, embedding vector) on commit drop"
        )
        with conn.cursor(name="kbpg_reembed_read") as read:
            read.itersize = REEMBED_BATCH
            read.execute("select id, section, content from kb.chunks order by id")
            while rows := read.fetchmany(REEMBED_BATCH):
                texts = []
                for _, section, content in rows:
                    if section not in prefixes:
                        path = tuple(section.split(SECTION_SEPARATOR)) if section else ()
                        prefixes[section] = heading_prefix(path, embedder)
                    texts.append(embed_text(prefixes[section], content))
                t0 = time.perf_counter()
                vectors = embedder.embed_documents(texts)
                t1 = time.perf_counter()
                with (
                    conn.cursor() as cur,
                    cur.copy(
                        "copy kbpg_reembed (id, embedding) from stdin (format binary)"
                    ) as copy,
                ):
                    copy.set_types(["int8", "vector"])
                    for (chunk_id, _, _), vector in zip(rows, vectors, strict=True):
                        copy.write_row((chunk_id, vector))
                summary.embed_s += t1 - t0
                summary.database_s += time.perf_counter() - t1
                summary.chunks += len(rows)
                if progress is not None:
                    progress(IngestProgress(0, summary.chunks, time.perf_counter() - started))
        t0 = time.perf_counter()
        conn.execute(
            "update kb.chunks c set embedding = r.embedding from kbpg_reembed r where r.id = c.id"
        )
        summary.database_s += time.perf_counter() - t0
    summary.total_s = time.perf_counter() - started
    return summary
