"""The application object: settings, connections, the embedder and model clients; one session per call."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from kbpg.config import ModelSettings, Settings
from kbpg.errors import (
    Busy,
    ConfigError,
    DatabaseUnavailable,
    InvalidInput,
    KbpgError,
    QueryTimeout,
    ReadOnlyDatabase,
    StageUnavailable,
)
from kbpg.search.request import SearchRequest
from kbpg.search.stages import ExpansionCache
from kbpg.store import db as kdb
from kbpg.store import queries
from kbpg.store.replicas import ReadReplicas

if TYPE_CHECKING:
    from kbpg.models import ChatClient, Reranker
    from kbpg.models.embedders import Embedder
    from kbpg.search.run import SearchResult

Connection = psycopg.Connection[Any]
log = logging.getLogger("kbpg")


@dataclass(frozen=True)
class Principal:
    """Who a call runs as: a PostgreSQL role the connecting user may SET ROLE to (None: itself)."""

    role: str | None = None

    def __post_init__(self) -> None:
        if self.role is not None and (
            not isinstance(self.role, str) or not self.role or "\x00" in self.role
        ):
            raise InvalidInput(f"not a role name: {self.role!r}")


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


class ModelClients:
    """The model stages beside the embedder (reranker, chat model), built from the settings
    on first use, and the query-expansion cache they share across requests."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.expansions = ExpansionCache()
        self._lock = threading.Lock()
        self._reranker: Reranker | None = None
        self._chat: ChatClient | None = None

    def reranker(self) -> Reranker:
        """The reranker KBPG_RERANK names; ConfigError when it is `none`."""
        from kbpg.models import make_reranker

        with self._lock:
            if self._reranker is None:
                reranker = make_reranker(self.settings)
                if reranker is None:
                    raise StageUnavailable(
                        "reranking was asked for, but no reranker is configured",
                        hint="set KBPG_RERANK to api, tei or llm (and KBPG_RERANK_URL / "
                        "KBPG_RERANK_MODEL or KBPG_CHAT_*), or search without --rerank",
                    )
                self._reranker = reranker
            return self._reranker

    def chat(self) -> ChatClient:
        """The chat model of KBPG_CHAT_BASE_URL / KBPG_CHAT_MODEL (query expansion, context)."""
        from kbpg.models import make_chat

        with self._lock:
            if self._chat is None:
                try:
                    self._chat = make_chat(self.settings)
                except ConfigError as exc:
                    raise StageUnavailable(exc.message, hint=exc.hint) from None
            return self._chat


class KnowledgeBase:
    """kbpg's application object: owns settings, connections, the embedder and model clients.

    Every database call runs in `session()` (or `connection()` + `transaction()` for jobs that
    commit in batches), which applies the caller's role and kbpg's timeouts. `pool_size=1`
    keeps one connection (a one-shot CLI); larger sizes open a pool shared by threads.
    Thread-safe; use as a context manager or call close().
    """

    def __init__(
        self,
        url: str | None = None,
        embedder: Embedder | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
        embedder_name: str | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.url = url or kdb.resolve_url(self.settings)
        self.models = ModelClients(self.settings.models)
        self._embedder = embedder
        self._embedder_name = embedder_name
        self._embedder_lock = threading.Lock()
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._pool: ConnectionPool | None = None
        # KBPG_READ_URL replicates KBPG_DATABASE_URL, not a database given here (kbpg eval's)
        self._replicas: ReadReplicas | None = None
        if self.settings.read_urls and (url is None or url == self.settings.database_url):
            self._replicas = ReadReplicas(self.settings.read_urls, pool_size=pool_size)
        # Fails fast when the database is down (a pool would keep retrying until its timeout).
        probe = kdb.connect(self.url, autocommit=True)
        if pool_size <= 1:
            self._conn = probe
        else:
            probe.close()
            self._pool = kdb.create_pool(self.url, min_size=1, max_size=pool_size)

    @classmethod
    def from_env(
        cls, settings: Settings | None = None, *, embedder: str | None = None, pool_size: int = 4
    ) -> Self:
        """A knowledge base on KBPG_DATABASE_URL (or the embedded server), model loaded now."""
        kb = cls(settings=settings, pool_size=pool_size, embedder_name=embedder)
        try:
            kb.embedder  # noqa: B018 - load now, so that search timings do not include it
        except BaseException:
            kb.close()
            raise
        return kb

    @property
    def embedder(self) -> Embedder:
        """The query and document model (KBPG_EMBEDDER unless given), loaded on first use."""
        with self._embedder_lock:
            if self._embedder is None:
                from kbpg.models.embedders import get_embedder

                embedder = get_embedder(self.settings, self._embedder_name)
                load = getattr(embedder, "load", None)
                if callable(load):
                    load()
                self._embedder = embedder
            return self._embedder

    def document_embedder(self) -> Embedder:
        """The model as ingest uses it: loaded by its first use, so that a load whose records
        all carry their vectors neither runs nor holds it (MiniLM: ~200 MB of RSS)."""
        with self._embedder_lock:
            if self._embedder is not None:
                return self._embedder
        from kbpg.models.embedders import get_embedder

        return get_embedder(self.settings, self._embedder_name)  # the one `embedder` loads

    # -- connections and sessions ----------------------------------------------------------

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
            yield conn

    @contextmanager
    def _checkout(self, pool: ConnectionPool | None, wait: float) -> Iterator[Connection]:
        if pool is None:
            if not self._lock.acquire(timeout=wait):
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
            raise _pool_timeout(pool, wait) from exc
        try:
            conn.autocommit = True  # transactions are explicit: see transaction()
            yield conn
        finally:
            pool.putconn(conn)

    @contextmanager
    def transaction(
        self, conn: Connection, principal: Principal | None = None, *, write: bool = False
    ) -> Iterator[Connection]:
        """A transaction on `conn` running as the principal's role, with kbpg's local timeouts."""
        with conn.transaction():
            role = principal.role if principal is not None else None
            timeouts = self._timeouts(write)
            if role is not None or timeouts:
                conn.execute(queries.local_settings(role, timeouts))
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

    def close(self) -> None:
        if self._replicas is not None:
            self._replicas.close()
        if self._pool is not None:
            self._pool.close()
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- search and health -----------------------------------------------------------------

    def search(
        self,
        query: str | SearchRequest,
        /,
        *,
        principal: Principal | None = None,
        cancel: Cancellation | None = None,
        **options: Any,
    ) -> SearchResult:
        """The best chunks for `query`, ranked by kb.search; options are SearchRequest's fields.

        `top` defaults to KBPG_DEFAULT_MAX_CHUNKS; pass a SearchRequest instead of a string to
        reuse a validated request. `cancel` lets another thread stop the call's statement.
        """
        from kbpg.search.run import run_search

        if isinstance(query, SearchRequest):
            if options:
                raise TypeError("pass options inside the SearchRequest, not beside it")
            request = query
        else:
            request = SearchRequest(query, **options)
        return run_search(self, request, principal, cancel)

    def warm_up(self) -> None:
        """Run the model once so that the first real query does not pay for lazy set-up."""
        self.embedder.embed_query("warm up")

    def health(self) -> dict[str, Any]:
        """Database reachable, schema at head, model loaded — what /healthz reports."""
        report: dict[str, Any] = {
            "database": "ok",
            "schema": "ok",
            "model": self.embedder.model_name,
        }
        try:
            with self.session(timeout=3.0) as conn:
                status = kdb.schema_status(conn)
            if not status.at_head:
                report["schema"] = f"at {status.current or 'none'}, head is {status.head}"
        except KbpgError as exc:
            report["database"] = exc.message
            report["schema"] = "unknown"
        report["ok"] = report["database"] == "ok" and report["schema"] == "ok"
        return report


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


def _pool_timeout(pool: ConnectionPool, wait: float) -> KbpgError:
    """Busy when every connection exists and is in use; unreachable when the pool cannot grow."""
    stats = pool.get_stats()
    if stats.get("pool_size", 0) >= stats.get("pool_max", 1):
        return Busy(
            f"all {stats.get('pool_max')} database connections stayed busy for {wait:g} s",
            hint="retry shortly, or give the server more connections (--pool-size)",
        )
    return DatabaseUnavailable(
        f"cannot connect to PostgreSQL: no connection within {wait:g} s",
        hint="check KBPG_DATABASE_URL and that the server is running",
    )
