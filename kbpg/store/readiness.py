"""Whether each database of a knowledge base can serve (up, busy, at the schema head, lagging),
and its connection pool right now."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from kbpg.errors import KbpgError, first_line
from kbpg.store import db as kdb
from kbpg.store import queries

OK, BUSY, DOWN, UNMIGRATED, LAGGING = "ok", "busy", "down", "unmigrated", "lagging"
# a probe gives up on a database after this long (a load balancer's probe waits a few seconds)
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PoolStats:
    """A connection pool right now: connections open, in use, and calls waiting for one."""

    database: str
    size: int
    max_size: int
    in_use: int
    waiting: int

    @classmethod
    def of(cls, database: str, pool: ConnectionPool) -> PoolStats:
        stats = pool.get_stats()
        size = stats.get("pool_size", 0)
        return cls(
            database,
            size,
            stats.get("pool_max", 0),
            size - stats.get("pool_available", 0),
            stats.get("requests_waiting", 0),
        )


@dataclass(frozen=True)
class DatabaseState:
    """One database's readiness. `status`: ok, busy (every pooled connection stayed in use),
    down (unreachable), unmigrated (kbpg's schema missing or not at head), lagging (a replica
    whose replay is paused or further behind than the allowed lag). `detail` says why, for the
    operator's log (it may hold PostgreSQL's text)."""

    database: str  # "primary" or the replica's URL, password hidden
    status: str
    detail: str = ""
    schema: str | None = None  # kbpg's revision there
    lag_bytes: int | None = None  # WAL the replica has yet to replay
    lag_s: float | None = None  # while behind: seconds since it last replayed a transaction

    @property
    def ok(self) -> bool:
        return self.status == OK

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"database": self.database, "status": self.status}
        if self.detail:
            out["detail"] = self.detail
        out["schema"] = self.schema
        if self.lag_bytes is not None:
            out["lag_bytes"] = self.lag_bytes
            out["lag_s"] = self.lag_s
        return out


@dataclass(frozen=True)
class Readiness:
    """The primary's state and each read replica's, in KBPG_READ_URL order. Ready when a
    search can be answered: by the primary, or by a replica that is ok."""

    primary: DatabaseState
    replicas: tuple[DatabaseState, ...] = ()

    @property
    def ok(self) -> bool:
        return self.primary.ok or any(r.ok for r in self.replicas)


def parse_lsn(text: str | None) -> int | None:
    """A pg_lsn ('16/B374D848') as a byte position."""
    if not text:
        return None
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


def schema_state(database: str, conn: psycopg.Connection[Any]) -> DatabaseState | None:
    """`unmigrated` when kbpg's schema there is not at head, else None (carry on)."""
    status = kdb.schema_status(conn)
    if status.at_head:
        return None
    detail = f"kbpg schema at {status.current or 'none'}, this kbpg needs {status.head}"
    return DatabaseState(database, UNMIGRATED, detail, status.current)


def primary_state(conn: psycopg.Connection[Any]) -> tuple[DatabaseState, int | None]:
    """The primary's state on one of its connections, and its WAL position."""
    unmigrated = schema_state("primary", conn)
    if unmigrated is not None:
        return unmigrated, None
    with kdb.translate_errors():
        row = conn.execute(queries.WAL_POSITION).fetchone()
    return DatabaseState("primary", OK, schema=kdb.head_revision()), parse_lsn(
        row[0] if row else None
    )


def replica_state(name: str, url: str, primary_lsn: int | None, max_lag_s: float) -> DatabaseState:
    """A read replica's state, on a connection of the probe's own."""
    try:
        with psycopg.connect(
            url, autocommit=True, connect_timeout=max(1, round(PROBE_TIMEOUT_S))
        ) as conn:
            unmigrated = schema_state(name, conn)
            if unmigrated is not None:
                return unmigrated
            with kdb.translate_errors():
                row = conn.execute(queries.REPLAY_STATE).fetchone()
    except psycopg.Error as exc:
        return DatabaseState(name, DOWN, first_line(str(exc)))
    except KbpgError as exc:
        return DatabaseState(name, DOWN, exc.message)
    head = kdb.head_revision()
    assert row is not None
    in_recovery, replayed, since_replay, paused = row
    replay_lsn = parse_lsn(replayed)
    if not in_recovery or replay_lsn is None or primary_lsn is None:
        return DatabaseState(name, OK, schema=head)  # not a standby we can compare
    lag_bytes = max(0, primary_lsn - replay_lsn)
    lag_s = max(0.0, float(since_replay or 0.0)) if lag_bytes else 0.0
    if lag_bytes and (paused or lag_s >= max_lag_s):
        why = "its WAL replay is paused" if paused else f"no replay for {lag_s:.0f} s"
        detail = f"{lag_bytes} bytes of WAL behind the primary; {why}"
        return DatabaseState(name, LAGGING, detail, head, lag_bytes, round(lag_s, 3))
    return DatabaseState(name, OK, schema=head, lag_bytes=lag_bytes, lag_s=round(lag_s, 3))
