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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import metrics as metric_fns
from .config import EvalConfig
from .data import iter_examples
from .dist import DistEnv, ProcessGroup, dist_env
from .errors import DataError, EvalError, Interrupted, RunFailed, RunStateError
from . import engines
from .generate import (
    generation_config_for,
    load_model_config,
    load_tokenizer,
    model_config_of,
    resolve_device,
    source_limit,
    source_prefix,
    task_entry,
)
from .merge import RowTaker, merge_by_id
from .oom import run_batch
from .plan import Batch, assign_batches, batch_budget, make_batches, padding_efficiency, plan_digest
from .report import (
    check_output_locations,
    data_files,
    lowest_scoring_line,
    now_iso,
    output_lines,
    package_versions,
    summary_table,
    write_outputs,
)
from .runfiles import (
    STOPPED,
    Journal,
    JournalIndex,
    RankWriter,
    RunLock,
    check_tmp_dir,
    cleanup_tmp_dir,
    journal_file,
    prepare_tmp_dir,
    rank_file,
    read_rank_output,
    refuse_earlier_run,
    wait_for_rank_files,
    write_json_atomic,
)
from .steal import Claims
from .store import ROWS_PER_BATCH, ExampleStore, write_blocks
from .tokens import CHUNK, SourceTokens, load_shards, shard_is_complete, shard_range, tokenize_to

logger = logging.getLogger("seq2seq_eval")


@dataclass
class Prepared:
    """Everything derived before generation: identical on every rank."""

    store: ExampleStore
    tokenizer: Any
    model_config: Any
    generation_config: Any
    prefix: str
    tokens: SourceTokens
    batches: list[Batch]
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per preparation step on this rank


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


def _data_key(cfg: EvalConfig) -> str:
    """What the examples cache depends on: the input options and, for local files, their size
    and modification time (a changed file is converted again; its new fingerprint then tells a
    --resume that the data changed)."""
    stamp = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in data_files(cfg)]
    options = [_canonical(cfg.input_path or cfg.dataset or cfg.data_dir), cfg.reference_path, cfg.dataset_config, cfg.split, cfg.type_path, cfg.n_obs,
               cfg.source_column, cfg.target_column, cfg.id_column, cfg.src_lang, cfg.tgt_lang, cfg.pseudolabels]
    return hashlib.sha256(json.dumps([options, stamp], default=str).encode()).hexdigest()


def _examples_store(cfg: EvalConfig, pg: ProcessGroup | None, cache: Path) -> tuple[ExampleStore, dict[str, Any]]:
    """The examples as an Arrow file in the cache: converted once by rank 0 (the others wait and
    then map it), reused by a resumed or restarted run whose inputs are unchanged."""
    path, meta_path = cache / "examples.arrow", cache / "examples.json"
    key = _data_key(cfg)

    def build() -> dict[str, Any]:
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("key") == key and path.is_file():
                return meta
        except (OSError, ValueError):
            pass
        blocks, origin = iter_examples(cfg, ROWS_PER_BATCH)
        n, sha = write_blocks(path, blocks)
        meta = {"key": key, "n": n, "sha256": sha, "origin": origin}
        write_json_atomic(meta_path, meta)  # last: the store above is complete
        return meta

    meta = pg.main_first(build, DataError) if pg is not None else build()
    return ExampleStore(path, meta["origin"]), meta


def _source_tokens(env: DistEnv, pg: ProcessGroup | None, cache: Path, key: str, store: ExampleStore,
                   tokenizer: Any, prefix: str, max_len: int | None) -> SourceTokens:
    """Each rank tokenizes its 1/world of the sources (a dry run: all of them), then maps every
    shard. Shards already complete for the same key (a resume, a restart) are kept."""
    world = env.world_size if pg is not None else 1
    ranges = [shard_range(len(store), r, world) for r in range(world)]
    start, end = ranges[env.rank if pg is not None else 0]
    if not shard_is_complete(cache, key, start, end):
        tokenize_to(cache, key, start, end, tokenizer, store.iter_sources(start, end, CHUNK), prefix, max_len)
    if pg is not None:
        pg.barrier()  # every shard is on disk
    return load_shards(cache, ranges)


def _in_memory_identity(model: Any) -> dict[str, Any]:
    """What the manifest records of a model passed in memory. No weight hash (that would read
    every parameter at every evaluation); such a run is never resumed (api.evaluate refuses
    --resume for it), so the identity only has to describe the model."""
    params = list(model.parameters())
    return {"name": f"<in-memory {type(model).__name__}>", "parameters": sum(p.numel() for p in params),
            "dtype": str(params[0].dtype).removeprefix("torch.") if params else None}


def prepare(cfg: EvalConfig, env: DistEnv, pg: ProcessGroup | None, cache: Path, device_type: str = "cpu",
            model: Any = None, tokenizer: Any = None) -> Prepared:
    """Everything before generation. `device_type` picks the default batch budget
    (plan.batch_budget); `model`, `tokenizer`: a model (and its tokenizer) already in memory
    (api.evaluate), used instead of loading --model_name."""
    model_config, base_gc = load_model_config(cfg) if model is None else model_config_of(model, cfg.model_name)
    tokenizer = load_tokenizer(cfg, tokenizer)
    entry = task_entry(model_config, cfg.task)
    if entry.note and (pg is None or pg.env.is_main):  # every rank sees the same; one says it
        logger.warning("--task %s: no task settings apply (%s)", cfg.task, entry.note)
    gc = generation_config_for(model_config, base_gc, tokenizer, cfg)
    engines.check(cfg, model_config, gc, tokenizer)
    prefix = source_prefix(model_config, cfg)
    max_source_length = source_limit(model_config, tokenizer, cfg)
    identity = _model_identity(model_config, cfg.model_name) if model is None else _in_memory_identity(model)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    store, data = _examples_store(cfg, pg, cache)
    t1 = time.perf_counter()
    token_key = hashlib.sha256(json.dumps(
        [data["sha256"], identity, prefix, max_source_length, type(tokenizer).__name__, len(tokenizer)], sort_keys=True
    ).encode()).hexdigest()
    tokens = _source_tokens(env, pg, cache, token_key, store, tokenizer, prefix, max_source_length)
    t2 = time.perf_counter()
    out_cap = gc.max_new_tokens or gc.max_length
    bs, max_tokens = batch_budget(cfg.bs, cfg.max_tokens, device_type)
    batches = make_batches(
        tokens.lengths.tolist(),
        bs=bs,
        max_tokens=max_tokens,
        out_ratio=1.0 if cfg.task_family == "translation" else 0.25,
        out_cap=out_cap,
        beams=gc.num_beams or 1,
    )
    gen_settings = {k: v for k, v in gc.to_diff_dict().items() if k != "transformers_version"}
    manifest = {
        "model": identity,
        "data": {
            # Resolved: the same files named relatively, absolutely or with a trailing slash
            # are the same run to --resume.
            "path": _canonical(cfg.input_path or cfg.dataset or cfg.data_dir),
            "dataset_config": cfg.dataset_config, "split": cfg.split,
            "n_examples": len(store), "sha256": data["sha256"],
        },
        "task": cfg.task,
        "task_settings": {"entry": entry.name, "params": json.loads(json.dumps(entry.params, default=str))},
        "type_path": cfg.type_path,
        "prefix": prefix,
        "max_source_length": max_source_length,
        "dtype": identity["dtype"] if model is not None else "float16" if cfg.fp16 else "bfloat16" if cfg.bf16 else "float32",
        "engine": engines.describe(cfg),
        "num_return_sequences": cfg.num_return_sequences,
        "seed": cfg.seed,
        "generation": json.loads(json.dumps(gen_settings, sort_keys=True, default=str)),
        "plan": {"bs": bs, "max_tokens": max_tokens, "sha256": plan_digest(batches)},
    }
    timings = {"examples": t1 - t0, "tokenize": t2 - t1, "plan": time.perf_counter() - t2}
    return Prepared(store, tokenizer, model_config, gc, prefix, tokens, batches, manifest, timings)


def describe_plan(prep: Prepared, world_size: int) -> str:
    deal = assign_batches(prep.batches, world_size)
    plan = prep.manifest["plan"]
    budget = f"--bs {plan['bs']}" if plan["bs"] is not None else f"--max_tokens {plan['max_tokens']}"
    lines = [
        f"{len(prep.store)} examples from {prep.store.origin}, {len(prep.batches)} batches ({budget}), "
        f"source padding efficiency {padding_efficiency(prep.batches, prep.tokens.lengths):.3f}",
        f"engine: {json.dumps(prep.manifest['engine'], sort_keys=True)}",
        f"task settings: {_describe_entry(prep.manifest['task_settings'])}",
        f"generation: {json.dumps(prep.manifest['generation'], sort_keys=True)}",
        f"source prefix: {prep.prefix!r}",
        f"sources truncated to {prep.manifest['max_source_length']} tokens: {prep.tokens.truncated}"
        if prep.manifest["max_source_length"] is not None else "sources are not truncated (no model limit)",
    ]
    for rank, indices in enumerate(deal):
        n = sum(len(prep.batches[i].members) for i in indices)
        cost = sum(prep.batches[i].cost for i in indices)
        lines.append(f"rank {rank}: {len(indices)} batches, {n} examples, est. cost {cost:.0f}")
    lines.append("prepared in " + ", ".join(f"{k} {v:.1f} s" for k, v in prep.timings.items()))
    return "\n".join(lines)


def _describe_entry(settings: dict[str, Any]) -> str:
    if settings["entry"] is None:
        return "none (no task_specific_params entry applies)"
    return f"task_specific_params[{settings['entry']!r}] = {json.dumps(settings['params'], sort_keys=True)}"


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


def run(cfg: EvalConfig, env: DistEnv | None = None, *, process_group: ProcessGroup | None = None,
        model: Any = None, tokenizer: Any = None) -> Outcome:
    """One rank's run. The command line passes the config alone; api.evaluate also passes the
    job's group (`process_group`, kept open: the caller closes it) and may pass a model and its
    tokenizer already in memory, which run where they are, as they are."""
    env = env or dist_env()
    t_start = time.perf_counter()
    check_output_locations(cfg)
    if cfg.dry_run:
        # A dry run is one process that never joins a group: it validates and prints the plan,
        # converting and tokenizing into a throwaway folder (the run's temp dir stays untouched).
        device, _ = resolve_device(cfg, env)
        with tempfile.TemporaryDirectory(prefix="seq2seq_eval_dry_run_") as cache:
            prep = prepare(cfg, env, None, Path(cache), device.type)
            check_tmp_dir(Path(cfg.tmp_dir), prep.manifest, cfg.resume)
            _earlier_run(cfg, prep)
            return Outcome(plan_text=describe_plan(prep, env.world_size))
    if model is not None:
        device = next(model.parameters()).device  # the caller's: its current device is set
    else:
        device, backend = resolve_device(cfg, env)
        if device.type == "cuda":
            import torch

            torch.cuda.set_device(device)
    pg = process_group if process_group is not None else ProcessGroup(env, backend, cfg.sync_timeout)
    lock: RunLock | None = None
    tmp_dir = Path(cfg.tmp_dir)
    prep: Prepared | None = None
    try:
        with _Signals():
            lock = _claim_tmp_dir(cfg, env, pg, tmp_dir)
            prep = prepare(cfg, env, pg, tmp_dir / "cache", device.type, model, tokenizer)
            _agree(env, pg, lambda: _check_manifest(cfg, env, tmp_dir, prep.manifest))
            earlier: list[Any] = []  # --compare_to's run, checked before any generation
            _agree(env, pg, lambda: earlier.append(_earlier_run(cfg, prep)))
            engine = engines.load(cfg, tokenizer=prep.tokenizer, model_config=prep.model_config,
                                  generation_config=prep.generation_config, device=device, env=env, model=model)
            t_loaded = time.perf_counter()
            # What a large run spends before generating anything (benchmarks/scale.py reads it).
            logger.info("rank %d ready to generate after %.1f s (%s)", env.rank, t_loaded - t_start,
                        ", ".join(f"{k} {v:.1f} s" for k, v in prep.timings.items()))
            stats = _generate_rank(cfg, env, prep, engine, device, tmp_dir,
                                   {"model_load_seconds": t_loaded - t_start, "prepare_seconds": prep.timings})
            if not env.is_main:
                return Outcome()
            return _finish(cfg, env, prep, tmp_dir, stats, t_start, earlier[0] if earlier else None)
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
        if process_group is None:
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


def _agree(env: DistEnv, pg: ProcessGroup, check: Any) -> None:
    """Rank 0 runs `check`; every rank learns its verdict from one broadcast, so a refused run
    stops on all ranks before any of them writes a journal line."""
    verdict: str | None = None
    if env.is_main:
        try:
            check()
        except EvalError as e:
            pg.broadcast(str(e))
            raise
    verdict = pg.broadcast(verdict)
    if verdict is not None:
        raise RunStateError(verdict)


def _claim_tmp_dir(cfg: EvalConfig, env: DistEnv, pg: ProcessGroup, tmp_dir: Path) -> RunLock | None:
    """Rank 0 creates and locks the temp dir before anything is written there (the examples
    cache comes next), and refuses an earlier run's files unless resuming."""
    holder: list[RunLock] = []

    def claim() -> None:
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(tmp_dir, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as e:
            raise RunStateError(f"--tmp_dir {tmp_dir}: not writable ({e.strerror})") from e
        lock = RunLock(tmp_dir)
        lock.acquire()
        try:
            # A worker group restarted by torchrun (--max_restarts) resumes by itself.
            refuse_earlier_run(tmp_dir, cfg.resume or env.restart_count > 0)
        except EvalError:
            lock.release()
            raise
        holder.append(lock)

    _agree(env, pg, claim)
    return holder[0] if holder else None


def _check_manifest(cfg: EvalConfig, env: DistEnv, tmp_dir: Path, manifest: dict[str, Any]) -> None:
    found = prepare_tmp_dir(tmp_dir, manifest, cfg.resume or env.restart_count > 0)
    if found:
        logger.info("resuming from %d journal(s) in %s", found, tmp_dir)


def _journal_entry_matches(entry: dict[str, Any] | None, ids: list[Any]) -> bool:
    recs = entry.get("records") if entry is not None else None
    if not isinstance(recs, list) or len(recs) != len(ids):
        return False
    return all(isinstance(r, dict) and r.get("id") == i for r, i in zip(recs, ids))


def _generate_rank(cfg: EvalConfig, env: DistEnv, prep: Prepared, engine: engines.Engine, device: Any, tmp_dir: Path,
                   startup: dict[str, Any]) -> dict[str, Any]:
    """Generate (or take from the journal) this rank's batches, scoring each on the way, into
    its rank file; returns the rank's stats."""
    from tqdm.auto import tqdm

    shares = assign_batches(prep.batches, env.world_size)
    mine = shares[env.rank]
    claims = Claims(tmp_dir, shares, env.rank, [b.cost for b in prep.batches], steal=not cfg.no_steal)
    finished = JournalIndex(tmp_dir)
    journal = Journal(journal_file(tmp_dir, env.rank))
    writer = RankWriter(tmp_dir, env.rank)
    stats = {
        "rank": env.rank, "examples": 0, "batches": 0, "planned_batches": len(mine), "stolen_batches": 0,
        "stolen_examples": 0, "resumed_batches": 0,
        "generated_examples": 0, "generated_tokens": 0, "new_generated_tokens": 0, "source_tokens": 0, "padded_source_tokens": 0,
        "generation_seconds": 0.0, "scoring_seconds": 0.0, "device": str(device), "split_batches": 0,
        "out_of_memory_errors": 0, **startup,
    }
    bar = tqdm(
        total=sum(len(prep.batches[i].members) for i in mine),
        desc=f"rank {env.rank}", unit="ex", disable=not (env.is_main or cfg.debug), file=sys.stderr,
        leave=False,  # the summary table follows; an error line must stand alone
    )
    stats["generation_started"] = time.time()
    try:
        for claimed in claims:
            index = claimed.index
            batch = prep.batches[index]
            members = list(batch.members)
            ids = prep.store.ids(members)
            stolen = claimed.stolen_by(env.rank)
            if stolen:
                stats["stolen_batches"] += 1
                stats["stolen_examples"] += len(members)
                bar.total += len(members)
            pieces = finished.batch(index)
            entry = pieces.finished() if pieces is not None else None
            if _journal_entry_matches(entry, ids):
                batch_records = entry["records"]  # type: ignore[index]
                stats["resumed_batches"] += 1
                stats["split_batches"] += int("parts" in entry)  # type: ignore[operator]
            else:
                # Splits in halves on out of memory, journaling each split and sub-batch (oom.py).
                done = run_batch(
                    engine.generate, index, [prep.tokens.ids(m) for m in members], ids,
                    journal=journal, journaled=pieces, pseudolabels=cfg.pseudolabels, device=device,
                    note={"from_rank": claimed.planned_rank} if stolen else None,
                )
                batch_records = done.records
                stats["generation_seconds"] += done.seconds
                stats["generated_examples"] += done.generated_examples
                stats["new_generated_tokens"] += done.new_tokens
                stats["source_tokens"] += done.source_tokens
                stats["padded_source_tokens"] += done.padded_source_tokens
                stats["split_batches"] += int(done.split)
                stats["out_of_memory_errors"] += done.out_of_memory
            if cfg.scored:
                t0 = time.perf_counter()
                _attach_example_stats(cfg, prep.store.targets(members), batch_records)
                stats["scoring_seconds"] += time.perf_counter() - t0
            writer.add(members, batch_records, output_lines(cfg, prep.store.examples(members), batch_records))
            stats["examples"] += len(members)
            stats["batches"] += 1
            stats["generated_tokens"] += sum(r["n_tokens"] for r in batch_records)
            bar.update(len(members))
    except BaseException:
        writer.abandon()
        raise
    finally:
        bar.close()
        journal.close()
    if device.type == "cuda":
        import torch

        stats["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    else:
        import resource

        stats["peak_memory_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    # Wall-clock, not busy time: with stealing, a rank that started late does less work, and what
    # matters is how long the first rank to finish waited for the last (finish_spread_seconds).
    stats["generation_finished"] = time.time()
    writer.close(stats)
    return stats


def _attach_example_stats(cfg: EvalConfig, targets: list[Any], records: list[dict[str, Any]]) -> None:
    """Per-example metric statistics ({metric name: statistics}) and sentence-level scores
    ({key: score}), computed by the rank that generated them, so rank 0 only adds them up and
    writes them (rouge-score and TER are the slow parts of a large run)."""
    names = cfg.metric_names
    refs = [(t,) if isinstance(t, str) else tuple(t) for t in targets]
    per_example = metric_fns.metric_statistics(names, [r["pred"] for r in records], refs)
    for rec, st, sent in zip(records, per_example, metric_fns.sentence_scores(names, per_example)):
        rec["metric_stats"] = st
        rec["sentence_scores"] = sent


def _earlier_run(cfg: EvalConfig, prep: Prepared) -> Any:
    """--compare_to's run, read and checked against this run's examples before any waiting."""
    if cfg.compare_to is None:
        return None
    from .compare import check_same_examples, load_run

    earlier = load_run(cfg.compare_to)
    check_same_examples(earlier, prep.store.ids(range(len(prep.store))), "this run")
    return earlier


def _compare(cfg: EvalConfig, prep: Prepared, table: Any, order: Any, earlier: Any) -> dict[str, Any]:
    """The paired test of this run against --compare_to's, with compare's own code."""
    import pyarrow as pa

    from .compare import compare_systems

    preds = [p[0] for p in table.take(pa.array(order)).column("pred").to_pylist()]
    refs = prep.store.targets(range(len(prep.store)))
    k = prep.store.max_references
    streams = [[(r,) if isinstance(r, str) else r for r in refs]]
    streams = [[t[j] if j < len(t) else None for t in streams[0]] for j in range(k)]
    baseline = f"{Path(cfg.compare_to).name or cfg.compare_to} (--compare_to)"
    return compare_systems({baseline: earlier.predictions, "this run": preds}, streams, metrics=cfg.metric_names)


def _missing_summary(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, missing_ranks: list[int] | None = None) -> str:
    if missing_ranks is None:
        missing_ranks = [r for r in range(env.world_size) if not rank_file(tmp_dir, r).exists()]
    done = JournalIndex(tmp_dir).finished()
    deal = assign_batches(prep.batches, env.world_size)
    left = {
        r: sum(len(prep.batches[i].members) for i in deal[r] if i not in done) for r in missing_ranks
    }
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in left.items())
    unfinished = sum(len(b.members) for b in prep.batches if b.index not in done)
    return (
        f"rank(s) {', '.join(map(str, missing_ranks)) or 'none'} did not finish ({per_rank} examples left); "
        f"{unfinished} of {len(prep.store)} examples still to generate ({len(done)} of {len(prep.batches)} "
        f"batches are kept in {tmp_dir}); resume with: {resume_command(env)}"
    )


def _finish(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, my_stats: dict[str, Any], t_start: float,
            earlier: Any) -> Outcome:
    t_wait = time.perf_counter()
    paths = wait_for_rank_files(
        tmp_dir, env.world_size, cfg.sync_timeout,
        describe_missing=lambda missing: "; " + _missing_summary(cfg, env, prep, tmp_dir, missing),
    )
    t_merge = time.perf_counter()
    outputs = [read_rank_output(p, r) for r, p in enumerate(paths)]
    table, order = merge_by_id(outputs, prep.store)
    per_rank = [o.stats for o in outputs]
    n = len(prep.store)

    def summarize(totals: metric_fns.MetricTotals | None) -> dict[str, Any]:
        metrics = totals.result(prep.store.sacrebleu_num_refs) if totals is not None else {}
        if earlier is not None:
            metrics["comparison"] = _compare(cfg, prep, table, order, earlier)
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
            # Batches run by another rank than the plan dealt them to (steal.py).
            "moved_batches": sum(s.get("stolen_batches", 0) for s in per_rank),
            "rank_imbalance": gen_seconds / (sum(s["generation_seconds"] for s in per_rank) / len(per_rank))
            if gen_seconds else None,
            # How long the first rank to finish its generation waited for the last one (clocks of
            # several nodes are only as close as NTP keeps them).
            "finish_spread_seconds": max(s["generation_finished"] for s in per_rank) - min(s["generation_finished"] for s in per_rank),
            "time_breakdown": {
                "prepare": my_stats["prepare_seconds"],  # examples, tokenize, plan: within model_load
                "model_load": my_stats["model_load_seconds"],
                "generation": my_stats["generation_seconds"],
                "scoring_on_rank": my_stats["scoring_seconds"],
                "waiting": t_merge - t_wait,
                "merge_and_scoring": t_end - t_merge,
                "total": t_end - t_start,
            },
            "per_rank": per_rank,
        }
        summary: dict[str, Any] = dict(metrics)
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
                "task_settings": prep.manifest["task_settings"],
                "generation": prep.manifest["generation"],
                "prefix": prep.prefix,
                "model": prep.manifest["model"],
                "engine": prep.manifest["engine"],
                "data": prep.manifest["data"],
                "plan": prep.manifest["plan"],
                "versions": package_versions(),
                "date": now_iso(),
                "world_size": env.world_size,
                "device_type": my_stats["device"].split(":")[0],
            },
        })
        return summary

    # In pseudolabel mode the same figures go to {type_path}_run_info.json instead of a metric file.
    written, summary, totals = write_outputs(cfg, prep.store, RowTaker(outputs), order, summarize, tail_since=t_merge)
    # The rank files are memory-mapped: drop the last references (summarize's too) before they are removed.
    table = outputs = None
    if not cfg.debug:
        cleanup_tmp_dir(tmp_dir)
    text = summary_table(summary, per_rank)
    if totals is not None:
        text += "\n" + lowest_scoring_line(prep.store, totals)
    if "comparison" in summary:
        from .compare import format_table

        text += "\n\n" + format_table(summary["comparison"])
    return Outcome(metrics=summary, written=written, table=text)
