"""--select in a run: each planned batch's candidates selected by the rank that generated (or
took from its journal) the batch, right after it, and journaled (select_rank_<k>.jsonl, one
fsynced line a batch, with the temp dir's token and the selection's signature), so that a resumed
run selects no batch again and a run resumed with another selection reuses the generation and
selects anew. A selection depends on its example's candidates alone (Selector's promise), and
the candidates on the batch plan alone, so the choices are the same at any world size.

A record then carries `selected` (the index in generation order) and `select_scores` (candidate
order); its `pred` stays in generation order for the output lines (outputs/write.output_lines),
and the rank file holds the selected candidate first (`best_first`), the prediction every
reader after generation takes as pred[0] (model metrics, the summary)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..run.journal import Journal
from ..run.tmpmarker import folder_token
from .candidates import CandidateSet
from .base import Selector
from .selectors import make_selector


def journal_path(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"select_rank_{rank}.jsonl"


def run_selector(cfg: Any, load: Callable[[str], Any] | None = None) -> Selector | None:
    """The run's checked selector (its check() before any generation), or None without --select.
    `load(name)`: the rank's one loaded model metric of that name, shared with --metrics."""
    if not cfg.selection:
        return None
    return make_selector(cfg.selection.select, cfg.selection.select_metric, dict(cfg.metric_options), load)


def rank_loader(cfg: Any, device: Any) -> Callable[..., Any]:
    """The rank's one loader of model metrics: each loaded at its first use, then the same object
    for the selector and for --metrics (called as model_scores' loader, whose arguments the run's
    own options and device stand for)."""
    from ..scoring import registry

    loaded: dict[str, Any] = {}

    def load(name: str, *_: Any) -> Any:
        if name not in loaded:
            loaded[name] = registry.load(name, dict(cfg.metric_options), device)
        return loaded[name]

    return load


class RunSelection:
    """One rank's selections in a run: those journaled before (by any rank), and this rank's journal."""

    def __init__(self, selector: Selector, tmp_dir: Path, rank: int) -> None:
        self.selector = selector
        self.signature = selector.signature()
        self.key = hashlib.sha256(self.signature.encode()).hexdigest()[:16]
        self.tmp_dir, self.rank = tmp_dir, rank
        self._journal: Journal | None = None
        self.done = self._journaled()
        self.resumed = 0

    def _journaled(self) -> dict[int, tuple[Path, int]]:
        """Where each batch's journaled selections are (its journal and the line's byte offset),
        not the selections: a resumed run of a million examples at N = 16 would otherwise hold
        16 million scores on every rank; this holds two small values a batch."""
        token = folder_token(self.tmp_dir)
        found: dict[int, tuple[Path, int]] = {}
        for path in sorted(self.tmp_dir.glob("select_rank_*.jsonl")):
            with open(path, "rb") as f:
                offset = 0
                for line in f:  # a line at a time, not the journal at once
                    at, offset = offset, offset + len(line)
                    if not line.endswith(b"\n"):
                        break  # a torn last line is not a batch
                    entry = _entry(line)
                    if entry is not None and entry.get("select") == self.key and entry.get("tmp") == token:
                        found.setdefault(int(entry["batch"]), (path, at))
        return found

    def apply(self, index: int, examples: Sequence[Any], records: list[dict[str, Any]]) -> None:
        """Batch `index`'s selections into its records, from the journal or made and journaled now."""
        where = self.done.get(index)
        chosen = _read_selections(*where) if where is not None else None
        if chosen is not None and len(chosen) == len(records):
            self.resumed += 1
        else:
            sets = [CandidateSet(e.id, e.source, tuple(r["pred"])) for e, r in zip(examples, records)]
            chosen = [[s.index, list(s.scores)] for s in self.selector.select(sets)]
            if self._journal is None:
                self._journal = Journal(journal_path(self.tmp_dir, self.rank))
            self._journal.append({"select": self.key, "batch": index, "selections": chosen})
        for record, (selected, scores) in zip(records, chosen):
            record["selected"], record["select_scores"] = selected, scores

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()


def _entry(line: bytes) -> dict[str, Any] | None:
    """A journal line's entry, or None for a line that is not one (a torn or foreign line)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    ok = isinstance(entry, dict) and isinstance(entry.get("selections"), list) and isinstance(entry.get("batch"), int)
    return entry if ok else None


def _read_selections(path: Path, at: int) -> list[Any] | None:
    """The selections journaled at byte `at` of `path` (read when the batch comes up)."""
    with open(path, "rb") as f:
        f.seek(at)
        entry = _entry(f.readline())
    return entry["selections"] if entry is not None else None


def chosen(record: Mapping[str, Any]) -> str:
    """The record's prediction: the selected candidate, or the one prediction of a run without --select."""
    pred = record["pred"]
    if "selected" in record:
        return pred[record["selected"]]
    return pred[0] if isinstance(pred, list) else pred


def best_first(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The record as the rank file holds it: the selected candidate first, the others after it
    in generation order, their scores with them (the rank file's `pred` is "candidates, best first")."""
    if "selected" not in record:
        return record
    k = record["selected"]
    out = dict(record)
    for key in ("pred", "scores"):
        if record.get(key) is not None:
            out[key] = [record[key][k], *record[key][:k], *record[key][k + 1:]]
    return out
