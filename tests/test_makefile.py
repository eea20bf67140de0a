"""The Makefile's installs (issue 42): `make demo` installs what running kbpg needs, not the
1.1 GB test and lint toolchain; `make install`/`make dev`/`make test` install the dev extra."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _plan(target: str) -> str:
    """The commands `make TARGET` would run from scratch (-n: none is run; -B: none is done)."""
    return subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_demo_installs_what_running_needs() -> None:
    plan = _plan("demo")
    assert "pip install --quiet -e '.[mcp]'" in plan
    assert ".[dev]" not in plan
    assert ". .venv/bin/activate" in plan


def test_install_dev_and_test_install_the_dev_extra() -> None:
    for target in ("install", "dev", "test"):
        assert "pip install --quiet -e '.[dev]'" in _plan(target), target
