"""Warm latency of the HTTP API: p50/p95 of POST /api/v1/kb/search against a running `kbpg serve`.

    kbpg ingest samples/kb --recursive
    kbpg serve --port 8080 &
    python benchmarks/bench_http.py --url http://127.0.0.1:8080 --requests 300 --concurrency 1

The latency of one request is measured by the client (HTTP + JSON + embedding + kb.search).
With --concurrency N, N clients send requests at once (throughput, latency under load).
KBPG_API_TOKEN, when set, is sent as the bearer token. Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

QUERIES = [
    "how do I renew a parking permit",
    "when is my bin collected",
    "how to get a library card",
    "appeal a parking fine",
    "reset my password",
    "pay property tax in instalments",
    "book a park shelter",
    "where do I take old paint and batteries",
    "monthly bus pass price",
    "request council meeting minutes",
    "connect to the VPN from home",
    "visitor permit for guests",
]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--top", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    token = os.environ.get("KBPG_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body_extra = {"top": args.top} if args.top else {}

    def run(count: int, offset: int) -> list[float]:
        timings = []
        with httpx.Client(base_url=args.url, headers=headers, timeout=60) as client:
            for i in range(count):
                query = QUERIES[(offset + i) % len(QUERIES)]
                started = time.perf_counter()
                response = client.post("/api/v1/kb/search", json={"query": query, **body_extra})
                elapsed = time.perf_counter() - started
                response.raise_for_status()
                timings.append(elapsed * 1000)
        return timings

    run(args.warmup, 0)
    per_client = max(1, args.requests // args.concurrency)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        batches = list(pool.map(lambda n: run(per_client, n), range(args.concurrency)))
    wall = time.perf_counter() - started
    latencies = [t for batch in batches for t in batch]
    print(
        f"{len(latencies)} requests, concurrency {args.concurrency}: "
        f"p50 {statistics.median(latencies):.1f} ms, p95 {percentile(latencies, 0.95):.1f} ms, "
        f"max {max(latencies):.1f} ms, {len(latencies) / wall:.0f} req/s"
    )


if __name__ == "__main__":
    main()
