"""One rank's run: load, plan, generate its batches with a journal, write its rank file; on
rank 0 also wait, merge by id, score and report."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
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
)
from .merge import merge_by_id
from .oom import run_batch
from .plan import Batch, assign_batches, make_batches, padding_efficiency, plan_digest
from .report import check_output_locations, now_iso, package_versions, summary_table, write_outputs
from .runfiles import (
    Journal,
    check_tmp_dir,
    cleanup_tmp_dir,
    STOPPED,
    RunLock,
    journal_file,
    prepare_tmp_dir,
    rank_file,
    read_journal_batches,
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


def _canonical(name: str) -> str:
    """A local path as an absolute, resolved path; a hub name as it is."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def _model_identity(model_config: Any, model_name: str) -> dict[str, Any]:
    """The model's revision when it came from the hub, else a hash of its local weight files."""
    identity: dict[str, Any] = {"name": _canonical(model_name)}
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
        out_ratio=1.0 if cfg.task == "translation" else 0.25,
        out_cap=out_cap,
        beams=gc.num_beams or 1,
    )
    gen_settings = {k: v for k, v in gc.to_diff_dict().items() if k != "transformers_version"}
    manifest = {
        "model": _model_identity(model_config, cfg.model_name),
        "data": {
            # Resolved: the same files named relatively, absolutely or with a trailing slash
            # are the same run to --resume.
            "path": _canonical(cfg.dataset if cfg.dataset is not None else cfg.data_dir),
            "dataset_config": cfg.dataset_config, "split": cfg.split,
            "n_examples": len(examples), "sha256": examples.fingerprint(),
        },
        "task": cfg.task,
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
        f"generation: {json.dumps(prep.manifest['generation'], sort_keys=True)}",
        f"sources truncated to {prep.manifest['max_source_length']} tokens: {prep.n_truncated}"
        if prep.manifest["max_source_length"] is not None else "sources are not truncated (no model limit)",
    ]
    for rank, indices in enumerate(deal):
        n = sum(len(prep.batches[i].members) for i in indices)
        cost = sum(prep.batches[i].cost for i in indices)
        lines.append(f"rank {rank}: {len(indices)} batches, {n} examples, est. cost {cost:.0f}")
    return "\n".join(lines)


def resume_command(env: DistEnv, argv: list[str] | None = None) -> str:
    """The command that continues this run: the same arguments plus --resume, under the same
    kind of launch (a multi-node torchrun needs its node count and rendezvous on every node)."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--resume"] + ["--resume"]
    if env.launcher == "torchrun":
        nproc = env.local_world_size or env.world_size
        nnodes = max(1, env.world_size // nproc)
        if nnodes == 1:
            launch = ["torchrun", "--standalone", f"--nproc_per_node={nproc}"]
        else:
            launch = ["torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
                      f"--rdzv_endpoint={env.rdzv_endpoint or 'HOST:PORT'}", f"--rdzv_id={env.run_id or 'ID'}"]
        cmd = shlex.join([*launch, "-m", "seq2seq_eval", *args])
        return cmd + (" (on every node)" if nnodes > 1 else "")
    if env.launcher == "slurm":
        return shlex.join(["srun", "python", "-m", "seq2seq_eval", *args]) + " (with the same srun options)"
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
    check_output_locations(cfg)
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
            if not cfg.pseudolabels:
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
            if lock is not None:
                # Before the lock goes: a rank that finds the lock free and this file absent
                # knows rank 0 died; with it, rank 0 was interrupted too and reports itself.
                _write_marker(tmp_dir / STOPPED)
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


def _write_marker(path: Path) -> None:
    try:
        path.write_bytes(b"")
    except OSError:
        pass  # only a hint for the other ranks' messages


def _main_rank_is_gone(tmp_dir: Path) -> bool:
    try:
        RunLock(tmp_dir).acquire()  # kept until this process exits
    except EvalError:
        return False
    return not (tmp_dir / STOPPED).exists()


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
    journaled = read_journal_batches(tmp_dir)
    journal = Journal(journal_file(tmp_dir, env.rank))
    records: list[dict[str, Any]] = []
    stats = {
        "rank": env.rank, "examples": 0, "batches": len(mine), "resumed_batches": 0,
        "generated_examples": 0, "generated_tokens": 0, "new_generated_tokens": 0, "source_tokens": 0, "padded_source_tokens": 0,
        "generation_seconds": 0.0, "device": str(device), "split_batches": 0, "out_of_memory_errors": 0,
    }
    bar = tqdm(
        total=sum(len(prep.batches[i].members) for i in mine),
        desc=f"rank {env.rank}", unit="ex", disable=not (env.is_main or cfg.debug), file=sys.stderr,
        leave=False,  # the summary table follows; an error line must stand alone
    )
    try:
        for index in mine:
            batch = prep.batches[index]
            pieces = journaled.get(index)
            entry = pieces.finished() if pieces is not None else None
            if entry is not None and _journal_entry_matches(entry, batch, prep):
                batch_records = entry["records"]
                stats["resumed_batches"] += 1
                stats["split_batches"] += int("parts" in entry)
            else:
                # Splits in halves on out of memory, journaling each split and sub-batch (oom.py).
                done = run_batch(
                    generator, index, [prep.input_ids[m] for m in batch.members],
                    [prep.examples.items[m].id for m in batch.members],
                    journal=journal, journaled=pieces, pseudolabels=cfg.pseudolabels, device=device,
                )
                batch_records = done.records
                stats["generation_seconds"] += done.seconds
                stats["generated_examples"] += done.generated_examples
                stats["new_generated_tokens"] += done.new_tokens
                stats["source_tokens"] += done.source_tokens
                stats["padded_source_tokens"] += done.padded_source_tokens
                stats["split_batches"] += int(done.split)
                stats["out_of_memory_errors"] += done.out_of_memory
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
    per_example = metric_fns.example_statistics(cfg.task, [r["pred"] for r in records], [refs[r["id"]] for r in records])
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
    if not cfg.pseudolabels:
        metrics = dict(metric_fns.combine(cfg.task, [r["metric_stats"] for r in records]))
    t_end = time.perf_counter()
    gen_seconds = max(s["generation_seconds"] for s in per_rank)
    # Rates cover what this run generated; batches reused from a journal cost no time here.
    generated = sum(s["generated_examples"] for s in per_rank)
    tokens = sum(s["new_generated_tokens"] for s in per_rank)
    padded = sum(s["padded_source_tokens"] for s in per_rank)
    throughput = {
        "generated_examples": generated,
        "samples_per_second": generated / gen_seconds if gen_seconds else None,
        "generated_tokens_per_second": tokens / gen_seconds if gen_seconds else None,
        "generation_seconds": gen_seconds,
        "source_padding_efficiency": sum(s["source_tokens"] for s in per_rank) / padded if padded else None,
        # Planned batches that ran as sub-batches after running out of memory (oom.py).
        "split_batches": sum(s.get("split_batches", 0) for s in per_rank),
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
        # As the legacy script: generation time over the run's examples. A resumed run's
        # reused batches cost nothing here, hence the generation-only figure beside it.
        "seconds_per_sample": gen_seconds / n,
        "seconds_per_generated_sample": gen_seconds / generated if generated else None,
        "n_gpus": env.world_size,
        "throughput": throughput,
        "provenance": {
            "config": cfg.to_dict(),
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
        cleanup_tmp_dir(tmp_dir)
    return Outcome(metrics=summary, written=written, table=summary_table(summary, per_rank))
