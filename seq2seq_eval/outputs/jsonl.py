"""One JSON value per line, whichever way a reader splits the lines.

JSON escapes every control character below U+0020 inside a string, so of the characters
Python's str.splitlines() ends a line at (\\n, \\r, \\x0b, \\x0c, \\x1c, \\x1d, \\x1e, \\x85,
U+2028, U+2029) only three can appear raw in JSON text written with ensure_ascii=False: U+0085,
U+2028 and U+2029. A text holding one would make a `splitlines()` reader (and JavaScript before
ES2019) see two broken lines where the file has one record. They are written as \\u escapes
here, which json.loads reads back as the same characters; text without them is encoded exactly
as json.dumps(value, ensure_ascii=False) encodes it.
"""

from __future__ import annotations

import json
from typing import Any

LINE_BREAKS_JSON_KEEPS = "\x85\u2028\u2029"
"""The characters str.splitlines() splits on that JSON leaves unescaped."""

_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in LINE_BREAKS_JSON_KEEPS}

# One encoder for every record: json.dumps builds a new JSONEncoder per call when given options,
# a fifth of rank 0's tail on a million pseudolabels.
encode = json.JSONEncoder(ensure_ascii=False).encode


def encode_line(value: Any) -> str:
    """`value` as JSON text with no character any line splitter ends a line at (no newline added)."""
    text = encode(value)
    # Most text is ASCII (one C pass); the rest is scanned for the three before any copy.
    if text.isascii() or not any(c in text for c in LINE_BREAKS_JSON_KEEPS):
        return text
    return text.translate(_ESCAPES)
