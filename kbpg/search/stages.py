"""The optional model stages of a search: reranking the fused pool and expanding the query.

Models run here, in Python; every ranking decision around them stays in SQL (kb.search fuses
the pool, kb.cap_per_document caps and cuts after the reranker). A stage that fails leaves
the plain result and says why in its StageReport, which `--explain` prints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kbpg.errors import ModelError
from kbpg.models.parsing import parse_json_array
from kbpg.models.rerank import document_text, full_order
from kbpg.store import queries

if TYPE_CHECKING:
    import psycopg

    from kbpg.models.chat import ChatClient
    from kbpg.models.clients import ExpansionCache
    from kbpg.models.rerank import Reranker

log = logging.getLogger("kbpg.stages")

APPLIED, SKIPPED, FAILED = "applied", "skipped", "failed"


@dataclass(frozen=True)
class StageReport:
    """What one optional stage did for a query: applied, skipped (and why) or failed (why)."""

    stage: str  # "rerank" or "expand"
    status: str  # applied | skipped | failed
    detail: str
    model: str
    ms: float

    @property
    def warning(self) -> str | None:
        """The line a failed stage puts on stderr / in the log."""
        if self.status != FAILED:
            return None
        return f"kbpg: {self.stage} stage failed ({self.detail}); using the plain result"


# -- reranking ------------------------------------------------------------------------------


def rerank_order(
    reranker: Reranker,
    query: str,
    pool: Sequence[dict[str, Any]],
    top: int,
    max_chars: int,
) -> tuple[list[tuple[int, float | None]], StageReport]:
    """The pool's positions in the reranker's order, each with its reranker score.

    `pool` is kb.search's fused pool (rows with title, source, section, content). The reranker
    runs only when the pool is larger than `top`; on any ModelError the fused order stands.
    """
    fused: list[tuple[int, float | None]] = [(i, None) for i in range(len(pool))]
    if len(pool) <= top:
        detail = f"the fused pool of {len(pool)} is not larger than top {top}"
        return fused, StageReport("rerank", SKIPPED, detail, reranker.model, 0.0)
    texts = [
        document_text(
            row["title"] or row["source"], row["section"] or "", row["content"], max_chars
        )
        for row in pool
    ]
    started = time.perf_counter()
    try:
        hits = reranker.rerank(query, texts)
    except ModelError as exc:
        ms = (time.perf_counter() - started) * 1000
        report = StageReport("rerank", FAILED, exc.message, reranker.model, ms)
        log.warning("%s", report.warning)
        return fused, report
    ms = (time.perf_counter() - started) * 1000
    order = full_order(hits, len(pool))
    ranked = len(hits)
    detail = f"{reranker.provider} reranked {ranked} of {len(pool)} fused candidates"
    return order, StageReport("rerank", APPLIED, detail, reranker.model, ms)


def cap_and_cut(
    conn: psycopg.Connection[Any],
    rows: Sequence[dict[str, Any]],
    top: int,
    max_per_doc: int | None,
) -> list[dict[str, Any]]:
    """`rows` (in their final order) after kb.cap_per_document and the cut to `top`, ranked
    from 1. max_per_doc None: kb.cap_per_document's own default."""
    statement = queries.CAP_AND_CUT.format(
        max_per_doc=", %(max_per_doc)s::integer" if max_per_doc is not None else ""
    )
    args = {
        "ids": [row["chunk_id"] for row in rows],
        "docs": [row["document_id"] for row in rows],
        "top": top,
        "max_per_doc": max_per_doc,
    }
    kept = [int(r[0]) for r in conn.execute(statement, args).fetchall()]
    return [{**rows[position - 1], "rank": rank} for rank, position in enumerate(kept, 1)]


# -- query expansion ------------------------------------------------------------------------

EXPAND_PROMPT_VERSION = 1
EXPAND_SYSTEM = (
    "You rewrite search queries. Answer with a JSON array of strings only: each one a "
    "paraphrase of the query that keeps its meaning, using other words where you can."
)


def paraphrases(
    chat: ChatClient, question: str, count: int, cache: ExpansionCache | None = None
) -> tuple[tuple[str, ...], StageReport]:
    """Up to `count` paraphrases of the question (temperature 0.3), none on failure."""
    key = (chat.model, count, question)
    started = time.perf_counter()
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        detail = f"{len(cached)} paraphrases (cached)"
        return cached, StageReport("expand", APPLIED, detail, chat.model, 0.0)
    prompt = (
        f"Query: {question}\n\nWrite {count} different paraphrases of this search query. "
        f'Answer with a JSON array of {count} strings, e.g. ["...", "..."].'
    )
    try:
        answer = chat.complete(
            [{"role": "system", "content": EXPAND_SYSTEM}, {"role": "user", "content": prompt}],
            temperature=0.3,
        )
        found = _distinct_texts(parse_json_array(answer), question, count)
        if not found:
            raise ModelError(f"no usable paraphrase in the answer {answer[:120]!r}")
    except ModelError as exc:
        ms = (time.perf_counter() - started) * 1000
        report = StageReport("expand", FAILED, exc.message, chat.model, ms)
        log.warning("%s", report.warning)
        return (), report
    ms = (time.perf_counter() - started) * 1000
    if cache is not None:
        cache.put(key, found)
    detail = f"{len(found)} paraphrases"
    return found, StageReport("expand", APPLIED, detail, chat.model, ms)


def _distinct_texts(values: Sequence[Any], question: str, count: int) -> tuple[str, ...]:
    seen = {" ".join(question.lower().split())}
    kept: list[str] = []
    for value in values:
        if not isinstance(value, str):
            continue
        text = " ".join(value.split())
        if text and "\x00" not in text and text.lower() not in seen:
            seen.add(text.lower())
            kept.append(text)
    return tuple(kept[:count])
