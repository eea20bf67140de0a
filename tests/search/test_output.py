"""The CLI's preview of a chunk: its snippet on one line, the query's words in bold."""

from __future__ import annotations

from kbpg.search.output import BOLD, PLAIN, marked_preview
from kbpg.search.results import Chunk


def chunk(text: str, highlights: tuple[tuple[int, int], ...] = (), start: int = 0) -> Chunk:
    return Chunk(1, 1, 1, "d", "s", "", "x" * start + text, 0.0, None, None, None, None,
                 highlights=highlights, snippet=text, snippet_start=start)  # fmt: skip


def test_a_text_that_fits_is_whole_and_marked_words_are_bold() -> None:
    text = "a" * 68 + " permits: ok"  # 80 characters, a mark followed by a colon
    marks = ((69 + 5, 76 + 5),)
    assert marked_preview(chunk(text, marks, start=5)) == text
    assert marked_preview(chunk(text, marks, start=5), bold=True) == (
        "a" * 68 + f" {BOLD}permits{PLAIN}: ok"
    )


def test_a_long_text_is_cut_at_a_word_with_an_ellipsis() -> None:
    text = "renew  the\nparking permit " * 10
    shown = marked_preview(chunk(text))
    assert shown.endswith("…") and len(shown) <= 80
    assert " ".join(text.split()).startswith(shown[:-1])
    assert marked_preview(chunk("x" * 200)) == "x" * 79 + "…"  # one word longer than the line
