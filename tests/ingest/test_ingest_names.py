"""Blank group, label and category names are refused everywhere, naming the file or line: a
typo (`groups: [""]`) used to store no groups at all, i.e. publish the document to every reader,
and `--group ""` stored {""}, readable by no one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kbpg.app import KnowledgeBase
from kbpg.errors import InvalidInput
from kbpg.ingest.document import Document, LoadFailure
from kbpg.ingest.loaders import iter_file
from kbpg.ingest.run import ingest_documents, ingest_paths
from kbpg.ingest.sources import iter_documents
from kbpg.store import db as kdb
from tests.helpers import run_kbpg
from tests.ingest.test_ingest import kb as kb  # the fixture
from tests.ingest.test_ingest import rows

BLANK_FRONT_MATTER = {
    "empty-item.md": 'groups: [""]',
    "space-item.md": 'groups: [" "]',
    "empty-string.md": 'groups: ""',
    "double-comma.md": 'groups: "hr,,finance"',
    "blank-label.md": 'labels: ["ok", "  "]',
    "blank-category.md": 'category: ""',
    "space-category.md": 'category: "  "',
}
BLANK_RECORDS = [
    {"id": "r-empty", "text": "x", "groups": [""]},
    {"id": "r-space", "text": "x", "groups": ["  "]},
    {"id": "r-string", "text": "x", "groups": ""},
    {"id": "r-label", "text": "x", "labels": ["\t"]},
    {"id": "r-category", "text": "x", "category": ""},
]


def folder(root: Path) -> Path:
    root.mkdir()
    for name, line in BLANK_FRONT_MATTER.items():
        (root / name).write_text(f"---\n{line}\n---\n# Secret\n\nSalary bands for staff.\n")
    (root / "good.md").write_text("---\ngroups: [hr]\n---\n# Good\n\nRenew a parking permit.\n")
    (root / "public.md").write_text("---\ngroups: []\n---\n# Public\n\nThe library opens at 9.\n")
    lines = [json.dumps(r) for r in BLANK_RECORDS] + [json.dumps({"id": "r-good", "text": "ok"})]
    (root / "records.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_loaders_refuse_blank_names_naming_the_file_or_line(tmp_path: Path) -> None:
    root = folder(tmp_path / "kb")
    for name in BLANK_FRONT_MATTER:
        (failure,) = iter_file(root / name)
        assert isinstance(failure, LoadFailure), name
        assert failure.where == str(root / name)
        assert "is blank" in failure.reason, failure.reason
    items = list(iter_file(root / "records.jsonl"))
    failures = {f.where: f.reason for f in items if isinstance(f, LoadFailure)}
    assert set(failures) == {f"{root / 'records.jsonl'}:{n}" for n in range(1, 6)}
    assert all("is blank" in reason for reason in failures.values()), failures
    assert [d.source for d in items if isinstance(d, Document)] == ["r-good"]


def test_nothing_with_a_blank_name_is_stored(
    db_url: str, kb: KnowledgeBase, tmp_path: Path
) -> None:
    root = folder(tmp_path / "kb")
    summary = ingest_paths(kb.db, kb.models, [root])
    assert (summary.added, summary.failed) == (3, len(BLANK_FRONT_MATTER) + len(BLANK_RECORDS))
    # sorted here: the database's collation may put "/" before or after letters
    stored = sorted(rows(db_url, "select source, groups from kb.documents"))
    assert stored == sorted(
        [
            ("r-good", []),
            (str((root / "good.md").resolve()), ["hr"]),
            (str((root / "public.md").resolve()), []),
        ]
    )


def test_command_line_and_python_names_are_checked(
    db_url: str, kb: KnowledgeBase, tmp_path: Path
) -> None:
    (tmp_path / "a.md").write_text("# A\n\nText.\n")
    for groups, labels, category in (([""], [], None), ([], [" "], None), ([], [], "")):
        with pytest.raises(InvalidInput, match="is blank"):
            list(iter_documents([tmp_path], groups=groups, labels=labels, category=category))
    # the Python API's documents (and any other source of them) go through the same check
    docs = [
        Document(source="py-blank", title="T", text="Salary bands.", groups=["hr", " "]),
        Document(source="py-good", title="T", text="Parking permits.", groups=["hr"]),
    ]
    summary = ingest_documents(kb.db, kb.models, docs)
    assert (summary.added, summary.failed) == (1, 1)
    assert summary.failures[0].where == "py-blank"
    assert "`groups` value ' ' is blank" in summary.failures[0].reason
    assert rows(db_url, "select source from kb.documents") == [("py-good",)]


def test_cli_refuses_a_blank_option_as_a_usage_error(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    (tmp_path / "a.md").write_text("# A\n\nText.\n")
    for option in ("--group", "--label", "--category"):
        done = run_kbpg("ingest", str(tmp_path / "a.md"), option, " ", env=cli_env)
        assert done.returncode == 2, done.stderr
        assert f"Invalid value for '{option}': ' ' is blank" in done.stderr
    listed = run_kbpg("documents", "list", "--json", env=cli_env)
    assert listed.stdout == "[]\n"


@pytest.mark.parametrize(
    ("column", "value"),
    [("groups", ["hr", ""]), ("groups", [" "]), ("labels", ["\n"]), ("category", " ")],
)
def test_sql_writes_refuse_blank_names(db_url: str, column: str, value: Any) -> None:
    """The tables refuse them too (CHECK), whoever writes: SQL, a table source, a writer role."""
    with kdb.connect(db_url) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                f"insert into kb.documents (source, content_hash, {column}) values ('d', 'h', %s)",
                (value,),
            )
        conn.rollback()
        doc = conn.execute(
            "insert into kb.documents (source, content_hash) values ('d', 'h') returning id"
        ).fetchone()
        assert doc is not None
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                f"insert into kb.chunks (document_id, ordinal, content, {column})"
                " values (%s, 0, 'x', %s)",
                (doc[0], value),
            )
