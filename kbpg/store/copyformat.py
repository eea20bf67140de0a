"""Values encoded for COPY in bulk: a batch's vectors and text arrays, byte for byte as psycopg's and pgvector's dumpers send them, for a fraction of their cost."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg.abc import Buffer
from psycopg.adapt import Dumper
from psycopg.pq import Format

# Measured on the writer's thread, whose time a load waits for: a chunk row took 15.7 us, of
# which 10 us went to pgvector's dumper (an array.array, a byteswap and a struct.pack a vector)
# and 4.7 us to psycopg's list dumper for `groups` and `labels`; a document row took 12.1 us.
_TEXT_OID = 25
_ARRAY_HEAD = struct.Struct("!IIIii")  # dimensions, has nulls, element oid, length, lower bound
_EMPTY_ARRAY = struct.pack("!III", 0, 0, _TEXT_OID)
_LENGTH = struct.Struct("!i")


class _Encoded(Dumper):
    """A value already in its binary form (bytes) as it is; anything else as the type's own
    dumper (`fallback`) dumps it."""

    format = Format.BINARY
    fallback: type[Dumper]

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self._fallback = self.fallback(cls, context)

    def dump(self, obj: Any) -> Buffer | None:
        return obj if isinstance(obj, bytes) else self._fallback.dump(obj)


def use_encoded(copy: Any, types: Sequence[str]) -> None:
    """Let `copy` (before its set_types) take values of `types` as encoded here. Only its cursor's
    adapters change (psycopg copies them from the connection's)."""
    adapters = copy.cursor.adapters
    for name in types:
        oid = adapters.types.get_oid(name)
        fallback = adapters.get_dumper_by_oid(oid, Format.BINARY)
        encoded = type(f"_Encoded_{oid}", (_Encoded,), {"oid": oid, "fallback": fallback})
        adapters.register_dumper(None, encoded)


def binary_vectors(vectors: np.ndarray[Any, Any]) -> list[bytes]:
    """Each row of a 2-D array as pgvector's binary `vector` (dimension, 0, big-endian float4s)."""
    rows, dimension = vectors.shape
    size = 4 + 4 * dimension
    encoded = np.empty((rows, size), dtype=np.uint8)
    encoded[:, :4] = np.frombuffer(struct.pack("!HH", dimension, 0), dtype=np.uint8)
    encoded[:, 4:] = np.ascontiguousarray(vectors, dtype=">f4").view(np.uint8)
    data = encoded.tobytes()
    return [data[start : start + size] for start in range(0, rows * size, size)]


def binary_text_array(items: Sequence[Any], encoding: str) -> bytes | list[Any]:
    """A one-dimensional text[] in PostgreSQL's binary array format; anything but strings is left
    to psycopg (returned as a list)."""
    if not items:
        return _EMPTY_ARRAY
    if not all(isinstance(item, str) for item in items):
        return list(items)
    parts = [_ARRAY_HEAD.pack(1, 0, _TEXT_OID, len(items), 1)]
    for item in items:
        data = item.encode(encoding)  # psycopg's str dumper raises the same on a lone surrogate
        parts += (_LENGTH.pack(len(data)), data)
    return b"".join(parts)


def text_array(items: Sequence[Any], encoding: str) -> str | list[Any]:
    """A text[] literal for COPY's text format (every element quoted); anything but strings, or
    a string the connection cannot encode, is left to psycopg (returned as a list), so that its
    errors stay word for word."""
    if not all(isinstance(item, str) for item in items):
        return list(items)
    quoted = (item.replace("\\", "\\\\").replace('"', '\\"') for item in items)
    literal = "{" + ",".join(f'"{item}"' for item in quoted) + "}"
    try:
        literal.encode(encoding)
    except UnicodeEncodeError:
        return list(items)
    return literal
