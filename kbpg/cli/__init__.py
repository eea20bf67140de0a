"""The `kbpg` command line: stdout carries data, stderr carries errors and progress.

One module per command family (db, search, library, access, sources); this one is the entry
point.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import click

from kbpg import __version__
from kbpg.cli import access, db, library, search, sources
from kbpg.cli.common import AppContext

__all__ = ["main"]


def _sigterm_to_exit(signum: int, frame: Any) -> None:
    # A SIGTERM runs finally blocks and closes connections instead of dying mid-write.
    raise SystemExit(128 + signum)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kbpg")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """kbpg: knowledge-base retrieval inside PostgreSQL (pgvector + BM25 + graph, fused by RRF).

    With KBPG_DATABASE_URL unset, kbpg runs its own embedded PostgreSQL in KBPG_HOME.
    """
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    ctx.obj = AppContext(debug=debug)


for command in (
    db.db,
    search.eval_command,
    search.search,
    search.serve,
    search.mcp,
    search.token,
    library.ingest,
    library.documents,
    library.stats,
    library.index_command,
    library.metadata_keys,
    library.reembed,
    library.recontextualize,
    library.embed,
    access.access,
    sources.sources,
    sources.sync_command,
):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
