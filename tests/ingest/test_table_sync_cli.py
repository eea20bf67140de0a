"""`kbpg sources ...` and `kbpg sync` as a user runs them: output, exit codes, several workers at
once, a worker killed mid-batch, SIGTERM, and a watching worker woken by NOTIFY."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kbpg.store import db as kdb
from tests.helpers import KBPG, invoke_kbpg, run_kbpg
from tests.tablesdata import ARTICLES, add_articles, count, documents, insert_article

WORKER_LOCK = 0x6B627073


def _ok(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = invoke_kbpg(*args, env=env)
    assert result.returncode == 0, f"kbpg {' '.join(args)}: {result.stderr}"
    return result


def _scalar(url: str, sql: str) -> int:
    with kdb.connect(url) as conn:
        return count(conn, sql)


def _wait_for(condition: object, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def test_sources_commands(db_url: str, cli_env: dict[str, str]) -> None:
    with kdb.connect(db_url, autocommit=True) as conn:
        add_articles(conn)
    added = _ok(
        "sources", "add", "articles", "public.articles", "--text", "body", "--title", "title",
        "--groups", "visible_to", "--labels", "tags", "--metadata", "author,updated_at",
        env=cli_env,
    )  # fmt: skip
    assert added.stdout.startswith("added source articles: public.articles keyed by id;")
    assert "kbpg sync" in added.stderr
    # the worker (here the same role, which reads the table) is not said to lack a grant
    # (issue 42: the embedded default warned "cannot read ... grant select" falsely)
    assert "Warning" not in added.stderr and "grant select" not in added.stderr, added.stderr

    # the console script itself, once: the message and hint on stderr, exit 1, no traceback
    missing = run_kbpg("sources", "add", "x", "public.articles", "--text", "nope", env=cli_env)
    assert missing.returncode == 1 and missing.stdout == ""
    assert 'Error: column "nope" of public.articles does not exist (text)' in missing.stderr
    assert "Hint: its columns: id, title, body" in missing.stderr
    assert "Traceback" not in missing.stderr
    # (the other definition errors: tests/sql/test_table_sources.py, as SQL raises them)
    assert invoke_kbpg("sources", "add", "x", "public.articles", env=cli_env).returncode == 2

    synced = _ok("sync", "--json", env=cli_env)
    summary = json.loads(synced.stdout)
    assert (summary["rows"], summary["added"], summary["failed"]) == (3, 3, 0)
    assert synced.stderr.strip().splitlines()[-1].startswith("synced 3 rows: added 3,")
    shown = _ok("sources", "show", "articles", env=cli_env).stdout
    assert "documents:\t3" in shown and "backfill:\tdone" in shown and "key:\tid" in shown

    with kdb.connect(db_url, autocommit=True) as conn:
        insert_article(conn, 9, "Bad", "Empty group below.", ["", "hr"])
    parked = invoke_kbpg("sync", env=cli_env)
    assert parked.returncode == 1
    assert "parked table:articles/9: groups holds an empty value (NULL or blank)" in parked.stderr
    errors = json.loads(_ok("sources", "errors", "--json", env=cli_env).stdout)
    assert [(e["document"], e["attempts"]) for e in errors] == [("table:articles/9", 1)]
    assert _ok("sources", "retry", "articles", env=cli_env).stdout == "queued 1 parked rows again\n"

    _ok("sources", "alter", "articles", "--title", "", env=cli_env)
    _ok("sources", "resync", "articles", env=cli_env)
    assert _scalar(
        db_url, "select count(*) from kb.table_sources where title_column is null and version = 2"
    ) == 1  # fmt: skip
    assert _scalar(db_url, "select count(*) from kb.source_queue where op = 'S'") == 1
    removed = _ok("sources", "remove", "articles", "--drop-documents", env=cli_env)
    assert removed.stdout == "removed source articles and its 3 documents\n"
    for table in ("table_sources", "source_queue", "source_errors", "documents"):
        assert _scalar(db_url, f"select count(*) from kb.{table}") == 0, table


def _bulk(db_url: str, rows: int, *, source: bool = True) -> None:
    """`rows` articles (before the source: the backfill's) and the source."""
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute(ARTICLES)
        conn.execute(
            "insert into public.articles (id, title, body)"
            " select g, 'Article ' || g, 'Article ' || g || ' is about topic ' || (g %% 13)"
            "        || ' and mentions permit number P-' || g || '.'"
            "   from generate_series(1, %s) g",
            (rows,),
        )
        if source:
            conn.execute(
                "select kb.add_table_source('articles', 'public.articles', text => 'body',"
                " title => 'title')"
            )


def _popen(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [KBPG, *args], env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True
    )


def test_two_workers_share_the_rows_and_none_is_done_twice(
    db_url: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    _bulk(db_url, 60)
    workers = [
        _popen("sync", "--batch-size", "5", "--json", env=cli_env, log=tmp_path / f"w{i}.log")
        for i in (1, 2)
    ]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [
        (tmp_path / f"w{i}.log").read_text() for i in (1, 2)
    ]
    summaries = [json.loads(out) for out in outputs]
    assert sum(s["rows"] for s in summaries) == 60  # every row claimed once, by one worker
    assert sum(s["added"] for s in summaries) == 60
    assert _scalar(db_url, "select count(*) from kb.documents") == 60
    assert _scalar(db_url, "select count(*) from kb.source_queue") == 0
    assert _scalar(db_url, "select count(*) from kb.source_claims") == 0


def _worker_locks(url: str) -> int:
    return _scalar(
        url,
        f"select count(*) from pg_locks where locktype = 'advisory' and classid = {WORKER_LOCK}"
        " and granted",
    )


def test_a_worker_killed_mid_batch_leaves_nothing_half_done(
    db_url: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # enough rows that the kill lands mid-way however fast the machine (60 were all written
    # before a quiet machine's 0.1 s poll saw the first 15)
    rows = 600
    _bulk(db_url, rows)
    worker = _popen("sync", "--watch", "--batch-size", "5", env=cli_env, log=tmp_path / "w.log")
    _wait_for(
        lambda: _scalar(db_url, "select count(*) from kb.documents") >= 15,
        what="the worker's first batches",
    )
    worker.send_signal(signal.SIGKILL)
    worker.wait(30)
    written = _scalar(db_url, "select count(*) from kb.documents")
    assert 15 <= written < rows
    # its backend ends with it: the session lock and any claim it held are free for others
    _wait_for(lambda: _worker_locks(db_url) == 0, what="the killed worker's session to end")
    _ok("sync", "--batch-size", "50", env=cli_env)
    assert _scalar(db_url, "select count(*) from kb.documents") == rows
    assert _scalar(db_url, "select count(*) from kb.source_claims") == 0
    assert _scalar(db_url, "select count(*) from kb.source_queue") == 0
    with kdb.connect(db_url) as conn:
        recount = conn.execute(
            "select lexemes_corrected, chunk_count from kb.recount_bm25_statistics()"
        ).fetchone()
        assert recount == (0, rows)
        docs = documents(conn)
    assert all(len(chunks) == 1 for *_, chunks in docs.values())


def test_sigterm_finishes_the_batch_in_hand_and_keeps_the_rest_queued(
    db_url: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    rows = 600  # the signal lands mid-way however fast the machine (as above)
    _bulk(db_url, rows)
    log = tmp_path / "w.log"
    worker = _popen("sync", "--watch", "--batch-size", "5", env=cli_env, log=log)
    _wait_for(
        lambda: _scalar(db_url, "select count(*) from kb.documents") >= 5,
        what="the worker's first batch",
    )
    worker.send_signal(signal.SIGTERM)
    worker.wait(120)
    assert worker.returncode == 0, log.read_text()
    assert "stopping after the batch in hand" in log.read_text()
    assert _scalar(db_url, "select count(*) from kb.source_claims") == 0
    written = _scalar(db_url, "select count(*) from kb.documents")
    queued = _scalar(db_url, "select count(*) from kb.source_queue")
    paged = _scalar(db_url, "select backfill_enqueued from kb.table_sources")
    assert written + queued == paged  # every row paged is written or still queued
    assert _worker_locks(db_url) == 0
    _ok("sync", env=cli_env)
    assert _scalar(db_url, "select count(*) from kb.documents") == rows


def test_a_watching_worker_is_woken_by_a_commit(
    db_url: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    _bulk(db_url, 0)
    log = tmp_path / "w.log"
    # a poll this long: only NOTIFY can wake it in time
    worker = _popen("sync", "--watch", "--poll", "10min", env=cli_env, log=log)
    try:
        _wait_for(lambda: _worker_locks(db_url) == 1, what="the worker to start")
        _wait_for(
            lambda: _scalar(db_url, "select count(*) from kb.table_sources"
                                    " where backfill_state = 'done'") == 1,
            what="the empty backfill",
        )  # fmt: skip
        with kdb.connect(db_url, autocommit=True) as conn:
            insert_article(conn, 1, "Late", "Written while the worker waits for changes.")
        _wait_for(
            lambda: _scalar(db_url, "select count(*) from kb.documents") == 1,
            what="the new row's document",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert worker.returncode == 0, log.read_text()


def test_a_source_whose_table_is_dropped(db_url: str, cli_env: dict[str, str]) -> None:
    """Issue 38, item 5: sync says so (exit 1, the reason, what to run), list/show name the table
    "(dropped)", resync binds a table re-created under the name, remove works; its documents
    stay searchable meanwhile."""
    with kdb.connect(db_url, autocommit=True) as conn:
        add_articles(conn)
    _ok("sources", "add", "articles", "public.articles", "--text", "body", env=cli_env)
    _ok("sync", env=cli_env)
    with kdb.connect(db_url, autocommit=True) as conn:
        conn.execute("drop table public.articles")
        assert sorted(documents(conn)) == [f"table:articles/{i}" for i in (1, 2, 3)]

    listed = _ok("sources", "list", env=cli_env).stdout.splitlines()
    assert listed[1].split("\t")[:3] == ["articles", "public.articles (dropped)", "3"]
    assert (
        "table:\tpublic.articles (dropped)\n"
        in _ok("sources", "show", "articles", env=cli_env).stdout
    )
    hint = (
        "re-create public.articles and run: kbpg sources resync articles;  or: kbpg sources"
        " remove articles (its documents stay searchable until then; --drop-documents deletes"
        " them)"
    )
    synced = invoke_kbpg("sync", env=cli_env)
    assert synced.returncode == 1
    assert (
        'Error: source articles could not be read: the table of table source "articles" was'
        f" dropped (it was public.articles) (hint: {hint})"
    ) in synced.stderr
    assert synced.stderr.count("synced 0 rows") == 1
    resynced = invoke_kbpg("sources", "resync", "articles", env=cli_env)
    assert resynced.returncode == 1 and "Traceback" not in resynced.stderr
    assert resynced.stderr == (
        'Error: the table of table source "articles" was dropped (it was public.articles)\n'
        f"Hint: {hint}\n"
    )

    # re-created under its name (row 2 gone, row 4 new): resync binds it, sync catches up
    with kdb.connect(db_url, autocommit=True) as conn:
        add_articles(conn, [(1, "One", "first body"), (3, "Three", "third body"),
                            (4, "Four", "fourth body")])  # fmt: skip
    _ok("sources", "resync", "articles", env=cli_env)
    assert (
        _ok("sync", env=cli_env)
        .stderr.strip()
        .splitlines()[-1]
        .startswith("synced 3 rows: added 1, updated 2, unchanged 0, deleted 1,")
    )
    listed = _ok("sources", "list", env=cli_env).stdout.splitlines()
    assert listed[1].split("\t")[:3] == ["articles", "public.articles", "3"]
    with kdb.connect(db_url, autocommit=True) as conn:
        assert sorted(documents(conn)) == [f"table:articles/{i}" for i in (1, 3, 4)]
        # the trigger is on the new table: a change of it is queued
        conn.execute("update public.articles set body = 'changed' where id = 4")
        assert count(conn, "select count(*) from kb.source_queue") == 1
        conn.execute("drop table public.articles")

    # remove works on a source whose table is gone; its documents go with --drop-documents
    removed = _ok("sources", "remove", "articles", "--drop-documents", env=cli_env)
    assert "removed source articles" in removed.stdout + removed.stderr
    with kdb.connect(db_url, autocommit=True) as conn:
        assert documents(conn) == {}
        assert count(conn, "select count(*) from kb.table_sources") == 0
