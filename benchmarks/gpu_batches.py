"""Every planned batch of a test set timed on one GPU; from those timings, the wall time of N GPUs
under the old default budget and under the world-size rule (run/plan.py, default_plan).

    python benchmarks/gpu_batches.py                     # newstest2017's German side, fp32 and fp16, on the GPU
    python benchmarks/gpu_batches.py --device cpu --model tiny --limit 40 --worlds 2 --dtypes float32   # a quick check
    python benchmarks/gpu_batches.py --project bench_out/gpu_batches/timings.json   # the projection again, no GPU

The model is a randomly initialised Marian at Helsinki-NLP/opus-mt-en-de's size (gpu.build_marian,
4 beams) on the HF engine. A random model does not stop by itself, so every batch runs exactly the
decoder steps the plan's estimate assumes of it: its padded source length, at most --max_steps
(120, the embedded model's translation max_length); min_new_tokens = max_new_tokens. Each budget's
plan (make_batches, the sources tokenized with the embedded tokenizer and its task prefix, as the
tool does) is timed batch by batch, largest budgets first, until --time_limit: the device default,
the rule's budget at each world size of --worlds, and any --budgets.

From the timings: a fit of each step's time to a + b x (rows weighted as the estimate weighs them),
whose ratio a/b is the step's fixed cost in the estimate's units (plan.STEP_OVERHEAD); and for each
world size the run's own deal (assign_batches on the estimated costs, with stealing simulated: a
rank out of work takes the unstarted batch at the end of the share with the most estimated cost
left, as run/steal.py does) replayed on the measured times, under the old default (the device
default at every world size) and the rule's budget. Writes {out}/timings.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from seq2seq_eval.run.plan import (  # noqa: E402
    DEFAULT_MAX_TOKENS, STEP_OVERHEAD, assign_batches, default_plan, make_batches,
)

NEWSTEST = REPO.parent / "shared" / "realdata" / "sacrebleu_wmt17_en_de" / "newstest2017-ende-ref.de.txt"
PREFIX = "translate: "  # the embedded model's translation prefix, which the tool prepends
BEAMS = 4
DTYPE_KEYS = {"float32": "hf", "float16": "hf_half", "bfloat16": "hf_half"}


def source_lengths(text: Path, limit: int | None) -> list[int]:
    from transformers import AutoTokenizer

    # split("\n"): news text may hold U+2028, which splitlines() would take for a line end.
    lines = text.read_text(encoding="utf-8").removesuffix("\n").split("\n")[:limit]
    tok = AutoTokenizer.from_pretrained(REPO / "data_samples" / "model")
    return [len(ids) for ids in tok([PREFIX + line for line in lines])["input_ids"]]


def time_batches(a: argparse.Namespace, lengths: list[int], out: Path) -> dict[str, Any]:
    """{dtype: {budget: [[rows, padded, steps, seconds] per batch, in plan order]}}."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    import gpu
    from seq2seq_eval.engines.hf import HFEngine

    device = torch.device(a.device)
    path = gpu.build_marian((a.models or out) / f"marian-{a.model}", a.model)
    tok = AutoTokenizer.from_pretrained(path)
    timings: dict[str, Any] = {}
    for dtype in a.dtypes:
        t_start = time.perf_counter()
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        gc = GenerationConfig.from_model_config(model.config)
        gc.num_beams, gc.early_stopping = BEAMS, True
        engine = HFEngine(model, tok, gc, device)
        per_budget: dict[str, list[list[float]]] = {}
        timings[dtype] = per_budget

        def run(ids: list[list[int]], steps: int) -> float:
            engine.gc.min_new_tokens = engine.gc.max_new_tokens = steps
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.generate(ids, 0)  # returns after copying the sequences to the host
            return time.perf_counter() - t0

        fake = [[5] * n for n in lengths]  # token values do not change the work of a random model
        run(fake[:8], 8)  # warm-up: CUDA context, kernels, the allocator (and its larger blocks next)
        run([[5] * 60] * 200, 20)
        for budget in budgets_to_time(a, lengths, dtype):
            if time.perf_counter() - t_start > a.time_limit:
                print(f"{dtype} --max_tokens {budget}: skipped, --time_limit {a.time_limit:.0f} s reached", flush=True)
                continue
            plan = make_batches(lengths, max_tokens=budget)
            rows = []
            for b in plan:
                steps = min(b.padded_len, a.max_steps)
                seconds = run([fake[m] for m in b.members], steps)
                rows.append([len(b.members) * BEAMS, b.padded_len, steps, seconds])
            per_budget[str(budget)] = rows
            print(f"{dtype} --max_tokens {budget}: {len(rows)} batches, {sum(r[3] for r in rows):.2f} s", flush=True)
            (out / "timings.json").write_text(json.dumps({"settings": settings(a), "lengths": lengths, "timings": timings}, default=str))
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return timings


def budgets_to_time(a: argparse.Namespace, lengths: list[int], dtype: str) -> list[int]:
    """The device default and the rule's budget at every world size of --worlds, then --budgets;
    largest first."""
    key = DTYPE_KEYS[dtype]
    default, overhead = DEFAULT_MAX_TOKENS[key]["cuda"], STEP_OVERHEAD[key]["cuda"]
    rule = {default_plan(lengths, w, default, out_cap=a.max_steps, beams=BEAMS, step_overhead=overhead)[0] for w in a.worlds}
    return sorted(rule | {default} | set(a.budgets), reverse=True)


def settings(a: argparse.Namespace) -> dict[str, Any]:
    import platform

    out = {k: v for k, v in vars(a).items() if k != "project"}
    out["text"] = str(a.text)
    try:
        import torch

        out["machine"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
        out["torch"] = torch.__version__
    except Exception:  # noqa: BLE001  (a description only)
        pass
    return out


def fit_overhead(rows: list[list[float]]) -> tuple[float, float]:
    """Least squares of seconds/step = a + b x (rows x (1 + padded/256)): the estimate's weighting
    of a step (plan.estimate_cost). Returns (a/b, b): the fixed cost in the estimate's units."""
    import numpy as np

    x = np.asarray([r[0] * (1.0 + r[1] / 256.0) for r in rows])
    y = np.asarray([r[3] / r[2] for r in rows])
    (b, a), *_ = np.linalg.lstsq(np.c_[x, np.ones_like(x)], y, rcond=None)
    return float(a / b), float(b)


def replay(plan: Any, seconds: list[float], world: int) -> tuple[float, int]:
    """(wall seconds, idle ranks) of the run's deal of `plan` replayed on measured times, with stealing."""
    costs = plan.cost.tolist()
    shares = assign_batches(plan, world)
    lo, hi = [0] * world, [len(s) for s in shares]
    clock = [0.0] * world
    while True:
        rank = min(range(world), key=lambda r: (clock[r], r))  # the rank that is free first
        if lo[rank] < hi[rank]:
            index = shares[rank][lo[rank]]
            lo[rank] += 1
        else:
            left = [(sum(costs[i] for i in shares[r][lo[r]:hi[r]]), hi[r] - lo[r], r) for r in range(world)]
            victims = [e for e in left if e[1] > 0]
            if not victims:
                break
            victim = max(victims, key=lambda e: (e[0], e[1], -e[2]))[2]
            hi[victim] -= 1
            index = shares[victim][hi[victim]]
        clock[rank] += seconds[index]
    busy = sum(1 for s in shares if s)
    return max(clock), world - busy


def project(data: dict[str, Any], worlds: list[int]) -> str:
    lengths, timings, s = data["lengths"], data["timings"], data["settings"]
    lines = [f"{len(lengths)} examples from {s['text']}, {BEAMS} beams, at most {s['max_steps']} steps; "
             f"{s.get('machine', '?')}, torch {s.get('torch', '?')}"]
    for dtype, per_budget in timings.items():
        key = DTYPE_KEYS[dtype]
        default = DEFAULT_MAX_TOKENS[key]["cuda"]
        overhead = STEP_OVERHEAD[key]["cuda"]
        all_rows = [r for rows in per_budget.values() for r in rows]
        fitted, _ = fit_overhead(all_rows)
        lines.append(f"\n{dtype}: default --max_tokens {default}; step overhead fitted {fitted:.0f} "
                     f"(plan.STEP_OVERHEAD: {overhead:.0f})")
        lines.append(" " + "  ".join(f"{b}: {len(r)} batches {sum(x[3] for x in r):.2f} s" for b, r in per_budget.items()))
        lines.append(f"{'GPUs':>5} {'old budget':>11} {'batches':>8} {'idle':>5} {'wall s':>8} {'new budget':>11} "
                     f"{'batches':>8} {'idle':>5} {'wall s':>8} {'old/new':>8} {'x 1 GPU':>8}")
        one_gpu = sum(r[3] for r in per_budget.get(str(default), []))
        for w in worlds:
            budget, _ = default_plan(lengths, w, default, out_cap=s["max_steps"], beams=BEAMS, step_overhead=overhead)
            cells = []
            for b in (default, budget):
                rows = per_budget.get(str(b))
                if rows is None:
                    cells.append(None)
                    continue
                plan = make_batches(lengths, max_tokens=b, out_cap=s["max_steps"], beams=BEAMS, step_overhead=overhead)
                wall, idle = replay(plan, [r[3] for r in rows], w)
                cells.append((b, len(rows), idle, wall))
            old, new = cells
            fmt = lambda c: f"{c[0]:>11} {c[1]:>8} {c[2]:>5} {c[3]:>8.2f}" if c else f"{'(not timed)':>35}"  # noqa: E731
            ratio = f"{old[3] / new[3]:>8.2f}" if old and new else f"{'':>8}"
            speed = f"{one_gpu / new[3]:>8.2f}" if new and one_gpu else f"{'':>8}"
            lines.append(f"{w:>5} {fmt(old)} {fmt(new)} {ratio} {speed}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", type=Path, default=NEWSTEST, help="sources, one a line (default: newstest2017's German side)")
    p.add_argument("--limit", type=int, default=None, help="the first N lines only")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="opus", choices=("opus", "tiny"), help="gpu.MARIAN_SIZES")
    p.add_argument("--dtypes", type=lambda t: [x for x in t.split(",") if x], default=["float32", "float16"])
    p.add_argument("--budgets", type=ints, default=[],
                   help="--max_tokens values to time besides the default and the rule's (e.g. 16384,8192,4096)")
    p.add_argument("--worlds", type=ints, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--max_steps", type=int, default=120)
    p.add_argument("--time_limit", type=float, default=200, help="seconds of timing per dtype; later budgets are skipped")
    p.add_argument("--models", type=Path, default=None, help="where the random model is built (default: --out)")
    p.add_argument("--out", type=Path, default=Path("bench_out/gpu_batches"))
    p.add_argument("--project", type=Path, default=None, help="a timings.json to project again, no timing")
    a = p.parse_args(argv)
    if a.project:
        print(project(json.loads(a.project.read_text()), a.worlds))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    lengths = source_lengths(a.text, a.limit)
    time_batches(a, lengths, a.out)
    text = project(json.loads((a.out / "timings.json").read_text()), a.worlds)
    (a.out / "projection.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
