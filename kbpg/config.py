"""Settings from the environment, with kbpg's defaults."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from kbpg.errors import ConfigError

# the knowledge base every database has (revision 0028): what a call without --kb / KBPG_KB uses
DEFAULT_KNOWLEDGE_BASE = "default"

DEFAULT_MAX_CHUNKS = 8
CLI_DEFAULT_TOP = 5
# Per-transaction limits applied by KnowledgeBase.session (milliseconds; 0 = the server's).
STATEMENT_TIMEOUT_MS = 30_000
WRITE_STATEMENT_TIMEOUT_MS = 0  # ingest batches and reembed on big corpora run for minutes
LOCK_TIMEOUT_MS = 10_000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 300_000
POOL_TIMEOUT_MS = 10_000
# a read replica behind its primary and without a replayed transaction this long is "lagging"
REPLICA_MAX_LAG_MS = 30_000
# A second writer (ingest, delete, reembed) waits this long for the first one, then gives up:
# long enough for a small ingest to finish, short enough that a cron job does not pile up.
WRITE_LOCK_WAIT_MS = 60_000


def _env(name: str) -> str | None:
    """The variable's value, stripped; None when unset or blank (the default applies)."""
    raw = os.environ.get(name)
    return raw.strip() if raw is not None and raw.strip() else None


def _env_bool(name: str, default: bool) -> bool:
    raw = _env(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean", hint="use true or false")


def _env_int(name: str, default: int, minimum: int = 1, maximum: int | None = None) -> int:
    value = _env_number(name, default, int, "an integer")
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} must be at most {maximum}")
    return int(value)


def _env_float(name: str, default: float) -> float:
    value = _env_number(name, default, float, "a number")
    if not value > 0:
        raise ConfigError(f"{name}={value} must be positive")
    return value


def _env_number(name: str, default: float, parse: type[float] | type[int], kind: str) -> float:
    raw = _env(name)
    if raw is None:
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not {kind}") from None


_DURATION = re.compile(r"(\d+)\s*(ms|s|min|h)?")
_UNIT_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}


def parse_duration_ms(raw: str, name: str, minimum: int = 0) -> int:
    """A duration in PostgreSQL's spelling (`30s`, `500ms`, `2min`; a bare number is ms)."""
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise ConfigError(f"{name}={raw!r} is not a duration", hint="use e.g. 30s, 500ms, 2min")
    value = int(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum} ms")
    return value


def _env_duration_ms(name: str, default: int, minimum: int = 0) -> int:
    raw = _env(name)
    return default if raw is None else parse_duration_ms(raw, name, minimum)


# libpq URLs may hold commas themselves (postgresql://h1,h2/db): split before a scheme only
def _env_url(name: str) -> str | None:
    """A database URL variable; bytes that are not UTF-8 (os.environ keeps them as lone
    surrogates) are a ConfigError, not a UnicodeEncodeError deep in the driver."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"{name} holds bytes that are not UTF-8",
            hint="percent-encode them in the URL (e.g. %C3%A9 for é) or set the variable as UTF-8",
        ) from None
    return raw


_URL_SEPARATOR = re.compile(r"\s*,\s*(?=postgres(?:ql)?://)")


def parse_read_urls(value: str | None) -> tuple[str, ...]:
    """KBPG_READ_URL: one or more PostgreSQL URLs, comma-separated."""
    if value is None or not value.strip():
        return ()
    return tuple(url.strip() for url in _URL_SEPARATOR.split(value.strip()) if url.strip())


def default_home() -> Path:
    """Where the embedded server keeps its data when KBPG_HOME is unset.

    Running as root, the data dir never goes under /root: the server runs as an unprivileged
    user that would need root's home opened up to reach it.
    """
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/kbpg")
    import platformdirs

    return Path(platformdirs.user_data_dir("kbpg", appauthor=False))


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    home: Path
    # KBPG_EMBEDDER; None: the knowledge base's recorded model, else its language's default
    embedder: str | None
    default_max_chunks: int
    lexical_enabled: bool
    openai_base_url: str
    openai_model: str
    openai_api_key: str | None = field(repr=False)
    api_token: str | None = field(repr=False)
    models: ModelSettings = field(default_factory=lambda: ModelSettings())
    statement_timeout_ms: int = STATEMENT_TIMEOUT_MS
    write_statement_timeout_ms: int = WRITE_STATEMENT_TIMEOUT_MS
    lock_timeout_ms: int = LOCK_TIMEOUT_MS
    idle_in_transaction_timeout_ms: int = IDLE_IN_TRANSACTION_TIMEOUT_MS
    pool_timeout_s: float = POOL_TIMEOUT_MS / 1000
    # read replicas of database_url (KBPG_READ_URL): searches go there, writes never
    read_urls: tuple[str, ...] = ()
    write_lock_wait_ms: int = WRITE_LOCK_WAIT_MS
    replica_max_lag_ms: int = REPLICA_MAX_LAG_MS
    # KBPG_LANGUAGE: the language `kbpg db upgrade` gives the knowledge base (and ingest checks)
    language: str | None = None
    # KBPG_KB (--kb): the knowledge base every call works in (kbpg kb create makes others)
    knowledge_base: str = DEFAULT_KNOWLEDGE_BASE

    @classmethod
    def from_env(cls) -> Settings:
        home = os.environ.get("KBPG_HOME")
        return cls(
            database_url=_env_url("KBPG_DATABASE_URL") or None,
            home=Path(home).expanduser().resolve() if home else default_home(),
            embedder=_env("KBPG_EMBEDDER"),
            default_max_chunks=_env_int("KBPG_DEFAULT_MAX_CHUNKS", DEFAULT_MAX_CHUNKS),
            lexical_enabled=_env_bool("KBPG_HYBRID_LEXICAL_ENABLED", True),
            openai_base_url=os.environ.get("KBPG_OPENAI_BASE_URL", "https://api.openai.com/v1"),
            openai_model=os.environ.get("KBPG_OPENAI_MODEL", "text-embedding-3-small"),
            openai_api_key=os.environ.get("KBPG_OPENAI_API_KEY")
            or os.environ.get("OPENAI_API_KEY"),
            api_token=os.environ.get("KBPG_API_TOKEN") or None,
            models=ModelSettings.from_env(),
            statement_timeout_ms=_env_duration_ms("KBPG_STATEMENT_TIMEOUT", STATEMENT_TIMEOUT_MS),
            write_statement_timeout_ms=_env_duration_ms(
                "KBPG_WRITE_STATEMENT_TIMEOUT", WRITE_STATEMENT_TIMEOUT_MS
            ),
            lock_timeout_ms=_env_duration_ms("KBPG_LOCK_TIMEOUT", LOCK_TIMEOUT_MS),
            idle_in_transaction_timeout_ms=_env_duration_ms(
                "KBPG_IDLE_IN_TRANSACTION_TIMEOUT", IDLE_IN_TRANSACTION_TIMEOUT_MS
            ),
            pool_timeout_s=_env_duration_ms("KBPG_POOL_TIMEOUT", POOL_TIMEOUT_MS, minimum=1) / 1000,
            read_urls=parse_read_urls(_env_url("KBPG_READ_URL")),
            write_lock_wait_ms=_env_duration_ms("KBPG_WRITE_LOCK_WAIT", WRITE_LOCK_WAIT_MS),
            replica_max_lag_ms=_env_duration_ms("KBPG_REPLICA_MAX_LAG", REPLICA_MAX_LAG_MS),
            language=_env("KBPG_LANGUAGE"),
            knowledge_base=_env("KBPG_KB") or DEFAULT_KNOWLEDGE_BASE,
        )


RERANKERS = ("none", "api", "tei", "llm")


@dataclass(frozen=True)
class ModelSettings:
    """The optional model stages: reranker, chat model (LLM reranking, query expansion).

    KBPG_RERANK picks the reranker and turns reranking on by default (none: off);
    KBPG_EXPAND turns query expansion on by default. Per request, `rerank` / `expand`
    override both. KBPG_CONTEXTUAL: `kbpg ingest` writes chunk contexts by default.
    """

    rerank: str = "none"
    rerank_url: str = ""
    rerank_model: str = ""
    rerank_api_key: str | None = field(default=None, repr=False)
    rerank_timeout_s: float = 10.0
    rerank_initial_k: int = 20
    rerank_max_chars: int = 2000
    chat_base_url: str = ""
    chat_model: str = ""
    chat_api_key: str | None = field(default=None, repr=False)
    chat_timeout_s: float = 30.0
    connect_timeout_s: float = 3.0
    retries: int = 1
    expand: bool = False
    expand_count: int = 3
    contextual: bool = False

    @classmethod
    def from_env(cls) -> ModelSettings:
        rerank = os.environ.get("KBPG_RERANK", "none").strip().lower() or "none"
        if rerank not in RERANKERS:
            raise ConfigError(
                f"KBPG_RERANK={rerank!r} is not a reranker",
                hint=f"use one of {', '.join(RERANKERS)}",
            )
        return cls(
            rerank=rerank,
            rerank_url=os.environ.get("KBPG_RERANK_URL", "").strip(),
            rerank_model=os.environ.get("KBPG_RERANK_MODEL", "").strip(),
            rerank_api_key=os.environ.get("KBPG_RERANK_API_KEY") or None,
            rerank_timeout_s=_env_float("KBPG_RERANK_TIMEOUT", 10.0),
            rerank_initial_k=_env_int("KBPG_RERANK_INITIAL_K", 20),
            rerank_max_chars=_env_int("KBPG_RERANK_MAX_CHARS", 2000, minimum=100),
            chat_base_url=os.environ.get("KBPG_CHAT_BASE_URL", "").strip(),
            chat_model=os.environ.get("KBPG_CHAT_MODEL", "").strip(),
            chat_api_key=os.environ.get("KBPG_CHAT_API_KEY") or None,
            chat_timeout_s=_env_float("KBPG_CHAT_TIMEOUT", 30.0),
            connect_timeout_s=_env_float("KBPG_MODEL_CONNECT_TIMEOUT", 3.0),
            retries=_env_int("KBPG_MODEL_RETRIES", 1, minimum=0),
            expand=_env_bool("KBPG_EXPAND", False),
            # each paraphrase is one more scan of the vector index: kb.search takes at most 8
            expand_count=_env_int("KBPG_EXPAND_COUNT", 3, maximum=8),
            contextual=_env_bool("KBPG_CONTEXTUAL", False),
        )
