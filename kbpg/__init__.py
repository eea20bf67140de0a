"""kbpg: PostgreSQL-native knowledge-base retrieval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kbpg.search import Chunk, Retriever, SearchResult, Source

__all__ = ["Chunk", "Retriever", "SearchResult", "Source", "__version__"]

# Imported on first use, so that `import kbpg` (and the CLI's start) stays cheap.
_LAZY = {"Chunk", "Retriever", "SearchResult", "Source"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from kbpg import search

        return getattr(search, name)
    raise AttributeError(f"module 'kbpg' has no attribute {name!r}")
