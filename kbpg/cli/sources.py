"""`kbpg sources ...` and `kbpg sync`: application tables whose rows kbpg keeps as documents."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from kbpg.cli.common import (
    AppContext,
    StatusLine,
    embedder_option,
    handle_errors,
    json_option,
    lock_wait_option,
    pass_app,
    print_rows,
)
from kbpg.errors import KbpgError, ModelError
from kbpg.ingest.sources import printable


@click.group()
def sources() -> None:
    """Application tables whose rows kbpg keeps as documents (`kbpg sync` follows them).

    A source reads one table: a key (the primary key, or --id), a text column, and optionally
    title, groups, category, labels and metadata columns. Its rows become the documents
    table:NAME/KEY. Adding one needs TRIGGER on the table and kbpg's writer role.
    """


def _metadata(values: tuple[str, ...]) -> list[str]:
    return [c.strip() for value in values for c in value.split(",") if c.strip()]


def _echo_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"Warning: {printable(warning)}", err=True)


@sources.command("add")
@click.argument("name")
@click.argument("table")
@click.option("--text", "text_column", required=True, metavar="COLUMN", help="The text to index.")
@click.option(
    "--id",
    "id_columns",
    metavar="COLUMNS",
    help="Key column(s), comma-separated (default: the single-column primary key).",
)
@click.option("--title", metavar="COLUMN", help="The document title.")
@click.option("--groups", metavar="COLUMN", help="Who may read a row: text[] or text.")
@click.option("--category", metavar="COLUMN", help="The category filter.")
@click.option("--labels", metavar="COLUMN", help="Labels: text[] or text.")
@click.option(
    "--metadata",
    multiple=True,
    metavar="COLUMNS",
    help="Columns kept as the document's JSON metadata (repeatable or comma-separated).",
)
@click.option(
    "--no-notify",
    is_flag=True,
    help="Do not NOTIFY the worker at commit (very high commit rates, two-phase commit): it "
    "then finds changes by polling (kbpg sync --poll).",
)
@json_option
@pass_app
@handle_errors
def sources_add(
    app: AppContext,
    name: str,
    table: str,
    text_column: str,
    id_columns: str | None,
    title: str | None,
    groups: str | None,
    category: str | None,
    labels: str | None,
    metadata: tuple[str, ...],
    no_notify: bool,
    as_json: bool,
) -> None:
    """Keep the rows of TABLE as documents table:NAME/KEY (run `kbpg sync` to backfill them)."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        added = table_sources.add(
            kb.db,
            name,
            table,
            text=text_column,
            id=id_columns,
            title=title,
            groups=groups,
            category=category,
            labels=labels,
            metadata=_metadata(metadata),
            notify=not no_notify,
        )
    _echo_warnings(added.warnings)
    if as_json:
        click.echo(json.dumps(added.as_dict(), indent=2))
        return
    click.echo(
        f"added source {added.name}: {added.table} keyed by {', '.join(added.key_columns)}; "
        f"triggers {', '.join(added.triggers)}"
    )
    click.echo(
        "run `kbpg sync` to backfill its rows (`kbpg sync --watch` to follow them)", err=True
    )


@sources.command("alter")
@click.argument("name")
@click.option("--text", "text_column", metavar="COLUMN", help="Another text column.")
@click.option("--title", metavar="COLUMN", help="Title column ('' for none).")
@click.option("--groups", metavar="COLUMN", help="Groups column ('' for none).")
@click.option("--category", metavar="COLUMN", help="Category column ('' for none).")
@click.option("--labels", metavar="COLUMN", help="Labels column ('' for none).")
@click.option(
    "--metadata",
    multiple=True,
    metavar="COLUMNS",
    help="The metadata columns, replacing the old list ('' for none).",
)
@click.option("--notify/--no-notify", default=None, help="NOTIFY the worker at commit.")
@json_option
@pass_app
@handle_errors
def sources_alter(
    app: AppContext,
    name: str,
    text_column: str | None,
    title: str | None,
    groups: str | None,
    category: str | None,
    labels: str | None,
    metadata: tuple[str, ...],
    notify: bool | None,
    as_json: bool,
) -> None:
    """Change what a source reads; the next `kbpg sync` reads every row again (documents that
    come out the same are not rewritten)."""
    from kbpg.store import table_sources

    options = (text_column, title, groups, category, labels, notify)
    if all(v is None for v in options) and not metadata:
        raise click.UsageError("nothing to change: give --text, --title, --metadata, ...")
    with app.knowledge_base() as kb:
        changed = table_sources.alter(
            kb.db,
            name,
            text=text_column,
            title=title,
            groups=groups,
            category=category,
            labels=labels,
            metadata=_metadata(metadata) if metadata else None,
            notify=notify,
        )
    _echo_warnings(changed.warnings)
    if as_json:
        click.echo(json.dumps(changed.as_dict(), indent=2))
        return
    click.echo(f"altered source {changed.name}: every row is read again by the next kbpg sync")


@sources.command("remove")
@click.argument("name")
@click.option("--drop-documents", is_flag=True, help="Delete the source's documents too.")
@json_option
@pass_app
@handle_errors
def sources_remove(app: AppContext, name: str, drop_documents: bool, as_json: bool) -> None:
    """Stop following a table: its triggers, queue and parked rows go (its documents stay
    unless --drop-documents)."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        removed = table_sources.remove(kb.db, name, drop_documents=drop_documents)
    _echo_warnings(removed.warnings)
    if as_json:
        click.echo(json.dumps(removed.as_dict(), indent=2))
        return
    line = f"removed source {removed.name}"
    if drop_documents:
        line += f" and its {removed.documents_deleted} documents"
    click.echo(line)


@sources.command("resync")
@click.argument("name")
@pass_app
@handle_errors
def sources_resync(app: AppContext, name: str) -> None:
    """Read every row again and delete the documents of rows that are gone (after changes the
    triggers did not see: a restore with triggers disabled, a logical replica)."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        table_sources.resync(kb.db, name)
    click.echo(f"source {name}: every row is read again by the next kbpg sync")


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else ""


def _backfill(source: Any) -> str:
    if source.backfill_state == "done":
        return "done"
    if source.backfill_state == "pending":
        return "pending"
    total = source.backfill_total or 0
    return f"{source.backfill_enqueued}/{total}"


@sources.command("list")
@json_option
@pass_app
@handle_errors
def sources_list(app: AppContext, as_json: bool) -> None:
    """The sources: table, documents, queued and parked rows, backfill (tab-separated)."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        found = table_sources.list_sources(kb.db)
    print_rows(
        found,
        as_json,
        ["name", "table", "documents", "queued", "claimed", "errors", "backfill", "oldest_queued"],
        lambda s: [
            s.name,
            s.table,
            str(s.documents),
            str(s.queued),
            str(s.claimed),
            str(s.errors),
            _backfill(s),
            _when(s.oldest_queued_at),
        ],
    )


@sources.command("show")
@click.argument("name")
@json_option
@pass_app
@handle_errors
def sources_show(app: AppContext, name: str, as_json: bool) -> None:
    """One source's definition and state."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        source = table_sources.show(kb.db, name)
    if as_json:
        click.echo(json.dumps(source.as_dict(), indent=2))
        return
    rows = [
        ("name", source.name),
        ("table", source.table),
        ("key", ", ".join(source.key_columns)),
        ("text", source.text_column),
        ("title", source.title_column or ""),
        ("groups", source.groups_column or ""),
        ("category", source.category_column or ""),
        ("labels", source.labels_column or ""),
        ("metadata", ", ".join(source.metadata_columns)),
        ("notify", "yes" if source.notify else "no"),
        ("version", str(source.version)),
        ("documents", str(source.documents)),
        ("queued", str(source.queued)),
        ("claimed", str(source.claimed)),
        ("errors", str(source.errors)),
        ("oldest queued", _when(source.oldest_queued_at)),
        ("backfill", _backfill(source)),
        ("created", _when(source.created_at)),
        ("altered", _when(source.altered_at)),
    ]
    for label, value in rows:
        click.echo(f"{label}:\t{printable(value)}")


@sources.command("errors")
@click.argument("name", required=False)
@json_option
@pass_app
@handle_errors
def sources_errors(app: AppContext, name: str | None, as_json: bool) -> None:
    """Rows that could not be ingested: document, attempts, next retry, error."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        parked = table_sources.errors(kb.db, name)
    print_rows(
        parked,
        as_json,
        ["document", "attempts", "retry_at", "error"],
        lambda e: [e.document, str(e.attempts), _when(e.retry_at), e.error],
    )


@sources.command("retry")
@click.argument("name", required=False)
@pass_app
@handle_errors
def sources_retry(app: AppContext, name: str | None) -> None:
    """Queue the parked rows (of source NAME) for the next `kbpg sync` now."""
    from kbpg.store import table_sources

    with app.knowledge_base() as kb:
        count = table_sources.retry(kb.db, name)
    click.echo(f"queued {count} parked rows again")


# -- kbpg sync ------------------------------------------------------------------------------------


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    from kbpg.config import parse_duration_ms

    if value is None:
        return None
    try:
        return parse_duration_ms(value, param.opts[0]) / 1000
    except KbpgError as exc:
        raise click.BadParameter(exc.message) from None


def _size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from kbpg.ingest.sources import parse_size

    try:
        return parse_size(str(value))
    except KbpgError as exc:
        raise click.BadParameter(exc.message) from None


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA unknown"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"ETA {hours} h {minutes:02d} min" if hours else f"ETA {minutes} min {secs:02d} s"


class _SyncLine(StatusLine):
    """A sync's progress: rows, rows/s, each backfill's share and ETA; parked rows."""

    def __call__(self, event: Any) -> None:
        for failure in event.failures:
            self.note(f"parked {printable(failure.where)}: {printable(failure.reason)}")
        line = f"sync: {event.rows} rows, {event.rows_per_s:.1f} rows/s"
        for backfill in event.backfills:
            if backfill.done:
                continue
            share = 100.0 * backfill.queued / backfill.total if backfill.total else 0.0
            line += (
                f"; backfill {backfill.source} {backfill.queued}/{backfill.total} queued "
                f"({share:.0f}%), {_eta(event.eta_s(backfill))}"
            )
        self.show(line)


@contextmanager
def _graceful_stop(stop: threading.Event) -> Iterator[None]:
    """SIGTERM or Ctrl-C: finish the batch in hand, then stop (a second one stops at once; the
    rows in hand then go back to the queue)."""

    def handle(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise SystemExit(128 + signum)
        stop.set()
        click.echo("stopping after the batch in hand (again to stop now)", err=True)

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _summary_line(summary: Any) -> str:
    return (
        f"synced {summary.rows} rows: added {summary.added}, updated {summary.updated}, "
        f"unchanged {summary.unchanged}, deleted {summary.deleted}, no text {summary.empty}, "
        f"parked {summary.failed}; {summary.chunks} chunks in {summary.total_s:.1f} s "
        f"({summary.rows_per_s:.1f} rows/s; embedding {summary.embed_s:.1f} s, "
        f"database {summary.database_s:.1f} s)"
    )


@click.command("sync")
@click.argument("names", nargs=-1, metavar="[SOURCE]...")
@click.option("--watch", is_flag=True, help="Keep following changes until SIGTERM or Ctrl-C.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=256,  # kbpg.ingest.tables.BATCH_ROWS (not imported here: numpy at start-up)
    show_default=True,
    help="Rows claimed, embedded and written together.",
)
@click.option(
    "--poll",
    metavar="DURATION",
    default="5s",
    show_default=True,
    callback=_duration,
    help="With --watch: look at the queue this often besides waiting for NOTIFY.",
)
@click.option(
    "--refresh-every",
    metavar="DURATION",
    default="5min",
    show_default=True,
    callback=_duration,
    help="With --watch: refresh derived edges and the lexical cache at most this often, when "
    "idle (search is exact without; this keeps the lexical arm fast).",
)
@click.option(
    "--max-text-size",
    "max_text_bytes",
    metavar="SIZE",
    envvar="KBPG_MAX_FILE_BYTES",
    default="20MiB",
    show_default=True,
    callback=_size,
    help="Park rows whose text is larger [env: KBPG_MAX_FILE_BYTES].",
)
@embedder_option
@lock_wait_option
@json_option
@pass_app
@handle_errors
def sync_command(
    app: AppContext,
    names: tuple[str, ...],
    watch: bool,
    batch_size: int,
    poll: float,
    refresh_every: float,
    max_text_bytes: int,
    embedder_name: str | None,
    as_json: bool,
) -> None:
    """Bring the documents of table sources (all, or those named) up to date with their rows.

    The first run of a new source backfills its rows (progress and ETA on stderr; a run that is
    stopped resumes where it was). Rows that cannot be ingested are parked (`kbpg sources
    errors`) and retried with backoff; exit code 1 when this run parked any. A model server
    that is down leaves the rows queued: --watch waits and tries again, otherwise exit 1.
    """
    from kbpg.ingest.tables import sync

    stop = threading.Event()
    line = _SyncLine()
    try:
        with app.knowledge_base(embedder_name) as kb, _graceful_stop(stop):
            summary = sync(
                kb.db,
                kb.models,
                names,
                watch=watch,
                batch_rows=batch_size,
                poll_s=poll,
                refresh_every_s=refresh_every,
                max_text_bytes=max_text_bytes,
                progress=line,
                stop=stop,
            )
    except ModelError as exc:
        line.clear()
        if not exc.hint:
            exc.hint = "the rows stay queued: run kbpg sync again when the model server is back"
        raise
    line.clear()
    click.echo(_summary_line(summary), err=True)
    for source, reason in summary.unreadable.items():
        click.echo(f"Error: source {source} could not be read: {printable(reason)}", err=True)
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2))
    if summary.failed or summary.unreadable:
        click.get_current_context().exit(1)
