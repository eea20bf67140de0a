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
from kbpg.cli import access, db, knowledge_bases, library, search, sources
from kbpg.cli.common import AppContext, knowledge_base_option

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


def _with_knowledge_base(command: click.Command) -> None:
    """--kb on the command, or on each command of a group."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_knowledge_base(sub)
    elif not any("--kb" in getattr(param, "opts", ()) for param in command.params):
        command.params.append(knowledge_base_option())  # (a command in two groups: once)


# every command that works in one knowledge base takes --kb (db works on the database, kb on
# the knowledge bases by name)
for command in (
    search.eval_command,
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
    _with_knowledge_base(command)
    main.add_command(command)
for command in (db.db, knowledge_bases.knowledge_bases):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
