"""Issue 42's ingest traps, as a newcomer met them: an empty page failed the whole ingest,
MkDocs attribute lists leaked into titles and text, two "Release Notes" could not be told
apart, and nothing deleted by the path that was ingested."""

from __future__ import annotations

import json
from pathlib import Path

import toon_format
from click.testing import CliRunner

from kbpg.cli import main
from kbpg.store import db as kdb
from tests.helpers import invoke_kbpg

EMBED = '<html><head><title>Video</title></head><body><iframe src="x"></iframe></body></html>'


def _site(root: Path) -> Path:
    """Two MkDocs projects' pages with attribute lists and the same title, and an empty page."""
    for project in ("alpha", "beta"):
        docs = root / project / "docs"
        docs.mkdir(parents=True)
        (docs / "release-notes.md").write_text(
            "# Release Notes { #release-notes }\n\n"
            f"## Version 2.0 {{: #v2 .new }}\n\nThe {project} tokenizer now splits hyphens.\n"
            "{: .note }\n\n"
            f"[Download {project}](get.md){{ .md-button }} or keep `{{ #kept }}` in code.\n"
        )
    (root / "alpha" / "docs" / "video.html").write_text(EMBED)
    return root


def test_empty_page_is_skipped_and_strict_fails_on_it(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    site = _site(tmp_path / "site")
    result = invoke_kbpg("ingest", str(site), "-r", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    video = str((site / "alpha" / "docs" / "video.html").resolve())
    assert f"Warning: skipped {video}: no text to index" in result.stderr
    assert "added 2, updated 0, unchanged 0, removed 0, skipped 1, failed 0" in result.stderr
    summary = json.loads(result.stdout)
    assert (summary["added"], summary["skipped"], summary["failed"]) == (2, 1, 0)
    assert summary["skips"] == [{"where": video, "reason": "no text to index"}]

    # ingested without a group, the documents are public: `--group public` finds them
    notes = {str((site / p / "docs" / "release-notes.md").resolve()) for p in ("alpha", "beta")}
    found = invoke_kbpg("search", "tokenizer", "--group", "public", "--json", env=cli_env)
    assert {c["source"] for c in json.loads(found.stdout)["chunks"]} == notes
    listed = invoke_kbpg("documents", "list", "--group", "public", "--json", env=cli_env)
    assert {d["source"] for d in json.loads(listed.stdout)} == notes
    other = invoke_kbpg("search", "tokenizer", "--group", "staff", "--json", env=cli_env)
    assert json.loads(other.stdout)["chunks"] == []

    strict = invoke_kbpg("ingest", str(site), "-r", "--strict", env=cli_env)
    assert strict.returncode == 1
    assert "unchanged 2, removed 0, skipped 1, failed 0" in strict.stderr


def test_attribute_lists_never_reach_titles_text_or_output(
    tmp_path: Path, cli_env: dict[str, str], db_url: str
) -> None:
    site = _site(tmp_path / "site")
    assert invoke_kbpg("ingest", str(site), "-r", env=cli_env).returncode == 0
    with kdb.connect(db_url) as conn:
        titles = {r[0] for r in conn.execute("select title from kb.documents")}
        chunks = conn.execute("select section, content from kb.chunks").fetchall()
    assert titles == {"Release Notes"}
    assert {section for section, _ in chunks} == {"Release Notes > Version 2.0"}
    for _, content in chunks:
        assert "{" not in content.replace("`{ #kept }`", "").replace("{ #kept }", ""), content
        assert "tokenizer now splits hyphens." in content and "Download" in content

    found = invoke_kbpg("search", "tokenizer hyphens release notes", env=cli_env)
    assert found.returncode == 0, found.stderr
    rows = toon_format.decode(found.stdout)["chunks"]
    assert {r["document"] for r in rows} == {"Release Notes"}
    # the path tells the two "Release Notes" apart
    assert {r["source"] for r in rows} == {
        str((site / p / "docs" / "release-notes.md").resolve()) for p in ("alpha", "beta")
    }
    assert all(
        "{" not in r["section"] + r["content_preview"].replace("{ #kept }", "") for r in rows
    )
    context = invoke_kbpg("search", "tokenizer hyphens", "--context", env=cli_env).stdout
    assert "#release-notes" not in context and ".md-button" not in context


def test_delete_by_the_path_ingested_and_start_afresh(
    tmp_path: Path, cli_env: dict[str, str], monkeypatch: object
) -> None:
    site = _site(tmp_path / "site")
    assert invoke_kbpg("ingest", str(site), "-r", env=cli_env).returncode == 0
    (tmp_path / "notes.txt").write_text("A note about the tokenizer.")
    assert invoke_kbpg("ingest", str(tmp_path / "notes.txt"), env=cli_env).returncode == 0

    def sources() -> set[str]:
        listed = invoke_kbpg("documents", "list", "--json", env=cli_env)
        return {d["source"] for d in json.loads(listed.stdout)}

    alpha = str((site / "alpha" / "docs" / "release-notes.md").resolve())
    beta = str((site / "beta" / "docs" / "release-notes.md").resolve())
    # a folder, as it was given to ingest (here relative to the working directory)
    monkeypatch.chdir(site)  # type: ignore[attr-defined]
    deleted = invoke_kbpg("documents", "delete", "alpha", env=cli_env)
    assert (deleted.returncode, deleted.stdout) == (0, f"deleted {alpha}\n")
    assert sources() == {beta, str((tmp_path / "notes.txt").resolve())}
    missing = invoke_kbpg("documents", "delete", "alpha", "gamma", env=cli_env)
    assert missing.returncode == 1
    assert "Error: no such document: alpha, gamma" in missing.stderr

    runner = CliRunner()
    refused = runner.invoke(main, ["documents", "delete", "--all"], env=cli_env, input="n\n")
    assert refused.exit_code == 1 and len(sources()) == 2
    usage = invoke_kbpg("documents", "delete", "--all", "alpha", env=cli_env)
    assert usage.returncode == 2
    confirmed = runner.invoke(main, ["documents", "delete", "--all"], env=cli_env, input="y\n")
    assert confirmed.exit_code == 0 and confirmed.stdout.endswith("deleted 2 documents\n")
    assert sources() == set()
    again = invoke_kbpg("documents", "delete", "--all", "--yes", env=cli_env)
    assert (again.returncode, again.stdout) == (0, "deleted 0 documents\n")
