"""kbpg.copyformat against psycopg's and pgvector's own dumpers, and through a real COPY."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import Format

from kbpg.store.copyformat import binary_text_array, binary_vectors, text_array, use_encoded

ARRAYS = [
    [],
    ["g1"],
    ["a", "b"],
    ["", "NULL", "null", "a b", " lead", "trail ", "a,b", "{x}", 'say "hi"', "back\\slash"],
    ["tab\tnew\nline", "caf\u00e9", "\u4e2d\u6587", "emoji \U0001f600", "\\N", "\\\\"],
]


def dumped(conn: psycopg.Connection[Any], type_name: str, value: Any) -> bytes:
    """What psycopg (with pgvector registered by kbpg.db) sends for `value` as `type_name` in a
    binary COPY after set_types."""
    tx = Transformer(conn)
    tx.set_dumper_types([conn.adapters.types.get_oid(type_name)], Format.BINARY)
    (data,) = tx.dump_sequence([value], [PyFormat.BINARY])
    assert data is not None
    return bytes(data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_vectors_are_pgvectors_bytes(conn: psycopg.Connection[Any], dtype: Any) -> None:
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(7, 384)).astype(dtype)
    vectors[0, :4] = [0.0, -0.0, 1e-45, 3.4e38]
    vectors[1] *= 1e-30
    encoded = binary_vectors(vectors)
    assert len(encoded) == 7
    assert encoded == [dumped(conn, "vector", row) for row in vectors]
    assert binary_vectors(np.zeros((0, 384), np.float32)) == []


def test_binary_text_arrays_are_psycopgs_bytes(conn: psycopg.Connection[Any]) -> None:
    for items in ARRAYS[1:]:  # psycopg sends [] as a 0-dimensional array too; checked below
        assert binary_text_array(items, "utf-8") == dumped(conn, "text[]", items), items
    assert binary_text_array([], "utf-8") == dumped(conn, "text[]", [])
    assert binary_text_array([1, "a"], "utf-8") == [1, "a"]  # left to psycopg
    with pytest.raises(UnicodeEncodeError) as ours:
        binary_text_array(["ok", "lone \udc80"], "utf-8")
    with pytest.raises(UnicodeEncodeError) as theirs:
        dumped(conn, "text[]", ["ok", "lone \udc80"])
    assert str(ours.value) == str(theirs.value)


def test_encoded_values_copy_in_as_psycopg_would_copy_them(
    conn: psycopg.Connection[Any],
) -> None:
    """The same rows COPYed in binary (encoded here / left to psycopg) and in text (literal /
    list) read back identically."""
    conn.execute(
        "create temp table t (n int, tags text[], embedding vector, fmt text) on commit drop"
    )
    vectors = np.random.default_rng(5).normal(size=(len(ARRAYS), 8)).astype(np.float32)
    encoded = binary_vectors(vectors)
    copy_binary = "copy t (n, tags, embedding, fmt) from stdin (format binary)"
    with conn.cursor() as cur, cur.copy(copy_binary) as copy:
        use_encoded(copy, ("vector", "text[]"))
        copy.set_types(["int4", "text[]", "vector", "text"])
        for n, items in enumerate(ARRAYS):
            copy.write_row((n, binary_text_array(items, "utf-8"), encoded[n], "ours"))
    with conn.cursor() as cur:
        with cur.copy("copy t (n, tags, embedding, fmt) from stdin (format binary)") as copy:
            copy.set_types(["int4", "text[]", "vector", "text"])
            for n, items in enumerate(ARRAYS):
                copy.write_row((n, items, vectors[n], "psycopg"))
        with cur.copy("copy t (n, tags, fmt) from stdin") as copy:
            for n, items in enumerate(ARRAYS):
                copy.write_row((n, text_array(items, "utf-8"), "literal"))
                copy.write_row((n, items, "list"))
    read = conn.execute("select fmt, n, tags, embedding::text from t order by fmt, n").fetchall()
    by_format: dict[str, list[tuple[Any, ...]]] = {}
    for fmt, n, tags, embedding in read:
        by_format.setdefault(fmt, []).append((n, tags, embedding))
    assert [tags for _, tags, _ in by_format["ours"]] == ARRAYS
    assert by_format["ours"] == by_format["psycopg"]
    assert by_format["literal"] == by_format["list"]
    assert [tags for _, tags, _ in by_format["literal"]] == ARRAYS


def test_what_is_not_encoded_is_dumped_by_psycopg(conn: psycopg.Connection[Any]) -> None:
    """A list left to psycopg (not all strings) fails with psycopg's own error."""
    errors = []
    for encoded in (True, False):
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            with pytest.raises(TypeError) as raised:  # noqa: SIM117 (the COPY raises, not `with`)
                with cur.copy("copy kb_data.chunks (labels) from stdin (format binary)") as copy:
                    if encoded:
                        use_encoded(copy, ("text[]",))
                    copy.set_types(["text[]"])
                    copy.write_row((binary_text_array([1, 2], "utf-8"),))
            errors.append(str(raised.value))
    assert errors[0] == errors[1] == "bad argument type for built-in operation"


def test_text_array_leaves_what_it_cannot_write_to_psycopg() -> None:
    assert text_array([], "utf-8") == "{}"
    assert text_array(['a"b', "c\\d"], "utf-8") == '{"a\\"b","c\\\\d"}'
    assert text_array([1, 2], "utf-8") == [1, 2]
    assert text_array(["lone \udc80"], "utf-8") == ["lone \udc80"]
    assert text_array(["caf\u00e9"], "latin-1") == '{"caf\u00e9"}'
    assert text_array(["\u4e2d"], "latin-1") == ["\u4e2d"]
