"""HTML to heading-path sections, streamed: the standard library's HTMLParser feeds the section
builder tag by tag, so memory follows the text and the nesting depth, not the element count
(BeautifulSoup's tree of 8.8 MB of nested <div>s peaked at 979 MB)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from kbpg.ingest.sections import SectionBuilder

BLOCK_TAGS = frozenset(
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
HIDDEN_TAGS = frozenset(
    ["script", "style", "noscript", "template", "head", "svg", "iframe", "object"]
)
# elements that never have content or an end tag
_VOID = frozenset(
    ["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
     "track", "wbr"]
)  # fmt: skip
_HEADING = re.compile(r"h[1-6]")
_FEED = 1 << 16  # characters handed to the parser at a time


class _TitleScan(HTMLParser):
    """First pass: the <title> text, the first <h1>'s, and whether there is a <body>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] | None = None
        self.h1: list[str] | None = None
        self.has_body = False
        self._in: str | None = None  # "title" or "h1" while reading one
        self._depth = 0  # hidden elements inside a heading (their text is not the heading's)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.has_body = True
        if self._in is not None:
            if tag in HIDDEN_TAGS and tag not in _VOID:
                self._depth += 1
            return
        if tag == "title" and self.title is None:
            self._in, self.title = "title", []
        elif tag == "h1" and self.h1 is None:
            self._in, self.h1 = "h1", []

    def handle_endtag(self, tag: str) -> None:
        if self._in is not None and tag in HIDDEN_TAGS and self._depth:
            self._depth -= 1
        elif tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None and not self._depth:
            (self.title if self._in == "title" else self.h1).append(data)  # type: ignore[union-attr]

    def done(self) -> bool:
        return self.title is not None and self._in is None and self.has_body


class _Walker(HTMLParser):
    """Second pass: visible text into the builder (inside <body> when there is one), headings,
    preformatted blocks, table cells, line breaks and links; hidden elements skipped."""

    def __init__(self, builder: SectionBuilder, has_body: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.builder = builder
        self.inside = not has_body  # no <body>: the whole document is its body
        self.hidden = 0  # depth inside hidden elements (<script>, <head>, ...)
        self.heading: tuple[int, list[str]] | None = None  # level and text while in <hN>
        self.pre = 0  # depth inside <pre>
        self.pre_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.inside = True
            self.hidden = 0  # an unclosed <head> ends where the body starts
            return
        if tag in HIDDEN_TAGS and tag not in _VOID:
            self.hidden += 1
            return
        if not self.inside or self.hidden:
            return
        if self.heading is not None:
            return  # markup inside a heading: its text only
        if self.pre:
            self.pre += tag == "pre"
            return
        b = self.builder
        if _HEADING.fullmatch(tag):
            self.heading = (int(tag[1]), [])
        elif tag == "pre":
            self.pre = 1
            self.pre_text = []
            b.block()
        elif tag == "br" or tag == "tr":
            b.newline()
        else:
            if tag == "a":
                href = dict(attrs).get("href")
                if href:
                    b.link(href)
            if tag in BLOCK_TAGS:
                b.block()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in HIDDEN_TAGS and tag not in _VOID:
            self.hidden = max(0, self.hidden - 1)
            return
        if tag == "body":
            self.inside = False
            return
        if not self.inside or self.hidden:
            return
        b = self.builder
        if self.heading is not None:
            if _HEADING.fullmatch(tag):
                level, parts = self.heading
                self.heading = None
                b.heading(level, " ".join(parts))
            return
        if self.pre:
            if tag == "pre":
                self.pre -= 1
                if not self.pre:
                    b.text("".join(self.pre_text), preformatted=True)
                    self.pre_text = []
                    b.block()
            return
        if tag in ("td", "th"):
            b.text(" | ")
        elif tag == "tr":
            b.newline()
        elif tag in BLOCK_TAGS:
            b.block()

    def handle_data(self, data: str) -> None:
        if not self.inside or self.hidden:
            return
        if self.heading is not None:
            self.heading[1].append(data)
        elif self.pre:
            self.pre_text.append(data)
        else:
            self.builder.text(data)


def _feed(parser: HTMLParser, html: str, stop: object = None) -> None:
    for start in range(0, len(html), _FEED):
        parser.feed(html[start : start + _FEED])
        if stop is not None and stop():  # type: ignore[operator]
            return
    parser.close()


def html_title(html: str) -> tuple[str, bool]:
    """The document's title (<title>, else the first <h1>; "" for none) and whether it has a
    <body>, read without keeping anything of the document."""
    scan = _TitleScan()
    _feed(scan, html, scan.done)
    chosen = scan.title if scan.title is not None and "".join(scan.title).strip() else scan.h1
    return re.sub(r"\s+", " ", " ".join(chosen or [])).strip(), scan.has_body


def html_sections(html: str, builder: SectionBuilder, has_body: bool) -> None:
    """Walk the document into `builder` (finish() it after)."""
    _feed(_Walker(builder, has_body), html)


class _Text(HTMLParser):
    """The text of an HTML fragment outside hidden elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in HIDDEN_TAGS and tag not in _VOID:
            self.hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in HIDDEN_TAGS and tag not in _VOID:
            self.hidden = max(0, self.hidden - 1)

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The visible text of an HTML fragment (a Markdown file's HTML block), its pieces joined by
    spaces."""
    parser = _Text()
    _feed(parser, html)
    return " ".join(parser.parts)
