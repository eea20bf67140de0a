"""A small hand-built knowledge base for the search tests (real model, real database)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kbpg.models.embedders import Embedder
from kbpg.store import db as kdb
from tests.conftest import TEMPLATE_DB, create_database, drop_database
from tests.helpers import clean_env


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
            (
                "Parking permits > Lost permits",
                "Report a lost or stolen parking permit at the service desk; a replacement "
                "permit costs 10 euros.",
            ),
            (
                "Parking permits > Disabled parking",
                "Blue badge holders may park free of charge in any resident parking zone.",
            ),
        ],
        ["howto"],
    ),
    Doc(
        "city/parking/fines.md",
        "Parking fines",
        "parking",
        ["public"],
        [
            (
                "Parking fines > Paying a fine",
                "Pay a parking fine online within 14 days to get the reduced rate.",
            ),
            (
                "Parking fines > Appeals",
                "Appeal a parking fine in writing within 28 days; include photos and your "
                "permit number if you hold a residential parking permit.",
            ),
        ],
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


def env_for(url: str, home: Path, **extra: str) -> dict[str, str]:
    """A clean environment for running `kbpg` against `url`."""
    return clean_env(KBPG_DATABASE_URL=url, KBPG_HOME=str(home), **extra)


@pytest.fixture(scope="module")
def kb_url(admin_url: str, template_url: str, embedder: Embedder) -> Iterator[str]:
    """A migrated database holding DOCS, shared by the tests of one module (read only)."""
    name = f"kbpg_search_{uuid.uuid4().hex[:10]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    try:
        load_kb(url, embedder)
        yield url
    finally:
        drop_database(admin_url, name)


@pytest.fixture(scope="module")
def kb_env(kb_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return env_for(kb_url, tmp_path_factory.mktemp("kbpg-home"))


def set_foreign_space(url: str, model: str, dimension: int) -> None:
    """Record another model's embedding space, as if the KB had been built with it."""
    with kdb.connect(url) as conn:
        conn.execute("select kb.set_embedding_space(%s, %s)", (model, dimension))
        conn.commit()


# Queries are data: none of these may error, inject, or reach SQL as anything but a value.
HOSTILE_QUERIES = [
    "renew permit'; drop table kb.chunks; --",
    "parking \"permit\" 'renewal'",
    "permit; select pg_sleep(10);",
    "back\\slash \\\\ permit \\'",
    "permit & renew | !fine",
    "(permit) : * renew:* !!! && || ()",
    '-permit -"renew" or OR or',
    ":*",
    "!",
    "%s %(query)s {} $1",
    "renew " * 2000,  # 12,000 characters
    "x" * 10_000,
    "図書館カードの更新",
    "Как продлить разрешение на парковку",
    "🅿️ parking 🚗 permit",
]
