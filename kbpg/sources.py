"""Sources: the files an ingest reads, found under the given paths, as Documents or failures."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from kbpg.loaders import SUPPORTED_SUFFIXES, Document, LoadFailure, iter_file

__all__ = ["discover", "iter_documents"]


def discover(
    paths: Sequence[Path], *, recursive: bool = False, glob: str | None = None
) -> Iterator[Path | LoadFailure]:
    """Files to ingest, in a stable order: given files as they are, directories scanned."""
    for path in paths:
        if not path.exists():
            yield LoadFailure(str(path), "no such file or directory")
            continue
        if path.is_file():
            yield path
            continue
        pattern = "**/*" if recursive else "*"
        for found in sorted(path.glob(pattern)):
            relative = found.relative_to(path)
            if any(part.startswith(".") for part in relative.parts):
                continue
            if not found.is_file() or found.suffix.lower() not in SUPPORTED_SUFFIXES:
                continue
            if glob and not (
                fnmatch.fnmatch(found.name, glob) or fnmatch.fnmatch(str(relative), glob)
            ):
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
) -> Iterator[Document | LoadFailure]:
    """Every document in the files under `roots`, with the command line's defaults applied."""
    for found in discover(roots, recursive=recursive, glob=glob):
        if isinstance(found, LoadFailure):
            yield found
            continue
        for item in iter_file(found):
            if isinstance(item, Document):
                item = _with_defaults(item, groups, category, labels)
            yield item
