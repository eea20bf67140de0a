"""Loaders and chunker on real files made here, with the real MiniLM tokenizer (no database)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from kbpg.ingest.chunking import Section, chunk_sections
from kbpg.ingest.document import Document, LoadFailure
from kbpg.ingest.entities import extract_entities
from kbpg.ingest.loaders import iter_file
from kbpg.ingest.records import parse_record
from kbpg.models.embedders import Embedder


def make_pdf(path: Path, pages: list[str], title: str | None = None) -> Path:
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path), pagesize=A4)
    if title:
        pdf.setTitle(title)
    for text in pages:
        y = 800
        for line in text.splitlines():
            pdf.drawString(72, y, line)
            y -= 16
        pdf.showPage()
    pdf.save()
    return path


def one(path: Path) -> Document:
    items = list(iter_file(path))
    assert len(items) == 1
    assert isinstance(items[0], Document), items[0]
    return items[0]


SENTENCE_WORDS = [
    "residents",
    "renew",
    "the",
    "parking",
    "permit",
    "online",
    "before",
    "it",
    "expires",
    "and",
    "upload",
    "a",
    "recent",
    "proof",
    "of",
    "address",
    "while",
    "the",
    "office",
    "checks",
    "the",
    "vehicle",
    "registration",
]


def long_text(words: int) -> str:
    """`words` words in sentences of 12 words and paragraphs of 5 sentences."""
    out, sentence, paragraph = [], [], []
    for i in range(words):
        sentence.append(f"{SENTENCE_WORDS[i % len(SENTENCE_WORDS)]}{i}")
        if len(sentence) == 12 or i == words - 1:
            paragraph.append(" ".join(sentence).capitalize() + ".")
            sentence = []
        if len(paragraph) == 5 or i == words - 1:
            if paragraph:
                out.append(" ".join(paragraph))
            paragraph = []
    return "\n\n".join(out)


# -- chunker ----------------------------------------------------------------------------------


def test_1000_word_text_is_chunked_not_truncated(embedder: Embedder) -> None:
    text = long_text(1000)
    chunks = chunk_sections([Section(("Handbook", "Permits"), text)], embedder)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.section == "Handbook > Permits"
        assert embedder.count_tokens(chunk.embed_text) <= embedder.max_tokens
        assert chunk.token_count == embedder.count_tokens(chunk.embed_text)
        assert chunk.embed_text == f"Handbook > Permits\n{chunk.content}"
        assert chunk.content == text[chunk.start : chunk.end]
    # every word is in some chunk, in order: nothing cut off
    covered = set()
    for chunk in chunks:
        covered.update(re.findall(r"\w+\d+", chunk.content))
    assert covered == set(re.findall(r"\w+\d+", text))
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for a, b in itertools.pairwise(chunks):
        assert b.start < a.end, "consecutive windows overlap"
        assert a.start < b.start, "windows move forward"
        # windows end on sentence boundaries
        assert a.content.endswith(".")
        assert b.content[0].isupper()


def test_short_sections_are_one_chunk_each_and_never_cross_headings(embedder: Embedder) -> None:
    sections = [
        Section(("Guide",), "Intro sentence."),
        Section(("Guide", "Setup"), "Install it. Then run it."),
        Section(("Guide", "Setup", "Linux"), long_text(400)),
        Section(("Guide", "Empty"), "   \n "),
    ]
    chunks = chunk_sections(sections, embedder)
    assert [c.section for c in chunks[:2]] == ["Guide", "Guide > Setup"]
    assert chunks[1].content == "Install it. Then run it."
    assert {c.section for c in chunks[2:]} == {"Guide > Setup > Linux"}
    assert len(chunks) >= 4
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert all(c.section_index != 3 for c in chunks)


def test_overlong_words_and_headings_still_fit(embedder: Embedder) -> None:
    path = tuple(f"Heading number {i} with several words in it" for i in range(20))
    text = "start " + "=" * 2000 + " end. " + "x" * 5000
    chunks = chunk_sections([Section(path, text)], embedder)
    assert all(embedder.count_tokens(c.embed_text) <= embedder.max_tokens for c in chunks)
    assert chunks[0].content.startswith("start")
    assert chunks[-1].content.endswith("x")
    # the stored section keeps the whole path; only the embedded prefix is shortened
    assert chunks[0].section.count(" > ") == 19


# -- loaders ----------------------------------------------------------------------------------


def test_markdown_front_matter_headings_and_links(tmp_path: Path, embedder: Embedder) -> None:
    (tmp_path / "sub").mkdir()
    page = tmp_path / "permits.md"
    page.write_text(
        "---\ntitle: Parking permits\ncategory: permits\ngroups: [residents, public]\n"
        "labels: parking\nowner: Parking Services\n---\n"
        "Lead paragraph before any heading.\n\n"
        "# Parking permits\n\nOverview with a [link to renewal](sub/renew.md#online-renewal) "
        "and an [external one](https://example.org/x).\n\n"
        "## Eligibility\n\nYou must *live* in the zone.\n\n- item one\n- item `two`\n\n"
        "### Documents\n\n| Doc | Needed |\n|---|---|\n| bill | yes |\n\n"
        "## Fees\n\n```\nfee = 60\n```\n"
    )
    doc = one(page)
    assert doc.source == str(page.resolve())
    assert doc.title == "Parking permits"
    assert doc.category == "permits"
    assert list(doc.groups) == ["residents", "public"]
    assert list(doc.labels) == ["parking"]
    assert doc.metadata == {"format": "markdown", "owner": "Parking Services"}
    sections = doc.section_list()
    assert [s.heading for s in sections] == [
        "Parking permits",
        "Parking permits",
        "Parking permits > Eligibility",
        "Parking permits > Eligibility > Documents",
        "Parking permits > Fees",
    ]
    assert "title:" not in doc.text
    overview = sections[1]
    assert overview.text.startswith("Overview with a link to renewal and an external one.")
    assert len(overview.links) == 1
    link = overview.links[0]
    assert link.target == str((tmp_path / "sub" / "renew.md").resolve())
    assert link.fragment == "online-renewal"
    assert overview.text[link.offset :].startswith("link to renewal")
    assert "You must live in the zone." in sections[2].text
    assert "item one\nitem two" in sections[2].text
    assert "bill | yes" in sections[3].text
    assert "fee = 60" in sections[4].text
    chunks = chunk_sections(sections, embedder)
    assert [c.section for c in chunks][-1] == "Parking permits > Fees"


def test_markdown_title_from_first_h1_or_file_name(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Waste guide\n\nBins.\n")
    (tmp_path / "bulky_items.md").write_text("Just text.\n\n## Booking\n\nCall us.\n")
    assert one(tmp_path / "a.md").title == "Waste guide"
    doc = one(tmp_path / "bulky_items.md")
    assert doc.title == "bulky items"
    assert [s.heading for s in doc.section_list()] == ["bulky items", "bulky items > Booking"]


def test_html_visible_text_title_headings_links(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text(
        "<html><head><title>Library  cards</title><style>p{color:red}</style>"
        "<script>var hidden = 'secret';</script></head><body>"
        "<nav>Home</nav><h1>Library cards</h1><p>Anyone can <b>join</b> for free.</p>"
        "<h2>Lost cards</h2><p>A replacement costs 2. See <a href='ebooks.html#sign-in'>e-books"
        "</a>.</p><!-- a comment --><ul><li>one</li><li>two</li></ul>"
        "<script>alert('no')</script></body></html>"
    )
    doc = one(page)
    assert doc.title == "Library cards"
    assert "secret" not in doc.text and "alert" not in doc.text and "color" not in doc.text
    assert "comment" not in doc.text
    sections = doc.section_list()
    assert [s.heading for s in sections] == [
        "Library cards",
        "Library cards",
        "Library cards > Lost cards",
    ]
    assert "Anyone can join for free." in sections[1].text
    lost = sections[2]
    assert "A replacement costs 2. See e-books." in lost.text
    assert "one\n" in lost.text and "two" in lost.text
    (link,) = lost.links
    assert link.target == str((tmp_path / "ebooks.html").resolve())
    assert link.fragment == "sign-in"
    assert lost.text[link.offset :].startswith("e-books")


def test_pdf_text_per_page(tmp_path: Path) -> None:
    pdf = make_pdf(
        tmp_path / "guide.pdf",
        ["Bulky item collection\nBook through the portal.", "Page two talks about fridges."],
        title="Bulky items guide",
    )
    doc = one(pdf)
    assert doc.title == "Bulky items guide"
    sections = doc.section_list()
    assert [s.heading for s in sections] == [
        "Bulky items guide > page 1",
        "Bulky items guide > page 2",
    ]
    assert "Book through the portal." in sections[0].text
    assert "fridges" in sections[1].text
    assert doc.metadata["pages"] == 2


def test_text_file(tmp_path: Path) -> None:
    (tmp_path / "opening_hours.txt").write_text("Open 9 to 5.\n\nClosed on Sundays.\n")
    doc = one(tmp_path / "opening_hours.txt")
    assert doc.title == "opening hours"
    assert doc.section_list()[0].text.startswith("Open 9 to 5.")


def test_jsonl_documents_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    lines = [
        json.dumps({"_id": "d1", "title": "T1", "text": "first"}),
        json.dumps(
            {
                "id": 2,
                "title": "T2",
                "text": "second",
                "category": "c",
                "groups": ["g1", "g2"],
                "labels": ["l"],
                "metadata": {"year": 1999},
            }
        ),
        "{not json",
        json.dumps({"id": "d3"}),
        "",
        json.dumps({"id": "d4", "text": "fourth"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    items = list(iter_file(path))
    docs = [i for i in items if isinstance(i, Document)]
    failures = [i for i in items if isinstance(i, LoadFailure)]
    assert [d.source for d in docs] == ["d1", "2", "d4"]
    assert docs[1].category == "c" and list(docs[1].groups) == ["g1", "g2"]
    assert docs[1].metadata == {"year": 1999}
    assert docs[0].section_list()[0].path == ("T1",)
    assert docs[2].section_list()[0].path == ()
    assert [f.where for f in failures] == [f"{path}:3", f"{path}:4"]
    assert "invalid JSON" in failures[0].reason
    assert "text" in failures[1].reason


def test_broken_files_are_failures_with_their_path(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81binary")
    (tmp_path / "bad_front.md").write_text("---\ntitle: [unclosed\n---\nbody\n")
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "data.xyz").write_text("?")
    for name, reason in [
        ("broken.pdf", "cannot read PDF"),
        ("binary.txt", "not UTF-8"),
        ("bad_front.md", "invalid front matter"),
        ("empty.md", "no text"),
        ("data.xyz", "unsupported file type"),
    ]:
        (failure,) = iter_file(tmp_path / name)
        assert isinstance(failure, LoadFailure), name
        assert failure.where == str(tmp_path / name)
        assert reason in failure.reason


def test_entities_codes_acronyms_and_names() -> None:
    found = extract_entities(
        "The Parking Services Office issues form PRK-204. When the IT Service Desk is closed, "
        "call 555-0100 in 2026 about ISO 9001 and the Riverton Money Advice Service."
    )
    assert {"PRK-204", "parking services office", "it service desk"} <= found
    assert "riverton money advice service" in found
    assert "ISO" in found
    assert "555-0100" not in found and "2026" not in found
    assert not any(e.startswith("the ") or e.startswith("when ") for e in found)


def test_entity_codes_at_word_edges() -> None:
    """Codes are matched inside words holding a digit (kbpg.entities): word edges, slashes,
    hyphens and non-ASCII neighbours give what a scan of the whole text gave."""
    found = extract_entities("form PRK-204/ and AB1//CD9 then x_AB12 or -XY9 and Zz9-1a")
    assert found == {"AB1", "CD9", "PRK", "PRK-204", "ZZ9-1A"}
    found = extract_entities("REF\u00a0A1B2 caf\u00e9Q7 Q7\u00e9 12ab 1-2-3 A-1 a1b2C")
    assert found == {"A-1", "A1B2", "A1B2C", "REF"}
    assert extract_entities("\u00c9A12 A12\u00c9 tab\tK9Z\nnew") == {"K9Z"}


@pytest.mark.parametrize(
    "line",
    [
        b'{"id": 123456789012345678901234567890, "text": "an id past 64 bits stays exact"}',
        b'{"id": "x", "text": "t", "metadata": {"n": -18446744073709551616, "f": 1e-400}}',
        b'{"id": "x", "text": "t", "metadata": {"n": 18446744073709551615}}',
        b'{"id": "x", "text": "t", "embedding": [0.5, 123456789012345678901234]}',
        b'{"id": "x", "text": "t", "metadata": {"deep": [["a", 99999999999999999999]]}}',
        b'{"id": "x", "text": "dup", "text": "last wins"}',
        b'{"id": "x", "text": "\\ud800 lone surrogate", "embedding": [0.1, 2, -3e-5]}',
        b'\xef\xbb\xbf{"id": "bom", "text": "byte order mark"}',
        b'{"id": "x", "text": "t", "embedding": [0.12345678901234567890123, 1.7976931348623157e308]}',
    ],
)
def test_records_parse_as_json_does(line: bytes) -> None:
    """kbpg.records reads lines with orjson where it gives json.loads's answer, else json."""
    parsed = parse_record(line)
    assert parsed == json.loads(line)
    assert [type(v) for v in parsed.values()] == [type(v) for v in json.loads(line).values()]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"id": "x", "embedding": [NaN]}', None),
        (b'{"id": "x", "embedding": [1e400]}', None),
        (b"{not json", "Expecting property name enclosed in double quotes"),
        (b'{"id": "\xff"}', "can't decode byte 0xff"),
    ],
)
def test_records_refused_or_odd_lines_as_json_reads_them(line: bytes, message: str | None) -> None:
    if message is None:  # NaN and infinity parse, and are refused where they land
        assert str(parse_record(line)) == str(json.loads(line))
        return
    with pytest.raises(ValueError, match=message):
        parse_record(line)
