"""Renderings of a search result for the terminal: TOON rows, JSON, and the --explain report."""

from __future__ import annotations

import json
from typing import Any

import toon_format

from kbpg.search.results import Chunk, SearchResult

PREVIEW_CHARS = 80
BOLD, PLAIN = "\x1b[1m", "\x1b[0m"


def marked_preview(chunk: Chunk, width: int = PREVIEW_CHARS, bold: bool = False) -> str:
    """The chunk's snippet (else its text) on one line, at most `width` characters shown, the
    query's words in bold when `bold` (a terminal)."""
    text = chunk.snippet or chunk.content
    offset = chunk.snippet_start if chunk.snippet else 0
    marks = [
        (start - offset, end - offset)
        for start, end in chunk.highlights
        if start >= offset and end <= offset + len(text)
    ]
    pieces: list[tuple[str, bool]] = []
    at = 0
    for start, end in marks:
        pieces += [(text[at:start], False), (text[start:end], True)]
        at = end
    pieces.append((text[at:], False))
    shown: list[str] = []
    room = width
    cut = len(" ".join(text.split())) > width  # the text on one line, whitespace collapsed
    pending_space = False
    for piece, marked in pieces:
        words = piece.split()
        lead = bool(piece[:1].isspace())
        for i, word in enumerate(words):
            space = (i > 0 or lead or pending_space) and bool(shown)
            need = len(word) + int(space)
            if need > room - int(cut):
                if not shown:  # one word longer than the line: its start
                    shown.append(word[: room - 1])
                room = 0
                break
            shown.append(
                (" " if space else "") + (BOLD + word + PLAIN if bold and marked else word)
            )
            room -= need
        if room == 0:
            break
        pending_space = bool(piece[-1:].isspace())
    return "".join(shown) + ("…" if cut else "")


def _score(value: float) -> float:
    return round(value, 4)


def render_toon(result: SearchResult, bold: bool = False) -> str:
    """`chunks[N]{document,source,section,score,similarity,content_preview}:` then one row per
    chunk: the source tells documents of the same title apart; score is the fused (RRF) score,
    similarity the vector arm's cosine similarity (null without a query embedding); the
    preview is the chunk's snippet, the query's words in bold when `bold` (a terminal). A
    search across knowledge bases puts each chunk's knowledge_base first."""
    across = any(chunk.knowledge_base for chunk in result.chunks)
    rows = [
        {
            **({"knowledge_base": chunk.knowledge_base} if across else {}),
            "document": chunk.document,
            "source": chunk.source,
            "section": chunk.section,
            "score": _score(chunk.score),
            "similarity": None if chunk.similarity is None else _score(chunk.similarity),
            "content_preview": marked_preview(chunk, bold=bold),
        }
        for chunk in result.chunks
    ]
    document: dict[str, Any] = {"chunks": rows}
    if result.facets:  # asked for with --facets
        document["facets"] = [
            {"facet": f.facet, "value": f.value, "documents": f.documents, "chunks": f.chunks}
            for f in result.facets
        ]
    return toon_format.encode(document)


def render_json(result: SearchResult) -> str:
    """`{"context", "sources", "chunks"}` — the same payload as the HTTP API."""
    return json.dumps(result.to_json(), ensure_ascii=False, indent=2)


def render_explain(result: SearchResult) -> str:
    """Per-arm ranks and timings, in TOON, for stderr."""
    timings = result.timings
    report: dict[str, Any] = {
        "timings_ms": {
            "embed": round(timings.embed_ms, 2),
            "sql": round(timings.sql_ms, 2),
            "total": round(timings.total_ms, 2),
        },
        "ranks": [
            {
                "rank": chunk.rank,
                "chunk_id": chunk.chunk_id,
                "document": chunk.document,
                "score": chunk.score,
                "similarity": None if chunk.similarity is None else round(chunk.similarity, 4),
                "vector": chunk.vector_rank,
                "lexical": chunk.lexical_rank,
                "graph": chunk.graph_rank,
                "fused": chunk.fused_rank,
                "rerank_score": None
                if chunk.rerank_score is None
                else round(chunk.rerank_score, 4),
            }
            for chunk in result.chunks
        ],
    }
    if result.notices:
        report["notices"] = list(result.notices)
    if result.stages:
        report["stages"] = [
            {
                "stage": s.stage,
                "status": s.status,
                "model": s.model,
                "ms": round(s.ms, 2),
                "detail": s.detail,
            }
            for s in result.stages
        ]
    return toon_format.encode(report)
