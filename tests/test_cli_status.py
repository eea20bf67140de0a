"""The CLI's progress for one long SQL call that reports nothing itself: the seconds so far."""

from __future__ import annotations

import re
import threading
import time

import pytest

from kbpg.cli.common import elapsed_status


def test_a_long_call_shows_its_seconds_on_stderr_and_nothing_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen = ""
    with elapsed_status("indexing product: bitmaps"):
        # until the first tick is out (a second in), at most 10 s on a loaded machine
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
            captured = capsys.readouterr()
            assert captured.out == ""
            seen += captured.err
    assert re.fullmatch(r"indexing product: bitmaps: \d+ s\n", seen), seen
    # the ticker stops with the block
    assert "kbpg-elapsed" not in {t.name for t in threading.enumerate()}
