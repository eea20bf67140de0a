"""The knowledge base's language: read it, and change it (one transaction, with progress)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from kbpg.store import queries

DEFAULT_LANGUAGE = "english"
# chunks re-analysed per statement: a progress line each (about a second of PostgreSQL's time)
REANALYSE_BATCH = 5000


@dataclass(frozen=True)
class LanguageProgress:
    language: str
    chunks_done: int
    chunks_total: int
    elapsed_s: float
    phase: str = "re-analysing"

    def describe(self) -> str:
        if self.phase != "re-analysing":
            return f"{self.language}: {self.phase}, {self.elapsed_s:.0f} s"
        share = 100.0 * self.chunks_done / self.chunks_total if self.chunks_total else 100.0
        return (
            f"{self.language}: re-analysed {self.chunks_done:,}/{self.chunks_total:,} chunks "
            f"({share:.0f}%), {self.elapsed_s:.0f} s"
        )


@dataclass(frozen=True)
class LanguageChange:
    before: str
    after: str
    chunks: int
    lexemes: int
    blocks_rebuilt: int
    seconds: float

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def describe(self) -> str:
        if not self.changed:
            return f"language: {self.after} (unchanged)"
        return (
            f"language: {self.after} (was {self.before}; {self.chunks:,} chunks re-analysed, "
            f"{self.lexemes:,} lexemes, {self.blocks_rebuilt} cache blocks rebuilt, "
            f"{self.seconds:.1f} s)"
        )


def current_language(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(queries.LANGUAGE).fetchone()
    return str(row[0]) if row else DEFAULT_LANGUAGE


def change_language(
    conn: psycopg.Connection[Any],
    language: str,
    progress: Callable[[LanguageProgress], None] | None = None,
    batch: int = REANALYSE_BATCH,
) -> LanguageChange:
    """kb.set_language's steps in the caller's (one) transaction, reporting progress between
    batches: the chunks, BM25 statistics and impact cache change together or not at all."""
    started = time.perf_counter()
    row = conn.execute(queries.LANGUAGE_CHANGE_BEGIN, {"language": language}).fetchone()
    assert row is not None
    before, after, total = str(row[0]), str(row[1]), int(row[2])
    done = 0
    if before != after:
        while True:
            step = conn.execute(queries.LANGUAGE_REANALYSE, {"batch": batch}).fetchone()
            count = int(step[0]) if step else 0
            if count == 0:
                break
            done += count
            if progress is not None:
                progress(LanguageProgress(after, done, total, time.perf_counter() - started))
        if progress is not None:
            progress(
                LanguageProgress(
                    after, done, total, time.perf_counter() - started, "rebuilding the BM25 cache"
                )
            )
    finished = conn.execute(queries.LANGUAGE_CHANGE_FINISH).fetchone()
    assert finished is not None
    return LanguageChange(
        before=before,
        after=after,
        chunks=int(finished[0]) if before != after else 0,
        lexemes=int(finished[1]),
        blocks_rebuilt=int(finished[2]),
        seconds=time.perf_counter() - started,
    )


def is_english(conn: psycopg.Connection[Any], language: str) -> bool:
    """Whether the language analyses English words (english, or a configuration built on it)."""
    row = conn.execute(queries.LANGUAGE_IS_ENGLISH, {"language": language}).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class ModelDefaults:
    """kb.model_defaults(): the recorded model (None before the first vector), the language,
    whether a model reads it as English, and kb.search's default vector weight."""

    model: str | None
    language: str
    english: bool
    vector_weight: float


def model_defaults(conn: psycopg.Connection[Any]) -> ModelDefaults:
    row = conn.execute(queries.MODEL_DEFAULTS).fetchone()
    assert row is not None  # one row always
    return ModelDefaults(
        model=None if row[0] is None else str(row[0]),
        language=str(row[1]),
        english=bool(row[2]),
        vector_weight=float(row[3]),
    )
