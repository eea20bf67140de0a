"""Loaders: text, Markdown, HTML, PDF and JSONL files into Documents with heading-path sections."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from kbpg.errors import IngestError
from kbpg.ingest.chunking import Link, Section
from kbpg.ingest.document import Document, LoadFailure, category_of, failure_of, string_list
from kbpg.ingest.limits import (
    BINARY_SNIFF_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    MAX_METADATA_BYTES,
    SURROGATE,
    check_not_binary,
    clean_text,
    human_bytes,
    json_metadata,
    read_limited,
    yaml_loader,
)
from kbpg.ingest.records import iter_jsonl

TEXT_SUFFIXES = frozenset({".txt", ".text"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
HTML_SUFFIXES = frozenset({".html", ".htm"})
PDF_SUFFIXES = frozenset({".pdf"})
JSONL_SUFFIXES = frozenset({".jsonl"})
SUPPORTED_SUFFIXES = (
    TEXT_SUFFIXES | MARKDOWN_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES | JSONL_SUFFIXES
)


def _title_from_path(path: Path) -> str:
    return clean_text(re.sub(r"[_-]+", " ", path.stem).strip() or path.name)


def _read_text(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> str:
    data = read_limited(path, max_bytes)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        raise IngestError(
            f"{path}: binary content (NUL bytes), not text "
            "(UTF-16 text must be converted to UTF-8 first)"
        )
    del data
    check_not_binary(text, str(path))
    return clean_text(text)


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


class _SectionBuilder:
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
        names = [text for _, text in self.headings if text]
        if not names or names[0] != self.title:
            names.insert(0, self.title)
        return tuple(names)

    def flush(self) -> None:
        text = "".join(self._parts)
        if text.strip():
            self.sections.append(Section(self.path(), text, tuple(self._links)))
        self._parts, self._length, self._links = [], 0, []

    def heading(self, level: int, text: str) -> None:
        self.flush()
        while self.headings and self.headings[-1][0] >= level:
            self.headings.pop()
        self.headings.append((level, re.sub(r"\s+", " ", text).strip()))

    def finish(self) -> tuple[Section, ...]:
        self.flush()
        return tuple(self.sections)


def _document(
    path: Path,
    title: str,
    sections: tuple[Section, ...],
    fmt: str,
    *,
    category: str | None = None,
    groups: Sequence[str] = (),
    labels: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
) -> Document:
    if any(SURROGATE.search(s.text) or any(map(SURROGATE.search, s.path)) for s in sections):
        sections = tuple(
            replace(s, path=tuple(map(clean_text, s.path)), text=clean_text(s.text))
            for s in sections
        )
    # one section (a text file): its string is the document's text, not a stripped copy
    text = sections[0].text if len(sections) == 1 else "\n\n".join(s.text.strip() for s in sections)
    if not text or text.isspace():
        raise IngestError(f"{path}: no text to index")
    meta = json_metadata({"format": fmt, **(metadata or {})}, str(path))
    return Document(
        source=str(path.resolve()),
        title=clean_text(title),
        text=text,
        category=category,
        groups=tuple(groups),
        labels=tuple(labels),
        metadata=meta,
        sections=sections,
    )


def load_text(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    text = _read_text(path, max_bytes)
    title = _title_from_path(path)
    return _document(path, title, (Section((title,), text),), "text")


# -- Markdown ---------------------------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.S)


def split_front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
    """YAML front matter between `---` lines at the top of a Markdown file, and the body."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    import yaml

    raw = match.group(1)
    if len(raw) > MAX_METADATA_BYTES:
        raise IngestError(
            f"{where}: front matter is over the {human_bytes(MAX_METADATA_BYTES)} metadata cap"
        )
    try:
        data = yaml.load(raw, Loader=yaml_loader()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        at = f" (front matter line {mark.line + 1})" if mark is not None else ""
        raise IngestError(f"{where}: invalid front matter: {problem}{at}") from exc
    except RecursionError:
        raise IngestError(f"{where}: invalid front matter: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise IngestError(f"{where}: invalid front matter: {exc}") from exc
    if not isinstance(data, dict):
        raise IngestError(f"{where}: front matter must be a mapping of keys to values")
    return {str(k): v for k, v in data.items()}, text[match.end() :]


def _markdown_inline(children: Sequence[Any], builder: _SectionBuilder | None) -> str:
    """Plain text of an inline token's children; links are recorded on the builder."""
    out: list[str] = []
    for child in children:
        kind = child.type
        if kind == "link_open" and builder is not None:
            builder.text("".join(out))
            out = []
            builder.link(str(child.attrGet("href") or ""))
        elif kind in ("text", "code_inline") or kind == "image":
            out.append(child.content)
        elif kind in ("softbreak", "hardbreak"):
            out.append(" " if kind == "softbreak" else "\n")
    return "".join(out)


def load_markdown(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    from markdown_it import MarkdownIt

    raw = _read_text(path, max_bytes)
    front, body = split_front_matter(raw, str(path))
    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    title = str(front.get("title") or "").strip()
    if not title:
        for index, token in enumerate(tokens):
            if token.type == "heading_open" and token.tag == "h1":
                title = _markdown_inline(tokens[index + 1].children or [], None).strip()
                break
    title = title or _title_from_path(path)
    builder = _SectionBuilder(title, path, str(path.resolve()))
    heading_level = 0
    for token in tokens:
        kind = token.type
        if kind == "heading_open":
            heading_level = int(token.tag[1:])
        elif kind == "heading_close":
            heading_level = 0
        elif kind == "inline":
            if heading_level:
                builder.heading(heading_level, _markdown_inline(token.children or [], None))
            else:
                builder.text(_markdown_inline(token.children or [], builder))
        elif kind in ("fence", "code_block"):
            builder.block()
            builder.text(token.content.rstrip("\n"), preformatted=True)
            builder.block()
        elif kind == "html_block":
            builder.block()
            builder.text(_html_fragment_text(token.content))
            builder.block()
        elif kind in ("th_close", "td_close"):
            builder.text(" | ")
        elif kind in ("tr_close", "list_item_close") or (
            kind == "paragraph_close" and token.hidden
        ):
            builder.newline()
        elif kind.endswith("_close") or kind == "hr":
            builder.block()
    known = {"title", "category", "groups", "labels"}
    return _document(
        path,
        title,
        builder.finish(),
        "markdown",
        category=category_of(front.get("category"), str(path)),
        groups=string_list(front.get("groups"), "groups", str(path)),
        labels=string_list(front.get("labels"), "labels", str(path)),
        metadata={k: v for k, v in front.items() if k not in known},
    )


# -- HTML -------------------------------------------------------------------------------------

_BLOCK_TAGS = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "section",
        "summary",
        "table",
        "tbody",
        "thead",
        "tfoot",
        "ul",
        "caption",
    ]
)
_HIDDEN_TAGS = ("script", "style", "noscript", "template", "head", "svg", "iframe", "object")


def _html_fragment_text(html: str) -> str:
    from bs4 import BeautifulSoup

    return BeautifulSoup(html, "html.parser").get_text(" ")


def _walk_html(root: Any, builder: _SectionBuilder) -> None:
    """Depth-first over the tree with a stack of its own: 5,000 nested <div>s are a document,
    not a RecursionError. The stack holds child iterators and actions to run after a child."""
    from bs4.element import Comment, NavigableString, Tag

    stack: list[Iterator[Any] | Callable[[], None]] = [iter(root.children)]
    while stack:
        top = stack.pop()
        if not isinstance(top, Iterator):
            top()
            continue
        child = next(top, None)
        if child is None:
            continue
        stack.append(top)
        if isinstance(child, Comment):
            continue
        if isinstance(child, NavigableString):
            builder.text(str(child))
            continue
        if not isinstance(child, Tag):
            continue
        name = child.name.lower()
        if re.fullmatch(r"h[1-6]", name):
            builder.heading(int(name[1]), child.get_text(" "))
        elif name == "pre":
            builder.block()
            builder.text(child.get_text(), preformatted=True)
            builder.block()
        elif name == "br":
            builder.newline()
        elif name in ("td", "th"):
            stack.append(functools.partial(builder.text, " | "))
            stack.append(iter(child.children))
        elif name == "tr":
            builder.newline()
            stack.append(builder.newline)
            stack.append(iter(child.children))
        else:
            if name == "a" and child.get("href"):
                builder.link(str(child.get("href")))
            if name in _BLOCK_TAGS:
                builder.block()
                stack.append(builder.block)
            stack.append(iter(child.children))


def load_html(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_read_text(path, max_bytes), "html.parser")
    title_tag = soup.find("title")
    title = title_tag.get_text(" ", strip=True) if title_tag else ""
    if not title:
        h1 = soup.find("h1")
        title = h1.get_text(" ", strip=True) if h1 else ""
    title = re.sub(r"\s+", " ", title) or _title_from_path(path)
    for hidden in soup.find_all(_HIDDEN_TAGS):
        hidden.decompose()
    builder = _SectionBuilder(title, path, str(path.resolve()))
    _walk_html(soup.body or soup, builder)
    return _document(path, title, builder.finish(), "html")


# -- PDF --------------------------------------------------------------------------------------


def load_pdf(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    import io

    import pypdf

    data = read_limited(path, max_bytes)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise IngestError(f"{path}: the PDF is encrypted")
        meta_title = (reader.metadata.title if reader.metadata else None) or ""
        pages = [clean_text(page.extract_text() or "") for page in reader.pages]
    except IngestError:
        raise
    except Exception as exc:  # pypdf raises many types for damaged files
        raise IngestError(f"{path}: cannot read PDF: {type(exc).__name__}: {exc}") from exc
    title = re.sub(r"\s+", " ", str(meta_title)).strip() or _title_from_path(path)
    sections = tuple(
        Section((title, f"page {number}"), text)
        for number, text in enumerate(pages, start=1)
        if text.strip()
    )
    if not sections:
        raise IngestError(f"{path}: no extractable text (a scanned PDF needs OCR first)")
    return _document(path, title, sections, "pdf", metadata={"pages": len(pages)})


_LOADERS = {
    **dict.fromkeys(TEXT_SUFFIXES, load_text),
    **dict.fromkeys(MARKDOWN_SUFFIXES, load_markdown),
    **dict.fromkeys(HTML_SUFFIXES, load_html),
    **dict.fromkeys(PDF_SUFFIXES, load_pdf),
}


def iter_file(
    path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> Iterator[Document | LoadFailure]:
    """The documents in one file (many for JSONL); failures are yielded, not raised: whatever a
    loader raises is this file's failure, never the end of the run."""
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        yield from iter_jsonl(path, max_bytes)
        return
    loader = _LOADERS.get(suffix)
    if loader is None:
        yield LoadFailure(str(path), f"unsupported file type {suffix or '(none)'!r}")
        return
    try:
        document = loader(path, max_bytes)
    except Exception as exc:
        yield failure_of(exc, str(path))
        return
    yield document
