from __future__ import annotations


def test_conn_fixture_is_migrated(conn):
    row = conn.execute("select count(*) from kb.chunks").fetchone()
    assert row == (0,)


def test_db_url_fixture_is_migrated(db_url):
    from kbpg.store import db as kdb

    with kdb.connect(db_url) as c:
        assert kdb.schema_status(c).at_head
