"""Text that is printed on one line: what every layer that shows a name needs."""

from __future__ import annotations

import re

__all__ = ["printable"]

# Characters that would let a file name (or a title, or a reason quoting either) forge a line,
# a column or a terminal escape when printed: C0/C1 controls, DEL, line/paragraph separators,
# bidirectional overrides, lone surrogates (undecodable bytes in a name).
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def printable(text: str) -> str:
    """`text` safe to print on one line: control and invisible characters escaped (`\\n`,
    `\\x1b`, `\\u202e`), so a name with a newline cannot forge a line of output."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(
        lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text
    )
