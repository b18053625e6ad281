"""evaluate() on a model already in memory against the command line's run minus its start-up.

    python benchmarks/api.py                      # the embedded test set (397 examples), best of 3
    python benchmarks/api.py --n_obs 100 --repeats 1

In one invocation, on the embedded model and test set, one process each, the same thread count:
  - the command line, `python -m seq2seq_eval ...` in a fresh interpreter: its wall time, and its
    start-up: the interpreter and imports (wall minus the run's own total, which run() starts
    timing) plus loading the model's config, tokenizer and weights (the run's model_load less the
    preparation steps inside it: examples, tokenize, plan, which evaluate() does too);
  - `seq2seq_eval.evaluate(model, tokenizer, ...)` in this process on the same model loaded once,
    after one small untimed call (the first call's lazy imports are start-up too).
The goal: evaluate() costs no more than the command line minus its start-up (ratio <= 1).
Best of --repeats for each; the machine's load shows as the spread between repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n_obs", type=int, default=397)
    p.add_argument("--bs", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads, in both (OMP_NUM_THREADS)")
    args = p.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(args.threads), CUDA_VISIBLE_DEVICES="")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import seq2seq_eval
    from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL

    torch.set_num_threads(args.threads)
    data = str(EMBEDDED_DATA["translation"])
    options = ["--data_dir", data, "--n_obs", str(args.n_obs), "--bs", str(args.bs)]
    with tempfile.TemporaryDirectory(prefix="bench_api_") as tmp:
        cli, startup = [], []
        for k in range(args.repeats):
            save = Path(tmp) / f"cli{k}"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "seq2seq_eval", "--model_name", str(EMBEDDED_MODEL), *options,
                            "--save_dir", str(save)], check=True, capture_output=True, cwd=tmp)
            wall = time.perf_counter() - t0
            tb = json.loads((save / "test_bleu.json").read_text())["throughput"]["time_breakdown"]
            # What evaluate() of a model in memory does not pay: the start-up but the examples' steps.
            loading = tb["startup"] - sum(tb["prepare"][k] for k in ("examples", "tokenize", "plan"))
            cli.append(wall)
            startup.append((wall - tb["total"]) + loading)

        model = AutoModelForSeq2SeqLM.from_pretrained(EMBEDDED_MODEL)
        tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_MODEL)
        seq2seq_eval.evaluate(model, tokenizer, data_dir=data, n_obs=2, save_dir=str(Path(tmp) / "warm"))
        api = []
        for k in range(args.repeats):
            t0 = time.perf_counter()
            result = seq2seq_eval.evaluate(model, tokenizer, data_dir=data, n_obs=args.n_obs, bs=args.bs,
                                           save_dir=str(Path(tmp) / f"api{k}"))
            api.append(time.perf_counter() - t0)
        same = (Path(tmp) / "api0" / "test_generations.txt").read_bytes() == (Path(tmp) / "cli0" / "test_generations.txt").read_bytes()

    best = min(range(args.repeats), key=lambda k: cli[k] - startup[k])
    floor = cli[best] - startup[best]
    print(f"{args.n_obs} examples, bs {args.bs}, {args.threads} thread(s), best of {args.repeats}; "
          f"generations identical: {same}; bleu {result.metrics['bleu']:.2f}")
    print(f"command line: wall {min(cli):.2f} s (all: {', '.join(f'{x:.2f}' for x in cli)}), "
          f"start-up {startup[best]:.2f} s, wall minus start-up {floor:.2f} s")
    print(f"evaluate() on the in-memory model: {min(api):.2f} s (all: {', '.join(f'{x:.2f}' for x in api)})")
    print(f"ratio evaluate / (command line - start-up): {min(api) / floor:.2f} (goal <= 1)")


if __name__ == "__main__":
    main()
