"""The documentation's adapter examples (docs/searching.md) run as written (a new Python process
each) on samples/kb."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kbpg.app import KnowledgeBase
from tests.conftest import REPO_ROOT
from tests.helpers import clean_env

SECTION = "## Agents (MCP), LangChain and LlamaIndex"
PAGE = REPO_ROOT / "docs" / "searching.md"


def examples() -> dict[str, str]:
    """The section's Python blocks, by the adapter module they import."""
    page = PAGE.read_text()
    section = page[page.index(SECTION) :]
    end = section.find("\n## ", len(SECTION))  # the next section, if any
    section = section if end < 0 else section[:end]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return {re.findall(r"kbpg\.integrations\.(\w+)", block)[0]: block for block in blocks}


def run(code: str, url: str) -> list[str]:
    env = clean_env(KBPG_DATABASE_URL=url)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_both_adapters_have_an_example() -> None:
    assert sorted(examples()) == ["langchain", "llamaindex"]


@pytest.mark.parametrize("adapter", ["langchain", "llamaindex"])
def test_readme_example_runs(adapter: str, samples_kb: KnowledgeBase) -> None:
    lines = run(examples()[adapter], samples_kb.url)
    direct = samples_kb.search("how do I renew a parking permit", top=4, groups=["public"])
    if adapter == "langchain":
        assert lines[:4] == [f"{c.rank} {c.section} {round(c.score, 4)}" for c in direct.chunks]
        per_call = samples_kb.search("when is the bulky waste collected", top=2, category="waste")
        assert lines[4:] == [str([c.document for c in per_call.chunks]), "1"]
    else:
        direct = samples_kb.search("how do I renew a parking permit", top=4, category="permits")
        assert lines[:4] == [f"{c.chunk_id} {round(c.score, 4)} {c.section}" for c in direct.chunks]
        assert lines[4:] == [
            "LLM is explicitly disabled. Using MockLLM.",
            str(sorted({c.document for c in direct.chunks})),
        ]
