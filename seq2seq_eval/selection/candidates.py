"""The candidates file `select` reads: JSON Lines of {id, source, candidates: [...]}, which is
also the shape of a pseudolabel run's `{type_path}_pseudolabels.jsonl` (its `target` and beam
`scores` are read past). Every record is checked before any candidate is scored, with errors
that name the file, the line, the field and what was expected."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..inputs.checks import check_id, check_text, duplicate_id, short, surrogate_at
from ..inputs.examples import ExampleId
from ..inputs.files import iter_lines, json_records_at
from ..inputs.seen import SeenIds

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


def _refuse_a_json_list(path: Path) -> None:
    """A file whose first line opens a JSON list (pseudolabel_results.json) is refused by name."""
    lines = iter_lines(path)
    try:
        a_list = next((text.lstrip().startswith("[") for _, text in lines if text.strip()), False)
    finally:
        lines.close()
    if a_list:
        raise DataError(f"{path}: a JSON list (pseudolabel_results.json's form); expected JSON Lines of "
                        "{id, source, candidates}, such as the {type_path}_pseudolabels.jsonl the same run wrote")


def iter_candidate_sets(path: Path, mode: str) -> Iterator[tuple[int, CandidateSet]]:
    """(line number, example) in file order, each checked (ids as a JSON Lines input's: a missing
    id is the line's index from 0)."""
    _refuse_a_json_list(path)
    for lineno, _, example in _sets_at(path, mode):
        yield lineno, example


def _sets_at(path: Path, mode: str, start: int = 0, first: int = 1) -> Iterator[tuple[int, int, CandidateSet]]:
    for lineno, at, record in json_records_at(path, start, first):
        ex_id = check_id(record.get("id", lineno - 1), lambda: f"{path} line {lineno} field 'id'")
        if "source" not in record:
            raise DataError(f"{path} line {lineno}: missing field 'source'; expected a non-empty string")
        source = check_text(record["source"], "source", lambda: f"{path} line {lineno} field 'source'")
        yield lineno, at, CandidateSet(ex_id, source, _candidates(record, path, lineno, mode))


def check_candidates_file(path: Path, mode: str) -> int:
    """Every record read and checked, ids unique; the number of examples. Before any scoring, so
    a bad line 90,000 is refused in seconds, not after an hour of work."""
    return index_candidates(path, mode, digest=False).examples


@dataclass(frozen=True)
class CandidateIndex:
    """A checked candidates file cut into batches of consecutive examples, what the ranks share
    (selection/ranks.py): where each batch's first record starts, so that a rank reads only the
    batches it selects; a rank's memory holds one batch's candidates, not the file's."""

    examples: int
    starts: tuple[tuple[int, int], ...]
    """Per batch: the byte offset and the line number of its first record."""
    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    """Per batch, what selecting it costs, about (the candidate pairs times their length): what
    the deal to the ranks balances, and nothing else."""
    digest: str
    """The sha256 of the file's bytes: a resumed selection reuses no journal of another file."""

    def batch(self, path: Path, mode: str, index: int) -> list[CandidateSet]:
        """Batch `index`'s examples, read from its first record on."""
        offset, lineno = self.starts[index]
        out = []
        for _, _, example in _sets_at(path, mode, offset, lineno):
            out.append(example)
            if len(out) == self.sizes[index]:
                break
        return out


def index_candidates(path: Path, mode: str, per_batch: int = 32, digest: bool = True) -> CandidateIndex:
    """check_candidates_file's checks, and the file's batches of `per_batch` examples. `digest`:
    the file's sha256 too (the ranks' resume key; one process streaming its lines keeps none, so
    it does not read the file a second time for it)."""
    seen = SeenIds()  # 8 bytes an id (inputs/seen.py); a suspected duplicate is confirmed below
    starts: list[tuple[int, int]] = []
    sizes: list[int] = []
    costs: list[float] = []
    n = 0
    _refuse_a_json_list(path)
    for lineno, at, example in _sets_at(path, mode):
        if seen.add(example.id):
            _first_duplicate(path, mode, lineno)
        if n % per_batch == 0:
            starts.append((at, lineno))
            sizes.append(0)
            costs.append(0.0)
        k = len(example.candidates)
        sizes[-1] += 1
        costs[-1] += float(k * k * (sum(map(len, example.candidates)) / k + 1))
        n += 1
    if seen.flush():
        _first_duplicate(path, mode, None)
    if not n:
        raise DataError(f"{path}: no records; expected one JSON object {{id, source, candidates}} per line")
    sha = ""
    if digest:
        with open(path, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
    return CandidateIndex(n, tuple(starts), tuple(sizes), tuple(costs), sha)


def _first_duplicate(path: Path, mode: str, upto: int | None) -> None:
    """The first id of lines 1..upto (all: None) that repeats an earlier one, as an error naming
    both lines; nothing when the suspicion was two ids sharing a hash (the rare path's dict)."""
    first: dict[ExampleId, int] = {}
    for lineno, _, example in _sets_at(path, mode):
        if upto is not None and lineno > upto:
            return
        earlier = first.setdefault(example.id, lineno)
        if earlier != lineno:
            raise duplicate_id(f"{path} line {lineno} field 'id'", example.id, f"on line {earlier}")
