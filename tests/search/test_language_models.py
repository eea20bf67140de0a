"""The knowledge base's model: recorded by the first ingest (the language's default unless one is
named), used by every command after it, refused when another is named; an English-only model on
another language is left out of kb.search's default fusion (issues 41 and 42)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from click.testing import CliRunner

from kbpg.cli import main
from kbpg.config import Settings
from kbpg.models.embedders import (
    E5_MODEL_NAME,
    MINILM_MODEL_NAME,
    get_embedder,
    to_pgvector_literal,
)
from kbpg.store import db as kdb

RUSSIAN = {
    "parking.md": "# Парковка\n\nЖители продлевают разрешение на парковку онлайн до окончания "
    "срока. Продление стоит 40 евро в год.\n",
    "library.md": "# Библиотека\n\nЧитательский билет выдают бесплатно в любой городской "
    "библиотеке по паспорту.\n",
    "waste.md": "# Мусор\n\nКрупногабаритный мусор вывозят по заявке раз в месяц; заявку "
    "подают на сайте города.\n",
}
ENGLISH = {
    "parking.md": "# Parking\n\nResidents renew a parking permit online before it expires. "
    "Renewal costs 40 euros a year.\n",
    "library.md": "# Library\n\nA library card is free at any city library; bring an ID.\n",
}


def invoke(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def write_docs(folder: Path, docs: dict[str, str]) -> Path:
    folder.mkdir()
    for name, text in docs.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def space(url: str) -> tuple[str, list[str] | None] | None:
    with kdb.connect(url) as conn:
        row = conn.execute("select model, languages from kb.embedding_space").fetchone()
    return None if row is None else (row[0], row[1])


def test_a_russian_knowledge_base_gets_the_multilingual_model(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    assert invoke(cli_env, "db", "upgrade", "--language", "russian")[0] == 0
    code, _, err = invoke(cli_env, "ingest", str(write_docs(tmp_path / "docs", RUSSIAN)))
    assert code == 0, err
    assert "knows English only" not in err
    assert space(db_url) == (E5_MODEL_NAME, None)
    # searched with it, no KBPG_EMBEDDER: the vector arm is in the fusion, no notice
    code, out, err = invoke(cli_env, "search", "как продлить парковку", "--json")
    assert code == 0, err
    chunks = json.loads(out)["chunks"]
    assert chunks[0]["source"].endswith("parking.md")
    assert chunks[0]["vector_rank"] == 1 and chunks[0]["lexical_rank"] == 1
    assert "left out" not in err


def test_an_english_only_model_on_russian_is_left_out_of_the_fusion(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    assert invoke(cli_env, "db", "upgrade", "--language", "russian")[0] == 0
    docs = write_docs(tmp_path / "docs", RUSSIAN)
    code, _, err = invoke(cli_env, "ingest", str(docs), "--embedder", "minilm")
    assert code == 0, err
    assert "all-MiniLM-L6-v2 knows English only: its vector arm is left out" in err
    assert space(db_url) == (MINILM_MODEL_NAME, ["english"])

    # in SQL: with the default weight the fused order is the lexical order, and one notice
    minilm = get_embedder(Settings.from_env(), "minilm")
    query = "заявка на вывоз мусора"
    vector = to_pgvector_literal(minilm.embed_query(query))
    notices: list[str] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        rows = conn.execute(
            "select chunk_id, vector_rank, lexical_rank, score"
            " from kb.search(%s, %s::vector, match_count => 3)",
            (query, vector),
        ).fetchall()
        weighted = conn.execute(
            "select chunk_id from kb.search(%s, %s::vector, match_count => 3, vector_weight => 1)",
            (query, vector),
        ).fetchall()
        assert conn.execute("select vector_weight from kb.model_defaults()").fetchone() == (0.0,)
    assert notices == [
        "kbpg: all-MiniLM-L6-v2 does not know the knowledge base's language (russian): its "
        "vector arm is left out of the fusion"
    ]
    lexical = [r for r in rows if r[2] is not None]
    assert [r[2] for r in lexical] == list(range(1, len(lexical) + 1))
    assert rows[: len(lexical)] == lexical  # lexical hits first, in their order
    assert lexical[0][3] == 1 / 61  # the lexical arm's contribution alone
    assert len(weighted) == 3

    # the CLI says it once, and --vector-weight brings the arm back without a word
    code, _, err = invoke(cli_env, "search", query, "--json")
    assert code == 0
    assert err.count("left out of the fusion") == 1
    code, _, err = invoke(cli_env, "search", query, "--json", "--vector-weight", "1")
    assert code == 0 and "left out" not in err


def test_commands_after_reembed_need_no_environment(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    docs = write_docs(tmp_path / "docs", ENGLISH)
    assert invoke(cli_env, "ingest", str(docs))[0] == 0
    assert space(db_url) == (MINILM_MODEL_NAME, ["english"])
    code, _, err = invoke(cli_env, "reembed", "--embedder", "multilingual-e5-small")
    assert code == 0, err
    assert "reembed: embedding every chunk with multilingual-e5-small" in err
    assert "reembed: 0 documents, 2 chunks" in err  # progress while it embeds
    assert space(db_url) == (E5_MODEL_NAME, None)
    # search, ingest, embed: the recorded model, no KBPG_EMBEDDER
    code, out, err = invoke(cli_env, "search", "renew parking permit", "--json")
    assert code == 0, err
    assert json.loads(out)["chunks"][0]["vector_rank"] == 1
    (docs / "waste.md").write_text("# Waste\n\nBulky waste is collected once a month.\n")
    code, _, err = invoke(cli_env, "ingest", str(docs))
    assert code == 0, err
    code, out, _ = invoke(cli_env, "embed", "renew parking permit")
    assert code == 0 and out.count(",") == 383
    # another model named is refused, with the value that is accepted
    code, out, err = invoke(cli_env, "search", "renew parking permit", "--embedder", "minilm")
    assert (code, out) == (1, "")
    assert "holds multilingual-e5-small vectors" in err
    assert "--embedder e5-multilingual" in err
    code, _, err = invoke({**cli_env, "KBPG_EMBEDDER": "minilm"}, "ingest", str(docs))
    assert code == 1 and "embedding space mismatch" in err
