"""Derived graph edges: the entities a chunk mentions, and link/entity edges refreshed from them."""

from __future__ import annotations

import itertools
import re
from typing import Any

import psycopg

from kbpg.store import queries

# Edge weights in [0, 1]: an explicit link is the author's own pointer; an entity edge is
# stronger the fewer documents share the entity (and none past MAX_ENTITY_DOCUMENTS).
WEIGHT_LINK = 0.9
MAX_ENTITY_DOCUMENTS = 5

_CODE = re.compile(r"(?<![\w-])[A-Za-z0-9]+(?:[-/][A-Za-z0-9]+)*(?![\w-])")
# A code holds a digit, and whitespace is neither \w nor "-": so codes are found inside the
# whitespace-separated words that hold a digit, with the same matches as over the whole text
# (90 -> 15 us in all for a 260-character chunk: the whole-text scan created a match object per
# word). The words are str.split()'s (the same whitespace as re's \s, checked for every code
# point) filtered in C: 7.9 -> 4.3 us a bench chunk, 3.8 -> 2.3 us an NPL text, against a
# pattern anchored at word starts, (?<!\S)[^\s0-9]*[0-9]\S* (the same words on NPL and fuzz).
_DIGITS = frozenset("0123456789")
_ACRONYM = re.compile(r"\b[A-Z]{3,}\b")
_NAME = re.compile(
    r"\b[A-Z][a-zA-Z'\u2019]+(?:(?:\s+(?:of|the|and|for|de|van|von|du|la))*\s+[A-Z][a-zA-Z'\u2019]+)+\b"
)
_NAME_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "as",
        "at",
        "but",
        "by",
        "for",
        "from",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "of",
        "on",
        "or",
        "our",
        "so",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "this",
        "those",
        "to",
        "we",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "with",
        "you",
        "your",
        "please",
        "note",
        "see",
        "all",
        "any",
        "each",
        "every",
        "no",
        "not",
        "yes",
    ]
)


def extract_entities(text: str) -> set[str]:
    """Identifiers and codes (PRK-204, ISO 9001 parts), acronyms and capitalised multi-word names.

    Whether an entity links chunks is decided later by how few documents mention it.
    """
    found: set[str] = set()
    for word in itertools.filterfalse(_DIGITS.isdisjoint, text.split()):
        for token in _CODE.findall(word):
            # ASCII only: a digit, and an upper-case letter (then lower() changes it)
            if len(token) >= 3 and not _DIGITS.isdisjoint(token) and token.lower() != token:
                found.add(token.upper())
    for match in _ACRONYM.finditer(text):
        found.add(match.group())
    for match in _NAME.finditer(text):
        words = match.group().split()
        # sentence-initial "The", "When", ... are not part of a name; "IT" in "IT Service" is
        while words and words[0].lower() in _NAME_STOP and not words[0].isupper():
            words.pop(0)
        while words and words[-1].lower() in _NAME_STOP and not words[-1].isupper():
            words.pop()
        if len(words) >= 2:
            found.add(" ".join(words).lower())
    return found


def refresh_edges(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Bring link and entity edges in line with the knowledge base; returns (added, removed).

    Runs in the caller's transaction.
    """
    distributed = conn.execute(queries.DISTRIBUTED).fetchone()
    statement = queries.REFRESH_EDGES_DISTRIBUTED if distributed and distributed[0] else None
    row = conn.execute(
        statement or queries.REFRESH_EDGES,
        {"link_weight": WEIGHT_LINK, "max_docs": MAX_ENTITY_DOCUMENTS},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
