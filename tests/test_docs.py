"""The documentation stays true: the README's first hour runs as written, its links resolve,
and the reference pages match the code (`kbpg --help`) and the database (`pg_proc`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import docs_reference
from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
NOTES = {
    "notes/guides/backups.md": "# Backups\n\nNightly backups run at 02:00 with pg_basebackup and are"
    " kept for 14 days.\n\n## Restoring\n\nTo restore a backup, stop the server and copy the base"
    " backup back.\n",
    "notes/oncall.md": "---\ntitle: On-call\nlabels: [ops]\n---\n# On-call rotation\n\nThe on-call"
    " engineer answers pages within 15 minutes, day and night.\n",
    "handbook.md": "# Leave\n\nStaff get twenty days of paid leave a year.\n",
}


def test_reference_pages_are_generated_from_the_code() -> None:
    for page, text in docs_reference.pages().items():
        assert page.read_text() == text, f"{page.name} is stale: make reference"


def test_the_cli_reference_lists_every_command() -> None:
    listed = re.findall(r"^## (kbpg(?: [\w-]+)*)$", docs_reference.CLI_PAGE.read_text(), re.M)
    help_text = subprocess.run(
        [str(Path(sys.executable).parent / "kbpg"), "--help"], capture_output=True, text=True
    ).stdout
    top = re.findall(r"^  ([a-z][\w-]*)  ", help_text, re.M)
    assert top and {f"kbpg {name}" for name in top} <= set(listed)
    assert listed[0] == "kbpg" and len(listed) == len(set(listed))


def test_the_sql_reference_lists_every_public_function(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "select p.proname, pg_catalog.oidvectortypes(p.proargtypes) from pg_catalog.pg_proc p"
        " where p.pronamespace = 'kb'::regnamespace and p.proname !~ '^_'"
        "   and p.prorettype <> 'pg_catalog.trigger'::regtype"
        "   and p.proname <> 'tsvector_token_count'"  # a pgvector-style support function
    ).fetchall()
    in_database = {(name, re.sub(r"\b\w+\.(?=\w)", "", args)) for name, args in rows}
    documented = {(name, args) for name, args, _ in docs_reference.sql_functions()}
    assert in_database == documented
    assert all(text for _, _, text in docs_reference.sql_functions())


def test_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert text.startswith("# kbpg\n\n```sh\nmake demo   #") and "\nmake test   #" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if not link.startswith("http"):
            assert (REPO_ROOT / link).is_file(), link


def _blocks(text: str, first: str, last: str, kind: str) -> list[str]:
    section = text[text.index(first) : text.index(last)]
    return re.findall(rf"```{kind}\n(.*?)```", section, re.DOTALL)


def _commands(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_first_hour_runs_as_written(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Steps 2-4 of the README, each command exactly as written, in a shell with the venv on
    PATH and a home holding ~/notes and ~/handbook.md, after the demo's ingest."""
    home = tmp_path / "home"
    for name, body in NOTES.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(body)
    env = {
        **cli_env,
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("COLUMNS", None)

    def shell(command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", command], cwd=REPO_ROOT, env=env, input=stdin, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}: {done.stderr}"
        return done

    shell("kbpg ingest samples/kb --recursive")  # what `make demo` did
    text = README.read_text()
    (start_fresh,) = _blocks(text, "## 2. Start fresh", "## 3.", "sh")
    outputs = [shell(c, stdin="y\n").stdout for c in _commands(start_fresh)]
    assert "documents: 0\n" in outputs[-1]

    (ingest,) = _blocks(text, "## 3. Ingest", "## 4.", "sh")
    for command in _commands(ingest):
        shell(command)
    searches, interfaces = _blocks(text, "## 4. Search", "## 5.", "sh")
    rows, as_json, context = (shell(c).stdout for c in _commands(searches))
    assert rows.splitlines()[1].startswith(f"  Backups,{home}/notes/guides/backups.md,Backups,")
    assert json.loads(as_json)["chunks"][0]["source"] == f"{home}/notes/guides/backups.md"
    assert "Nightly backups run at 02:00" in context

    psql, serve, curl = _commands(interfaces)
    assert f"{home}/notes/guides/backups.md" in shell(psql).stdout
    assert serve.endswith("&")
    server = subprocess.Popen(
        ["bash", "-c", f"exec {serve.removesuffix('&').strip()}"], cwd=REPO_ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8080/readyz", timeout=2) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("kbpg serve did not become ready")
                time.sleep(0.5)
        answer = json.loads(shell(curl).stdout)  # (HTTP shows no server path: the file's name)
        assert (answer["chunks"][0]["document"], answer["chunks"][0]["source"]) == (
            "Backups",
            "backups.md",
        )
    finally:
        server.terminate()
        server.wait(timeout=60)

    (python,) = _blocks(text, "## 4. Search", "## 5.", "python")
    done = subprocess.run(
        [sys.executable, "-c", python], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Nightly backups run at 02:00" in done.stdout
