"""Named knowledge bases in one database (issue 39): create, list, rename, drop over the
kb.*_knowledge_base SQL functions. Which one a call works in is the Database's (KBPG_KB)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kbpg.store import indexing, queries

if TYPE_CHECKING:
    from kbpg.store.sessions import Database


@dataclass(frozen=True)
class KnowledgeBaseInfo:
    """One row of kb.knowledge_bases()."""

    name: str
    language: str | None
    model: str | None  # None before its first vector
    dimension: int | None
    documents: int
    chunks: int
    readers: str  # "all", or "granted": only roles with a group grant in it (enforced access)
    created_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat() if self.created_at else None
        return data


def list_all(db: Database) -> list[KnowledgeBaseInfo]:
    with db.session() as conn:
        rows = conn.execute(queries.KNOWLEDGE_BASES).fetchall()
    return [KnowledgeBaseInfo(*row) for row in rows]


def create(
    db: Database,
    name: str,
    *,
    language: str | None = None,
    model: str | None = None,
    dimension: int | None = None,
    readers: str | None = None,
) -> KnowledgeBaseInfo:
    """A new, empty knowledge base. The first one beside default limits default's HNSW index
    to default's rows: built here first, concurrently (default's searches and writes go on; at
    a million chunks it takes minutes), then swapped in by kb.create_knowledge_base. `readers`:
    "all" or "granted" (the default: only roles holding a group grant in it read it)."""
    with db.connection(write=True) as conn:
        with db.transaction(conn, write=True):
            conn.execute(queries.CHECK_KNOWLEDGE_BASE_NAME, (name,))
            row = conn.execute(queries.SHARED_DEFAULT_VECTOR_INDEX).fetchone()
        statement = row[0] if row is not None else None
        if statement is not None:
            settings = indexing.build_settings(conn)
            for setting, value in settings.items():
                conn.execute(queries.SET_SESSION, (setting, value))
            try:
                conn.execute(queries.DROP_SHARED_DEFAULT_VECTOR_INDEX)
                conn.execute(statement.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1))
            finally:
                for setting in settings:
                    conn.execute(queries.RESET_SESSION, (setting,))
        with db.transaction(conn, write=True):
            row = conn.execute(
                queries.CREATE_KNOWLEDGE_BASE, (name, language, model, dimension)
            ).fetchone()
            assert row is not None
            if readers is not None:
                conn.execute(queries.SET_KNOWLEDGE_BASE_READERS, (name, readers))
            created = conn.execute(queries.KNOWLEDGE_BASE, (row[0],)).fetchone()
    assert created is not None
    return KnowledgeBaseInfo(*created)


def rename(db: Database, name: str, new_name: str) -> None:
    with db.session(write=True) as conn:
        conn.execute(queries.RENAME_KNOWLEDGE_BASE, (name, new_name))


def set_readers(db: Database, name: str, readers: str) -> None:
    """Who reads the knowledge base `name` while access control is enforced: "all" reader roles,
    or those "granted" a group in it."""
    with db.session(write=True) as conn:
        conn.execute(queries.SET_KNOWLEDGE_BASE_READERS, (name, readers))


def drop(db: Database, name: str) -> tuple[int, int]:
    """Delete the knowledge base `name` whole; (documents, chunks) it held."""
    with db.session(write=True) as conn:
        row = conn.execute(queries.DROP_KNOWLEDGE_BASE, (name,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
