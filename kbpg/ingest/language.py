"""What `kbpg ingest` checks before it starts: the language asked for against the knowledge
base's, and the embedding model against that language."""

from __future__ import annotations

from typing import Any

import psycopg

from kbpg.errors import ConfigError
from kbpg.models.embedders import model_mismatch
from kbpg.store import queries
from kbpg.store.language import current_language, is_english


def ingest_warnings(
    conn: psycopg.Connection[Any], wanted: str | None, model_name: str
) -> list[str]:
    """What `kbpg ingest` says before it starts: KBPG_LANGUAGE other than the knowledge base's
    is an error (its text would be analysed in the recorded one); an English-only model on
    another language is a warning (kb.search leaves its vector arm out)."""
    language = current_language(conn)
    if wanted is not None:
        row = conn.execute(queries.RESOLVE_LANGUAGE, {"language": wanted}).fetchone()
        if row is not None and row[0] != language:
            raise ConfigError(
                f"KBPG_LANGUAGE is {row[0]}, but this knowledge base is in {language}",
                hint=f"run `kbpg db upgrade --language {row[0]}` (re-analyses every chunk), or "
                f"unset KBPG_LANGUAGE",
            )
    notes = []
    mismatch = model_mismatch(language, is_english(conn, language), model_name)
    if mismatch:
        notes.append(mismatch)
    return notes
