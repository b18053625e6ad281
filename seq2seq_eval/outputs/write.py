"""The output files, streamed in data order: each example's lines are serialized by the rank that
generated it (output_lines, stored in its rank file) and rank 0 concatenates them, adding up the
metrics as it goes (write_outputs)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import dumps
from ..config import EvalConfig
from ..inputs.examples import Example
# encode: one encoder for every record (outputs/jsonl.py); encode_line: the same with the
# characters line splitters break at escaped, for a line of a JSON Lines file.
from .jsonl import encode, encode_line
from ..scoring.totals import MetricTotals
from .locations import _one_line, planned_outputs, run_inputs, run_outputs, save_dir_way_out
from .parts import Parts, add_scores, complete, concatenated, legacy_ends, scores_of
from .publish import Staging, publish_together
from .record import OutputRecord
from .shuffle import ROWS_PER_CHUNK, prefetched

logger = logging.getLogger("seq2seq_eval")




def _indented(value: Any, level: int) -> str:
    # json.dumps(..., indent=1) goes through the pure-Python encoder, a third of rank 0's tail on
    # a million pseudolabels; this builds the same text with the C encoder doing the scalars.
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        pad = " " * (level + 1)
        return "[\n" + ",\n".join(pad + _indented(v, level + 1) for v in value) + "\n" + " " * level + "]"
    return encode(value)


def _legacy_record(record: Mapping[str, Any]) -> bytes:
    """One element of json.dumps(list, ensure_ascii=False, sort_keys=True, indent=1): the same
    bytes as dumping the whole list at once, written one element at a time. Values are strings,
    numbers, None or lists of them (tested against json.dumps)."""
    items = ",\n".join(f"  {encode(k)}: {_indented(record[k], 2)}" for k in sorted(record))
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
    # --select (selection/in_run.py): the selected candidate is the generation; pred stays in
    # generation order, which select_scores and `selected` follow.
    picks = [r.get("selected", 0) for r in records]
    lines: dict[str, list[bytes]] = {"out_gen": [(_one_line(p[k]) + "\n").encode("utf-8") for p, k in zip(preds, picks)]}
    if cfg.pseudolabels:
        # pseudolabel_results.json keeps its shape: `preds` best first, the selected candidate
        # first with --select (the others after it, in generation order).
        lines["out_legacy"] = [
            b",\n" + _legacy_record({"id": e.id, "source": e.source, "target": target_list(e.target),
                                     "preds": [p[k], *p[:k], *p[k + 1:]]})
            for e, p, k in zip(examples, preds, picks)]
        lines["out_jsonl"] = [
            (encode_line({"id": e.id, "source": e.source, "target": target_list(e.target), "candidates": p,
                           "scores": r.get("scores"), **_selection(r)})
             + "\n").encode("utf-8")
            for e, p, r in zip(examples, preds, records)]
    if cfg.scored and not cfg.no_examples_file:
        lines["out_example"] = [
            _example_line(e, p[k], r.get("sentence_scores"),
                          {"candidates": p, "scores": r.get("scores"), **_selection(r)} if "selected" in r else None)
            for e, p, k, r in zip(examples, preds, picks, records)]
    return lines


def _selection(record: Mapping[str, Any]) -> dict[str, Any]:
    """A selected record's `selected` index and its candidates' `select_scores` (in their order)."""
    if "selected" not in record:
        return {}
    return {"selected": record["selected"], "select_scores": record["select_scores"]}


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
    tmp_token: str | None = None,
    also: Callable[[dict[str, Any], Staging], list[Staging]] | None = None,
    on_whole: Callable[[], None] | None = None,
) -> tuple[list[Path], dict[str, Any], MetricTotals | None]:
    """Write every output in one pass over the examples in data order into a staging folder
    inside --save_dir, then publish them as one unit (outputs/publish.py), so a failure or a kill
    midway leaves either the earlier outputs or these, never half of them. Per-example lines come
    serialized from the ranks (output_lines); the metrics are added up in the same pass;
    `summarize(totals)` then builds the metric file's content, published last: its presence means
    the run completed. `rows` gives every example's row of the rank files in data order, as tables
    a chunk or a bucket at a time (shuffle.gathered, with the columns parts.columns_taken names
    for this run); or `rows` is the ranks' slices of the outputs (Parts: the files the ranks wrote in place,
    parts.write_slice), which are completed and moved into the staging folder. With `tail_since` (a
    perf_counter time), the seconds from then to just before the publish are recorded as
    time_breakdown.tail. `tmp_token`: the token the temp dir's marker carries in this run (a
    recovery removes it only while it does). `also(summary, staging)`: the files the command
    writes besides (the legacy form's SAVE_PATH and SCORE_PATH), added to this staging or staged
    in their own folders; returns every staging to publish, --save_dir's last if it is among them:
    one transaction over all those folders. `on_whole`: publish_together's."""
    save_dir = Path(cfg.save_dir)
    n_refs = store.max_references if cfg.debug else 1
    planned = planned_outputs(cfg, n_refs)
    prefix = cfg.output_prefix
    # Checked before any work too; again here, as the user may have put a file there since (and
    # once more under the folder's lock as the files are published).
    if save_dir.is_dir():
        OutputRecord(save_dir).check_writable(planned, prefix, way_out=save_dir_way_out(cfg))
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
    assembled = complete(rows) if shared else {}
    # A recovery that completes this publish for a run killed in it also removes its temp dir,
    # as the run would have next (unless --debug keeps it).
    staging = Staging(save_dir, prefix, "output", None if cfg.debug else Path(cfg.tmp_dir), tmp_token)
    files: dict[str, Any] = {}
    refs_files: list[Any] = []
    totals = MetricTotals(cfg.metric_names) if cfg.scored and cfg.metric_names else None
    try:
        for role, path in paths.items():
            if shared:
                staging.adopt(path.name, rows.assembled[role], *assembled[role])
            else:
                files[role] = staging.file(path.name)
        refs_files = [staging.file(path.name) for path in refs_paths]
        gen, legacy, jsonl = files.get("gen"), files.get("legacy"), files.get("jsonl")
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
        for f in [*files.values(), *refs_files]:
            f.close()
        summary = summarize(totals)
    except BaseException:
        for f in [*files.values(), *refs_files]:
            f.abandon()
        staging.discard()
        raise

    def metric_file(removed: list[str]) -> bytes:
        # Made under the folder's lock, once the stale results this publish removes are known.
        summary["provenance"] = {**summary.get("provenance", {}), "outputs": [p.name for p in planned],
                                 "removed_stale_outputs": removed}
        if tail_since is not None and "throughput" in summary:
            summary["throughput"]["time_breakdown"]["tail"] = time.perf_counter() - tail_since
        return dumps(summary)

    inputs = {os.path.realpath(r.path) for r in run_inputs(cfg)}
    roles = {r.path: r.what for r in run_outputs(cfg, n_refs)}
    # The legacy pseudolabel file is a result a reader takes as complete too: placed last as well.
    staging.plan((planned[-1].name, metric_file), stale=True, inputs=inputs, roles=roles, way_out=save_dir_way_out(cfg),
                 completes=[paths["legacy"].name] if "legacy" in paths else [])
    together = [staging]
    if also is not None:
        try:
            together = also(summary, staging)
        except BaseException:
            staging.discard()
            raise
    removed = publish_together(together, on_whole)[together.index(staging)] if staging in together else []
    for name in removed:
        logger.info("removed %s: an earlier run's result, not written by this run", save_dir / name)
    return planned, summary, totals


def _example_line(e: Example, prediction: str, scores: Mapping[str, float] | None,
                  candidates: Mapping[str, Any] | None = None) -> bytes:
    """A line of {type_path}_examples.jsonl, one JSON object per example in the order of the data.

    Keys: id, source, references (always a list, so every row has the same type and
    `datasets.load_dataset("json", ...)` reads the file), prediction, with --select the
    candidates, their generation scores, select_scores and the selected index, then the
    sentence-level score of each metric (bleu, chrf, chrf++, ter, rouge1, rouge2, rougeL,
    rougeLsum), as the generating rank computed them.
    """
    row: dict[str, Any] = {"id": e.id, "source": e.source, "references": list(e.references), "prediction": prediction}
    row.update(candidates or {})
    row.update(scores or {})
    return (encode_line(row) + "\n").encode("utf-8")
