"""KnowledgeBase sessions on a real server: roles, local timeouts, pool exhaustion, SQLSTATEs."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from kbpg.app import KnowledgeBase, Principal
from kbpg.config import Settings
from kbpg.errors import (
    Busy,
    EmbeddingSpaceMismatch,
    InvalidInput,
    KbpgError,
    PermissionDenied,
    QueryTimeout,
    QueryTooLarge,
    ReadOnlyDatabase,
    SchemaNotMigrated,
)
from kbpg.models.embedders import Embedder
from tests.search_kb import kb_url  # noqa: F401 - fixture


def settings(**changes: object) -> Settings:
    return dataclasses.replace(Settings.from_env(), **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def reader(kb_url: str) -> Iterator[str]:  # noqa: F811
    """A NOLOGIN role with no privileges on kb (the connecting user may SET ROLE to it)."""
    role = f"kbpg_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(kb_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(role)))
        user = conn.execute("select current_user").fetchone()
        assert user is not None
        conn.execute(
            sql.SQL("grant {} to {}").format(sql.Identifier(role), sql.Identifier(user[0]))
        )
    yield role
    with psycopg.connect(kb_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


@pytest.fixture
def kb(kb_url: str, embedder: Embedder) -> Iterator[KnowledgeBase]:  # noqa: F811
    with KnowledgeBase(kb_url, embedder, settings=settings(), pool_size=2) as knowledge_base:
        yield knowledge_base


def _current_user(conn: psycopg.Connection[object]) -> str:
    row = conn.execute("select current_user::text").fetchone()
    assert row is not None
    return str(row[0])


def test_session_runs_as_the_principals_role(kb: KnowledgeBase, reader: str) -> None:
    with kb.session() as conn:
        login = _current_user(conn)
    assert login != reader
    with kb.session(Principal(reader)) as conn:
        assert _current_user(conn) == reader
    # SET LOCAL ends with the transaction: the pooled connection is itself again
    with kb.session() as conn:
        assert _current_user(conn) == login


def test_role_names_are_identifiers_not_sql(kb: KnowledgeBase) -> None:
    with pytest.raises(KbpgError) as info, kb.session(Principal('x"; drop table kb.chunks; --')):
        pass
    assert "does not exist" in info.value.message
    with kb.session() as conn:
        assert conn.execute("select count(*) from kb.chunks").fetchone() == (11,)
    with pytest.raises(InvalidInput):
        Principal("")


def test_search_as_a_role_without_privileges_is_permission_denied(
    kb: KnowledgeBase, reader: str
) -> None:
    with pytest.raises(PermissionDenied) as info:
        kb.search("renew parking permit", principal=Principal(reader))
    assert "permission denied" in info.value.message
    assert kb.search("renew parking permit", top=2).chunks  # the login role still can


def test_read_sessions_carry_the_search_timeouts(kb: KnowledgeBase) -> None:
    with kb.session() as conn:
        shown = [
            conn.execute(sql.SQL("show {}").format(sql.Identifier(name))).fetchone()
            for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        ]
    assert shown == [("30s",), ("10s",), ("5min",)]
    with kb.session(write=True) as conn:
        # writes leave statement_timeout to the server (ingest batches run long)
        assert conn.execute("show statement_timeout").fetchone() == ("0",)
        assert conn.execute("show lock_timeout").fetchone() == ("10s",)
    with kb.connection() as conn:  # outside a session: the server's own settings
        assert conn.execute("show statement_timeout").fetchone() == ("0",)


def test_statement_timeout_is_query_timeout(kb_url: str, embedder: Embedder) -> None:  # noqa: F811
    quick = settings(statement_timeout_ms=50)
    with KnowledgeBase(kb_url, embedder, settings=quick, pool_size=1) as kb:
        with pytest.raises(QueryTimeout) as info, kb.session() as conn:
            conn.execute("select pg_sleep(2)")
        assert info.value.hint and "KBPG_STATEMENT_TIMEOUT" in info.value.hint
        with kb.session() as conn:  # the connection is usable afterwards
            assert conn.execute("select 1").fetchone() == (1,)


def test_exhausted_pool_is_busy(kb_url: str, embedder: Embedder) -> None:  # noqa: F811
    impatient = settings(pool_timeout_s=0.2)
    with (
        KnowledgeBase(kb_url, embedder, settings=impatient, pool_size=2) as kb,
        kb.session(),
        kb.session(),
    ):
        with pytest.raises(Busy) as info, kb.session():
            pass
        assert "all 2 database connections" in info.value.message
    with KnowledgeBase(kb_url, embedder, settings=impatient, pool_size=1) as single:
        with single.session(), pytest.raises(Busy), single.session():
            pass
        assert single.search("renew parking permit", top=1).chunks  # free again


def test_read_only_transaction_is_read_only_database(kb: KnowledgeBase) -> None:
    with pytest.raises(ReadOnlyDatabase) as info, kb.session(write=True) as conn:
        conn.execute("set transaction read only")
        conn.execute("delete from kb.edges")
    assert info.value.hint == "this server is a read-only standby: write on the primary"


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("KB001", EmbeddingSpaceMismatch),
        ("KB002", EmbeddingSpaceMismatch),
        ("KB003", QueryTooLarge),
        ("42501", PermissionDenied),
        ("25006", ReadOnlyDatabase),
        ("57014", QueryTimeout),
        ("22023", InvalidInput),
        ("3F000", SchemaNotMigrated),
        ("42P01", SchemaNotMigrated),
        ("42883", SchemaNotMigrated),
        ("P0001", KbpgError),
    ],
)
def test_errors_map_by_sqlstate(kb: KnowledgeBase, state: str, kind: type[KbpgError]) -> None:
    raise_it = sql.SQL(
        "do $$ begin raise exception 'kb.anything went wrong' using errcode = {}, hint = 'h'; end $$"
    ).format(sql.Literal(state))
    with pytest.raises(KbpgError) as info, kb.session() as conn:
        conn.execute(raise_it)
    assert type(info.value) is kind
    assert info.value.hint is not None


def test_query_too_large_is_invalid_input() -> None:
    assert issubclass(QueryTooLarge, InvalidInput)


@pytest.mark.parametrize("pool_size", [1, 2])
def test_a_transaction_left_open_is_rolled_back(
    kb_url: str,  # noqa: F811
    embedder: Embedder,
    pool_size: int,
) -> None:
    with KnowledgeBase(kb_url, embedder, settings=settings(), pool_size=pool_size) as kb:
        with kb.connection() as conn:
            conn.execute("begin")
            conn.execute("create temporary table left_behind (x int)")
        for _ in range(pool_size):
            with kb.session() as conn:
                row = conn.execute("select pg_catalog.to_regclass('pg_temp.left_behind')")
                assert row.fetchone() == (None,)


def test_writer_lock_is_released_even_from_a_failed_transaction(
    kb_url: str,  # noqa: F811
    embedder: Embedder,
) -> None:
    from kbpg.ingest.writer import WRITE_LOCK_KEY, writer

    with KnowledgeBase(kb_url, embedder, settings=settings(), pool_size=1) as kb:
        with pytest.raises(KbpgError), writer(kb.db) as conn:
            conn.execute("begin")  # a job that left its transaction open and failed in it
            conn.execute("select 1 / 0")
        with kb.session(write=True) as conn:  # the lock is free: waiting would time out
            conn.execute("select pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
        with writer(kb.db):
            pass
        with kb.session(write=True) as conn:
            conn.execute("select pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
