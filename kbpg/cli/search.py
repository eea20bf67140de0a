"""`kbpg search`, `serve`, `token` and `eval`: thin front ends over KnowledgeBase + SearchRequest."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import click

from kbpg.cli.common import (
    AppContext,
    choose_knowledge_base,
    embedder_option,
    handle_errors,
    json_option,
    pass_app,
    search_options,
)
from kbpg.config import CLI_DEFAULT_TOP
from kbpg.errors import InvalidInput, KbpgError
from kbpg.ingest.sources import printable
from kbpg.search.request import OPTIONS, TUNING_OPTIONS


@click.command("eval")
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
@click.option(
    "--language",
    metavar="LANG",
    help="The evaluation database's language (english, russian, cjk, ...: see `kbpg db "
    "upgrade --language`)  [env var: KBPG_LANGUAGE; default: english].",
)
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
    language: str | None,
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
    from kbpg.models.embedders import get_embedder

    dataset = ev.load_beir(dataset_dir, split)
    chosen = ev.parse_arms(arms)
    extra = ("rerank",) * rerank_arm + ("expand",) * expand_arm
    if extra:
        chosen = tuple(dict.fromkeys((*(chosen or ev.DEFAULT_ARMS), *extra)))
    name = embedder_name or app.settings.embedder
    model = get_embedder(app.settings, name) if name else None  # None: the language's default
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
        language=language or app.settings.language,
    )
    if report.database:
        click.echo(f"kept evaluation database {report.database}", err=True)
    if save_runs is not None:
        save_runs.mkdir(parents=True, exist_ok=True)
        for arm, run in report.runs.items():
            ev.write_trec_run(save_runs / f"{arm}.run", run, tag=f"kbpg-{arm}")
    click.echo(json.dumps(report.to_json()) if as_json else ev.format_table(report))


def _searchable_query(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from kbpg.search.request import validate_query

    try:
        return validate_query(value)
    except KbpgError as exc:
        raise click.BadParameter(exc.message, ctx=ctx, param=param) from None


_SEARCH_OPTIONS = {name: option for name, option in OPTIONS.items() if name != "query"}


def _knowledge_bases(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    # the first is the session's: its model embeds the query
    choose_knowledge_base(ctx, value[0] if value else None)
    return value


@click.command()
@click.argument("query", callback=_searchable_query)
@search_options(_SEARCH_OPTIONS, defaults={"top": CLI_DEFAULT_TOP})
@click.option(
    "--kb",
    "knowledge_bases",
    metavar="NAME",
    multiple=True,
    is_eager=True,  # before the other options' callbacks read the settings
    callback=_knowledge_bases,
    help="The knowledge base to search [env: KBPG_KB; default: default]. Several (--kb a --kb "
    "b): one ranking across them, each chunk labelled with its knowledge base; they must share "
    "an embedding model (no graph, recency, diversity, convex fusion, facets, rerank, expand).",
)
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
    knowledge_bases: tuple[str, ...],
    **options: Any,
) -> None:
    """Search the knowledge base for QUERY (TOON rows by default).

    The query is plain text (websearch syntax for the BM25 arm); it is never run as SQL.
    --json prints {context, sources, chunks, stages}. Database: KBPG_DATABASE_URL; model: KBPG_EMBEDDER.
    """
    if as_json and context_only:
        raise click.UsageError("--json and --context cannot be used together")
    from kbpg.search import output
    from kbpg.search.request import SearchRequest

    try:
        request = SearchRequest(query, **options)
    except InvalidInput as exc:
        raise click.UsageError(exc.message) from None
    with app.knowledge_base(embedder_name) as kb:
        result = kb.search(request, knowledge_bases=knowledge_bases or None)
    for notice in result.notices:
        click.echo(f"Notice: {notice}", err=True)
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        click.echo(output.render_json(result))
    elif context_only:
        click.echo(result.context, nl=False)
    else:
        terminal = sys.stdout.isatty()  # the query's words in bold on a terminal only
        click.echo(output.render_toon(result, bold=terminal))
    if explain:
        click.echo(output.render_explain(result), err=True)


@click.command()
@embedder_option
@pass_app
@handle_errors
def mcp(app: AppContext, embedder_name: str | None) -> None:
    """Serve the knowledge base to an agent over MCP (stdio): search, list and read documents.

    An agent host launches it (`"command": "kbpg", "args": ["mcp"]`); stdout carries the
    protocol, logs go to stderr. Database and model as for `kbpg search`.
    """
    try:
        from kbpg.serve.mcp_server import serve as run_mcp
    except ImportError as exc:
        raise KbpgError(
            f"the MCP server needs the `mcp` package ({exc.name} is missing)",
            hint="pip install 'kbpg[mcp]'",
        ) from None
    run_mcp(app.settings, embedder_name)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port."
)
@click.option(
    "--pool-size",
    type=click.IntRange(2, 100),
    default=None,
    help="Database connections shared by the request threads (searches run at once; the rest "
    "wait up to KBPG_POOL_TIMEOUT). Default: this machine's cores plus one: PostgreSQL "
    "on the same cores runs its searches best at that; give a server elsewhere its own cores.",
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
@click.option(
    "--metrics-token",
    envvar="KBPG_METRICS_TOKEN",
    metavar="TOKEN",
    help="Guard /metrics with this bearer token instead of the API's tokens (env "
    "KBPG_METRICS_TOKEN; a Prometheus scraper then holds no search token).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="KBPG_LOG_FORMAT",
    default="text",
    show_default=True,
    help="Server log on stderr: uvicorn's text lines, or one JSON object a line with a line "
    "per request (route, status, ms) (env KBPG_LOG_FORMAT).",
)
@pass_app
@handle_errors
def serve(
    app: AppContext,
    host: str,
    port: int,
    pool_size: int | None,
    allowed_hosts: tuple[str, ...],
    tokens_file: Path | None,
    source_root: Path | None,
    insecure_no_token: bool,
    metrics_token: str | None,
    log_format: str,
) -> None:
    """Serve the search page (/), the HTTP API (POST /api/v1/kb/search), /healthz (alive),
    /readyz (databases ready), /metrics (Prometheus) and /docs.

    KBPG_API_TOKEN (runs as the server's own role) or a tokens file (each token runs as its
    database role) guards the API and /metrics. Without either, only a loopback address is
    served.
    """
    from kbpg.serve.http import serve as run_server

    run_server(
        app.settings,
        host=host,
        port=port,
        pool_size=pool_size,
        extra_hosts=tuple(h for value in allowed_hosts for h in value.split()),
        tokens_file=tokens_file,
        insecure_no_token=insecure_no_token,
        source_root=str(source_root.resolve()) if source_root else None,
        metrics_token=metrics_token or None,
        log_format=log_format,
    )


def _append_line(path: Path, line: str) -> None:
    """Append `line` to a tokens file on a line of its own (a file whose last line has no
    newline got the new entry glued to it: one invalid line, and a server that would not
    start); only a regular file (created 0600 when missing)."""
    where = printable(str(path))
    hint = "give a regular file this user may write (created when missing)"
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise KbpgError(
            f"cannot write the tokens file {where}: {exc.strerror}", hint=hint
        ) from None
    try:
        size = os.fstat(fd)
        if not stat.S_ISREG(size.st_mode):
            raise KbpgError(f"the tokens file {where} is not a regular file", hint=hint)
        glued = size.st_size > 0 and os.pread(fd, 1, size.st_size - 1) != b"\n"
        os.write(fd, (("\n" if glued else "") + line + "\n").encode())
    except OSError as exc:
        raise KbpgError(
            f"cannot write the tokens file {where}: {exc.strerror}", hint=hint
        ) from None
    finally:
        os.close(fd)


@click.group()
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
    from kbpg.serve.tokens import new_token, token_line

    secret = new_token()
    line = token_line(secret, role, comment)
    if path is None:
        click.echo(line, err=True)
    else:
        _append_line(path, line)
        click.echo(f"added a token for role {role} to {printable(str(path))}", err=True)
    click.echo(secret)


@token.command("hash")
@click.argument("role")
@handle_errors
def token_hash(role: str) -> None:
    """Read a token on stdin; print its tokens-file line for ROLE (the token is not stored)."""
    from kbpg.serve.tokens import token_line

    secret = sys.stdin.readline().strip()
    if not secret:
        raise click.UsageError("no token on stdin")
    click.echo(token_line(secret, role))
