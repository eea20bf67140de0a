"""Wide embedding spaces (3,072-d, 4,096-d) through ingest and hybrid search, precomputed JSONL
embeddings, the deferred HNSW build and `kbpg index`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kbpg.app import KnowledgeBase
from kbpg.ingest.run import ingest_paths
from kbpg.models import embedders as embedding
from kbpg.models.embedders import Embedder
from kbpg.store import db as kdb
from kbpg.store import indexing
from tests.embedding_server import EmbeddingServer
from tests.helpers import run_kbpg
from tests.sql.test_layouts import executed_plans

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples" / "kb"
QUERIES = ["how do I renew a parking permit", "when is the bulky waste collected"]


class WideEmbedder:
    """MiniLM's vectors mapped into `dimension` dimensions by a fixed matrix with orthonormal
    columns: every cosine similarity is MiniLM's own, so search results must be too."""

    def __init__(self, base: Embedder, dimension: int) -> None:
        self.base = base
        rng = np.random.default_rng(dimension)
        q, _ = np.linalg.qr(rng.normal(size=(dimension, base.dimension)))
        self.basis = q.astype(np.float32)  # dimension x 384, orthonormal columns

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray[Any, Any]:
        return self.base.embed_documents(texts) @ self.basis.T


def rows(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with kdb.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def search_sources(env: dict[str, str], query: str, *extra: str) -> list[tuple[str, str]]:
    result = run_kbpg("search", query, "--json", "--top", "5", *extra, env=env)
    assert result.returncode == 0, result.stderr
    return [
        (c["source"].rsplit("/samples/", 1)[-1], c["section"])
        for c in json.loads(result.stdout)["chunks"]
    ]


@pytest.mark.parametrize(("dimension", "layout"), [(3072, "halfvec"), (4096, "binary")])
def test_wide_space_through_ingest_and_hybrid_search(
    dimension: int,
    layout: str,
    embedder: Embedder,
    cli_env: dict[str, str],
    db_url: str,
    new_database: Callable[..., str],
) -> None:
    # the reference: the same files in a 384-d MiniLM knowledge base
    reference_env = dict(cli_env, KBPG_DATABASE_URL=new_database())
    assert run_kbpg("ingest", str(SAMPLES), "-r", env=reference_env).returncode == 0
    expected = {q: search_sources(reference_env, q) for q in QUERIES}

    wide = WideEmbedder(embedder, dimension)
    with EmbeddingServer(wide, model=f"wide-{dimension}") as server:  # type: ignore[arg-type]
        env = dict(
            cli_env,
            KBPG_OPENAI_BASE_URL=server.base_url,
            KBPG_OPENAI_MODEL=f"wide-{dimension}",
            KBPG_EMBEDDER="openai",
        )
        result = run_kbpg("ingest", str(SAMPLES), "-r", env=env)
        assert result.returncode == 0, result.stderr
        assert rows(db_url, "select model, dimension, layout from kb.embedding_space") == [
            (f"wide-{dimension}", dimension, layout)
        ]
        stats = run_kbpg("stats", env=env)
        assert f"wide-{dimension} ({dimension}-d, {layout} index)" in stats.stdout
        for query in QUERIES:
            assert search_sources(env, query) == expected[query], query
        query_vector = wide.embed_documents([QUERIES[0]])[0]

    # kb.search's vector arm scans the layout's index (the planner has no other way left)
    with kdb.connect(db_url) as conn:
        conn.execute("select set_config('enable_seqscan', 'off', true)")
        plans = executed_plans(
            conn,
            "select * from kb.search(%s, %s::vector)",
            (QUERIES[0], "[" + ",".join(map(str, query_vector.tolist())) + "]"),
        )
    assert "Index Scan using chunks_embedding_hnsw" in plans
    assert ("halfvec(3072)" if layout == "halfvec" else "bit(4096)") in plans


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_with_precomputed_embeddings(
    tmp_path: Path, cli_env: dict[str, str], db_url: str, embedder: Embedder
) -> None:
    texts = {
        "permit": "Residents renew their parking permit online before it expires.",
        "bins": "Bulky waste is collected on the first Monday of the month.",
        "library": "The central library opens at nine on weekdays.",
    }
    vectors = embedder.embed_documents(list(texts.values()))
    good = [
        {"id": k, "title": k.title(), "text": t, "embedding": v.tolist()}
        for (k, t), v in zip(texts.items(), vectors, strict=True)
    ]
    bad = [
        {"id": "short", "text": "three numbers", "embedding": [0.1, 0.2, 0.3]},
        {"id": "words", "text": "not numbers", "embedding": ["a", "b"]},
        {"id": "nan", "text": "not finite", "embedding": [float("nan")] * 384},
    ]
    path = jsonl(tmp_path / "embedded.jsonl", [*good, *bad])
    result = run_kbpg("ingest", str(path), "--json", env=cli_env)
    assert result.returncode == 1
    assert "added 3, updated 0, unchanged 0, removed 0, skipped 0, failed 3" in result.stderr
    reasons = {
        f["where"].split(":")[-1]: f["reason"] for f in json.loads(result.stdout)["failures"]
    }
    # every failure names PATH:LINE (the wrong size named the record's id before: issue 25)
    assert reasons == {
        "4": "`embedding` has 3 dimensions; this knowledge base holds 384-d vectors "
        "(all-MiniLM-L6-v2)",
        "5": "`embedding` must be a non-empty list of numbers",
        "6": "`embedding` holds NaN or infinity",
    }
    # one chunk a record, holding exactly the given vector
    stored = rows(
        db_url,
        "select d.source, c.content, c.embedding::text from kb.chunks c"
        " join kb.documents d on d.id = c.document_id order by d.source",
    )
    assert [(s, c) for s, c, _ in stored] == sorted((k, t) for k, t in texts.items())
    for source, _, literal in stored:
        given = np.array(json.loads(literal))
        assert np.allclose(given, vectors[list(texts).index(source)], atol=1e-6)
    top = json.loads(run_kbpg("search", "renew my parking permit", "--json", env=cli_env).stdout)
    assert top["chunks"][0]["source"] == "permit"
    # a new vector for the same text is a change; the same file again is not
    good[0]["embedding"] = vectors[1].tolist()
    jsonl(path, good)
    again = run_kbpg("ingest", str(path), env=cli_env)
    assert "added 0, updated 1, unchanged 2" in again.stderr


def test_a_load_of_embedded_records_never_loads_the_model(
    tmp_path: Path, db_url: str, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedding, "_cache", {})  # as in a process that has not loaded MiniLM
    text = "Bulky waste is collected on the first Monday of the month."
    record = {"id": "bins", "text": text, "embedding": embedder.embed_query(text).tolist()}
    path = jsonl(tmp_path / "embedded.jsonl", [record])
    with KnowledgeBase(db_url, pool_size=1, embedder_name="minilm") as kb:
        summary = ingest_paths(kb.db, kb.models, [path])
        assert (summary.added, summary.chunks, summary.failed) == (1, 1, 0)
        model = embedding.get_embedder(kb.settings, "minilm")
        assert "session" not in vars(model) and "tokenizer" not in vars(model)
        assert kb.embedder is model and "session" in vars(model)  # a search loads it
        hits = kb.search("when are bulky items collected", top=1)
        assert [h.source for h in hits.chunks] == ["bins"]


def test_first_load_builds_the_index_after_the_rows(
    tmp_path: Path, cli_env: dict[str, str], db_url: str, embedder: Embedder
) -> None:
    rng = np.random.default_rng(1)
    records = [
        {"id": f"r{i}", "text": f"record {i}", "embedding": v.tolist()}
        for i, v in enumerate(rng.normal(size=(3000, 384)).astype(np.float32))
    ]
    path = jsonl(tmp_path / "bulk.jsonl", records)
    result = run_kbpg("ingest", str(path), env=cli_env)
    assert result.returncode == 0, result.stderr
    # built once, after the load: the index is newer than every chunk row's transaction
    ((indexed, layout),) = rows(
        db_url,
        "select to_regclass('kb_data.chunks_embedding_hnsw') is not null, layout from kb.embedding_space",
    )
    assert indexed and layout == "halfvec"
    (n,) = rows(db_url, "select count(*) from kb.chunks")[0]
    assert n == 3000
    # an index that is missing (an interrupted load) is rebuilt by the next ingest
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("drop index kb_data.chunks_embedding_hnsw")
    again = run_kbpg("ingest", str(path), env=cli_env)
    assert again.returncode == 0 and "unchanged 3000" in again.stderr
    assert rows(db_url, "select to_regclass('kb_data.chunks_embedding_hnsw') is not null") == [
        (True,)
    ]


def test_defer_index_only_for_a_load_that_dwarfs_the_knowledge_base(
    db_url: str,
) -> None:
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("select kb.set_embedding_space('m', 3)")
        conn.execute(
            "insert into kb.documents (source, content_hash) values ('d', 'h');"
            "insert into kb.chunks (document_id, ordinal, content, embedding)"
            " select (select id from kb.documents), g, 'c', '[1,2,3]' from generate_series(0, 99) g"
        )
        assert not indexing.defer_index(conn, conn.transaction, 50)
        assert not indexing.defer_index(conn, conn.transaction, None)
        assert indexing.index_present(conn)
        assert indexing.defer_index(conn, conn.transaction, 500)
        assert not indexing.index_present(conn)
        assert indexing.ensure_index(conn, db_url)
        assert indexing.index_present(conn)
        assert not indexing.ensure_index(conn, db_url)


def test_index_build_progress_from_a_second_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexing, "POLL_S", 0.05)
    rng = np.random.default_rng(2)
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("select kb.set_embedding_space('m', 256, 'vector')")
        conn.execute("insert into kb.documents (source, content_hash) values ('d', 'h')")
        with (
            conn.cursor() as cur,
            cur.copy(
                "copy kb_data.chunks (document_id, ordinal, content, embedding) from stdin"
            ) as copy,
        ):
            for i, v in enumerate(rng.normal(size=(6000, 256))):
                copy.write_row((1, i, "c", "[" + ",".join(map(str, v)) + "]"))
        events: list[indexing.IndexProgress] = []
        layout, seconds = indexing.set_layout(conn, db_url, "halfvec", events.append)
        assert layout == "halfvec" and seconds > 0
        assert rows(db_url, "select layout from kb.embedding_space") == [("halfvec",)]
    assert events, "no progress seen during the build"
    assert all(e.layout == "halfvec" and e.tuples_total == 6000 for e in events)
    assert any("loading tuples" in e.phase for e in events)
    assert "building the halfvec index" in events[-1].describe()
    done = [e.tuples_done for e in events]
    assert done == sorted(done)


def test_cli_index_changes_the_layout(tmp_path: Path, cli_env: dict[str, str], db_url: str) -> None:
    (tmp_path / "a.md").write_text("# Permits\n\nRenew your parking permit online.\n")
    assert run_kbpg("ingest", str(tmp_path / "a.md"), env=cli_env).returncode == 0
    result = run_kbpg("index", "--layout", "binary", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert "built the binary index in" in result.stderr and result.stdout == ""
    assert "(384-d, binary index)" in run_kbpg("stats", env=cli_env).stdout
    hits = json.loads(run_kbpg("search", "renew permit", "--json", env=cli_env).stdout)
    assert hits["chunks"][0]["source"].endswith("a.md")
    rebuilt = run_kbpg("index", env=cli_env)  # no --layout: rebuild the current one
    assert rebuilt.returncode == 0 and "built the binary index" in rebuilt.stderr
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("update kb.embedding_space set dimension = 3000")  # a wide space's limits
    refused = run_kbpg("index", "--layout", "vector", env=cli_env)
    assert refused.returncode == 1
    assert "Error: the vector layout indexes at most 2,000 dimensions, not 3000" in refused.stderr
    assert "Hint: use halfvec (up to 4,000 dimensions) or binary" in refused.stderr
    bad = run_kbpg("index", "--layout", "pq", env=cli_env)
    assert bad.returncode == 2
