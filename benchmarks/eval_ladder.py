"""Recall ladder: one ingest of a BEIR dataset, hybrid metrics for a ladder of kb.search options.

    python benchmarks/eval_ladder.py ../shared/ir/npl

Each rung is what `kbpg eval DATASET --arms hybrid --<option> <value>` reports; the script
only saves re-ingesting the corpus for every rung. Not a test: it prints numbers.
"""

from __future__ import annotations

import sys
import time

from kbpg import evaluate as ev
from kbpg.config import Settings
from kbpg.models.embedders import get_embedder
from kbpg.store.db import resolve_url

LADDER: list[tuple[str, ev.SearchOptions]] = [
    ("defaults (pool x4, cap 3, k 60, w 1/1)", {}),
    ("fetch_multiplier 1", {"fetch_multiplier": 1}),
    ("fetch_multiplier 2", {"fetch_multiplier": 2}),
    ("fetch_multiplier 8", {"fetch_multiplier": 8}),
    ("fetch_multiplier 16", {"fetch_multiplier": 16}),
    ("max_per_doc 1", {"max_per_doc": 1}),
    ("rrf_k 10", {"rrf_k": 10}),
    ("rrf_k 120", {"rrf_k": 120}),
    ("vector_weight 0.5", {"vector_weight": 0.5}),
    ("vector_weight 2", {"vector_weight": 2.0}),
    ("lexical_weight 0.5", {"lexical_weight": 0.5}),
    ("lexical_weight 2", {"lexical_weight": 2.0}),
    ("min_similarity 0", {"min_similarity": 0.0}),
]


def main(path: str) -> None:
    settings = Settings.from_env()
    dataset = ev.load_beir(path)
    embedder = get_embedder(settings)
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    with ev.throwaway_database(resolve_url(settings)) as url:
        collection = ev.ingest_collection(url, dataset, embedder, log)
        print(
            f"{dataset.name}: {len(dataset.query_ids)} queries, ingest "
            f"{collection.timings['ingest_s']:.0f} s"
        )
        names = ev.Cutoffs().names
        print(f"{'kb.search options':<40}" + "".join(f"{n:>11}" for n in names) + "  search s")
        metrics, _, _ = ev.score_arms(collection, ("vector", "lexical"))
        for arm, values in metrics.items():
            print(f"{arm + ' arm alone':<40}" + "".join(f"{values[n]:>11.4f}" for n in names))
        for label, options in LADDER:
            clock = time.perf_counter()
            metrics, _, _ = ev.score_arms(collection, ("hybrid",), options=options)
            elapsed = time.perf_counter() - clock
            values = metrics["hybrid"]
            print(
                f"{label:<40}" + "".join(f"{values[n]:>11.4f}" for n in names) + f"{elapsed:>10.1f}"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/ir/npl")
