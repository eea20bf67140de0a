"""kbpg: PostgreSQL-native knowledge-base retrieval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase, Principal, Retriever
    from kbpg.search.request import SearchRequest
    from kbpg.search.results import Chunk, SearchResult, Source

__all__ = [
    "Chunk",
    "KnowledgeBase",
    "Principal",
    "Retriever",
    "SearchRequest",
    "SearchResult",
    "Source",
    "__version__",
]

# Imported on first use, so that `import kbpg` (and the CLI's start) stays cheap.
_LAZY = {
    "Chunk": "kbpg.search.results",
    "KnowledgeBase": "kbpg.app",
    "Principal": "kbpg.app",
    "Retriever": "kbpg.app",
    "SearchRequest": "kbpg.search.request",
    "SearchResult": "kbpg.search.results",
    "Source": "kbpg.search.results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'kbpg' has no attribute {name!r}")
