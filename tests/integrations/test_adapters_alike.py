"""What both adapters do alike: searches run as the principal given, and cancelling an async
search cancels its SQL statement (the connection goes back to the pool)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from kbpg.app import KnowledgeBase, Principal
from kbpg.config import Settings
from kbpg.errors import NotFound
from kbpg.ingest.run import ingest_paths
from kbpg.integrations import langchain, llamaindex
from kbpg.models.embedders import Embedder
from kbpg.store import access as kaccess
from kbpg.store.knowledge_bases import create as create_knowledge_base
from tests.accessdata import login_roles
from tests.conftest import drop_database
from tests.integrations.conftest import SAMPLES, ingested_samples, relative

VPN = "how do I connect to the VPN"
PARKING = "where can I park and how do I get a permit"


@pytest.fixture(scope="module")
def access_kb(
    admin_url: str, template_url: str, embedder: Embedder
) -> Iterator[tuple[KnowledgeBase, Principal]]:
    """samples/kb with access control on, and a resident who reads `public` and `residents`
    (not `staff`, the IT help desk's group)."""
    name, kb = ingested_samples(admin_url, embedder)
    try:
        with login_roles(admin_url, ["resident"]) as roles:
            reader, _ = kaccess.setup(kb.db)
            with psycopg.connect(kb.url, autocommit=True) as conn:
                conn.execute(f'grant "{reader}" to "{roles["resident"]}"')
            kaccess.grant(kb.db, roles["resident"], ["public", "residents"])
            assert kaccess.set_enforced(kb.db, True).enforced
            yield kb, Principal(roles["resident"])
            kb.close()
    finally:
        kb.close()
        drop_database(admin_url, name)


def test_searches_run_as_the_principal(access_kb: tuple[KnowledgeBase, Principal]) -> None:
    kb, resident = access_kb
    owner = [c.chunk_id for c in kb.search(VPN, top=3).chunks]
    theirs = [c.chunk_id for c in kb.search(VPN, top=3, principal=resident).chunks]
    assert theirs and not set(owner) & set(theirs)

    chain = langchain.KbpgRetriever(knowledge_base=kb, top=3)
    assert [d.metadata["chunk_id"] for d in chain.invoke(VPN)] == owner
    assert {relative(d.metadata["source"]) for d in chain.invoke(VPN)} == {"it-helpdesk/vpn.md"}
    chain = langchain.KbpgRetriever(knowledge_base=kb, top=3, principal=resident)
    docs = chain.invoke(VPN)
    assert [d.metadata["chunk_id"] for d in docs] == theirs
    assert not any(relative(d.metadata["source"]).startswith("it-helpdesk/") for d in docs)
    assert [d.metadata["chunk_id"] for d in asyncio.run(chain.ainvoke(VPN))] == theirs

    index = llamaindex.KbpgRetriever(kb, top=3)
    assert [int(n.node.node_id) for n in index.retrieve(VPN)] == owner
    index = llamaindex.KbpgRetriever(kb, top=3, principal=resident)
    assert [int(n.node.node_id) for n in index.retrieve(VPN)] == theirs
    assert [int(n.node.node_id) for n in asyncio.run(index.aretrieve(VPN))] == theirs


def test_both_search_the_knowledge_base_their_principal_names(
    admin_url: str,
    template_url: str,
    embedder: Embedder,
) -> None:
    """samples/kb in default and its it-helpdesk folder alone in `it`: a principal naming `it`
    takes both retrievers there, as it takes KnowledgeBase.search."""
    name, kb = ingested_samples(admin_url, embedder)
    try:
        create_knowledge_base(kb.db, "it")
        with KnowledgeBase(kb.url, embedder, kb="it", pool_size=1) as it:
            ingest_paths(it.db, it.models, [SAMPLES / "it-helpdesk"], recursive=True)
        where = Principal(knowledge_base="it")
        ranked = [c.chunk_id for c in kb.search(PARKING, top=3, principal=where).chunks]
        assert ranked and ranked != [c.chunk_id for c in kb.search(PARKING, top=3).chunks]
        chain = langchain.KbpgRetriever(knowledge_base=kb, top=3, principal=where)
        docs = chain.invoke(PARKING)
        assert [d.metadata["chunk_id"] for d in docs] == ranked
        assert all(relative(d.metadata["source"]).startswith("it-helpdesk/") for d in docs)
        index = llamaindex.KbpgRetriever(kb, top=3, principal=where)
        assert [int(n.node.node_id) for n in index.retrieve(PARKING)] == ranked
        nowhere = langchain.KbpgRetriever(
            knowledge_base=kb, principal=Principal(knowledge_base="nothing")
        )
        with pytest.raises(NotFound, match='no knowledge base "nothing"'):
            nowhere.invoke(PARKING)
    finally:
        kb.close()
        drop_database(admin_url, name)


def _langchain(kb: KnowledgeBase) -> Awaitable[Any]:
    return langchain.KbpgRetriever(knowledge_base=kb).ainvoke(VPN)


def _llamaindex(kb: KnowledgeBase) -> Awaitable[Any]:
    return llamaindex.KbpgRetriever(kb).aretrieve(VPN)


def _lock_waiters(url: str) -> list[str]:
    """The queries of this database's backends that wait for a lock."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "select query from pg_catalog.pg_stat_activity"
            " where datname = current_database() and wait_event_type = 'Lock'"
        ).fetchall()
    return [query for (query,) in rows]


@pytest.mark.parametrize("asearch", [_langchain, _llamaindex], ids=["langchain", "llamaindex"])
def test_cancelling_an_async_search_cancels_its_statement(
    samples_kb: KnowledgeBase,
    embedder: Embedder,
    asearch: Callable[[KnowledgeBase], Awaitable[Any]],
) -> None:
    # kbpg's own timeouts far away: only the cancellation may end the statement
    patient = replace(Settings.from_env(), statement_timeout_ms=120_000, lock_timeout_ms=120_000)
    with (
        KnowledgeBase(samples_kb.url, embedder, settings=patient, pool_size=1) as kb,
        psycopg.connect(kb.url) as locker,
    ):
        locker.execute("lock table kb.chunks in access exclusive mode")  # the search waits

        async def cancel_while_waiting() -> None:
            task = asyncio.ensure_future(asearch(kb))
            deadline = time.monotonic() + 60
            while not _lock_waiters(kb.url):  # the search's statement is running, blocked
                assert not task.done(), task
                assert time.monotonic() < deadline, "the search never reached the database"
                await asyncio.sleep(0.05)
            task.cancel()
            # a guard against a hang, not a timing: without the cancel the statement would
            # wait for the lock until kbpg's lock timeout (2 minutes here)
            await asyncio.wait({task}, timeout=60)
            assert task.cancelled(), "cancelling the task did not end its SQL statement"

        asyncio.run(cancel_while_waiting())
        # the statement was cancelled while the lock is still held: nobody waits any more
        assert _lock_waiters(kb.url) == []
        locker.rollback()
        # the pool's one connection is back and usable
        assert [c.source for c in kb.search(VPN, top=1).chunks] == [
            c.source for c in samples_kb.search(VPN, top=1).chunks
        ]
