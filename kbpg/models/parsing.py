"""Reading JSON arrays out of chat-model answers, however they are wrapped."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from kbpg.errors import ModelError

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*(.*?)```", re.DOTALL)


def parse_json_array(text: str) -> list[Any]:
    """The first JSON array in a model's answer.

    Tolerates prose before and after it, Markdown code fences, and an object holding exactly
    one array (`{"ranking": [...]}`, what JSON modes tend to produce). A ModelError when the
    answer holds no array at all.
    """
    if not isinstance(text, str):
        raise ModelError(f"the model answered {type(text).__name__}, not text")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for match in re.finditer(r"[\[{]", candidate):
            try:
                value, _ = decoder.raw_decode(candidate, match.start())
            except ValueError:
                continue
            if isinstance(value, list):
                return value
            if isinstance(value, dict):
                lists = [v for v in value.values() if isinstance(v, list)]
                if len(lists) == 1:
                    return lists[0]
    preview = " ".join(text.split())[:120]
    raise ModelError(f"the model's answer holds no JSON array: {preview!r}")


def as_positions(values: Sequence[Any], count: int, *, base: int = 1) -> list[int]:
    """0-based positions from a model's list of `base`-based numbers, in the model's order.

    Numbers may come as ints, integral floats or strings ("3", "[3]", "passage 3");
    anything else, numbers outside 1..count, and repeats are dropped.
    """
    seen: set[int] = set()
    positions: list[int] = []
    for value in values:
        number: int | None = None
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            digits = re.findall(r"\d+", value)
            if len(digits) == 1:
                number = int(digits[0])
        if number is None:
            continue
        position = number - base
        if 0 <= position < count and position not in seen:
            seen.add(position)
            positions.append(position)
    return positions


def fill_order(positions: Sequence[int], count: int) -> list[int]:
    """`positions` followed by every other position 0..count-1 in its original order."""
    given = set(positions)
    return [*positions, *(i for i in range(count) if i not in given)]
