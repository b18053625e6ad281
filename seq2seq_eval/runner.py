"""One rank's run: load, plan, generate its batches with a journal, write its rank file; on
rank 0 also wait, merge by id, score and report."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import metrics as metric_fns
from .config import EvalConfig
from .data import Examples, load_examples
from .dist import DistEnv, ProcessGroup, dist_env
from .errors import EvalError, Interrupted, RunFailed, RunStateError
from .generate import (
    Generator,
    encode_sources,
    generation_config_for,
    load_model,
    load_model_config,
    load_tokenizer,
    resolve_device,
    source_limit,
    source_prefix,
    task_entry,
)
from .merge import merge_by_id
from .plan import Batch, assign_batches, make_batches, padding_efficiency, plan_digest
from .report import now_iso, package_versions, summary_table, write_outputs
from .runfiles import (
    Journal,
    check_tmp_dir,
    RunLock,
    journal_file,
    prepare_tmp_dir,
    rank_file,
    read_journals,
    read_rank_output,
    wait_for_rank_files,
    write_rank_output,
)

logger = logging.getLogger("seq2seq_eval")


@dataclass
class Prepared:
    """Everything derived before generation: identical on every rank."""

    examples: Examples
    tokenizer: Any
    model_config: Any
    generation_config: Any
    prefix: str
    input_ids: list[list[int]]
    batches: list[Batch]
    manifest: dict[str, Any]
    n_truncated: int = 0


@dataclass
class Outcome:
    """What the CLI reports: metrics on rank 0, nothing on other ranks."""

    metrics: dict[str, Any] | None = None
    written: list[Path] = field(default_factory=list)
    table: str = ""
    plan_text: str = ""


def _model_identity(model_config: Any, model_name: str) -> dict[str, Any]:
    """The model's revision when it came from the hub, else a hash of its local weight files."""
    identity: dict[str, Any] = {"name": model_name}
    revision = getattr(model_config, "_commit_hash", None)
    if revision:
        identity["revision"] = revision
    path = Path(os.path.expanduser(model_name))
    if path.is_dir():
        h = hashlib.sha256()
        for f in sorted(path.iterdir()):
            if f.suffix in (".safetensors", ".bin") and f.is_file():
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 22), b""):
                        h.update(chunk)
        identity["weights_sha256"] = h.hexdigest()
    return identity


def prepare(cfg: EvalConfig, pg: ProcessGroup | None = None) -> Prepared:
    from .errors import DataError

    examples = load_examples(cfg, (lambda fn: pg.main_first(fn, DataError)) if pg is not None else None)
    model_config, base_gc = load_model_config(cfg)
    tokenizer = load_tokenizer(cfg)
    entry = task_entry(model_config, cfg.task)
    if entry.note and (pg is None or pg.env.is_main):  # every rank sees the same; one says it
        logger.warning("--task %s: no task settings apply (%s)", cfg.task, entry.note)
    gc = generation_config_for(model_config, base_gc, tokenizer, cfg)
    prefix = source_prefix(model_config, cfg)
    max_source_length = source_limit(model_config, tokenizer, cfg)
    input_ids, n_truncated = encode_sources(tokenizer, [e.source for e in examples.items], prefix, max_source_length)
    lengths = [len(ids) for ids in input_ids]
    out_cap = gc.max_new_tokens or gc.max_length
    batches = make_batches(
        lengths,
        bs=None if cfg.max_tokens else cfg.bs,
        max_tokens=cfg.max_tokens,
        out_ratio=1.0 if cfg.task_family == "translation" else 0.25,
        out_cap=out_cap,
        beams=gc.num_beams or 1,
    )
    gen_settings = {k: v for k, v in gc.to_diff_dict().items() if k != "transformers_version"}
    manifest = {
        "model": _model_identity(model_config, cfg.model_name),
        "data": {"origin": examples.origin, "n_examples": len(examples), "sha256": examples.fingerprint()},
        "task": cfg.task,
        "task_settings": {"entry": entry.name, "params": json.loads(json.dumps(entry.params, default=str))},
        "type_path": cfg.type_path,
        "prefix": prefix,
        "max_source_length": max_source_length,
        "dtype": "float16" if cfg.fp16 else "bfloat16" if cfg.bf16 else "float32",
        "num_return_sequences": cfg.num_return_sequences,
        "seed": cfg.seed,
        "generation": json.loads(json.dumps(gen_settings, sort_keys=True, default=str)),
        "plan": {"bs": None if cfg.max_tokens else cfg.bs, "max_tokens": cfg.max_tokens, "sha256": plan_digest(batches)},
    }
    return Prepared(examples, tokenizer, model_config, gc, prefix, input_ids, batches, manifest, n_truncated)


def describe_plan(prep: Prepared, world_size: int) -> str:
    lengths = [len(ids) for ids in prep.input_ids]
    deal = assign_batches(prep.batches, world_size)
    lines = [
        f"{len(prep.examples)} examples from {prep.examples.origin}, {len(prep.batches)} batches, "
        f"source padding efficiency {padding_efficiency(prep.batches, lengths):.3f}",
        f"task settings: {_describe_entry(prep.manifest['task_settings'])}",
        f"generation: {json.dumps(prep.manifest['generation'], sort_keys=True)}",
        f"source prefix: {prep.prefix!r}",
        f"sources truncated to {prep.manifest['max_source_length']} tokens: {prep.n_truncated}"
        if prep.manifest["max_source_length"] is not None else "sources are not truncated (no model limit)",
    ]
    for rank, indices in enumerate(deal):
        n = sum(len(prep.batches[i].members) for i in indices)
        cost = sum(prep.batches[i].cost for i in indices)
        lines.append(f"rank {rank}: {len(indices)} batches, {n} examples, est. cost {cost:.0f}")
    return "\n".join(lines)


def _describe_entry(settings: dict[str, Any]) -> str:
    if settings["entry"] is None:
        return "none (no task_specific_params entry applies)"
    return f"task_specific_params[{settings['entry']!r}] = {json.dumps(settings['params'], sort_keys=True)}"


def resume_command(env: DistEnv) -> str:
    args = [a for a in sys.argv[1:] if a != "--resume"] + ["--resume"]
    if env.launcher == "torchrun":
        return shlex.join(["torchrun", f"--nproc_per_node={env.world_size}", "-m", "seq2seq_eval", *args])
    return shlex.join([sys.executable, "-m", "seq2seq_eval", *args])


class _Signals:
    """SIGINT/SIGTERM become an `Interrupted` exception in the main thread. torchrun sends
    SIGTERM to every worker when one of them dies; unwinding (instead of dying at once) lets
    rank 0 say which examples are missing. Finished batches are already fsynced in the journal."""

    def __enter__(self) -> "_Signals":
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def run(cfg: EvalConfig, env: DistEnv | None = None) -> Outcome:
    env = env or dist_env()
    t_start = time.perf_counter()
    if cfg.dry_run:
        # A dry run is one process that never joins a group: it validates and prints the plan.
        resolve_device(cfg, env)
        prep = prepare(cfg)
        check_tmp_dir(Path(cfg.tmp_dir), prep.manifest, cfg.resume)
        return Outcome(plan_text=describe_plan(prep, env.world_size))
    device, backend = resolve_device(cfg, env)
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    pg = ProcessGroup(env, backend, cfg.sync_timeout)
    lock: RunLock | None = None
    tmp_dir = Path(cfg.tmp_dir)
    prep: Prepared | None = None
    try:
        with _Signals():
            prep = prepare(cfg, pg)
            lock = _claim_tmp_dir(cfg, env, pg, prep, tmp_dir)
            model = load_model(cfg, device)
            t_loaded = time.perf_counter()
            records, stats = _generate_rank(cfg, env, prep, model, device, tmp_dir)
            stats["model_load_seconds"] = t_loaded - t_start
            t_scored = time.perf_counter()
            if cfg.scored:
                _attach_example_stats(cfg, prep, records)
            stats["scoring_seconds"] = time.perf_counter() - t_scored
            write_rank_output(tmp_dir, env.rank, records, stats)
            if not env.is_main:
                return Outcome()
            return _finish(cfg, env, prep, tmp_dir, stats, t_start)
    except Interrupted as e:
        if prep is None:
            raise
        if env.is_main:
            raise Interrupted(f"{e}; {_missing_summary(cfg, env, prep, tmp_dir)}") from e
        if _main_rank_is_gone(tmp_dir):
            # Rank 0 died (its flock went with it) and cannot report; the first surviving rank to
            # take the lock says what is missing, the others stay quiet.
            raise RunFailed(f"rank 0 is gone; {_missing_summary(cfg, env, prep, tmp_dir)}") from e
        raise
    finally:
        if lock is not None:
            lock.release()
        pg.close()


def _main_rank_is_gone(tmp_dir: Path) -> bool:
    try:
        RunLock(tmp_dir).acquire()  # kept until this process exits
    except EvalError:
        return False
    return True


def _claim_tmp_dir(cfg: EvalConfig, env: DistEnv, pg: ProcessGroup, prep: Prepared, tmp_dir: Path) -> RunLock | None:
    """Rank 0 locks and checks the temp dir; every rank learns the verdict from one broadcast,
    so a refused run stops on all ranks before any of them writes a journal line."""
    lock = None
    verdict: str | None = None
    if env.is_main:
        try:
            try:
                tmp_dir.mkdir(parents=True, exist_ok=True)
                if not os.access(tmp_dir, os.W_OK):
                    raise PermissionError(13, "Permission denied")
            except OSError as e:
                raise RunStateError(f"--tmp_dir {tmp_dir}: not writable ({e.strerror})") from e
            lock = RunLock(tmp_dir)
            lock.acquire()
            # A worker group restarted by torchrun (--max_restarts) resumes by itself.
            found = prepare_tmp_dir(tmp_dir, prep.manifest, cfg.resume or env.restart_count > 0)
            if found:
                logger.info("resuming from %d journal(s) in %s", found, tmp_dir)
        except EvalError as e:
            if lock is not None:
                lock.release()
            verdict = str(e)
            pg.broadcast(verdict)
            raise
    verdict = pg.broadcast(verdict)
    if verdict is not None:
        raise RunStateError(verdict)
    return lock


def _journal_entry_matches(entry: dict[str, Any], batch: Batch, prep: Prepared) -> bool:
    recs = entry.get("records")
    if not isinstance(recs, list) or len(recs) != len(batch.members):
        return False
    return all(r.get("id") == prep.examples.items[m].id for r, m in zip(recs, batch.members))


def _generate_rank(
    cfg: EvalConfig, env: DistEnv, prep: Prepared, model: Any, device: Any, tmp_dir: Path
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from tqdm.auto import tqdm

    generator = Generator(model, prep.tokenizer, prep.generation_config, device, seed=cfg.seed)
    mine = assign_batches(prep.batches, env.world_size)[env.rank]
    finished = read_journals(tmp_dir)
    journal = Journal(journal_file(tmp_dir, env.rank))
    records: list[dict[str, Any]] = []
    stats = {
        "rank": env.rank, "examples": 0, "batches": len(mine), "resumed_batches": 0,
        "generated_examples": 0, "generated_tokens": 0, "new_generated_tokens": 0, "source_tokens": 0, "padded_source_tokens": 0,
        "generation_seconds": 0.0, "device": str(device),
    }
    bar = tqdm(
        total=sum(len(prep.batches[i].members) for i in mine),
        desc=f"rank {env.rank}", unit="ex", disable=not (env.is_main or cfg.debug), file=sys.stderr,
        leave=False,  # the summary table follows; an error line must stand alone
    )
    try:
        for index in mine:
            batch = prep.batches[index]
            entry = finished.get(index)
            if entry is not None and _journal_entry_matches(entry, batch, prep):
                batch_records = entry["records"]
                stats["resumed_batches"] += 1
            else:
                t0 = time.perf_counter()
                out = generator([prep.input_ids[m] for m in batch.members], index)
                dt = time.perf_counter() - t0
                batch_records = []
                for j, m in enumerate(batch.members):
                    rec: dict[str, Any] = {
                        "id": prep.examples.items[m].id,
                        "pred": out.preds[j] if cfg.pseudolabels else out.preds[j][0],
                        "n_tokens": out.n_tokens[j],
                    }
                    if out.scores is not None:
                        rec["scores"] = out.scores[j]
                    batch_records.append(rec)
                journal.append({"batch": index, "records": batch_records, "seconds": dt})
                stats["generation_seconds"] += dt
                stats["generated_examples"] += len(batch.members)
                stats["new_generated_tokens"] += sum(out.n_tokens)
                stats["source_tokens"] += sum(len(prep.input_ids[m]) for m in batch.members)
                stats["padded_source_tokens"] += batch.padded_tokens
            records.extend(batch_records)
            stats["examples"] += len(batch.members)
            stats["generated_tokens"] += sum(r["n_tokens"] for r in batch_records)
            bar.update(len(batch.members))
    finally:
        bar.close()
        journal.close()
    if device.type == "cuda":
        import torch

        stats["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    else:
        import resource

        stats["peak_memory_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    return records, stats


def _attach_example_stats(cfg: EvalConfig, prep: Prepared, records: list[dict[str, Any]]) -> None:
    """Per-example metric statistics, computed by the rank that generated them, so rank 0 only
    adds them up (rouge-score is the slow part of a large summarization run)."""
    refs = {e.id: e.target for e in prep.examples.items}
    per_example = metric_fns.example_statistics(cfg.task_family, [r["pred"] for r in records], [refs[r["id"]] for r in records])
    for rec, st in zip(records, per_example):
        rec["metric_stats"] = st


def _missing_summary(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, missing_ranks: list[int] | None = None) -> str:
    if missing_ranks is None:
        missing_ranks = [r for r in range(env.world_size) if not rank_file(tmp_dir, r).exists()]
    done = read_journals(tmp_dir) if tmp_dir.exists() else {}
    deal = assign_batches(prep.batches, env.world_size)
    left = {
        r: sum(len(prep.batches[i].members) for i in deal[r] if i not in done) for r in missing_ranks
    }
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in left.items())
    unfinished = sum(len(b.members) for b in prep.batches if b.index not in done)
    return (
        f"rank(s) {', '.join(map(str, missing_ranks)) or 'none'} did not finish ({per_rank} examples left); "
        f"{unfinished} of {len(prep.examples)} examples still to generate ({len(done)} of {len(prep.batches)} "
        f"batches are kept in {tmp_dir}); resume with: {resume_command(env)}"
    )


def _finish(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, my_stats: dict[str, Any], t_start: float) -> Outcome:
    t_wait = time.perf_counter()
    paths = wait_for_rank_files(
        tmp_dir, env.world_size, cfg.sync_timeout,
        describe_missing=lambda missing: "; " + _missing_summary(cfg, env, prep, tmp_dir, missing),
    )
    t_merge = time.perf_counter()
    outputs = [read_rank_output(p, r) for r, p in enumerate(paths)]
    records = merge_by_id(outputs, prep.examples.ids)
    per_rank = [o.stats for o in outputs]
    n = len(records)
    metrics: dict[str, Any] | None = None
    if cfg.scored:
        metrics = dict(metric_fns.combine(cfg.task_family, [r["metric_stats"] for r in records]))
    t_end = time.perf_counter()
    gen_seconds = max(s["generation_seconds"] for s in per_rank)
    # Rates cover what this run generated; batches reused from a journal cost no time here.
    generated = sum(s["generated_examples"] for s in per_rank)
    tokens = sum(s["new_generated_tokens"] for s in per_rank)
    padded = sum(s["padded_source_tokens"] for s in per_rank)
    throughput = {
        "samples_per_second": generated / gen_seconds if gen_seconds else None,
        "generated_tokens_per_second": tokens / gen_seconds if gen_seconds else None,
        "generation_seconds": gen_seconds,
        "source_padding_efficiency": sum(s["source_tokens"] for s in per_rank) / padded if padded else None,
        "rank_imbalance": gen_seconds / (sum(s["generation_seconds"] for s in per_rank) / len(per_rank))
        if gen_seconds else None,
        "time_breakdown": {
            "model_load": my_stats["model_load_seconds"],
            "generation": my_stats["generation_seconds"],
            "scoring_on_rank": my_stats["scoring_seconds"],
            "waiting": t_merge - t_wait,
            "merge_and_scoring": t_end - t_merge,
            "total": t_end - t_start,
        },
        "per_rank": per_rank,
    }
    summary: dict[str, Any] = dict(metrics or {})
    summary.update({
        "n_obs": n,
        "seconds_per_sample": gen_seconds / generated if generated else None,
        "n_gpus": env.world_size,
        "throughput": throughput,
        "provenance": {
            "config": cfg.to_dict(),
            "task_settings": prep.manifest["task_settings"],
            "generation": prep.manifest["generation"],
            "prefix": prep.prefix,
            "model": prep.manifest["model"],
            "data": prep.manifest["data"],
            "plan": prep.manifest["plan"],
            "versions": package_versions(),
            "date": now_iso(),
            "world_size": env.world_size,
            "device_type": my_stats["device"].split(":")[0],
        },
    })
    # In pseudolabel mode the same figures go to {type_path}_run_info.json instead of a metric file.
    written = write_outputs(cfg, prep.examples.items, records, summary, tail_since=t_merge)
    if not cfg.debug:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return Outcome(metrics=summary, written=written, table=summary_table(summary, per_rank))
