"""Building a document's heading-path sections while a parser walks it (Markdown, HTML)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kbpg.errors import IngestError
from kbpg.ingest.chunking import Link, Section

# Every section becomes at least one chunk, and each costs ~1 kB of Python objects on the way
# (section, chunk, heading path, counts) whatever its size: a file of a heading and a word per
# section held ~150 bytes per byte of text. A document of more sections is refused (split it).
MAX_SECTIONS = 50_000


def resolve_link(href: str, base: Path, own_source: str) -> Link | None:
    """A relative link to another file (or a #fragment of this one) as a Link; None if external."""
    parts = urlsplit(href.strip())
    if parts.scheme or parts.netloc or href.startswith("//"):
        return None
    fragment = unquote(parts.fragment)
    if not parts.path:
        return Link(0, own_source, fragment) if fragment else None
    target = (base.parent / unquote(parts.path)).resolve()
    return Link(0, str(target), fragment)


class SectionBuilder:
    """Collects plain text under a heading path while a parser walks a document."""

    def __init__(self, title: str, base: Path, source: str) -> None:
        self.title = title
        self.base = base
        self.source = source
        self.headings: list[tuple[int, str]] = []
        self.sections: list[Section] = []
        self._parts: list[str] = []
        self._length = 0
        self._links: list[Link] = []
        self._path: tuple[str, ...] | None = None  # the heading path, until the next heading

    def _tail(self) -> str:
        return self._parts[-1][-2:] if self._parts else ""

    def text(self, value: str, *, preformatted: bool = False) -> None:
        if not preformatted:
            value = re.sub(r"\s+", " ", value)
            if not self._parts or self._tail().endswith("\n"):
                value = value.lstrip()
        if value:
            self._parts.append(value)
            self._length += len(value)

    def newline(self) -> None:
        if self._parts and not self._tail().endswith("\n"):
            self._parts.append("\n")
            self._length += 1

    def block(self) -> None:
        if self._parts and self._tail() != "\n\n":
            add = "\n" if self._tail().endswith("\n") else "\n\n"
            self._parts.append(add)
            self._length += len(add)

    def link(self, href: str) -> None:
        link = resolve_link(href, self.base, self.source)
        if link is not None:
            self._links.append(Link(self._length, link.target, link.fragment))

    def path(self) -> tuple[str, ...]:
        if self._path is None:
            names = [text for _, text in self.headings if text]
            if not names or names[0] != self.title:
                names.insert(0, self.title)
            self._path = tuple(names)
        return self._path

    def flush(self) -> None:
        text = "".join(self._parts)
        if text.strip():
            if len(self.sections) >= MAX_SECTIONS:
                raise IngestError(
                    f"{self.source}: more than {MAX_SECTIONS:,} sections (headings with text "
                    "under them); split the file into several"
                )
            self.sections.append(Section(self.path(), text, tuple(self._links)))
        self._parts, self._length, self._links = [], 0, []

    def heading(self, level: int, text: str) -> None:
        self.flush()
        while self.headings and self.headings[-1][0] >= level:
            self.headings.pop()
        self.headings.append((level, re.sub(r"\s+", " ", text).strip()))
        self._path = None

    def finish(self) -> tuple[Section, ...]:
        self.flush()
        return tuple(self.sections)
