"""Indexed metadata keys: the keys whose values get filter bitmaps and value caches of their
own (sql/045), so that a metadata filter's equalities on them mask the lexical arm as a group
filter does."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kbpg.store import db as kdb
from kbpg.store import queries
from kbpg.store.sessions import Database


@dataclass(frozen=True)
class IndexedKey:
    key: str
    indexed_at: str
    values: int
    cached_values: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def index_key(db: Database, key: str) -> bool:
    """Index `key` (dotted when nested) and build its bitmaps now; False if it was indexed."""
    with db.session(write=True) as conn:
        kdb.require_schema(conn)
        row = conn.execute(queries.INDEX_METADATA_KEY, (key,)).fetchone()
    return bool(row and row[0])


def unindex_key(db: Database, key: str) -> bool:
    """Drop `key`'s bitmaps and caches; False if it was not indexed."""
    with db.session(write=True) as conn:
        kdb.require_schema(conn)
        row = conn.execute(queries.UNINDEX_METADATA_KEY, (key,)).fetchone()
    return bool(row and row[0])


def indexed_keys(db: Database) -> list[IndexedKey]:
    """The indexed keys, how many values their bitmaps hold and how many have a cache."""
    with db.session() as conn:
        kdb.require_schema(conn)
        rows = conn.execute(queries.LIST_INDEXED_METADATA_KEYS).fetchall()
    return [
        IndexedKey(key, at.isoformat(timespec="seconds"), int(values), int(cached))
        for key, at, values, cached in rows
    ]
