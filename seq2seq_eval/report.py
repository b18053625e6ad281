"""What rank 0 writes into save_dir, and the summary table it prints."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from .config import EvalConfig
from .inputs.examples import Example
from .errors import OutputError, RunStateError
from .scoring.totals import MetricTotals
from .atomic import AtomicFile, dumps, write_atomic

logger = logging.getLogger("seq2seq_eval")

VERSIONED = ("torch", "transformers", "datasets", "sacrebleu", "rouge-score", "seq2seq_eval")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["python"] = platform.python_version()
    return versions


def _one_line(text: str) -> str:
    # generations.txt is one example per line: a newline inside a prediction would shift every
    # later line against the references of anyone who reads the file by position.
    return " ".join(text.splitlines())


# Every result file a run may leave in --save_dir, after its prefix. A run removes the ones of
# its own prefix that it does not write itself, so a metric file of an earlier run (another task,
# or scores where this run made pseudolabels) is never left beside new generations.
RESULT_SUFFIXES = (
    "_bleu.json", "_rouge.json", "_generations.txt", "_pseudolabels.jsonl", ".pseudo.target",
    "_run_info.json", "_references.txt", "_examples.jsonl",
)


def planned_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Path]:
    """The files this run writes into --save_dir, in the order written, the metric (or run
    info) file last. With --debug, `n_refs` reference files (the number of reference sets)."""
    save_dir, p = Path(cfg.save_dir), cfg.output_prefix
    paths = [save_dir / f"{p}_generations.txt"]
    if cfg.pseudolabels:
        paths += [save_dir / "pseudolabel_results.json", save_dir / f"{p}_pseudolabels.jsonl"]
        if cfg.pseudo_target:
            paths.append(save_dir / f"{p}.pseudo.target")
    if cfg.debug:
        paths += [save_dir / (f"{p}_references.txt" if k == 0 else f"{p}_references.{k}.txt") for k in range(n_refs)]
    if cfg.scored and not cfg.no_examples_file:
        paths.append(save_dir / f"{p}_examples.jsonl")
    paths.append(save_dir / (f"{p}_{cfg.metric_name}.json" if cfg.scored else f"{p}_run_info.json"))
    return paths


def stale_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Path]:
    planned = set(planned_outputs(cfg, n_refs))
    save_dir = Path(cfg.save_dir)
    return [save_dir / f"{cfg.output_prefix}{s}" for s in RESULT_SUFFIXES
            if (save_dir / f"{cfg.output_prefix}{s}").is_file() and save_dir / f"{cfg.output_prefix}{s}" not in planned]


def data_files(cfg: EvalConfig) -> list[Path]:
    """The local data files a run reads (a local dataset's files, the legacy layout's files of
    --type_path, a .jsonl file, --input_path and --reference_path)."""
    if cfg.input_path is not None:
        return [Path(p).expanduser() for p in (cfg.input_path, cfg.reference_path) if p is not None and Path(p).is_file()]
    path = Path(cfg.dataset if cfg.dataset is not None else cfg.data_dir).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []  # a hub dataset, or a missing path (reported when the data is read)
    found = path.rglob("*") if cfg.dataset is not None else path.glob(f"{cfg.type_path}.*")
    return sorted(f for f in found if f.is_file())


def input_files(cfg: EvalConfig) -> list[Path]:
    """The local files a run reads: its data files and the model folder's files."""
    model = Path(cfg.model_name).expanduser()
    return data_files(cfg) + (sorted(f for f in model.iterdir() if f.is_file()) if model.is_dir() else [])


def _check_folder(flag: str, folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{flag} {folder}: is a file; expected a folder (created if missing)")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{flag} {folder}: {existing} is a file; expected a folder (created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "on a read-only file system" if read_only else "not writable by this user"
        raise OutputError(f"{flag} {folder}: {existing} is {why}; expected a folder the run can write")


def check_output_locations(cfg: EvalConfig) -> None:
    """Before any work (the dry run too): --save_dir and --tmp_dir must be usable folders, and
    no output may replace a file the run reads (a --debug run once wrote its copy of the
    references over the user's {type_path}.target)."""
    _check_folder("--save_dir", Path(cfg.save_dir))
    _check_folder("--tmp_dir", Path(cfg.tmp_dir))
    inputs = {os.path.realpath(f) for f in input_files(cfg)}
    tmp_dir = Path(cfg.tmp_dir)
    for path in [*planned_outputs(cfg), tmp_dir / "manifest.json", tmp_dir / "run.lock"]:
        if os.path.realpath(path) in inputs:
            raise OutputError(
                f"{path}: this run would write over one of its own input files; "
                "expected --save_dir/--tmp_dir folders apart from the data and the model"
            )


ROWS_PER_CHUNK = 20_000
"""Examples taken from the rank files at a time while writing, in data order. Each chunk costs a
call per record batch of the rank files (merge.RowTaker), so the number of calls grows with
(N / chunk) * N; at 5,000 those calls were half of rank 0's tail on a million pseudolabels.
20,000 such rows are about 50 MB."""


# One encoder for every record: json.dumps builds a new JSONEncoder per call when given options,
# a fifth of rank 0's tail on a million pseudolabels. Same output as json.dumps(x, ensure_ascii=False).
_encode = json.JSONEncoder(ensure_ascii=False).encode


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
            b",\n" + _legacy_record({"id": e.id, "source": e.source, "target": e.target, "preds": p})
            for e, p in zip(examples, preds)]
        lines["out_jsonl"] = [
            (_encode({"id": e.id, "source": e.source, "target": e.target, "candidates": p, "scores": r.get("scores")})
             + "\n").encode("utf-8")
            for e, p, r in zip(examples, preds, records)]
    if cfg.scored and not cfg.no_examples_file:
        lines["out_example"] = [_example_line(e, p[0], r.get("sentence_scores")) for e, p, r in zip(examples, preds, records)]
    return lines


def _concatenated(part: Any, column: str) -> memoryview:
    """The values of a binary column, end to end, without a Python object per row."""
    import numpy as np

    array = part.column(column).combine_chunks()
    if array.null_count:
        raise RunStateError(f"rank files lack the serialized {column!r} of some examples; "
                            "expected every row written with its output lines (report.output_lines)")
    if len(array) == 0:
        return memoryview(b"")
    _, offsets_buf, data = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32)[array.offset : array.offset + len(array) + 1]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


def write_outputs(
    cfg: EvalConfig,
    store: Any,
    rows: Any,
    order: Any,
    summarize: Callable[[MetricTotals | None], dict[str, Any]],
    tail_since: float | None = None,
) -> tuple[list[Path], dict[str, Any], MetricTotals | None]:
    """Write every output in one pass over the examples in data order, `ROWS_PER_CHUNK` at a
    time, each file through a temporary name, so memory stays at one chunk and a failure midway
    leaves no half file behind. Per-example lines come serialized from the ranks (output_lines);
    the metrics are added up in the same pass; `summarize(totals)` then builds the metric file's
    content, written last: its presence means the run completed. `rows` (a merge.RowTaker) gives
    rank file rows by the numbers in `order`. With `tail_since` (a perf_counter time), the
    seconds from then to just before that last write are recorded as time_breakdown.tail."""
    save_dir = Path(cfg.save_dir)
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"--save_dir {save_dir}: cannot create the folder ({e.strerror})") from e
    n_refs = store.max_references if cfg.debug else 1
    removed = stale_outputs(cfg, n_refs)
    for path in removed:
        path.unlink()
        logger.info("removed %s: an earlier run's result, not written by this run", path)
    planned = planned_outputs(cfg, n_refs)
    files = {path: AtomicFile(path) for path in planned[:-1]}
    names = iter(planned)
    gen = files[next(names)]
    legacy = jsonl = pseudo = None
    if cfg.pseudolabels:
        legacy, jsonl = files[next(names)], files[next(names)]
        pseudo = files[next(names)] if cfg.pseudo_target else None
    refs_files = [files[next(names)] for _ in range(n_refs)] if cfg.debug else []
    examples_file = files[next(names)] if cfg.scored and not cfg.no_examples_file else None
    totals = MetricTotals(cfg.metric_names) if cfg.scored else None
    try:
        if legacy is not None:
            legacy.write(b"[" if len(order) else b"[]")
        for start in range(0, len(order), ROWS_PER_CHUNK):
            part = rows.take(order[start : start + ROWS_PER_CHUNK])
            generations = _concatenated(part, "out_gen")
            gen.write(generations)
            if pseudo is not None:
                pseudo.write(generations)
            if legacy is not None and jsonl is not None:
                elements = _concatenated(part, "out_legacy")
                legacy.write(elements[1:] if start == 0 else elements)  # no comma before the first
                jsonl.write(_concatenated(part, "out_jsonl"))
            if refs_files:
                examples = store.slice(start, part.num_rows)
                for k, f in enumerate(refs_files):
                    f.write("".join(_one_line(e.references[k] if k < len(e.references) else "") + "\n"
                                    for e in examples).encode("utf-8"))
            if totals is not None:
                stats = [json.loads(x) for x in part.column("metric_stats").to_pylist()]
                sentence = [json.loads(x) for x in part.column("sentence_scores").to_pylist()]
                totals.add(stats, sentence)
                if examples_file is not None:
                    examples_file.write(_concatenated(part, "out_example"))
        if legacy is not None:
            legacy.write(b"\n]\n" if len(order) else b"\n")
        summary = summarize(totals)
        for f in files.values():
            f.commit()
    except BaseException:
        for f in files.values():
            f.discard()
        raise
    summary["provenance"] = {**summary.get("provenance", {}),
                             "outputs": [p.name for p in planned],
                             "removed_stale_outputs": [p.name for p in removed]}
    if tail_since is not None and "throughput" in summary:
        summary["throughput"]["time_breakdown"]["tail"] = time.perf_counter() - tail_since
    write_atomic(planned[-1], dumps(summary))
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
    return (_encode(row) + "\n").encode("utf-8")


def lowest_scoring_line(store: Any, totals: MetricTotals, k: int = 5) -> str:
    """The summary line naming the `k` worst examples by the first metric's sentence score,
    worst first (for TER the highest: it is an error rate)."""
    key, positions, values = totals.lowest(k)
    worst = ", ".join(f"{i} ({v:.1f})" for i, v in zip(store.ids(positions), values))
    return f"{'lowest ' + key + ' ids':<28}{worst}"


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def summary_table(metrics: Mapping[str, Any], per_rank: Sequence[Mapping[str, Any]]) -> str:
    """A short human summary; the JSON file holds the full figures."""
    width = 28
    lines = []
    shown = [k for k in ("bleu", "chrf", "chrf++", "ter", "rouge1", "rouge2", "rougeL", "rougeLsum") if k in metrics]
    for key in shown:
        ci = ""
        if f"{key}_ci_low" in metrics:
            ci = f"  (95% CI {metrics[f'{key}_ci_low']:.2f}-{metrics[f'{key}_ci_high']:.2f})"
        lines.append(f"{key:<{width}}{metrics[key]:>12.4f}{ci}")
    tp = metrics.get("throughput", {})
    lines.append(f"{'n_obs':<{width}}{metrics.get('n_obs', 0):>12d}")
    if tp.get("generated_examples") == 0:
        # A resumed run whose batches were all journaled: nothing was timed, so no rates.
        lines.append(f"{'newly generated':<{width}}{0:>12d}  (every batch came from the journal)")
    for key, fmt in (("samples_per_second", ".2f"), ("generated_tokens_per_second", ".1f")):
        if tp.get(key) is not None:
            lines.append(f"{key:<{width}}{tp[key]:>12{fmt}}")
    if tp.get("split_batches"):
        # Said only when it happened: a split batch's outputs may differ in the last bits (run/oom.py).
        lines.append(f"{'split_batches':<{width}}{tp['split_batches']:>12d}  (out of memory: split in halves and retried)")
    if tp.get("moved_batches"):
        lines.append(f"{'moved_batches':<{width}}{tp['moved_batches']:>12d}  (taken by a rank that ran out of work from a slower one)")
    if per_rank:
        lines.append(f"{'rank':>6}{'examples':>10}{'batches':>9}{'taken':>7}{'resumed':>9}{'tokens':>9}{'gen s':>9}")
        for r in per_rank:
            lines.append(
                f"{r['rank']:>6}{r['examples']:>10}{r['batches']:>9}{r.get('stolen_batches', 0):>7}{r['resumed_batches']:>9}"
                f"{r['generated_tokens']:>9}{r['generation_seconds']:>9.2f}"
            )
    return "\n".join(lines)
