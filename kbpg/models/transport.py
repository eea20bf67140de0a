"""One HTTP helper for every model server: timeouts, retries with backoff, error mapping."""

from __future__ import annotations

import json
import threading
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kbpg import telemetry
from kbpg.errors import ConfigError, ModelError

if TYPE_CHECKING:
    import httpx

# Defaults for calls made while a user waits (a reranker, a chat model): connecting to a
# model server on the same network takes milliseconds, so 3 s already means it is down.
DEFAULT_CONNECT_TIMEOUT_S = 3.0
DEFAULT_TIMEOUT_S = 30.0
# The longest Retry-After a client honours before giving up on the attempt's budget.
MAX_RETRY_AFTER_S = 30.0
_READ_SIZE = 65536


class ModelHTTP:
    """POSTs JSON to one model server and returns the decoded answer.

    - `timeout_s` bounds one attempt from connecting to the last byte of the answer (httpx's
      own timeouts are per socket operation: a server that trickles bytes would never time
      out), and `budget_s`, when set, bounds the whole call with its retries and back-offs;
      `connect_timeout_s` bounds the TCP connect alone.
    - Connect errors, timeouts, 429 and 5xx are retried `retries` times with exponential
      backoff (`backoff_s`, doubled each time; a numeric Retry-After wins when it fits the
      budget); other 4xx are not retried.
    - Every failure is one `error` (a ModelError class) naming the server, with `hint`.
    - Failures and retries are reported to kbpg.telemetry under `client` (embedder, reranker,
      chat).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        what: str = "model server",
        client: str = "model",
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        budget_s: float | None = None,
        retries: int = 2,
        backoff_s: float = 0.5,
        error: type[ModelError] = ModelError,
        hint_unreachable: str | None = None,
        hint_refused: str | None = None,
    ) -> None:
        if not base_url or not base_url.strip():
            raise ConfigError(f"the {what} URL is empty")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"the {what} URL {base_url!r} is not an http(s) URL",
                hint="e.g. http://localhost:8080/v1",
            )
        for name, value in (("timeout", timeout_s), ("connect timeout", connect_timeout_s)):
            if not value > 0:
                raise ConfigError(f"the {what} {name} must be positive, got {value}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.what = what
        self.client = client
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.budget_s = budget_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.error = error
        self.hint_unreachable = hint_unreachable
        self.hint_refused = hint_refused
        self.requests_made = 0
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}" if path else self.base_url

    @cached_property
    def _client(self) -> httpx.Client:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(headers=headers)

    def close(self) -> None:
        if "_client" in self.__dict__:
            self._client.close()

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """The decoded JSON answer of POST `path`; a ModelError after the retries."""
        import httpx

        url = self.url(path)
        started = time.monotonic()
        deadline = None if self.budget_s is None else started + self.budget_s
        last = ""
        attempts = 0
        delay = 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                telemetry.report.model_retry(self.client)
                delay = max(delay, self.backoff_s * 2 ** (attempt - 1))
                if deadline is not None and time.monotonic() + delay >= deadline:
                    break
                time.sleep(delay)
            delay = 0.0
            attempt_timeout = self.timeout_s
            if deadline is not None:
                attempt_timeout = min(attempt_timeout, deadline - time.monotonic())
                if attempt_timeout <= 0:
                    break
            attempts += 1
            with self._lock:
                self.requests_made += 1
            try:
                status, text, retry_after = self._attempt(url, body, attempt_timeout)
            except (httpx.TransportError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if status == 429 or status >= 500:
                last = f"HTTP {status}: {text[:200]}"
                if retry_after is not None:
                    delay = min(retry_after, MAX_RETRY_AFTER_S)
                continue
            if status >= 400:
                telemetry.report.model_error(self.client, "refused")
                refused = self.error(
                    f"{self.what} {url} refused the request: HTTP {status}: {text[:300]}",
                    hint=self.hint_refused,
                )
                # bad input (400, 413, 422), unlike a key or model name the server does not know
                refused.refused = status in (400, 413, 422)
                raise refused
            try:
                return json.loads(text)
            except ValueError as exc:
                telemetry.report.model_error(self.client, "bad_answer")
                raise self.error(
                    f"{self.what} {url} sent an unexpected response: not JSON ({exc})"
                ) from None
        elapsed = time.monotonic() - started
        telemetry.report.model_error(self.client, "unreachable")
        raise self.error(
            f"{self.what} {url} failed after {attempts} attempt{'s' * (attempts != 1)} "
            f"({last or 'out of time'}; {elapsed:.1f} s)",
            hint=self.hint_unreachable,
        )

    def _attempt(
        self, url: str, body: dict[str, Any], timeout_s: float
    ) -> tuple[int, str, float | None]:
        """(status, body text, Retry-After seconds) of one POST finished within `timeout_s`."""
        import httpx

        ends = time.monotonic() + timeout_s
        timeout = httpx.Timeout(timeout_s, connect=min(self.connect_timeout_s, timeout_s))
        with self._client.stream("POST", url, json=body, timeout=timeout) as response:
            parts: list[bytes] = []
            for part in response.iter_bytes(_READ_SIZE):
                parts.append(part)
                if time.monotonic() > ends:
                    raise TimeoutError(f"no complete answer within {timeout_s:.1f} s")
            raw = response.headers.get("retry-after", "")
            retry_after = float(raw) if raw.replace(".", "", 1).isdigit() else None
            return response.status_code, b"".join(parts).decode("utf-8", "replace"), retry_after
