"""Where a rank's bytes go before its first batch: resident memory after each step of preparation.

    python benchmarks/memory.py --data_dir DATA --cache CACHE [--bs 64] [--world 2]

One process does what `prepare` does on a rank (examples store, token shards, plan, the deal,
the plan digest, a dry run's description) and prints, after each step, its resident memory split
into anonymous memory (the process's own) and file-backed pages (memory maps, shared through the
page cache: a map counts here once touched), and what Python allocated (tracemalloc), then the
largest Python allocation sites. CACHE keeps the examples and the token shards between runs (as a
--resume does), so a second run measures the steps without tokenizing again.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def rss() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile in MB, from /proc/self/status."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--cache", required=True)
    p.add_argument("--bs", type=int, default=None)
    p.add_argument("--world", type=int, default=2, help="world size of the deal")
    p.add_argument("--trace", action="store_true", help="also trace Python allocations (slower)")
    a = p.parse_args()

    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.run import prepare as prep_mod
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.plan import assign_batches, plan_digest

    cfg = EvalConfig(data_dir=a.data_dir, save_dir=str(Path(a.cache) / "out"), bs=a.bs, dry_run=True)
    env = DistEnv(rank=0, world_size=1, local_rank=0)
    cache = Path(a.cache)
    rows = []

    def step(name: str, t0: float) -> None:
        now = rss()
        traced = tracemalloc.get_traced_memory()[0] / 2**20 if a.trace else float("nan")
        rows.append((name, time.perf_counter() - t0, now["VmRSS"], now["RssAnon"], now["RssFile"], traced))
        print(f"{name:<28}{rows[-1][1]:>8.1f} s{now['VmRSS']:>9.0f} MB rss{now['RssAnon']:>9.0f} anon"
              f"{now['RssFile']:>9.0f} file{traced:>9.0f} py MB", flush=True)

    t = time.perf_counter()
    # Everything up to the examples: model settings, tokenizer (the fixed baseline).
    import seq2seq_eval.run.runner  # noqa: F401  what a rank imports
    step("imports", t)
    if a.trace:
        tracemalloc.start(8)
    t = time.perf_counter()
    prep = prep_mod.prepare(cfg, env, None, cache, "cpu")
    step("prepare (all)", t)
    n = len(prep.store)
    t = time.perf_counter()
    deal = assign_batches(prep.batches, a.world)
    step(f"deal to {a.world} ranks", t)
    t = time.perf_counter()
    plan_digest(prep.batches)
    step("plan digest again", t)
    t = time.perf_counter()
    prep_mod.describe_plan(prep, a.world)
    step("describe plan", t)
    t = time.perf_counter()
    first = prep.batches[deal[0][0]]
    prep.store.examples(list(first.members))
    [prep.tokens.ids(m) for m in first.members]
    step("first batch's inputs", t)
    print(f"\n{n} examples, {len(prep.batches)} batches; peak RSS {rss()['VmHWM']:.0f} MB; "
          f"timings {', '.join(f'{k} {v:.1f} s' for k, v in prep.timings.items())}")
    if a.trace:
        snapshot = tracemalloc.take_snapshot()
        print("\nlargest Python allocation sites still held:")
        for stat in snapshot.statistics("lineno")[:12]:
            print(f"  {stat.size / 2**20:8.1f} MB  {stat.count:>9} blocks  {stat.traceback[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
