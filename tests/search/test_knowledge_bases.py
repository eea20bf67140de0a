"""Two knowledge bases in one database, end to end (issue 39): `default` in English with
MiniLM (384-d) and `ru` in Russian with a 128-d model served over HTTP, each made, filled and
searched from the CLI, psql, Python and HTTP; one's writes leave the other's BM25 scores
bit-identical, and dropping one leaves the other's searches identical."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from kbpg.app import KnowledgeBase
from kbpg.models.embedders import Embedder
from kbpg.search import output
from kbpg.store.embedded import _binaries_dir
from tests.embedding_server import EmbeddingServer
from tests.helpers import invoke_kbpg, run_kbpg
from tests.http_server import running_server

ENGLISH = {
    "permits.md": "# Parking permits\n\nResidents apply for a parking permit at the council office.\n",
    "library.md": "# Library cards\n\nA library card is free; the library opens at nine.\n",
    "waste.md": "# Waste collection\n\nBulky waste is collected once a month on request.\n",
}
RUSSIAN = {
    "parking.md": "# Парковка\n\nРазрешение на парковку выдаёт городская служба парковки.\n",
    "library.md": "# Библиотека\n\nЧитательский билет в библиотеке бесплатный.\n",
    "taxes.md": "# Налоги\n\nНалог на имущество платят до первого декабря.\n",
}
LEXICAL = (
    "select s.source, l.score from kb.search_lexical(%s, 10) l"
    " join kb.chunks c on c.id = l.chunk_id join kb.documents s on s.id = c.document_id"
    " order by l.rank"
)


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def ok(env: dict[str, str], *args: str) -> str:
    done = invoke_kbpg(*args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def sources(env: dict[str, str], query: str, *args: str) -> list[str]:
    found = json.loads(ok(env, "search", query, "--json", *args))
    return [Path(c["source"]).name for c in found["chunks"]]


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """The CLI's KBPG_* settings for KnowledgeBase() in this process."""
    for name, value in env.items():
        if name.startswith("KBPG_"):
            monkeypatch.setenv(name, value)


def psql_lines(db_url: str, query: str, embedding: str, script: str) -> list[str]:
    """`script` run by psql as a user types it, with :'t' the query text and :'q' its
    embedding (`kbpg embed`); its output lines."""
    done = subprocess.run(
        [str(_binaries_dir() / "psql"), db_url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
         "-v", f"q={embedding}", "-v", f"t={query}", "-f", "-"],
        input=script, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def lexical(db_url: str, kb: str, query: str) -> list[tuple[str, float]]:
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "select set_config('kbpg.kb_id', kb.knowledge_base_id(%s)::text, false)", (kb,)
        )
        return [(Path(s).name, score) for s, score in conn.execute(LEXICAL, (query,)).fetchall()]


@pytest.fixture
def served(embedder: Embedder) -> Iterator[EmbeddingServer]:
    with EmbeddingServer(embedder, model="minilm-128", dimensions=128) as server:  # type: ignore[arg-type]
        yield server


@pytest.fixture
def two(cli_env: dict[str, str], served: EmbeddingServer, tmp_path: Path) -> dict[str, str]:
    env = {**cli_env, "KBPG_OPENAI_BASE_URL": served.base_url, "KBPG_OPENAI_MODEL": "minilm-128"}
    ok(env, "ingest", str(write(tmp_path / "en", ENGLISH)))
    ok(env, "kb", "create", "ru", "--language", "russian", "--embedder", "openai")
    ok(env, "ingest", "--kb", "ru", str(write(tmp_path / "ru", RUSSIAN)))
    return env


def test_each_is_searched_in_its_own_language_model_and_statistics(
    two: dict[str, str], db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = two
    listed = json.loads(ok(env, "kb", "list", "--json"))
    assert [
        (k["name"], k["language"], k["model"], k["dimension"], k["documents"]) for k in listed
    ] == [
        ("default", "english", "all-MiniLM-L6-v2", 384, 3),
        ("ru", "russian", "minilm-128", 128, 3),
    ]
    # the CLI: each finds its own documents, stemmed in its own language ("парковку" and
    # "парковки" are one lexeme in Russian, two in English)
    assert sources(env, "разрешения на парковку", "--kb", "ru")[0] == "parking.md"
    assert set(sources(env, "разрешения на парковку", "--kb", "ru")) <= set(RUSSIAN)
    assert sources(env, "parking permit")[0] == "permits.md"
    assert set(sources(env, "parking permit")) <= set(ENGLISH)
    assert sources({**env, "KBPG_KB": "ru"}, "налог на имущество")[0] == "taxes.md"
    assert [s for s, _ in lexical(db_url, "ru", "парковки")] == ["parking.md"]
    assert lexical(db_url, "default", "парковки") == []

    # Python, psql and HTTP give the CLI's ranking
    query = "бесплатный читательский билет"
    cli = json.loads(ok(env, "search", query, "--kb", "ru", "--json", "--top", "3"))
    use_env(monkeypatch, env)
    with KnowledgeBase(kb="ru", pool_size=1) as kb:
        assert json.loads(output.render_json(kb.search(query, top=3))) == cli
    literal = ok(env, "embed", "--kb", "ru", query).strip()
    assert literal.count(",") == 127
    ranked = psql_lines(
        db_url,
        query,
        literal,
        "select kb.use_knowledge_base('ru') \\g /dev/null\n"
        "select chunk_id from kb.search(:'t', :'q'::vector, 3) order by rank;\n",
    )
    assert [int(i) for i in ranked] == [c["chunk_id"] for c in cli["chunks"]]
    with running_server({**env, "KBPG_KB": "ru"}, tmp_path / "serve.log") as api:
        served_chunks = api.post("/api/v1/kb/search", json={"query": query, "top": 3}).json()[
            "chunks"
        ]
        assert [(c["chunk_id"], c["score"]) for c in served_chunks] == [
            (c["chunk_id"], c["score"]) for c in cli["chunks"]
        ]


def test_writing_or_dropping_one_leaves_the_other_identical(
    two: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    env = two
    before = lexical(db_url, "default", "library card parking")
    searched = ok(env, "search", "library card", "--json")
    ok(
        env,
        "ingest",
        "--kb",
        "ru",
        str(write(tmp_path / "more", {"card.md": "# Card\n\nlibrary card parking card\n"})),
    )
    assert lexical(db_url, "default", "library card parking") == before  # bit-identical scores
    assert [s for s, _ in lexical(db_url, "ru", "library card")] == ["card.md"]

    refused = run_kbpg("kb", "drop", "ru", env=env, input="n\n")
    assert refused.returncode == 1 and "Aborted" in refused.stderr
    assert "dropped knowledge base ru (4 documents, 4 chunks)" in ok(
        env, "kb", "drop", "ru", "--yes"
    )
    assert lexical(db_url, "default", "library card parking") == before
    assert ok(env, "search", "library card", "--json") == searched
    gone = invoke_kbpg("search", "x", "--kb", "ru", env=env)
    assert gone.returncode == 1 and 'no knowledge base "ru"' in gone.stderr
    with psycopg.connect(db_url) as conn:
        assert conn.execute("select count(*) from kb_data.chunks where kb_id <> 1").fetchone() == (
            0,
        )
        assert conn.execute(
            "select indexname from pg_indexes where indexname like 'chunks_embedding_hnsw%'"
        ).fetchall() == [("chunks_embedding_hnsw",)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("kb", "create", "Bad Name"), 'invalid knowledge base name "Bad Name"'),
        (("kb", "create", "default"), 'knowledge base "default" exists already'),
        (("kb", "drop", "default", "--yes"), "default cannot be dropped"),
        (("kb", "rename", "default", "other"), "default keeps its name"),
        (("kb", "drop", "missing", "--yes"), 'no knowledge base "missing"'),
        (("stats", "--kb", "missing"), 'no knowledge base "missing"'),
    ],
)
def test_refusals_say_why(cli_env: dict[str, str], args: tuple[str, ...], message: str) -> None:
    done = invoke_kbpg(*args, env=cli_env)
    assert (done.returncode, done.stdout) == (1, "")
    assert message in done.stderr and "Hint:" in done.stderr


def test_a_renamed_knowledge_base_keeps_its_documents(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    ok(cli_env, "kb", "create", "hr")
    ok(cli_env, "ingest", "--kb", "hr", str(write(tmp_path / "hr", ENGLISH)))
    assert "renamed knowledge base hr to people" in ok(cli_env, "kb", "rename", "hr", "people")
    assert sources(cli_env, "parking permit", "--kb", "people")[0] == "permits.md"
    assert sources(cli_env, "parking permit") == []


def test_who_reads_a_knowledge_base_is_set_from_the_cli(cli_env: dict[str, str]) -> None:
    ok(cli_env, "kb", "create", "open", "--readers", "all")
    ok(cli_env, "kb", "create", "closed")
    readers = {k["name"]: k["readers"] for k in json.loads(ok(cli_env, "kb", "list", "--json"))}
    assert readers == {"default": "all", "open": "all", "closed": "granted"}
    assert "knowledge base open: readers granted" in ok(cli_env, "kb", "readers", "open", "granted")
    listed = ok(cli_env, "kb", "list").splitlines()
    assert listed[0].split()[-1] == "readers"
    assert [line.split()[0] + " " + line.split()[-1] for line in listed[1:]] == [
        "default all",
        "open granted",
        "closed granted",
    ]
    wrong = invoke_kbpg("kb", "readers", "open", "everyone", env=cli_env)
    assert wrong.returncode == 2 and "'everyone' is not one of 'granted', 'all'" in wrong.stderr


MORE = {
    "permits.md": "# Permit renewal\n\nRenew a parking permit online a month before it ends.\n",
    "bikes.md": "# Bicycle parking\n\nBicycle racks stand beside every library.\n",
}


def test_a_search_across_knowledge_bases_fuses_and_labels(
    two: dict[str, str], db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--kb default --kb more` (both MiniLM): one ranking, each chunk labelled, the same from
    the CLI, Python and psql; with `ru` (a 128-d model) it is refused."""
    env = two
    ok(env, "kb", "create", "more")
    ok(env, "ingest", "--kb", "more", str(write(tmp_path / "more", MORE)))
    query = "renew a parking permit"
    found = json.loads(ok(env, "search", query, "--kb", "default", "--kb", "more", "--json"))
    chunks = found["chunks"]
    assert {c["knowledge_base"] for c in chunks} == {"default", "more"}
    assert [(c["knowledge_base"], Path(c["source"]).name) for c in chunks[:2]] == [
        ("more", "permits.md"),
        ("default", "permits.md"),
    ]
    # the same source in two knowledge bases: two documents, labelled
    assert [(s["knowledge_base"], Path(s["source"]).name) for s in found["sources"][:2]] == [
        ("more", "permits.md"),
        ("default", "permits.md"),
    ]
    assert "permits.md (more) [1]" in found["context"]
    table = ok(env, "search", query, "--kb", "default", "--kb", "more")
    assert table.splitlines()[0].startswith("chunks[") and "{knowledge_base,document," in table

    use_env(monkeypatch, env)
    with KnowledgeBase(pool_size=1) as kb:
        python = kb.search(query, knowledge_bases=["default", "more"])
    assert json.loads(output.render_json(python)) == found
    literal = ok(env, "embed", query).strip()
    assert psql_lines(
        db_url,
        query,
        literal,
        "select knowledge_base || ' ' || chunk_id from kb.search_knowledge_bases("
        "'{default,more}', :'t', :'q'::vector) order by rank;\n",
    ) == [f"{c['knowledge_base']} {c['chunk_id']}" for c in chunks]

    refused = invoke_kbpg("search", query, "--kb", "default", "--kb", "ru", env=env)
    assert refused.returncode == 1
    assert (
        "knowledge bases default and ru hold different embedding spaces "
        "(all-MiniLM-L6-v2 384-d, minilm-128 128-d)" in refused.stderr
    )
    graph = invoke_kbpg("search", query, "--kb", "default", "--kb", "more", "--graph", env=env)
    assert graph.returncode == 1
    assert "a search across knowledge bases does not take graph" in graph.stderr
