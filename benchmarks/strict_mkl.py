"""The cost of MKL's strict mode (seq2seq_eval.numerics: the same bits at any threads per
process) on generation and on model metrics, against the same run with MKL in its default mode,
in one invocation.

    python benchmarks/strict_mkl.py [--threads 2] [--rounds 3] [--n 200] [--max_new_tokens 32]
                                    [--small] [--out bench_strict_mkl]

Each run is `python -m seq2seq_eval` in one process with OMP_NUM_THREADS=--threads on the first
--n examples of the embedded translation set, --metrics bleu,bertscore,comet: generation by an
opus-mt-en-de-size BART with random weights (throughput.py's build_opus_size; 4 beams, at most
--max_new_tokens new tokens), BERTScore by a random encoder of roberta-base's architecture
(bertscore.py's make_model, layer 10) and COMET by a random checkpoint of that size
(comet.py's make_checkpoint). `--small` takes the embedded model and tiny metric models, to
check the script in seconds. Per round, in turns: "strict" (the tool as it is) and "default"
(the same run in a process whose MKL computed before the tool started, so that it keeps its
default mode: what the tool records as off). Reads the run's own timings from its metric file
(generation seconds; each model metric's scoring seconds on rank 0), checks which mode each run
recorded, prints the per-round ratios strict/default and their medians, and whether the two
modes wrote the same generations; writes {out}/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# MKL takes its mode at its first call and keeps it: one GEMM before the tool starts leaves it in
# its default mode, and the tool records that it could not set the strict one.
DEFAULT_MODE = ("import torch; torch.mm(torch.ones(8, 8), torch.ones(8, 8)); "
                "from seq2seq_eval.cli import main; raise SystemExit(main())")
STRICT_MODE = "from seq2seq_eval.cli import main; raise SystemExit(main())"


def build(out: Path, small: bool) -> dict[str, Path]:
    import bertscore
    import comet
    from throughput import build_opus_size

    size = "tiny" if small else "base"
    models = {"generation": ROOT / "data_samples" / "model" if small else build_opus_size(out / "bart-opus-size"),
              "bertscore": out / f"bertscore-{size}", "comet": out / f"comet-{size}"}
    if not models["bertscore"].exists():
        bertscore.make_model(models["bertscore"], size)
    if not models["comet"].exists():
        comet.make_checkpoint(models["comet"], size)
    return models


def run_once(mode: str, models: dict[str, Path], data: Path, args: argparse.Namespace, save: Path) -> dict:
    import bertscore

    layer = bertscore.SIZES["tiny" if args.small else "base"]["layer"]
    cmd = [sys.executable, "-c", STRICT_MODE if mode == "strict" else DEFAULT_MODE,
           "--model_name", str(models["generation"]), "--data_dir", str(data), "--save_dir", str(save),
           "--metrics", "bleu,bertscore,comet", "--bertscore_model", str(models["bertscore"]),
           "--bertscore_num_layers", str(layer), "--comet_model", str(models["comet"]),
           "--max_new_tokens", str(args.max_new_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MKL_CBWR", None)  # the tool's own choice (numerics.py), not the caller's
    proc = subprocess.run(cmd, cwd=save.parent, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    metric = json.loads((save / "test_bleu.json").read_text(encoding="utf-8"))
    timing = metric["throughput"]
    return {"generation": timing["time_breakdown"]["generation"],
            **{m: timing["model_metrics"][m]["rank0_seconds"] for m in ("bertscore", "comet")},
            "mode": metric["provenance"]["mkl_cbwr_per_rank"][0],
            "generations": (save / "test_generations.txt").read_text(encoding="utf-8")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--small", action="store_true", help="the embedded model and tiny metric models, to check the script")
    p.add_argument("--out", default="bench_strict_mkl")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    models = build(out, args.small)
    data = out / "data.jsonl"
    src = (ROOT / "data_samples" / "translation" / "test.source").read_text(encoding="utf-8").splitlines()[: args.n]
    tgt = (ROOT / "data_samples" / "translation" / "test.target").read_text(encoding="utf-8").splitlines()[: args.n]
    data.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in zip(src, tgt)), encoding="utf-8")
    rounds = []
    for r in range(args.rounds):
        got = {}
        for mode in ("strict", "default"):  # in turns: a neighbour's load falls on both
            save = out / "runs" / f"{mode}_{r}" / "save"
            shutil.rmtree(save.parent, ignore_errors=True)
            save.parent.mkdir(parents=True)
            got[mode] = run_once(mode, models, data, args, save)
        rounds.append(got)
        print(f"round {r + 1}: " + ", ".join(
            f"{part} {got['strict'][part]:.2f} s strict / {got['default'][part]:.2f} s default"
            for part in ("generation", "bertscore", "comet")), flush=True)
    modes = {mode: sorted({g[mode]["mode"] or "none" for g in rounds}) for mode in ("strict", "default")}
    ratios = {part: [g["strict"][part] / g["default"][part] for g in rounds] for part in ("generation", "bertscore", "comet")}
    same = all(g["strict"]["generations"] == g["default"]["generations"] for g in rounds)
    print(f"modes recorded: strict runs {modes['strict']}, default runs {modes['default']}")
    for part, values in ratios.items():
        print(f"{part}: strict / default = {statistics.median(values):.3f} (median of {len(values)}; rounds "
              f"{', '.join(f'{v:.3f}' for v in values)})")
    print(f"the same generations in both modes: {same}")
    results = {"threads": args.threads, "n": args.n, "small": args.small, "modes": modes, "ratios": ratios,
               "medians": {k: statistics.median(v) for k, v in ratios.items()}, "same_generations": same,
               "seconds": [{m: {k: v for k, v in g[m].items() if k != "generations"} for m in g} for g in rounds]}
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
