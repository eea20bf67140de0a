"""Heading-aware chunking into overlapping windows that always fit the embedding model's window."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kbpg.errors import IngestError

SECTION_SEPARATOR = " > "
DEFAULT_OVERLAP_TOKENS = 32
# The heading path is embedded in front of every chunk; it may use at most this share of the
# window (longer paths keep their last headings), the rest is for the chunk's own text.
_MAX_PREFIX_SHARE = 4
# A chunk may end early at a paragraph break once it is at least this full.
_PARAGRAPH_BREAK_FILL = 0.5
# Counts of units are added up; word pieces are additive across whitespace, but a stand-in
# tokenizer (OpenAI provider) may not be, so a packed chunk is re-counted and re-packed.
_MAX_REPACKS = 6
# Memory and tokenizer work stay bounded whatever a section's size: a section is first counted
# whole only when it could fit one window (no word piece is shorter than a character; past 16
# characters a token it cannot fit in practice, and the split path is exact either way), whole
# sections are counted in groups of at most _COUNT_GROUP_CHARS, and a long section is split
# piece by piece, each piece at most _PIECE_CHARS and cut at a paragraph, line or word break
# (chunks never cross a piece boundary, as they never cross a heading).
_WHOLE_CHARS_PER_TOKEN = 16
_COUNT_GROUP_CHARS = 256_000
_PIECE_CHARS = 64_000

_PARAGRAPH = re.compile(r"\S(?:.*?\S)?(?=\n[ \t]*\n|\s*\Z)", re.S)
_LINE = re.compile(r"[^\n]*\S[^\n]*")
_SENTENCE = re.compile(r"\S.*?(?:[.!?][\"')\]]*(?=\s)|\Z)", re.S)
_WORD = re.compile(r"\S+")


class TokenCounter(Protocol):
    """The part of an Embedder the chunker needs."""

    @property
    def max_tokens(self) -> int: ...

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]: ...


@dataclass(frozen=True)
class Link:
    """A link found in a section: where it sits in the text and the source it resolves to."""

    offset: int
    target: str
    fragment: str = ""


@dataclass(frozen=True)
class Section:
    """Text under one heading path (the document title first)."""

    path: tuple[str, ...]
    text: str
    links: tuple[Link, ...] = ()

    @property
    def heading(self) -> str:
        return SECTION_SEPARATOR.join(p for p in self.path if p)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A window `start:end` of its section's text. Its content and embedded text are made when
    asked for, not held: a 50 MB section's 100k chunks would otherwise hold it twice more."""

    ordinal: int
    section: str
    text: str = field(repr=False, compare=False)  # the whole section, shared by its chunks
    prefix: str  # the heading path embedded in front of the content ("" for none)
    token_count: int
    section_index: int
    start: int
    end: int

    @property
    def content(self) -> str:
        return self.text[self.start : self.end]

    @property
    def embed_text(self) -> str:
        return embed_text(self.prefix, self.content)


@dataclass(frozen=True)
class _Unit:
    start: int
    end: int
    tokens: int
    paragraph_start: bool


def embed_text(prefix: str, content: str) -> str:
    """What the model sees for a chunk: its heading path, then its text."""
    return f"{prefix}\n{content}" if prefix else content


def heading_prefix(path: tuple[str, ...], counter: TokenCounter) -> str:
    """The heading path to embed: whole when short, else its last headings, else cut by words."""
    limit = max(counter.max_tokens // _MAX_PREFIX_SHARE, 8)
    parts = [p for p in path if p]
    candidates = [SECTION_SEPARATOR.join(parts[i:]) for i in range(len(parts))]
    if not candidates:
        return ""
    counts = counter.count_tokens_batch(candidates)
    for candidate, count in zip(candidates, counts, strict=True):
        if count - 2 <= limit:
            return candidate
    words = candidates[-1].split()
    while words and counter.count_tokens_batch([" ".join(words)])[0] - 2 > limit:
        words = words[: max(len(words) * 3 // 4, len(words) - 1)] if len(words) > 1 else []
    return " ".join(words)


def _units(text: str, budget: int, counter: TokenCounter) -> list[_Unit]:
    """Sentence-sized spans of `text` (words, or character runs, when a sentence is too long)."""
    spans: list[tuple[int, int, bool]] = []
    for para in _PARAGRAPH.finditer(text):
        first = True
        for line in _LINE.finditer(para.group()):
            for sentence in _SENTENCE.finditer(line.group()):
                start = para.start() + line.start() + sentence.start()
                spans.append((start, start + len(sentence.group().rstrip()), first))
                first = False
    counts = counter.count_tokens_batch([text[s:e] for s, e, _ in spans])
    units: list[_Unit] = []
    for (start, end, para_start), count in zip(spans, counts, strict=True):
        if count - 2 <= budget:
            units.append(_Unit(start, end, count - 2, para_start))
            continue
        words = [(start + m.start(), start + m.end()) for m in _WORD.finditer(text[start:end])]
        word_counts = counter.count_tokens_batch([text[s:e] for s, e in words])
        for index, ((ws, we), wc) in enumerate(zip(words, word_counts, strict=True)):
            first_word = para_start and index == 0
            if wc - 2 <= budget:
                units.append(_Unit(ws, we, wc - 2, first_word))
                continue
            # a "word" of many word pieces (punctuation runs, CJK): no piece of `budget`
            # characters can hold more than `budget` word pieces
            for cs in range(ws, we, budget):
                ce = min(cs + budget, we)
                units.append(_Unit(cs, ce, ce - cs, first_word and cs == ws))
    return units


def _pack(units: list[_Unit], budget: int, overlap: int) -> list[tuple[int, int]]:
    """Greedy windows of whole units within `budget` tokens, consecutive windows overlapping."""
    windows: list[tuple[int, int]] = []
    i, n = 0, len(units)
    while i < n:
        j, total = i, 0
        while j < n and total + units[j].tokens <= budget:
            total += units[j].tokens
            j += 1
        j = max(j, i + 1)
        if j < n:
            # end at a paragraph break when one leaves the window reasonably full
            filled = 0
            best = None
            for k in range(i, j):
                if k > i and units[k].paragraph_start and filled >= budget * _PARAGRAPH_BREAK_FILL:
                    best = k
                filled += units[k].tokens
            if best is not None and not units[j].paragraph_start:
                j = best
        windows.append((i, j))
        if j >= n:
            break
        k, carried = j, 0
        while k - 1 > i and carried + units[k - 1].tokens <= overlap:
            k -= 1
            carried += units[k].tokens
        if k == j and j - 1 > i and units[j - 1].tokens <= budget // 2:
            # a sentence longer than the overlap is still repeated whole: windows must overlap
            k = j - 1
        i = k
    return windows


def chunk_sections(
    sections: Sequence[Section],
    counter: TokenCounter,
    *,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> list[Chunk]:
    """Cut sections into chunks whose embedded text (heading path + content) fits the window.

    Chunks never cross a heading. A section longer than the window becomes overlapping windows
    of whole sentences (preferring paragraph breaks); nothing is ever truncated.
    """
    max_tokens = counter.max_tokens
    prefixes: dict[tuple[str, ...], tuple[str, int]] = {}
    live = [(index, s) for index, s in enumerate(sections) if s.text and not s.text.isspace()]
    for _, section in live:
        if section.path not in prefixes:
            prefix = heading_prefix(section.path, counter)
            tokens = counter.count_tokens_batch([prefix])[0] - 2 if prefix else 0
            prefixes[section.path] = (prefix, tokens)
    whole = _whole_counts([(prefixes[s.path][0], s.text) for _, s in live], counter)
    chunks: list[Chunk] = []
    for (index, section), whole_count in zip(live, whole, strict=True):
        prefix, prefix_tokens = prefixes[section.path]
        text = section.text
        spans: Iterable[tuple[int, int, int]]
        if whole_count is not None and whole_count <= max_tokens:
            start = len(text) - len(text.lstrip())
            end = len(text.rstrip())
            spans = [(start, end, whole_count)]
        else:
            spans = (
                (offset + s, offset + e, c)
                for offset, piece in _pieces(text)
                for s, e, c in _split_section(piece, prefix, prefix_tokens, counter, overlap_tokens)
            )
        heading = section.heading
        for start, end, count in spans:
            chunks.append(
                Chunk(
                    ordinal=len(chunks),
                    section=heading,
                    text=text,
                    prefix=prefix,
                    token_count=count,
                    section_index=index,
                    start=start,
                    end=end,
                )
            )
    return chunks


def _whole_counts(sections: Sequence[tuple[str, str]], counter: TokenCounter) -> list[int | None]:
    """Token counts of each (prefix, text) embedded whole; None where it cannot fit one window."""
    limit = counter.max_tokens * _WHOLE_CHARS_PER_TOKEN
    counts: list[int | None] = [None] * len(sections)
    group: list[int] = []
    chars = 0

    def flush() -> None:
        texts = [embed_text(sections[i][0], sections[i][1].strip()) for i in group]
        for i, count in zip(group, counter.count_tokens_batch(texts), strict=True):
            counts[i] = count
        group.clear()

    for i, (_, text) in enumerate(sections):
        if len(text) > limit:
            continue
        group.append(i)
        chars += len(text)
        if chars >= _COUNT_GROUP_CHARS:
            flush()
            chars = 0
    if group:
        flush()
    return counts


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """`text` as (offset, piece) of at most _PIECE_CHARS, cut at the last paragraph break, else
    line break, else whitespace before the limit (a hard cut only in a 64k-character word);
    one piece at a time, so a huge section is never held twice."""
    if len(text) <= _PIECE_CHARS:
        yield 0, text
        return
    start = 0
    while len(text) - start > _PIECE_CHARS:
        limit = start + _PIECE_CHARS
        cut = -1
        for separator in ("\n\n", "\n", " "):
            cut = text.rfind(separator, start + _PIECE_CHARS // 2, limit)
            if cut > 0:
                break
        end = cut if cut > 0 else limit
        piece = text[start:end]
        if piece.strip():
            yield start, piece
        start = end
    piece = text[start:]
    if piece.strip():
        yield start, piece


def _split_section(
    text: str, prefix: str, prefix_tokens: int, counter: TokenCounter, overlap: int
) -> list[tuple[int, int, int]]:
    budget = counter.max_tokens - 2 - prefix_tokens - (1 if prefix else 0)
    for _ in range(_MAX_REPACKS):
        if budget < 8:
            break
        units = _units(text, budget, counter)
        windows = _pack(units, budget, min(overlap, budget // 4))
        spans = [(units[i].start, units[j - 1].end) for i, j in windows]
        counts = counter.count_tokens_batch([embed_text(prefix, text[s:e]) for s, e in spans])
        worst = max(counts) - counter.max_tokens
        if worst <= 0:
            return [(s, e, c) for (s, e), c in zip(spans, counts, strict=True)]
        budget -= worst
    raise IngestError(
        f"cannot cut a section into chunks of at most {counter.max_tokens} tokens "
        f"(heading {prefix[:80]!r})"
    )
