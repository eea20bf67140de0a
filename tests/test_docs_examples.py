"""The docs' examples marked `<!-- tested: tests/test_docs_examples.py -->` run as written: each
`sh` block's commands in a shell with the venv on PATH, each `sql` block through `kbpg db psql`,
against samples/kb as `make demo` ingests it; what they print is checked against what the text
around them says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

MARK = "<!-- tested: tests/test_docs_examples.py -->"
PARKING = {p.name for p in (REPO_ROOT / "samples/kb/parking").glob("*.md")}
# the parking pages' dates and category, as kb.facets lists them
PARKING_FACETS = {"2023-11-02", "2024-03-15", "2025-01-20", "2025-06-30", "2024-09-01", "permits"}
# what each example's output names of the parking pages, by its first words (updated:
# accessible 2023-11-02, fines 2024-03-15, renew 2025-01-20, residential 2025-06-30, visitor
# 2024-09-01)
EXPECTED: dict[str, set[str] | None] = {
    # an indexed key (the bitmaps) answers as before; "list" names no page
    "kbpg metadata-keys index updated": set(),
    """kbpg search "parking permit" --filter '{"updated": {"$in": ["2025-01-20", "2024-09-01"]}}'""": {
        "renew-permit.md",
        "visitor-permits.md",
    },
    "kbpg metadata-keys list": set(),
    # (the row of "updated", indexed above: five values; checked below)
    """SELECT key, "values", cached_values FROM kb.list_indexed_metadata_keys();""": None,
    """SELECT s.rank, s.source, h.snippet, h.highlights
  FROM kb.search('parking permit', filter => '{"updated": {"$gte": "2025-01-01"}}') s,
       kb.highlight(s.content, 'parking permit', 120) h;""": {
        "renew-permit.md",
        "residential-permits.md",
    },
    "SELECT * FROM kb.facets('parking permit', '{category,metadata.updated}');": PARKING_FACETS,
    # the newest page first (checked on the first row below)
    """kbpg search "parking permit" --recency "30 days" --recency-key updated --filter '{"updated": {"$exists": true}}'""": None,
    """kbpg search "parking permit" --filter '{"updated": {"$gte": "2025-01-01"}}'""": {
        "renew-permit.md",
        "residential-permits.md",
    },
    """kbpg search "parking permit" --filter 'updated>=2024-01-01' --filter 'updated<2025-01-01'""": {
        "fines-and-appeals.md",
        "visitor-permits.md",
    },
    """SELECT rank, source, section\n  FROM kb.search('parking permit', filter => '{"updated": {"$gte": "2025-01-01"}}');""": {
        "renew-permit.md",
        "residential-permits.md",
    },
}


def marked_blocks() -> list[tuple[str, str, str]]:
    """(page, kind, body) of every marked block in docs/."""
    found = []
    for page in sorted((REPO_ROOT / "docs").glob("*.md")):
        text = page.read_text()
        for kind, body in re.findall(
            re.escape(MARK) + r"\n```(\w+)\n(.*?)```", text, flags=re.DOTALL
        ):
            found.append((page.name, kind, body))
    return found


def test_every_marked_example_is_known() -> None:
    examples = [
        command
        for _, kind, body in marked_blocks()
        for command in ([body.strip()] if kind == "sql" else body.strip().splitlines())
    ]
    assert sorted(examples) == sorted(EXPECTED)


@pytest.fixture
def env(cli_env: dict[str, str]) -> dict[str, str]:
    env = {**cli_env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    done = subprocess.run(
        ["kbpg", "ingest", "samples/kb", "--recursive"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return env


def test_the_marked_examples_print_what_the_docs_say(env: dict[str, str]) -> None:
    for page, kind, body in marked_blocks():
        if kind == "sh":
            runs = [(line, ["bash", "-c", line]) for line in body.strip().splitlines()]
        else:
            runs = [(body.strip(), ["kbpg", "db", "psql", "-c", body.strip()])]
        for example, argv in runs:
            done = subprocess.run(
                argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"{page}: {example}: {done.stderr}"
            named = {name for name in PARKING if f"parking/{name}" in done.stdout}
            expected = EXPECTED[example]
            if expected is None and kind == "sql":  # the indexed key, as indexed above
                assert re.search(r"updated\s*\|\s*5\s*\|\s*0", done.stdout), done.stdout
            elif expected is None:  # --recency: the first row is the newest page
                first = done.stdout.splitlines()[1]
                assert "parking/residential-permits.md" in first, done.stdout
            elif expected is PARKING_FACETS:  # kb.facets: the values, not the files
                assert all(value in done.stdout for value in expected), done.stdout
            else:
                assert named == expected, f"{page}: {example}:\n{done.stdout}"
