"""One rank's generation: the batches it claims (its share, then others' leftovers), each taken from
the journal or generated and journaled, scored on the way, into its rank file."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from .. import engines, numerics
from ..scoring import totals as metric_fns
from ..config import EvalConfig
from ..outputs.write import output_lines
from .dist import DistEnv
from .journal import Journal, JournalIndex, journal_file
from .oom import run_batch
from .plan import assign_batches
from .prepare import Prepared
from .rankfiles import RankWriter
from .steal import Claims
from ..selection.in_run import RunSelection, best_first, chosen


def _journal_entry_matches(entry: dict[str, Any] | None, ids: list[Any]) -> bool:
    recs = entry.get("records") if entry is not None else None
    if not isinstance(recs, list) or len(recs) != len(ids):
        return False
    return all(isinstance(r, dict) and r.get("id") == i for r, i in zip(recs, ids))


def generate_rank(cfg: EvalConfig, env: DistEnv, prep: Prepared, engine: engines.Engine, device: Any, tmp_dir: Path,
                   startup: dict[str, Any], selector: Any = None) -> dict[str, Any]:
    """Generate (or take from the journal) this rank's batches, selecting (--select: `selector`)
    and scoring each on the way, into its rank file; returns the rank's stats."""
    import torch
    from tqdm.auto import tqdm

    shares = assign_batches(prep.batches, env.world_size)
    mine = shares[env.rank]
    claims = Claims(tmp_dir, shares, env.rank, prep.batches.cost, steal=not cfg.no_steal)
    finished = JournalIndex(tmp_dir)
    journal = Journal(journal_file(tmp_dir, env.rank))
    writer = RankWriter(tmp_dir, env.rank)
    selection = RunSelection(selector, tmp_dir, env.rank) if selector is not None else None
    stats = {
        "rank": env.rank, "examples": 0, "batches": 0, "planned_batches": len(mine), "stolen_batches": 0,
        "stolen_examples": 0, "resumed_batches": 0,
        "generated_examples": 0, "generated_tokens": 0, "new_generated_tokens": 0, "source_tokens": 0, "padded_source_tokens": 0,
        "generation_seconds": 0.0, "scoring_seconds": 0.0, "device": str(device), "split_batches": 0,
        "out_of_memory_errors": 0, **startup,
        "torch_threads": torch.get_num_threads(),
        # What makes the CPU's float sums independent of those threads (numerics.py).
        "mkl_cbwr": numerics.pin(str(device).split(":")[0]),
    }
    if selection is not None:
        stats["selection_seconds"] = 0.0
    bar = tqdm(
        total=int(prep.batches.sizes[mine].sum()),
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
            if selection is not None:  # on the generating rank, journaled (selection/in_run.py)
                t0 = time.perf_counter()
                selection.apply(index, prep.store.examples(members), batch_records)
                stats["selection_seconds"] += time.perf_counter() - t0
            if cfg.scored and cfg.metric_names:  # a reference-free run has no text metric
                t0 = time.perf_counter()
                _attach_example_stats(cfg, prep.store.targets(members), batch_records)
                stats["scoring_seconds"] += time.perf_counter() - t0
            lines = output_lines(cfg, prep.store.examples(members), batch_records)
            writer.add(members, [best_first(r) for r in batch_records] if selection else batch_records, lines)
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
        if selection is not None:
            selection.close()
    if selection is not None:
        stats.update(select_signature=selection.signature, resumed_selections=selection.resumed)
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
    per_example = metric_fns.metric_statistics(names, [chosen(r) for r in records], refs)
    for rec, st, sent in zip(records, per_example, metric_fns.sentence_scores(names, per_example)):
        rec["metric_stats"] = st
        rec["sentence_scores"] = sent
