"""kbpg: PostgreSQL-native knowledge-base retrieval."""

from __future__ import annotations

__version__ = "0.1.0"
