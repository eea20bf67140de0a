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


class InvalidInput(KbpgError):
    """Bad input rejected by kbpg or by the SQL functions (SQLSTATE 22xxx and friends)."""


class EmbeddingSpaceMismatch(KbpgError):
    """Vectors from another model or dimension than the database's embedding space."""


class QueryTooLarge(InvalidInput):
    """A query over kbpg's documented cost bound (SQLSTATE KB003)."""


class ModelError(KbpgError):
    """A model server (embedding, reranker, chat) failed, timed out or answered nonsense."""


class EmbeddingError(ModelError):
    """The embedding model or server failed."""


class IngestError(KbpgError):
    """A source could not be read or ingested."""


# SQLSTATE classes / codes that mean "the schema is not there".
_UNDEFINED_OBJECT_STATES = {"3F000", "42P01", "42883", "42704"}

# kbpg's own conditions (class KB), raised by the sql/ functions with a hint.
_KB_STATES: dict[str, type[KbpgError]] = {
    "KB001": EmbeddingSpaceMismatch,  # query or model vectors of another embedding space
    "KB002": EmbeddingSpaceMismatch,  # no embedding space recorded yet (no vectors)
    "KB003": QueryTooLarge,  # over the documented query cost bound
}


def from_psycopg(exc: psycopg.Error) -> KbpgError:
    """Translate a psycopg error into the matching KbpgError, keeping the server's hint."""
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
    if state.startswith("08") or state in {"57P01", "57P02", "57P03", "53300"}:
        return DatabaseUnavailable(f"database unavailable: {message}", hint=hint)
    if state in _UNDEFINED_OBJECT_STATES and ("kb." in message or '"kb"' in message):
        return SchemaNotMigrated(f"kbpg schema missing: {message}", hint="run `kbpg db upgrade`")
    if state in _KB_STATES:
        return _KB_STATES[state](message, hint=hint)
    if state.startswith("22") or state in {"42704", "23514"}:
        return InvalidInput(message, hint=hint)
    return KbpgError(message, hint=hint)


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text
