"""Read replicas (KBPG_READ_URL): searches go to a replica that is up and at kbpg's schema head."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from kbpg import telemetry
from kbpg.errors import KbpgError
from kbpg.store import db as kdb
from kbpg.store.readiness import DatabaseState, PoolStats, replica_state

log = logging.getLogger("kbpg.replicas")

# a replica that failed is left alone this long before it is tried again
RETRY_AFTER_S = 30.0
# a replica's schema revision is read again after this long (an upgrade replays on it late)
SCHEMA_CHECK_EVERY_S = 5.0
# how long a search waits for a replica connection before trying the next one
CHECKOUT_TIMEOUT_S = 2.0


def redacted(url: str) -> str:
    """A URL fit for a log line: the password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.split(':')[0]}:***@{host}"))


class _Replica:
    def __init__(self, url: str) -> None:
        self.url = url
        self.name = redacted(url)
        self.pool: ConnectionPool | None = None
        self.failed_at = -RETRY_AFTER_S
        self.checked_at = -SCHEMA_CHECK_EVERY_S


class ReadReplicas:
    """Pools on the read replicas, used in turn; one that is down or not at the schema head
    is skipped with a warning (and retried later), and with none left the caller reads from
    the primary — never a silent answer from a stale schema."""

    def __init__(self, urls: tuple[str, ...], *, pool_size: int) -> None:
        self._replicas = [_Replica(url) for url in urls]
        self._pool_size = max(pool_size, 1)
        self._lock = threading.Lock()
        self._turn = 0

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any] | None]:
        """A replica connection in autocommit, or None when no replica can serve the call."""
        for replica in self._in_turn():
            conn = self._checkout(replica)
            if conn is None:
                continue
            assert replica.pool is not None
            telemetry.report.read_routed(replica.name)
            try:
                yield conn
            finally:
                replica.pool.putconn(conn)
            return
        yield None

    def pool_stats(self) -> list[PoolStats]:
        """The pools opened so far (a replica's opens on its first read)."""
        return [
            PoolStats.of(replica.name, replica.pool)
            for replica in self._replicas
            if replica.pool is not None
        ]

    def states(self, primary_lsn: int | None, max_lag_s: float) -> tuple[DatabaseState, ...]:
        """Each replica's readiness (probed now, skipped ones too), in KBPG_READ_URL order."""
        return tuple(replica_state(r.name, r.url, primary_lsn, max_lag_s) for r in self._replicas)

    def close(self) -> None:
        for replica in self._replicas:
            if replica.pool is not None:
                replica.pool.close()

    def _in_turn(self) -> list[_Replica]:
        now = time.monotonic()
        with self._lock:
            start = self._turn
            self._turn += 1
        ordered = self._replicas[start % len(self._replicas) :]
        ordered += self._replicas[: start % len(self._replicas)]
        return [r for r in ordered if now - r.failed_at >= RETRY_AFTER_S]

    def _checkout(self, replica: _Replica) -> psycopg.Connection[Any] | None:
        try:
            if replica.pool is None:
                # a probe fails at once where a pool would retry until its open timeout
                kdb.connect(replica.url, autocommit=True).close()
                replica.pool = kdb.create_pool(replica.url, min_size=1, max_size=self._pool_size)
            conn = replica.pool.getconn(timeout=CHECKOUT_TIMEOUT_S)
        except KbpgError as exc:
            self._skip(replica, exc.message, "down")
            return None
        except PoolTimeout:
            self._skip(replica, f"no free connection within {CHECKOUT_TIMEOUT_S:g} s", "busy")
            return None
        conn.autocommit = True
        now = time.monotonic()
        if now - replica.checked_at >= SCHEMA_CHECK_EVERY_S:
            try:
                status = kdb.schema_status(conn)
            except KbpgError as exc:
                replica.pool.putconn(conn)
                self._skip(replica, exc.message, "down")
                return None
            if not status.at_head:
                replica.pool.putconn(conn)
                self._skip(
                    replica,
                    f"its kbpg schema is at {status.current or 'none'}, this kbpg needs "
                    f"{status.head}",
                    "behind",
                )
                return None
            replica.checked_at = now
        return conn

    def _skip(self, replica: _Replica, reason: str, kind: str) -> None:
        telemetry.report.replica_skipped(replica.name, kind)
        replica.failed_at = time.monotonic()
        replica.checked_at = -SCHEMA_CHECK_EVERY_S
        if replica.pool is not None:  # no reconnecting in the background meanwhile
            replica.pool.close()
            replica.pool = None
        log.warning(
            "read replica %s skipped for %.0f s: %s",
            replica.name,
            RETRY_AFTER_S,
            reason,
        )
