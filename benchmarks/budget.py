"""Samples/s against the batch budget, for each engine: what the defaults of --bs and --max_tokens
are chosen from.

    python benchmarks/budget.py [--model data_samples/model|opus] [--n 397] [--threads 1]
                                [--engines hf,ctranslate2] [--bs 8,16,32,64] [--max_tokens 512,1024,2048,4096]

One process, generation only: the run's own preparation (runner.prepare: the same plan the tool
makes for that budget), then every planned batch through the engine, timed from the first batch
to the last. --threads 1 is what each of two ranks on a 2-core machine gets (OMP_NUM_THREADS=1),
the case the defaults are chosen for. Each point runs --rounds times in turns; the table gives
the median and each engine's best budget, with every other budget's rate as a fraction of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def stopping(model: str) -> tuple:
    """early_stopping=True where the model's translation settings use beams: the stop CTranslate2's
    beam search makes, which it refuses to replace by generate()'s default (engines/ct2_rules.py);
    both engines are measured with it."""
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.model.settings import load_model_config, task_params

    model_config, base = load_model_config(EvalConfig(model_name=model))
    beams = task_params(model_config, "translation").get("num_beams") or base.num_beams or 1
    return (("early_stopping", True),) if beams > 1 else ()


def measure(model: str, data_dir: Path, engine: str, budget: tuple[str, int], n: int, max_new_tokens: int | None) -> float:
    import torch

    from seq2seq_eval import engines

    from seq2seq_eval.run import runner
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.run.dist import DistEnv

    kind, value = budget
    gen = (("max_new_tokens", max_new_tokens),) if max_new_tokens else ()
    gen += stopping(model)
    cfg = EvalConfig(model_name=model, data_dir=str(data_dir), task="translation", n_obs=n, engine=engine,
                     bs=value if kind == "bs" else EvalConfig.bs, max_tokens=value if kind == "max_tokens" else None,
                     device="cpu", generate_kwargs=gen)
    with tempfile.TemporaryDirectory(prefix="budget_") as cache:
        prep = runner.prepare(cfg, DistEnv(), None, Path(cache))
        engine_ = engines.load(cfg, tokenizer=prep.tokenizer, model_config=prep.model_config,
                               generation_config=prep.generation_config, device=torch.device("cpu"), env=DistEnv(),
                               kind=prep.kind)
        batches = [[prep.tokens.ids(m) for m in b.members] for b in prep.batches]
        t0 = time.perf_counter()
        for i, batch in enumerate(batches):
            engine_.generate(batch, i)
        return len(prep.store) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "data_samples" / "model"),
                   help="model folder, or 'opus' for a random BART at opus-mt-en-de's size (built once under --out)")
    p.add_argument("--data_dir", default=str(REPO / "data_samples" / "translation"))
    p.add_argument("--n", type=int, default=397, help="examples (the first n of the data)")
    p.add_argument("--threads", type=int, default=1, help="threads of the one process (torch and CTranslate2)")
    p.add_argument("--engines", default="hf,ctranslate2")
    p.add_argument("--bs", default="8,16,32,64")
    p.add_argument("--max_tokens", default="512,1024,2048,4096")
    p.add_argument("--max_new_tokens", type=int, default=None)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default="bench_out/budget")
    a = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # read by CTranslate2's engine for its threads
    import torch

    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = a.model
    if model == "opus":
        from throughput import build_opus_size

        model = str(build_opus_size(out / "bart-opus-size"))
    budgets = [("bs", int(v)) for v in a.bs.split(",") if v] + [("max_tokens", int(v)) for v in a.max_tokens.split(",") if v]
    names = [e for e in a.engines.split(",") if e]
    rates: dict[str, dict[str, list[float]]] = {e: {f"--{k} {v}": [] for k, v in budgets} for e in names}
    for r in range(a.rounds):
        for engine in names:
            for budget in budgets:
                rate = measure(model, Path(a.data_dir), engine, budget, a.n, a.max_new_tokens)
                rates[engine][f"--{budget[0]} {budget[1]}"].append(rate)
                print(f"round {r + 1} {engine} --{budget[0]} {budget[1]}: {rate:.1f} samples/s", flush=True)
    print(f"\n{a.n} examples, {a.threads} thread(s), model {model}, median of {a.rounds} round(s), samples/s")
    result = {}
    for engine in names:
        med = {k: statistics.median(v) for k, v in rates[engine].items()}
        best = max(med, key=med.get)
        result[engine] = {"samples_per_second": med, "best": best}
        print(f"{engine}: best {best} ({med[best]:.1f}); " + ", ".join(f"{k} {v:.1f} ({v / med[best]:.2f})" for k, v in med.items()))
    (out / "budget.json").write_text(json.dumps({"settings": vars(a), "model": model, "engines": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
