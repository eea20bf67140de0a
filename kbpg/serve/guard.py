"""What every HTTP request passes before kbpg's routes: allowed Host, bearer token, body size.

Plain ASGI (no web framework), so it runs before any routing or body parsing.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from kbpg.serve.tokens import Tokens

_log = logging.getLogger("uvicorn.error")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# A browser can be made to send any Host name that resolves to this machine (DNS rebinding):
# only names the operator lists are served. Loopback names cannot be rebound.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
# answered for any Host name and without a token: load balancers and orchestrators probe them
PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH})


def is_loopback(host: str) -> bool:
    """True for a loopback address or the name localhost (other names: not loopback)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names served: loopback names, the bound address itself, and `extra`."""
    hosts = {*LOOPBACK_HOSTS, *(h.strip().lower() for h in extra if h.strip())}
    if bind not in ("0.0.0.0", "::", ""):
        hosts.add(bind.strip("[]").lower())
    return frozenset(hosts)


def host_name(header: bytes) -> str:
    """The name of a Host header, without port or IPv6 brackets, lower case."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


async def send_json(send: Send, status: int, body: dict[str, Any], **headers: str) -> None:
    payload = json.dumps(body).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
    ]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


class GuardMiddleware:
    """Allowed Host on every route but the probes; bearer token on the API; body size limit.

    The page, its assets and the API docs hold no data and need no token (a browser cannot send
    one on navigation); everything under /api/ and anything not listed as public does, /metrics
    included unless `metrics_tokens` guard it instead. The principal of the matching token goes
    into `scope["state"]["principal"]`.
    """

    def __init__(
        self,
        app: ASGIApp,
        tokens: Tokens,
        hosts: frozenset[str] | None,
        max_body_bytes: int,
        public_paths: frozenset[str] = frozenset(),
        public_prefixes: tuple[str, ...] = (),
        metrics_tokens: Tokens | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.hosts = hosts
        self.max_body_bytes = max_body_bytes
        self.public_paths = public_paths | PROBE_PATHS
        self.public_prefixes = public_prefixes
        self.metrics_tokens = metrics_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        path: str = scope["path"]
        if path not in PROBE_PATHS and not self._host_allowed(headers.get(b"host", b"")):
            host = headers.get(b"host", b"").decode("latin-1")[:100]
            await send_json(
                send,
                400,
                {
                    "error": "HostNotAllowed",
                    "message": f"this server does not answer to the host name {host!r}",
                    "hint": "use the address the server was started with, or ask its operator "
                    "to allow this name (kbpg serve --allowed-host)",
                },
            )
            return
        public = path in self.public_paths or path.startswith(self.public_prefixes)
        tokens = self.tokens
        if path == METRICS_PATH and self.metrics_tokens is not None:
            tokens = self.metrics_tokens
        if tokens.enabled and not public:
            error = tokens.reload()
            if error is not None:
                _log.error("tokens file not reloaded, the previous one stays: %s", error.message)
            supplied = headers.get(b"authorization", b"")
            scheme, _, credential = supplied.partition(b" ")
            principal = tokens.lookup(credential.strip()) if scheme.lower() == b"bearer" else None
            if principal is None:
                await send_json(
                    send,
                    401,
                    {
                        "error": "Unauthorized",
                        "message": "a valid bearer token is required",
                        "hint": "send the header `Authorization: Bearer <token>`",
                    },
                    **{"www-authenticate": "Bearer"},
                )
                return
            scope.setdefault("state", {})["principal"] = principal
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

    def _host_allowed(self, header: bytes) -> bool:
        if self.hosts is None:  # --allowed-host '*'
            return True
        return host_name(header) in self.hosts

    async def _too_large(self, send: Send) -> None:
        await send_json(
            send,
            413,
            {
                "error": "PayloadTooLarge",
                "message": f"request body over {self.max_body_bytes} bytes",
                "hint": "send a shorter query",
            },
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive() that returns `messages` first, then the server's own (a disconnect, later)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
