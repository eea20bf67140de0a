"""`kbpg ingest`, `documents`, `stats`, `reembed`, `embed`: the knowledge base's contents."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kbpg.cli.common import (
    AppContext,
    StatusLine,
    elapsed_status,
    embedder_option,
    handle_errors,
    json_option,
    lock_wait_option,
    pass_app,
    print_rows,
)
from kbpg.errors import KbpgError
from kbpg.ingest.sources import printable


class _ProgressLine(StatusLine):
    """An ingest's or a re-embedding's progress: documents, chunks, chunks/s; skipped files."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def __call__(self, event: Any) -> None:
        for failure in event.failures:
            self.note(
                ("Warning: skipped " if failure.empty else "skipped ")
                + f"{printable(failure.where)}: {printable(failure.reason)}"
            )
        self.show(
            f"{self.label}: {event.documents} documents, {event.chunks} chunks, "
            f"{event.chunks_per_s:.0f} chunks/s"
        )


def _size_option(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from kbpg.ingest.sources import parse_size

    try:
        return parse_size(str(value))
    except KbpgError as exc:
        raise click.BadParameter(exc.message) from None


def _names_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """--group / --label / --category: names, never blank (a typo must not change who reads)."""
    for name in (value,) if isinstance(value, str) else value or ():
        if not name.strip():
            raise click.BadParameter(f"{name!r} is blank; give a name")
    return value


def _index_progress(event: Any) -> None:
    click.echo(("\r\x1b[K" if sys.stderr.isatty() else "") + event.describe(), err=True)


def _summary_line(summary: Any) -> str:
    line = (
        f"added {summary.added}, updated {summary.updated}, unchanged {summary.unchanged}, "
        f"removed {summary.removed}, skipped {summary.skipped}, failed {summary.failed}; "
        f"{summary.chunks} chunks, "
        f"{summary.edges} edges in {summary.total_s:.1f} s ({summary.chunks_per_s:.0f} chunks/s; "
        f"embedding {summary.embed_s:.1f} s, database {summary.database_s:.1f} s)"
    )
    contexts = summary.contexts
    if contexts.calls:
        line += (
            f"; contexts: {contexts.written} written, {contexts.missing} missing "
            f"({contexts.calls} model calls)"
        )
        if contexts.missing:
            line += " — run `kbpg recontextualize` when the chat model is back"
    return line


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="G",
    callback=_names_option,
    help="Add group G (repeatable).",
)
@click.option(
    "--category", metavar="C", callback=_names_option, help="Category for documents that name none."
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="L",
    callback=_names_option,
    help="Add label L (repeatable).",
)
@click.option("-r", "--recursive", is_flag=True, help="Descend into subdirectories.")
@click.option("--glob", metavar="PATTERN", help="Only files matching PATTERN (e.g. '*.md').")
@click.option("--prune", is_flag=True, help="Remove documents whose files under PATHS are gone.")
@embedder_option
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Documents per transaction (a kill loses at most one batch, never half a document) "
    "[default: 1024; 32 with e5-multilingual, a progress line each].",
)
@click.option(
    "--contextual/--no-contextual",
    default=None,
    help="Have the chat model (KBPG_CHAT_*) situate each chunk in its document; the context "
    "is embedded and indexed for BM25.  [env var: KBPG_CONTEXTUAL; default: off]",
)
@click.option(
    "--max-file-size",
    "max_file_bytes",
    metavar="SIZE",
    envvar="KBPG_MAX_FILE_BYTES",
    default="20MiB",
    show_default=True,
    callback=_size_option,
    help="Refuse larger files (for .jsonl: longer lines), e.g. 64MiB; memory grows with it "
    "[env: KBPG_MAX_FILE_BYTES].",
)
@lock_wait_option
@click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Read symlinks that point outside PATHS (skipped and reported by default).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 when a file holds no text to index too (by default it is skipped with a "
    "warning and counted as skipped).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="While the run lasts, serve its Prometheus metrics (documents, chunks, model errors, "
    "the pool) at http://127.0.0.1:PORT/metrics, for a long ingest.",
)
@json_option
@pass_app
@handle_errors
def ingest(
    app: AppContext,
    paths: tuple[Path, ...],
    groups: tuple[str, ...],
    category: str | None,
    labels: tuple[str, ...],
    recursive: bool,
    glob: str | None,
    prune: bool,
    embedder_name: str | None,
    batch_size: int | None,
    contextual: bool | None,
    max_file_bytes: int,
    follow_symlinks: bool,
    strict: bool,
    metrics_port: int | None,
    as_json: bool,
) -> None:
    """Ingest files: .md .txt .html .pdf, and .jsonl (one document per line).

    Re-ingesting is idempotent: unchanged documents are skipped, changed ones replaced
    atomically. Markdown front matter may set title, category, groups and labels. A file with
    no text to index (a page that is only an iframe) is skipped with a warning. Exit code 1
    when any file failed (the others are ingested), or with --strict was skipped.
    """
    import contextlib
    import json

    from kbpg.ingest.batching import batch_documents_for
    from kbpg.ingest.run import ingest_paths

    with app.knowledge_base(embedder_name) as kb, contextlib.ExitStack() as metrics:
        model = kb.models.document_embedder()
        _language_notes(kb, model.model_name)
        if metrics_port is not None:
            metrics.callback(_serve_metrics(kb, metrics_port))
        summary = ingest_paths(
            kb.db,
            kb.models,
            list(paths),
            recursive=recursive,
            glob=glob,
            groups=groups,
            category=category,
            labels=labels,
            prune=prune,
            progress=_ProgressLine("ingest"),
            batch_documents=batch_size or batch_documents_for(model),
            index_progress=_index_progress,
            contextual=contextual,
            max_file_bytes=max_file_bytes,
            follow_symlinks=follow_symlinks,
        )
    if sys.stderr.isatty():
        click.echo("\r\x1b[K", nl=False, err=True)
    click.echo(_summary_line(summary), err=True)
    for warning in summary.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2))
    if summary.failed or (strict and summary.skipped):
        click.get_current_context().exit(1)


def _serve_metrics(kb: Any, port: int) -> Any:
    """Metrics of this process at 127.0.0.1:port; the function that stops serving them."""
    from kbpg.serve.metrics import Metrics, expose

    metrics = Metrics(kb.db.pool_stats)
    metrics.start()
    try:
        stop = expose(metrics, port)
    except OSError as exc:
        metrics.stop()
        raise KbpgError(
            f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror}",
            hint="choose another --metrics-port",
        ) from None
    click.echo(f"metrics at http://127.0.0.1:{port}/metrics", err=True)

    def done() -> None:
        stop()
        metrics.stop()

    return done


def _language_notes(kb: Any, model_name: str) -> None:
    """Refuse a KBPG_LANGUAGE the knowledge base is not in; warn of a model that does not
    know its language."""
    from kbpg.ingest.language import ingest_warnings
    from kbpg.store import db as kdb

    with kb.session() as conn:
        kdb.require_schema(conn)
        notes = ingest_warnings(conn, kb.settings.language, model_name)
    for note in notes:
        click.echo(f"warning: {note}", err=True)


@click.group()
def documents() -> None:
    """List and delete ingested documents."""


@documents.command("list")
@click.option(
    "--group", metavar="G", help="Only documents in group G (public: also those without groups)."
)
@json_option
@pass_app
@handle_errors
def documents_list(app: AppContext, group: str | None, as_json: bool) -> None:
    """List documents: source, title, category, groups, chunk count (tab-separated)."""

    from kbpg.store.catalog import list_documents

    with app.knowledge_base() as kb:
        docs = list_documents(kb.db, group=group)
    print_rows(
        docs,
        as_json,
        ["source", "title", "category", "groups", "chunks"],
        lambda d: [d.source, d.title, d.category or "", ",".join(d.groups), str(d.chunks)],
    )


@documents.command("delete")
@click.argument("sources", nargs=-1)
@click.option("--all", "delete_all", is_flag=True, help="Delete every document: start afresh.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before deleting --all (for scripts).")
@lock_wait_option
@pass_app
@handle_errors
def documents_delete(
    app: AppContext, sources: tuple[str, ...], delete_all: bool, yes: bool
) -> None:
    """Delete documents (their chunks and edges) by the PATH you ingested, or by source.

    A path may be relative, as you gave it to `kbpg ingest`; a folder deletes every document
    ingested from under it (`kbpg documents delete samples/kb` removes the demo's documents).
    `--all` deletes every document after asking (`--yes` does not ask); table sources keep
    their definitions (`kbpg sources resync NAME` reads their rows again).
    """
    from kbpg.ingest.maintenance import delete_all_documents, delete_documents

    if delete_all == bool(sources):
        raise click.UsageError("give the paths or sources to delete, or --all (not both)")
    if delete_all:
        if not yes:
            click.confirm("Delete every document of the knowledge base?", abort=True, err=True)
        with app.knowledge_base() as kb:
            count = delete_all_documents(kb.db)
        click.echo(f"deleted {count} documents")
        return
    with app.knowledge_base() as kb:
        deleted, missing = delete_documents(kb.db, list(sources))
    for source in deleted:
        click.echo(f"deleted {printable(source)}")
    if missing:
        raise KbpgError(
            f"no such document: {', '.join(map(printable, missing))}",
            hint="give a path as you ingested it, a folder, or a source `kbpg documents list` "
            "shows",
        )


@click.command()
@json_option
@pass_app
@handle_errors
def stats(app: AppContext, as_json: bool) -> None:
    """Documents, chunks, edges, embedding space, BM25 statistics and index sizes."""
    import json

    from kbpg.store.catalog import stats as kb_stats

    with app.knowledge_base() as kb:
        data = kb_stats(kb.db)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    space = data["embedding_space"]
    edges = data["edges"]
    click.echo(f"language: {data['language']}")
    click.echo(f"documents: {data['documents']}")
    click.echo(f"chunks: {data['chunks']} ({data['chunks_without_embedding']} without embedding)")
    edge_text = ", ".join(f"{k} {v}" for k, v in edges.items()) or "none"
    click.echo(f"edges: {sum(edges.values())} ({edge_text})")
    click.echo(
        "embedding space: "
        + (
            f"{space['model']} ({space['dimension']}-d, {space['layout']} index"
            + ("" if space["indexed"] else " NOT BUILT: run `kbpg index`")
            + ")"
            if space
            else "not set"
        )
    )
    bm25 = data["bm25"]
    click.echo(
        f"bm25: {bm25['chunks']} chunks, average length {bm25['average_length']}, "
        f"{bm25['lexemes']} lexemes"
    )
    if data["indexed_metadata_keys"] is not None:
        click.echo("indexed metadata keys: " + (", ".join(data["indexed_metadata_keys"]) or "none"))
    for kind in ("tables", "indexes"):
        click.echo(f"{kind}:")
        for name, size in data[kind].items():
            click.echo(f"  {name}: {_human_bytes(size)}")


@click.command("index")
@click.option(
    "--layout",
    type=click.Choice(["vector", "halfvec", "binary"]),
    help="Index layout: vector (HNSW on the vectors, up to 2,000 dimensions), halfvec (half "
    "precision, up to 4,000, half the memory), binary (binary quantization + exact re-rank, "
    "any dimension, 1/32 of the memory). Default: the current layout (a rebuild).",
)
@pass_app
@handle_errors
def index_command(app: AppContext, layout: str | None) -> None:
    """Rebuild the vector (HNSW) index, in another layout with --layout.

    Searches keep using the old index until the new one is built; writers wait. Progress goes
    to stderr.
    """
    from kbpg.store.indexing import set_layout

    with app.knowledge_base() as kb, kb.connection(write=True) as conn:
        chosen, seconds = set_layout(
            conn, kb.url, layout, _index_progress, lambda: kb.transaction(conn, write=True)
        )
    click.echo(f"built the {chosen} index in {seconds:.1f} s", err=True)


@click.group("metadata-keys")
def metadata_keys() -> None:
    """Metadata keys indexed for fast filters: a filter's equalities on them
    ({"product": "p7"}) serve the lexical arm as a group filter does."""


@metadata_keys.command("list")
@json_option
@pass_app
@handle_errors
def metadata_keys_list(app: AppContext, as_json: bool) -> None:
    """The indexed keys: key, values held, values with a cache of their own (tab-separated)."""
    from kbpg.store.metadata_keys import indexed_keys

    with app.knowledge_base() as kb:
        keys = indexed_keys(kb.db)
    print_rows(
        keys,
        as_json,
        ["key", "values", "cached_values", "indexed_at"],
        lambda k: [k.key, str(k.values), str(k.cached_values), k.indexed_at],
    )


@metadata_keys.command("index")
@click.argument("keys", nargs=-1, required=True)
@pass_app
@handle_errors
def metadata_keys_index(app: AppContext, keys: tuple[str, ...]) -> None:
    """Index KEYS (dotted when nested: author.name) and build their bitmaps now.

    For keys with a few to a few thousand values (a product, a tenant, a year): each value
    costs a bitmap per block of 16,000 chunks it occurs in. Filters on other keys work as
    they are, scored from the filtered chunks. The build reads every chunk's document once
    (about 5 minutes for 100 values at 1M chunks); the seconds so far go to stderr.
    """
    from kbpg.store.metadata_keys import index_key

    with app.knowledge_base() as kb:
        for key in keys:
            with elapsed_status(f"indexing {printable(key)}: every block's bitmaps, then caches"):
                added = index_key(kb.db, key)
            click.echo(
                f"indexed {printable(key)}" if added else f"{printable(key)} was indexed already"
            )


@metadata_keys.command("unindex")
@click.argument("keys", nargs=-1, required=True)
@pass_app
@handle_errors
def metadata_keys_unindex(app: AppContext, keys: tuple[str, ...]) -> None:
    """Stop indexing KEYS: their bitmaps and caches are dropped; their filters still work."""
    from kbpg.store.metadata_keys import unindex_key

    with app.knowledge_base() as kb:
        missing = [key for key in keys if not unindex_key(kb.db, key)]
    for key in keys:
        if key not in missing:
            click.echo(f"unindexed {printable(key)}")
    if missing:
        raise KbpgError(
            f"not indexed: {', '.join(map(printable, missing))}",
            hint="`kbpg metadata-keys list` shows the indexed keys",
        )


def _human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


@click.command()
@embedder_option
@lock_wait_option
@pass_app
@handle_errors
def reembed(app: AppContext, embedder_name: str | None) -> None:
    """Rebuild every vector with another embedding model (one transaction: all or nothing);
    progress on stderr. Without --embedder (and KBPG_EMBEDDER): the default model of the
    knowledge base's language. Every command then uses the model the knowledge base records."""
    from kbpg.ingest.maintenance import reembed as run_reembed
    from kbpg.models.embedders import default_embedder, get_embedder

    with app.knowledge_base() as kb:
        name = embedder_name or app.settings.embedder
        if name is None:
            name = default_embedder(kb.model_defaults().english)
        embedder = get_embedder(app.settings, name)
        click.echo(f"reembed: embedding every chunk with {embedder.model_name}", err=True)
        summary = run_reembed(
            kb.db, embedder, progress=_ProgressLine("reembed"), index_progress=_index_progress
        )
    click.echo(
        f"re-embedded {summary.chunks} chunks with {embedder.model_name} "
        f"({embedder.dimension}-d) in {summary.total_s:.1f} s",
        err=True,
    )


@click.command()
@click.option("--dry-run", is_flag=True, help="Only count stale and missing contexts.")
@lock_wait_option
@json_option
@pass_app
@handle_errors
def recontextualize(app: AppContext, dry_run: bool, as_json: bool) -> None:
    """Write the contexts that are missing or stale (made with another chat model or prompt
    version) with KBPG_CHAT_MODEL, and re-embed those chunks; progress on stderr."""
    import json

    from kbpg.ingest.maintenance import recontextualize as run

    def progress(summary: Any) -> None:
        click.echo(
            f"recontextualize: {summary.redone_documents} documents redone, "
            f"{summary.tally.written} contexts written",
            err=True,
        )

    with app.knowledge_base() as kb:
        summary = run(kb.db, kb.models, dry_run=dry_run, progress=progress)
    click.echo(
        f"{summary.documents} documents, {summary.chunks} chunks: {summary.stale} stale, "
        f"{summary.missing} missing; {summary.redone_documents} documents redone, "
        f"{summary.tally.written} contexts written, {summary.tally.missing} still missing "
        f"({summary.tally.calls} model calls) in {summary.total_s:.1f} s",
        err=True,
    )
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2))


@click.command()
@click.argument("text")
@embedder_option
@pass_app
@handle_errors
def embed(app: AppContext, text: str, embedder_name: str | None) -> None:
    """Print TEXT's query vector as a pgvector literal, for psql: \\set q `kbpg embed '...'`
    (with the knowledge base's model unless --embedder / KBPG_EMBEDDER names one)."""
    from kbpg.models.embedders import to_pgvector_literal

    with app.knowledge_base(embedder_name) as kb:
        embedder = kb.embedder
    click.echo(to_pgvector_literal(embedder.embed_query(text)))
