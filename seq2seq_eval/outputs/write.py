"""The output files, streamed in data order: each example's lines are serialized by the rank that
generated it (output_lines, stored in its rank file) and rank 0 concatenates them, adding up the
metrics as it goes (write_outputs)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import AdoptedFile, AtomicFile, dumps, write_atomic
from ..config import EvalConfig
from ..errors import OutputError
from ..inputs.examples import Example
from .jsonl import encode_line
from ..scoring.totals import MetricTotals
from .locations import (
    _one_line,
    planned_outputs,
    stale_outputs,
)
from .parts import Parts, add_scores, complete, concatenated, legacy_ends, scores_of
from .record import OutputRecord
from .shuffle import ROWS_PER_CHUNK, prefetched

logger = logging.getLogger("seq2seq_eval")


# One encoder for every record: json.dumps builds a new JSONEncoder per call when given options,
# a fifth of rank 0's tail on a million pseudolabels. Same output as json.dumps(x, ensure_ascii=False).
_encode = json.JSONEncoder(ensure_ascii=False).encode
# A line of a JSON Lines file: the same, but U+0085, U+2028 and U+2029 escaped, so a reader
# that splits lines with str.splitlines() sees one line per example (outputs/jsonl.py).
_encode_line = encode_line


def _indented(value: Any, level: int) -> str:
    # json.dumps(..., indent=1) goes through the pure-Python encoder, a third of rank 0's tail on
    # a million pseudolabels; this builds the same text with the C encoder doing the scalars.
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        pad = " " * (level + 1)
        return "[\n" + ",\n".join(pad + _indented(v, level + 1) for v in value) + "\n" + " " * level + "]"
    return _encode(value)


def _legacy_record(record: Mapping[str, Any]) -> bytes:
    """One element of json.dumps(list, ensure_ascii=False, sort_keys=True, indent=1): the same
    bytes as dumping the whole list at once, written one element at a time. Values are strings,
    numbers, None or lists of them (tested against json.dumps)."""
    items = ",\n".join(f"  {_encode(k)}: {_indented(record[k], 2)}" for k in sorted(record))
    return (" {\n" + items + "\n }").encode("utf-8")


def output_lines(cfg: EvalConfig, examples: Sequence[Example], records: Sequence[Mapping[str, Any]]) -> dict[str, list[bytes]]:
    """Each example's bytes in every output file that has one line (or element) per example, as
    the rank that generated it serializes them: rank 0 then only concatenates them in data order.
    Building these strings was most of rank 0's tail on a million pseudolabels, a serial step at
    the end of the run; on the ranks it costs microseconds per example, in parallel.

    Keys are run.rankfiles.LINE_COLUMNS: out_gen ({type_path}_generations.txt, also .pseudo.target),
    out_legacy (an element of pseudolabel_results.json, with the ",\n" that precedes it),
    out_jsonl (a line of _pseudolabels.jsonl), out_example (a line of _examples.jsonl)."""
    preds = [r["pred"] if isinstance(r["pred"], list) else [r["pred"]] for r in records]
    lines: dict[str, list[bytes]] = {"out_gen": [(_one_line(p[0]) + "\n").encode("utf-8") for p in preds]}
    if cfg.pseudolabels:
        lines["out_legacy"] = [
            b",\n" + _legacy_record({"id": e.id, "source": e.source, "target": target_list(e.target), "preds": p})
            for e, p in zip(examples, preds)]
        lines["out_jsonl"] = [
            (_encode_line({"id": e.id, "source": e.source, "target": target_list(e.target), "candidates": p,
                           "scores": r.get("scores")})
             + "\n").encode("utf-8")
            for e, p, r in zip(examples, preds, records)]
    if cfg.scored and not cfg.no_examples_file:
        lines["out_example"] = [_example_line(e, p[0], r.get("sentence_scores")) for e, p, r in zip(examples, preds, records)]
    return lines


def target_list(target: Any) -> list[str]:
    """An example's references as the pseudolabel files write them: always a list (one element
    for one reference, empty without references), so a reader never has to ask which type a
    row's `target` has, as it would if one reference were written as a bare string."""
    if target is None:
        return []
    return [target] if isinstance(target, str) else list(target)


def write_outputs(
    cfg: EvalConfig,
    store: Any,
    rows: Any,
    summarize: Callable[[MetricTotals | None], dict[str, Any]],
    tail_since: float | None = None,
) -> tuple[list[Path], dict[str, Any], MetricTotals | None]:
    """Write every output in one pass over the examples in data order, each file through a
    temporary name, so a failure midway leaves no half file behind. Per-example lines come
    serialized from the ranks (output_lines); the metrics are added up in the same pass;
    `summarize(totals)` then builds the metric file's content, written last: its presence means
    the run completed. `rows` gives every example's row of the rank files in data order, as tables
    a chunk or a bucket at a time (shuffle.gathered, with the columns parts.columns_taken names
    for this run); or `rows` is the ranks' slices of the outputs (Parts: the files the ranks wrote in place,
    parts.write_slice), which are completed and moved into place. With `tail_since` (a
    perf_counter time), the seconds from then to just before that last write are recorded as
    time_breakdown.tail."""
    save_dir = Path(cfg.save_dir)
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"--save_dir {save_dir}: cannot create the folder ({e.strerror})") from e
    n_refs = store.max_references if cfg.debug else 1
    planned = planned_outputs(cfg, n_refs)
    # Checked before any work too; again here, as the user may have put a file there since.
    OutputRecord(save_dir).check_writable(planned)
    removed = stale_outputs(cfg, n_refs)
    for path in removed:
        path.unlink()
        logger.info("removed %s: an earlier run's result, not written by this run", path)
    names = iter(planned)
    paths = {"gen": next(names)}
    if cfg.pseudolabels:
        paths["legacy"], paths["jsonl"] = next(names), next(names)
        if cfg.pseudo_target:
            paths["pseudo"] = next(names)
    refs_paths = [next(names) for _ in range(n_refs)] if cfg.debug else []
    if cfg.scored and not cfg.no_examples_file:
        paths["example"] = next(names)
    shared = isinstance(rows, Parts)
    if shared:
        complete(rows)
    files: dict[str, Any] = {}
    refs_files: list[AtomicFile] = []
    totals = MetricTotals(cfg.metric_names) if cfg.scored else None
    try:
        for role, path in paths.items():
            files[role] = AdoptedFile(path, rows.assembled[role]) if shared else AtomicFile(path)
        refs_files = [AtomicFile(path) for path in refs_paths]
        gen, legacy, jsonl = files["gen"], files.get("legacy"), files.get("jsonl")
        pseudo, examples_file = files.get("pseudo"), files.get("example")
        if shared:
            if totals is not None:
                add_scores(rows, totals)
        elif legacy is not None:
            legacy.write(legacy_ends(len(store))[0])
        first = True
        for part in prefetched(rows) if not shared else ():
            generations = concatenated(part, "out_gen")
            gen.write(generations)
            if pseudo is not None:
                pseudo.write(generations)
            if legacy is not None and jsonl is not None:
                elements = concatenated(part, "out_legacy")
                legacy.write(elements[1:] if first else elements)  # no comma before the first
                jsonl.write(concatenated(part, "out_jsonl"))
            if totals is not None:
                totals.add(*scores_of(part))
                if examples_file is not None:
                    examples_file.write(concatenated(part, "out_example"))
            first = first and part.num_rows == 0
        for start in range(0, len(store), ROWS_PER_CHUNK) if refs_files else ():
            examples = store.slice(start, min(ROWS_PER_CHUNK, len(store) - start))
            for k, f in enumerate(refs_files):
                f.write("".join(_one_line(e.references[k] if k < len(e.references) else "") + "\n"
                                for e in examples).encode("utf-8"))
        if legacy is not None and not shared:
            legacy.write(legacy_ends(len(store))[1])
        summary = summarize(totals)
        for f in [*files.values(), *refs_files]:
            f.commit()
    except BaseException:
        for f in [*files.values(), *refs_files]:
            f.discard()
        raise
    summary["provenance"] = {**summary.get("provenance", {}),
                             "outputs": [p.name for p in planned],
                             "removed_stale_outputs": [p.name for p in removed]}
    if tail_since is not None and "throughput" in summary:
        summary["throughput"]["time_breakdown"]["tail"] = time.perf_counter() - tail_since
    write_atomic(planned[-1], dumps(summary))
    # Last: a crash before this line leaves outputs the record does not list, which the next
    # run then refuses to write over (one line naming them) rather than taking them for its own.
    OutputRecord(save_dir).update(written=planned, removed=removed)
    return planned, summary, totals


def _example_line(e: Example, prediction: str, scores: Mapping[str, float] | None) -> bytes:
    """A line of {type_path}_examples.jsonl, one JSON object per example in the order of the data.

    Keys: id, source, references (always a list, so every row has the same type and
    `datasets.load_dataset("json", ...)` reads the file), prediction, then the sentence-level
    score of each metric (bleu, chrf, chrf++, ter, rouge1, rouge2, rougeL, rougeLsum), as the
    generating rank computed them.
    """
    row: dict[str, Any] = {"id": e.id, "source": e.source, "references": list(e.references), "prediction": prediction}
    row.update(scores or {})
    return (_encode_line(row) + "\n").encode("utf-8")
