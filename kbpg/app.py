"""The application object: one knowledge base's settings, database sessions and model clients,
and the search every face (CLI, HTTP, MCP, adapters) calls."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Self

from kbpg.config import Settings
from kbpg.errors import (
    DatabaseUnavailable,
    EmbeddingSpaceMismatch,
    InvalidInput,
    KbpgError,
    ReadOnlyDatabase,
    SchemaNotMigrated,
)
from kbpg.models.clients import ModelClients
from kbpg.models.embedders import Embedder, default_embedder, embedder_for_model
from kbpg.search.request import SearchRequest
from kbpg.search.results import SearchResult
from kbpg.search.run import run_search, run_search_across
from kbpg.store.language import ModelDefaults, model_defaults
from kbpg.store.readiness import Readiness
from kbpg.store.sessions import Cancellation, Connection, Database, Principal

__all__ = ["Cancellation", "KnowledgeBase", "Principal", "Retriever"]


class KnowledgeBase:
    """kbpg's application object: owns the settings, the database (`db`: pool, replicas,
    sessions per principal) and the model clients (`models`: embedder, reranker, chat model).

    The use cases in kbpg.search and kbpg.ingest take `kb.db` and `kb.models`; `search()` is
    the one most callers want. Thread-safe; use as a context manager or call close().
    """

    def __init__(
        self,
        url: str | None = None,
        embedder: Embedder | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
        embedder_name: str | None = None,
        kb: str | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        if kb is not None:  # over KBPG_KB: the knowledge base this object works in
            self.settings = dataclasses.replace(self.settings, knowledge_base=kb)
        self.db = Database(self.settings, url, pool_size=pool_size)
        self.url = self.db.url
        self.models = ModelClients(
            self.settings, embedder, embedder_name, default_embedder=self.default_embedder_name
        )
        if embedder is None:
            # which model, read now: later a caller may hold the pool's only connection. A
            # database that cannot say (down, no privilege) is asked again when a model is needed,
            # and that call says why; a command that embeds nothing never asks.
            with contextlib.suppress(KbpgError):
                self.models.embedder_name()

    def model_defaults(self) -> ModelDefaults:
        """kb.model_defaults(): the recorded model, the language, the default vector weight,
        from the primary (a read replica may lag a reembed; nor is it a search to count)."""
        try:
            with self.db.connection(write=True) as conn:
                return model_defaults(conn)
        except ReadOnlyDatabase:  # kbpg pointed at a standby alone
            with self.db.connection() as conn:
                return model_defaults(conn)

    def default_embedder_name(self) -> str:
        """The embedder when none is named (--embedder, KBPG_EMBEDDER): the one of the model
        the knowledge base records, else its language's default (MiniLM for English, the
        multilingual model otherwise). A database without kbpg's schema yet is English."""
        try:
            defaults = self.model_defaults()
        except SchemaNotMigrated:
            return default_embedder(english=True)
        if defaults.model is None:
            return default_embedder(defaults.english)
        name = embedder_for_model(defaults.model)
        if name == "openai" and self.settings.openai_model != defaults.model:
            raise EmbeddingSpaceMismatch(
                f"embedding space mismatch: this knowledge base holds {defaults.model} vectors, "
                f"a model kbpg does not carry",
                hint=f"serve it with an OpenAI-compatible server (KBPG_OPENAI_MODEL="
                f"{defaults.model}, KBPG_OPENAI_BASE_URL), or run `kbpg reembed --embedder "
                f"{default_embedder(defaults.english)}` to rebuild it offline",
            )
        return name

    @classmethod
    def from_env(
        cls,
        settings: Settings | None = None,
        *,
        url: str | None = None,
        embedder: str | None = None,
        pool_size: int = 4,
    ) -> Self:
        """A knowledge base on `url` (default: KBPG_DATABASE_URL, else the embedded server), the
        other settings from the environment, model loaded now."""
        kb = cls(url, settings=settings, pool_size=pool_size, embedder_name=embedder)
        try:
            kb.embedder  # noqa: B018 - load now, so that search timings do not include it
        except DatabaseUnavailable:
            pass  # which model the knowledge base records is read once it answers
        except BaseException:
            kb.close()
            raise
        return kb

    @property
    def embedder(self) -> Embedder:
        """The query and document model (the one given, --embedder, KBPG_EMBEDDER, else the
        knowledge base's recorded model, else its language's default), loaded on first use."""
        return self.models.embedder

    # -- sessions, for callers that run their own SQL (kbpg.store.sessions.Database's) ------

    def session(
        self,
        principal: Principal | None = None,
        *,
        write: bool = False,
        timeout: float | None = None,
    ) -> AbstractContextManager[Connection]:
        """A connection inside one transaction, as `principal`, with kbpg's local timeouts."""
        return self.db.session(principal, write=write, timeout=timeout)

    def connection(
        self, *, write: bool = False, timeout: float | None = None
    ) -> AbstractContextManager[Connection]:
        """A connection of the call's own, in autocommit (see Database.connection)."""
        return self.db.connection(write=write, timeout=timeout)

    def transaction(
        self, conn: Connection, principal: Principal | None = None, *, write: bool = False
    ) -> AbstractContextManager[Connection]:
        """A transaction on `conn` as the principal's role, with kbpg's local timeouts."""
        return self.db.transaction(conn, principal, write=write)

    def close(self) -> None:
        self.db.close()

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
        knowledge_bases: Sequence[str] | None = None,
        **options: Any,
    ) -> SearchResult:
        """The best chunks for `query`, ranked by kb.search; options are SearchRequest's fields.

        `top` defaults to KBPG_DEFAULT_MAX_CHUNKS; pass a SearchRequest instead of a string to
        reuse a validated request. `cancel` lets another thread stop the call's statement.
        `knowledge_bases`: search those instead of this object's (one: as if it were this
        object's; several: one ranking across them, kb.search_knowledge_bases, each chunk's
        `knowledge_base` saying where it comes from).
        """
        if isinstance(query, SearchRequest):
            if options:
                raise TypeError("pass options inside the SearchRequest, not beside it")
            request = query
        else:
            request = SearchRequest(query, **options)
        if knowledge_bases is not None:
            if isinstance(knowledge_bases, str) or not knowledge_bases:
                raise InvalidInput(
                    "knowledge_bases must be a non-empty list of names",
                    hint='for example ["handbook", "faq"]',
                )
            if len(set(knowledge_bases)) > 1:
                return run_search_across(
                    self.db, self.models, request, knowledge_bases, principal, cancel
                )
            principal = dataclasses.replace(
                principal or Principal(), knowledge_base=knowledge_bases[0]
            )
        return run_search(self.db, self.models, request, principal, cancel)

    def warm_up(self) -> None:
        """Run the model once so that the first real query does not pay for lazy set-up (not
        while the database, which says which model, does not answer)."""
        try:
            embedder = self.embedder
        except DatabaseUnavailable:
            return
        embedder.embed_query("warm up")

    def model_name(self) -> str | None:
        """The embedding model's name; None while the database, which records it, is down."""
        try:
            return self.embedder.model_name
        except DatabaseUnavailable:
            return None

    def readiness(self) -> Readiness:
        """The primary's and each read replica's state (ok, busy, down, unmigrated, lagging),
        probed now: what /readyz reports."""
        return self.db.readiness()

    def health(self) -> dict[str, Any]:
        """`readiness()` as a dict, with the model and the reasons: `{"ok", "model",
        "primary": {"database", "status", "detail"?, "schema", ...}, "replicas": [...]}`."""
        ready = self.readiness()
        return {
            "ok": ready.ok,
            "model": self.model_name(),
            "primary": ready.primary.as_dict(),
            "replicas": [r.as_dict() for r in ready.replicas],
        }


class Retriever(KnowledgeBase):
    """The documentation's name for the application object (kbpg.app.KnowledgeBase).

    `with Retriever.from_env() as kb: kb.search("...", top=8, groups=[...])`.
    """
