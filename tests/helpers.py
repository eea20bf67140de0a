"""Shared helpers for tests that run the real `kbpg` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kbpg.cli import main

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


def invoke_kbpg(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `kbpg` inside this process (click's runner) with the environment `env` (KBPG_*
    settings not in it unset): exit code, stdout and stderr as run_kbpg returns them, without
    an interpreter to start or a model to load each time. For what a separate process is not
    the point of (signals, concurrency, the console script itself: run_kbpg)."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KBPG_")}
    result = CliRunner().invoke(main, list(args), env={**unset, **env})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        [KBPG, *args], result.exit_code, result.stdout, result.stderr
    )


def clean_env(**overrides: str) -> dict[str, str]:
    """The process environment without KBPG_* settings, plus overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBPG_")}
    env["ORT_DISABLE_TELEMETRY"] = "1"
    env.update(overrides)
    return env
