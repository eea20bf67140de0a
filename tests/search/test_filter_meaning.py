"""Issue 42: `--label` means all of the labels and `--group` any of the groups, and every help
text says so (the CLI, the HTTP schema, the MCP tool and the page)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpg.cli import main
from kbpg.models.embedders import Embedder
from tests.conftest import TEMPLATE_DB, create_database, drop_database
from tests.search_kb import Doc, env_for, load_kb

DOCS = [
    Doc("both.md", "Both", "web", ["a"], [("Both", "Browser cookies and two-factor login.")],
        ["cookies", "2fa"]),
    Doc("cookies.md", "Cookies", "web", ["b"], [("Cookies", "Browser cookies settings.")],
        ["cookies"]),
    Doc("twofa.md", "Two factor", "web", ["c"], [("2FA", "Two-factor login codes.")], ["2fa"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def env(
    admin_url: str, template_url: str, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    name = f"kbpg_labels_{uuid.uuid4().hex[:10]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    try:
        load_kb(url, embedder, DOCS)
        yield env_for(url, Path(tmp_path_factory.mktemp("home")))
    finally:
        drop_database(admin_url, name)


def sources(env: dict[str, str], *args: str) -> set[str]:
    result = CliRunner().invoke(
        main, ["search", "cookies login", "--min-similarity", "-1", "--json", *args], env=env
    )
    assert result.exit_code == 0, result.stderr
    return {c["source"] for c in json.loads(result.stdout)["chunks"]}


def test_labels_mean_all_of_them_groups_any(env: dict[str, str]) -> None:
    assert sources(env, "--label", "cookies", "--label", "2fa") == {"both.md"}
    assert sources(env, "--label", "cookies") == {"both.md", "cookies.md"}
    assert sources(env, "--group", "a", "--group", "c") == {"both.md", "twofa.md"}


def test_every_help_says_all_for_labels() -> None:
    help_text = " ".join(CliRunner().invoke(main, ["search", "--help"]).stdout.split())
    assert "labelled L (repeatable: carrying all of the labels)" in help_text
    assert "group G (repeatable: in any of the groups; public: also the documents" in help_text
    page = (Path(__file__).parents[2] / "kbpg/serve/web/index.html").read_text()
    assert "labels: a chunk carrying all of them" in page
    assert "public: also chunks without groups" in page
