"""Loader memory is bounded by structure, not only by size: a Markdown file of only headings held
~460 bytes per byte in markdown-it's tokens (1.2 MB: 557 MB), nested HTML ~110 in
BeautifulSoup's tree (8.8 MB: 979 MB). Measured here with tracemalloc (the Python heap the
loader allocates, deterministic); benchmarks/bench_ingest_memory.py --shape measures RSS."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kbpg.errors import IngestError
from kbpg.ingest import loaders, sections
from kbpg.ingest.document import Document
from kbpg.ingest.loaders import load_html, load_markdown, markdown_pieces
from kbpg.ingest.sections import MAX_SECTIONS

MB = 1_000_000


def peak_bytes(load: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        result = load()
    except IngestError as exc:
        result = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, result


def test_heading_only_markdown_is_parsed_a_piece_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "headings.md"
    path.write_text("# h\n" * 12_000)  # 48 kB: 12,000 headings and no text
    peak, result = peak_bytes(lambda: load_markdown(path, 2 * MB))
    assert isinstance(result, IngestError) and "no text to index" in str(result)
    assert peak < 10 * MB, peak  # was ~22 MB, and grew with the file (~460 bytes a byte)


def test_deeply_nested_html_is_streamed(tmp_path: Path) -> None:
    depth = 40_000  # 440 kB of <div>s
    path = tmp_path / "deep.html"
    path.write_text(
        "<html><head><title>Deep</title></head><body>"
        + "<div>" * depth
        + "<p>Treasure at the bottom.</p><h2>Map</h2><p>Here.</p>"
        + "</div>" * depth
        + "</body></html>"
    )
    peak, doc = peak_bytes(lambda: load_html(path, MB))
    assert isinstance(doc, Document)
    assert [(s.heading, s.text.strip()) for s in doc.section_list()] == [
        ("Deep", "Treasure at the bottom."),
        ("Deep > Map", "Here."),
    ]
    assert peak < 3 * path.stat().st_size, peak  # the text read, and little else (was ~220x)


def test_many_small_sections_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_SECTIONS == 50_000
    monkeypatch.setattr(sections, "MAX_SECTIONS", 100)
    path = tmp_path / "sections.md"
    path.write_text("".join(f"## s{i}\n\nword{i}\n\n" for i in range(100)))
    assert len(load_markdown(path).section_list()) == 100
    path.write_text("".join(f"## s{i}\n\nword{i}\n\n" for i in range(101)))
    with pytest.raises(IngestError, match="more than 100 sections"):
        load_markdown(path)


BIG_MARKDOWN = """---
title: Manual
---
Intro paragraph with a [reference link][ref] and a [late one][late].

# Part {i}

Text of part {i}, over
two lines.

- item one
- item two

  continued item paragraph

```
code block

with a blank line and # not a heading
```

<!-- a comment

# not a heading either
-->

<div>
# inside an HTML block
</div>

| a | b |
|---|---|
| {i} | x |

## Sub {i}
Setext title {i}
---------

    indented code

> quote {i}
>
> more quote
"""


def test_a_long_markdown_file_reads_the_same_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = "".join(BIG_MARKDOWN.split("---\n", 2)[2].format(i=i) for i in range(80))
    path = tmp_path / "manual.md"
    path.write_text(
        "---\ntitle: Manual\n---\n" + body + "\n[ref]: a.md#x\n[late]: b.md\n", encoding="utf-8"
    )
    monkeypatch.setattr(loaders, "MARKDOWN_PIECE_LINES", 10**9)
    whole = load_markdown(path)
    monkeypatch.setattr(loaders, "MARKDOWN_PIECE_LINES", 40)
    pieces = list(markdown_pieces(body, 40))
    assert len(pieces) > 20 and "".join(pieces) == body
    # every piece starts a block: none opens inside the fence or the comment
    assert not any(p.startswith(("with a blank", "# not a heading")) for p in pieces)
    parts = load_markdown(path)
    assert [s.heading for s in parts.section_list()] == [s.heading for s in whole.section_list()]
    assert [s.text for s in parts.section_list()] == [s.text for s in whole.section_list()]
    assert [s.links for s in parts.section_list()] == [s.links for s in whole.section_list()]
    links = [link.target for s in parts.section_list() for link in s.links]
    assert links and all(t.endswith(("a.md", "b.md")) for t in links)


def test_one_long_list_is_cut_where_it_must(tmp_path: Path) -> None:
    body = "".join(f"- item {i}\n" for i in range(1000))
    pieces = list(markdown_pieces(body, 40))
    assert "".join(pieces) == body
    assert max(p.count("\n") for p in pieces) <= 8 * 40
