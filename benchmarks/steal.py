"""Work-stealing benchmark: 2 ranks with one of them stopped half the time, with and without stealing.

    python benchmarks/steal.py [--model data_samples/model] [--data data_samples/translation]
                               [--bs 8] [--rounds 3] [--period 0.1] [--out bench_steal]

Each round runs four real 2-rank jobs (torchrun, gloo, CPU, one thread per rank) on the same
model, data and batch plan, in turns:

  idle / steal       nothing disturbed, stealing on (the default);
  idle / no_steal    nothing disturbed, --no_steal (every rank runs exactly its planned share);
  slow / steal       rank 1 stopped and continued in turns (SIGSTOP/SIGCONT every --period s,
                     from outside: it runs half the time), from its first batch to its end;
  slow / no_steal    the same with --no_steal.

A slowed job's ideal generation time is its examples over the sum of the two ranks' speeds,
each speed taken from the slow / no_steal job of the same round (there each rank ran its own
share alone, at its own speed). Goals (median over rounds): with stealing the fast rank generates
at least 1.6 times the slow one's examples and the generation time is within 15% of the ideal;
idle, stealing costs nothing (samples/s within 3% of no_steal) and the rank imbalance, on the
wall clock (see wall_imbalance), is at most 1.02. Writes {out}/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))
from faults import Throttle, find_worker, stop_all, wait_for_lines  # noqa: E402  (tests' helpers: a worker by its rank, slowed)
from throughput import child_env, fresh, machine  # noqa: E402

JOBS = ("idle/steal", "idle/no_steal", "slow/steal", "slow/no_steal")


def run_job(job: str, a: argparse.Namespace, save: Path) -> dict[str, Any]:
    slow, steal = job.split("/")
    tag = uuid.uuid4().hex
    args = ["--model_name", a.model, "--data_dir", a.data, "--bs", str(a.bs), "--save_dir", str(fresh(save))]
    fresh(Path(f"{save}_tmp"))
    if steal == "no_steal":
        args.append("--no_steal")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "seq2seq_eval", *args]
    log = save.parent / f"{save.name}.log"
    throttle = None
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**child_env(), "S2S_TEST_TAG": tag}, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if slow == "slow":
                pid = find_worker(tag, 1)
                wait_for_lines(Path(f"{save}_tmp") / "journal_rank_1.jsonl", 0, timeout=600)  # it is generating
                throttle = Throttle(pid, a.period)
                throttle.start()
            proc.wait()
        finally:
            stop_all(proc, throttle)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark: {job} failed with exit code {proc.returncode}; see {log}")
    tp = json.loads((save / "test_bleu.json").read_text())["throughput"]
    ranks = tp["per_rank"]
    return {
        "wall_seconds": wall,
        "generation_seconds": tp["generation_seconds"],
        "samples_per_second": tp["samples_per_second"],
        "rank_imbalance": tp["rank_imbalance"],
        "finish_spread_seconds": tp["finish_spread_seconds"],
        "wall_imbalance": wall_imbalance(ranks),
        "moved_batches": tp.get("moved_batches", 0),
        "examples": [r["examples"] for r in ranks],
        "rank_seconds": [r["generation_seconds"] for r in ranks],
        "generations": (save / "test_generations.txt").read_bytes().decode(),
    }


def wall_imbalance(per_rank: Sequence[dict[str, Any]]) -> float:
    """The last rank's generation wall time over the ranks' mean, all from the first rank's start:
    how long ranks sat waiting at the end. The metric file's rank_imbalance compares busy times,
    which stealing makes unequal on purpose (a rank that starts late, after a slower model load,
    leaves some of its share to the others), so it no longer measures waiting."""
    t0 = min(r["generation_started"] for r in per_rank)
    spans = [r["generation_finished"] - t0 for r in per_rank]
    return max(spans) / (sum(spans) / len(spans))


def judge(rounds: Sequence[dict[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[tuple[str, bool]]]:
    rows = []
    for r in rounds:
        calib = r["slow/no_steal"]
        # Each rank's own speed, from the job where it ran its planned share alone.
        speeds = [n / s for n, s in zip(calib["examples"], calib["rank_seconds"])]
        ideal = sum(calib["examples"]) / sum(speeds)
        st = r["slow/steal"]
        rows.append({
            "fast_over_slow": st["examples"][0] / st["examples"][1],
            "steal_over_ideal": st["generation_seconds"] / ideal,
            "no_steal_over_ideal": calib["generation_seconds"] / ideal,
            "steal_speedup": calib["generation_seconds"] / st["generation_seconds"],
            "idle_steal_over_no_steal": r["idle/steal"]["samples_per_second"] / r["idle/no_steal"]["samples_per_second"],
            "idle_imbalance": r["idle/steal"]["wall_imbalance"],
            "idle_no_steal_imbalance": r["idle/no_steal"]["wall_imbalance"],
            "idle_busy_imbalance": r["idle/steal"]["rank_imbalance"],
            "identical": len({j["generations"] for j in r.values()}) == 1,
        })
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0] if k != "identical"}
    goals = [
        (f"slowed: fast rank's examples / slow rank's >= 1.6 (median {med['fast_over_slow']:.2f})", med["fast_over_slow"] >= 1.6),
        (f"slowed: generation time with stealing / ideal <= 1.15 (median {med['steal_over_ideal']:.3f})",
         med["steal_over_ideal"] <= 1.15),
        (f"idle: samples/s with stealing / without >= 0.97 (median {med['idle_steal_over_no_steal']:.3f})",
         med["idle_steal_over_no_steal"] >= 0.97),
        (f"idle: rank imbalance (wall clock) with stealing <= 1.02 (median {med['idle_imbalance']:.3f})",
         med["idle_imbalance"] <= 1.02),
        ("generations identical in every job of every round", all(row["identical"] for row in rows)),
    ]
    return rows, goals


def format_table(rounds: Sequence[dict[str, dict[str, Any]]]) -> str:
    lines = [f"{'job':<16}{'gen s':>8}{'wall s':>8}{'samples/s':>11}{'rank 0 ex':>11}{'rank 1 ex':>11}{'moved':>7}"
             f"{'busy imb.':>11}{'wall imb.':>11}{'spread s':>10}"]
    for job in JOBS:
        med = {k: statistics.median(r[job][k] for r in rounds) for k in (
            "generation_seconds", "wall_seconds", "samples_per_second", "moved_batches", "rank_imbalance", "wall_imbalance", "finish_spread_seconds")}
        ex = [statistics.median(r[job]["examples"][i] for r in rounds) for i in (0, 1)]
        lines.append(f"{job:<16}{med['generation_seconds']:>8.1f}{med['wall_seconds']:>8.1f}{med['samples_per_second']:>11.1f}"
                     f"{ex[0]:>11.0f}{ex[1]:>11.0f}{med['moved_batches']:>7.0f}{med['rank_imbalance']:>11.3f}"
                     f"{med['wall_imbalance']:>11.3f}{med['finish_spread_seconds']:>10.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "data_samples" / "model"))
    p.add_argument("--data", default=str(REPO / "data_samples" / "translation"), help="a data dir with test.source/.target")
    p.add_argument("--bs", type=int, default=8, help="examples per batch (fine batches let the work move in small steps)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--period", type=float, default=0.1, help="seconds stopped, then seconds running, in turns")
    p.add_argument("--out", default="bench_steal")
    a = p.parse_args(argv)
    root = Path(a.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    rounds = []
    for k in range(a.rounds):
        results = {}
        for job in JOBS:
            results[job] = run_job(job, a, root / job.replace("/", "_"))
            print(f"  round {k + 1}/{a.rounds} {job}: generation {results[job]['generation_seconds']:.1f} s, "
                  f"examples per rank {results[job]['examples']}", flush=True)
        rounds.append(results)
    rows, goals = judge(rounds)
    print(format_table(rounds))
    for i, row in enumerate(rows):
        print(f"round {i + 1}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    for text, ok in goals:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    for r in rounds:
        for job in r.values():
            job.pop("generations")
    (root / "results.json").write_text(json.dumps({"machine": machine(), "args": vars(a), "rounds": rounds, "per_round": rows,
                                                   "goals": [{"goal": t, "pass": ok} for t, ok in goals]}, indent=1))
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
