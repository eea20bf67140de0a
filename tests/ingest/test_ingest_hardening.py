"""Ingest survives any file: bad records and files fail alone, reads are bounded, names print
safely. Real files in tmp dirs, the real MiniLM tokenizer; database tests use real PostgreSQL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kbpg.app import KnowledgeBase
from kbpg.errors import InvalidInput
from kbpg.ingest.chunking import Section, chunk_sections
from kbpg.ingest.document import Document, LoadFailure
from kbpg.ingest.limits import MAX_METADATA_BYTES
from kbpg.ingest.loaders import iter_file
from kbpg.ingest.run import ingest_paths
from kbpg.ingest.sources import discover, iter_documents, parse_size, printable
from kbpg.models.embedders import Embedder
from tests.helpers import KBPG, run_kbpg
from tests.ingest.test_ingest import kb as kb  # the fixture
from tests.ingest.test_ingest import rows
from tests.ingest.test_ingest_loaders import long_text

DEEP_DIVS = 5000


def deep_html(depth: int = DEEP_DIVS) -> str:
    return (
        "<html><head><title>Deep</title></head><body>"
        + "<div>" * depth
        + "<p>Treasure at the bottom of the nesting.</p>"
        + "</div>" * depth
        + "</body></html>"
    )


def jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    return path


# JSON text as a producer would write it: `\u0000` and `\ud800` are escapes in the file.
BAD_RECORDS = [
    json.dumps({"id": "good-1", "text": "First good record about parking."}),
    '{"id": "nul-category", "text": "x", "category": "a\\u0000b"}',
    '{"id": "nul-group", "text": "x", "groups": ["staff\\u0000"]}',
    '{"id": "nul-metadata", "text": "Metadata record.", "metadata": {"k\\u0000": 1}}',
    '{"id": "nul-metadata-value", "text": "Metadata value record.", "metadata": {"note": "a\\u0000b"}}',
    '{"id": "surrogate-text", "text": "broken \\ud800 text about bins"}',
    '{"id": "surrogate-group", "text": "x", "groups": ["\\udc80"]}',
    '{"id": "deep", "text": "x", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"id": "nan", "text": "x", "metadata": {"score": NaN}}',
    json.dumps({"id": "good-2", "text": "Second good record about libraries."}),
]


def test_jsonl_bad_records_fail_alone_with_path_and_line(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "records.jsonl", BAD_RECORDS)
    items = list(iter_file(path))
    docs = {d.source: d for d in items if isinstance(d, Document)}
    failures = {f.where: f.reason for f in items if isinstance(f, LoadFailure)}
    assert sorted(docs) == [
        "good-1",
        "good-2",
        "nul-metadata-value",
        "surrogate-text",
    ]
    assert failures == {
        f"{path}:2": "`category` 'a\\x00b' contains a NUL character",
        f"{path}:3": "`groups` value 'staff\\x00' contains a NUL character",
        f"{path}:4": "metadata key 'k\\x00' contains a NUL character",
        f"{path}:7": "`groups` value '\\udc80' contains a lone surrogate (not UTF-8)",
        f"{path}:8": "invalid JSON: nested too deeply",
        f"{path}:9": "metadata score is nan, which JSON cannot store",
    }
    # free text is cleaned, not refused: NUL dropped, a lone surrogate becomes U+FFFD
    assert docs["nul-metadata-value"].metadata == {"note": "ab"}
    assert docs["surrogate-text"].text == "broken \ufffd text about bins"


def test_jsonl_is_streamed_and_an_overlong_line_fails_alone(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "big.jsonl",
        [
            json.dumps({"id": "a", "text": "short"}),
            json.dumps({"id": "b", "text": "y" * 5000}),
            json.dumps({"id": "c", "text": "short too"}),
        ],
    )
    items = list(iter_file(path, max_bytes=1000))
    assert [i.source for i in items if isinstance(i, Document)] == ["a", "c"]
    (failure,) = [i for i in items if isinstance(i, LoadFailure)]
    assert failure.where == f"{path}:2"
    assert failure.reason.startswith("line is longer than that, over the 1000 bytes limit")
    assert "--max-file-size" in failure.reason and "KBPG_MAX_FILE_BYTES" in failure.reason


def test_deeply_nested_html_is_read_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.html"
    path.write_text(deep_html())
    (doc,) = iter_file(path)
    assert isinstance(doc, Document), doc
    assert doc.title == "Deep"
    assert doc.text.strip() == "Treasure at the bottom of the nesting."


def test_front_matter_without_aliases_and_metadata_capped(tmp_path: Path) -> None:
    laughs = (
        "---\n"
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
        "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
        "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
        "---\n# Laughs\n\nBody.\n"
    )
    (tmp_path / "laughs.md").write_text(laughs)
    (tmp_path / "anchor.md").write_text("---\nx: &x 1\n---\nBody.\n")
    (tmp_path / "deep.md").write_text("---\nx: " + "[" * 5000 + "\n---\nBody.\n")
    (tmp_path / "huge.md").write_text(
        "---\nnotes: [" + ", ".join(["word"] * (MAX_METADATA_BYTES // 7)) + "]\n---\nBody.\n"
    )
    (tmp_path / "nan.md").write_text("---\nscore: .nan\n---\nBody.\n")
    (tmp_path / "bytes.md").write_text("---\nblob: !!binary aGVsbG8=\n---\nBody.\n")
    (tmp_path / "group.md").write_text('---\ngroups: ["staff\\0"]\n---\nBody.\n')
    for name, reason in [
        ("laughs.md", "anchors and aliases are not allowed"),
        ("anchor.md", "anchors and aliases are not allowed"),
        ("deep.md", "invalid front matter: nested too deeply"),
        ("huge.md", "metadata is 73.2 KiB as JSON, over the 64 KiB cap"),
        ("nan.md", "metadata score is nan, which JSON cannot store"),
        ("bytes.md", "metadata blob is a bytes, not a JSON value"),
        ("group.md", "`groups` value 'staff\\x00' contains a NUL character"),
    ]:
        (failure,) = iter_file(tmp_path / name)
        assert isinstance(failure, LoadFailure), name
        assert failure.where == str(tmp_path / name)
        assert reason in failure.reason, (name, failure.reason)
    # dates become ISO strings (jsonb has no date type; they used to fail the whole batch)
    (tmp_path / "dated.md").write_text("---\npublished: 2024-01-31\n---\nBody.\n")
    (doc,) = iter_file(tmp_path / "dated.md")
    assert isinstance(doc, Document)
    assert doc.metadata == {"format": "markdown", "published": "2024-01-31"}


def test_binary_content_is_refused_with_a_reason(tmp_path: Path) -> None:
    controls = bytes(b for b in range(1, 32) if b not in b"\t\n\r\x0b\x0c") * 40
    (tmp_path / "controls.md").write_bytes(controls)
    (tmp_path / "nul.txt").write_bytes(b"text\x00with\x00nul\x00bytes")
    (tmp_path / "ansi.txt").write_text("a log line \x1b[31mred\x1b[0m and more ordinary words\n")
    (failure,) = iter_file(tmp_path / "controls.md")
    assert isinstance(failure, LoadFailure)
    assert (
        failure.reason
        == "binary content (1040 control characters in the first 1040 characters), not text"
    )
    (failure,) = iter_file(tmp_path / "nul.txt")
    assert isinstance(failure, LoadFailure)
    assert failure.reason.startswith("binary content (NUL bytes), not text")
    (doc,) = iter_file(tmp_path / "ansi.txt")  # a few escapes are still text
    assert isinstance(doc, Document)


def test_max_file_size_refuses_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text(long_text(2000))
    size = path.stat().st_size
    (failure,) = iter_file(path, max_bytes=size - 1)
    assert isinstance(failure, LoadFailure)
    assert failure.where == str(path)
    assert failure.reason.startswith(f"{size / 1024:.1f} KiB, over the ")
    assert "raise it with --max-file-size or KBPG_MAX_FILE_BYTES" in failure.reason
    (doc,) = iter_file(path, max_bytes=size)
    assert isinstance(doc, Document)


def test_a_huge_section_is_chunked_in_bounded_pieces(embedder: Embedder) -> None:
    """A 300k-character section: every chunk fits the window, nothing is lost, no chunk
    crosses a 64k piece boundary (the tokenizer never sees the whole section at once)."""
    text = long_text(45_000)
    assert len(text) > 300_000
    chunks = chunk_sections([Section(("Big",), text)], embedder)
    counts = embedder.count_tokens_batch([c.embed_text for c in chunks])
    assert max(counts) <= embedder.max_tokens
    covered = [False] * len(text)
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.content
        covered[chunk.start : chunk.end] = [True] * (chunk.end - chunk.start)
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())


def test_symlinks_leaving_the_roots_are_skipped_unless_followed(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "secret" / "passwords.txt"
    outside.parent.mkdir()
    outside.write_text("hunter2")
    (root / "own.md").write_text("# Own\n\ntext\n")
    (root / "sub" / "inner.md").write_text("# Inner\n\ntext\n")
    (root / "leak.txt").symlink_to(outside)
    (root / "alias.md").symlink_to(root / "sub" / "inner.md")  # stays inside: read
    (root / "secretdir").symlink_to(outside.parent, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)

    found = list(discover([root], recursive=True))
    paths = [f.relative_to(root).as_posix() for f in found if isinstance(f, Path)]
    skipped = {f.where: f.reason for f in found if isinstance(f, LoadFailure)}
    assert paths == ["alias.md", "own.md", "sub/inner.md"]
    assert skipped == {
        str(root / "leak.txt"): f"symlink to {outside}, outside the paths given; skipped "
        "(--follow-symlinks reads it)",
        str(root / "secretdir"): f"symlink to {outside.parent}, outside the paths given; "
        "skipped (--follow-symlinks reads it)",
    }
    # asked for: followed (a symlink loop is walked once)
    followed = [
        f.relative_to(root).as_posix()
        for f in discover([root], recursive=True, follow_symlinks=True)
        if isinstance(f, Path)
    ]
    assert followed == [
        "alias.md",
        "leak.txt",
        "own.md",
        "secretdir/passwords.txt",
        "sub/inner.md",
    ]
    # a file named on the command line is read wherever it points
    assert list(discover([root / "leak.txt"])) == [root / "leak.txt"]


def test_undecodable_file_name_is_refused_not_a_failed_batch(tmp_path: Path) -> None:
    name = os.fsdecode(b"caf\xe9.md")
    (tmp_path / name).write_text("# Cafe\n\ntext\n")
    (failure,) = discover([tmp_path])
    assert isinstance(failure, LoadFailure)
    assert failure.reason == "the file name is not valid UTF-8; rename it"
    assert printable(failure.where).endswith("caf\\udce9.md")


@pytest.mark.parametrize("follow_symlinks", [False, True])
def test_unreadable_folder_entries_are_reported_with_their_reason(
    tmp_path: Path, follow_symlinks: bool
) -> None:
    """A FIFO `.md` (stat only: opening it blocks), a symlink loop, a dangling symlink: each a
    failure with its reason, found in a folder or named directly (issue 38)."""
    root = tmp_path / "kb"
    root.mkdir()
    (root / "own.md").write_text("# Own\n\ntext\n")
    os.mkfifo(root / "pipe.md")
    (root / "loop.md").symlink_to(root / "loop.md")
    (root / "gone.md").symlink_to(root / "missing.md")
    loop = "a symlink loop (too many levels of symbolic links)"
    gone = f"a dangling symlink (its target {root}/missing.md does not exist)"
    fifo = "not a regular file or directory (a device, FIFO or socket)"
    found = list(discover([root], recursive=True, follow_symlinks=follow_symlinks))
    assert [f for f in found if isinstance(f, Path)] == [root / "own.md"]
    assert {f.where: f.reason for f in found if isinstance(f, LoadFailure)} == {
        str(root / "gone.md"): gone,
        str(root / "loop.md"): loop,
        str(root / "pipe.md"): fifo,
    }
    named = list(discover([root / "loop.md", root / "gone.md", root / "nothing.md"]))
    assert [(f.where, f.reason) for f in named if isinstance(f, LoadFailure)] == [
        (str(root / "loop.md"), loop),
        (str(root / "gone.md"), gone),
        (str(root / "nothing.md"), "no such file or directory"),
    ]


def test_printable_escapes_what_could_forge_a_line() -> None:
    assert printable("plain name.md") == "plain name.md"
    assert printable("a\nskipped /etc/passwd: ok\tx\x1b[2J\u202e.md") == (
        "a\\nskipped /etc/passwd: ok\\tx\\x1b[2J\\u202e.md"
    )


def test_parse_size() -> None:
    assert parse_size("20MB") == 20_000_000
    assert parse_size("20MiB") == 20 * 1024 * 1024
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size("1048576") == 1048576
    for bad in ("lots", "0", "-5MB", "5 parsecs"):
        with pytest.raises(InvalidInput):
            parse_size(bad)


def test_command_line_groups_with_nul_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="group 'a\\\\x00' contains a NUL"):
        list(iter_documents([tmp_path], groups=["a\x00"]))


# -- into the database ------------------------------------------------------------------------


def hostile_folder(root: Path, outside: Path) -> None:
    """Every kind of bad input next to good files: the good ones must all be ingested."""
    (root / "sub").mkdir(parents=True)
    (root / "good.md").write_text("# Good\n\nRenew the parking permit online.\n")
    (root / "deep.html").write_text(deep_html())
    jsonl(root / "records.jsonl", BAD_RECORDS)
    (root / "sub" / "dated.md").write_text("---\npublished: 2024-01-31\n---\n# Dated\n\nBins.\n")
    (root / "sub" / "laughs.md").write_text("---\na: &a [1, 2]\nb: [*a, *a]\n---\nBody.\n")
    (root / "sub" / "controls.md").write_bytes(bytes(range(1, 9)) * 100)
    (root / "sub" / "leak.txt").symlink_to(outside)


def test_hostile_folder_ingests_every_good_record(
    db_url: str, kb: KnowledgeBase, tmp_path: Path
) -> None:
    outside = tmp_path / "os-release"
    outside.write_text("NAME=secret\n")
    root = tmp_path / "kb"
    hostile_folder(root, outside)
    summary = ingest_paths(kb.db, kb.models, [root], recursive=True)
    records = root / "records.jsonl"
    assert {f.where for f in summary.failures} == {
        *(f"{records}:{n}" for n in (2, 3, 4, 7, 8, 9)),
        str(root / "sub" / "laughs.md"),
        str(root / "sub" / "controls.md"),
        str(root / "sub" / "leak.txt"),
    }
    assert (summary.added, summary.failed) == (7, 9)
    sources = [r[0] for r in rows(db_url, "select source from kb.documents order by source")]
    assert sources == sorted(
        [
            str((root / "deep.html").resolve()),
            str((root / "good.md").resolve()),
            str((root / "sub" / "dated.md").resolve()),
            "good-1",
            "good-2",
            "nul-metadata-value",
            "surrogate-text",
        ]
    )
    assert rows(
        db_url, "select metadata from kb.documents where source = 'nul-metadata-value'"
    ) == [({"note": "ab"},)]
    assert rows(
        db_url,
        "select c.content from kb.chunks c join kb.documents d on d.id = c.document_id "
        "where d.source = 'surrogate-text'",
    ) == [("broken \ufffd text about bins",)]
    assert rows(
        db_url,
        "select metadata->>'published' from kb.documents where source = %s",
        (str((root / "sub" / "dated.md").resolve()),),
    ) == [("2024-01-31",)]
    assert not rows(db_url, "select 1 from kb.chunks where content like '%secret%'")


# -- command line -----------------------------------------------------------------------------


def test_cli_file_names_cannot_forge_lines(tmp_path: Path, cli_env: dict[str, str]) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    (root / "evil\nskipped passwords: forged.md").write_bytes(bytes(range(1, 9)) * 50)
    (root / "good\nname.md").write_text("Renew the parking permit online.\n")
    result = run_kbpg("ingest", str(root), env=cli_env)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    skipped = [line for line in lines if line.startswith("skipped ")]
    assert skipped == [
        f"skipped {root}/evil\\nskipped passwords: forged.md: binary content "
        "(400 control characters in the first 400 characters), not text"
    ]
    assert "added 1, updated 0, unchanged 0, removed 0, skipped 0, failed 1" in result.stderr
    listed = run_kbpg("documents", "list", env=cli_env)
    assert listed.returncode == 0, listed.stderr
    source = (root / "good\nname.md").resolve()
    assert listed.stdout.splitlines() == [
        "source\ttitle\tcategory\tgroups\tchunks",
        f"{printable(str(source))}\tgood\\nname\t\t\t1",
    ]
    assert printable(str(source)).endswith("/good\\nname.md")
    # JSON keeps the real name (escaped by JSON itself)
    (doc,) = json.loads(run_kbpg("documents", "list", "--json", env=cli_env).stdout)
    assert doc["source"] == str(source)


def test_cli_max_file_size_flag_env_and_follow_symlinks(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    (root / "big.txt").write_text("Parking permits are renewed online every year. " * 64)
    outside = tmp_path / "elsewhere.md"
    outside.write_text("# Elsewhere\n\nBulky waste is collected on Saturdays.\n")
    (root / "link.md").symlink_to(outside)

    small = run_kbpg("ingest", str(root), "--max-file-size", "1KiB", env=cli_env)
    assert small.returncode == 1
    assert [line for line in small.stderr.splitlines() if line.startswith("skipped")] == [
        f"skipped {root}/big.txt: 2.9 KiB, over the 1 KiB limit "
        "(raise it with --max-file-size or KBPG_MAX_FILE_BYTES)",
        f"skipped {root}/link.md: symlink to {outside}, outside the paths given; skipped "
        "(--follow-symlinks reads it)",
    ]
    assert "added 0, updated 0, unchanged 0, removed 0, skipped 0, failed 2" in small.stderr

    raised = run_kbpg(
        "ingest", str(root), "--follow-symlinks", env={**cli_env, "KBPG_MAX_FILE_BYTES": "1MB"}
    )
    assert raised.returncode == 0, raised.stderr
    assert "added 2, updated 0, unchanged 0, removed 0, skipped 0, failed 0" in raised.stderr

    bad = run_kbpg("ingest", str(root), "--max-file-size", "lots", env=cli_env)
    assert bad.returncode == 2
    assert "Invalid value for '--max-file-size': 'lots' is not a size" in bad.stderr


def test_a_failed_batch_write_retries_documents_one_by_one(db_url: str, kb: KnowledgeBase) -> None:
    """Documents from the Python API skip the loaders' checks: the database refuses them (their
    names are checked before). Only those are skipped; the good documents of the same batch are
    stored."""
    import datetime
    import secrets

    from kbpg.ingest.run import ingest_documents

    long_id = secrets.token_hex(4000)  # 8,000 random characters: no btree index row fits
    docs = [
        Document(source="good-1", title="Permits", text="Renew the parking permit online."),
        Document(source=long_id, title="Long", text="An id too long for the source index."),
        Document(source="nul-group", title="G", text="Group with NUL.", groups=["a\x00"]),
        Document(
            source="dated",
            title="D",
            text="Metadata with a date.",
            metadata={"at": datetime.date(2024, 1, 31)},
        ),
        Document(source="good-2", title="Bins", text="Bins are collected on Mondays."),
    ]
    summary = ingest_documents(kb.db, kb.models, docs, batch_documents=10)
    assert (summary.added, summary.failed) == (2, 3)
    reasons = {f.where: f.reason for f in summary.failures}
    assert reasons[long_id].startswith("not stored: index row size")
    # names are checked before the write (blank or NUL: issue 25), naming the value
    assert reasons["nul-group"] == "`groups` value 'a\\x00' contains a NUL character"
    assert reasons["dated"] == (
        "not stored: TypeError: Object of type date is not JSON serializable"
    )
    assert rows(db_url, "select source from kb.documents order by source") == [
        ("good-1",),
        ("good-2",),
    ]
    assert summary.chunks == rows(db_url, "select count(*) from kb.chunks")[0][0] == 2


def test_ids_taken_ahead_of_the_write_survive_a_retried_batch(
    db_url: str, kb: KnowledgeBase
) -> None:
    """Ids come from the tables' sequences before the batch is written (kbpg.batching): a batch
    retried document by document keeps them, chunks chain in reading order, an update keeps its
    document's id, and a row added afterwards by the identity default does not collide."""
    from kbpg.ingest.run import ingest_documents

    long = Document(source="long", title="Long", text=long_text(900))
    docs = [
        long,
        Document(source="nul-group", title="G", text="Group with NUL.", groups=["a\x00"]),
        Document(source="short", title="Bins", text="Bins are collected on Mondays."),
    ]
    summary = ingest_documents(kb.db, kb.models, docs, batch_documents=10)
    assert (summary.added, summary.failed) == (2, 1)
    stored = rows(
        db_url,
        "select d.source, d.id, array_agg(c.id order by c.ordinal), array_agg(c.ordinal order by"
        " c.ordinal) from kb.documents d join kb.chunks c on c.document_id = d.id group by 1, 2"
        " order by 1",
    )
    assert [(source, ordinals) for source, _, _, ordinals in stored] == [
        ("long", list(range(len(stored[0][3])))),
        ("short", [0]),
    ]
    assert len(stored[0][3]) > 2
    chunk_ids = stored[0][2] + stored[1][2]
    assert len(set(chunk_ids)) == len(chunk_ids) == summary.chunks
    chain = rows(
        db_url,
        "select src_chunk_id, dst_chunk_id from kb.edges where relation = 'next' order by 1",
    )
    assert chain == list(zip(stored[0][2], stored[0][2][1:], strict=False))

    changed = Document(source="long", title="Long", text=long_text(400))
    assert ingest_documents(kb.db, kb.models, [changed]).updated == 1
    again = rows(
        db_url,
        "select id, (select min(id) from kb.chunks c where c.document_id = d.id)"
        " from kb.documents d where source = 'long'",
    )
    assert again[0][0] == stored[0][1]  # the same document row
    assert again[0][1] > max(chunk_ids)  # its new chunks have new ids
    manual = rows(
        db_url,
        "insert into kb.documents (source, content_hash) values ('manual', '') returning id",
    )
    assert manual[0][0] > max(stored[0][1], stored[1][1])


def test_a_second_ingest_says_what_it_waits_for_and_gives_up(
    db_url: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    import subprocess

    import psycopg

    from kbpg.ingest.writer import WRITE_LOCK_KEY

    (tmp_path / "doc.md").write_text("# Permits\n\nRenew the parking permit online.\n")
    with psycopg.connect(db_url, autocommit=True, application_name="first-writer") as holder:
        holder.execute("select pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
        pid = holder.info.backend_pid
        gave_up = run_kbpg("ingest", str(tmp_path), "--lock-wait", "2s", env=cli_env)
        assert gave_up.returncode == 1, gave_up.stderr
        who = f"another kbpg writer (PostgreSQL backend pid {pid}, application 'first-writer', "
        lines = gave_up.stderr.splitlines()
        assert lines[0].startswith(f"waiting up to 2 s for the write lock held by {who}")
        assert lines[1].startswith(f"Error: {who}")
        assert lines[1].endswith(") holds kbpg's write lock; gave up after waiting 2 s")
        assert lines[2] == (
            "Hint: let it finish, or wait longer with --lock-wait (KBPG_WRITE_LOCK_WAIT), "
            "e.g. 10min"
        )
        assert rows(db_url, "select count(*) from kb.documents") == [(0,)]
        # the first writer finishes while the second waits: the second goes on
        waiting = subprocess.Popen(
            [KBPG, "ingest", str(tmp_path)],
            env={**cli_env, "KBPG_WRITE_LOCK_WAIT": "2min"},
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiting.stderr is not None
        first = waiting.stderr.readline()
        assert first.startswith(f"waiting up to 120 s for the write lock held by {who}")
        holder.execute("select pg_advisory_unlock_all()")
        rest = waiting.stderr.read()
        assert waiting.wait(timeout=300) == 0, rest
        assert "added 1," in rest


def test_every_writer_takes_lock_wait(db_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    """`documents delete` and `reembed` take --lock-wait like ingest (over KBPG_WRITE_LOCK_WAIT)."""
    import psycopg

    from kbpg.ingest.writer import WRITE_LOCK_KEY

    (tmp_path / "doc.md").write_text("# Permits\n\nRenew the parking permit online.\n")
    assert run_kbpg("ingest", str(tmp_path), env=cli_env).returncode == 0
    env = {**cli_env, "KBPG_WRITE_LOCK_WAIT": "10min"}
    with psycopg.connect(db_url, autocommit=True, application_name="first-writer") as holder:
        holder.execute("select pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
        for command in (
            ["documents", "delete", str(tmp_path / "doc.md"), "--lock-wait", "1s"],
            ["reembed", "--lock-wait", "1s"],
        ):
            gave_up = run_kbpg(*command, env=env)
            assert gave_up.returncode == 1, gave_up.stderr
            lines = gave_up.stderr.splitlines()
            if command[0] == "reembed":  # it names the model first, then waits for the lock
                assert lines.pop(0) == "reembed: embedding every chunk with all-MiniLM-L6-v2"
            assert lines[0].startswith("waiting up to 1 s for the write lock held by ")
            assert lines[1].startswith("Error: another kbpg writer (PostgreSQL backend pid ")
            assert lines[1].endswith(") holds kbpg's write lock; gave up after waiting 1 s")
            assert gave_up.stdout == ""
        at_once = run_kbpg("documents", "delete", "doc.md", "--lock-wait", "0", env=env)
        assert at_once.returncode == 1
        assert at_once.stderr.splitlines()[0].endswith("gave up after waiting 0 s")
    bad = run_kbpg("reembed", "--lock-wait", "soon", env=cli_env)
    assert bad.returncode == 2
    assert "Invalid value for '--lock-wait': --lock-wait='soon' is not a duration" in bad.stderr
    assert rows(db_url, "select count(*) from kb.documents") == [(1,)]
    deleted = run_kbpg(
        "documents", "delete", str(tmp_path / "doc.md"), "--lock-wait", "5s", env=cli_env
    )
    assert deleted.returncode == 0, deleted.stderr
    assert rows(db_url, "select count(*) from kb.documents") == [(0,)]


def test_the_cli_batch_size_default_is_the_librarys() -> None:
    from kbpg.cli.library import ingest
    from kbpg.ingest.batching import BATCH_DOCUMENTS, batch_documents_for
    from kbpg.models.embedders import E5Embedder, MiniLMEmbedder

    # no --batch-size: the model's own batch (e5's slow passages) or the library's
    defaults = [p.default for p in ingest.params if p.name == "batch_size"]
    assert defaults == [None]
    assert batch_documents_for(MiniLMEmbedder()) == BATCH_DOCUMENTS == 1024
    assert batch_documents_for(E5Embedder()) == 32
