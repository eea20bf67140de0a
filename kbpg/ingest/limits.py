"""Limits and cleaning: how big a file may be, what a document's strings and metadata may hold."""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kbpg.errors import IngestError

# A whole-file loader holds the file, its text and its chunks in memory at once (about 11x the
# file's size at peak, measured by benchmarks/bench_ingest_memory.py), so files are refused
# above this size; a JSONL file is read line by line and the limit applies to each line.
DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024
# Front matter and JSONL `metadata`, serialised as JSON, are refused above this size (a
# document's metadata is stored once per document and returned with every search hit).
MAX_METADATA_BYTES = 64 * 1024
MAX_METADATA_DEPTH = 32
# Binary content: a NUL byte in the first 8 KiB (git's and grep's test), or more than this
# share of control characters other than whitespace in the first 64 Ki characters.
BINARY_SNIFF_BYTES = 8192
CONTROL_SAMPLE = 65536
MAX_CONTROL_SHARE = 0.10
CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Free text PostgreSQL can store: NUL removed (PDF extraction and JSON `\\u0000` yield it),
    lone surrogates (from JSON escapes or a bad encoder) replaced by U+FFFD, length kept."""
    text = text.replace("\x00", "")
    return SURROGATE.sub("\ufffd", text) if SURROGATE.search(text) else text


def check_name(value: str, what: str, where: str) -> str:
    """A key or filter value (id, category, group, label, metadata key) is stored as given or
    refused: silently changing a group name would change who may read the document."""
    if "\x00" in value:
        raise IngestError(f"{where}: {what} {value[:40]!r} contains a NUL character")
    if SURROGATE.search(value):
        raise IngestError(f"{where}: {what} {value[:40]!r} contains a lone surrogate (not UTF-8)")
    return value


def check_filter_name(value: str, what: str, where: str) -> str:
    """A group, label or category: a name as check_name wants it, never blank. A blank group
    (`groups: [""]`) used to vanish, leaving the document public: a typo must never do that."""
    if not value.strip():
        raise IngestError(
            f"{where}: {what} {value!r} is blank; give a name (or leave it out: no groups is public)"
        )
    return check_name(value, what, where)


def check_not_binary(text: str, where: str) -> None:
    """Refuse text that is mostly control characters (a binary file with a text file's name)."""
    sample = text[:CONTROL_SAMPLE]
    controls = len(CONTROL.findall(sample))
    if controls > 8 and controls > len(sample) * MAX_CONTROL_SHARE:
        raise IngestError(
            f"{where}: binary content ({controls} control characters in the first "
            f"{len(sample)} characters), not text"
        )


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{size} bytes"


def too_large(size: str, max_bytes: int) -> str:
    return (
        f"{size}, over the {human_bytes(max_bytes)} limit "
        "(raise it with --max-file-size or KBPG_MAX_FILE_BYTES)"
    )


def read_limited(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, refused without reading it when it is over `max_bytes` (and never more
    than `max_bytes` + 1 bytes read, whatever its size claims)."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise IngestError(f"{path}: {too_large(human_bytes(size), max_bytes)}")
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise IngestError(f"{path}: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        raise IngestError(f"{path}: {too_large('larger than that', max_bytes)}")
    return data


def json_metadata(metadata: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Metadata as JSON PostgreSQL stores (jsonb): dates as ISO strings, free text cleaned;
    refused when a value has no JSON form (NaN, bytes, sets), when a key contains NUL, when
    nested deeper than 32 levels or over MAX_METADATA_BYTES serialised."""

    def convert(value: Any, at: str, depth: int) -> Any:
        if depth > MAX_METADATA_DEPTH:
            raise IngestError(f"{where}: metadata nested deeper than {MAX_METADATA_DEPTH} levels")
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise IngestError(f"{where}: metadata {at} is {value}, which JSON cannot store")
            return value
        if isinstance(value, str):
            return clean_text(value)
        if isinstance(value, datetime.date | datetime.time):
            return value.isoformat()
        if isinstance(value, list | tuple):
            return [convert(v, f"{at}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for k, v in value.items():
                key = check_name(str(k), "metadata key", where)
                out[key] = convert(v, f"{at}.{key}" if at else key, depth + 1)
            return out
        raise IngestError(
            f"{where}: metadata {at or 'value'} is a {type(value).__name__}, not a JSON value"
        )

    if not metadata:
        return {}  # nothing to convert or measure (4.5 us a record without metadata)
    converted: dict[str, Any] = convert(dict(metadata), "", 0)
    size = len(json.dumps(converted, ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise IngestError(
            f"{where}: metadata is {human_bytes(size)} as JSON, over the "
            f"{human_bytes(MAX_METADATA_BYTES)} cap"
        )
    return converted


@functools.cache
def yaml_loader() -> type[Any]:
    import yaml

    class NoAliasLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no stubs here
        """yaml.SafeLoader that refuses anchors and aliases: a few hundred bytes of nested
        aliases expand to gigabytes once the front matter becomes JSON ("billion laughs")."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise yaml.composer.ComposerError(
                    None, None, "anchors and aliases are not allowed", event.start_mark
                )
            return super().compose_node(parent, index)

    return NoAliasLoader
