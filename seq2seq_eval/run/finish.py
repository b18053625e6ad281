"""Rank 0's tail: wait for every rank file, merge by id, score, write the outputs and the summary;
and what to say when ranks did not finish (what is missing, how to resume)."""

from __future__ import annotations

import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..scoring import totals as metric_fns
from ..config import EvalConfig
from ..outputs.merge import merge_by_id
from ..outputs.parts import columns_taken, roles
from ..outputs.shuffle import gathered
from ..outputs.summary import lowest_scoring_line, now_iso, package_versions, summary_table
from ..outputs.write import write_outputs
from .dist import DistEnv
from .journal import JournalIndex
from .model_scores import system_scores, with_model_scores
from .plan import assign_batches
from .prepare import Prepared
from .presence import wait_for_ranks_to_leave
from .rankfiles import rank_file, read_rank_output, wait_for_rank_files
from .sharedtail import missing_parts, spill_file, wait_for_parts, write_my_part
from .presence import mark_done
from .tmpdir import cleanup_tmp_dir
from .tmpmarker import tmp_token

logger = logging.getLogger("seq2seq_eval")


@dataclass
class Outcome:
    """What the CLI reports: metrics on rank 0, nothing on other ranks."""

    metrics: dict[str, Any] | None = None
    written: list[Path] = field(default_factory=list)
    table: str = ""
    plan_text: str = ""


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


def earlier_run(cfg: EvalConfig, prep: Prepared) -> Any:
    """--compare_to's run, read and checked against this run's examples before any waiting."""
    if cfg.compare_to is None:
        return None
    from ..comparison.runs import check_same_examples, check_same_references, load_run

    earlier = load_run(cfg.compare_to, complete=not cfg.dry_run)
    check_same_examples(earlier, prep.store.ids(range(len(prep.store))), "this run")
    check_same_references(earlier, _reference_fingerprints(prep), "this run")
    return earlier


def _reference_fingerprints(prep: Prepared, chunk: int = 20_000) -> list[str]:
    """The fingerprint of each reference set, read from the store a chunk at a time."""
    from ..comparison.runs import reference_fingerprints

    n = len(prep.store)
    targets = (t for i in range(0, n, chunk) for t in prep.store.targets(range(i, min(n, i + chunk))))
    return reference_fingerprints(targets, prep.store.max_references)


def _compare(cfg: EvalConfig, prep: Prepared, table: Any, order: Any, earlier: Any) -> dict[str, Any]:
    """The paired test of this run against --compare_to's, with compare's own code."""
    import pyarrow as pa

    from ..comparison.systems import compare_systems

    preds = [p[0] for p in table.take(pa.array(order)).column("pred").to_pylist()]
    refs = prep.store.targets(range(len(prep.store)))
    k = prep.store.max_references
    streams = [[(r,) if isinstance(r, str) else r for r in refs]]
    streams = [[t[j] if j < len(t) else None for t in streams[0]] for j in range(k)]
    baseline = f"{Path(cfg.compare_to).name or cfg.compare_to} (--compare_to)"
    comparison = compare_systems({baseline: earlier.predictions, "this run": preds}, streams, metrics=cfg.metric_names)
    # The keys `compare --json` prints: task and inputs beside the results.
    comparison.update(task=cfg.task, inputs={baseline: str(cfg.compare_to), "this run": str(cfg.save_dir)})
    if cfg.model_metric_names:
        # Said, not left out in silence: the test here covers the text metrics; a model metric's
        # needs both runs scored by that model (the `compare` command does it).
        comparison["not_compared"] = {
            name: f"--compare_to tests the text metrics; for {name}: seq2seq_eval compare --predictions "
                  f"{cfg.compare_to} {cfg.save_dir} --metrics {name} (with this run's {name} options)"
            for name in cfg.model_metric_names}
    return comparison


def missing_summary(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, missing_ranks: list[int] | None = None) -> str:
    if missing_ranks is None:
        missing_ranks = [r for r in range(env.world_size) if not rank_file(tmp_dir, r).exists()]
    if not missing_ranks and env.world_size > 1 and cfg.shared_tail and missing_parts(tmp_dir, env.world_size):
        return missing_tail_summary(env, tmp_dir)
    done = JournalIndex(tmp_dir).finished()
    deal = assign_batches(prep.batches, env.world_size)
    sizes = prep.batches.sizes
    open_ = np.ones(len(sizes), bool)
    open_[[i for i in done if 0 <= i < len(sizes)]] = False
    left = {r: int(sizes[deal[r]][open_[deal[r]]].sum()) for r in missing_ranks}
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in left.items())
    unfinished = int(sizes[open_].sum())
    if not missing_ranks and not unfinished:
        return (f"every rank had finished; nothing was published: {cfg.save_dir} holds what it held before, and "
                f"every batch is kept in {tmp_dir}; resume with: {resume_command(env)}")
    return (
        f"rank(s) {', '.join(map(str, missing_ranks)) or 'none'} did not finish ({per_rank} examples left); "
        f"{unfinished} of {len(prep.store)} examples still to generate ({len(done)} of {len(prep.batches)} "
        f"batches are kept in {tmp_dir}); resume with: {resume_command(env)}"
    )


def missing_tail_summary(env: DistEnv, tmp_dir: Path, missing: list[int] | None = None) -> str:
    missing = missing_parts(tmp_dir, env.world_size) if missing is None else missing
    return (f"every rank finished generating, but rank(s) {', '.join(map(str, missing))} did not write their slice "
            f"of the outputs; every batch is kept in {tmp_dir}; resume with: {resume_command(env)}")


def finish(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, my_stats: dict[str, Any], t_start: float,
            earlier: Any, model_scores: dict[str, Any] | None = None, abort: Any = None,
            progress: dict[str, Any] | None = None, also: Any = None) -> Outcome:
    """`model_scores`: run.model_scores' values of the model metrics (COMET), when --metrics names
    one. `progress["published"]` is set once the outputs are published (an interruption after
    that is reported as such). `also`: what the command writes besides, in the same transaction
    (outputs.write.write_outputs)."""
    t_wait = time.perf_counter()
    paths = wait_for_rank_files(
        tmp_dir, env.world_size, cfg.sync_timeout,
        describe_missing=lambda missing: "; " + missing_summary(cfg, env, prep, tmp_dir, missing), abort=abort,
    )
    t_merge = time.perf_counter()
    outputs = [read_rank_output(p, r) for r, p in enumerate(paths)]
    per_rank = [o.stats for o in outputs]
    shared = env.world_size > 1 and cfg.shared_tail
    rows: Any = None
    if shared:
        # Rank 0's own slice, then the others': rank 0 only completes the files (sharedtail.py).
        write_my_part(cfg, env, prep.store, tmp_dir)
        rows = wait_for_parts(cfg, env.world_size, tmp_dir, lambda missing: "; " + missing_tail_summary(env, tmp_dir, missing))
    table = order = None
    if not shared or earlier is not None:
        table, order = merge_by_id(outputs, prep.store)
    n = len(prep.store)

    def summarize(totals: metric_fns.MetricTotals | None) -> dict[str, Any]:
        metrics = totals.result(prep.store.sacrebleu_num_refs) if totals is not None else {}
        metrics.update(system_scores(model_scores))
        if "select_signature" in my_stats:  # --select: what chose each generation (selection/in_run.py)
            metrics["select_signature"] = my_stats["select_signature"]
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
                # Everything before the first batch, and its steps in the order they ran.
                "startup": my_stats["startup_seconds"],
                "startup_steps": my_stats["startup_steps"],
                "prepare": my_stats["prepare_seconds"],  # the steps of run/prepare.py: within startup
                "model_load": my_stats["model_load_seconds"],  # the engine's model alone: within startup
                "generation": my_stats["generation_seconds"],
                "scoring_on_rank": my_stats["scoring_seconds"],
                "waiting": t_merge - t_wait,
                "merge_and_scoring": t_end - t_merge,
                "total": t_end - t_start,
            },
            "per_rank": per_rank,
        }
        if model_scores:
            throughput["model_metrics"] = model_scores["stats"]  # COMET's batches and rank 0's time
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
                # A decoder-only model's prompts (an encoder-decoder's provenance is as it was).
                **({"prompt": prep.manifest["prompt"]} if "prompt" in prep.manifest else {}),
                "model": prep.manifest["model"],
                "engine": prep.manifest["engine"],
                "data": prep.manifest["data"],
                # What --compare_to checks a later run against (comparison.runs).
                **({"references": {"sha256": _reference_fingerprints(prep)}} if cfg.scored else {}),
                # The budget and how it was chosen: --budget_for_world_size's depends on the world
                # size, and --max_tokens with the recorded value gives the same batches at any other.
                "plan": {**prep.manifest["plan"], "budget": prep.budget},
                "versions": package_versions(),
                "date": now_iso(),
                "world_size": env.world_size,
                "torch_threads_per_rank": [s.get("torch_threads") for s in per_rank],
                # MKL's mode on each rank: with STRICT the outputs do not depend on the threads
                # per rank (docs/outputs.md).
                "mkl_cbwr_per_rank": [s.get("mkl_cbwr") for s in per_rank],
                "device_type": my_stats["device"].split(":")[0],
            },
        })
        return summary

    # In pseudolabel mode the same figures go to {type_path}_run_info.json instead of a metric file.
    if not shared:
        # Rank 0 alone: rows taken at random, or every rank file spilled and read back (shuffle.py).
        rows = gathered(outputs, order, columns_taken(roles(cfg), cfg.scored), spill_file(tmp_dir, "all", 0))
        if model_scores:
            rows = with_model_scores(rows, model_scores)
    token = tmp_token(tmp_dir)

    def whole() -> None:
        # The outputs are in place in every folder: from here a signal, a kill or a fault leaves
        # a complete run, said so, and its temp dir is the next command's to clear, not to resume
        # (the publish marked it so: publish_together, for the staging that names it).
        if progress is not None:
            progress["published"] = True

    written, summary, totals = write_outputs(cfg, prep.store, rows, summarize, tail_since=t_merge,
                                             tmp_token=token, also=also, on_whole=whole)
    # The rank files are memory-mapped: drop the last references (summarize's too) before they are removed.
    table = outputs = None
    mark_done(tmp_dir)  # the other ranks may go now (runner._wait_for_main)
    if not cfg.debug:
        # A rank may still be in the temp dir (a model metric's phase it began after this rank
        # had scored every batch): it goes once it sees rank0.done.
        staying = wait_for_ranks_to_leave(tmp_dir, env.world_size, cfg.sync_timeout)
        if staying:
            logger.warning("rank(s) %s still use %s after --sync_timeout %g s; left in place (remove it before the "
                           "next run there)", ", ".join(map(str, staying)), tmp_dir, cfg.sync_timeout)
        else:
            cleanup_tmp_dir(tmp_dir)
    text = summary_table(summary, per_rank)
    # The first metric --metrics names ranks them, a model metric's values as a text metric's.
    lowest = lowest_scoring_line(prep.store, totals, first=cfg.ranking_metric, model_scores=model_scores)
    if lowest is not None:
        text += "\n" + lowest
    if "comparison" in summary:
        from ..comparison.table import format_table

        text += "\n\n" + format_table(summary["comparison"])
    return Outcome(metrics=summary, written=written, table=text)
