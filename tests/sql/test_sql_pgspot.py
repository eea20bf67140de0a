"""pgspot (timescale's linter for PostgreSQL scripts) over every migration and sql/ file.

The scripts are checked as one stream, in the order a fresh database runs them (revisions
0001..head, then sql/ with pgvector's schema substituted for @extschema:vector@), so that
pgspot knows schema `kb` is the script's own. Zero findings in sql/ except inside the
functions inlined by design (false positives, explained at INLINED); the revisions' findings
are bounded to the kinds explained in the test.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from kbpg.store import db as kdb

PGSPOT = str(Path(sys.executable).parent / "pgspot")

# pgspot 0.9.4 reads a function body only from `AS '...'`: a SQL-standard body (`BEGIN ATOMIC
# ... END` or `RETURN expr`) makes it stop with IndexError. The test rewrites those bodies into
# the equivalent `AS $$ ... $$` so that their SQL is checked too.
ATOMIC = re.compile(r"^begin atomic\n(.*?)\nend;$", re.MULTILINE | re.DOTALL)
RETURN = re.compile(r"^return (.*?);$", re.MULTILINE | re.DOTALL)

# Functions without a SET search_path clause, by design: PostgreSQL inlines a SQL function
# only without one, and these run per row (or per probe), or in every search (whether the
# table is shared, who calls, whether access control is on: a SET clause saves and restores the
# setting around each call); their bodies are SQL-standard, bound to objects when created
# (kbpg.db applies the files under search_path pg_catalog, pg_temp), so nothing in them is
# looked up by name at run time.
INLINED = [
    "kb._chunks_shared",
    "kb._access_caller",
    "kb._access_enforced",
    "kb._chunk_filter_sql",
    "kb._chunk_filter_values",
    "kb._chunk_matches_filters",
    "kb._bm25_score",
    "kb._distributed",
    "kb._visible_to",
    "kb._metadata_match_sql",
    "kb._metadata_filter_sql",
    "kb._metadata_holds",
    "kb._metadata_mask_value",
    "kb._metadata_mask_prefix",
    "kb._metadata_row_filter_sql",
]

FROZEN = {
    "0001",
    "0002",
    "0003",
}  # released in 0.1.0: tests/production/test_production_upgrade.py hashes them


def sql_standard_bodies_as_strings(text: str) -> str:
    text = ATOMIC.sub(lambda m: "as $pgspot$\n" + m.group(1) + "\n$pgspot$;", text)
    return RETURN.sub(lambda m: "as $pgspot$ select " + m.group(1) + " $pgspot$;", text)


def migration_sql(frozen: bool) -> list[str]:
    scripts = []
    for path in sorted((kdb.migrations_dir() / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")):
        if (path.name[:4] in FROZEN) != frozen:
            continue
        spec = importlib.util.spec_from_file_location(f"kbpg_revision_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        scripts.append(f"-- {path.name}\n{sql_standard_bodies_as_strings(module.UPGRADE)}")
    return scripts


def function_sql() -> list[str]:
    scripts = []
    for path in kdb.sql_files():
        text = sql_standard_bodies_as_strings(kdb.sql_function_text(path, "extensions"))
        scripts.append(f"-- {path.name}\n{text}")
    return scripts


def findings(output: str, path: Path) -> list[tuple[str, str, int]]:
    """(code, message, line) of each finding pgspot printed in the section of `path`."""
    section = output.split(f"{path}: ", 1)[1].split("Errors:", 1)[0]
    return [
        (code, message, int(line))
        for code, message, line in re.findall(r"^(PS\d{3}): (.*) at line (\d+)$", section, re.M)
    ]


def test_pgspot_finds_nothing_unexplained(tmp_path: Path) -> None:
    frozen, revisions, functions = (tmp_path / f"{n}.sql" for n in ("frozen", "later", "sql"))
    frozen.write_text("\n".join(migration_sql(frozen=True)))
    revisions.write_text("\n".join(migration_sql(frozen=False)))
    functions.write_text("\n".join(function_sql()))
    # --append: one state through the three, in the order a fresh database runs them
    result = subprocess.run(
        [PGSPOT, "--append", str(frozen), str(revisions), str(functions)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "TOTAL:" in result.stdout and "out of range" not in result.stdout, result.stdout
    assert "Unknown: 0" in result.stdout, result.stdout

    # 0001-0003 are frozen (0.1.0, hashed by tests/production/test_production_upgrade.py): their findings
    # are unqualified names in CHECK constraints, defaults and trigger bodies, and `create
    # schema/extension if not exists`; bound when the migration runs, so what the deploying
    # session's search_path holds then. They cannot change; listed so that none is added.
    assert {code for code, _, _ in findings(result.stdout, frozen)} <= {
        "PS001",
        "PS005",
        "PS010",
        "PS016",
        "PS017",
    }, result.stdout

    # Revisions after 0.1.0: unqualified operators, functions and types (PS001/PS016/PS017,
    # e.g. 'english'::regconfig in 0008's generated column) in table, default, generated-column
    # and policy expressions only: bound when the migration runs, like 0001's; nothing else.
    # (New revisions do better to qualify them: pg_catalog.regconfig, operator(pg_catalog.=).)
    later = findings(result.stdout, revisions)
    assert {code for code, _, _ in later} <= {"PS001", "PS016", "PS017"}, later

    # sql/: findings only inside the functions that are inlined by design (INLINED), whose
    # bodies pgspot sees as strings after the rewrite above although PostgreSQL bound them at
    # creation: false positives. Every other function pins search_path and is clean.
    ours = findings(result.stdout, functions)
    inlined_lines = {
        line
        for code, message, line in ours
        if code == "PS005" and message.split(": ", 1)[1].split("(")[0] in INLINED
    }
    assert len(inlined_lines) == len(INLINED), ours
    assert [f for f in ours if f[2] not in inlined_lines] == [], ours
