"""Login roles and a hand-built knowledge base with groups, for the access-control tests."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from kbpg.store import db as kdb
from tests.sqldata import add_chunk, add_doc, add_edge

PASSWORD = "kbpg-test-secret"
# one file per group folder: public (no group), hr, finance
FILES = {
    "public/parking.md": "# Parking permits\n\nRenew your parking permit online before it expires.\n",
    "hr/salary.md": "# Salary review\n\nSalary bands and the yearly pay review for staff.\n",
    "finance/budget.md": "# Budget\n\nThe budget forecast covers salary costs and parking.\n",
}


def write_files(root: Path) -> None:
    """FILES under root (root/public, root/hr, root/finance)."""
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def url_as(url: str, user: str) -> str:
    """The same database URL logging in as another role."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user)}:{PASSWORD}@{host}"))


@dataclass
class AccessKb:
    """A committed knowledge base: ids by name, login role names and their visible chunk ids."""

    url: str
    ids: dict[str, int]
    roles: dict[str, str]
    reader_role: str
    writer_role: str
    visible: dict[str, set[int]] = field(default_factory=dict)

    def connect(self, who: str, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection logged in as `who` (alice, bob, dave, walt) or the owner (`owner`)."""
        url = self.url if who == "owner" else url_as(self.url, self.roles[who])
        return kdb.connect(url, autocommit=True, **kwargs)


@contextlib.contextmanager
def login_roles(admin_url: str, names: list[str]) -> Iterator[dict[str, str]]:
    """Unique LOGIN roles for this test (cluster-wide objects: dropped afterwards)."""
    suffix = uuid.uuid4().hex[:8]
    roles = {name: f"kbt_{name}_{suffix}" for name in names}
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in roles.values():
            conn.execute(f"create role \"{role}\" login password '{PASSWORD}'")
        conn.execute(f'create role "kbt_team_{suffix}" nologin')
    roles["team"] = f"kbt_team_{suffix}"
    try:
        yield roles
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role in roles.values():
                conn.execute(f'drop role if exists "{role}"')


def build(url: str, roles: dict[str, str]) -> AccessKb:
    """Documents in groups hr / finance / both / none, 3-d embeddings, edges across groups.

    alice reads hr; bob reads finance through the NOLOGIN role `team` he belongs to; dave is a
    reader with no grants (public chunks only); walt is a writer (every group).
    """
    with kdb.connect(url, autocommit=True) as conn:
        reader, writer = conn.execute(
            "select reader_role, writer_role from kb.access_settings"
        ).fetchone() or ("", "")
        conn.execute("select kb.set_embedding_space('test-model', 3)")
        pub = add_doc(conn, "public.md")
        hr = add_doc(conn, "hr.md", groups=["hr"])
        fin = add_doc(conn, "finance.md", groups=["finance"])
        both = add_doc(conn, "both.md", groups=["hr", "finance"])
        n = {
            "pub": pub,
            "hr": hr,
            "fin": fin,
            "both": both,
            "P1": add_chunk(conn, pub, "renew your parking permit online", [1, 0, 0]),
            "H1": add_chunk(conn, hr, "parking permit for staff and salary rules", [0.9, 0.1, 0]),
            "H2": add_chunk(conn, hr, "salary bands and pay review", [0, 1, 0]),
            "F1": add_chunk(conn, fin, "parking permit budget for finance", [0.95, 0, 0.05]),
            "F2": add_chunk(conn, fin, "budget forecast and salary costs", [0, 0.9, 0.1]),
            "B1": add_chunk(conn, both, "permit memo shared by hr and finance", [0.8, 0.2, 0]),
        }
        add_edge(conn, n["P1"], n["F1"], 0.9)  # public -> finance
        add_edge(conn, n["F1"], n["H1"], 0.9)  # finance -> hr: alice must not walk through F1
        add_edge(conn, n["H1"], n["H2"], 0.8)
        add_edge(conn, n["P1"], n["B1"], 0.6)
        conn.execute("select * from kb.refresh_lexical_index()")
        conn.execute(f'grant "{reader}" to "{roles["alice"]}", "{roles["bob"]}", "{roles["dave"]}"')
        conn.execute(f'grant "{roles["team"]}" to "{roles["bob"]}"')
        conn.execute(f'grant "{writer}" to "{roles["walt"]}"')
        conn.execute("select * from kb.grant_groups(%s, array['hr'])", (roles["alice"],))
        conn.execute("select * from kb.grant_groups(%s, array['finance'])", (roles["team"],))
    chunks = {k: v for k, v in n.items() if k[0] in "PHFB" and k[1:].isdigit()}
    everything = set(chunks.values())
    visible = {
        "alice": {n["P1"], n["H1"], n["H2"], n["B1"]},
        "bob": {n["P1"], n["F1"], n["F2"], n["B1"]},
        "dave": {n["P1"]},
        "walt": everything,
        "owner": everything,
    }
    return AccessKb(url, n, roles, reader, writer, visible)
