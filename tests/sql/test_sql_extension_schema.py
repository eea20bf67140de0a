"""pgvector installed outside `public` (Supabase's `extensions`): kbpg finds it at apply time."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import psycopg

from kbpg.store import db as kdb
from tests.conftest import drop_database, with_database
from tests.sqldata import vec


def test_vector_in_schema_extensions_upgrade_and_hybrid_search(
    new_database: Callable[..., str],
) -> None:
    url = new_database(migrated=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create schema extensions")
        conn.execute("create extension vector schema extensions")
    kdb.upgrade(url)
    kdb.upgrade(url)  # at head: re-applies sql/ (a second deploy) the same way
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "select n.nspname from pg_extension e join pg_namespace n on n.oid = e.extnamespace"
            " where e.extname = 'vector'"
        ).fetchone() == ("extensions",)
        assert conn.execute(
            "select format_type(a.atttypid, a.atttypmod) from pg_attribute a"
            " where a.attrelid = 'kb_data.chunks'::regclass and a.attname = 'embedding'"
        ).fetchone() == ("extensions.vector",)
        # the caller's search_path does not name `extensions`: kb's functions need not either
        assert "extensions" not in conn.execute("show search_path").fetchone()[0]
        conn.execute("select kb.set_embedding_space('ext-model', 3)")
        doc = conn.execute(
            "insert into kb.documents (source, content_hash) values ('e.md', 'h') returning id"
        ).fetchone()[0]
        rows = [
            ("renew your parking permit online", [1, 0, 0]),
            ("permit office opening hours", [0, 1, 0]),
            ("bicycle storage", [0.9, 0.1, 0]),
        ]
        ids = [
            conn.execute(
                "insert into kb.chunks (document_id, ordinal, content, embedding)"
                " values (%s, %s, %s, %s::extensions.vector) returning id",
                (doc, i, text, vec(v)),
            ).fetchone()[0]
            for i, (text, v) in enumerate(rows)
        ]
        conn.execute("select kb.refresh_lexical_index()")
        conn.commit()
        hits = conn.execute(
            "select chunk_id, vector_rank, lexical_rank from kb.search('renew permit',"
            " %s::extensions.vector, max_per_doc => 5)",
            (vec([1, 0, 0]),),
        ).fetchall()
        # a1 is first in both arms; the bicycle chunk only by vector, the office only lexically
        assert hits[0] == (ids[0], 1, 1)
        assert {h[0] for h in hits} == set(ids)
        lexical = conn.execute("select chunk_id from kb.search('permit office')").fetchall()
        assert lexical[0] == (ids[1],)
        index = conn.execute(
            "select pg_get_indexdef('kb_data.chunks_embedding_hnsw'::regclass)"
        ).fetchone()[0]
        assert "extensions.halfvec_cosine_ops" in index  # the default layout of 3-d spaces


def test_non_superuser_owner_upgrades_every_time(admin_url: str) -> None:
    """vector pre-created by an admin; the owner's later upgrades must still create the
    functions declared with SET hnsw.* (unknown settings until vector.so is loaded)."""
    suffix = uuid.uuid4().hex[:8]
    role, dbname = f"kbpg_t_owner_{suffix}", f"kbpg_t_owned_{suffix}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"create role {role} login")
        conn.execute(f"create database {dbname} owner {role}")
    try:
        with psycopg.connect(with_database(admin_url, dbname), autocommit=True) as conn:
            conn.execute("create extension vector")
        parts = urlsplit(with_database(admin_url, dbname))
        owner_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.split('@')[-1]}"))
        for _ in range(2):  # each upgrade runs in a fresh session without vector.so loaded
            kdb.upgrade(owner_url)
        with psycopg.connect(owner_url) as conn:
            assert conn.execute(
                "select current_user, usesuper from pg_user where usename = current_user"
            ).fetchone() == (role, False)
            config = conn.execute(
                "select proconfig from pg_proc where oid = 'kb._search_vector'::regproc"
            ).fetchone()[0]
            assert "hnsw.iterative_scan=relaxed_order" in config
            assert kdb.schema_status(conn).at_head
    finally:
        drop_database(admin_url, dbname)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"drop role if exists {role}")
