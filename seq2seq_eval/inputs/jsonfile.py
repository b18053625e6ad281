"""A local JSON Lines (or JSON array) file given as --dataset, read as --data_dir reads it.

The datasets JSON loader changes values: a column that mixes kinds of values (strings and
numbers, a text and a list of texts) becomes its `Json` type, which keeps a string that parses
as JSON as that JSON (the id "007" comes back as the number 7, "1e3" as 1000.0, 0 and "0" as one
id, a reference "42" as a number); an integer beyond 64 bits becomes a float; and such a file
with a blank line in it does not load at all. A --dataset run of a file would then write other
ids than a --data_dir run of the same file, and join nothing with it. So a local JSON file is read
here, line by line by --data_dir's reader (files.json_records), and only the choice of columns
(--source_column, the recognised layouts...) is --dataset's.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import DataError
from .examples import ExampleId
from .files import json_records

Slice = tuple[Callable[[str], list[Any]], list[Any]]
"""Consecutive rows: the values at a column path, row by row; and the rows' ids."""


def _is_array(path: Path) -> bool:
    """Whether the file holds one JSON array rather than one object per line."""
    with open(path, "rb") as f:
        head = f.read(4096).removeprefix(b"\xef\xbb\xbf")
    return head.lstrip().startswith(b"[")


def records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(0-based line number, record) for each non-blank line, read as --data_dir reads them
    (files.json_records); for a file holding one JSON array, (index, item) for each item (a text item is a
    record whose "text" is that text, as the datasets loader reads a list of texts)."""
    if _is_array(path):
        try:
            with open(path, encoding="utf-8-sig") as f:
                items = json.load(f)
        except (ValueError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: malformed JSON ({e}); expected one JSON array of objects, or one object per line") from e
        for i, item in enumerate(items):
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict):
                raise DataError(f"{path} item {i}: expected a JSON object, got {type(item).__name__}")
            yield i, item
        return
    for lineno, record in json_records(path):
        yield lineno - 1, record


def columns_of(record: dict[str, Any]) -> dict[str, Any]:
    """A record's columns, as inputs.columns reads a dataset's features: a dict value's keys
    nested under its column (`translation.en`), anything else a leaf (None)."""
    return {k: columns_of(v) if isinstance(v, dict) else None for k, v in record.items()}


def value_at(record: dict[str, Any], path: str, whole: bool) -> Any:
    """The value at a column path: the key `path` itself when `whole` (a column whose name has a
    dot), else its dotted parts; None where a key is missing, as in a dataset's row."""
    if whole:
        return record.get(path)
    value: Any = record
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _values(chunk: list[dict[str, Any]], columns: dict[str, Any], path: str) -> list[Any]:
    whole = path in columns
    return [value_at(record, path, whole) for record in chunk]


def json_slices(path: Path, n_obs: int | None, id_column: str | None, rows: int) -> tuple[dict[str, Any], Iterator[Slice]]:
    """The file's columns (its first record's) and its first `n_obs` records (all: None) in
    slices of `rows`. Ids: --id_column's values, else each record's "id", else its 0-based line
    number, as --data_dir numbers them."""
    stream = records(path)
    first = next(stream, None)
    if first is None:
        raise DataError(f"{path}: no records; expected one JSON object per line")
    columns = columns_of(first[1])

    def slices() -> Iterator[Slice]:
        taken = itertools.chain([first], stream)
        if n_obs is not None:
            taken = itertools.islice(taken, n_obs)
        while chunk := list(itertools.islice(taken, rows)):
            values = partial(_values, [r for _, r in chunk], columns)
            ids: list[ExampleId] = values(id_column) if id_column else [r.get("id", line) for line, r in chunk]
            yield values, ids

    return columns, slices()
