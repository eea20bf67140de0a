"""The "Languages" table of docs/languages.md: kbpg's own evaluation (kbpg eval's code) on XQuAD in five
languages (not a test; prints a Markdown table, nDCG@10).

Per collection (../shared/ir/xquad-{de,es,ru,zh,en}): ingested with all-MiniLM-L6-v2 in
`english` (what kbpg did before languages), then the same knowledge base switched to its
language with kb.set_language; and ingested with multilingual-e5-small in its language.
`hybrid, vector off` is kb.search with vector_weight 0 (the English model switched off).

    python benchmarks/eval_languages.py                  # all five, ~30-60 min on 2 cores
    python benchmarks/eval_languages.py xquad-ru xquad-zh
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kbpg import evaluate as ev
from kbpg.config import Settings
from kbpg.models.embedders import get_embedder
from kbpg.store import db as kdb
from kbpg.store.embedded import EmbeddedServer

IR = Path(__file__).resolve().parent.parent.parent / "shared" / "ir"
LANGUAGES = {
    "xquad-de": "german",
    "xquad-es": "spanish",
    "xquad-ru": "russian",
    "xquad-zh": "cjk",
    "xquad-en": "english",
}
NDCG = "ndcg@10"
COLUMNS = [
    "MiniLM english: lexical",
    "MiniLM english: hybrid",
    "language: lexical",
    "MiniLM language: hybrid",
    "MiniLM language: hybrid, vector off",
    "e5 language: vector",
    "e5 language: hybrid",
]


def scores(collection: ev.Collection, prefix: str, off: bool = False) -> dict[str, float]:
    metrics, _, _ = ev.score_arms(collection, ("hybrid", "vector", "lexical"))
    out = {f"{prefix}: {arm}": m[NDCG] for arm, m in metrics.items()}
    if off:
        hybrid, _, _ = ev.score_arms(collection, ("hybrid",), options={"vector_weight": 0.0})
        out[f"{prefix}: hybrid, vector off"] = hybrid["hybrid"][NDCG]
    return out


def measure(admin: str, name: str) -> dict[str, float]:
    dataset = ev.load_beir(IR / name)
    language = LANGUAGES[name]
    settings = Settings.from_env()
    row: dict[str, float] = {}
    started = time.perf_counter()
    with ev.throwaway_database(admin) as url:
        collection = ev.ingest_collection(url, dataset, get_embedder(settings, "minilm"))
        row.update(scores(collection, "MiniLM english"))
        if language != "english":
            with kdb.connect(url) as conn:
                conn.execute("select kb.set_language(%s)", (language,))
                conn.commit()
        row.update(scores(collection, "MiniLM language", off=True))
    row["language: lexical"] = row["MiniLM language: lexical"]
    row["minilm_s"] = time.perf_counter() - started
    started = time.perf_counter()
    with ev.throwaway_database(admin, language=language) as url:
        collection = ev.ingest_collection(url, dataset, get_embedder(settings, "e5-multilingual"))
        row.update(scores(collection, "e5 language"))
    row["e5_s"] = time.perf_counter() - started
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("collections", nargs="*", default=list(LANGUAGES))
    parser.add_argument("--url", help="a server's maintenance URL (default: a throwaway one)")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON")
    args = parser.parse_args()
    server = None
    admin = args.url
    if admin is None:
        import tempfile

        home = Path(tempfile.mkdtemp(prefix="kbpg-eval-lang-", dir="/tmp"))
        home.chmod(0o755)
        server = EmbeddedServer(home, durable=False)
        server.start()
        admin = server.url("postgres")
    results = {}
    try:
        for name in args.collections:
            results[name] = measure(admin, name)
            print(f"{name} ({LANGUAGES[name]}): " + json.dumps(results[name]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
    finally:
        if server is not None:
            server.stop()
    print("| collection | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, row in results.items():
        cells = [f"{row[c]:.3f}" if c in row else "" for c in COLUMNS]
        print(f"| {name} (`{LANGUAGES[name]}`) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
