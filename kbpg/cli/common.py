"""What every kbpg command shares: per-invocation state, error handling, declared-once options."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kbpg.config import Settings
from kbpg.errors import InvalidInput, KbpgError
from kbpg.ingest.sources import printable
from kbpg.search.request import Option, combine_filters, parse_filter

if TYPE_CHECKING:
    from kbpg.app import KnowledgeBase

F = TypeVar("F", bound=Callable[..., Any])


class StatusLine:
    """Progress on stderr: one rewritten line on a terminal, a line every few seconds otherwise;
    notes (a skipped file, a parked row) on lines of their own."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.written = False

    def note(self, message: str) -> None:
        self.clear()
        click.echo(message, err=True)

    def show(self, line: str) -> None:
        """Show `line` unless the last one was shown moments ago (0.2 s on a terminal, 5 s
        otherwise)."""
        now = time.monotonic()
        if now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        if self.tty:
            click.echo("\r" + line + "\x1b[K", nl=False, err=True)
            self.written = True
        else:
            click.echo(line, err=True)

    def clear(self) -> None:
        if self.tty and self.written:
            click.echo("\r\x1b[K", nl=False, err=True)
            self.written = False


@contextlib.contextmanager
def elapsed_status(label: str) -> Iterator[None]:
    """While the block runs (one long SQL call that reports nothing itself), `label` and the
    seconds so far on stderr, as StatusLine shows progress."""
    status = StatusLine()
    stop = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not stop.wait(1.0):
            status.show(f"{label}: {time.monotonic() - started:.0f} s")

    ticker = threading.Thread(target=tick, name="kbpg-elapsed", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        status.clear()


class AppContext:
    """Per-invocation state shared by subcommands (settings are read once)."""

    def __init__(self, debug: bool) -> None:
        self.debug = debug
        self._settings: Settings | None = None
        self._url: str | None = None
        self.write_lock_wait_ms: int | None = None  # --lock-wait, over KBPG_WRITE_LOCK_WAIT
        self.knowledge_base_name: str | None = None  # --kb, over KBPG_KB

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            settings = Settings.from_env()
            if self.write_lock_wait_ms is not None:
                settings = dataclasses.replace(settings, write_lock_wait_ms=self.write_lock_wait_ms)
            if self.knowledge_base_name is not None:
                settings = dataclasses.replace(settings, knowledge_base=self.knowledge_base_name)
            self._settings = settings
        return self._settings

    @property
    def url(self) -> str:
        """The database URL; starts the embedded server when KBPG_DATABASE_URL is unset."""
        if self._url is None:
            from kbpg.store.db import resolve_url

            self._url = resolve_url(self.settings)
        return self._url

    def knowledge_base(self, embedder: str | None = None) -> KnowledgeBase:
        """The application object over one connection (a CLI call is one unit of work).

        On the embedded server (no KBPG_DATABASE_URL) its database gets kbpg's schema on first
        use; a database of the user's own is left to `kbpg db upgrade`.
        """
        from kbpg.app import KnowledgeBase

        return KnowledgeBase(settings=self.settings, pool_size=1, embedder_name=embedder)


def _not_utf8(value: Any) -> bool:
    """An argument the shell passed as bytes that are not UTF-8 (Python keeps them as lone
    surrogates, which nothing downstream can encode)."""
    if isinstance(value, str | os.PathLike):
        return any("\udc80" <= ch <= "\udcff" for ch in os.fspath(value))
    if isinstance(value, tuple | list):
        return any(_not_utf8(v) for v in value)
    return False


def handle_errors(func: F) -> F:
    """Turn KbpgError into `Error: ...` plus a hint on stderr, exit 1; no traceback. An argument
    that is not UTF-8 is a usage error (exit 2), before the command runs."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        debug = isinstance(ctx.obj, AppContext) and ctx.obj.debug
        for name, value in kwargs.items():
            if _not_utf8(value):
                param = next((p for p in ctx.command.params if p.name == name), None)
                raise click.BadParameter(
                    "not valid UTF-8 (kbpg reads arguments as UTF-8 text)", ctx, param
                )
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
    help="Embedding provider: minilm (offline, English), e5-multilingual (offline, ~100 "
    "languages) or openai  [env var: KBPG_EMBEDDER; default: the model the knowledge base "
    "records, else minilm for English and e5-multilingual for other languages].",
)


def _lock_wait(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from kbpg.config import parse_duration_ms

    app = ctx.find_object(AppContext)
    if value is None or app is None:
        return
    try:
        app.write_lock_wait_ms = parse_duration_ms(value, "--lock-wait")
    except KbpgError as exc:
        raise click.BadParameter(exc.message) from None


# Every writer (ingest, documents delete, reembed, recontextualize) waits for kbpg's write lock.
lock_wait_option = click.option(
    "--lock-wait",
    metavar="DURATION",
    expose_value=False,
    callback=_lock_wait,
    help="Give up after waiting this long for another writer (e.g. 30s, 10min; 0: at once) "
    "[env: KBPG_WRITE_LOCK_WAIT; default: 60s].",
)


def choose_knowledge_base(ctx: click.Context, name: str | None) -> None:
    """The command works in the knowledge base `name` (None: KBPG_KB, else default)."""
    app = ctx.find_object(AppContext)
    if name is not None and app is not None:
        app.knowledge_base_name = name


def _knowledge_base(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    choose_knowledge_base(ctx, value)


def knowledge_base_option() -> click.Option:
    """--kb NAME, which every command working in one knowledge base takes (kbpg.cli adds it)."""
    return click.Option(
        ["--kb", "knowledge_base"],
        metavar="NAME",
        expose_value=False,
        is_eager=True,  # before the other options' callbacks read the settings
        callback=_knowledge_base,
        help="The knowledge base to work in [env: KBPG_KB; default: default].",
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
        kwargs["type"] = _FiniteFloatRange(option.minimum, option.maximum)
    elif option.kind == "texts":
        kwargs.update(multiple=True, metavar=option.metavar, default=())
    elif option.kind == "filter":  # JSON or KEY=VALUE, repeatable: one filter, all of them
        kwargs.update(multiple=True, metavar=option.metavar, default=(), callback=_filters)
    else:
        kwargs["metavar"] = option.metavar
    return click.option(*decls, **kwargs)


def _filters(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    try:
        return combine_filters(tuple(parse_filter(v) for v in values))
    except InvalidInput as exc:
        message = exc.message + (f" ({exc.hint})" if exc.hint else "")
        raise click.BadParameter(message, ctx=ctx, param=param) from None


class _FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses nan and inf (they compare false with both bounds)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


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


def print_rows(
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
        click.echo("\t".join(map(printable, fields(item))))
