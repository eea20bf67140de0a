"""JSONL records: one Document per line, streamed; a bad line fails alone (`path:line`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import orjson

from kbpg.errors import IngestError
from kbpg.ingest.document import Document, LoadFailure, category_of, failure_of, string_list
from kbpg.ingest.limits import (
    DEFAULT_MAX_FILE_BYTES,
    check_name,
    check_not_binary,
    clean_text,
    json_metadata,
    too_large,
)

# orjson reads an integer past 64 bits as a float (json keeps it exact): a record holding a
# number that large is parsed again by json. Checked on the parsed values, where a 384-number
# list costs one math.hypot (a regex over the line's digits cost more than the parse).
_BIG = float(2**63)
# A line of 384 numbers is ~4 kB: with the default 8 kB buffer every other line straddled two
# reads (readline 3-5 us a line; 1-1.4 us with 64 kB)
_READ_BUFFER = 1 << 16


def _holds_huge_number(value: Any) -> bool:
    if isinstance(value, float):
        return not -_BIG < value < _BIG
    if isinstance(value, list):
        try:
            return not math.hypot(*value) < _BIG  # all numbers: one C loop, |x| <= hypot
        except (TypeError, OverflowError):
            return any(map(_holds_huge_number, value))
    if isinstance(value, dict):
        return any(map(_holds_huge_number, value.values()))
    return False


def parse_record(raw: bytes) -> Any:
    """One JSONL line parsed as json.loads parses it (NaN, lone surrogates, a BOM and their
    errors included): orjson first, 6x faster on a line of 384 floats, and json where orjson
    refuses the line or could have read it differently."""
    try:
        record = orjson.loads(raw)
        if not _holds_huge_number(record):
            return record
    except (orjson.JSONDecodeError, RecursionError):
        pass
    return json.loads(raw)


def document_from_record(record: Any, where: str) -> Document:
    """A Document from a JSON object: id (or _id), title, text, category, groups, labels, metadata,
    and optionally a precomputed `embedding` (the record is then stored as one chunk).

    Free text (text, title, metadata values) is cleaned of what PostgreSQL cannot store; keys
    and filter values (id, category, groups, labels, metadata keys) are refused instead.
    """
    if not isinstance(record, dict):
        raise IngestError(f"{where}: expected a JSON object")
    ident = record.get("id", record.get("_id"))
    if ident is None or str(ident).strip() == "":
        raise IngestError(f"{where}: missing `id`")
    if not isinstance(ident, str | int) or isinstance(ident, bool):
        raise IngestError(f"{where}: `id` must be a string or an integer")
    text = record.get("text")
    if not isinstance(text, str):
        raise IngestError(f"{where}: `text` must be a string")
    title = record.get("title") or ""
    metadata = record.get("metadata") or {}
    if not isinstance(title, str) or not isinstance(metadata, dict):
        raise IngestError(f"{where}: `title` must be a string and `metadata` an object")
    check_not_binary(text, where)
    embedding = _embedding(record.get("embedding"), where)
    return Document(
        source=check_name(str(ident), "`id`", where),
        title=clean_text(title.strip()),
        text=clean_text(text),
        category=category_of(record.get("category"), where),
        groups=string_list(record.get("groups"), "groups", where),
        labels=string_list(record.get("labels"), "labels", where),
        metadata=json_metadata(metadata, where),
        embedding=embedding,
        origin=where,
    )


def _embedding(value: Any, where: str) -> npt.NDArray[np.float32] | None:
    """A precomputed embedding: a non-empty flat list of finite numbers (its dimension is checked
    against the knowledge base's embedding space at ingest). Checked by numpy: a per-number
    Python loop cost 1.4 ms a 384-d record, more than the rest of the load."""
    if value is None:
        return None
    vector = np.asarray(value) if isinstance(value, list) else None
    if vector is None or vector.ndim != 1 or vector.size == 0 or vector.dtype.kind not in "iuf":
        raise IngestError(f"{where}: `embedding` must be a non-empty list of numbers")
    if not np.isfinite(vector).all():
        raise IngestError(f"{where}: `embedding` holds NaN or infinity")
    return vector.astype(np.float32)


def _lines(handle: IO[bytes], max_bytes: int) -> Iterator[bytes | None]:
    """The file's lines, read one at a time; a line over `max_bytes` is skipped unread (None)."""
    while raw := handle.readline(max_bytes + 1):
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield raw


def iter_jsonl(
    path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> Iterator[Document | LoadFailure]:
    """One Document per line, streamed; a bad line becomes a LoadFailure (`path:line`) and
    reading goes on. `max_bytes` bounds each line, not the file."""
    try:
        handle = path.open("rb", buffering=_READ_BUFFER)
    except OSError as exc:
        yield LoadFailure(str(path), exc.strerror or str(exc))
        return
    with handle:
        for number, raw in enumerate(_lines(handle, max_bytes), start=1):
            where = f"{path}:{number}"
            if raw is None:
                yield LoadFailure(where, too_large("line is longer than that", max_bytes))
                continue
            if not raw.strip():
                continue
            try:
                record = parse_record(raw)  # NaN/Infinity: refused where they land
                document = document_from_record(record, where)
            except Exception as exc:
                yield failure_of(exc, where, record=True)
                continue
            yield document
