"""Access control: group grants and row-level security, over the kb.* access functions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from kbpg.errors import KbpgError, from_psycopg

_OWNER_HINT = (
    "run it as the owner of the kb tables (the role that ran `kbpg db upgrade`), or in psql: "
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
    """What kb.access_status() reports, seen by the current role."""

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
def _errors(hint: str | None = None) -> Iterator[None]:
    """Map SQL errors; insufficient privilege gets the hint of the action that needs it."""
    try:
        yield
    except psycopg.Error as exc:
        error = from_psycopg(exc)
        if getattr(exc, "sqlstate", None) == "42501" and hint and not error.hint:
            error = KbpgError(error.message, hint=hint)
        raise error from exc


def setup(
    conn: psycopg.Connection[Any], reader_role: str | None = None, writer_role: str | None = None
) -> tuple[str, str]:
    """Create (when missing) and grant the NOLOGIN reader and writer roles; their names."""
    with _errors(), conn.transaction():
        row = conn.execute(
            "select reader, writer from kb.access_setup(reader_role => %s, writer_role => %s)",
            (reader_role, writer_role),
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def grant(conn: psycopg.Connection[Any], role: str, groups: Sequence[str]) -> list[Grant]:
    """Let `role` read `groups`; the grants that were new."""
    with _errors(_GRANT_HINT), conn.transaction():
        rows = conn.execute(
            "select role, group_name from kb.grant_groups(role_name => %s, groups => %s)",
            (role, list(groups)),
        ).fetchall()
    return [Grant(r[0], r[1]) for r in rows]


def revoke(
    conn: psycopg.Connection[Any], role: str, groups: Sequence[str] | None = None
) -> list[Grant]:
    """Take `groups` (every group when None) away from `role`; what was revoked."""
    with _errors(_GRANT_HINT), conn.transaction():
        rows = conn.execute(
            "select role, group_name from kb.revoke_groups(role_name => %s, groups => %s)",
            (role, None if groups is None else list(groups)),
        ).fetchall()
    return [Grant(r[0], r[1]) for r in rows]


def list_grants(conn: psycopg.Connection[Any], role: str | None = None) -> list[Grant]:
    """The grants the current role may see (a reader: its own), by role and group."""
    with _errors():
        rows = conn.execute(
            "select role, group_name, granted_at from kb.list_grants(role_name => %s)", (role,)
        ).fetchall()
    return [Grant(r[0], r[1], r[2]) for r in rows]


def status(conn: psycopg.Connection[Any]) -> AccessStatus:
    """Whether access control is enforced, the roles, and what the current role may read."""
    with _errors():
        row = conn.execute(
            "select enforced, tables_enforced, tables_total, reader_role, writer_role,"
            " lexical_cache_split, visible_groups, reads_all from kb.access_status()"
        ).fetchone()
    assert row is not None
    return AccessStatus(
        bool(row[0]), row[1], row[2], row[3], row[4], bool(row[5]), list(row[6]), bool(row[7])
    )


def set_enforced(conn: psycopg.Connection[Any], enforced: bool) -> AccessStatus:
    """Turn enforcement on or off (rebuilds the lexical cache to match); the new status."""
    function = "kb.access_enable()" if enforced else "kb.access_disable()"
    with _errors(_OWNER_HINT), conn.transaction():
        conn.execute(f"select {function}")
    return status(conn)
