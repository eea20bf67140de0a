"""Shared helpers for tests that run the real `kbpg` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KBPG = str(Path(sys.executable).parent / "kbpg")


def run_kbpg(
    *args: str, env: dict[str, str], input: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the installed `kbpg` console script as a user would."""
    return subprocess.run(
        [KBPG, *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def clean_env(**overrides: str) -> dict[str, str]:
    """The process environment without KBPG_* settings, plus overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
    env["ORT_DISABLE_TELEMETRY"] = "1"
    env.update(overrides)
    return env
