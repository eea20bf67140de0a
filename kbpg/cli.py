"""The `kbpg` command line: stdout carries data, stderr carries errors and progress."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kbpg import __version__
from kbpg.config import CLI_DEFAULT_TOP, Settings
from kbpg.errors import InvalidInput, KbpgError
from kbpg.request import OPTIONS, TUNING_OPTIONS, Option

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase
    from kbpg.db import SchemaStatus

F = TypeVar("F", bound=Callable[..., Any])


class AppContext:
    """Per-invocation state shared by subcommands (settings are read once)."""

    def __init__(self, debug: bool) -> None:
        self.debug = debug
        self._settings: Settings | None = None
        self._url: str | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    @property
    def url(self) -> str:
        """The database URL; starts the embedded server when KBPG_DATABASE_URL is unset."""
        if self._url is None:
            from kbpg.db import resolve_url

            self._url = resolve_url(self.settings)
        return self._url

    def knowledge_base(self, embedder: str | None = None) -> KnowledgeBase:
        """The application object over one connection (a CLI call is one unit of work)."""
        from kbpg.app import KnowledgeBase

        return KnowledgeBase(self.url, settings=self.settings, pool_size=1, embedder_name=embedder)


def handle_errors(func: F) -> F:
    """Turn KbpgError into `Error: ...` plus a hint on stderr, exit 1; no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        debug = isinstance(ctx.obj, AppContext) and ctx.obj.debug
        try:
            return func(*args, **kwargs)
        except KbpgError as exc:
            if debug:
                raise
            click.echo(f"Error: {exc.message}", err=True)
            if exc.hint:
                click.echo(f"Hint: {exc.hint}", err=True)
            ctx.exit(1)

    return wrapper  # type: ignore[return-value]


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


pass_app = click.make_pass_decorator(AppContext)

# Options shared by several commands, declared once.
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON on stdout (`[]` or `{}` shapes for scripts).",
)
embedder_option = click.option(
    "--embedder",
    "embedder_name",
    metavar="NAME",
    default=None,
    help="Embedding provider: minilm (offline) or openai  [env var: KBPG_EMBEDDER; "
    "default: minilm].",
)


def _search_option(name: str, option: Option, default: Any = None) -> Callable[[F], F]:
    """The click option of one SearchRequest field, from its metadata."""
    flag = option.flag or "--" + name.replace("_", "-")
    notes = []
    if default is None:
        notes += [f"env var: {option.env}"] if option.env else []
        notes += [f"default: {option.default_note}"] if option.default_note else []
    help_text = option.help + (f"  [{'; '.join(notes)}]" if notes else "")
    decls = [flag, *([option.short] if option.short else []), name]
    kwargs: dict[str, Any] = {"help": help_text, "default": default}
    if default is not None:
        kwargs["show_default"] = True
    if option.kind == "bool" and option.env:  # on/off/unset (the setting decides)
        decls[0] = f"{flag}/--no-{flag[2:]}"
    elif option.kind == "bool":
        kwargs.update(is_flag=True, default=None, flag_value=True)
    elif option.kind == "int":
        kwargs["type"] = click.IntRange(_bound(option.minimum), _bound(option.maximum))
    elif option.kind == "float":
        kwargs["type"] = click.FloatRange(option.minimum, option.maximum)
    elif option.kind == "texts":
        kwargs.update(multiple=True, metavar=option.metavar, default=())
    else:
        kwargs["metavar"] = option.metavar
    return click.option(*decls, **kwargs)


def _bound(value: float | None) -> int | None:
    return None if value is None else int(value)


def search_options(
    options: dict[str, Option], defaults: dict[str, Any] | None = None
) -> Callable[[F], F]:
    """Every given SearchRequest field as a click option, in declaration order."""

    def decorate(func: F) -> F:
        for name, option in reversed(options.items()):
            func = _search_option(name, option, (defaults or {}).get(name))(func)
        return func

    return decorate


# -- kbpg db ----------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Manage the database: embedded server, URL, migrations."""


def _embedded_server(app: AppContext) -> Any:
    from kbpg.server import EmbeddedServer

    if app.settings.database_url:
        raise KbpgError(
            "KBPG_DATABASE_URL is set: kbpg uses that database, not its embedded server",
            hint="unset KBPG_DATABASE_URL to manage the embedded server",
        )
    return EmbeddedServer(app.settings.home)


@db.command("start")
@pass_app
@handle_errors
def db_start(app: AppContext) -> None:
    """Start the embedded PostgreSQL server (it keeps running until `kbpg db stop`)."""
    server = _embedded_server(app)
    url = server.start()
    click.echo(f"embedded PostgreSQL running in {server.pgdata}", err=True)
    click.echo(url)


@db.command("stop")
@pass_app
@handle_errors
def db_stop(app: AppContext) -> None:
    """Stop the embedded PostgreSQL server."""
    server = _embedded_server(app)
    stopped = server.stop()
    click.echo("stopped" if stopped else "not running")


@db.command("status")
@pass_app
@handle_errors
def db_status(app: AppContext) -> None:
    """Show which database kbpg uses, whether it is up, and its schema revision."""
    from kbpg import db as kdb

    settings = app.settings
    if settings.database_url:
        click.echo("database: external (KBPG_DATABASE_URL)")
        url = settings.database_url
    else:
        status = _embedded_server(app).status()
        click.echo(f"database: embedded, data in {status.pgdata}")
        click.echo(f"server: {status.note}" + (f" (pid {status.pid})" if status.pid else ""))
        if not status.running:
            return
        assert status.url is not None
        url = status.url
    from kbpg import queries

    with kdb.connect(url) as conn:
        version = conn.execute(queries.SERVER_VERSION).fetchone()
        vector = conn.execute(queries.VECTOR_VERSION).fetchone()
        schema = kdb.schema_status(conn)
    click.echo(f"postgresql: {version[0] if version else '?'}")
    click.echo(f"pgvector: {vector[0] if vector else 'not installed'}")
    current = schema.current or "none"
    state = "at head" if schema.at_head else "run `kbpg db upgrade`"
    click.echo(f"schema: {current} (head {schema.head}, {state})")


@db.command("url")
@pass_app
@handle_errors
def db_url(app: AppContext) -> None:
    """Print the connection URL, so that `psql "$(kbpg db url)"` works."""
    click.echo(app.url)


@db.command("psql", context_settings={"ignore_unknown_options": True})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@pass_app
@handle_errors
def db_psql(app: AppContext, psql_args: tuple[str, ...]) -> None:
    """Open psql on kbpg's database (extra arguments go to psql)."""
    from kbpg.server import _binaries_dir

    psql = shutil.which("psql")
    if psql is None and not app.settings.database_url:
        psql = str(_binaries_dir() / "psql")
    if psql is None:
        raise KbpgError("psql is not installed", hint="install the PostgreSQL client")
    url = app.url
    sys.stdout.flush()
    os.execv(psql, [psql, url, *psql_args])


def _schema_status(app: AppContext) -> SchemaStatus:
    """The alembic revision of the database kbpg uses."""
    from kbpg import db as kdb

    with kdb.connect(app.url) as conn:
        return kdb.schema_status(conn)


@db.command("upgrade")
@click.argument("revision", default="head")
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the migration as a psql script instead of running it (reads no database; "
    "from a revision: REV:head).",
)
@click.option(
    "--vector-schema",
    metavar="SCHEMA",
    help="With --sql: the schema pgvector is in.  [default: public]",
)
@pass_app
@handle_errors
def db_upgrade(app: AppContext, revision: str, as_sql: bool, vector_schema: str | None) -> None:
    """Migrate to REVISION (default head) and re-apply the sql/ function files at head."""
    from kbpg import db as kdb

    if as_sql:
        click.echo(kdb.upgrade_script(revision, vector_schema=vector_schema or "public"), nl=False)
        return
    if vector_schema is not None:
        raise click.UsageError("--vector-schema goes with --sql (online, kbpg finds it itself)")
    kdb.upgrade(app.url, revision)
    status = _schema_status(app)
    click.echo(f"schema at {status.current}" + (" (head)" if status.at_head else ""))


@db.command("downgrade")
@click.argument("revision")
@pass_app
@handle_errors
def db_downgrade(app: AppContext, revision: str) -> None:
    """Migrate down to REVISION (`base` removes the kb schema and all its data)."""
    from kbpg import db as kdb

    kdb.downgrade(app.url, revision)
    status = _schema_status(app)
    click.echo(f"schema at {status.current or 'base'}")


@db.command("current")
@pass_app
@handle_errors
def db_current(app: AppContext) -> None:
    """Print the schema revision of the database (`none` when unmigrated)."""

    status = _schema_status(app)
    click.echo(status.current or "none")


@db.command("check")
@pass_app
@handle_errors
def db_check(app: AppContext) -> None:
    """Exit 0 when the schema is at head, 1 (with a hint) otherwise."""
    from kbpg import db as kdb

    with kdb.connect(app.url) as conn:
        status = kdb.require_schema(conn)
    click.echo(f"schema at head ({status.head})")


# -- kbpg eval --------------------------------------------------------------------------------


@main.command("eval")
@click.argument("dataset_dir", type=click.Path(path_type=Path))
@click.option(
    "--top-k",
    default=10,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Cutoff of nDCG and MRR; also the match_count of the first call per query.",
)
@click.option(
    "--depth",
    default=100,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Ranked chunks fetched per query, the cutoff of Recall and MAP.",
)
@click.option(
    "--arms",
    default=None,
    help="Comma-separated arms: hybrid,vector,lexical,graph,rerank,expand "
    "[default: hybrid,vector,lexical, plus graph when ingest made edges].",
)
@click.option(
    "--rerank",
    "rerank_arm",
    is_flag=True,
    help="Add a `rerank` arm: the hybrid search reranked by the KBPG_RERANK reranker.",
)
@click.option(
    "--expand",
    "expand_arm",
    is_flag=True,
    help="Add an `expand` arm: the hybrid search with query expansion (KBPG_CHAT_*).",
)
@click.option(
    "--contextual",
    is_flag=True,
    help="Ingest the corpus with chunk contexts from the chat model (KBPG_CHAT_*); compare "
    "with a run without.",
)
@click.option("--split", default="test", show_default=True, help="Which qrels/<split>.tsv.")
@embedder_option
@search_options(TUNING_OPTIONS)
@click.option(
    "--save-runs",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write each arm's ranking as a TREC run file <DIR>/<arm>.run.",
)
@json_option
@click.option(
    "--keep", is_flag=True, help="Keep the evaluation database (its name goes to stderr)."
)
@pass_app
@handle_errors
def eval_command(
    app: AppContext,
    /,
    dataset_dir: Path,
    top_k: int,
    depth: int,
    arms: str | None,
    rerank_arm: bool,
    expand_arm: bool,
    contextual: bool,
    split: str,
    embedder_name: str | None,
    save_runs: Path | None,
    as_json: bool,
    keep: bool,
    **search_options: Any,
) -> None:
    """Measure retrieval quality on a BEIR dataset (corpus.jsonl, queries.jsonl, qrels/).

    The corpus goes into a throwaway database `kbpg_eval_<random>` on the same server (never
    your knowledge base), dropped at the end unless --keep. Reports nDCG@k, Recall@depth,
    MRR@k, MAP@depth and hit@8 per arm; the kb.search options apply to hybrid and graph.
    """
    import json

    from kbpg import evaluate as ev
    from kbpg.embedding import get_embedder

    dataset = ev.load_beir(dataset_dir, split)
    chosen = ev.parse_arms(arms)
    extra = ("rerank",) * rerank_arm + ("expand",) * expand_arm
    if extra:
        chosen = tuple(dict.fromkeys((*(chosen or ev.DEFAULT_ARMS), *extra)))
    model = get_embedder(app.settings, embedder_name)
    report = ev.evaluate(
        app.url,
        dataset,
        model,
        arms=chosen,
        cutoffs=ev.Cutoffs(top_k=top_k, depth=depth),
        options=search_options,
        keep=keep,
        progress=lambda message: click.echo(message, err=True),
        settings=app.settings,
        contextual=contextual,
    )
    if report.database:
        click.echo(f"kept evaluation database {report.database}", err=True)
    if save_runs is not None:
        save_runs.mkdir(parents=True, exist_ok=True)
        for arm, run in report.runs.items():
            ev.write_trec_run(save_runs / f"{arm}.run", run, tag=f"kbpg-{arm}")
    click.echo(json.dumps(report.to_json()) if as_json else ev.format_table(report))


# -- kbpg search / serve ----------------------------------------------------------------------


def _searchable_query(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from kbpg.request import validate_query

    try:
        return validate_query(value)
    except KbpgError as exc:
        raise click.BadParameter(exc.message, ctx=ctx, param=param) from None


_SEARCH_OPTIONS = {name: option for name, option in OPTIONS.items() if name != "query"}


@main.command()
@click.argument("query", callback=_searchable_query)
@search_options(_SEARCH_OPTIONS, defaults={"top": CLI_DEFAULT_TOP})
@click.option("--explain", is_flag=True, help="Per-arm ranks and timings on stderr.")
@json_option
@click.option("--context", "context_only", is_flag=True, help="Print only the context block.")
@embedder_option
@pass_app
@handle_errors
def search(
    app: AppContext,
    /,
    query: str,
    explain: bool,
    as_json: bool,
    context_only: bool,
    embedder_name: str | None,
    **options: Any,
) -> None:
    """Search the knowledge base for QUERY (TOON rows by default).

    The query is plain text (websearch syntax for the BM25 arm); it is never run as SQL.
    --json prints {context, sources, chunks}. Database: KBPG_DATABASE_URL; model: KBPG_EMBEDDER.
    """
    if as_json and context_only:
        raise click.UsageError("--json and --context cannot be used together")
    from kbpg import output
    from kbpg.request import SearchRequest

    try:
        request = SearchRequest(query, **options)
    except InvalidInput as exc:
        raise click.UsageError(exc.message) from None
    with app.knowledge_base(embedder_name) as kb:
        result = kb.search(request)
    for notice in result.notices:
        click.echo(f"Notice: {notice}", err=True)
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        click.echo(output.render_json(result))
    elif context_only:
        click.echo(result.context, nl=False)
    else:
        click.echo(output.render_toon(result))
    if explain:
        click.echo(output.render_explain(result), err=True)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port."
)
@click.option(
    "--pool-size",
    type=click.IntRange(2, 100),
    default=8,
    show_default=True,
    help="Database connections shared by the request threads.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="KBPG_ALLOWED_HOSTS",
    metavar="NAME",
    help="Also answer to this Host name (repeatable; env KBPG_ALLOWED_HOSTS, space-separated). "
    "Loopback names and the bound address always work; '*' turns the check off.",
)
@click.option(
    "--tokens-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="KBPG_TOKENS_FILE",
    help="Tokens mapped to database roles, one `<sha256 hex> <role>` a line, re-read when it "
    "changes (env KBPG_TOKENS_FILE; see `kbpg token`).",
)
@click.option(
    "--source-root",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="KBPG_SOURCE_ROOT",
    help="Show file sources relative to this directory (env KBPG_SOURCE_ROOT); other "
    "absolute paths are shown by file name.",
)
@click.option(
    "--insecure-no-token",
    is_flag=True,
    help="Serve a non-loopback address without any token (only behind a trusted network).",
)
@pass_app
@handle_errors
def serve(
    app: AppContext,
    host: str,
    port: int,
    pool_size: int,
    allowed_hosts: tuple[str, ...],
    tokens_file: Path | None,
    source_root: Path | None,
    insecure_no_token: bool,
) -> None:
    """Serve the search page (/), the HTTP API (POST /api/v1/kb/search), /healthz and /docs.

    KBPG_API_TOKEN (runs as the server's own role) or a tokens file (each token runs as its
    database role) guards the API. Without either, only a loopback address is served.
    """
    from kbpg.http import serve as run_server

    run_server(
        app.settings,
        host=host,
        port=port,
        pool_size=pool_size,
        extra_hosts=tuple(h for value in allowed_hosts for h in value.split()),
        tokens_file=tokens_file,
        insecure_no_token=insecure_no_token,
        source_root=str(source_root.resolve()) if source_root else None,
    )


@main.group()
def token() -> None:
    """API tokens for `kbpg serve --tokens-file`: each maps to a database role."""


@token.command("new")
@click.argument("role")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append the token's line to this tokens file (created 0600 when missing).",
)
@click.option("--comment", default="", help="A note kept beside the hash (who holds it).")
@handle_errors
def token_new(role: str, path: Path | None, comment: str) -> None:
    """Make a random token for ROLE ('-': the server's own role); print it once on stdout.

    Only its sha256 hash is written to the file (or printed on stderr without --file).
    """
    from kbpg.tokens import new_token, token_line

    secret = new_token()
    line = token_line(secret, role, comment)
    if path is None:
        click.echo(line, err=True)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as out:
            out.write(line + "\n")
        click.echo(f"added a token for role {role} to {path}", err=True)
    click.echo(secret)


@token.command("hash")
@click.argument("role")
@handle_errors
def token_hash(role: str) -> None:
    """Read a token on stdin; print its tokens-file line for ROLE (the token is not stored)."""
    from kbpg.tokens import token_line

    secret = sys.stdin.readline().strip()
    if not secret:
        raise click.UsageError("no token on stdin")
    click.echo(token_line(secret, role))


# -- kbpg ingest / documents / stats / reembed / embed ------------------------------------------


class _ProgressLine:
    """Progress on stderr: one rewritten line on a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.written = False

    def __call__(self, event: Any) -> None:
        import time

        for failure in event.failures:
            self._clear()
            click.echo(f"skipped {failure.where}: {failure.reason}", err=True)
        now = time.monotonic()
        if now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        line = (
            f"{self.label}: {event.documents} documents, {event.chunks} chunks, "
            f"{event.chunks_per_s:.0f} chunks/s"
        )
        if self.tty:
            click.echo("\r" + line + "\x1b[K", nl=False, err=True)
            self.written = True
        else:
            click.echo(line, err=True)

    def _clear(self) -> None:
        if self.tty and self.written:
            click.echo("\r\x1b[K", nl=False, err=True)
            self.written = False


def _index_progress(event: Any) -> None:
    click.echo(("\r\x1b[K" if sys.stderr.isatty() else "") + event.describe(), err=True)


def _summary_line(summary: Any) -> str:
    line = (
        f"added {summary.added}, updated {summary.updated}, unchanged {summary.unchanged}, "
        f"removed {summary.removed}, failed {summary.failed}; {summary.chunks} chunks, "
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


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--group", "groups", multiple=True, metavar="G", help="Add group G (repeatable).")
@click.option("--category", metavar="C", help="Category for documents that name none.")
@click.option("--label", "labels", multiple=True, metavar="L", help="Add label L (repeatable).")
@click.option("-r", "--recursive", is_flag=True, help="Descend into subdirectories.")
@click.option("--glob", metavar="PATTERN", help="Only files matching PATTERN (e.g. '*.md').")
@click.option("--prune", is_flag=True, help="Remove documents whose files under PATHS are gone.")
@embedder_option
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Documents per transaction (a kill loses at most one batch, never half a document).",
)
@click.option(
    "--contextual/--no-contextual",
    default=None,
    help="Have the chat model (KBPG_CHAT_*) situate each chunk in its document; the context "
    "is embedded and indexed for BM25.  [env var: KBPG_CONTEXTUAL; default: off]",
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
    batch_size: int,
    contextual: bool | None,
    as_json: bool,
) -> None:
    """Ingest files: .md .txt .html .pdf, and .jsonl (one document per line).

    Re-ingesting is idempotent: unchanged documents are skipped, changed ones replaced
    atomically. Markdown front matter may set title, category, groups and labels. Exit code 1
    when any file failed (the others are ingested).
    """
    import json

    from kbpg.ingest import ingest_paths

    with app.knowledge_base(embedder_name) as kb:
        summary = ingest_paths(
            kb,
            list(paths),
            recursive=recursive,
            glob=glob,
            groups=groups,
            category=category,
            labels=labels,
            prune=prune,
            progress=_ProgressLine("ingest"),
            batch_documents=batch_size,
            index_progress=_index_progress,
            contextual=contextual,
        )
    if sys.stderr.isatty():
        click.echo("\r\x1b[K", nl=False, err=True)
    click.echo(_summary_line(summary), err=True)
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2))
    if summary.failed:
        click.get_current_context().exit(1)


@main.group()
def documents() -> None:
    """List and delete ingested documents."""


@documents.command("list")
@click.option("--group", metavar="G", help="Only documents in group G.")
@json_option
@pass_app
@handle_errors
def documents_list(app: AppContext, group: str | None, as_json: bool) -> None:
    """List documents: source, title, category, groups, chunk count (tab-separated)."""

    from kbpg.maintenance import list_documents

    with app.knowledge_base() as kb:
        docs = list_documents(kb, group=group)
    _print_rows(
        docs,
        as_json,
        ["source", "title", "category", "groups", "chunks"],
        lambda d: [d.source, d.title, d.category or "", ",".join(d.groups), str(d.chunks)],
    )


def _print_rows(
    items: Sequence[Any], as_json: bool, header: list[str], fields: Callable[[Any], list[str]]
) -> None:
    """Items as a JSON list of their as_dict() (`[]` when empty), or tab-separated lines
    under a header (nothing when empty)."""
    import json

    if as_json:
        click.echo(json.dumps([item.as_dict() for item in items], indent=2))
        return
    if items:
        click.echo("\t".join(header))
    for item in items:
        click.echo("\t".join(fields(item)))


@documents.command("delete")
@click.argument("sources", nargs=-1, required=True)
@pass_app
@handle_errors
def documents_delete(app: AppContext, sources: tuple[str, ...]) -> None:
    """Delete documents (their chunks and edges) by SOURCE; a file path may be relative."""
    from kbpg.maintenance import delete_documents

    with app.knowledge_base() as kb:
        deleted, missing = delete_documents(kb, list(sources))
    for source in deleted:
        click.echo(f"deleted {source}")
    if missing:
        raise KbpgError(
            f"no such document: {', '.join(missing)}",
            hint="`kbpg documents list` shows the sources",
        )


@main.command()
@json_option
@pass_app
@handle_errors
def stats(app: AppContext, as_json: bool) -> None:
    """Documents, chunks, edges, embedding space, BM25 statistics and index sizes."""
    import json

    from kbpg.maintenance import stats as kb_stats

    with app.knowledge_base() as kb:
        data = kb_stats(kb)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    space = data["embedding_space"]
    edges = data["edges"]
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
    for kind in ("tables", "indexes"):
        click.echo(f"{kind}:")
        for name, size in data[kind].items():
            click.echo(f"  {name}: {_human_bytes(size)}")


@main.command("index")
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
    from kbpg.indexing import set_layout

    with app.knowledge_base() as kb, kb.connection(write=True) as conn:
        chosen, seconds = set_layout(
            conn, kb.url, layout, _index_progress, lambda: kb.transaction(conn, write=True)
        )
    click.echo(f"built the {chosen} index in {seconds:.1f} s", err=True)


def _human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


@main.command()
@embedder_option
@pass_app
@handle_errors
def reembed(app: AppContext, embedder_name: str | None) -> None:
    """Rebuild every vector with another embedding model (one transaction: all or nothing)."""
    from kbpg.embedding import get_embedder
    from kbpg.maintenance import reembed as run_reembed

    embedder = get_embedder(app.settings, embedder_name)
    with app.knowledge_base() as kb:
        summary = run_reembed(kb, embedder, progress=_ProgressLine("reembed"))
    click.echo(
        f"re-embedded {summary.chunks} chunks with {embedder.model_name} "
        f"({embedder.dimension}-d) in {summary.total_s:.1f} s",
        err=True,
    )


@main.command()
@click.option("--dry-run", is_flag=True, help="Only count stale and missing contexts.")
@json_option
@pass_app
@handle_errors
def recontextualize(app: AppContext, dry_run: bool, as_json: bool) -> None:
    """Write the contexts that are missing or stale (made with another chat model or prompt
    version) with KBPG_CHAT_MODEL, and re-embed those chunks; progress on stderr."""
    import json

    from kbpg.contextual import recontextualize as run

    def progress(summary: Any) -> None:
        click.echo(
            f"recontextualize: {summary.redone_documents} documents redone, "
            f"{summary.tally.written} contexts written",
            err=True,
        )

    with app.knowledge_base() as kb:
        summary = run(kb, dry_run=dry_run, progress=progress)
    click.echo(
        f"{summary.documents} documents, {summary.chunks} chunks: {summary.stale} stale, "
        f"{summary.missing} missing; {summary.redone_documents} documents redone, "
        f"{summary.tally.written} contexts written, {summary.tally.missing} still missing "
        f"({summary.tally.calls} model calls) in {summary.total_s:.1f} s",
        err=True,
    )
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2))


@main.command()
@click.argument("text")
@embedder_option
@pass_app
@handle_errors
def embed(app: AppContext, text: str, embedder_name: str | None) -> None:
    """Print TEXT's query vector as a pgvector literal, for psql: \\set q `kbpg embed '...'`"""
    from kbpg.embedding import get_embedder, to_pgvector_literal

    embedder = get_embedder(app.settings, embedder_name)
    click.echo(to_pgvector_literal(embedder.embed_query(text)))


# -- kbpg access ------------------------------------------------------------------------------


@main.group()
def access() -> None:
    """Who reads which groups: grants enforced by PostgreSQL row-level security.

    Off until `kbpg access enable`; then a role sees chunks without groups plus the groups
    granted to it (or to a role it is a member of). Every command runs as the database role
    of KBPG_DATABASE_URL: grants, enable and disable need the owner of the kb tables.
    """


@access.command("setup")
@click.option("--reader-role", metavar="NAME", help="Reader role name (default kbpg_reader).")
@click.option("--writer-role", metavar="NAME", help="Writer role name (default kbpg_writer).")
@pass_app
@handle_errors
def access_setup(app: AppContext, reader_role: str | None, writer_role: str | None) -> None:
    """Create (when missing) and grant the NOLOGIN reader and writer roles (needs CREATEROLE)."""
    from kbpg import access as kaccess

    with app.knowledge_base() as kb:
        reader, writer = kaccess.setup(kb, reader_role, writer_role)
    click.echo(f"reader role: {reader}\nwriter role: {writer}")
    click.echo(f"let a login role search with: grant {reader} to <login>;", err=True)


@access.command("grant")
@click.argument("role")
@click.argument("groups", nargs=-1, required=True)
@pass_app
@handle_errors
def access_grant(app: AppContext, role: str, groups: tuple[str, ...]) -> None:
    """Let ROLE (and its members) read GROUPS; takes effect on the next query."""
    from kbpg import access as kaccess

    with app.knowledge_base() as kb:
        new = kaccess.grant(kb, role, groups)
    for g in new:
        click.echo(f"granted {g.group} to {g.role}")


@access.command("revoke")
@click.argument("role")
@click.argument("groups", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Revoke every group of ROLE.")
@pass_app
@handle_errors
def access_revoke(app: AppContext, role: str, groups: tuple[str, ...], every: bool) -> None:
    """Take GROUPS (or --all) away from ROLE; takes effect on the next query."""
    from kbpg import access as kaccess

    if bool(groups) == every:
        raise click.UsageError("give GROUPS or --all (not both)")
    with app.knowledge_base() as kb:
        gone = kaccess.revoke(kb, role, None if every else groups)
    for g in gone:
        click.echo(f"revoked {g.group} from {g.role}")
    if not gone:
        click.echo(f"{role} had none of those grants", err=True)


@access.command("list")
@click.argument("role", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (`[]` when empty).")
@pass_app
@handle_errors
def access_list(app: AppContext, role: str | None, as_json: bool) -> None:
    """List grants (role, group, granted at); a reader sees its own."""

    from kbpg import access as kaccess

    with app.knowledge_base() as kb:
        grants = kaccess.list_grants(kb, role)
    _print_rows(
        grants,
        as_json,
        ["role", "group", "granted_at"],
        lambda g: [g.role, g.group, g.granted_at.isoformat() if g.granted_at else ""],
    )


def _print_access_status(status: Any, as_json: bool) -> None:
    import json

    if as_json:
        click.echo(json.dumps(status.as_dict(), indent=2))
        return
    state = "on" if status.enforced else "off"
    click.echo(f"enforced: {state} ({status.tables_enforced}/{status.tables_total} tables)")
    click.echo(f"reader role: {status.reader_role or 'not set up'}")
    click.echo(f"writer role: {status.writer_role or 'not set up'}")
    click.echo(f"lexical cache split by groups: {'yes' if status.lexical_cache_split else 'no'}")
    seen = "every group" if status.reads_all else (", ".join(status.visible_groups) or "none")
    click.echo(f"this role reads: public chunks and {seen}")


@access.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
@handle_errors
def access_status(app: AppContext, as_json: bool) -> None:
    """Whether access control is enforced, the roles, and what this role may read."""
    from kbpg import access as kaccess

    with app.knowledge_base() as kb:
        status = kaccess.status(kb)
    _print_access_status(status, as_json)


def _set_enforced(app: AppContext, enforced: bool) -> None:
    from kbpg import access as kaccess

    with app.knowledge_base() as kb:
        status = kaccess.set_enforced(kb, enforced)
    _print_access_status(status, as_json=False)


@access.command("enable")
@pass_app
@handle_errors
def access_enable(app: AppContext) -> None:
    """Enforce grants (row-level security on; rebuilds the lexical cache by group)."""
    _set_enforced(app, True)


@access.command("disable")
@pass_app
@handle_errors
def access_disable(app: AppContext) -> None:
    """Stop enforcing grants: every role with SELECT sees every chunk (grants are kept)."""
    _set_enforced(app, False)


if __name__ == "__main__":  # pragma: no cover
    main()
