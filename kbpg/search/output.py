"""Renderings of a search result for the terminal: TOON rows, JSON, and the --explain report."""

from __future__ import annotations

import json
from typing import Any

import toon_format

from kbpg.search.results import SearchResult

PREVIEW_CHARS = 80


def preview(text: str, width: int = PREVIEW_CHARS) -> str:
    """The first `width` characters of a chunk on one line, whitespace collapsed."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _score(value: float) -> float:
    return round(value, 4)


def render_toon(result: SearchResult) -> str:
    """`chunks[N]{document,source,section,score,similarity,content_preview}:` then one row per
    chunk: the source tells documents of the same title apart; score is the fused (RRF) score,
    similarity the vector arm's cosine similarity (null without a query embedding)."""
    rows = [
        {
            "document": chunk.document,
            "source": chunk.source,
            "section": chunk.section,
            "score": _score(chunk.score),
            "similarity": None if chunk.similarity is None else _score(chunk.similarity),
            "content_preview": preview(chunk.content),
        }
        for chunk in result.chunks
    ]
    return toon_format.encode({"chunks": rows})


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
