"""The HTTP API (`kbpg serve`): POST /api/v1/kb/search, GET /healthz, OpenAPI, bearer token."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from kbpg import request as search_request
from kbpg.app import KnowledgeBase
from kbpg.config import Settings
from kbpg.errors import (
    Busy,
    DatabaseUnavailable,
    EmbeddingSpaceMismatch,
    InvalidInput,
    KbpgError,
    PermissionDenied,
    QueryTimeout,
    ReadOnlyDatabase,
    SchemaNotMigrated,
)
from kbpg.search import Chunk, Source
from kbpg.stages import StageReport

_log = logging.getLogger("uvicorn.error")

MAX_BODY_BYTES = 64 * 1024
HEALTH_PATH = "/healthz"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


_PYTHON_TYPES: dict[str, Any] = {
    "query": str,
    "int": int,
    "float": float,
    "bool": bool,
    "text": str,
    "texts": list[str],
}


class _SearchBody(BaseModel):
    """Strict types (`true` is not 1, "5" is not 5); the values are checked by kbpg.request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*")
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
        bounded = Field(default=None, description=description, ge=option.minimum, le=option.maximum)
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


class ErrorResponse(BaseModel):
    error: str
    message: str
    hint: str | None = None


_STATUS: list[tuple[type[KbpgError], int]] = [
    (InvalidInput, 422),
    (EmbeddingSpaceMismatch, 409),
    (PermissionDenied, 403),
    (DatabaseUnavailable, 503),
    (SchemaNotMigrated, 503),
    (Busy, 503),
    (ReadOnlyDatabase, 503),
    (QueryTimeout, 504),
]


def _error_response(exc: KbpgError) -> JSONResponse:
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
    body = ErrorResponse(error=type(exc).__name__, message=exc.message, hint=exc.hint)
    return JSONResponse(body.model_dump(), status_code=status)


async def _send_json(send: Send, status: int, body: dict[str, Any], **headers: str) -> None:
    payload = json.dumps(body).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
    ]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


class GuardMiddleware:
    """Bearer token on every route but health, then a request body size limit (413)."""

    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"] != HEALTH_PATH:
            supplied = headers.get(b"authorization", b"")
            scheme, _, credential = supplied.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credential.strip(), self.token
            ):
                await _send_json(
                    send,
                    401,
                    {"error": "Unauthorized", "message": "a valid bearer token is required"},
                    **{"www-authenticate": "Bearer"},
                )
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send)
            return
        # Read the body here (it is small by construction) so that a chunked upload without a
        # Content-Length is held to the same limit, then replay it to the app.
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await self._too_large(send)
                return
        replayed: Message = {"type": "http.request", "body": bytes(body), "more_body": False}
        await self.app(scope, _replay([replayed], then=receive), send)

    async def _too_large(self, send: Send) -> None:
        await _send_json(
            send,
            413,
            {
                "error": "PayloadTooLarge",
                "message": f"request body over {self.max_body_bytes} bytes",
            },
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def create_app(
    kb: KnowledgeBase, *, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """The FastAPI app over one KnowledgeBase (one model, one connection pool)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            kb.close()

    app = FastAPI(
        title="kbpg",
        summary="Knowledge-base retrieval inside PostgreSQL (pgvector + BM25 + graph, RRF).",
        lifespan=lifespan,
    )

    @app.exception_handler(KbpgError)
    async def kbpg_error(request: Request, exc: KbpgError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes each invalid input back: a 60 KB query, or a lone surrogate
        # that cannot even be encoded as JSON. Where and what is enough to fix a request.
        detail = [
            {"type": error["type"], "loc": list(error["loc"]), "msg": error["msg"]}
            for error in exc.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.post(
        "/api/v1/kb/search",
        response_model=SearchResponse,
        responses={
            401: {"model": ErrorResponse},
            409: {"model": ErrorResponse},
            413: {"model": ErrorResponse},
            503: {"model": ErrorResponse},
        },
    )
    def search(body: SearchRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """Rank chunks for a query with kb.search; returns context, sources and chunks."""
        # A sync endpoint: FastAPI runs it in its threadpool, so the CPU-bound embedding and
        # the database wait never block the event loop.
        request = search_request.SearchRequest(**body.model_dump())  # type: ignore[attr-defined]
        return kb.search(request).to_json()

    @app.get(HEALTH_PATH, responses={503: {"description": "not ready"}})
    def healthz() -> JSONResponse:
        """Database reachable, schema at head, model loaded (503 otherwise); no token needed."""
        report = kb.health()
        return JSONResponse(report, status_code=200 if report["ok"] else 503)

    app.add_middleware(GuardMiddleware, token=token, max_body_bytes=max_body_bytes)
    return app


def _loopback(host: str) -> str:
    """The host as an IP address for the loopback check (names other than localhost: not loopback)."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "0.0.0.0"
    return host


def serve(settings: Settings, *, host: str, port: int, pool_size: int = 8) -> None:
    """Load the model, open the pool, and run the API with uvicorn until interrupted."""
    import uvicorn

    kb = KnowledgeBase.from_env(settings, pool_size=pool_size)
    try:
        kb.warm_up()
        report = kb.health()
        if not report["ok"]:
            # Serve anyway: /healthz says 503 until the schema is migrated.
            _log.warning("not ready: database %s, schema %s", report["database"], report["schema"])
        if not settings.api_token and not ipaddress.ip_address(_loopback(host)).is_loopback:
            _log.warning(
                "serving on %s without KBPG_API_TOKEN: anyone who can reach it can search", host
            )
        app = create_app(kb, token=settings.api_token)
        uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
    finally:
        kb.close()
