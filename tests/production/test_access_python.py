"""Access control through the Python API: KnowledgeBase / Retriever calls with a Principal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from kbpg import Retriever
from kbpg.app import Principal
from kbpg.errors import PermissionDenied
from kbpg.ingest.run import ingest_paths
from kbpg.store import access as kaccess
from tests.accessdata import login_roles, write_files

if TYPE_CHECKING:
    from kbpg.models.embedders import Embedder

QUERY = "salary parking budget permit review"


@pytest.fixture
def kb(
    admin_url: str, db_url: str, embedder: Embedder, tmp_path: Path
) -> Iterator[tuple[Retriever, dict[str, Principal]]]:
    """The owner's Retriever over public / hr / finance files, and principals for two readers
    (alice: hr, bob: finance) and a writer (walt)."""
    write_files(tmp_path)
    with (
        login_roles(admin_url, ["alice", "bob", "walt"]) as roles,
        Retriever(db_url, embedder=embedder, pool_size=2) as retriever,
    ):
        for folder, groups in (("public", ()), ("hr", ("hr",)), ("finance", ("finance",))):
            ingest_paths(retriever.db, retriever.models, [tmp_path / folder], groups=groups)
        with psycopg.connect(db_url, autocommit=True) as conn:
            reader, writer = conn.execute(
                "select reader_role, writer_role from kb.access_settings"
            ).fetchone() or ("", "")
            conn.execute(f'grant "{reader}" to "{roles["alice"]}", "{roles["bob"]}"')
            conn.execute(f'grant "{writer}" to "{roles["walt"]}"')
        kaccess.grant(retriever.db, roles["alice"], ["hr"])
        kaccess.grant(retriever.db, roles["bob"], ["finance"])
        yield retriever, {name: Principal(role) for name, role in roles.items()}


def files(result: Any) -> set[str]:
    return {Path(c.source).name for c in result.chunks}


def test_each_principal_sees_its_groups(kb: tuple[Retriever, dict[str, Principal]]) -> None:
    retriever, who = kb
    everything = {"parking.md", "salary.md", "budget.md"}
    assert files(retriever.search(QUERY, top=10, principal=who["alice"])) == everything
    status = kaccess.set_enforced(retriever.db, True)
    assert status.enforced and status.tables_enforced == status.tables_total == 4

    alice = retriever.search(QUERY, top=10, principal=who["alice"])
    assert files(alice) == {"parking.md", "salary.md"}
    assert "budget forecast" not in alice.context
    assert {Path(s.source).name for s in alice.sources} == {"parking.md", "salary.md"}
    assert files(retriever.search(QUERY, top=10, principal=who["bob"])) == {
        "parking.md",
        "budget.md",
    }
    assert files(retriever.search(QUERY, top=10)) == everything  # the owner
    # a group the principal may not read: nothing from it, no error
    assert retriever.search(QUERY, top=10, groups=["finance"], principal=who["alice"]).chunks == ()

    assert kaccess.status(retriever.db, who["alice"]).visible_groups == ["hr"]
    assert kaccess.list_grants(retriever.db, principal=who["alice"]) == [
        kaccess.Grant(
            who["alice"].role or "", "hr", kaccess.list_grants(retriever.db)[0].granted_at
        )
    ]

    kaccess.revoke(retriever.db, who["alice"].role or "", ["hr"])
    assert files(retriever.search(QUERY, top=10, principal=who["alice"])) == {"parking.md"}


def test_writer_principal_ingests_and_sees_every_group(
    kb: tuple[Retriever, dict[str, Principal]], tmp_path: Path
) -> None:
    retriever, who = kb
    kaccess.set_enforced(retriever.db, True)
    legal = tmp_path / "legal"
    legal.mkdir()
    (legal / "contract.md").write_text(
        "# Contract\n\nThe parking contract and its salary clause.\n"
    )
    ingest_paths(retriever.db, retriever.models, [legal], groups=["legal"], principal=who["walt"])
    seen = files(retriever.search(QUERY + " contract", top=10, principal=who["walt"]))
    assert seen == {"parking.md", "salary.md", "budget.md", "contract.md"}
    assert "contract.md" not in files(
        retriever.search(QUERY + " contract", top=10, principal=who["alice"])
    )


def test_writer_principal_ingests_a_document_larger_than_a_slice(
    kb: tuple[Retriever, dict[str, Principal]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under row-level security a large document's slices still go through a stage (COPY is
    refused there) and into kb.chunks by an INSERT the policies check."""
    from kbpg.ingest import run as ingest
    from kbpg.ingest.run import Document, ingest_documents
    from tests.ingest.test_ingest_loaders import long_text

    monkeypatch.setattr(ingest, "SLICE_CHUNKS", 4)
    retriever, who = kb
    kaccess.set_enforced(retriever.db, True)
    text = long_text(1200) + "\n\nZebra clause."
    handbook = Document(source="handbook.md", title="Handbook", text=text, groups=["legal"])
    summary = ingest_documents(retriever.db, retriever.models, [handbook], principal=who["walt"])
    assert (summary.added, summary.failed) == (1, 0)
    assert summary.chunks > 8
    with psycopg.connect(retriever.url) as conn:
        stored = conn.execute(
            "select count(*), count(distinct e.src_chunk_id) from kb.chunks c"
            " join kb.documents d on d.id = c.document_id"
            " left join kb.edges e on e.src_chunk_id = c.id and e.relation = 'next'"
            " where d.source = 'handbook.md'"
        ).fetchone()
    assert stored == (summary.chunks, summary.chunks - 1)
    hits = retriever.search("zebra clause", top=3, principal=who["walt"])
    assert hits.chunks[0].source == "handbook.md"


def test_writer_principal_loads_a_collection_larger_than_the_knowledge_base(
    kb: tuple[Retriever, dict[str, Principal]], tmp_path: Path
) -> None:
    """A load that at least doubles the knowledge base drops the HNSW index to build it after
    the rows, but only the table's owner may drop or build it: a writer role loads with the
    index kept (it failed with "must be owner of index chunks_embedding_hnsw")."""
    from tests.ingest.test_ingest_loaders import long_text

    retriever, who = kb
    kaccess.set_enforced(retriever.db, True)
    bulk = tmp_path / "bulk"
    bulk.mkdir()
    for i in range(6):
        (bulk / f"part{i}.md").write_text(f"# Part {i}\n\n" + long_text(900) + f" walrus{i}\n")
    summary = ingest_paths(
        retriever.db, retriever.models, [bulk], groups=["legal"], principal=who["walt"]
    )
    assert (summary.added, summary.failed) == (6, 0)
    with psycopg.connect(retriever.url) as conn:
        counts = conn.execute(
            "select count(*) filter (where d.source like %s), count(*) from kb.chunks c"
            " join kb.documents d on d.id = c.document_id",
            (str(bulk) + "%",),
        ).fetchone()
        index = conn.execute("select to_regclass('kb_data.chunks_embedding_hnsw')").fetchone()
    assert counts is not None and counts[0] == summary.chunks and 2 * counts[0] > counts[1]
    assert index == ("kb_data.chunks_embedding_hnsw",)
    hits = retriever.search("walrus3", top=3, principal=who["walt"])
    assert Path(hits.chunks[0].source).name == "part3.md"


def test_readers_get_permission_errors_with_a_hint(
    kb: tuple[Retriever, dict[str, Principal]],
) -> None:
    retriever, who = kb
    with pytest.raises(PermissionDenied) as info:
        kaccess.set_enforced(retriever.db, True, principal=who["alice"])
    assert info.value.hint and "owner of the kb tables" in info.value.hint
    with pytest.raises(PermissionDenied) as info:
        kaccess.grant(retriever.db, who["alice"].role or "", ["finance"], principal=who["alice"])
    assert info.value.hint == kaccess._GRANT_HINT


def test_a_role_the_login_may_not_use_says_which_grant_is_missing(
    kb: tuple[Retriever, dict[str, Principal]], db_url: str, embedder: Embedder
) -> None:
    """SET ROLE refused (the login role is not a member): the error names the grant the
    operator must run, not the reader role (the HTTP 403 said `grant kbpg_reader` here)."""
    from kbpg.errors import RoleUnavailable
    from tests.accessdata import url_as

    _, who = kb
    alice, bob = who["alice"].role or "", who["bob"].role or ""
    with Retriever(url_as(db_url, alice), embedder=embedder, pool_size=1) as as_alice:
        with pytest.raises(RoleUnavailable) as info:
            as_alice.search(QUERY, principal=who["bob"])
        assert info.value.message == f"login role {alice!r} may not act as role {bob!r}"
        assert info.value.hint is not None and f'grant "{bob}" to "{alice}"' in info.value.hint
        with pytest.raises(RoleUnavailable, match="does not exist"):
            as_alice.search(QUERY, principal=Principal("kbt_no_such_role_at_all"))
        assert as_alice.search(QUERY, top=3).chunks  # its own role still searches
