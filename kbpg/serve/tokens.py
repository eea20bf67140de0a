"""API tokens of `kbpg serve`: sha256 hashes mapped to database roles, in a file an operator edits.

One line per token: `<sha256 hex of the token> <role> [# comment]`. The role is the PostgreSQL
role the token's searches run as (`SET LOCAL ROLE`, so row-level security decides what it
sees); `-` runs as the server's own login role. The file holds hashes only: a stolen copy
does not let anyone in. `kbpg token new ROLE --file F` appends a fresh token's line and prints
the token once.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from kbpg.errors import ConfigError
from kbpg.store.sessions import Principal

OWN_ROLE = "-"
_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class TokenEntry:
    """One accepted token: the sha256 digest of the token and who its requests run as."""

    digest: bytes
    principal: Principal
    line: int = 0


def hash_token(token: str) -> str:
    """The sha256 hex digest a tokens file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A random token (256 bits, URL-safe)."""
    return "kbpg_" + secrets.token_urlsafe(32)


def token_line(token: str, role: str, comment: str = "") -> str:
    """The tokens-file line for `token` mapped to `role`."""
    parse_role(role, "role")
    note = " ".join(comment.split())
    return f"{hash_token(token)} {role}" + (f"  # {note}" if note else "")


def parse_role(role: str, where: str) -> Principal:
    if role == OWN_ROLE:
        return Principal(None)
    if not role or "\x00" in role or any(c.isspace() for c in role):
        raise ConfigError(f"{where}: {role!r} is not a role name")
    return Principal(role)


def parse_tokens(text: str, where: str) -> tuple[TokenEntry, ...]:
    """The entries of a tokens file; ConfigError naming the line of the first bad one."""
    entries: list[TokenEntry] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        here = f"{where}:{number}"
        if len(fields) != 2:
            raise ConfigError(
                f"{here}: expected `<sha256 hex> <role>`, got {len(fields)} fields",
                hint="`kbpg token new ROLE --file FILE` writes a correct line",
            )
        digest, role = fields[0].lower(), fields[1]
        if not _HEX.fullmatch(digest):
            raise ConfigError(
                f"{here}: the first field is not a sha256 hex digest (64 hex digits)",
                hint="store the token's hash, never the token: `kbpg token hash`",
            )
        if digest in seen:
            raise ConfigError(f"{here}: the same token hash is listed twice")
        seen.add(digest)
        entries.append(TokenEntry(bytes.fromhex(digest), parse_role(role, here), number))
    return tuple(entries)


def read_tokens(path: Path) -> tuple[TokenEntry, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the tokens file {path}: {exc}") from None
    return parse_tokens(text, str(path))


class Tokens:
    """The tokens a server accepts: KBPG_API_TOKEN (the server's own role) and a tokens file.

    The file is re-read when its modification time changes, so adding or removing a line takes
    effect on the next request; a file that became invalid keeps the previous entries (and the
    error is returned by `reload` for the log).
    """

    def __init__(self, single: str | None = None, path: Path | None = None) -> None:
        self.path = path
        self._single = (
            TokenEntry(hashlib.sha256(single.encode()).digest(), Principal(None))
            if single
            else None
        )
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: tuple[TokenEntry, ...] = ()
        if path is not None:
            self._entries = read_tokens(path)
            self._stamp = _stamp(path)

    @property
    def enabled(self) -> bool:
        """True when requests need a token (one is configured, or a tokens file is given)."""
        return self._single is not None or self.path is not None

    def reload(self) -> ConfigError | None:
        """Re-read the file if it changed; the error when the new content is invalid."""
        if self.path is None:
            return None
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return None
        with self._lock:
            self._stamp = stamp
            try:
                self._entries = read_tokens(self.path) if stamp is not None else ()
            except ConfigError as exc:
                return exc
        return None

    def lookup(self, token: bytes) -> Principal | None:
        """Who a presented token runs as, or None when no token matches.

        Every entry is compared (constant time per entry, no early exit), so the time taken
        does not depend on which entry matches.
        """
        digest = hashlib.sha256(token).digest()
        found: Principal | None = None
        candidates = [*self._entries, *([self._single] if self._single else [])]
        for entry in candidates:
            if hmac.compare_digest(digest, entry.digest) and found is None:
                found = entry.principal
        return found


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size
