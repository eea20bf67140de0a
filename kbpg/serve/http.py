"""The HTTP API (`kbpg serve`): POST /api/v1/kb/search (and /api/v1/kb/{name}/search, in
another knowledge base), /healthz, /readyz, /metrics, the search page and offline docs."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import logging.config
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import orjson
import psycopg
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from starlette.exceptions import HTTPException

from kbpg.app import Cancellation, KnowledgeBase, Principal
from kbpg.config import Settings
from kbpg.errors import (
    Busy,
    ConfigError,
    DatabaseUnavailable,
    EmbeddingSpaceMismatch,
    InvalidInput,
    KbpgError,
    ModelError,
    NotFound,
    PermissionDenied,
    QueryTimeout,
    ReadOnlyDatabase,
    RoleUnavailable,
    SchemaNotMigrated,
    StageUnavailable,
)
from kbpg.search import request as search_request
from kbpg.search.results import Chunk, FacetCount, SearchResult, Source
from kbpg.search.stages import StageReport
from kbpg.serve.guard import (
    HEALTH_PATH,
    METRICS_PATH,
    READY_PATH,
    ASGIApp,
    GuardMiddleware,
    Message,
    Receive,
    Scope,
    Send,
    allowed_hosts,
    is_loopback,
)
from kbpg.serve.logs import log_config
from kbpg.serve.metrics import CONTENT_TYPE, Metrics
from kbpg.serve.slow_clients import TimedH11Protocol
from kbpg.serve.tokens import Tokens
from kbpg.store.readiness import BUSY, DatabaseState, Readiness

_log = logging.getLogger("uvicorn.error")
_requests = logging.getLogger("kbpg.http")

MAX_BODY_BYTES = 64 * 1024
SEARCH_PATH = "/api/v1/kb/search"
# the same search in the knowledge base of that name (the server's own, --kb, at SEARCH_PATH)
KB_SEARCH_PATH = "/api/v1/kb/{name}/search"
_KB_SEARCH_PATHS = re.compile(r"/api/v1/kb/[^/]+/search")
WEB_DIR = Path(__file__).parent / "web"
BUSY_RETRY_AFTER_S = 2

_PYTHON_TYPES: dict[str, Any] = {
    "query": str,
    "int": int,
    "float": float,
    "bool": bool,
    "text": str,
    "texts": list[str],
    "filter": dict[str, Any],
    "interval": str,
}


class _SearchBody(BaseModel):
    """Strict types (`true` is not 1, "5" is not 5); the values are checked by kbpg.request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kb: str | None = Field(
        default=None,
        description="The knowledge base to search (its name); the server's own (kbpg serve "
        "--kb, KBPG_KB) when omitted. One the token's role may not read is not found.",
        min_length=1,
        max_length=63,
    )
    kbs: list[Annotated[str, Field(min_length=1, max_length=63)]] | None = Field(
        default=None,
        description="Several knowledge bases of one embedding space to search together (by "
        "name): one ranking across them, each chunk and source naming its knowledge base "
        "(kb.search_knowledge_bases). Not with `kb` or a name in the path; no graph arm, "
        "recency, diversity, facets, rerank or expand.",
        min_length=1,
        max_length=100,
    )

    @field_validator(*search_request.OPTIONS, check_fields=False)
    @classmethod
    def _checked(cls, value: Any, info: Any) -> Any:
        try:
            search_request.check(info.field_name, value)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return value


def _body_field(name: str, option: search_request.Option) -> tuple[Any, Any]:
    kind = _PYTHON_TYPES[option.kind]
    description = option.help + (f" Default: {option.default_note}." if option.default_note else "")
    if option.env:
        description += f" ({option.env})"
    if option.kind == "query":
        return kind, Field(min_length=1, description=description)
    if option.kind in ("int", "float"):
        bounded = Field(
            default=None,
            description=description,
            ge=option.minimum,
            le=option.maximum,
            # NaN and Infinity: "Input should be a finite number", not a misleading bound
            allow_inf_nan=False if option.kind == "float" else None,
        )
        return kind | None, bounded
    return kind | None, Field(default=None, description=description)


# The HTTP body of POST /api/v1/kb/search: SearchRequest's fields, mapped one to one.
SearchRequest: type[_SearchBody] = create_model(  # type: ignore[call-overload]
    "SearchRequest",
    __base__=_SearchBody,
    __doc__="A search: the query and optional filters; omitted fields take kbpg's defaults.",
    **{name: _body_field(name, option) for name, option in search_request.OPTIONS.items()},
)


class SearchResponse(BaseModel):
    """The LLM-ready context block, its sources, and the ranked chunks (as `kbpg search --json`)."""

    context: str
    sources: list[Source]
    chunks: list[Chunk]
    stages: list[StageReport] = Field(
        default_factory=list,
        description="What each optional stage asked for (rerank, expand) did: applied, "
        "skipped or failed, with the reason; a failed stage leaves the plain result.",
    )
    facets: list[FacetCount] = Field(
        default_factory=list,
        description="The counts asked for with `facets`: per field, its values with the "
        "number of documents and chunks of the match set holding them (kb.facets).",
    )


class ErrorResponse(BaseModel):
    error: str
    message: str
    hint: str | None = None


class ValidationErrorResponse(ErrorResponse):
    """A request that is not valid: the first problem in `message`, each one in `detail`."""

    detail: list[dict[str, Any]]


# the error names of the HTTP errors the framework raises itself (no route, wrong method, ...)
_HTTP_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("BadRequest", "check the request's syntax and headers"),
    404: ("NotFound", f"the API is POST {SEARCH_PATH}; GET /docs describes it"),
    405: ("MethodNotAllowed", "the Allow header lists the methods this path takes"),
}


def http_error_response(exc: HTTPException) -> JSONResponse:
    """An HTTP error the framework raised, in kbpg's error shape."""
    name, hint = _HTTP_ERRORS.get(exc.status_code, ("HTTPError", None))
    body = ErrorResponse(error=name, message=_printable(str(exc.detail)), hint=hint)
    return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)


# What a client is told for each error: what to do, never PostgreSQL's own text, paths or role
# names (those go to the server log). None: the error's message is kbpg's own and says what to
# fix (validation, kbpg's SQL raising with a hint).
_ANSWERS: list[tuple[type[KbpgError], int, str | None, str | None]] = [
    (InvalidInput, 422, None, None),
    (NotFound, 404, None, None),  # a knowledge base that is not there (or hidden): kbpg's words
    (
        # the server's configuration: its log names the role and the grant that is missing
        RoleUnavailable,
        403,
        "this token's database role cannot be used by the server",
        "the server's operator must fix the token's role (the server log names it)",
    ),
    (
        PermissionDenied,
        403,
        "this token may not search this knowledge base",
        "ask the server's operator to grant the token's role kbpg_reader",
    ),
    (Busy, 503, "the server is busy", f"retry in {BUSY_RETRY_AFTER_S} seconds"),
    (QueryTimeout, 504, "the search took too long and was stopped", "use fewer words or filters"),
    (
        EmbeddingSpaceMismatch,
        503,
        "the server's embedding model does not match this knowledge base",
        "the server's operator must fix its model setting (see the server log)",
    ),
    (DatabaseUnavailable, 503, "the database is unavailable", "retry later"),
    (SchemaNotMigrated, 503, "the knowledge base is not ready yet", "retry later"),
    (ReadOnlyDatabase, 503, "the knowledge base cannot take writes here", None),
    (ModelError, 502, "the model server failed", "retry later"),
    (StageUnavailable, 422, None, None),
]


def _own_message(exc: KbpgError) -> bool:
    """True when the message was written by kbpg: raised in Python, or by kbpg's SQL with a hint."""
    cause = exc.__cause__
    if not isinstance(cause, psycopg.Error):
        return True
    state = cause.sqlstate or ""
    return state.startswith("KB") or bool(cause.diag.message_hint)


def error_response(exc: KbpgError) -> JSONResponse:
    """The client's view of a KbpgError; the full message is logged for the operator."""
    status, message, hint = next(
        ((code, text, tip) for kind, code, text, tip in _ANSWERS if isinstance(exc, kind)),
        (500, "the search failed", "retry later; the server's log has the cause"),
    )
    if message is None and not _own_message(exc):
        message, hint = "the database refused the search request", "check the request's values"
    if message is None:
        body = ErrorResponse(error=type(exc).__name__, message=exc.message, hint=exc.hint)
    else:
        body = ErrorResponse(error=type(exc).__name__, message=message, hint=hint)
        _log.warning(
            "%s (%s): %s%s",
            body.error,
            status,
            exc.message,
            f" (hint: {exc.hint})" if exc.hint else "",
        )
    headers = {"Retry-After": str(BUSY_RETRY_AFTER_S)} if isinstance(exc, Busy) else None
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is read: the next message is a disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _search_until_disconnect(
    kb: KnowledgeBase,
    query: search_request.SearchRequest,
    principal: Principal,
    request: Request,
    knowledge_bases: list[str] | None = None,
) -> SearchResult | None:
    """Run the search in a worker thread (across `knowledge_bases` when given); cancel its SQL
    when the client disconnects (None)."""
    cancel = Cancellation()
    work = asyncio.ensure_future(
        run_in_threadpool(
            kb.search, query, principal=principal, cancel=cancel, knowledge_bases=knowledge_bases
        )
    )
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not work.done():
        _log.info("client went away: cancelling its search")
        cancel.cancel()
        with suppress(KbpgError):  # the statement ends with query_canceled; nobody listens
            await work
        return None
    return work.result()


def create_app(
    kb: KnowledgeBase,
    *,
    token: str | None = None,
    tokens: Tokens | None = None,
    hosts: frozenset[str] | None = allowed_hosts("127.0.0.1"),
    max_body_bytes: int = MAX_BODY_BYTES,
    source_root: str | None = None,
    metrics: Metrics | None = None,
    metrics_token: str | None = None,
) -> FastAPI:
    """The FastAPI app over one KnowledgeBase (one model, one connection pool).

    `tokens` (or the single `token`) guard the API and /metrics, or `metrics_token` guards
    /metrics alone; `hosts` are the Host names served (None: any); sources are shown relative
    to `source_root` (see search.display_sources). `metrics` (made here when not given) counts
    what this process does from now until the app shuts down.
    """
    if metrics is None:
        metrics = Metrics(kb.db.pool_stats)
    metrics.start()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            metrics.stop()
            kb.close()

    app = FastAPI(
        title="kbpg",
        summary="Knowledge-base retrieval inside PostgreSQL (pgvector + BM25 + graph, RRF).",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's Swagger UI loads from a CDN: blank offline. See /docs below.
        redoc_url=None,
    )

    @app.exception_handler(KbpgError)
    async def kbpg_error(request: Request, exc: KbpgError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes each invalid input back: a 60 KB query, or a lone surrogate
        # that cannot even be encoded as JSON. Where and what is enough to fix a request.
        detail = [
            {"type": error["type"], "loc": [_printable(part) for part in error["loc"]],
             "msg": _printable(error["msg"])}
            for error in exc.errors()
        ]  # fmt: skip
        first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        body = ValidationErrorResponse(
            error="InvalidRequest",
            message=f"{where}: {first['msg']}" if where else str(first["msg"]),
            hint=f"POST {SEARCH_PATH} takes a JSON object with a query; GET /docs lists the fields"
            + (f" ({len(detail)} problems: see detail)" if len(detail) > 1 else ""),
            detail=detail,
        )
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return http_error_response(exc)

    async def answer(body: Any, request: Request, kb_name: str | None) -> Any:
        fields = body.model_dump()
        named = fields.pop("kb")
        across = fields.pop("kbs")
        if kb_name is not None and named is not None and named != kb_name:
            raise InvalidInput(
                f"the path names knowledge base {kb_name!r}, the body {named!r}",
                hint="name it in one place",
            )
        if across is not None and (kb_name or named) is not None:
            raise InvalidInput(
                "kbs names the knowledge bases of a search across several: not with kb or a "
                "knowledge base in the path",
                hint=f"POST {SEARCH_PATH} with kbs alone",
            )
        query = search_request.SearchRequest(**fields)
        principal = request.scope.get("state", {}).get("principal") or Principal()
        if (kb_name or named) is not None:
            principal = dataclasses.replace(principal, knowledge_base=kb_name or named)
        result = await _search_until_disconnect(kb, query, principal, request, across)
        if result is None:
            return Response(status_code=499)  # nginx's "client closed request"; never read
        # serialised here, not re-validated against SearchResponse (the docs' schema): the
        # result is kbpg's own, and validating it again cost more than the search's Python
        payload = orjson.dumps(result.for_display(source_root).to_json())
        return Response(payload, media_type="application/json")

    responses: dict[int | str, dict[str, Any]] = {
        401: {"model": ErrorResponse},
        403: {"model": ErrorResponse},
        404: {"model": ErrorResponse, "description": "no such knowledge base (or not the token's)"},
        413: {"model": ErrorResponse},
        422: {"model": ValidationErrorResponse},
        503: {"model": ErrorResponse, "description": "busy (Retry-After) or not ready"},
        504: {"model": ErrorResponse},
    }

    @app.post(SEARCH_PATH, response_model=SearchResponse, responses=responses)
    async def search(body: SearchRequest, request: Request) -> Any:  # type: ignore[valid-type]
        """Rank chunks for a query with kb.search; returns context, sources and chunks.

        Runs as the database role of the request's token, in the knowledge base the body's `kb`
        names (else the server's); a client that disconnects has its SQL cancelled.
        """
        return await answer(body, request, None)

    @app.post(KB_SEARCH_PATH, response_model=SearchResponse, responses=responses)
    async def search_in(name: str, body: SearchRequest, request: Request) -> Any:  # type: ignore[valid-type]
        """The same search in the knowledge base `name` (a body's `kb`, when given, must agree)."""
        return await answer(body, request, name)

    @app.get(HEALTH_PATH)
    async def healthz() -> JSONResponse:
        """Liveness: the process answers (the database is not asked); no token needed."""
        return JSONResponse({"ok": True})

    @app.get(READY_PATH, responses={503: {"description": "not ready: busy, down or unmigrated"}})
    def readyz() -> JSONResponse:
        """Readiness: the primary and each read replica, each ok, busy (every pooled connection
        in use), down, unmigrated (kbpg's schema not at head) or lagging (a replica); 200 when
        a search can be answered, 503 otherwise. No token needed; the reasons go to the log."""
        ready = kb.readiness()
        for state in (ready.primary, *ready.replicas):
            if not state.ok:
                _log.warning("readiness: %s is %s: %s", state.database, state.status, state.detail)
        headers = {"Retry-After": str(BUSY_RETRY_AFTER_S)} if ready.primary.status == BUSY else None
        return JSONResponse(
            _readiness_body(ready, kb.model_name()),
            status_code=200 if ready.ok else 503,
            headers=None if ready.ok else headers,
        )

    @app.get(METRICS_PATH, include_in_schema=False)
    def metrics_page() -> Response:
        """Prometheus metrics (text format); the API's tokens or --metrics-token guard it."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers=_PAGE_HEADERS)

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(WEB_DIR / "docs.html", headers=_PAGE_HEADERS)

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    app.add_middleware(
        GuardMiddleware,
        tokens=tokens or Tokens(token),
        hosts=hosts,
        max_body_bytes=max_body_bytes,
        public_paths=frozenset({"/", "/docs", "/openapi.json"}),
        public_prefixes=("/static/",),
        metrics_tokens=Tokens(metrics_token) if metrics_token else None,
    )
    app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: counts refusals too
    return app


# the route label of a request: its path when kbpg serves it (bounded), else "other"
_ROUTES = frozenset(
    {SEARCH_PATH, HEALTH_PATH, READY_PATH, METRICS_PATH, "/", "/docs", "/openapi.json"}
)


def route_of(path: str) -> str:
    if path in _ROUTES:
        return path
    if _KB_SEARCH_PATHS.fullmatch(path):
        return KB_SEARCH_PATH
    return "/static/" if path.startswith("/static/") else "other"


class RequestMetrics:
    """Counts and times every HTTP request by route and status, and logs it on `kbpg.http`
    (shown with --log-format json)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            route = route_of(scope["path"])
            self.metrics.request(route, scope["method"], status, seconds)
            _requests.info(
                "%s %s %d",
                scope["method"],
                route,
                status,
                extra={
                    "method": scope["method"],
                    "route": route,
                    "status": status,
                    "ms": round(seconds * 1000, 2),
                },
            )


def _readiness_body(ready: Readiness, model: str | None) -> dict[str, Any]:
    """What /readyz shows anyone: statuses, revisions and lag, replicas by their place in
    KBPG_READ_URL (their URLs and PostgreSQL's text stay in the server's log)."""

    def shown(state: DatabaseState) -> dict[str, Any]:
        out: dict[str, Any] = {"status": state.status, "schema": state.schema}
        if state.lag_bytes is not None:
            out |= {"lag_bytes": state.lag_bytes, "lag_s": state.lag_s}
        return out

    return {
        "ok": ready.ok,
        "model": model,
        "primary": shown(ready.primary),
        "replicas": [{"replica": i, **shown(r)} for i, r in enumerate(ready.replicas, 1)],
    }


# The page and its scripts come from this server only; nothing may frame it.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _printable(value: Any) -> Any:
    """A validation error's part, encodable as JSON UTF-8 (a lone surrogate becomes U+FFFD)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def default_pool_size() -> int:
    """The cores this process may run on, plus one. Searches beyond that only queue inside
    PostgreSQL, where they evict each other's caches; one more than the cores keeps them busy
    while a search is between statements. At 8 clients on 2 cores (200k chunks, kbpg serve
    with PostgreSQL on the same cores; 02-12-2026, two runs of two rounds): a pool of 3 served
    74-77 searches/s at p95 130-139 ms, 2 69-73 at 132-137, 4 65-85 at 131-158, the former
    default of 8 61-69 at 175-198 (PostgreSQL 19.2-21.1 ms of CPU a search, 16.6-17.6 with 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores + 1


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    pool_size: int | None = None,
    extra_hosts: tuple[str, ...] = (),
    tokens_file: Path | None = None,
    insecure_no_token: bool = False,
    source_root: str | None = None,
    metrics_token: str | None = None,
    log_format: str = "text",
) -> None:
    """Load the model, open the pool, and run the API with uvicorn until interrupted."""
    import uvicorn

    config = log_config(log_format)
    if config is not None:  # before the model loads, so that its log lines are JSON too
        logging.config.dictConfig(config)

    tokens = Tokens(settings.api_token, tokens_file)
    if not tokens.enabled and not is_loopback(host) and not insecure_no_token:
        raise ConfigError(
            f"refusing to serve on {host} without a token: anyone who can reach it could search",
            hint="set KBPG_API_TOKEN or --tokens-file, bind 127.0.0.1, or pass "
            "--insecure-no-token if the network in front of it is trusted",
        )
    hosts = None if "*" in extra_hosts else allowed_hosts(host, extra_hosts)
    kb = KnowledgeBase.from_env(settings, pool_size=pool_size or default_pool_size())
    try:
        kb.warm_up()
        ready = kb.readiness()
        if not ready.primary.ok:
            # Serve anyway: /readyz says 503 until the database answers at the schema head.
            _log.warning("not ready: primary %s: %s", ready.primary.status, ready.primary.detail)
        if not tokens.enabled and not is_loopback(host):
            _log.warning("serving on %s without a token (--insecure-no-token)", host)
        app = create_app(
            kb,
            tokens=tokens,
            hosts=hosts,
            source_root=source_root,
            metrics_token=metrics_token,
        )
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="info",
            access_log=False,
            log_config=config or uvicorn.config.LOGGING_CONFIG,
            http=TimedH11Protocol,  # headers in 10 s, a body in 30 s, or the connection closes
        )
    finally:
        kb.close()
