"""Access control: group grants and row-level security, over the kb.* access functions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kbpg.errors import PermissionDenied
from kbpg.store import db as kdb
from kbpg.store import queries

if TYPE_CHECKING:
    from kbpg.store.sessions import Database, Principal

_OWNER_HINT = (
    "run it as the owner of the kb tables (the role that ran `kbpg db upgrade`); in psql: "
    "select kb.access_enable();"
)
_GRANT_HINT = "grants are managed by the owner of the kb tables (or a superuser)"


@dataclass(frozen=True)
class Grant:
    """A role may read a group's chunks (once access control is enforced)."""

    role: str
    group: str
    granted_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["granted_at"] = self.granted_at.isoformat() if self.granted_at else None
        return data


@dataclass(frozen=True)
class AccessStatus:
    """What kb.access_status() reports, seen by the calling role."""

    enforced: bool
    tables_enforced: int
    tables_total: int
    reader_role: str | None
    writer_role: str | None
    lexical_cache_split: bool
    visible_groups: list[str]
    reads_all: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextlib.contextmanager
def _needs(hint: str) -> Iterator[None]:
    """Insufficient privilege gets the hint of who may do it (more than the generic one)."""
    try:
        yield
    except PermissionDenied as exc:
        exc.hint = hint
        raise


def setup(
    db: Database,
    reader_role: str | None = None,
    writer_role: str | None = None,
    principal: Principal | None = None,
) -> tuple[str, str]:
    """Create (when missing) and grant the NOLOGIN reader and writer roles; their names."""
    with db.session(principal, write=True) as conn:
        kdb.require_schema(conn)
        row = conn.execute(
            queries.ACCESS_SETUP, {"reader": reader_role, "writer": writer_role}
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def grant(
    db: Database, role: str, groups: Sequence[str], principal: Principal | None = None
) -> list[Grant]:
    """Let `role` (and its members) read `groups`; the grants that were new."""
    with _needs(_GRANT_HINT), db.session(principal, write=True) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(queries.ACCESS_GRANT, {"role": role, "groups": list(groups)})
        return [Grant(r[0], r[1]) for r in rows.fetchall()]


def revoke(
    db: Database,
    role: str,
    groups: Sequence[str] | None = None,
    principal: Principal | None = None,
) -> list[Grant]:
    """Take `groups` (every group when None) away from `role`; what was revoked."""
    params = {"role": role, "groups": None if groups is None else list(groups)}
    with _needs(_GRANT_HINT), db.session(principal, write=True) as conn:
        kdb.require_schema(conn)
        return [Grant(r[0], r[1]) for r in conn.execute(queries.ACCESS_REVOKE, params)]


def list_grants(
    db: Database, role: str | None = None, principal: Principal | None = None
) -> list[Grant]:
    """The grants the calling role may see (a reader: its own), by role and group."""
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        rows = conn.execute(queries.ACCESS_LIST, {"role": role}).fetchall()
    return [Grant(r[0], r[1], r[2]) for r in rows]


def status(db: Database, principal: Principal | None = None) -> AccessStatus:
    """Whether access control is enforced, the roles, and what the calling role may read."""
    with db.session(principal) as conn:
        kdb.require_schema(conn)
        row = conn.execute(queries.ACCESS_STATUS).fetchone()
    assert row is not None
    return AccessStatus(
        bool(row[0]), row[1], row[2], row[3], row[4], bool(row[5]), list(row[6]), bool(row[7])
    )


def set_enforced(db: Database, enforced: bool, principal: Principal | None = None) -> AccessStatus:
    """Turn enforcement on or off (rebuilds the lexical cache to match); the new status."""
    with _needs(_OWNER_HINT), db.session(principal, write=True) as conn:
        kdb.require_schema(conn)
        conn.execute(queries.ACCESS_ENABLE if enforced else queries.ACCESS_DISABLE)
    return status(db, principal)
