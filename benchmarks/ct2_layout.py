"""CTranslate2 on CPU: a rank's threads as workers of one thread each, each given a part of every
batch (the engine's layout, engines/ct2.py `cpu_layout`), against one worker spreading each op
over all the threads (the layout before), whole runs with start-up, in one invocation.

    python benchmarks/ct2_layout.py [--threads 2] [--rounds 2] [--n_translate 300] [--n_prompts 500]
                                    [--small] [--jobs translate,causal] [--out bench_ct2_layout]

Two jobs, each `python -m seq2seq_eval --engine ctranslate2` on one process with
OMP_NUM_THREADS=--threads and the tool's default batches:

  translate  an opus-mt-en-de-size BART with random weights (throughput.py's build_opus_size) on
             the embedded translation sources, beam search (4 beams, early stopping, 64 new tokens);
  causal     causal.py's 59M-parameter Llama-style model with random weights on its 500 prompts,
             greedy, 32 new tokens.

`--small` takes the embedded translation model and causal.py's tiny model instead, to check the
script in seconds. Each model is converted once before the rounds. Per round, in turns: "workers" (the tool as it
is) and "one worker" (the same run with `cpu_layout` giving one worker of all the threads, set in
the child process). Prints the seconds, the median of the per-round ratios, and whether the two
layouts wrote the same generations; writes {out}/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

ONE_WORKER = ("from seq2seq_eval.engines import ct2; "
              "ct2.CT2Engine.cpu_layout = classmethod(lambda cls, t: {'inter_threads': 1, 'intra_threads': t}); "
              "from seq2seq_eval.cli import main; raise SystemExit(main())")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--n_translate", type=int, default=300)
    p.add_argument("--n_prompts", type=int, default=500)
    p.add_argument("--small", action="store_true", help="small models, to check the script")
    p.add_argument("--jobs", default="translate,causal", help="which of the two jobs to run")
    p.add_argument("--out", default="bench_ct2_layout")
    args = p.parse_args(argv)
    import causal
    from causal import timed
    from throughput import build_opus_size

    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    opus = ROOT / "data_samples" / "model" if args.small else build_opus_size(out / "bart-opus-size")
    llama = out / "llama"
    causal.make_model(llama, "tiny" if args.small else "base", 32)
    prompts = out / "prompts.txt"
    prompts.write_text("".join(line + "\n" for line in causal.prompts(args.n_prompts)), encoding="utf-8")
    jobs = {
        "translate": ["--model_name", str(opus), "--data_dir", str(ROOT / "data_samples" / "translation"),
                      "--n_obs", str(args.n_translate), "--num_beams", "4", "--early_stopping", "true",
                      "--max_new_tokens", "64"],
        "causal": ["--model_name", str(llama), "--input_path", str(prompts)],
    }
    unknown = set(args.jobs.split(",")) - set(jobs)
    if unknown:
        p.error(f"--jobs: {', '.join(sorted(unknown))}; expected some of {', '.join(jobs)}")
    jobs = {job: flags for job, flags in jobs.items() if job in args.jobs.split(",")}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "SEQ2SEQ_EVAL_CACHE": str(out / "ct2_cache"),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    layouts = {"workers": [sys.executable, "-m", "seq2seq_eval"], "one worker": [sys.executable, "-c", ONE_WORKER]}
    results = {}
    for job, flags in jobs.items():
        base = [*flags, "--engine", "ctranslate2"]
        timed([*layouts["workers"], *base, "--n_obs", "1", "--save_dir", str(out / job / "convert")], env)
        rounds = []
        for r in range(args.rounds):
            seconds = {}
            for name, cmd in layouts.items():
                save = out / job / name.replace(" ", "_")
                if save.exists():
                    shutil.rmtree(save)
                seconds[name] = timed([*cmd, *base, "--save_dir", str(save)], env)
            rounds.append(seconds)
            print(f"{job} round {r + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()), flush=True)
        texts = {name: (out / job / name.replace(" ", "_") / "test_generations.txt").read_text(encoding="utf-8")
                 for name in layouts}
        results[job] = {
            "rounds": rounds,
            "seconds": {name: statistics.median(rd[name] for rd in rounds) for name in layouts},
            "ratio": statistics.median(rd["one worker"] / rd["workers"] for rd in rounds),
            "same_generations": texts["workers"] == texts["one worker"],
        }
    print(f"\n{args.threads} thread(s), median of {args.rounds} round(s); ratio: one worker's seconds over the workers'")
    print(f"{'job':12}{'workers s':>12}{'one worker s':>14}{'ratio':>8}  same generations")
    for job, r in results.items():
        print(f"{job:12}{r['seconds']['workers']:>12.1f}{r['seconds']['one worker']:>14.1f}{r['ratio']:>8.2f}  "
              f"{r['same_generations']}")
    (out / "results.json").write_text(json.dumps({"threads": args.threads, **results}, indent=1), encoding="utf-8")
    return 0 if all(r["same_generations"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
