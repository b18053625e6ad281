"""Selection speed: the tool's `select` against mbrs 0.1.8's decoders, whole processes, same
machine, same run, CPU, the same candidates, for three cases in one invocation.

    python benchmarks/selection.py [--n 24] [--n_chrf 2000] [--threads 1] [--rounds 1] [--size base]
                                   [--cases comet,chrf,kiwi] [--mbrs_python /work/side/venv-mbrs/bin/python]
                                   [--out bench_selection]

Cases (N = 16 candidates per example: the embedded model's sampled candidates of
tests/data/selection/sample16.jsonl, its 10 examples repeated under new ids to --n; they hold
4.4 distinct texts of 16 on average, which the tool encodes once each and mbrs' COMET metrics
encode 16 times: --candidates FILE measures on another candidates file, such as one of distinct
beam outputs):
- `comet`: COMET-MBR. The tool's `select --select mbr --select_metric comet` against mbrs'
  `DecoderMBR(MetricCOMET)` with the hypotheses as the references, its `decode` per example.
- `chrf`: chrF-MBR (--n_chrf examples). The tool's `select --select_metric chrf` against mbrs'
  `DecoderMBR(MetricChrF(fastchrf=True))`, its fastest chrF (Rust); the expected utilities are
  compared to 1e-9 with the float64 means of mbrs' own per-pair `MetricChrF.score` (run apart,
  untimed), as tests/test_selection.py does.
- `kiwi`: CometKiwi reranking. The tool's `select --select qe --select_metric comet` against
  mbrs' `DecoderRerank(MetricCOMETkiwi)`.

The COMET checkpoints are random, built here in COMET's layout with XLM-R-base's architecture
(12 layers, hidden 768, the estimator [3072, 1024]) and the tiny test tokenizer
(benchmarks/comet.py's make_checkpoint: a regression model, and a unified one on [mt, src] for
CometKiwi); --size tiny makes small ones for a smoke run. mbrs loads them through its own
COMET metrics once comet.download_model is bypassed (tests/mbrs_models_side.py does the same).

Each side runs as a fresh process from start to exit (imports, model load, every selection, its
output), with OMP_NUM_THREADS=--threads; its CPU seconds are the kernel's accounting of the
child (user + system). Per case: the CPU and wall ratios (mbrs over the tool; the median over
--rounds), whether the selections agree wherever mbrs' best is unique by more than the
tolerance (1e-6 for COMET, 1e-4 for mbrs' float32 chrF), the largest difference in the
expected utilities, and one PASS or MISS line against the goal (CPU seconds: 1.5x for COMET-MBR
and CometKiwi, 1x for chrF). Writes {out}/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _comet_benchmark():
    """benchmarks/comet.py, by its path (an installed `comet` package would shadow its name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("comet_benchmark", ROOT / "benchmarks" / "comet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bench = _comet_benchmark()
child, make_checkpoint = _bench.child, _bench.make_checkpoint

FIXTURE = ROOT / "tests" / "data" / "selection" / "sample16.jsonl"
GOALS = {"comet": 1.5, "chrf": 1.0, "kiwi": 1.5}
TOLERANCE = {"comet": 1e-6, "chrf": 1e-4, "kiwi": 1e-6}

SIDE = r'''
import json, os, sys
import torch
import mbrs.metrics.comet as mbrs_comet
import mbrs.metrics.cometkiwi as mbrs_kiwi
from mbrs.decoders import DecoderMBR, DecoderRerank
from mbrs.metrics import MetricChrF, MetricCOMET, MetricCOMETkiwi

case, folder, path, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if case != "chrf":
    checkpoint = os.path.join(folder, "checkpoints", "model.ckpt")
    mbrs_comet.download_model = mbrs_kiwi.download_model = lambda name, *a, **k: checkpoint
    os.chdir(folder)
if case == "comet":
    decoder = DecoderMBR(DecoderMBR.Config(), MetricCOMET(MetricCOMET.Config(model=folder, cpu=True)))
elif case == "kiwi":
    decoder = DecoderRerank(DecoderRerank.Config(), MetricCOMETkiwi(MetricCOMETkiwi.Config(model=folder, cpu=True)))
else:
    decoder = DecoderMBR(DecoderMBR.Config(), MetricChrF(MetricChrF.Config(fastchrf=True)))
rows = []
with open(path, encoding="utf-8") as f:
    for line in f:
        r = json.loads(line)
        hyps = r["candidates"]
        if case == "kiwi":
            o = decoder.decode(hyps, r["source"], nbest=1)
        else:
            o = decoder.decode(hyps, hyps, source=r["source"], nbest=1)
        rows.append({"id": r["id"], "selected": int(o.idx[0])})
with open(out, "w", encoding="utf-8") as f:
    json.dump(rows, f)
'''
"""mbrs' decode loop: DecoderMBR / DecoderRerank's `decode` per example, as its CLI runs it."""

EXPECTED = r'''
import json, os, sys
import torch
import mbrs.metrics.comet as mbrs_comet
import mbrs.metrics.cometkiwi as mbrs_kiwi
from mbrs.metrics import MetricCOMET, MetricCOMETkiwi

case, folder, path = sys.argv[1], sys.argv[2], sys.argv[3]
if case == "chrf":
    from mbrs.metrics import MetricChrF
    metric = MetricChrF(MetricChrF.Config(num_workers=1))
else:
    checkpoint = os.path.join(folder, "checkpoints", "model.ckpt")
    mbrs_comet.download_model = mbrs_kiwi.download_model = lambda name, *a, **k: checkpoint
    os.chdir(folder)
    metric = (MetricCOMET(MetricCOMET.Config(model=folder, cpu=True)) if case == "comet"
              else MetricCOMETkiwi(MetricCOMETkiwi.Config(model=folder, cpu=True)))
rows, seen = [], {}
with torch.inference_mode(), open(path, encoding="utf-8") as f:
    for line in f:
        r = json.loads(line)
        hyps = r["candidates"]
        key = (r["source"], tuple(hyps))  # the fixture's examples repeat: each computed once
        if key in seen:
            rows.append(seen[key])
            continue
        if case == "chrf":
            # mbrs' own per-pair sacrebleu score (Metric.score, float64), each distinct pair once,
            # and the float64 mean of each row
            pair = {(h, x): metric.score(h, x) for h in set(hyps) for x in set(hyps)}
            rows.append([sum(pair[h, x] for x in hyps) / len(hyps) for h in hyps])
        else:
            e = (metric.expected_scores(hyps, hyps, r["source"]) if case == "comet"
                 else metric.scores(hyps, [r["source"]] * len(hyps)))
            rows.append([float(x) for x in e.tolist()])
        seen[key] = rows[-1]
print(json.dumps(rows))
'''
"""mbrs' expected utilities (COMET) or scores (CometKiwi), or for chrF the float64 means of its
per-pair scores, untimed, for the comparison."""


def candidates(path: Path, n: int, source: Path = FIXTURE) -> Path:
    """--n examples: those of `source` (the fixture's 10 by default), repeated under new ids."""
    records = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    path.write_text("".join(json.dumps({**records[i % len(records)], "id": i}, ensure_ascii=False) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def env(threads: int, side: bool) -> dict[str, str]:
    e = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
         "TOKENIZERS_PARALLELISM": "false"}
    e["PYTHONPATH"] = "" if side else str(ROOT)
    return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=24, help="examples for the COMET cases")
    ap.add_argument("--n_chrf", type=int, default=2000, help="examples for chrF")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--size", choices=("base", "tiny"), default="base")
    ap.add_argument("--cases", default="comet,chrf,kiwi")
    ap.add_argument("--mbrs_python", default=os.environ.get("S2S_MBRS_PYTHON", "/work/side/venv-mbrs/bin/python"))
    ap.add_argument("--out", default="bench_selection")
    ap.add_argument("--candidates", default=str(FIXTURE),
                    help="a candidates file (JSON Lines of {id, source, candidates}) to repeat to --n in place of the fixture")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    side = Path(args.mbrs_python)
    if not side.is_file():
        raise SystemExit(f"no mbrs side environment at {side} (docs/selection.md says how to make one)")
    lines = [json.loads(x) for x in Path(args.candidates).read_text(encoding="utf-8").splitlines()]
    counts = [len(r["candidates"]) for r in lines]
    distinct = sum(len(set(r["candidates"])) for r in lines) / len(lines)
    report = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": args.threads,
              "size": args.size, "n": args.n, "n_chrf": args.n_chrf, "candidates": args.candidates,
              "per_example": sorted(set(counts)), "distinct_per_example": distinct, "cases": {}}
    for case in args.cases.split(","):
        if case not in GOALS:
            raise SystemExit(f"--cases: {case!r}; expected some of {', '.join(GOALS)}")
        report["cases"][case] = measure(case, args, out, side)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"\n{report['machine']}, {report['cpus']} CPUs, {args.threads} thread(s) per process, size {args.size}, "
          f"N = {'/'.join(map(str, report['per_example']))} candidates per example, {distinct:.1f} distinct on average")
    print(f"{'case':6} {'examples':>8} {'tool CPU s':>10} {'mbrs CPU s':>10} {'CPU ratio':>9} {'wall ratio':>10} "
          f"{'agree':>7} {'max |diff|':>10}")
    for case, v in report["cases"].items():
        print(f"{case:6} {v['examples']:8d} {v['tool_cpu']:10.1f} {v['mbrs_cpu']:10.1f} {v['cpu_ratio']:9.2f} "
              f"{v['wall_ratio']:10.2f} {v['agree']:>7} {v['max_diff']:10.2e}")
    for case, v in report["cases"].items():
        goal = GOALS[case]
        print(f"{'PASS' if v['cpu_ratio'] >= goal else 'MISS'}  {case}: mbrs' CPU seconds / the tool's >= {goal}x: "
              f"{v['cpu_ratio']:.2f}x (wall {v['wall_ratio']:.2f}x); the same selections where mbrs' best is unique by "
              f"> {TOLERANCE[case]:g}: {v['agree']}" + (f"; expected utilities within 1e-9 of mbrs' float64 per-pair "
                                                       f"means: {v['within_1e-9']}" if case == "chrf" else ""))


def measure(case: str, args: argparse.Namespace, out: Path, side: Path) -> dict:
    n = args.n_chrf if case == "chrf" else args.n
    data = candidates(out / f"candidates_{case}.jsonl", n, Path(args.candidates))
    folder = None
    if case != "chrf":
        kind = "regression" if case == "comet" else "kiwi"
        folder = out / f"{kind}_{args.size}"
        if not (folder / "hparams.yaml").is_file():
            make_checkpoint(folder, args.size, kind)
    mode, metric = ("qe", "comet") if case == "kiwi" else ("mbr", "comet" if case == "comet" else "chrf")
    tool_out = out / f"tool_{case}.jsonl"
    tool = [sys.executable, "-m", "seq2seq_eval", "select", "--candidates", str(data), "--select", mode,
            "--select_metric", metric, "--output", str(tool_out)] + (["--comet_model", str(folder)] if folder else [])
    mbrs_out = out / f"mbrs_{case}.json"
    mbrs = [str(side), "-c", SIDE, case, str(folder or ""), str(data), str(mbrs_out)]
    times: dict[str, list[tuple[float, float]]] = {"tool": [], "mbrs": []}
    for r in range(args.rounds):
        for name, command in (("tool", tool), ("mbrs", mbrs)) if r % 2 == 0 else (("mbrs", mbrs), ("tool", tool)):
            if name == "tool":
                tool_out.unlink(missing_ok=True)
            wall, cpu, _ = child(command, env(args.threads, name == "mbrs"))
            times[name].append((wall, cpu))
            print(f"{case} round {r + 1}: {name} {wall:.1f} s wall, {cpu:.1f} CPU s", flush=True)
    ours = [json.loads(line) for line in tool_out.read_text(encoding="utf-8").splitlines()]
    theirs_sel = json.loads(mbrs_out.read_text(encoding="utf-8"))
    # mbrs' scores, untimed: the float32 expected utilities its decoder selects from (COMET,
    # CometKiwi) or, for chrF, its per-pair float64 sacrebleu scores (tests/mbrs_side.py).
    check = subprocess.run([str(side), "-c", EXPECTED, case, str(folder or ""), str(data)], capture_output=True,
                           text=True, env=env(args.threads, True), check=True)
    expected = json.loads(check.stdout)
    float64 = expected if case == "chrf" else None
    agree = compared = 0
    max_diff = 0.0
    for o, m, e in zip(ours, theirs_sel, expected, strict=True):
        max_diff = max(max_diff, max(abs(a - b) for a, b in zip(o["select_scores"], e)))
        top = sorted(e, reverse=True)
        if top[0] - top[1] > TOLERANCE[case]:
            compared += 1
            agree += o["selected"] == m["selected"]
    entry = {"examples": n, "tool_cpu": statistics.median(c for _, c in times["tool"]),
             "mbrs_cpu": statistics.median(c for _, c in times["mbrs"]),
             "tool_wall": statistics.median(w for w, _ in times["tool"]),
             "mbrs_wall": statistics.median(w for w, _ in times["mbrs"]), "max_diff": max_diff,
             "agree": f"{agree}/{compared}", "times": times}
    entry["cpu_ratio"] = entry["mbrs_cpu"] / entry["tool_cpu"]
    entry["wall_ratio"] = entry["mbrs_wall"] / entry["tool_wall"]
    if float64 is not None:
        worst = max(abs(a - b) for o, f in zip(ours, float64) for a, b in zip(o["select_scores"], f))
        entry["within_1e-9"] = f"{'yes' if worst <= 1e-9 else 'NO'} (largest {worst:.1e})"
    return entry


if __name__ == "__main__":
    main()
