"""One error hierarchy for kbpg, mapped from SQLSTATEs in one place."""

from __future__ import annotations

import psycopg


class KbpgError(Exception):
    """Base of every error kbpg raises on purpose; `hint` says what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(KbpgError):
    """A setting is missing or malformed."""


class DatabaseUnavailable(KbpgError):
    """The database cannot be reached."""


class SchemaNotMigrated(KbpgError):
    """The database is reachable but kbpg's schema is missing or not at head."""


class ServerError(KbpgError):
    """The embedded PostgreSQL server could not be started, stopped or inspected."""


class Busy(KbpgError):
    """Every pooled database connection is in use: retry shortly."""


class InvalidInput(KbpgError):
    """Bad input rejected by kbpg or by the SQL functions (SQLSTATE 22xxx and friends)."""


class EmbeddingSpaceMismatch(KbpgError):
    """Vectors from another model or dimension than the database's embedding space."""


class QueryTooLarge(InvalidInput):
    """A query over kbpg's documented cost bound (SQLSTATE KB003)."""


class StageUnavailable(ConfigError):
    """A request asked for a model stage (rerank, expand) this installation has no model for."""


class ModelError(KbpgError):
    """A model server (embedding, reranker, chat) failed, timed out or answered nonsense."""

    # The server answered and refused this request's input (HTTP 400, 413, 422): the input, not
    # the server, is at fault; sending the same input again will not help.
    refused: bool = False


class EmbeddingError(ModelError):
    """The embedding model or server failed."""


class IngestError(KbpgError):
    """A source could not be read or ingested."""


class EmptyDocument(IngestError):
    """A source holds no text to index (a page that is only an iframe): skipped with a warning,
    not a failure, unless the ingest is strict."""


class NotFound(KbpgError):
    """The thing asked for does not exist (or the caller may not see it)."""


class PermissionDenied(KbpgError):
    """The role a call runs as lacks a privilege (SQLSTATE 42501)."""


class RoleUnavailable(PermissionDenied):
    """The role a call is to run as cannot be used: it does not exist, or the connecting login
    role may not SET ROLE to it (a server's configuration, not the caller's request)."""


class ReadOnlyDatabase(KbpgError):
    """A write reached a read-only server, typically a hot standby (SQLSTATE 25006)."""


class QueryTimeout(KbpgError):
    """A statement ran past its statement_timeout, or was cancelled (SQLSTATE 57014)."""


# kbpg's own conditions (class KB, raised by the sql/ functions with a hint) and the standard
# SQLSTATEs kbpg gives a class of their own. Mapped by code only, never by message text.
_BY_STATE: dict[str, type[KbpgError]] = {
    "KB001": EmbeddingSpaceMismatch,  # query or model vectors of another embedding space
    "KB002": EmbeddingSpaceMismatch,  # no embedding space recorded yet (no vectors)
    "KB003": QueryTooLarge,  # over the documented query cost bound
    "KB004": InvalidInput,  # a metadata filter kb._metadata_jsonpath cannot read
    "KB010": NotFound,  # a table source's table was dropped
    "KB011": NotFound,  # no knowledge base of that name
    "42501": PermissionDenied,
    "25006": ReadOnlyDatabase,
    "57014": QueryTimeout,
}
_SCHEMA_MISSING_STATES = {"3F000", "42P01", "42883"}  # no schema / table / function
_UNAVAILABLE_STATES = {"57P01", "57P02", "57P03", "53300"}  # shutdown, starting, too many
_INVALID_STATES = {"42704", "23514"}  # undefined object (e.g. a text search config), check
_HINTS = {
    ReadOnlyDatabase: "this server is a read-only standby: write on the primary",
    QueryTimeout: "the statement ran past KBPG_STATEMENT_TIMEOUT; narrow the query or raise it",
    PermissionDenied: "grant the role the privilege, or run as a role that has it",
}


def from_psycopg(exc: psycopg.Error) -> KbpgError:
    """Translate a psycopg error into the matching KbpgError by SQLSTATE, keeping the hint."""
    diag = getattr(exc, "diag", None)
    state = getattr(exc, "sqlstate", None) or ""
    message = (diag.message_primary if diag is not None else None) or str(exc).strip()
    hint = diag.message_hint if diag is not None else None
    if isinstance(exc, psycopg.OperationalError) and not state:
        return DatabaseUnavailable(
            f"cannot connect to PostgreSQL: {first_line(str(exc))}",
            hint="check KBPG_DATABASE_URL, or unset it to use the embedded server "
            "(`kbpg db start`)",
        )
    if state.startswith("08") or state in _UNAVAILABLE_STATES:
        return DatabaseUnavailable(f"database unavailable: {message}", hint=hint)
    if state in _SCHEMA_MISSING_STATES:
        return SchemaNotMigrated(f"kbpg schema missing: {message}", hint="run `kbpg db upgrade`")
    kind = _BY_STATE.get(state)
    if kind is not None:
        return kind(message, hint=hint or _HINTS.get(kind))
    if state.startswith("22") or state in _INVALID_STATES:
        return InvalidInput(message, hint=hint)
    return KbpgError(message, hint=hint)


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text
