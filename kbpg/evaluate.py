"""Retrieval evaluation on BEIR-layout collections: throwaway database, every arm, IR metrics."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kbpg.app import KnowledgeBase
from kbpg.config import DEFAULT_MAX_CHUNKS, Settings
from kbpg.errors import ConfigError, DatabaseUnavailable, InvalidInput, KbpgError, from_psycopg
from kbpg.search.request import check_options, sql_arguments
from kbpg.store import db as kdb
from kbpg.store import queries

ARMS = ("hybrid", "vector", "lexical", "graph", "rerank", "expand")
DEFAULT_ARMS = ("hybrid", "vector", "lexical")
# Arms that run a model stage around kb.search (the hybrid search plus that stage).
STAGE_ARMS = {"rerank": "rerank", "expand": "expand"}
DEFAULT_TOP_K = 10
DEFAULT_DEPTH = 100
HIT_K = DEFAULT_MAX_CHUNKS  # hit@8: does the API's default answer hold a relevant document?
DATABASE_PREFIX = "kbpg_eval_"
log = logging.getLogger("kbpg.evaluate")

if TYPE_CHECKING:
    from kbpg.models.embedders import Embedder

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Sequence[str]]
Progress = Callable[[str], None]


# -- BEIR reader ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusDoc:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Dataset:
    """A BEIR collection: corpus, queries and graded judgments (qrels) of one split."""

    name: str
    corpus: tuple[CorpusDoc, ...]
    queries: Mapping[str, str]
    qrels: Qrels

    @property
    def query_ids(self) -> list[str]:
        """The evaluated queries: those judged in qrels, in the order of queries.jsonl."""
        return [qid for qid in self.queries if qid in self.qrels]


def _jsonl(path: Path, required: Sequence[str]) -> Iterator[dict[str, str]]:
    if not path.is_file():
        raise InvalidInput(
            f"{path}: file not found",
            hint="a BEIR dataset directory holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv",
        )
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise InvalidInput(f"{path}:{number}: expected a JSON object")
            for key in required:
                if key not in record:
                    raise InvalidInput(f"{path}:{number}: missing field {key!r}")
            yield {key: "" if value is None else str(value) for key, value in record.items()}


def _read_qrels(path: Path) -> dict[str, dict[str, int]]:
    if not path.is_file():
        raise InvalidInput(
            f"{path}: file not found",
            hint="qrels/<split>.tsv: query-id, corpus-id, score, with a header",
        )
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as lines:
        header = lines.readline().rstrip("\n").split("\t")
        if len(header) != 3 or header[2].strip().lower() != "score":
            raise InvalidInput(f"{path}:1: expected the header query-id<TAB>corpus-id<TAB>score")
        for number, line in enumerate(lines, start=2):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise InvalidInput(
                    f"{path}:{number}: expected 3 tab-separated fields, got {len(fields)}"
                )
            qid, doc_id, score = (f.strip() for f in fields)
            try:
                grade = int(float(score))
            except ValueError:
                raise InvalidInput(f"{path}:{number}: score {score!r} is not a number") from None
            qrels.setdefault(qid, {})[doc_id] = grade
    return qrels


def load_beir(path: Path | str, split: str = "test") -> Dataset:
    """Read corpus.jsonl, queries.jsonl and qrels/<split>.tsv; errors name the file and line."""
    root = Path(path)
    if not root.is_dir():
        raise InvalidInput(f"{root}: not a directory", hint="pass a BEIR dataset directory")
    corpus: list[CorpusDoc] = []
    seen: set[str] = set()
    corpus_path = root / "corpus.jsonl"
    for record in _jsonl(corpus_path, ("_id", "text")):
        doc_id = record["_id"]
        if doc_id in seen:
            raise InvalidInput(f"{corpus_path}: duplicate _id {doc_id!r}")
        seen.add(doc_id)
        corpus.append(CorpusDoc(doc_id, record.get("title", ""), record["text"]))
    if not corpus:
        raise InvalidInput(f"{corpus_path}: no documents")
    queries = {r["_id"]: r["text"] for r in _jsonl(root / "queries.jsonl", ("_id", "text"))}
    qrels = _read_qrels(root / "qrels" / f"{split}.tsv")
    dataset = Dataset(root.resolve().name, tuple(corpus), queries, qrels)
    if not dataset.query_ids:
        raise InvalidInput(f"{root}: no query of queries.jsonl is judged in qrels/{split}.tsv")
    return dataset


# -- metrics (trec_eval conventions: relevant = grade >= 1, linear gains) ---------------------


@dataclass(frozen=True)
class Cutoffs:
    top_k: int = DEFAULT_TOP_K
    depth: int = DEFAULT_DEPTH
    hit_k: int = HIT_K

    @property
    def names(self) -> tuple[str, ...]:
        k, d = self.top_k, self.depth
        return (f"ndcg@{k}", f"recall@{d}", f"mrr@{k}", f"map@{d}", f"hit@{self.hit_k}")


def query_metrics(
    ranking: Sequence[str], judged: Mapping[str, int], cutoffs: Cutoffs
) -> list[float]:
    """nDCG@k, Recall@depth, MRR@k, MAP@depth, hit@h of one ranked list, as pytrec_eval does."""
    relevant = {doc for doc, grade in judged.items() if grade >= 1}
    k, depth = cutoffs.top_k, cutoffs.depth
    dcg = sum(
        judged.get(doc, 0) / math.log2(i + 2)
        for i, doc in enumerate(ranking[:k])
        if judged.get(doc, 0) > 0
    )
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    found = 0
    precision_sum = 0.0
    first: int | None = None
    for i, doc in enumerate(ranking[:depth], start=1):
        if doc in relevant:
            found += 1
            precision_sum += found / i
            if first is None:
                first = i
    n_rel = len(relevant)
    return [
        dcg / idcg if idcg > 0 else 0.0,
        found / n_rel if n_rel else 0.0,
        1.0 / first if first is not None and first <= k else 0.0,
        precision_sum / n_rel if n_rel else 0.0,
        1.0 if first is not None and first <= cutoffs.hit_k else 0.0,
    ]


def evaluate_run(
    qrels: Qrels, run: Run, query_ids: Iterable[str], cutoffs: Cutoffs = Cutoffs()
) -> dict[str, float]:
    """Mean of each metric over query_ids; a query missing from the run scores 0."""
    totals = [0.0] * len(cutoffs.names)
    count = 0
    for qid in query_ids:
        count += 1
        for i, value in enumerate(query_metrics(run.get(qid, ()), qrels.get(qid, {}), cutoffs)):
            totals[i] += value
    if count == 0:
        raise InvalidInput("no queries to evaluate")
    return {name: total / count for name, total in zip(cutoffs.names, totals, strict=True)}


def write_trec_run(path: Path, run: Run, tag: str) -> None:
    """TREC run file (qid Q0 doc rank score tag), scores strictly decreasing with the rank."""
    with path.open("w", encoding="utf-8") as out:
        for qid, ranking in run.items():
            for rank, doc in enumerate(ranking, start=1):
                out.write(f"{qid} Q0 {doc} {rank} {len(ranking) - rank + 1} {tag}\n")


def first_occurrences(ids: Iterable[str], limit: int) -> list[str]:
    """Distinct ids in order of first appearance, at most `limit` of them."""
    out: list[str] = []
    seen: set[str] = set()
    for item in ids:
        if item not in seen:
            seen.add(item)
            out.append(item)
            if len(out) == limit:
                break
    return out


# -- throwaway database -----------------------------------------------------------------------


def url_for_database(url: str, dbname: str) -> str:
    """The same server and credentials as `url`, another database."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + dbname))
    return make_conninfo(url, dbname=dbname)


@contextlib.contextmanager
def _maintenance(url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the server's `postgres` database, else to `url` itself."""
    try:
        conn = kdb.connect(url_for_database(url, "postgres"), autocommit=True)
    except DatabaseUnavailable:
        conn = kdb.connect(url, autocommit=True)
    with conn:
        yield conn


def drop_database(url: str, name: str) -> None:
    """Drop database `name` on url's server, closing its sessions first."""
    with _maintenance(url) as conn, kdb.translate_errors():
        conn.execute(queries.drop_database(name))


@contextlib.contextmanager
def throwaway_database(
    url: str, *, keep: bool = False, language: str | None = None
) -> Iterator[str]:
    """A new migrated `kbpg_eval_<random>` database on url's server (in `language`, default
    english), dropped on exit (also on errors, Ctrl-C and SIGTERM-as-SystemExit) unless `keep`."""
    name = DATABASE_PREFIX + secrets.token_hex(6)
    with _maintenance(url) as conn:
        try:
            conn.execute(queries.create_database(name))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise KbpgError(
                f"cannot create the evaluation database: {exc.diag.message_primary}",
                hint="kbpg eval needs a role with CREATEDB on the server",
            ) from exc
        except psycopg.Error as exc:
            raise from_psycopg(exc) from exc
    try:
        eval_url = url_for_database(url, name)
        kdb.upgrade(eval_url)
        if language is not None:
            from kbpg.store.language import change_language

            with kdb.connect(eval_url) as conn, kdb.translate_errors():
                change_language(conn, language)
                conn.commit()
        yield eval_url
    finally:
        if not keep:
            drop_database(url, name)


# -- running the arms -------------------------------------------------------------------------


SearchOptions = Mapping[str, Any]  # kb.search options by SearchRequest field name


def _arm_call(
    arm: str, text: str, embedding: Any, match_count: int, options: SearchOptions
) -> tuple[sql.Composed, dict[str, Any]]:
    if arm == "vector":
        args: dict[str, Any] = {"query_embedding": embedding, "match_count": match_count}
        args.update(sql_arguments({"min_similarity": options.get("min_similarity")}))
        return queries.call_ranked_documents("search_vector", list(args)), args
    if arm == "lexical":
        args = {"query_text": text, "match_count": match_count}
        return queries.call_ranked_documents("search_lexical", list(args)), args
    args = sql_arguments({**options, "top": match_count, "graph": arm == "graph"})
    args.update(query_text=text, query_embedding=embedding)
    return queries.call_ranked_documents("search", list(args)), args


def run_arm(
    conn: psycopg.Connection[Any],
    arm: str,
    texts: Mapping[str, str],
    embeddings: Mapping[str, Any],
    sources: Mapping[int, str],
    cutoffs: Cutoffs,
    options: SearchOptions,
) -> dict[str, list[str]]:
    """Each query's ranked document sources for one arm.

    The first top_k ranks are what a caller asking for top_k chunks gets; ranks beyond come
    from a second call at `depth`. Fusion (pool = match_count x fetch_multiplier) and the
    per-document cap depend on match_count, so one deep call would not show the user's top-k.
    Chunks map to their documents, first occurrence wins.
    """
    runs: dict[str, list[str]] = {}
    with kdb.translate_errors():
        for qid, text in texts.items():
            chunk_docs: list[int] = []
            for match_count in (cutoffs.top_k, cutoffs.depth):
                query, args = _arm_call(arm, text, embeddings[qid], match_count, options)
                chunk_docs += [row[0] for row in conn.execute(query, args)]
            runs[qid] = first_occurrences((sources[d] for d in chunk_docs), cutoffs.depth)
    return runs


def check_stage_arms(arms: Sequence[str], settings: Settings, contextual: bool = False) -> None:
    """ConfigError now, not after the ingest, when a stage arm's model is not configured."""
    from kbpg.models import make_chat, make_reranker

    if "rerank" in arms and make_reranker(settings.models) is None:
        raise ConfigError(
            "the rerank arm needs a reranker",
            hint="set KBPG_RERANK to api, tei or llm (with KBPG_RERANK_URL / KBPG_RERANK_MODEL "
            "or KBPG_CHAT_*)",
        )
    if "expand" in arms or contextual:
        make_chat(settings.models)


def run_stage_arm(
    kb: KnowledgeBase,
    arm: str,
    texts: Mapping[str, str],
    cutoffs: Cutoffs,
    options: SearchOptions,
) -> dict[str, list[str]]:
    """`rerank` / `expand`: the hybrid search with that model stage, through the same
    pipeline as `kbpg search` (a stage that fails falls back to the plain order there too,
    so the report counts how many queries it failed on)."""
    from kbpg.search.request import SearchRequest
    from kbpg.search.run import run_search

    stage = STAGE_ARMS[arm]
    runs: dict[str, list[str]] = {}
    failed = 0
    for qid, text in texts.items():
        found: list[str] = []
        for match_count in (cutoffs.top_k, cutoffs.depth):
            # this arm's stage alone, whatever the settings turn on by default
            only = {name: name == stage for name in STAGE_ARMS.values()}
            request = SearchRequest(text, **{**options, **only, "top": match_count})
            result = run_search(kb.db, kb.models, request)
            failed += any(s.status == "failed" for s in result.stages)
            found += [chunk.source for chunk in result.chunks]
        runs[qid] = first_occurrences(found, cutoffs.depth)
    if failed:
        log.warning("kbpg eval: the %s stage failed on %d calls (plain order used)", arm, failed)
    return runs


# -- the whole evaluation ---------------------------------------------------------------------


@dataclass(frozen=True)
class EvalReport:
    dataset: str
    queries: int
    metrics: dict[str, dict[str, float]]
    runs: dict[str, dict[str, list[str]]] = field(repr=False)
    timings: dict[str, float]
    database: str | None = None
    language: str = "english"
    model: str | None = None
    # what the reader should know: a model that does not know the language
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "queries": self.queries,
            "language": self.language,
            "model": self.model,
            "arms": self.metrics,
            "timings": self.timings,
            "notes": list(self.notes),
        }


def parse_arms(spec: str | None) -> tuple[str, ...] | None:
    """`hybrid,vector` -> ('hybrid', 'vector'); None -> None (the default set)."""
    if spec is None:
        return None
    arms = tuple(dict.fromkeys(a.strip() for a in spec.split(",") if a.strip()))
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise InvalidInput(
            f"unknown arm(s): {', '.join(unknown) or spec!r}", hint=f"choose from {', '.join(ARMS)}"
        )
    return arms


@dataclass(frozen=True)
class Collection:
    """A dataset ingested into an evaluation database, its queries embedded: ready to query."""

    url: str
    dataset: Dataset
    embeddings: Mapping[str, Any] = field(repr=False)
    sources: Mapping[int, str] = field(repr=False)
    has_edges: bool
    timings: Mapping[str, float]
    settings: Settings | None = field(default=None, repr=False)
    embedder: Embedder | None = field(default=None, repr=False)

    @property
    def queries(self) -> dict[str, str]:
        return {qid: self.dataset.queries[qid] for qid in self.dataset.query_ids}


def ingest_collection(
    eval_url: str,
    dataset: Dataset,
    embedder: Embedder,
    progress: Progress | None = None,
    settings: Settings | None = None,
    contextual: bool = False,
) -> Collection:
    """Ingest the corpus (document source = corpus `_id`) and embed the judged queries;
    `contextual`: with chunk contexts from the chat model (every arm then sees them)."""
    from kbpg.ingest.batching import batch_documents_for
    from kbpg.ingest.run import Document, ingest_documents
    from kbpg.models.embedders import embed_queries

    if progress:
        progress(f"ingesting {len(dataset.corpus)} documents into {database_name(eval_url)}")
    clock = time.perf_counter()
    documents = [Document(source=d.id, title=d.title, text=d.text) for d in dataset.corpus]
    with KnowledgeBase(eval_url, embedder, settings=settings, pool_size=1) as kb:
        ingest_documents(
            kb.db,
            kb.models,
            documents,
            progress=(
                (lambda p: progress(f"ingested {p.documents} documents, {p.chunks} chunks"))
                if progress
                else None
            ),
            contextual=contextual,
            batch_documents=batch_documents_for(embedder),
        )
        ingest_s = time.perf_counter() - clock
        with kb.session() as conn:
            sources = {row[0]: row[1] for row in conn.execute(queries.ALL_DOCUMENTS)}
            edges = conn.execute(queries.HAS_EDGES).fetchone()

    clock = time.perf_counter()
    query_ids = dataset.query_ids
    # one batched call; MiniLM and the OpenAI provider embed queries like documents, e5 with
    # its `query: ` prefix
    vectors = embed_queries(embedder, [dataset.queries[qid] for qid in query_ids])
    embed_s = time.perf_counter() - clock
    return Collection(
        url=eval_url,
        dataset=dataset,
        embeddings=dict(zip(query_ids, vectors, strict=True)),
        sources=sources,
        has_edges=bool(edges and edges[0]),
        timings={"ingest_s": ingest_s, "embed_queries_s": embed_s},
        settings=settings,
        embedder=embedder,
    )


def score_arms(
    collection: Collection,
    arms: Sequence[str] | None = None,
    cutoffs: Cutoffs = Cutoffs(),
    options: SearchOptions | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[str]]], dict[str, float]]:
    """Metrics, runs and search timings per arm; None = hybrid, vector, lexical (+graph
    when the collection has edges). `options` are kb.search options (SearchRequest names)."""
    checked = check_options(options or {})
    chosen = tuple(arms) if arms else DEFAULT_ARMS + (("graph",) if collection.has_edges else ())
    texts = collection.queries
    metrics: dict[str, dict[str, float]] = {}
    runs: dict[str, dict[str, list[str]]] = {}
    timings: dict[str, float] = {}
    with KnowledgeBase(
        collection.url, collection.embedder, settings=collection.settings, pool_size=1
    ) as kb:
        for arm in chosen:
            if progress:
                progress(f"running {len(texts)} queries through the {arm} arm")
            clock = time.perf_counter()
            if arm in STAGE_ARMS:
                runs[arm] = run_stage_arm(kb, arm, texts, cutoffs, checked)
            else:
                with kb.session() as conn:
                    runs[arm] = run_arm(
                        conn, arm, texts, collection.embeddings, collection.sources, cutoffs,
                        checked,
                    )  # fmt: skip
            timings[f"search_{arm}_s"] = time.perf_counter() - clock
            metrics[arm] = evaluate_run(collection.dataset.qrels, runs[arm], texts, cutoffs)
    return metrics, runs, timings


def evaluate(
    url: str,
    dataset: Dataset,
    embedder: Embedder | None,
    *,
    arms: Sequence[str] | None = None,
    cutoffs: Cutoffs = Cutoffs(),
    options: SearchOptions | None = None,
    keep: bool = False,
    progress: Progress | None = None,
    settings: Settings | None = None,
    contextual: bool = False,
    language: str | None = None,
) -> EvalReport:
    """`kbpg eval`: ingest `dataset` into a throwaway database on url's server (in `language`,
    default english), run the arms, score them, drop the database unless `keep`. `embedder`
    None: the language's default model, what a user of that language gets.
    `contextual`: ingest with chunk contexts (compare with a run without to see what they do)."""
    from kbpg.models.embedders import default_embedder, get_embedder, model_mismatch
    from kbpg.store.language import current_language, is_english

    check_options(options or {})  # before the corpus is ingested, not after
    check_stage_arms(arms or (), settings or Settings.from_env(), contextual)
    started = time.perf_counter()
    with throwaway_database(url, keep=keep, language=language) as eval_url:
        if progress:
            progress(f"evaluation database {database_name(eval_url)}")
        with kdb.connect(eval_url) as conn:
            chosen = current_language(conn)
            english = is_english(conn, chosen)
        if embedder is None:
            embedder = get_embedder(settings or Settings.from_env(), default_embedder(english))
        mismatch = model_mismatch(chosen, english, embedder.model_name)
        if mismatch and progress:
            progress(f"warning: {mismatch}")
        collection = ingest_collection(
            eval_url, dataset, embedder, progress, settings, contextual=contextual
        )
        metrics, runs, search_timings = score_arms(collection, arms, cutoffs, options, progress)
    timings = {**collection.timings, **search_timings, "total_s": time.perf_counter() - started}
    return EvalReport(
        dataset=dataset.name,
        queries=len(dataset.query_ids),
        metrics=metrics,
        runs=runs,
        timings={k: round(v, 3) for k, v in timings.items()},
        database=database_name(eval_url) if keep else None,
        language=chosen,
        model=embedder.model_name,
        notes=_notes(metrics, mismatch),
    )


def _notes(metrics: Mapping[str, Mapping[str, float]], mismatch: str | None) -> tuple[str, ...]:
    """The report's warnings: a model that does not know the language, and what it costs."""
    notes = [mismatch] if mismatch else []
    hybrid, lexical = metrics.get("hybrid"), metrics.get("lexical")
    if hybrid and lexical:
        ndcg = next(iter(hybrid))
        if hybrid[ndcg] < lexical[ndcg] - 0.01:
            notes.append(
                f"hybrid {ndcg} {hybrid[ndcg]:.4f} is below the lexical arm's "
                f"{lexical[ndcg]:.4f}: the vector arm adds noise"
                + (" (see above)" if mismatch else "")
            )
    return tuple(notes)


def database_name(url: str) -> str:
    """The database name of a URL or key=value DSN."""
    return str(conninfo_to_dict(url).get("dbname", ""))


def format_table(report: EvalReport) -> str:
    """The report as a plain-text table, one row per arm."""
    names = next(iter(report.metrics.values())).keys() if report.metrics else ()
    width = max([len(a) for a in report.metrics] + [3])
    lines = [
        f"{report.dataset}: {report.queries} queries, language {report.language}"
        + (f", model {report.model}" if report.model else ""),
        "  ".join([f"{'arm':<{width}}", *(f"{n:>10}" for n in names)]),
    ]
    for arm, values in report.metrics.items():
        lines.append("  ".join([f"{arm:<{width}}", *(f"{values[n]:>10.4f}" for n in names)]))
    lines.append("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in report.timings.items()))
    lines += [f"warning: {note}" for note in report.notes]
    return "\n".join(lines)
