"""Rank balance of the batch budget: whole multi-rank runs under the world-size rule
(--budget_for_world_size: run/plan.py, default_plan) against the default (the device's budget at
every world size), in one invocation; or (--issue63) the default budget alone, as issue 63 ran it.

    python benchmarks/balance.py [--model opus] [--n 240,600] [--engines hf,ctranslate2] [--nproc 2]
                                 [--max_new_tokens 64] [--rounds 1] [--out bench_balance]
    python benchmarks/balance.py --issue63 [--model embedded,opus] [--n 240,360] [--rounds 3]

--issue63: for each model (`embedded`: data_samples/model; `opus`: the random opus-mt-size BART;
or a folder), engine and size, a real job on the first N examples of the embedded translation
set (data_samples/translation) with the device's default budget, 4 beams (the models' settings),
--max_new_tokens 64 --early_stopping true, float32, 2 ranks of one thread, no --min_new_tokens
(the estimate is not told that random weights reach the limit). Reported per job: the metric
file's rank_imbalance and finish_spread_seconds, each rank's examples and generation seconds, the
batches that moved; median over the rounds. Goal: rank_imbalance <= 1.10 for every job. The
opus-size model on 360 examples takes minutes a job on 2 cores: `--n 240` for it, or
`--opus_n 240` (the default) to run it on that size only.

For each engine and set size (the first N examples of `scripts/make_data.py --bench`), a real
job (torchrun, gloo, CPU, one thread per rank) with --budget_for_world_size, then the same with the
default pinned (`--max_tokens` = DEFAULT_MAX_TOKENS for the engine on CPU). Where the rule chose the
old budget the plan is the same, and the one run stands for both. Reported per job: the budget,
the batches per rank, the metric file's rank_imbalance (the slowest rank's generation seconds over
the mean), its generation seconds and the whole job's wall seconds (torchrun start to exit).
Goals: rank_imbalance <= 1.10 for every job under the rule, and its wall time at the largest N no
worse than the old rule's (within 3%: the spread of one job run twice here). A warm-up job per
engine first (the CTranslate2 conversion, the caches). Writes {out}/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from throughput import build_opus_size, child_env, fresh, machine  # noqa: E402

from seq2seq_eval.run.plan import DEFAULT_MAX_TOKENS  # noqa: E402

STOPPING = ["--early_stopping", "true"]
"""In every job, on both engines: the stop CTranslate2's beam search makes (engines/ct2_rules.py
refuses generate()'s default, early_stopping=False, under --engine ctranslate2)."""
MAX_RANK_IMBALANCE = 1.10
WALL_TOLERANCE = 1.03


def job_args(model: str, data: Path, engine: str, n: int, max_new_tokens: int, budget: list[str], save: Path,
             floor: bool = True) -> list[str]:
    """One job's seq2seq_eval arguments (tests/test_benchmark_smoke.py dry-runs them on each engine).
    Random weights never end an output early: every output is max_new_tokens long, whatever its
    source, where the plan's estimate (run/plan.py) takes a trained model's, about the source's
    length. `floor`: --min_new_tokens says what happens anyway, so that the estimate knows it (its
    out_floor); with beams CTranslate2 honours it with --renormalize_logits true only. Without it
    (--issue63) the run is the issue's, and only the plan's split (run/split.py, split_costly,
    which sizes batches by the length limit) keeps the ranks together."""
    floored = ["--min_new_tokens", str(max_new_tokens), "--renormalize_logits", "true"] if floor else []
    return ["--model_name", model, "--data_dir", str(data), "--n_obs", str(n), "--engine", engine,
            "--max_new_tokens", str(max_new_tokens), *floored, "--save_dir", str(save), *STOPPING, *budget]


def run_job(a: argparse.Namespace, model: str, data: Path, engine: str, n: int, budget: list[str], save: Path,
            floor: bool = True) -> dict[str, Any]:
    fresh(save)
    fresh(Path(f"{save}_tmp"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.nproc}", "-m", "seq2seq_eval",
           *job_args(model, data, engine, n, a.max_new_tokens, budget, save, floor)]
    log = save.parent / f"{save.name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark: {engine} n={n} {budget or 'default'} failed with exit code {proc.returncode}; see {log}")
    metrics = json.loads((save / "test_bleu.json").read_text())
    tp, plan = metrics["throughput"], metrics["provenance"]["plan"]
    return {
        "max_tokens": plan["max_tokens"], "budget": plan.get("budget"), "wall_seconds": wall,
        "generation_seconds": tp["generation_seconds"], "rank_imbalance": tp["rank_imbalance"],
        "finish_spread_seconds": tp.get("finish_spread_seconds"), "moved_batches": tp.get("moved_batches"),
        "batches_per_rank": [r["batches"] for r in tp["per_rank"]],
        "examples_per_rank": [r.get("examples") for r in tp["per_rank"]],
        "generation_seconds_per_rank": [r["generation_seconds"] for r in tp["per_rank"]],
        "generations": (save / "test_generations.txt").read_bytes().decode(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="opus", help="a model folder, or 'opus': a random BART at opus-mt-en-de's size")
    p.add_argument("--n", default="240,600", help="set sizes (the first N benchmark examples)")
    p.add_argument("--engines", default="hf,ctranslate2")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default="bench_balance")
    p.add_argument("--issue63", action="store_true", help="issue 63's runs: the default budget alone, no --min_new_tokens")
    p.add_argument("--opus_n", default="240", help="--issue63: the sizes the opus-size model runs (of --n)")
    a = p.parse_args(argv)
    if a.issue63:
        return issue63(a)
    root = Path(a.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in a.n.split(",") if x]
    engines = [e for e in a.engines.split(",") if e]
    model = str(build_opus_size(root / "bart-opus-size")) if a.model == "opus" else a.model
    data = root / "data" / "translation"
    if not (data / "test.source").exists():
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_data.py"), "--task", "translation", "--bench",
                        str(max(sizes)), "--out", str(root / "data")], check=True, capture_output=True, timeout=300)
    for engine in engines:  # warm-up: the CTranslate2 conversion, the file caches
        run_job(a, model, data, engine, 4, [], root / f"warmup_{engine}")
    rounds: list[dict[str, Any]] = []
    for r in range(a.rounds):
        jobs: dict[str, Any] = {}
        for engine in engines:
            for n in sizes:
                rule = run_job(a, model, data, engine, n, ["--budget_for_world_size"], root / f"{engine}_{n}_rule")
                old_budget = DEFAULT_MAX_TOKENS[engine]["cpu"]
                same = rule["max_tokens"] == old_budget
                old = rule if same else run_job(a, model, data, engine, n, ["--max_tokens", str(old_budget)],
                                               root / f"{engine}_{n}_old")
                jobs[f"{engine} {n}"] = {"rule": rule, "old": old, "same_plan": same,
                                         "identical_generations": rule["generations"] == old["generations"]}
                print(f"round {r + 1} {engine} n={n}: rule --max_tokens {rule['max_tokens']} {rule['batches_per_rank']} "
                      f"imbalance {rule['rank_imbalance']:.3f} wall {rule['wall_seconds']:.1f} s; old --max_tokens {old_budget}"
                      + (" (the same plan)" if same else f" {old['batches_per_rank']} imbalance {old['rank_imbalance']:.3f} "
                         f"wall {old['wall_seconds']:.1f} s"), flush=True)
        rounds.append(jobs)
    med = lambda key, which, f: statistics.median(r[key][which][f] for r in rounds)  # noqa: E731
    print(f"\n{a.nproc} ranks, model {model}, {a.max_new_tokens} new tokens at most, median of {a.rounds} round(s)")
    print(f"{'job':<18}{'rule budget':>12}{'batches':>14}{'imbalance':>10}{'wall s':>8}{'old budget':>12}{'batches':>14}"
          f"{'imbalance':>10}{'wall s':>8}")
    goals = []
    for key in rounds[0]:
        rule, old = rounds[0][key]["rule"], rounds[0][key]["old"]
        print(f"{key:<18}{rule['max_tokens']:>12}{str(rule['batches_per_rank']):>14}{med(key, 'rule', 'rank_imbalance'):>10.3f}"
              f"{med(key, 'rule', 'wall_seconds'):>8.1f}{old['max_tokens']:>12}{str(old['batches_per_rank']):>14}"
              f"{med(key, 'old', 'rank_imbalance'):>10.3f}{med(key, 'old', 'wall_seconds'):>8.1f}")
        imb = med(key, "rule", "rank_imbalance")
        goals.append((f"{key}: rank_imbalance under the rule <= {MAX_RANK_IMBALANCE}: {imb:.3f}", imb <= MAX_RANK_IMBALANCE))
        if key.endswith(f" {max(sizes)}"):
            ratio = med(key, "rule", "wall_seconds") / med(key, "old", "wall_seconds")
            same = all(r[key]["same_plan"] for r in rounds)
            goals.append((f"{key}: wall time under the rule / the old rule's <= {WALL_TOLERANCE}: {ratio:.3f}"
                          + (" (the same plan: one run)" if same else ""), ratio <= WALL_TOLERANCE))
    for text, ok in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    for r in rounds:
        for job in r.values():
            for which in ("rule", "old"):
                job[which].pop("generations", None)
    (root / "results.json").write_text(json.dumps({"machine": machine(), "args": vars(a), "rounds": rounds,
                                                   "goals": [{"goal": t, "pass": ok} for t, ok in goals]}, indent=1))
    return 0 if all(ok for _, ok in goals) else 1


def issue63(a: argparse.Namespace) -> int:
    """Issue 63's runs (the module's docstring): rank_imbalance of the default budget."""
    root = Path(a.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in a.n.split(",") if x]
    opus_sizes = {int(x) for x in a.opus_n.split(",") if x}
    engines = [e for e in a.engines.split(",") if e]
    models = {}
    for name in (m for m in a.model.split(",") if m):
        models[name] = (str(REPO / "data_samples" / "model") if name == "embedded" else
                        str(build_opus_size(root / "bart-opus-size")) if name == "opus" else name)
    data = REPO / "data_samples" / "translation"
    for name, model in models.items():  # warm-up: the CTranslate2 conversion, the file caches
        for engine in engines:
            run_job(a, model, data, engine, 4, [], root / f"warmup_{engine}", floor=False)
    jobs = [(name, engine, n) for name in models for engine in engines for n in sizes
            if name != "opus" or n in opus_sizes]
    rounds: list[dict[str, Any]] = []
    for r in range(a.rounds):
        done = {}
        for name, engine, n in jobs:
            job = run_job(a, models[name], data, engine, n, [], root / f"{name}_{engine}_{n}", floor=False)
            job.pop("generations")
            done[f"{name} {engine} {n}"] = job
            print(f"round {r + 1} {name} {engine} n={n}: imbalance {job['rank_imbalance']:.3f} finish spread "
                  f"{job['finish_spread_seconds']:.1f} s, examples {job['examples_per_rank']}, seconds "
                  f"{[round(x, 1) for x in job['generation_seconds_per_rank']]}, batches {job['batches_per_rank']}, "
                  f"moved {job['moved_batches']}", flush=True)
        rounds.append(done)
    print(f"\n{a.nproc} ranks of one thread, the default budget, 4 beams, {a.max_new_tokens} new tokens at most, "
          f"median of {a.rounds} round(s)")
    print(f"{'job':<28}{'batches':>10}{'imbalance':>11}{'spread s':>10}{'generation s':>14}")
    goals = []
    for key in rounds[0]:
        med = lambda f: statistics.median(r[key][f] for r in rounds)  # noqa: E731
        print(f"{key:<28}{sum(rounds[0][key]['batches_per_rank']):>10}{med('rank_imbalance'):>11.3f}"
              f"{med('finish_spread_seconds'):>10.1f}{med('generation_seconds'):>14.1f}")
        each = ", ".join(f"{r[key]['rank_imbalance']:.3f}" for r in rounds)
        goals.append((f"{key}: rank_imbalance <= {MAX_RANK_IMBALANCE:.2f}: {med('rank_imbalance'):.3f} (rounds: {each})",
                      med("rank_imbalance") <= MAX_RANK_IMBALANCE))
    for text, ok in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    (root / "results_issue63.json").write_text(json.dumps({"machine": machine(), "args": vars(a), "rounds": rounds,
                                                           "goals": [{"goal": t, "pass": ok} for t, ok in goals]}, indent=1))
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
