"""kbpg eval: BEIR reader, metrics cross-checked against pytrec_eval, the command end to end."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytrec_eval
from click.testing import CliRunner

from kbpg import evaluate as ev
from kbpg.cli import main
from kbpg.errors import InvalidInput

# -- metrics vs pytrec_eval on the same run files ---------------------------------------------


def _pytrec_means(qrels: ev.Qrels, run_path: Path, cutoffs: ev.Cutoffs) -> dict[str, float]:
    """The same five metrics by pytrec_eval, from a TREC run file, over every judged query."""
    with run_path.open() as f:
        run = pytrec_eval.parse_run(f)
    k, depth, hit = cutoffs.top_k, cutoffs.depth, cutoffs.hit_k
    plain = {q: dict(j) for q, j in qrels.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(
        plain, {f"ndcg_cut.{k}", f"recall.{depth}", f"map_cut.{depth}", f"success.{hit}"}
    )
    # MRR@k is trec_eval's recip_rank on the run cut at k (scores decrease with the rank)
    cut = {q: dict(sorted(d.items(), key=lambda x: -x[1])[:k]) for q, d in run.items()}
    mrr = pytrec_eval.RelevanceEvaluator(plain, {"recip_rank"}).evaluate(cut)
    per_query = evaluator.evaluate(run)
    keys = [f"ndcg_cut_{k}", f"recall_{depth}", "recip_rank", f"map_cut_{depth}", f"success_{hit}"]
    n = len(qrels)  # pytrec_eval leaves out queries absent from the run; they score 0
    means = {}
    for name, key in zip(cutoffs.names, keys, strict=True):
        source = mrr if key == "recip_rank" else per_query
        means[name] = sum(values[key] for values in source.values()) / n
    return means


def _random_case(seed: int) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(300)]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, list[str]] = {}
    for q in range(40):
        qid = f"q{q}"
        judged = rng.sample(docs, rng.randint(1, 25))
        qrels[qid] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
        if q % 13 == 5:
            continue  # no run at all: every metric 0
        pool = judged + rng.sample(docs, 120)
        rng.shuffle(pool)
        run[qid] = ev.first_occurrences(pool, rng.choice([0, 3, 9, 50, 100, 150]))
    return qrels, run


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    "cutoffs", [ev.Cutoffs(), ev.Cutoffs(top_k=5, depth=20, hit_k=3)], ids=["default", "small"]
)
def test_metrics_match_pytrec_eval(tmp_path: Path, seed: int, cutoffs: ev.Cutoffs) -> None:
    qrels, run = _random_case(seed)
    run_path = tmp_path / "arm.run"
    ev.write_trec_run(run_path, run, tag="test")
    ours = ev.evaluate_run(qrels, run, qrels, cutoffs)
    theirs = _pytrec_means(qrels, run_path, cutoffs)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name] == pytest.approx(theirs[name], abs=1e-6), name


def test_graded_qrels_by_hand() -> None:
    qrels = {"q": {"a": 2, "b": 1, "c": 0, "x": 3}}
    run = {"q": ["c", "a", "z", "b"]}  # x (grade 3) never retrieved
    m = ev.evaluate_run(qrels, run, ["q"], ev.Cutoffs(top_k=10, depth=100, hit_k=1))
    dcg = 2 / 1.584962500721156 + 1 / 2.321928094887362
    idcg = 3 + 2 / 1.584962500721156 + 1 / 2.0
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    assert m["recall@100"] == pytest.approx(2 / 3)  # grade 0 is not relevant
    assert m["mrr@10"] == pytest.approx(1 / 2)
    assert m["map@100"] == pytest.approx((1 / 2 + 2 / 4) / 3)
    assert m["hit@1"] == 0.0


def test_first_occurrence_wins() -> None:
    assert ev.first_occurrences(["a", "b", "a", "c", "b", "d"], 3) == ["a", "b", "c"]


# -- BEIR reader -------------------------------------------------------------------------------


def write_beir(
    root: Path,
    corpus: list[dict[str, Any]],
    queries: list[dict[str, Any]],
    qrels: list[tuple[str, str, int]],
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir(exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in qrels]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_reader_graded_and_unjudged(tmp_path: Path) -> None:
    root = write_beir(
        tmp_path / "mini",
        [{"_id": "d1", "title": "T", "text": "x"}, {"_id": 2, "text": "y"}],
        [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": "b"}, {"_id": "q3", "text": "c"}],
        [("q1", "d1", 2), ("q1", "2", 0), ("q3", "d1", 1), ("q9", "d1", 1)],
    )
    data = ev.load_beir(root)
    assert data.name == "mini"
    assert [d.id for d in data.corpus] == ["d1", "2"]
    assert data.corpus[1].title == ""
    assert data.qrels["q1"] == {"d1": 2, "2": 0}
    assert data.query_ids == ["q1", "q3"]  # q2 unjudged, q9 not a query


BROKEN: list[tuple[str, str]] = [
    ("corpus.jsonl", "missing"),
    ("queries.jsonl", "missing"),
    ("qrels/test.tsv", "missing"),
    ("corpus.jsonl", '{"_id": "d1", "text": "x"}\n{"_id": "d2", "text": \n'),
    ("corpus.jsonl", '{"_id": "d1"}\n'),
    ("corpus.jsonl", '{"_id": "d1", "text": "x"}\n{"_id": "d1", "text": "y"}\n'),
    ("corpus.jsonl", "[1, 2]\n"),
    ("corpus.jsonl", ""),
    ("queries.jsonl", '{"text": "no id"}\n'),
    ("qrels/test.tsv", "q1\td1\t1\n"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\n"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\thigh\n"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq7\td1\t1\n"),
]
EXPECTED = [
    "corpus.jsonl: file not found",
    "queries.jsonl: file not found",
    "test.tsv: file not found",
    "corpus.jsonl:2: not valid JSON",
    "corpus.jsonl:1: missing field 'text'",
    "duplicate _id 'd1'",
    "corpus.jsonl:1: expected a JSON object",
    "corpus.jsonl: no documents",
    "queries.jsonl:1: missing field '_id'",
    "test.tsv:1: expected the header",
    "test.tsv:2: expected 3 tab-separated fields",
    "test.tsv:2: score 'high' is not a number",
    "no query of queries.jsonl is judged",
]


@pytest.mark.parametrize(("case", "expected"), list(zip(BROKEN, EXPECTED, strict=True)))
def test_reader_errors(tmp_path: Path, case: tuple[str, str], expected: str) -> None:
    root = write_beir(
        tmp_path / "ds",
        [{"_id": "d1", "text": "x"}],
        [{"_id": "q1", "text": "a"}],
        [("q1", "d1", 1)],
    )
    name, content = case
    if content == "missing":
        (root / name).unlink()
    else:
        (root / name).write_text(content)
    with pytest.raises(InvalidInput, match=re.escape(expected)):
        ev.load_beir(root)


def test_reader_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a directory"):
        ev.load_beir(tmp_path / "nope")


def test_parse_arms() -> None:
    assert ev.parse_arms(None) is None
    assert ev.parse_arms("lexical, hybrid,lexical") == ("lexical", "hybrid")
    with pytest.raises(InvalidInput, match="bm25"):
        ev.parse_arms("hybrid,bm25")


def test_url_for_database() -> None:
    assert (
        ev.url_for_database("postgresql://u@h:5/kb?host=/s", "x") == "postgresql://u@h:5/x?host=/s"
    )
    assert "dbname=x" in ev.url_for_database("host=/tmp dbname=kb user=u", "x")


def test_cli_reports_broken_dataset(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "nope"), "--json"])
    assert result.exit_code == 1
    assert "Error:" in result.stderr and "not a directory" in result.stderr
    assert result.stdout == ""


# -- end to end on a tiny hand-built collection ------------------------------------------------

TINY_CORPUS = [
    ("bees", "Honey bees", "Honey bees collect nectar from flowers and store honey in the hive."),
    ("volcano", "Volcanoes", "A volcano erupts lava, ash and gas when magma reaches the surface."),
    ("tides", "Ocean tides", "Tides rise and fall twice a day, pulled by the gravity of the moon."),
    ("bread", "Baking bread", "Knead the dough, let the yeast rise, then bake the bread loaf."),
    ("chess", "Chess openings", "The Sicilian defence is a chess opening answering king pawn."),
    ("rust", "Iron rust", "Iron rusts when oxygen and water oxidise its surface into iron oxide."),
    ("comet", "Comets", "A comet is an icy body whose tail points away from the sun."),
    ("violin", "Violins", "A violin has four strings tuned in fifths and is played with a bow."),
]
TINY_QUERIES = [
    ("q1", "how do bees make honey"),
    ("q2", "what happens when a volcano erupts"),
    ("q3", "why does the moon cause tides"),
    ("q4", "chess opening against king pawn"),
]
TINY_QRELS = [("q1", "bees", 2), ("q2", "volcano", 1), ("q3", "tides", 1), ("q4", "chess", 1)]
TINY_QRELS += [("q3", "comet", 0)]


@pytest.fixture
def tiny_dataset(tmp_path: Path) -> Path:
    return write_beir(
        tmp_path / "tiny",
        [{"_id": s, "title": t, "text": x} for s, t, x in TINY_CORPUS],
        [{"_id": q, "text": t} for q, t in TINY_QUERIES],
        TINY_QRELS,
    )


def _databases(url: str, prefix: str) -> set[str]:
    with psycopg.connect(url) as c:
        rows = c.execute("select datname from pg_database where datname like %s", (prefix + "%",))
        return {r[0] for r in rows}


def test_eval_json_end_to_end(
    tiny_dataset: Path, cli_env: dict[str, str], tmp_path: Path, db_url: str
) -> None:
    runs_dir = tmp_path / "runs"
    args = ["eval", str(tiny_dataset), "--json", "--save-runs", str(runs_dir)]
    result = CliRunner().invoke(main, args, env=cli_env)
    assert result.exit_code == 0, result.stderr + result.stdout
    report = json.loads(result.stdout)
    assert set(report) == {"dataset", "queries", "language", "model", "arms", "timings", "notes"}
    assert (report["language"], report["model"], report["notes"]) == (
        "english",
        "all-MiniLM-L6-v2",
        [],
    )
    assert report["dataset"] == "tiny"
    assert report["queries"] == 4
    assert set(report["arms"]) >= {"hybrid", "vector", "lexical"}
    for values in report["arms"].values():
        assert list(values) == ["ndcg@10", "recall@100", "mrr@10", "map@100", "hit@8"]
    # every query's answer is obvious: every arm finds it first
    for arm in ("hybrid", "vector", "lexical"):
        assert report["arms"][arm]["mrr@10"] == 1.0, arm
        assert report["arms"][arm]["hit@8"] == 1.0, arm
    # the reported numbers are pytrec_eval's on the run files the command wrote
    qrels: dict[str, dict[str, int]] = {}
    for q, d, s in TINY_QRELS:
        qrels.setdefault(q, {})[d] = s
    for arm, values in report["arms"].items():
        theirs = _pytrec_means(qrels, runs_dir / f"{arm}.run", ev.Cutoffs())
        assert values == pytest.approx(theirs, abs=1e-6), arm
    # the throwaway database is gone and the user's database was not touched
    name = re.search(r"kbpg_eval_[0-9a-f]+", result.stderr)
    assert name is not None, result.stderr
    assert _databases(db_url, name.group(0)) == set()
    with psycopg.connect(db_url) as c:
        assert c.execute("select count(*) from kb.documents").fetchone() == (0,)


def test_eval_keep_and_table(tiny_dataset: Path, cli_env: dict[str, str], db_url: str) -> None:
    result = CliRunner().invoke(main, ["eval", str(tiny_dataset), "--keep"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    kept = re.search(r"kept evaluation database (kbpg_eval_[0-9a-f]+)", result.stderr)
    assert kept is not None, result.stderr
    try:
        assert _databases(db_url, kept.group(1)) == {kept.group(1)}
    finally:
        ev.drop_database(db_url, kept.group(1))
    lines = result.stdout.splitlines()
    assert lines[0] == "tiny: 4 queries, language english, model all-MiniLM-L6-v2"
    assert lines[1].split() == ["arm", "ndcg@10", "recall@100", "mrr@10", "map@100", "hit@8"]
    assert [line.split()[0] for line in lines[2:5]] == ["hybrid", "vector", "lexical"]


def test_eval_drops_database_on_interrupt(tiny_dataset: Path, db_url: str) -> None:
    """Ctrl-C (KeyboardInterrupt) after ingest still drops the throwaway database."""
    from kbpg.config import Settings
    from kbpg.models.embedders import get_embedder

    inner = get_embedder(Settings.from_env())
    messages: list[str] = []

    class Interrupting:
        calls = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def embed_documents(self, texts: list[str]) -> Any:
            Interrupting.calls += 1
            if any(t == TINY_QUERIES[0][1] for t in texts):
                raise KeyboardInterrupt
            return inner.embed_documents(texts)

        def embed_queries(self, texts: list[str]) -> Any:  # MiniLM embeds queries in batches
            return self.embed_documents(texts)

    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(db_url, ev.load_beir(tiny_dataset), Interrupting(), progress=messages.append)
    assert Interrupting.calls >= 2  # ingest ran before the interrupt
    name = re.search(r"kbpg_eval_[0-9a-f]+", messages[0])
    assert name is not None
    assert _databases(db_url, name.group(0)) == set()


def test_eval_in_another_language_says_the_model_does_not_know_it(
    tiny_dataset: Path, cli_env: dict[str, str], db_url: str
) -> None:
    args = ["eval", str(tiny_dataset), "--language", "german", "--arms", "lexical"]
    # what a German user gets by default: the multilingual model, nothing to warn about
    result = CliRunner().invoke(main, args, env=cli_env)
    assert result.exit_code == 0, result.stderr + result.stdout
    assert result.stdout.startswith("tiny: 4 queries, language german, model multilingual-e5")
    assert "warning" not in result.stdout + result.stderr
    # MiniLM named: English only, said so
    result = CliRunner().invoke(main, [*args, "--embedder", "minilm"], env=cli_env)
    assert result.exit_code == 0, result.stderr + result.stdout
    assert result.stdout.startswith("tiny: 4 queries, language german, model all-MiniLM-L6-v2")
    assert "warning: the knowledge base's language is german, but all-MiniLM-L6-v2" in (
        result.stdout
    )
    bad = CliRunner().invoke(main, [*args[:2], "--language", "klingon"], env=cli_env)
    assert bad.exit_code == 1
    assert "unknown language klingon" in bad.stderr
