"""One corpus in one server and in a Citus cluster: the loads, the search variants, the comparison.

Used by tests/test_citus.py (the equivalence tests) and benchmarks/bench_citus.py (latencies,
commands per search, recall per shard count). A corpus is loaded by kbpg's own ingest (JSONL
records with their embeddings, or the sample Markdown files with the real model), so both
databases get the same chunk ids from their sequences; every variant is then a `kb.*` call run
on both, and its rows are compared id by id and score by score.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from kbpg.store import db as kdb
from tests.conftest import NPL_DIR as NPL

REPO = Path(__file__).resolve().parent.parent
DIM = 384


# -- corpora ----------------------------------------------------------------------------------


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    with path.open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return path


def npl_missing() -> str | None:
    """Why the NPL collection cannot be read (None when it can): the synthetic corpus draws
    its words and questions from it, the NPL corpus is it; never made-up words instead."""
    if (NPL / "corpus.jsonl").exists() and (NPL / "queries.jsonl").exists():
        return None
    return f"NPL collection not found at {NPL} (set KBPG_NPL_DIR, or place it in ../shared/ir/npl)"


def _require_npl() -> None:
    missing = npl_missing()
    if missing:
        raise FileNotFoundError(missing)


def _npl_words() -> tuple[list[str], np.ndarray[Any, Any], list[str]]:
    _require_npl()
    counts: Counter[str] = Counter()
    with (NPL / "corpus.jsonl").open() as f:
        for line in f:
            counts.update(json.loads(line)["text"].split())
    with (NPL / "queries.jsonl").open() as f:
        queries = [json.loads(line)["text"] for line in f]
    words = list(counts)
    freq = np.array([counts[w] for w in words], dtype=np.float64)
    return words, freq / freq.sum(), queries


@dataclass
class Corpus:
    """Records (JSONL with embeddings) or files, and the queries to run on them."""

    name: str
    paths: list[Path]
    queries: list[tuple[str, list[float]]]
    # filter values present in the corpus, for the filtered variants
    groups: list[str] = field(default_factory=list)
    category: str | None = None
    labels: list[str] = field(default_factory=list)
    recursive: bool = False


def synthetic_corpus(
    directory: Path, n_chunks: int = 40_000, n_queries: int = 40, seed: int = 7
) -> Corpus:
    """`n_chunks` one-chunk records: ~40 words drawn from NPL's unigram distribution, a code
    shared by a few records (entity edges for the graph arm), 384-d vectors around 200
    centroids; group g{i % 50} (2%: the vector arm's exact path), category cat{i % 10} (10%),
    labels l{i % 7}. Queries: NPL's questions, vectors near the centroids."""
    nrng = np.random.default_rng(seed)
    words, probs, npl_queries = _npl_words()
    centroids = nrng.normal(size=(200, DIM)).astype(np.float32)
    records = []
    for i in range(n_chunks):
        text_words = list(nrng.choice(words, size=int(nrng.integers(20, 60)), p=probs))
        text_words.insert(
            int(nrng.integers(0, len(text_words))), f"K{int(nrng.integers(0, n_chunks // 4))}Q"
        )
        vector = centroids[i % 200] + nrng.normal(scale=0.6, size=DIM).astype(np.float32)
        records.append(
            {
                "id": f"syn-{i}",
                "title": f"Record {i}",
                "text": " ".join(text_words),
                "groups": [f"g{i % 50}"],
                "category": f"cat{i % 10}",
                "labels": [f"l{i % 7}"],
                "embedding": [round(float(x), 6) for x in vector / np.linalg.norm(vector)],
            }
        )
    path = write_jsonl(directory / "synthetic.jsonl", records)
    queries = []
    for j in range(n_queries):
        q = centroids[(j * 37) % 200] + nrng.normal(scale=0.6, size=DIM).astype(np.float32)
        queries.append((npl_queries[j % len(npl_queries)], (q / np.linalg.norm(q)).tolist()))
    return Corpus("synthetic", [path], queries, ["g3"], "cat4", ["l2"])


def _window_pieces(text: str, embedder: Any) -> list[str]:
    """The text, or its words split in halves until every piece fits the model's window."""
    if len(embedder.tokenizer.encode(text).ids) <= embedder.max_tokens:
        return [text]
    words = text.split()
    half = len(words) // 2
    return _window_pieces(" ".join(words[:half]), embedder) + _window_pieces(
        " ".join(words[half:]), embedder
    )


def npl_corpus(directory: Path, embedder: Any) -> Corpus:
    """NPL's 11,429 abstracts as one-chunk records embedded once by `embedder` (the knowledge
    base's model; the few abstracts over its window split in halves), and its 93 questions
    embedded by the same model. The records are kept in the system's temp directory, named
    after the model and the corpus's size, and reused (embedding them takes minutes)."""
    _require_npl()
    corpus_file = NPL / "corpus.jsonl"
    cached = Path(tempfile.gettempdir()) / (
        f"kbpg-citus-npl-{embedder.model_name}-{corpus_file.stat().st_size}.jsonl"
    )
    questions = [json.loads(line) for line in (NPL / "queries.jsonl").open()]
    queries = [(q["text"], [float(x) for x in embedder.embed_query(q["text"])]) for q in questions]
    corpus = Corpus("npl", [cached], queries, ["g5"], "cat2", ["l1"])
    if cached.exists():
        return corpus
    pieces = []
    for i, line in enumerate(corpus_file.open()):
        doc = json.loads(line)
        for k, text in enumerate(_window_pieces(doc["text"], embedder)):
            pieces.append((f"npl-{doc['_id']}-{k}", text, i))
    vectors = embedder.embed_documents([text for _, text, _ in pieces])
    records = [
        {
            "id": ident,
            "text": text,
            "groups": [f"g{i % 20}"],
            "category": f"cat{i % 4}",
            "labels": [f"l{i % 3}"],
            "embedding": [float(x) for x in v],
        }
        for (ident, text, i), v in zip(pieces, vectors, strict=True)
    ]
    staging = write_jsonl(directory / "npl.jsonl", records)
    shutil.move(staging, cached)
    return corpus


def samples_corpus(embedder: Any) -> Corpus:
    """samples/kb (Markdown with links, sections, groups), ingested with the real model."""
    questions = [
        "how do I renew a parking permit",
        "when is bulky waste collected",
        "reset my password",
        "library opening hours",
        "council tax discount for single occupants",
        "report a pothole",
        "book a sports pitch in the park",
        "bus pass for older residents",
    ]
    queries = [(q, [float(x) for x in embedder.embed_query(q)]) for q in questions]
    return Corpus(
        "samples",
        [REPO / "samples" / "kb"],
        queries,
        ["residents"],
        "permits",
        ["waste"],
        recursive=True,
    )


def load(url: str, corpus: Corpus) -> Any:
    """Ingest the corpus through kbpg (KnowledgeBase + ingest_paths); the ingest summary."""
    from kbpg.app import KnowledgeBase
    from kbpg.ingest.run import ingest_paths

    with KnowledgeBase(url, pool_size=1, embedder_name="minilm") as kb:
        return ingest_paths(kb.db, kb.models, corpus.paths, recursive=corpus.recursive)


# -- search variants --------------------------------------------------------------------------

COLUMNS = (
    "chunk_id, document_id, rank, score, similarity, vector_rank, lexical_rank, graph_rank, "
    "fused_rank"
)


@dataclass(frozen=True)
class Variant:
    name: str
    sql: str
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def uses_vectors(self) -> bool:
        """Whether HNSW (approximate) takes part: an embedding or seeds from one."""
        return "%(e)s" in self.sql or "%(seeds)s" in self.sql


def variants(corpus: Corpus, *, graph: bool = True) -> list[Variant]:
    """Every way of searching kbpg offers, as calls with %(q)s (text), %(e)s (embedding),
    %(e2)s (a second embedding) and %(seeds)s (chunk ids); without the graph arm's two
    (`search graph`, `expand_graph`) unless `graph` (a corpus with edges)."""
    g = "array[" + ", ".join(f"'{x}'" for x in corpus.groups) + "]"
    labels = "array[" + ", ".join(f"'{x}'" for x in corpus.labels) + "]::text[]"
    category = f"'{corpus.category}'"
    search = f"select {COLUMNS} from kb.search(%(q)s, %(e)s::vector, match_count => 8"
    lexical = "select chunk_id, document_id, rank, score from kb.search_lexical(%(q)s, 32"
    vector = "select chunk_id, document_id, rank, score, similarity from kb.search_vector("
    out = [
        Variant("search hybrid", search + ")"),
        Variant("search text only", f"select {COLUMNS} from kb.search(%(q)s, null, 8)"),
        Variant("search vector only", search + ", use_lexical => false)"),
        Variant(
            "search graph",
            search + ", use_graph => true, graph_max_depth => 2, "
            "graph_max_returned => 5, graph_min_score => 0.3)",
        ),
        Variant("search groups", search + f", groups => {g})"),
        Variant("search category", search + f", category => {category})"),
        Variant("search extra embeddings", search + ", extra_embeddings => array[%(e2)s::vector])"),
        Variant("search rerank pool", search + ", rerank_pool => 24)"),
        Variant(
            "search weights no cap",
            search + ", rrf_k => 20, vector_weight => 0.5, "
            "lexical_weight => 2, max_per_doc => null, fetch_multiplier => 6)",
        ),
        Variant("search_vector", vector + "%(e)s::vector, 32)"),
        Variant(
            "search_vector extra",
            vector + "%(e)s::vector, 32, extra_embeddings => array[%(e2)s::vector])",
        ),
        Variant(
            "search_vector groups exact",
            vector + f"%(e)s::vector, 32, groups => {g})",
            (("kb.vector_exact_limit", "1000000000"),),
        ),
        Variant(
            "search_vector category hnsw",
            vector + f"%(e)s::vector, 32, category => {category})",
            (("kb.vector_exact_limit", "0"),),
        ),
        Variant("search_lexical", lexical + ")"),
        Variant("search_lexical groups", lexical + f", groups => {g})"),
        Variant("search_lexical category", lexical + f", category => {category})"),
        Variant(
            "search_lexical exhaustive",
            lexical + ")",
            (("kb.lexical_exhaustive_limit", "1000000000"),),
        ),
        Variant(
            "search_lexical excluded",
            "select chunk_id, document_id, rank, score from "
            "kb.search_lexical(%(q)s || ' -' || split_part(%(q)s, ' ', 1), 32)",
        ),
        Variant(
            "expand_graph",
            "select chunk_id, document_id, rank, score, depth, via_chunk_id "
            "from kb.expand_graph(%(seeds)s, 2, 20, 0.2)",
        ),
    ]
    if corpus.labels:
        out.append(Variant("search labels", search + f", labels => {labels})"))
    if not graph:
        out = [v for v in out if v.name not in GRAPH_VARIANTS]
    return out


GRAPH_VARIANTS = ("search graph", "expand_graph")


def parameters(corpus: Corpus, i: int) -> dict[str, Any]:
    text, embedding = corpus.queries[i]
    other = corpus.queries[(i + 1) % len(corpus.queries)][1]
    return {"q": text, "e": str(embedding), "e2": str(other), "seeds": []}


# With this the planner leaves HNSW aside (it serves plain index scans only) and the vector arm
# scans exactly, on one server and on every shard alike: HNSW is approximate, and one graph
# of every chunk and eight graphs of an eighth each need not miss the same neighbours.
EXACT_VECTORS = (("enable_indexscan", "off"),)


def run_variant(
    conn: psycopg.Connection[Any],
    variant: Variant,
    params: dict[str, Any],
    extra_settings: tuple[tuple[str, str], ...] = (),
) -> list[tuple[Any, ...]]:
    """The variant's rows, in one transaction (its settings SET LOCAL: on Citus passed on to
    the workers), rolled back."""
    try:
        settings = variant.settings + extra_settings
        if (
            settings
            and conn.execute(
                "select 1 from pg_catalog.pg_extension where extname = 'citus'"
            ).fetchone()
        ):
            conn.execute("set local citus.propagate_set_commands = local")
        for name, value in settings:
            conn.execute(
                sql.SQL("set local {} = {}").format(
                    sql.SQL(".").join(sql.Identifier(part) for part in name.split(".")),
                    sql.Literal(value),
                )
            )
        if "%(seeds)s" in variant.sql and not params["seeds"]:
            seeds = conn.execute(
                "select chunk_id from kb.search_vector(%(e)s::vector, 4) order by rank", params
            ).fetchall()
            params = {**params, "seeds": [r[0] for r in seeds]}
        return [tuple(r) for r in conn.execute(variant.sql, params).fetchall()]
    finally:
        conn.rollback()


@dataclass
class Difference:
    variant: str
    query: int
    single: list[tuple[Any, ...]]
    distributed: list[tuple[Any, ...]]

    def __str__(self) -> str:
        return (
            f"{self.variant} #{self.query} (overlap {overlap(self.single, self.distributed):.2f})"
            f":\n  single      {self.single[:5]}\n  distributed {self.distributed[:5]}"
        )


def same_rows(a: Sequence[tuple[Any, ...]], b: Sequence[tuple[Any, ...]]) -> bool:
    """Equal ids and ranks, and scores equal to 1e-12 (relative)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float) and isinstance(v, float):
                if not math.isclose(u, v, rel_tol=1e-12, abs_tol=1e-12):
                    return False
            elif u != v:
                return False
    return True


def overlap(a: Sequence[tuple[Any, ...]], b: Sequence[tuple[Any, ...]]) -> float:
    """The share of the chunk ids (first column) two calls returned that both returned: 1.0
    for the same ids in any order, 0.75 when a top 8 kept 6 of its chunks."""
    ids_a, ids_b = {r[0] for r in a}, {r[0] for r in b}
    return len(ids_a & ids_b) / max(len(ids_a), len(ids_b), 1)


@dataclass
class Comparison:
    checked: int = 0
    rows: int = 0
    differences: list[Difference] = field(default_factory=list)
    per_variant: Counter[str] = field(default_factory=Counter)
    # rows the graph arm ranked (kb.search's graph_rank) or walked to (kb.expand_graph)
    graph_rows: int = 0


def compare(
    single_url: str,
    distributed_url: str,
    corpus: Corpus,
    *,
    exact_vectors: bool = False,
    role: str | None = None,
    graph: bool = True,
    queries: int | None = None,
) -> Comparison:
    """Every variant on every query (or the first `queries`), on both databases
    (exact_vectors: without HNSW; role: the sessions SET ROLE to it first, as kbpg's sessions
    do for a principal; graph: with the graph arm's variants)."""
    result = Comparison()
    extra = EXACT_VECTORS if exact_vectors else ()
    with kdb.connect(single_url) as one, kdb.connect(distributed_url) as many:
        if role is not None:
            for conn in (one, many):
                conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
                conn.commit()
        for variant in variants(corpus, graph=graph):
            for i in range(len(corpus.queries) if queries is None else queries):
                params = parameters(corpus, i)
                a = run_variant(one, variant, params, extra)
                b = run_variant(many, variant, params, extra)
                result.checked += 1
                result.rows += len(a)
                result.per_variant[variant.name] += len(a)
                if variant.name == "expand_graph":
                    result.graph_rows += len(a)
                elif variant.sql.startswith(f"select {COLUMNS} "):
                    result.graph_rows += sum(1 for r in a if r[7] is not None)
                if not same_rows(a, b):
                    result.differences.append(Difference(variant.name, i, a, b))
    return result


# -- statistics and commands ------------------------------------------------------------------

STATISTICS = """
select (select chunk_count from kb.corpus_stats), (select total_tokens from kb.corpus_stats),
       (select count(*) from kb.lexeme_stats), (select coalesce(sum(doc_freq), 0) from kb.lexeme_stats),
       (select md5(string_agg(lexeme || ':' || doc_freq, ',' order by lexeme)) from kb.lexeme_stats)
"""
RECOUNTED = """
select (select count(*) from kb.chunks), (select coalesce(sum(token_count), 0) from kb.chunks),
       count(*), coalesce(sum(n), 0), md5(string_agg(l || ':' || n, ',' order by l))
  from (select l, count(*) as n from kb.chunks c, unnest(tsvector_to_array(c.tsv)) l group by l) x
"""


def statistics(url: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(the BM25 statistics kbpg keeps, the same counted from kb.chunks now)."""
    with kdb.connect(url) as conn:
        kept = conn.execute(STATISTICS).fetchone()
        counted = conn.execute(RECOUNTED).fetchone()
    assert kept is not None and counted is not None
    return tuple(kept), tuple(counted)


def commands(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> Counter[str]:
    """The commands the coordinator sent to the workers for one statement, in a transaction
    block (as kbpg's clients run it), by kind: citus.log_remote_commands."""
    sent: list[str] = []

    def notice(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith("issuing "):
            sent.append(message)

    conn.add_notice_handler(notice)
    try:
        conn.execute("set local citus.log_remote_commands = on")
        conn.execute("set local client_min_messages = log")
        conn.execute(sql, params).fetchall()
        conn.commit()  # COMMIT / PREPARE go out here
    finally:
        conn.rollback()
        conn.remove_notice_handler(notice)
    # by the first word: a BEGIN carries the SET LOCALs and the distributed transaction id
    kinds: Counter[str] = Counter(m.removeprefix("issuing ").split(" ", 1)[0].upper() for m in sent)
    kinds["all"] = len(sent)
    return kinds


def chunk_keys(url: str) -> dict[int, tuple[str, int]]:
    """chunk id -> (document source, ordinal): the same on both sides when the ids are."""
    with kdb.connect(url) as conn:
        rows = conn.execute(
            "select c.id, d.source, c.ordinal from kb.chunks c join kb.documents d"
            " on d.id = c.document_id"
        ).fetchall()
    return {int(i): (s, int(o)) for i, s, o in rows}


def exact_neighbours(url: str, embeddings: Sequence[list[float]], k: int) -> list[list[int]]:
    """Brute-force cosine top-k chunk ids (numpy over every stored vector)."""
    with kdb.connect(url) as conn:
        rows = conn.execute("select id, embedding from kb.chunks order by id").fetchall()
    ids = np.array([r[0] for r in rows])
    matrix = np.stack([np.asarray(r[1].to_numpy(), dtype=np.float32) for r in rows])
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    out = []
    for e in embeddings:
        q = np.asarray(e, dtype=np.float32)
        sims = matrix @ (q / np.linalg.norm(q))
        out.append(ids[np.argsort(-sims, kind="stable")[:k]].tolist())
    return out


def recall_at(url: str, corpus: Corpus, k: int = 32) -> float:
    """kb.search_vector's recall@k against an exact scan, over the corpus's queries."""
    truth = exact_neighbours(url, [e for _, e in corpus.queries], k)
    found = 0
    with kdb.connect(url) as conn:
        for (_, e), expected in zip(corpus.queries, truth, strict=True):
            rows = conn.execute(
                "select chunk_id from kb.search_vector(%s::vector, %s, min_similarity => -1)",
                (str(e), k),
            ).fetchall()
            conn.rollback()
            found += len({r[0] for r in rows} & set(expected))
    return found / (k * len(corpus.queries))


def timings(conn: psycopg.Connection[Any], call: Callable[[int], None], n: int) -> Iterator[float]:
    import time

    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        yield (time.perf_counter() - t0) * 1000
