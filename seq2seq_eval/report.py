"""What rank 0 writes into save_dir, and the summary table it prints."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from .config import EvalConfig
from .data import Example
from .runfiles import dumps, write_atomic

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
    save_dir.mkdir(parents=True, exist_ok=True)
    written = []
    best = [r["pred"][0] if isinstance(r["pred"], list) else r["pred"] for r in records]
    gen_path = save_dir / f"{cfg.type_path}_generations.txt"
    write_atomic(gen_path, "".join(_one_line(p) + "\n" for p in best).encode("utf-8"))
    written.append(gen_path)
    if cfg.pseudolabels:
        legacy = [
            {"id": e.id, "source": e.source, "target": e.target, "preds": r["pred"]}
            for e, r in zip(examples, records)
        ]
        path = save_dir / "pseudolabel_results.json"
        write_atomic(path, dumps(legacy))
        written.append(path)
        lines = [
            json.dumps(
                {"id": e.id, "source": e.source, "target": e.target, "candidates": r["pred"], "scores": r.get("scores")},
                ensure_ascii=False,
            )
            for e, r in zip(examples, records)
        ]
        path = save_dir / f"{cfg.type_path}_pseudolabels.jsonl"
        write_atomic(path, ("\n".join(lines) + "\n").encode("utf-8"))
        written.append(path)
        if cfg.pseudo_target:
            path = save_dir / f"{cfg.type_path}.pseudo.target"
            write_atomic(path, "".join(_one_line(p) + "\n" for p in best).encode("utf-8"))
            written.append(path)
    if cfg.debug:
        path = save_dir / f"{cfg.type_path}.target"
        write_atomic(path, "".join(_one_line(e.target or "") + "\n" for e in examples).encode("utf-8"))
        written.append(path)
    if metrics is not None:
        metrics = dict(metrics)
        if tail_since is not None and "throughput" in metrics:
            metrics["throughput"]["time_breakdown"]["tail"] = time.perf_counter() - tail_since
        name = f"{cfg.type_path}_{cfg.metric_name}.json" if cfg.scored else f"{cfg.type_path}_run_info.json"
        path = save_dir / name
        write_atomic(path, dumps(metrics))
        written.append(path)
    return written


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def summary_table(metrics: Mapping[str, Any], per_rank: Sequence[Mapping[str, Any]]) -> str:
    """A short human summary; the JSON file holds the full figures."""
    lines = []
    shown = [k for k in ("bleu", "rouge1", "rouge2", "rougeL", "rougeLsum") if k in metrics]
    for key in shown:
        ci = ""
        if f"{key}_ci_low" in metrics:
            ci = f"  (95% CI {metrics[f'{key}_ci_low']:.2f}-{metrics[f'{key}_ci_high']:.2f})"
        lines.append(f"{key:<22}{metrics[key]:>10.4f}{ci}")
    tp = metrics.get("throughput", {})
    lines.append(f"{'n_obs':<22}{metrics.get('n_obs', 0):>10d}")
    for key, fmt in (("samples_per_second", ".2f"), ("generated_tokens_per_second", ".1f")):
        if key in tp:
            lines.append(f"{key:<22}{tp[key]:>10{fmt}}")
    if per_rank:
        lines.append(f"{'rank':>6}{'examples':>10}{'batches':>9}{'resumed':>9}{'tokens':>9}{'gen s':>9}")
        for r in per_rank:
            lines.append(
                f"{r['rank']:>6}{r['examples']:>10}{r['batches']:>9}{r['resumed_batches']:>9}"
                f"{r['generated_tokens']:>9}{r['generation_seconds']:>9.2f}"
            )
    return "\n".join(lines)
