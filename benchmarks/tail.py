"""Rank 0's tail on synthetic records: what `throughput.py` and `scale.py` time.

`make_rank_files` writes, without any model, what ranks would have left in the temp dir after
generating N examples: the example store and one rank file per rank, with batches of 16 dealt
to the ranks in a shuffled order as a length-sorted plan deals them. `run_tail` then runs
seq2seq_eval's own rank-0 path on them (read the rank files, merge by id, add up the metric,
write every output) and returns its seconds.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from seq2seq_eval.scoring import totals as metrics
from seq2seq_eval.config import EvalConfig
from seq2seq_eval.inputs.examples import Example
from seq2seq_eval.outputs.merge import merge_by_id
from seq2seq_eval.outputs.parts import columns_taken, roles
from seq2seq_eval.outputs.shuffle import gathered
from seq2seq_eval.outputs.write import output_lines, write_outputs
from seq2seq_eval.run.rankfiles import RankWriter, read_rank_output
from seq2seq_eval.inputs.store import ExampleStore, write_store

TASK = "translation"


def _config(work: Path, out: Path, candidates: int) -> EvalConfig:
    return EvalConfig(save_dir=str(out), task=TASK, data_dir=str(work), num_return_sequences=candidates)


def make_rank_files(work: Path, sources: list[str], targets: list[str], n_ranks: int, candidates: int = 1) -> None:
    """`candidates` > 1: pseudolabel records (that many candidates with beam scores, no metric);
    else scored records with BLEU statistics and sentence scores, as a rank computes them."""
    n = len(sources)
    rng = random.Random(0)
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    # Examples made as they are written, never all at once: at 10M they were gigabytes of objects.
    write_store(work / "examples.arrow", (Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets))))
    # What each rank serializes as it goes, so the tail below is rank 0's part alone.
    cfg = _config(work, work, candidates)
    batches = [list(range(i, min(i + 16, n))) for i in range(0, n, 16)]
    rng.shuffle(batches)
    writers = [RankWriter(work / "tmp", r) for r in range(n_ranks)]
    counts = [0] * n_ranks
    for j, batch in enumerate(batches):
        preds = []
        for i in batch:  # a near miss per reference, so statistics are realistic
            words = targets[i].split()
            if len(words) > 1:
                del words[rng.randrange(len(words))]
            preds.append(" ".join(words))
        if candidates > 1:
            records: list[dict[str, Any]] = [
                {"id": i, "pred": [p] + [p + " x" * k for k in range(1, candidates)], "n_tokens": len(p.split()) + 1,
                 "scores": [-0.1 * k for k in range(candidates)]} for i, p in zip(batch, preds)]
        else:
            stats = metrics.metric_statistics(["bleu"], preds, [targets[i] for i in batch])
            sentence = metrics.sentence_scores(["bleu"], stats)
            records = [{"id": i, "pred": p, "n_tokens": len(p.split()) + 1, "metric_stats": st, "sentence_scores": se}
                       for i, p, st, se in zip(batch, preds, stats, sentence)]
        examples = [Example(i, sources[i], targets[i]) for i in batch]
        writers[j % n_ranks].add(batch, records, output_lines(cfg, examples, records))
        counts[j % n_ranks] += len(batch)
    for r, w in enumerate(writers):
        w.close({"rank": r, "examples": counts[r]})


def run_tail(work: Path, out: Path, n_ranks: int, candidates: int = 1) -> tuple[float, dict[str, Any]]:
    """seq2seq_eval's rank-0 path on the files `make_rank_files` wrote; (seconds, metric file)."""
    cfg = _config(work, out, candidates)
    t0 = time.perf_counter()
    store = ExampleStore(work / "examples.arrow", str(work))
    outputs = [read_rank_output(work / "tmp" / f"rank_{r}_output.json", r) for r in range(n_ranks)]
    _, order = merge_by_id(outputs, store)

    def summarize(totals: metrics.MetricTotals | None) -> dict[str, Any]:
        scores = totals.result(store.sacrebleu_num_refs) if totals is not None else {}
        return {**scores, "n_obs": len(store), "throughput": {"time_breakdown": {}}}

    # As finish.py: rows at random, or every rank file spilled beside them and read back (outputs/shuffle.py).
    rows = gathered(outputs, order, columns_taken(roles(cfg), cfg.scored), work / "tmp" / "tail_spill_all_0.arrow")
    _, summary, _ = write_outputs(cfg, store, rows, summarize, tail_since=t0)
    return time.perf_counter() - t0, summary


def run_tail_rank(work: Path, out: Path, rank: int, n_ranks: int, candidates: int = 1) -> dict[str, Any]:
    """One rank of the shared tail on the files `make_rank_files` wrote, as a run's rank does it:
    its slice of the outputs (run/sharedtail.py); rank 0 then waits for every slice and joins
    them. Start one process per rank at once; returns this rank's seconds (rank 0: its whole
    tail, its slice, the wait and the join) and, on rank 0, the metric file."""
    from seq2seq_eval.outputs.parts import Parts
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.sharedtail import wait_for_parts, write_my_part

    cfg = _config(work, out, candidates)
    env = DistEnv(rank=rank, world_size=n_ranks)
    t0 = time.perf_counter()
    store = ExampleStore(work / "examples.arrow", str(work))
    write_my_part(cfg, env, store, work / "tmp")
    result: dict[str, Any] = {"slice_seconds": time.perf_counter() - t0}
    if rank == 0:
        parts: Parts = wait_for_parts(cfg, n_ranks, work / "tmp")
        result["wait_seconds"] = time.perf_counter() - t0 - result["slice_seconds"]

        def summarize(totals: metrics.MetricTotals | None) -> dict[str, Any]:
            scores = totals.result(store.sacrebleu_num_refs) if totals is not None else {}
            return {**scores, "n_obs": len(store), "throughput": {"time_breakdown": {}}}

        _, summary, _ = write_outputs(cfg, store, parts, summarize, tail_since=t0)
        result["summary"] = summary
    result["seconds"] = time.perf_counter() - t0
    return result


def clear_parts(work: Path) -> None:
    """Removes the slices an earlier shared tail left beside the rank files."""
    for path in (work / "tmp").glob("tail_*"):
        path.unlink()
