"""The reference pages of the documentation, generated from the code so they cannot drift.

docs/reference-cli.md is every `kbpg` command's own `--help`; docs/reference-sql.md is every
public function of schema `kb` (a name not starting with `_`) with the COMMENT sql/ gives it;
docs/changelog.md is CHANGELOG.md.
tests/test_docs.py fails when a committed page differs from what this generates; `make
reference` writes them again:

    python -m tests.docs_reference
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from kbpg.cli import main as kbpg_cli

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = ROOT / "docs" / "reference-cli.md"
SQL_PAGE = ROOT / "docs" / "reference-sql.md"
CHANGELOG_PAGE = ROOT / "docs" / "changelog.md"
WIDTH = 96

# COMMENT ON FUNCTION kb.name(types) IS 'a' 'b' ...;  (adjacent literals, as SQL joins them)
_COMMENT = re.compile(
    r"^comment on function kb\.(?P<name>[a-z]\w*)\((?P<args>[^)]*)\) is\s+(?P<text>(?:'(?:[^']|'')*'\s*)+);",
    re.MULTILINE | re.IGNORECASE,
)


def commands(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    """(full name, command) of every command under `group`, depth first, in name order."""
    found: list[tuple[str, click.Command]] = []
    for name in sorted(group.commands):
        command = group.commands[name]
        if command.hidden:
            continue
        full = f"{prefix} {name}"
        found.append((full, command))
        if isinstance(command, click.Group):
            found.extend(commands(command, full))
    return found


def cli_page() -> str:
    # a fixed width: the page must not depend on the terminal that generated it
    # and the group's context settings (-h as well as --help), as `kbpg` itself runs it: click
    # caches a command's help option the first time it is asked for
    root = click.Context(
        kbpg_cli,
        info_name="kbpg",
        terminal_width=WIDTH,
        max_content_width=WIDTH,
        **kbpg_cli.context_settings,
    )
    lines = [
        "# Reference: the `kbpg` command",
        "",
        "Every command's own `--help`, generated from the code (`python -m tests.docs_reference`;",
        "a test fails when this page and the code differ).",
        "",
        "## kbpg",
        "",
        "```text",
        kbpg_cli.get_help(root),
        "```",
    ]
    contexts: dict[str, click.Context] = {"kbpg": root}
    for full, command in commands(kbpg_cli, "kbpg"):
        parent = contexts[full.rsplit(" ", 1)[0]]
        with click.Context(
            command, info_name=full.split()[-1], parent=parent, **command.context_settings
        ) as ctx:
            contexts[full] = ctx
            lines += ["", f"## {full}", "", "```text", command.get_help(ctx), "```"]
    return "\n".join(lines) + "\n"


def sql_functions() -> list[tuple[str, str, str]]:
    """(name, argument types, comment) of every public kb function the sql/ files define."""
    found = []
    for path in sorted((ROOT / "sql").glob("[0-9][0-9][0-9]-*.sql")):
        for match in _COMMENT.finditer(path.read_text()):
            literals = re.findall(r"'((?:[^']|'')*)'", match["text"])
            text = "".join(literals).replace("''", "'")
            args = " ".join(match["args"].replace("@extschema:vector@.", "").split())
            found.append((match["name"], args, text))
    return sorted(found)


def sql_page() -> str:
    lines = [
        "# Reference: the SQL functions",
        "",
        "Every public function of schema `kb` (names without a leading `_`), with its argument",
        "types and the COMMENT `sql/` gives it (`\\df+ kb.*` in psql shows the same), generated",
        "from the code (`python -m tests.docs_reference`; a test fails when this page, `sql/` and",
        "the database's `pg_proc` differ).",
        "",
    ]
    for name, args, text in sql_functions():
        lines += [f"## kb.{name}({args})", "", text, ""]
    return "\n".join(lines)


def pages() -> dict[Path, str]:
    # the changelog page is CHANGELOG.md as it is (MkDocs reads only docs/)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    return {CLI_PAGE: cli_page(), SQL_PAGE: sql_page(), CHANGELOG_PAGE: changelog}


if __name__ == "__main__":
    for page, text in pages().items():
        page.write_text(text)
        print(f"wrote {page.relative_to(ROOT)}", file=sys.stderr)
