"""Sources: the files an ingest reads, found under the given paths, as Documents or failures."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from kbpg.errors import IngestError, InvalidInput
from kbpg.ingest.document import Document, LoadFailure
from kbpg.ingest.limits import DEFAULT_MAX_FILE_BYTES, check_filter_name
from kbpg.ingest.loaders import SUPPORTED_SUFFIXES, iter_file
from kbpg.text import printable

__all__ = ["discover", "iter_documents", "parse_size", "printable"]

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?\s*", re.I)


def parse_size(text: str) -> int:
    """Bytes from `20MB`, `20MiB`, `1.5G`, `1048576` (k, M, G are powers of 1000; Ki, Mi, Gi of
    1024)."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise InvalidInput(f"{text!r} is not a size", hint="use e.g. 20MB, 64MiB or 1048576")
    number, prefix, binary = match.groups()
    power = " kmgt".index(prefix.lower()) if prefix else 0
    size = int(float(number) * (1024 if binary else 1000) ** power)
    if size < 1:
        raise InvalidInput(f"{text!r} is not a positive size")
    return size


def _within(real: str, roots: Sequence[str]) -> bool:
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _not_readable(path: Path) -> str | None:
    """Why `path` cannot be read as a file (None: a regular file, or a directory, which the
    caller handles): a symlink loop, a dangling symlink, a device, FIFO or socket (never opened:
    reading a FIFO blocks until a writer comes), or the error stat gave."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (too many levels of symbolic links)"
        if exc.errno == errno.ENOENT:
            if os.path.islink(path):
                return f"a dangling symlink (its target {os.readlink(path)} does not exist)"
            return "no such file or directory"
        return exc.strerror or str(exc)
    except ValueError as exc:
        return str(exc)
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "not a regular file or directory (a device, FIFO or socket)"


def _walk(root: Path, recursive: bool, follow_symlinks: bool) -> Iterator[Path | LoadFailure]:
    """Entries under `root` (files and symlinks, not descending into hidden directories),
    unreadable directories as failures; symlinked directories only with `follow_symlinks`,
    each real directory once (a link cycle is walked once)."""
    errors: list[OSError] = []
    visited: set[str] = set()
    for current, dirs, files in os.walk(root, onerror=errors.append, followlinks=follow_symlinks):
        while errors:
            error = errors.pop()
            yield LoadFailure(str(error.filename or current), error.strerror or str(error))
        real = os.path.realpath(current)
        if real in visited:
            dirs[:] = []
            continue
        visited.add(real)
        here = Path(current)
        for name in files:
            if not name.startswith("."):
                yield here / name
        kept = []
        for name in sorted(dirs):
            if name.startswith("."):
                continue
            if os.path.islink(here / name) and not follow_symlinks:
                yield here / name  # a symlinked directory: reported by the caller if it leaves
                continue
            kept.append(name)
        dirs[:] = kept if recursive else []
    while errors:
        error = errors.pop()
        yield LoadFailure(str(error.filename or root), error.strerror or str(error))


def discover(
    paths: Sequence[Path],
    *,
    recursive: bool = False,
    glob: str | None = None,
    follow_symlinks: bool = False,
) -> Iterator[Path | LoadFailure]:
    """Files to ingest, in a stable order: given files as they are, directories scanned.

    A symlink found in a directory whose target lies outside every given path is skipped and
    reported (it could expose any file the user can read) unless `follow_symlinks`; a file
    named on the command line is read wherever it points.
    """
    roots: list[str] = []
    for path in paths:
        try:
            roots.append(os.path.realpath(path))
        except (OSError, ValueError):
            continue
    for path in paths:
        try:
            exists, is_file = path.exists(), path.is_file()
        except (OSError, ValueError) as exc:
            yield LoadFailure(str(path), getattr(exc, "strerror", None) or str(exc))
            continue
        if not exists:
            # Path.exists() is False for a symlink loop and a dangling symlink too
            yield LoadFailure(str(path), _not_readable(path) or "no such file or directory")
            continue
        if is_file:
            yield path
            continue
        if not path.is_dir():  # a device, FIFO or socket: reading it could block or never end
            yield LoadFailure(
                str(path), "not a regular file or directory (a device, FIFO or socket)"
            )
            continue
        found_files: list[Path] = []
        for found in _walk(path, recursive, follow_symlinks):
            if isinstance(found, LoadFailure):
                yield found
                continue
            found_files.append(found)
        for found in sorted(found_files):
            relative = found.relative_to(path)
            if found.suffix.lower() not in SUPPORTED_SUFFIXES and not found.is_dir():
                continue
            if glob and not (
                fnmatch.fnmatch(found.name, glob) or fnmatch.fnmatch(str(relative), glob)
            ):
                continue
            if found.is_symlink() and not follow_symlinks:
                target = os.path.realpath(found)
                if not _within(target, roots):
                    yield LoadFailure(
                        str(found),
                        f"symlink to {target}, outside the paths given; skipped "
                        "(--follow-symlinks reads it)",
                    )
                    continue
            reason = _not_readable(found)
            if reason is not None:  # a FIFO `.md`, a symlink loop, a dangling link: reported
                yield LoadFailure(str(found), reason)
                continue
            if not found.is_file():  # a symlinked directory inside the roots (not followed)
                continue
            try:
                str(found).encode()
            except UnicodeEncodeError:
                yield LoadFailure(str(found), "the file name is not valid UTF-8; rename it")
                continue
            yield found


def _with_defaults(
    document: Document,
    groups: Sequence[str],
    category: str | None,
    labels: Sequence[str],
) -> Document:
    """Command-line groups and labels add to a file's own; its category wins over --category."""
    if not groups and category is None and not labels:
        return document
    return replace(
        document,
        groups=tuple(dict.fromkeys([*document.groups, *groups])),
        labels=tuple(dict.fromkeys([*document.labels, *labels])),
        category=document.category or category,
    )


def iter_documents(
    roots: Sequence[Path],
    *,
    recursive: bool = False,
    glob: str | None = None,
    groups: Sequence[str] = (),
    category: str | None = None,
    labels: Sequence[str] = (),
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    follow_symlinks: bool = False,
) -> Iterator[Document | LoadFailure]:
    """Every document in the files under `roots`, with the command line's defaults applied."""
    try:
        for value, what in [*((g, "--group") for g in groups), *((v, "--label") for v in labels)]:
            check_filter_name(value, what, "command line")
        if category is not None:
            check_filter_name(category, "--category", "command line")
    except IngestError as exc:
        raise InvalidInput(exc.message) from None
    for found in discover(roots, recursive=recursive, glob=glob, follow_symlinks=follow_symlinks):
        if isinstance(found, LoadFailure):
            yield found
            continue
        for item in iter_file(found, max_file_bytes):
            if isinstance(item, Document):
                item = _with_defaults(item, groups, category, labels)
            yield item
