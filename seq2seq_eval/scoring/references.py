"""References given as Python lists, read one way by `score`, `evaluate` and `compare`.

Two layouts exist in the wild: one entry per example (a text, or a list of texts: what
`evaluate` and the JSON Lines files take) and reference streams (a list of lists, each aligned
with the predictions: what sacrebleu takes). Most inputs can only be one of them; a list of
N lists of N texts each (N >= 2) can be both, and the two readings give different scores.
That one is refused unless `reference_layout` says which it is: a wrong number that looks
right is worse than a one-line error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, DataError
from ..inputs.checks import check_texts

LAYOUTS = ("examples", "streams")
"""reference_layout's values: one entry per example, or sacrebleu's reference streams."""


def per_example(references: Any, n: int, layout: str | None = None, what: str = "predictions") -> list[list[str]]:
    """`references` as one list of texts per example (`n` examples), read in `layout`
    ("examples", "streams", or None: whichever the shape allows; both: refused unless
    they agree). Every text is a non-empty str; a DataError says where, otherwise."""
    if layout is not None and layout not in LAYOUTS:
        raise ConfigError(f"reference_layout must be one of {', '.join(LAYOUTS)} (or None), got {layout!r}")
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise DataError(f"references: expected a list of texts, of lists of texts or of reference streams, "
                        f"got {type(references).__name__}")
    items = list(references)
    if not items:
        raise DataError(f"references: empty; expected references for {n} {what}")
    for i, r in enumerate(items):
        if not isinstance(r, str) and (not isinstance(r, Sequence) or any(not isinstance(t, str) for t in r)):
            raise DataError(f"references[{i}]: expected a non-empty string or a list of them, got {_kind(r)}")
    lists = not any(isinstance(r, str) for r in items)
    as_examples = len(items) == n
    as_streams = lists and all(len(r) == n for r in items)
    if layout is None:
        if as_examples and as_streams and n > 1 and _rows(items) != _transpose(items, n):
            raise DataError(
                f"references: {n} lists of {n} texts can be one list per example or {n} reference streams, "
                f"and the two give different scores; pass reference_layout='examples' or 'streams'")
        layout = "examples" if as_examples else "streams" if as_streams else None
        if layout is None:
            raise DataError(
                f"references: {len(items)} entries for {n} {what}; expected one text (or list of texts) per "
                f"{what.rstrip('s')}, or reference streams of {n} texts each")
    if layout == "examples":
        if not as_examples:
            raise DataError(f"references: {len(items)} entries but {n} {what}; expected one text (or list of texts) "
                            f"per {what.rstrip('s')} (reference_layout='examples')")
        rows, where = _rows(items), "references[{i}][{j}]"
    else:
        for k, r in enumerate(items):
            if isinstance(r, str) or len(r) != n:
                got = "a text" if isinstance(r, str) else f"{len(r)} texts"
                raise DataError(f"references[{k}]: {got} but {n} {what}; a reference stream has one text per "
                                f"{what.rstrip('s')} (reference_layout='streams')")
        rows, where = _transpose(items, n), "references[{j}][{i}]"
    for i, row in enumerate(rows):
        if not row:
            raise DataError(f"references[{i}]: an empty list; expected one or more references")
        check_texts(row, "reference", lambda j: where.format(i=i, j=j))
    return rows


def _kind(value: Any) -> str:
    if isinstance(value, Sequence) and not isinstance(value, str):
        bad = next(t for t in value if not isinstance(t, str))
        return f"a list holding {type(bad).__name__}"
    return type(value).__name__


def _rows(items: list[Any]) -> list[list[str]]:
    return [[r] if isinstance(r, str) else list(r) for r in items]


def _transpose(items: list[Any], n: int) -> list[list[str]]:
    return [[stream[i] for stream in items] for i in range(n)]
