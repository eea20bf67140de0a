"""`kbpg serve` in a subprocess on a free loopback port, for the HTTP tests."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers import KBPG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running_server(env: dict[str, str], log: Path, *args: str) -> Iterator[httpx.Client]:
    """`kbpg serve` in a subprocess; a client on its base URL once /healthz answers."""
    port = free_port()
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [KBPG, "serve", "--port", str(port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                client.get("/healthz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
