"""Connections that send too slowly are closed: uvicorn waits for a request's headers and body
as long as bytes keep coming, so 20 clients trickling a byte a second held 20 connections for
minutes (slowloris). A request's headers must be in within HEADERS_S of the connection (or of
the previous response), its body within BODY_S of its headers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_log = logging.getLogger("uvicorn.error")

HEADERS_S = 10.0
BODY_S = 30.0  # the body is at most 64 KiB (kbpg.serve.guard)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines for a request's headers and its body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._reading: str | None = None  # "headers" or "body" while a deadline runs

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", HEADERS_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._reading == "headers":
            self._arm("body", BODY_S)
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the request is in: the route's own time limits apply now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm("headers", HEADERS_S)

    def _arm(self, reading: str, seconds: float) -> None:
        self._disarm()
        self._reading = reading
        self._deadline = self.loop.call_later(seconds, self._too_slow, reading, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._reading = None, None

    def _too_slow(self, reading: str, seconds: float) -> None:
        self._deadline, self._reading = None, None
        if not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            _log.info("closing %s: its request's %s took over %g s", client, reading, seconds)
            self.transport.close()
