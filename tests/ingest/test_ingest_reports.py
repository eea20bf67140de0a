"""Every skipped input is reported as `skipped WHERE: reason` and nothing else on stderr: JSONL
records by PATH:LINE (a duplicate id or a vector of the wrong size named only the id), special
files by what they are (they read "Not a directory"), broken PDFs without pypdf's own lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import run_kbpg


def test_skips_name_the_file_or_line_and_nothing_else_is_printed(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    records = tmp_path / "records.jsonl"
    records.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"id": "a", "text": "First record about parking.", "embedding": [0.1] * 384},
                {"id": "a", "text": "The same id again."},
                {"id": "b", "text": "A vector of the wrong size.", "embedding": [0.1, 0.2]},
                {"id": "c", "text": "A good record about libraries."},
            )
        )
        + "\n"
    )
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\n1 0 obj << >> endobj\n")  # no xref, no %%EOF
    # in a folder (issue 38): a FIFO `.md` (never opened: it would block), a symlink loop and a
    # dangling symlink, each reported with its reason and counted as failed
    folder = tmp_path / "folder"
    folder.mkdir()
    os.mkfifo(folder / "pipe.md")
    (folder / "loop.md").symlink_to(folder / "loop.md")
    (folder / "gone.md").symlink_to(folder / "missing.md")
    done = run_kbpg(
        "ingest", str(records), str(fifo), str(broken), str(folder), "--recursive",
        "--follow-symlinks", env=cli_env,
    )  # fmt: skip
    assert done.returncode == 1
    skipped = sorted(line for line in done.stderr.splitlines() if line.startswith("skipped "))
    assert skipped == sorted(
        [
            f"skipped {records}:2: duplicate source 'a' in this ingest; skipped",
            f"skipped {records}:3: `embedding` has 2 dimensions; this knowledge base holds"
            " 384-d vectors (all-MiniLM-L6-v2)",
            f"skipped {fifo}: not a regular file or directory (a device, FIFO or socket)",
            f"skipped {broken}: cannot read PDF: PdfStreamError: Stream has ended unexpectedly",
            f"skipped {folder}/pipe.md: not a regular file or directory (a device, FIFO or socket)",
            f"skipped {folder}/loop.md: a symlink loop (too many levels of symbolic links)",
            f"skipped {folder}/gone.md: a dangling symlink (its target {folder}/missing.md does"
            " not exist)",
        ]
    )
    others = [
        line
        for line in done.stderr.splitlines()
        if not line.startswith(("skipped ", "ingest: ", "added ", "\r"))
    ]
    assert others == [], done.stderr  # pypdf printed "EOF marker not found" here
