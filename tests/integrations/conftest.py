"""The sample knowledge base (samples/kb, ingested by kbpg's own pipeline) for the adapters."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbpg.app import KnowledgeBase
from kbpg.ingest.run import ingest_paths
from kbpg.models.embedders import Embedder
from tests.conftest import TEMPLATE_DB, create_database, drop_database

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "kb"


def ingested_samples(admin_url: str, embedder: Embedder) -> tuple[str, KnowledgeBase]:
    """A new database with samples/kb ingested, and a KnowledgeBase on it (name, kb)."""
    name = f"kbpg_samples_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    kb = KnowledgeBase(url, embedder, pool_size=2)
    summary = ingest_paths(kb.db, kb.models, [SAMPLES], recursive=True)
    assert summary.documents == len(list(SAMPLES.rglob("*.md")))
    return name, kb


@pytest.fixture(scope="package")
def samples_kb(admin_url: str, template_url: str, embedder: Embedder) -> Iterator[KnowledgeBase]:
    """samples/kb in a database of its own, shared by the adapter tests (they only read)."""
    name, kb = ingested_samples(admin_url, embedder)
    try:
        yield kb
    finally:
        kb.close()
        drop_database(admin_url, name)


def relative(source: str) -> str:
    """A sample's source as its path under samples/kb."""
    return str(Path(source).relative_to(SAMPLES))
