"""What loading produces: a Document to ingest, or the LoadFailure of a file or JSONL line,
and the checks of the fields both file front matter and JSONL records carry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kbpg.errors import EmptyDocument, IngestError
from kbpg.ingest.chunking import Section
from kbpg.ingest.limits import check_filter_name


@dataclass(frozen=True)
class Document:
    """One document to ingest. `source` is its unique key (a path, URI or external id).

    `sections` carries the heading structure and links when a loader found them; without it
    the text is one section under the title.
    """

    source: str
    title: str
    text: str
    category: str | None = None
    groups: Sequence[str] = ()
    labels: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    sections: tuple[Section, ...] | None = None
    # a precomputed embedding (JSONL `embedding`): the document is then one chunk with this vector
    # (compared through the content hash, which covers it)
    embedding: npt.NDArray[np.float32] | None = field(default=None, compare=False, repr=False)
    # where it was read, for messages (a JSONL record: PATH:LINE; else its source)
    origin: str | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        return self.origin or self.source

    def section_list(self) -> tuple[Section, ...]:
        if self.sections is not None:
            return self.sections
        return (Section((self.title,) if self.title else (), self.text),)


@dataclass(frozen=True)
class LoadFailure:
    """A file (or JSONL line) that could not be read; ingest reports it and goes on. `empty`:
    it was read but holds no text to index (counted as skipped, not failed, unless strict)."""

    where: str
    reason: str
    empty: bool = False


def string_list(value: Any, key: str, where: str) -> tuple[str, ...]:
    """Groups or labels: a list of names or one comma-separated string; null or [] for none.
    A blank name anywhere ("", " ", "a,,b") is refused, never dropped."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list) and all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        items = [str(v).strip() for v in value]
    else:
        raise IngestError(f"{where}: `{key}` must be a list of strings")
    return tuple(check_filter_name(v, f"`{key}` value", where) for v in items)


def category_of(value: Any, where: str) -> str | None:
    """A category name, None for none (null or absent); a blank one is refused."""
    if value is None:
        return None
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise IngestError(f"{where}: `category` must be a string")
    return check_filter_name(str(value).strip(), "`category`", where)


def check_filters(document: Document, where: str) -> None:
    """A document's groups, labels and category (from any source: files, JSONL, the Python
    API, table sources): names, never blank (IngestError naming `where`)."""
    for key, values in (("groups", document.groups), ("labels", document.labels)):
        if isinstance(values, str):
            raise IngestError(f"{where}: `{key}` must be a list of strings, not a string")
        for value in values:
            if not isinstance(value, str):
                raise IngestError(f"{where}: `{key}` must be a list of strings")
            check_filter_name(value, f"`{key}` value", where)
    if document.category is not None:
        if not isinstance(document.category, str):
            raise IngestError(f"{where}: `category` must be a string")
        check_filter_name(document.category, "`category`", where)


def failure_of(exc: Exception, where: str, *, record: bool = False) -> LoadFailure:
    """What a loader raised, as the failure of this file or JSONL line (`where`)."""
    if isinstance(exc, IngestError):
        reason = exc.message
    elif isinstance(exc, RecursionError):
        reason = f"{'invalid JSON' if record else 'cannot read'}: nested too deeply"
    elif record and isinstance(exc, ValueError):  # JSONDecodeError, UnicodeDecodeError
        reason = f"invalid JSON: {exc}"
    else:  # a library's surprise is this file's failure, never the end of the run
        reason = f"cannot read: {type(exc).__name__}: {exc}"
    return LoadFailure(
        where, reason.removeprefix(f"{where}: "), empty=isinstance(exc, EmptyDocument)
    )
