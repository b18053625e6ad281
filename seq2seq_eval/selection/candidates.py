"""The candidates file `select` reads: JSON Lines of {id, source, candidates: [...]}, which is
also the shape of a pseudolabel run's `{type_path}_pseudolabels.jsonl` (its `target` and beam
`scores` are read past). Every record is checked before any candidate is scored, with errors
that name the file, the line, the field and what was expected."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..inputs.checks import check_id, check_text, duplicate_id, short, surrogate_at
from ..inputs.examples import ExampleId
from ..inputs.files import iter_lines, json_records

MIN_CANDIDATES = 2
"""Fewer leaves nothing to choose between (and one candidate's MBR is itself against itself)."""


@dataclass(frozen=True)
class CandidateSet:
    """One example: its id, its source and its N candidates in the order they were made."""

    id: ExampleId
    source: str
    candidates: tuple[str, ...]


def _candidates(record: dict[str, Any], path: Path, lineno: int, mode: str) -> tuple[str, ...]:
    where = f"{path} line {lineno} field 'candidates'"
    if "candidates" not in record:
        hint = " (a pseudolabel_results.json record's 'preds': pass the run's _pseudolabels.jsonl)" if "preds" in record else ""
        raise DataError(f"{path} line {lineno}: missing field 'candidates'{hint}; expected a list of "
                        f"{MIN_CANDIDATES} or more candidate strings")
    value = record["candidates"]
    if not isinstance(value, list):
        raise DataError(f"{where}: expected a list of {MIN_CANDIDATES} or more candidate strings, got {short(value)}")
    if len(value) < MIN_CANDIDATES:
        raise DataError(f"{where}: {len(value)} candidate{'s' * (len(value) != 1)}; --select {mode} needs "
                        f"{MIN_CANDIDATES} or more per example")
    for k, item in enumerate(value):
        # A candidate is a model's output, not an input: an empty one is a real (if poor) output
        # and is scored as such; only what cannot be text is refused.
        if not isinstance(item, str):
            raise DataError(f"{where} item {k}: expected a string, got {short(item)}")
        if (at := surrogate_at(item)) is not None:
            raise DataError(f"{where} item {k}: holds a lone surrogate (U+{ord(item[at]):04X} at character {at}), "
                            "which is not a Unicode character; expected text UTF-8 can encode")
    return tuple(value)


def _first_line_is_a_list(path: Path) -> bool:
    lines = iter_lines(path)
    try:
        return next((text.lstrip().startswith("[") for _, text in lines if text.strip()), False)
    finally:
        lines.close()


def iter_candidate_sets(path: Path, mode: str) -> Iterator[tuple[int, CandidateSet]]:
    """(line number, example) in file order, each checked (ids as a JSON Lines input's: a missing
    id is the line's index from 0)."""
    if _first_line_is_a_list(path):
        raise DataError(f"{path}: a JSON list (pseudolabel_results.json's form); expected JSON Lines of "
                        "{id, source, candidates}, such as the {type_path}_pseudolabels.jsonl the same run wrote")
    for lineno, record in json_records(path):
        ex_id = check_id(record.get("id", lineno - 1), lambda: f"{path} line {lineno} field 'id'")
        if "source" not in record:
            raise DataError(f"{path} line {lineno}: missing field 'source'; expected a non-empty string")
        source = check_text(record["source"], "source", lambda: f"{path} line {lineno} field 'source'")
        yield lineno, CandidateSet(ex_id, source, _candidates(record, path, lineno, mode))


def check_candidates_file(path: Path, mode: str) -> int:
    """Every record read and checked, ids unique; the number of examples. Before any scoring, so
    a bad line 90,000 is refused in seconds, not after an hour of work."""
    first: dict[ExampleId, int] = {}
    n = 0
    for n, (lineno, example) in enumerate(iter_candidate_sets(path, mode), start=1):
        earlier = first.setdefault(example.id, lineno)
        if earlier != lineno:
            raise duplicate_id(f"{path} line {lineno} field 'id'", example.id, f"on line {earlier}")
    if not n:
        raise DataError(f"{path}: no records; expected one JSON object {{id, source, candidates}} per line")
    return n
