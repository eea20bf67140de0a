"""Sessions on a knowledge base's database: the pool (or one connection), read replicas, the
role a call runs as (Principal), kbpg's local timeouts, and cancelling a running statement."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from kbpg import telemetry
from kbpg.config import DEFAULT_KNOWLEDGE_BASE, Settings
from kbpg.errors import (
    Busy,
    DatabaseUnavailable,
    InvalidInput,
    KbpgError,
    QueryTimeout,
    ReadOnlyDatabase,
    RoleUnavailable,
)
from kbpg.store import db as kdb
from kbpg.store import queries, readiness
from kbpg.store.readiness import PoolStats
from kbpg.store.replicas import ReadReplicas

Connection = psycopg.Connection[Any]
log = logging.getLogger("kbpg")
PRIMARY = "primary"  # the primary's name in telemetry and readiness (replicas: their URL)


@dataclass(frozen=True)
class Principal:
    """Who a call runs as, and where: a PostgreSQL role the connecting user may SET ROLE to
    (None: itself), and the knowledge base it works in (None: the Database's own, KBPG_KB).

    The knowledge base is looked up by name as that role (kb.knowledge_base_id), in the call's
    transaction: one the role may not read is NotFound, as one that does not exist.
    """

    role: str | None = None
    knowledge_base: str | None = None

    def __post_init__(self) -> None:
        for what, value in (("role", self.role), ("knowledge base", self.knowledge_base)):
            if value is not None and (not isinstance(value, str) or not value or "\x00" in value):
                raise InvalidInput(f"not a {what} name: {value!r}")


class Cancellation:
    """Lets another thread stop the statement a call is running (an HTTP client that went away).

    The call registers its connection with `watching(conn)`; `cancel()` sends PostgreSQL a
    cancel request for whatever that connection runs (the statement ends with SQLSTATE 57014),
    or makes the call stop before its statement starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self.cancelled = False

    @contextmanager
    def watching(self, conn: Connection) -> Iterator[Connection]:
        with self._lock:
            if self.cancelled:
                raise QueryTimeout("the call was cancelled before its statement started")
            self._conn = conn
        try:
            yield conn
        finally:
            with self._lock:
                self._conn = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._conn is not None:
                self._conn.cancel_safe(timeout=5.0)


class Database:
    """The connections of one knowledge base: every database call runs in `session()` (or
    `connection()` + `transaction()` for jobs that commit in batches), which applies the
    caller's role and kbpg's timeouts. `pool_size=1` keeps one connection (a one-shot CLI);
    larger sizes open a pool shared by threads. KBPG_READ_URL's replicas serve reads.
    """

    def __init__(self, settings: Settings, url: str | None = None, *, pool_size: int = 4) -> None:
        self.settings = settings
        # no URL anywhere: kbpg's own embedded server, whose database gets its schema on first use
        embedded = url is None and not settings.database_url
        self.url = url or kdb.resolve_url(settings)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._pool: ConnectionPool | None = None
        # KBPG_READ_URL replicates KBPG_DATABASE_URL, not a database given here (kbpg eval's)
        read_urls = settings.read_urls if url is None or url == settings.database_url else ()
        # Fails fast when the database is down (a pool would keep retrying until its timeout).
        probe = kdb.connect(self.url, autocommit=True)
        try:
            if embedded and kdb.create_schema_if_missing(probe, self.url, settings.language):
                log.info("created kbpg's schema in the embedded database (first use)")
                kdb.register_types(probe)  # pgvector's types exist now
            if settings.knowledge_base != DEFAULT_KNOWLEDGE_BASE:
                # every session of this Database works in that knowledge base
                kb_id = kdb.knowledge_base_id(probe, settings.knowledge_base)
                self.url = kdb.in_knowledge_base(self.url, kb_id)
                read_urls = tuple(kdb.in_knowledge_base(u, kb_id) for u in read_urls)
                probe.execute(queries.SELECT_KNOWLEDGE_BASE, (str(kb_id),))
        except BaseException:
            probe.close()
            raise
        self._replicas: ReadReplicas | None = None
        if read_urls:
            self._replicas = ReadReplicas(read_urls, pool_size=pool_size)
        if pool_size <= 1:
            self._conn = probe
        else:
            probe.close()
            self._pool = kdb.create_pool(self.url, min_size=1, max_size=pool_size)

    def _pool_for(self, write: bool) -> ConnectionPool | None:
        """The pool a call draws from: the one place a read-replica pool plugs in."""
        return self._pool

    @contextmanager
    def connection(
        self, *, write: bool = False, timeout: float | None = None
    ) -> Iterator[Connection]:
        """A connection of the call's own, in autocommit; psycopg errors come out as KbpgError.

        Most callers want `session()`. Jobs that commit in batches hold one connection and
        open each batch with `transaction()`.
        """
        wait = self.settings.pool_timeout_s if timeout is None else timeout
        if not write and self._replicas is not None:
            with kdb.translate_errors(), self._replicas.connection() as replica:
                if replica is not None:
                    yield replica
                    return
            log.warning("no read replica can serve this call: reading from the primary")
        with kdb.translate_errors(), self._checkout(self._pool_for(write), wait) as conn:
            if write:
                _require_primary(conn)
            else:
                telemetry.report.read_routed(PRIMARY)
            yield conn

    @contextmanager
    def _checkout(self, pool: ConnectionPool | None, wait: float) -> Iterator[Connection]:
        if pool is None:
            if not self._lock.acquire(timeout=wait):
                telemetry.report.pool_exhausted(PRIMARY)
                raise Busy(
                    f"the database connection stayed busy for {wait:g} s",
                    hint="retry shortly (this knowledge base has one connection)",
                )
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = kdb.connect(self.url, autocommit=True)
                yield self._conn
            finally:
                _reset(self._conn)
                self._lock.release()
            return
        try:
            conn = pool.getconn(timeout=wait)
        except PoolTimeout as exc:
            error = _pool_timeout(pool, wait, self.url)
            if isinstance(error, Busy):
                telemetry.report.pool_exhausted(PRIMARY)
            raise error from exc
        try:
            conn.autocommit = True  # transactions are explicit: see transaction()
            yield conn
        finally:
            pool.putconn(conn)

    @contextmanager
    def transaction(
        self, conn: Connection, principal: Principal | None = None, *, write: bool = False
    ) -> Iterator[Connection]:
        """A transaction on `conn` running as the principal's role, in its knowledge base, with
        kbpg's local timeouts."""
        with conn.transaction():
            role = principal.role if principal is not None else None
            knowledge_base = principal.knowledge_base if principal is not None else None
            timeouts = self._timeouts(write)
            if role is not None or knowledge_base is not None or timeouts:
                try:
                    conn.execute(
                        queries.local_settings_text(role, tuple(timeouts.items()), knowledge_base)
                    )
                except psycopg.Error as exc:
                    if role is None or exc.sqlstate not in ("22023", "42501", "42704"):
                        raise
                    raise _role_unavailable(role, conn.info.user, exc) from exc
            yield conn

    @contextmanager
    def session(
        self,
        principal: Principal | None = None,
        *,
        write: bool = False,
        timeout: float | None = None,
    ) -> Iterator[Connection]:
        """A connection inside one transaction, as `principal`, with local timeouts.

        Committed when the block ends, rolled back when it raises. `write=True` marks calls
        that modify the knowledge base (they go to the primary, with the write timeouts).
        """
        with (
            self.connection(write=write, timeout=timeout) as conn,
            self.transaction(conn, principal, write=write),
        ):
            yield conn

    def _timeouts(self, write: bool) -> dict[str, int]:
        """The local timeouts in ms; 0 leaves the server's (or role's) own setting."""
        s = self.settings
        timeouts = {
            "statement_timeout": s.write_statement_timeout_ms if write else s.statement_timeout_ms,
            "lock_timeout": s.lock_timeout_ms,
            "idle_in_transaction_session_timeout": s.idle_in_transaction_timeout_ms,
        }
        return {name: value for name, value in timeouts.items() if value > 0}

    def pool_stats(self) -> list[PoolStats]:
        """The primary's pool (or its one connection) and each replica pool opened so far."""
        if self._pool is not None:
            primary = PoolStats.of(PRIMARY, self._pool)
        else:
            primary = PoolStats(PRIMARY, 1, 1, int(self._lock.locked()), 0)
        replicas = self._replicas.pool_stats() if self._replicas is not None else []
        return [primary, *replicas]

    def readiness(self, timeout: float = readiness.PROBE_TIMEOUT_S) -> readiness.Readiness:
        """Whether the primary and each read replica can serve, probed now.

        The primary is asked on a pooled connection, waited for at most `timeout` (busy when
        none frees: a search would wait as long); each replica on a connection of its own,
        its replay compared with the primary's WAL position (lagging past KBPG_REPLICA_MAX_LAG).
        """
        wait = min(timeout, self.settings.pool_timeout_s)
        lsn = None
        try:
            with kdb.translate_errors(), self._checkout(self._pool, wait) as conn:
                primary, lsn = readiness.primary_state(conn)
        except Busy as exc:
            primary = readiness.DatabaseState(PRIMARY, readiness.BUSY, exc.message)
        except KbpgError as exc:
            primary = readiness.DatabaseState(PRIMARY, readiness.DOWN, exc.message)
        replicas: tuple[readiness.DatabaseState, ...] = ()
        if self._replicas is not None:
            replicas = self._replicas.states(lsn, self.settings.replica_max_lag_ms / 1000)
        return readiness.Readiness(primary, replicas)

    def close(self) -> None:
        if self._replicas is not None:
            self._replicas.close()
        if self._pool is not None:
            self._pool.close()
        if self._conn is not None:
            self._conn.close()


def _role_unavailable(role: str, login: str, exc: psycopg.Error) -> RoleUnavailable:
    """SET ROLE refused: the role does not exist, or the login role is not a member of it."""
    if exc.sqlstate == "42501":
        return RoleUnavailable(
            f"login role {login!r} may not act as role {role!r}",
            hint=f'grant "{role}" to "{login}"  (as a role with CREATEROLE)',
        )
    return RoleUnavailable(
        f"role {role!r} does not exist",
        hint="create it (and grant it the reader role and to the login role), or name another",
    )


def _require_primary(conn: Connection) -> None:
    """Writes stop before any work on a hot standby (one round trip per write connection)."""
    row = conn.execute("select pg_catalog.pg_is_in_recovery()").fetchone()
    if row is not None and row[0]:
        raise ReadOnlyDatabase(
            "this server is a read-only standby: write on the primary",
            hint="point KBPG_DATABASE_URL at the primary (replicas belong in KBPG_READ_URL)",
        )


def _reset(conn: Connection | None) -> None:
    """Leave the one connection idle for the next call, as a pool does on return: a
    transaction a caller left open is rolled back, a connection mid-command is closed."""
    if conn is None or conn.closed:
        return
    status = conn.info.transaction_status
    try:
        if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            conn.rollback()
        elif status != TransactionStatus.IDLE:
            conn.close()
    except psycopg.Error:
        conn.close()


def _pool_timeout(pool: ConnectionPool, wait: float, url: str) -> KbpgError:
    """Busy when every connection exists, is in use and the database takes a new one;
    unreachable when the pool cannot grow or the database refuses connections (connections
    it broke off count in the pool until they are replaced)."""
    stats = pool.get_stats()
    if stats.get("pool_size", 0) >= stats.get("pool_max", 1):
        try:
            kdb.connect(url, autocommit=True).close()
        except DatabaseUnavailable as exc:
            return exc
        return Busy(
            f"all {stats.get('pool_max')} database connections stayed busy for {wait:g} s",
            hint="retry shortly, or give the server more connections (--pool-size)",
        )
    return DatabaseUnavailable(
        f"cannot connect to PostgreSQL: no connection within {wait:g} s",
        hint="check KBPG_DATABASE_URL and that the server is running",
    )
