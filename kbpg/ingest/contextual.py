"""Contextual retrieval: a chat model situates each chunk in its document (one call a document).

The context (one or two sentences: what the document is, what this part is about) is stored
in kb.chunks.context and goes into the embedded text and the BM25 text. It is keyed by what
it was made from, so an unchanged chunk is never sent twice and a new model or prompt
version shows which chunks are stale.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kbpg.errors import ModelError
from kbpg.models.parsing import parse_json_array

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase, Principal
    from kbpg.models.chat import ChatClient
    from kbpg.models.embedders import Embedder

PROMPT_VERSION = 1
# The document as the model sees it: enough to say what it is about, bounded so that one
# call stays inside the context window of small local models (~8k tokens).
MAX_DOCUMENT_CHARS = 12_000
MAX_CONTEXT_CHARS = 400
# Chunks a fallback call carries when the whole document's answer had the wrong length.
FALLBACK_BATCH = 8

CONTEXT_SYSTEM = (
    "You situate passages within their document to improve search retrieval. For each "
    "numbered passage write one or two short sentences saying what the document is and what "
    "this part of it is about. Answer with a JSON array of strings, one per passage, in order."
)


def context_key(content: str, document_hash: str, model: str) -> str:
    """What a context was made from: chunk content, document hash, model, prompt version."""
    digest = hashlib.sha256()
    for part in (content, document_hash, model, str(PROMPT_VERSION)):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


@dataclass(frozen=True)
class ContextCalls:
    """What writing the contexts of one document cost and gave."""

    contexts: tuple[str | None, ...]
    calls: int
    failures: tuple[str, ...]


def _prompt(title: str, document: str, passages: Sequence[str], first: int) -> str:
    numbered = "\n\n".join(f"[{first + i}] {' '.join(p.split())}" for i, p in enumerate(passages))
    return (
        f"<document title={title!r}>\n{document[:MAX_DOCUMENT_CHARS]}\n</document>\n\n"
        f"Passages:\n{numbered}\n\n"
        f"Answer with a JSON array of exactly {len(passages)} strings, one context per passage."
    )


class _Mismatch(Exception):
    """The answer came but did not hold one context per passage: try smaller batches."""


def _ask(
    chat: ChatClient, title: str, document: str, passages: Sequence[str], first: int
) -> list[str]:
    # a ModelError from the call itself (server down, timeout, 5xx) propagates: smaller
    # batches would only wait for the same dead server again
    answer = chat.complete(
        [
            {"role": "system", "content": CONTEXT_SYSTEM},
            {"role": "user", "content": _prompt(title, document, passages, first)},
        ],
        temperature=0.0,
    )
    try:
        values = parse_json_array(answer)
    except ModelError as exc:
        raise _Mismatch(exc.message) from None
    if len(values) != len(passages) or not all(isinstance(v, str) and v.strip() for v in values):
        raise _Mismatch(f"the model answered {len(values)} contexts for {len(passages)} passages")
    return [" ".join(v.split())[:MAX_CONTEXT_CHARS] for v in values]


def write_contexts(
    chat: ChatClient,
    title: str,
    document: str,
    passages: Sequence[str],
) -> ContextCalls:
    """One context per passage: one call for the whole document, then batches of
    FALLBACK_BATCH, then one call a passage where an answer's length did not match. When the
    server fails (down, timeout, HTTP error) the passages left keep None: their chunks are
    marked missing and a later `kbpg recontextualize` fills them in."""
    contexts: list[str | None] = [None] * len(passages)
    failures: list[str] = []
    calls = 0

    def attempt(start: int, size: int) -> bool:
        nonlocal calls
        calls += 1
        try:
            answer = _ask(chat, title, document, passages[start : start + size], start + 1)
        except _Mismatch as exc:
            failures.append(str(exc))
            return False
        contexts[start : start + size] = answer
        return True

    try:
        if not passages or attempt(0, len(passages)):
            return ContextCalls(tuple(contexts), calls, tuple(failures))
        pending = [(0, len(passages))]
        for size in [FALLBACK_BATCH, 1] if len(passages) > FALLBACK_BATCH else [1]:
            retry: list[tuple[int, int]] = []
            for start, length in pending:
                for offset in range(start, start + length, size):
                    step = min(size, start + length - offset)
                    if not attempt(offset, step):
                        retry.append((offset, step))
            pending = retry
            if not pending:
                break
    except ModelError as exc:
        failures.append(exc.message)
    return ContextCalls(tuple(contexts), calls, tuple(failures))


def document_text(passages: Sequence[str]) -> str:
    """The document as the context prompt shows it: its chunks in order. Built from the chunks
    (kb.documents keeps no text), so ingest and `kbpg recontextualize` send the same."""
    return "\n\n".join(p.strip() for p in passages)


def document_digest(passages: Sequence[str]) -> str:
    """The document part of a context key: its text, not its filters or metadata, so
    re-tagging a document does not send its chunks to the model again."""
    return hashlib.sha256(document_text(passages).encode("utf-8", "surrogatepass")).hexdigest()


def with_context(embedder: Embedder, context: str | None, text: str) -> str:
    """The text to embed: the context, then the chunk's own embedding text, inside the
    model's token window (the context loses words from its end when both do not fit)."""
    if not context:
        return text
    combined = f"{context}\n{text}"
    if embedder.count_tokens(combined) <= embedder.max_tokens:
        return combined
    words = context.split()
    low, high = 0, len(words)  # words[:low] fit with the text
    while low < high:
        middle = (low + high + 1) // 2
        if embedder.count_tokens(" ".join(words[:middle]) + "\n" + text) <= embedder.max_tokens:
            low = middle
        else:
            high = middle - 1
    return f"{' '.join(words[:low])}\n{text}" if low else text


@dataclass
class ContextTally:
    """What contextual retrieval did in one run (part of the ingest summary)."""

    written: int = 0
    missing: int = 0
    calls: int = 0
    failures: list[str] = field(default_factory=list)


def contexts_for_document(
    chat: ChatClient, title: str, passages: Sequence[str], tally: ContextTally
) -> tuple[list[str | None], list[str]]:
    """Contexts (None where the model failed) and their keys for one document's chunks."""
    digest = document_digest(passages)
    keys = [context_key(p, digest, chat.model) for p in passages]
    result = write_contexts(chat, title, document_text(passages), passages)
    tally.calls += result.calls
    tally.written += sum(c is not None for c in result.contexts)
    tally.missing += sum(c is None for c in result.contexts)
    tally.failures.extend(result.failures)
    return list(result.contexts), keys


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
    kb: KnowledgeBase,
    *,
    principal: Principal | None = None,
    dry_run: bool = False,
    progress: Callable[[RecontextSummary], None] | None = None,
) -> RecontextSummary:
    """Write the context of every chunk that is stale or missing one, with the configured chat
    model, and re-embed those chunks; one transaction a document. `dry_run` only counts."""
    import time

    from kbpg.ingest.chunking import SECTION_SEPARATOR, embed_text, heading_prefix
    from kbpg.ingest.writer import writer
    from kbpg.store import queries

    started = time.perf_counter()
    summary = RecontextSummary()
    chat = kb.models.chat()
    embedder = kb.embedder
    with writer(kb, principal) as conn:
        with kb.transaction(conn, principal, write=True):
            conn.execute(queries.SET_EMBEDDING_SPACE, (embedder.model_name, embedder.dimension))
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
            with kb.transaction(conn, principal, write=True), conn.cursor() as cur:
                cur.executemany(
                    queries.CONTEXT_WRITE,
                    [
                        (context, key, vector, row[2])
                        for row, context, key, vector in zip(
                            chunks, contexts, keys, vectors, strict=True
                        )
                    ],
                )
            summary.redone_documents += 1
            if progress is not None:
                progress(summary)
        if summary.redone_documents:
            with kb.transaction(conn, principal, write=True):
                conn.execute(queries.REFRESH_LEXICAL_INDEX)
    summary.total_s = time.perf_counter() - started
    return summary
