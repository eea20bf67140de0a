"""A small hand-built knowledge base for the search tests (real model, real database)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from kbpg import db as kdb
from kbpg.embedding import Embedder


@dataclass(frozen=True)
class Doc:
    source: str
    title: str
    category: str
    groups: list[str]
    chunks: list[tuple[str, str]]  # (section, content)
    labels: list[str] = field(default_factory=list)


DOCS = [
    Doc(
        "city/parking/permits.md",
        "Parking permits",
        "parking",
        ["public"],
        [
            (
                "Parking permits > Renewing a permit",
                "Residents renew a residential parking permit online in the permit portal "
                "before it expires. Renewal costs 40 euros a year and needs proof of address.",
            ),
            (
                "Parking permits > Visitor permits",
                "Visitor parking permits are day passes for guests of residents; buy up to "
                "twenty a month in the permit portal.",
            ),
        ],
        ["howto"],
    ),
    Doc(
        "city/waste/collection.md",
        "Waste collection",
        "waste",
        ["public"],
        [
            (
                "Waste collection > Bin days",
                "Household bins are collected weekly; recycling every second Tuesday. Put "
                "bins at the kerb by 7 am.",
            ),
            (
                "Waste collection > Bulky items",
                "Book a bulky item pick-up for furniture and mattresses; the first two "
                "items each year are free.",
            ),
        ],
    ),
    Doc(
        "staff/payroll.md",
        "Payroll",
        "hr",
        ["staff"],
        [
            (
                "Payroll > Pay dates",
                "Staff salaries are paid on the 25th of each month; parking permit costs "
                "for staff are deducted from payroll.",
            ),
        ],
        ["confidential"],
    ),
    Doc(
        "city/library/cards.md",
        "Library cards",
        "library",
        ["public"],
        [
            (
                "Library cards",
                "A library card is free for residents. Renew your library card at any branch "
                "desk with photo identification.",
            ),
            (
                "図書館カード",
                "図書館カードは住民なら無料です。どの窓口でも更新できます。",
            ),
        ],
        ["howto"],
    ),
]


def load_kb(url: str, embedder: Embedder, docs: list[Doc] = DOCS) -> None:
    """Insert `docs` with real embeddings (what `kbpg ingest` would write)."""
    with kdb.connect(url) as conn:
        conn.execute(
            "select kb.set_embedding_space(%s, %s)", (embedder.model_name, embedder.dimension)
        )
        for doc in docs:
            row = conn.execute(
                "insert into kb.documents (source, title, category, groups, labels, content_hash)"
                " values (%s, %s, %s, %s, %s, %s) returning id",
                (
                    doc.source,
                    doc.title,
                    doc.category,
                    doc.groups,
                    doc.labels,
                    hashlib.sha256(repr(doc.chunks).encode()).hexdigest(),
                ),
            ).fetchone()
            assert row is not None
            vectors = embedder.embed_documents([content for _, content in doc.chunks])
            for ordinal, ((section, content), vector) in enumerate(
                zip(doc.chunks, vectors, strict=True)
            ):
                conn.execute(
                    "insert into kb.chunks (document_id, ordinal, section, content, groups,"
                    " category, labels, embedding) values (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (row[0], ordinal, section, content, doc.groups, doc.category, doc.labels,
                     vector),
                )  # fmt: skip
        conn.commit()
