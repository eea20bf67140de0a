"""kbpg's own SQLSTATEs (class KB) map to their KbpgError by code, whatever the message says."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kbpg.errors import (
    EmbeddingSpaceMismatch,
    InvalidInput,
    KbpgError,
    QueryTooLarge,
    from_psycopg,
)


def raised(conn: psycopg.Connection[Any], sqlstate: str, message: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute(
            "do $$ begin raise exception '%' , $m$"
            + message
            + "$m$ using errcode = '"
            + sqlstate
            + "', hint = 'do this'; end $$"
        )
    return info.value


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [
        ("KB001", EmbeddingSpaceMismatch),
        ("KB002", EmbeddingSpaceMismatch),
        ("KB003", QueryTooLarge),
        ("22023", InvalidInput),
    ],
)
def test_mapped_by_code_with_the_hint(conn, sqlstate, expected):
    error = from_psycopg(raised(conn, sqlstate, "a message naming nothing in particular"))
    assert type(error) is expected
    assert error.message == "a message naming nothing in particular"
    assert error.hint == "do this"


def test_message_text_alone_maps_nothing(conn):
    error = from_psycopg(raised(conn, "P0001", "embedding space mismatch"))
    assert type(error) is KbpgError


def test_query_too_large_is_invalid_input():
    assert issubclass(QueryTooLarge, InvalidInput)
