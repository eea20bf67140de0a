"""kbpg: PostgreSQL-native knowledge-base retrieval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase, Principal
    from kbpg.search.request import SearchRequest
    from kbpg.search.run import Chunk, Retriever, SearchResult, Source

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
    "Chunk": "kbpg.search.run",
    "KnowledgeBase": "kbpg.app",
    "Principal": "kbpg.app",
    "Retriever": "kbpg.search.run",
    "SearchRequest": "kbpg.search.request",
    "SearchResult": "kbpg.search.run",
    "Source": "kbpg.search.run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'kbpg' has no attribute {name!r}")
