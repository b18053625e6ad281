"""What rank 0 writes into save_dir, and the summary table it prints."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from .config import EvalConfig
from .data import Example
from .errors import OutputError
from .runfiles import dumps, write_atomic

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


def planned_outputs(cfg: EvalConfig) -> list[Path]:
    """The files this run writes into --save_dir, the metric (or run info) file last."""
    save_dir, p = Path(cfg.save_dir), cfg.output_prefix
    paths = [save_dir / f"{p}_generations.txt"]
    if cfg.pseudolabels:
        paths += [save_dir / "pseudolabel_results.json", save_dir / f"{p}_pseudolabels.jsonl"]
        if cfg.pseudo_target:
            paths.append(save_dir / f"{p}.pseudo.target")
    if cfg.debug:
        paths.append(save_dir / f"{p}_references.txt")
    paths.append(save_dir / (f"{p}_run_info.json" if cfg.pseudolabels else f"{p}_{cfg.metric_name}.json"))
    return paths


def stale_outputs(cfg: EvalConfig) -> list[Path]:
    planned = set(planned_outputs(cfg))
    save_dir = Path(cfg.save_dir)
    return [save_dir / f"{cfg.output_prefix}{s}" for s in RESULT_SUFFIXES
            if (save_dir / f"{cfg.output_prefix}{s}").is_file() and save_dir / f"{cfg.output_prefix}{s}" not in planned]


def input_files(cfg: EvalConfig) -> list[Path]:
    """The local files a run reads: data files, a local dataset's files, the model folder's files."""
    files: list[Path] = []

    def add(path: Path) -> None:
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(f for f in path.rglob("*") if f.is_file())

    model = Path(cfg.model_name).expanduser()
    if model.is_dir():
        files.extend(f for f in model.iterdir() if f.is_file())
    if cfg.dataset is not None:
        add(Path(cfg.dataset).expanduser())
    else:
        data = Path(cfg.data_dir).expanduser()
        if data.is_dir():
            files.extend(f for f in data.glob(f"{cfg.type_path}.*") if f.is_file())
        else:
            add(data)
    return files


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


def write_outputs(
    cfg: EvalConfig,
    examples: Sequence[Example],
    records: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Any] | None,
    tail_since: float | None = None,
) -> list[Path]:
    """Write every output atomically, so a failure midway leaves no half file behind. The
    metric file goes last: its presence means the run completed. With `tail_since` (a
    perf_counter time), the seconds from then to just before that last write are recorded as
    throughput.time_breakdown.tail."""
    save_dir = Path(cfg.save_dir)
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"--save_dir {save_dir}: cannot create the folder ({e.strerror})") from e
    removed = stale_outputs(cfg)
    for path in removed:
        path.unlink()
        logger.info("removed %s: an earlier run's result, not written by this run", path)
    paths = iter(planned_outputs(cfg))
    written = []

    def write(data: bytes) -> None:
        path = next(paths)
        write_atomic(path, data)
        written.append(path)

    best = [r["pred"][0] if isinstance(r["pred"], list) else r["pred"] for r in records]
    write("".join(_one_line(p) + "\n" for p in best).encode("utf-8"))
    if cfg.pseudolabels:
        legacy = [
            {"id": e.id, "source": e.source, "target": e.target, "preds": r["pred"]}
            for e, r in zip(examples, records)
        ]
        write(dumps(legacy))
        lines = [
            json.dumps(
                {"id": e.id, "source": e.source, "target": e.target, "candidates": r["pred"], "scores": r.get("scores")},
                ensure_ascii=False,
            )
            for e, r in zip(examples, records)
        ]
        write(("\n".join(lines) + "\n").encode("utf-8"))
        if cfg.pseudo_target:
            write("".join(_one_line(p) + "\n" for p in best).encode("utf-8"))
    if cfg.debug:
        write("".join(_one_line(e.target or "") + "\n" for e in examples).encode("utf-8"))
    if metrics is not None:
        metrics = dict(metrics)
        metrics["provenance"] = {**metrics.get("provenance", {}),
                                 "outputs": [p.name for p in planned_outputs(cfg)],
                                 "removed_stale_outputs": [p.name for p in removed]}
        if tail_since is not None and "throughput" in metrics:
            metrics["throughput"]["time_breakdown"]["tail"] = time.perf_counter() - tail_since
        write(dumps(metrics))
    return written


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def summary_table(metrics: Mapping[str, Any], per_rank: Sequence[Mapping[str, Any]]) -> str:
    """A short human summary; the JSON file holds the full figures."""
    width = 28
    lines = []
    shown = [k for k in ("bleu", "rouge1", "rouge2", "rougeL", "rougeLsum") if k in metrics]
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
        # Said only when it happened: a split batch's outputs may differ in the last bits (oom.py).
        lines.append(f"{'split_batches':<{width}}{tp['split_batches']:>12d}  (out of memory: split in halves and retried)")
    if per_rank:
        lines.append(f"{'rank':>6}{'examples':>10}{'batches':>9}{'resumed':>9}{'tokens':>9}{'gen s':>9}")
        for r in per_rank:
            lines.append(
                f"{r['rank']:>6}{r['examples']:>10}{r['batches']:>9}{r['resumed_batches']:>9}"
                f"{r['generated_tokens']:>9}{r['generation_seconds']:>9.2f}"
            )
    return "\n".join(lines)
