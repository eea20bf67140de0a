"""Loaders: text, Markdown, HTML, PDF and JSONL files into Documents with heading-path sections."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kbpg.errors import EmptyDocument, IngestError
from kbpg.ingest.chunking import Section
from kbpg.ingest.document import Document, LoadFailure, category_of, failure_of, string_list
from kbpg.ingest.html import html_sections, html_text, html_title
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
from kbpg.ingest.sections import SectionBuilder

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
        raise EmptyDocument(f"{path}: no text to index")
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


# An attribute list of Python-Markdown's attr_list (MkDocs, Material): `{ #id }`, `{ .class }`,
# `{: #id .cls key="v" }` after a heading, a link, an image or a block; markup, never text.
# Every item must be an id, a class or a key=value, so `{name}` or `{}` in prose stays.
_ATTR_ITEM = r"""(?:[#.][A-Za-z_][\w:.-]*|[A-Za-z_][\w-]*=(?:"[^"\n]*"|'[^'\n]*'|[^\s{}"']+))"""
ATTRIBUTE_LIST = re.compile(r"[ \t]*\{:?[ \t]*" + _ATTR_ITEM + r"(?:[ \t]+" + _ATTR_ITEM
                            + r")*[ \t]*:?\}")  # fmt: skip


def strip_attribute_lists(text: str) -> str:
    """`text` without MkDocs attribute lists (`Install { #install }` is `Install`)."""
    return ATTRIBUTE_LIST.sub("", text) if "{" in text else text


def _markdown_inline(children: Sequence[Any], builder: SectionBuilder | None) -> str:
    """Plain text of an inline token's children, attribute lists stripped (code spans keep
    theirs); links are recorded on the builder."""
    out: list[str] = []
    for child in children:
        kind = child.type
        if kind == "link_open" and builder is not None:
            builder.text(strip_attribute_lists("".join(out)))
            out = []
            builder.link(str(child.attrGet("href") or ""))
        elif kind == "text":
            out.append(strip_attribute_lists(child.content))
        elif kind == "code_inline" or kind == "image":
            out.append(child.content)
        elif kind in ("softbreak", "hardbreak"):
            out.append(" " if kind == "softbreak" else "\n")
    return "".join(out)


# markdown-it keeps every token of what it parses (~4 a line, ~2 kB), so a long file is parsed a
# piece of about this many lines at a time (1.2 MB of "# h" lines held 557 MB in one parse)
MARKDOWN_PIECE_LINES = 2_000
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"#{1,6}(?:[ \t]|$)")
# CommonMark HTML blocks that run over blank lines (kinds 1-5), and what ends each
_HTML_SPANNING = [
    (re.compile(r" {0,3}<(?:script|pre|style|textarea)(?:\s|>|$)", re.I),
     re.compile(r"</(?:script|pre|style|textarea)>", re.I)),
    (re.compile(r" {0,3}<!--"), re.compile(r"-->")),
    (re.compile(r" {0,3}<\?"), re.compile(r"\?>")),
    (re.compile(r" {0,3}<![A-Za-z]"), re.compile(r">")),
    (re.compile(r" {0,3}<!\[CDATA\["), re.compile(r"\]\]>")),
]  # fmt: skip
_REFERENCE = re.compile(r"^ {0,3}\[(?:[^\]\\\n]|\\.)+\]:.*(?:\n[ \t]+\S.*)?$", re.M)


def markdown_pieces(body: str, lines: int = MARKDOWN_PIECE_LINES) -> Iterator[str]:
    """`body` in pieces of about `lines` lines that parse as the whole does: cut only before a
    line at column 0 that starts a block at the top level (after a blank line, or an ATX heading
    after one), never inside a fenced code block or an HTML block that spans blank lines. A piece
    with no such place (one long list) is cut at any column-0 line past 8x the size: a list or
    paragraph cut there reads as two, with the same text."""
    start = pos = count = 0
    fence: tuple[str, int] | None = None  # the open fence's character and length
    html_end: re.Pattern[str] | None = None
    fresh = True  # the previous line was blank (or a heading after one): a block may start
    while pos < len(body):
        end = body.find("\n", pos)
        end = len(body) if end < 0 else end + 1
        line = body[pos:end].rstrip("\r\n")
        if (
            count >= lines
            and fence is None
            and html_end is None
            and line[:1].strip()
            and (fresh or count >= 8 * lines)
        ):
            yield body[start:pos]
            start, count = pos, 0
        blank = not line.strip()
        if fence is not None:
            closing = _FENCE.match(line)
            if (
                closing
                and closing.group(1)[0] == fence[0]
                and len(closing.group(1)) >= fence[1]
                and not line[closing.end() :].strip()
            ):
                fence = None
            fresh = False
        elif html_end is not None:
            if html_end.search(line):
                html_end = None
            fresh = False
        else:
            opened = _FENCE.match(line)
            if opened:
                fence = (opened.group(1)[0], len(opened.group(1)))
            else:
                for begin, finish in _HTML_SPANNING:
                    found = begin.match(line)
                    if found:
                        if not finish.search(line, found.end()):
                            html_end = finish
                        break
            fresh = blank or (fresh and bool(_ATX.match(line)))
        count += 1
        pos = end
    if start < len(body):
        yield body[start:]


def _markdown_token_lists(md: Any, body: str) -> Iterator[list[Any]]:
    """The tokens of `body`, a piece at a time (one list for a short file). Link reference
    definitions (`[id]: url`) are read from the whole body first: a piece's links to a
    definition in another piece still resolve."""
    if body.count("\n") <= MARKDOWN_PIECE_LINES:
        yield md.parse(body)
        return
    env: dict[str, Any] = {}
    definitions = "\n\n".join(m.group(0) for m in _REFERENCE.finditer(body))
    if definitions:
        md.parse(definitions, env)
    for piece in markdown_pieces(body, MARKDOWN_PIECE_LINES):
        yield md.parse(piece, env)


def _markdown_h1(tokens: Sequence[Any]) -> str:
    for index, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == "h1":
            return _markdown_inline(tokens[index + 1].children or [], None).strip()
    return ""


def load_markdown(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    from markdown_it import MarkdownIt

    raw = _read_text(path, max_bytes)
    front, body = split_front_matter(raw, str(path))
    del raw
    md = MarkdownIt("commonmark").enable("table")
    title = str(front.get("title") or "").strip()
    first: list[Any] | None = None  # a short file's tokens, parsed once for both passes
    if not title:
        for tokens in _markdown_token_lists(md, body):
            first = tokens if body.count("\n") <= MARKDOWN_PIECE_LINES else None
            title = _markdown_h1(tokens)
            if title:
                break
    title = title or _title_from_path(path)
    builder = SectionBuilder(title, path, str(path.resolve()))
    heading_level = 0
    for tokens in [first] if first is not None else _markdown_token_lists(md, body):
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
                builder.text(html_text(token.content))
                builder.block()
            elif kind in ("th_close", "td_close"):
                builder.text(" | ")
            elif kind in ("tr_close", "list_item_close") or (
                kind == "paragraph_close" and token.hidden
            ):
                builder.newline()
            elif kind.endswith("_close") or kind == "hr":
                builder.block()
        tokens.clear()  # a piece's tokens go before the next piece is parsed
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


def load_html(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    html = _read_text(path, max_bytes)
    title, has_body = html_title(html)
    title = title or _title_from_path(path)
    builder = SectionBuilder(title, path, str(path.resolve()))
    html_sections(html, builder, has_body)
    return _document(path, title, builder.finish(), "html")


# -- PDF --------------------------------------------------------------------------------------


_QUIET = logging.NullHandler()


def load_pdf(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    import io

    import pypdf

    # pypdf logs what it repairs ("EOF marker not found"); with no handler configured Python
    # printed it raw on stderr, beside kbpg's own `skipped PATH: reason` line
    logging.getLogger("pypdf").addHandler(_QUIET)

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
