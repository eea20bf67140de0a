"""An application's table (help-centre articles) for the table-source tests, and queue views."""

from __future__ import annotations

from typing import Any

import psycopg

ARTICLES = """
create table public.articles (
    id          bigint primary key,
    title       text,
    body        text,
    visible_to  text[],
    section     text,
    tags        text[],
    author      text,
    updated_at  timestamptz not null default now(),
    view_count  integer not null default 0,
    extra       json
)
"""

ROWS = [
    (1, "Renew a parking permit", "Renew your parking permit online before it expires.",
     [], "permits", ["parking"], "ann"),
    (2, "Parental leave", "Staff get twenty weeks of parental leave at full salary.",
     ["hr"], "hr", ["leave"], "bob"),
    (3, "Bicycle storage", "Bicycle storage is free in every municipal garage.",
     [], "parking", ["bicycle", "parking"], "cy"),
]  # fmt: skip


def add_articles(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]] | None = None) -> None:
    conn.execute(ARTICLES)
    for row in ROWS if rows is None else rows:
        insert_article(conn, *row)


def insert_article(
    conn: psycopg.Connection[Any],
    id: int,
    title: str | None,
    body: str | None,
    visible_to: list[str] | None = None,
    section: str | None = None,
    tags: list[str] | None = None,
    author: str | None = None,
) -> None:
    conn.execute(
        "insert into public.articles (id, title, body, visible_to, section, tags, author)"
        " values (%s, %s, %s, %s, %s, %s, %s)",
        (id, title, body, visible_to, section, tags, author),
    )


ADD_SOURCE = (
    "select * from kb.add_table_source('articles', 'public.articles', text => 'body',"
    " title => 'title', groups => 'visible_to', category => 'section', labels => 'tags',"
    " metadata => '{author, updated_at}')"
)


def queue(conn: psycopg.Connection[Any]) -> list[tuple[list[str], str]]:
    """(key, op) of every queued key as a worker's claim takes it (once, its earliest entry's op),
    oldest first."""
    # the table (a view has no ctid): in kb_data from revision 0028, in kb before
    row = conn.execute("select pg_catalog.to_regnamespace('kb_data') is not null").fetchone()
    table = "kb_data.source_queue" if row and row[0] else "kb.source_queue"
    return [
        (list(r[0]), str(r[1]))
        for r in conn.execute(
            "select key, op from (select distinct on (source_id, key) source_id, key, op, enqueued_at"
            f"                       from {table} order by source_id, key, enqueued_at, ctid) q"
            " order by enqueued_at, key"
        ).fetchall()
    ]


def entries(conn: psycopg.Connection[Any]) -> int:
    """How many entries the queue holds (a key changed by several statements has several)."""
    return count(conn, "select count(*) from kb.source_queue")


def count(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> int:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def documents(conn: psycopg.Connection[Any], prefix: str = "table:articles/") -> dict[str, Any]:
    """source -> (title, groups, category, labels, metadata, chunk texts) of the source's documents."""
    rows = conn.execute(
        "select d.source, d.title, d.groups, d.category, d.labels, d.metadata,"
        " array(select c.content from kb.chunks c where c.document_id = d.id order by c.ordinal)"
        " from kb.documents d where starts_with(d.source, %s) order by d.source",
        (prefix,),
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}
