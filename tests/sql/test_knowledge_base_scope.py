"""Writes name the tables of kb_data, reads the views of kb (revision 0028).

Citus refuses a write through a view when the statement touches a Citus table, so every write
in sql/ and in the Python writer names the table; and since a table holds every knowledge
base's rows, each UPDATE and DELETE of one names the knowledge base it changes
(docs/knowledge-bases-design.md, docs/citus.md)."""

from __future__ import annotations

import re
from pathlib import Path

from kbpg.store import db as kdb

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(ROOT.glob("sql/*.sql")) + sorted((ROOT / "kbpg").rglob("*.py"))
WRITE = re.compile(
    r"\b(insert\s+into|update|delete\s+from|truncate|copy|merge\s+into)\s+(kb|kb_data)\.(\w+)",
    re.IGNORECASE,
)


def _writes() -> list[tuple[str, int, str, str, str]]:
    """(file, line, verb, schema, relation) of every write statement's target, comments aside."""
    found = []
    for path in SOURCES:
        text = path.read_text()
        for match in WRITE.finditer(text):
            line_start = text.rfind("\n", 0, match.start()) + 1
            before = text[line_start : match.start()]
            if "--" in before or before.lstrip().startswith("#"):
                continue
            verb, schema, relation = match.groups()
            found.append(
                (
                    str(path.relative_to(ROOT)),
                    text.count("\n", 0, match.start()) + 1,
                    " ".join(verb.lower().split()),
                    schema,
                    relation,
                )
            )
    return found


def _tables(db_url: str) -> set[str]:
    with kdb.connect(db_url) as conn:
        rows = conn.execute(
            "select relname from pg_class where relnamespace = 'kb_data'::regnamespace"
            " and relkind in ('r', 'p')"
        ).fetchall()
    return {r[0] for r in rows}


def test_no_write_goes_through_a_view(db_url: str) -> None:
    views = _tables(db_url)
    assert {"documents", "chunks", "lexeme_stats"} <= views
    through_views = [
        f"{file}:{line}: {verb} kb.{relation}"
        for file, line, verb, schema, relation in _writes()
        if schema == "kb" and relation in views
    ]
    assert through_views == []


# `kbpg db distribute` rewrites every knowledge base's rows (it moves the whole database)
WHOLE_DATABASE = {"kbpg/store/distribute.py"}


def test_every_update_and_delete_names_its_knowledge_base() -> None:
    unscoped = []
    for path in SOURCES:
        if str(path.relative_to(ROOT)) in WHOLE_DATABASE:
            continue
        text = path.read_text()
        if path.suffix == ".py":  # adjacent literals are one string: "... x"\n    " where ..."
            text = re.sub(r'"\n\s*"', "\n", text)
        # (the registry of knowledge bases is keyed by the knowledge base itself)
        for match in re.finditer(
            r"\b(update|delete\s+from)\s+kb_data\.(?!knowledge_bases\b)\w+", text, re.IGNORECASE
        ):
            # the statement runs to its semicolon or the end of its string literal
            end = min(
                (i for i in (text.find(";", match.end()), text.find('"', match.end())) if i > 0),
                default=len(text),
            )
            if "kb_id" not in text[match.start() : end]:
                unscoped.append(
                    f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
                )
    assert unscoped == []
