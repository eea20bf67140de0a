"""Settings from the environment, with kbpg's defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kbpg.errors import ConfigError

DEFAULT_MAX_CHUNKS = 8
CLI_DEFAULT_TOP = 5


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean", hint="use true or false")


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


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
    embedder: str
    default_max_chunks: int
    lexical_enabled: bool
    openai_base_url: str
    openai_model: str
    openai_api_key: str | None = field(repr=False)
    api_token: str | None = field(repr=False)

    @classmethod
    def from_env(cls) -> Settings:
        home = os.environ.get("KBPG_HOME")
        return cls(
            database_url=os.environ.get("KBPG_DATABASE_URL") or None,
            home=Path(home).expanduser().resolve() if home else default_home(),
            embedder=os.environ.get("KBPG_EMBEDDER", "minilm").strip() or "minilm",
            default_max_chunks=_env_int("KBPG_DEFAULT_MAX_CHUNKS", DEFAULT_MAX_CHUNKS),
            lexical_enabled=_env_bool("KBPG_HYBRID_LEXICAL_ENABLED", True),
            openai_base_url=os.environ.get("KBPG_OPENAI_BASE_URL", "https://api.openai.com/v1"),
            openai_model=os.environ.get("KBPG_OPENAI_MODEL", "text-embedding-3-small"),
            openai_api_key=os.environ.get("KBPG_OPENAI_API_KEY")
            or os.environ.get("OPENAI_API_KEY"),
            api_token=os.environ.get("KBPG_API_TOKEN") or None,
        )
