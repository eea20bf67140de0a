"""`kbpg access ...`: who reads which groups (row-level security in PostgreSQL)."""

from __future__ import annotations

from typing import Any

import click

from kbpg.cli.common import (
    AppContext,
    handle_errors,
    pass_app,
    print_rows,
)


@click.group()
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
    from kbpg.store import access as kaccess

    with app.knowledge_base() as kb:
        reader, writer = kaccess.setup(kb.db, reader_role, writer_role)
    click.echo(f"reader role: {reader}\nwriter role: {writer}")
    click.echo(f"let a login role search with: grant {reader} to <login>;", err=True)


@access.command("grant")
@click.argument("role")
@click.argument("groups", nargs=-1, required=True)
@pass_app
@handle_errors
def access_grant(app: AppContext, role: str, groups: tuple[str, ...]) -> None:
    """Let ROLE (and its members) read GROUPS; takes effect on the next query."""
    from kbpg.store import access as kaccess

    with app.knowledge_base() as kb:
        new = kaccess.grant(kb.db, role, groups)
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
    from kbpg.store import access as kaccess

    if bool(groups) == every:
        raise click.UsageError("give GROUPS or --all (not both)")
    with app.knowledge_base() as kb:
        gone = kaccess.revoke(kb.db, role, None if every else groups)
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

    from kbpg.store import access as kaccess

    with app.knowledge_base() as kb:
        grants = kaccess.list_grants(kb.db, role)
    print_rows(
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
    from kbpg.store import access as kaccess

    with app.knowledge_base() as kb:
        status = kaccess.status(kb.db)
    _print_access_status(status, as_json)


def _set_enforced(app: AppContext, enforced: bool) -> None:
    from kbpg.store import access as kaccess

    with app.knowledge_base() as kb:
        status = kaccess.set_enforced(kb.db, enforced)
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
