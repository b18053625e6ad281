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
        # One file per reference set, named as the legacy layout reads them back.
        for k in range(max([1, *(len(e.references) for e in examples)])):
            path = save_dir / (f"{cfg.type_path}.target" + (f".{k}" if k else ""))
            texts = (e.references[k] if k < len(e.references) else "" for e in examples)
            write_atomic(path, "".join(_one_line(t) + "\n" for t in texts).encode("utf-8"))
            written.append(path)
    if not cfg.pseudolabels and not cfg.no_examples_file:
        path = save_dir / f"{cfg.type_path}_examples.jsonl"
        write_atomic(path, examples_jsonl(examples, records))
        written.append(path)
    if metrics is not None:
        metrics = dict(metrics)
        if tail_since is not None and "throughput" in metrics:
            metrics["throughput"]["time_breakdown"]["tail"] = time.perf_counter() - tail_since
        name = f"{cfg.type_path}_{cfg.metric_name}.json" if not cfg.pseudolabels else f"{cfg.type_path}_run_info.json"
        path = save_dir / name
        write_atomic(path, dumps(metrics))
        written.append(path)
    return written


def examples_jsonl(examples: Sequence[Example], records: Sequence[Mapping[str, Any]]) -> bytes:
    """{type_path}_examples.jsonl: one JSON object per example, in the order of the data.

    Keys: id, source, references (always a list, so every row has the same type and
    `datasets.load_dataset("json", ...)` reads the file), prediction, then the sentence-level
    score of each metric (bleu, chrf, chrf++, ter, rouge1, rouge2, rougeL, rougeLsum), as the
    generating rank computed them.
    """
    lines = []
    for e, r in zip(examples, records):
        row: dict[str, Any] = {"id": e.id, "source": e.source, "references": list(e.references), "prediction": r["pred"]}
        row.update(r.get("sentence_scores") or {})
        lines.append(json.dumps(row, ensure_ascii=False))
    return "".join(line + "\n" for line in lines).encode("utf-8")


def lowest_scoring_line(metric: str, ids: Sequence[Any], records: Sequence[Mapping[str, Any]], k: int = 5) -> str:
    """The summary line naming the `k` worst examples by `metric`'s sentence score, worst first
    (for TER the highest: it is an error rate)."""
    from .metrics import lowest_scoring, ranking_key

    key, _ = ranking_key(metric)
    scores = [r["sentence_scores"] for r in records]
    worst = ", ".join(f"{ids[i]} ({scores[i][key]:.1f})" for i in lowest_scoring(metric, scores, k))
    return f"{'lowest ' + key + ' ids':<22}{worst}"


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def summary_table(metrics: Mapping[str, Any], per_rank: Sequence[Mapping[str, Any]]) -> str:
    """A short human summary; the JSON file holds the full figures."""
    lines = []
    shown = [k for k in ("bleu", "chrf", "chrf++", "ter", "rouge1", "rouge2", "rougeL", "rougeLsum") if k in metrics]
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
