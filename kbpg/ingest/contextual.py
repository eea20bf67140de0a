"""Contextual retrieval: a chat model situates each chunk in its document (one call a document).

The context (one or two sentences: what the document is, what this part is about) is stored
in kb.chunks.context and goes into the embedded text and the BM25 text. It is keyed by what
it was made from, so an unchanged chunk is never sent twice and a new model or prompt
version shows which chunks are stale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kbpg.errors import ModelError
from kbpg.models.parsing import parse_json_array

if TYPE_CHECKING:
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
