"""`kbpg kb ...`: the named knowledge bases of one database (every other command takes --kb)."""

from __future__ import annotations

import json

import click

from kbpg.cli.common import AppContext, handle_errors, json_option, pass_app, print_rows

READERS = ("granted", "all")


@click.group("kb")
def knowledge_bases() -> None:
    """Named knowledge bases in one database, each with its own documents, language, embedding
    model, BM25 statistics, vector index and grants.

    Every database has `default`; any other command works in the one `--kb NAME` (or KBPG_KB)
    names. Creating, renaming, dropping and opening one need the owner of the kb tables (they
    build and drop indexes); a reader lists the ones it may read.
    """


@knowledge_bases.command("create")
@click.argument("name")
@click.option(
    "--language",
    metavar="LANGUAGE",
    help="Its language: english, russian, simple, cjk, ... (default: default's).",
)
@click.option(
    "--embedder",
    "embedder_name",
    metavar="NAME",
    help="Record this embedding model now (default: the first ingest's).",
)
@click.option(
    "--readers",
    type=click.Choice(READERS),
    default="granted",
    show_default=True,
    help="Which reader roles read it once access control is enforced: those granted a group in "
    "it, or all (each reads its chunks without groups).",
)
@json_option
@pass_app
@handle_errors
def kb_create(
    app: AppContext,
    name: str,
    language: str | None,
    embedder_name: str | None,
    readers: str,
    as_json: bool,
) -> None:
    """Create the knowledge base NAME, empty.

    The first one beside default limits default's vector index to default's rows: it is built
    again first, concurrently (searches go on; minutes at a million chunks).
    """
    from kbpg.models.embedders import get_embedder
    from kbpg.store import knowledge_bases as kbs

    model = dimension = None
    if embedder_name is not None:
        embedder = get_embedder(app.settings, embedder_name)
        model, dimension = embedder.model_name, embedder.dimension
    with app.knowledge_base() as kb:
        created = kbs.create(
            kb.db, name, language=language, model=model, dimension=dimension, readers=readers
        )
    if as_json:
        click.echo(json.dumps(created.as_dict(), indent=2))
        return
    space = f", {created.model} {created.dimension}-d" if created.model else ""
    click.echo(f"created knowledge base {created.name} ({created.language}{space})")
    click.echo(f"use it with --kb {created.name} (or KBPG_KB={created.name})", err=True)


_COLUMNS = (
    ["name", "language", "model", "dimension", "documents", "chunks", "readers"],
    lambda k: [
        k.name,
        k.language or "",
        k.model or "",
        str(k.dimension or ""),
        str(k.documents),
        str(k.chunks),
        k.readers,
    ],
)


@knowledge_bases.command("list")
@json_option
@pass_app
@handle_errors
def kb_list(app: AppContext, as_json: bool) -> None:
    """The knowledge bases of this database, default first (those the caller may read: a reader
    sees its documents in each)."""
    from kbpg.store import knowledge_bases as kbs

    with app.knowledge_base() as kb:
        rows = kbs.list_all(kb.db)
    print_rows(rows, as_json, *_COLUMNS)


@knowledge_bases.command("rename")
@click.argument("name")
@click.argument("new_name")
@pass_app
@handle_errors
def kb_rename(app: AppContext, name: str, new_name: str) -> None:
    """Give the knowledge base NAME the name NEW_NAME (default keeps its own)."""
    from kbpg.store import knowledge_bases as kbs

    with app.knowledge_base() as kb:
        kbs.rename(kb.db, name, new_name)
    click.echo(f"renamed knowledge base {name} to {new_name}")


@knowledge_bases.command("readers")
@click.argument("name")
@click.argument("readers", type=click.Choice(READERS))
@pass_app
@handle_errors
def kb_readers(app: AppContext, name: str, readers: str) -> None:
    """Which reader roles may read the knowledge base NAME once access control is enforced.

    granted: only roles holding a group grant in it (`kbpg access grant ROLE GROUP --kb NAME`);
    to every other reader it does not exist. all: every reader role reads its chunks without
    groups, and those of its groups there (default's way, and that of every knowledge base an
    upgrade to 0031 found). With access control off, every role reads everything.
    """
    from kbpg.store import knowledge_bases as kbs

    with app.knowledge_base() as kb:
        kbs.set_readers(kb.db, name, readers)
    click.echo(f"knowledge base {name}: readers {readers}")


@knowledge_bases.command("drop")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask first (for scripts).")
@pass_app
@handle_errors
def kb_drop(app: AppContext, name: str, yes: bool) -> None:
    """Delete the knowledge base NAME whole: documents, chunks, statistics, index, grants.

    Asks first (`--yes` does not). default cannot be dropped (`kbpg documents delete --all`
    empties it); a knowledge base with table sources neither, until they are removed.
    """
    from kbpg.store import knowledge_bases as kbs

    if not yes:
        click.confirm(f"Drop the knowledge base {name} and everything in it?", abort=True, err=True)
    with app.knowledge_base() as kb:
        documents, chunks = kbs.drop(kb.db, name)
    click.echo(f"dropped knowledge base {name} ({documents} documents, {chunks} chunks)")
