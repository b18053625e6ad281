"""What a whole run costs beyond the library it drives, in CPU-seconds of whole processes (start-up
included), the tool against a plain script doing the same run, in one invocation:

    python benchmarks/startup.py [--rounds 3] [--n 8] [--jobs hf,ct2] [--out bench_startup]

  hf   `python -m seq2seq_eval --n_obs N` on its defaults (the embedded model and translation
       sources, as the README's quickstart, one process) against a plain script doing what it
       does: AutoTokenizer and AutoModelForSeq2SeqLM.from_pretrained, the model's task prefix, one
       padded batch through generate() with the same settings (the model's translation entry: 4
       beams, early stopping, max_length 120), the texts written to a file. Goal: the tool within
       0.5 CPU-seconds of the script.
  ct2  an opus-mt-en-de-size BART with random weights (throughput.py's build_opus_size) run by
       `--engine ctranslate2` (converted once before the rounds, as a later run finds it cached):
       the tool's `time_breakdown.model_load` (loading the converted model) against a fresh
       process constructing `ctranslate2.Translator` on the same folder with the same threads, and
       both whole processes (the bare one: the tokenizer, the Translator, translate_batch on the
       N sources, the texts written).

CPU-seconds are user+sys of the child and its waited-for descendants (RUSAGE_CHILDREN), far less
sensitive than wall time to other work on the machine. Every process gets the same environment.
Prints each round's figures, the medians, the differences and the ratios, and whether the
outputs agree (the hf job's do; the bare CTranslate2 loop is the library's plain use, without the
model's forced end token that the tool applies as generate() does, so its texts may differ);
writes {out}/results.json. On a 2-core machine the hf job takes about a minute, the ct2 job two.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
EMBEDDED = ROOT / "data_samples" / "model"
SOURCES = ROOT / "data_samples" / "translation" / "test.source"

PLAIN_HF = """
import sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
model_dir, source, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
entry = model.config.task_specific_params["translation"]
with open(source, encoding="utf-8") as f:
    lines = [entry["prefix"] + next(f).rstrip("\\n") for _ in range(n)]
batch = tokenizer(lines, return_tensors="pt", padding=True, truncation=True)
ids = model.generate(**batch, num_beams=entry["num_beams"], early_stopping=entry["early_stopping"],
                     max_length=entry["max_length"])
with open(out, "w", encoding="utf-8") as f:
    f.writelines(t.strip() + "\\n" for t in tokenizer.batch_decode(ids, skip_special_tokens=True))
"""

BARE_CT2_LOAD = """
import json, sys, time
t = time.perf_counter(); c = time.process_time()
import ctranslate2
t_import = time.perf_counter() - t
t = time.perf_counter(); c = time.process_time()
ctranslate2.Translator(sys.argv[1], device="cpu", inter_threads=int(sys.argv[2]), intra_threads=1)
print(json.dumps({"import": t_import, "load_wall": time.perf_counter() - t, "load_cpu": time.process_time() - c}))
"""

BARE_CT2_RUN = """
import sys
import ctranslate2
from transformers import AutoTokenizer
model_dir, converted, source, n, out, threads = sys.argv[1:7]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
translator = ctranslate2.Translator(converted, device="cpu", inter_threads=int(threads), intra_threads=1)
with open(source, encoding="utf-8") as f:
    lines = ["translate: " + next(f).rstrip("\\n") for _ in range(int(n))]
tokens = [tokenizer.convert_ids_to_tokens(tokenizer(line).input_ids) for line in lines]
results = translator.translate_batch(tokens, beam_size=4, max_decoding_length=64, max_batch_size=64)
with open(out, "w", encoding="utf-8") as f:
    f.writelines(tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True).strip()
                 + "\\n" for r in results)
"""


def cpu_run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """CPU-seconds (user+sys of the process and its waited-for children) and wall seconds of one
    command; its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def median_of(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def hf_job(args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict[str, Any]:
    rounds = []
    for r in range(args.rounds):
        save = out / "hf_tool"
        shutil.rmtree(save, ignore_errors=True)
        shutil.rmtree(out / "hf_tool_tmp", ignore_errors=True)
        tool_cpu, tool_wall, _ = cpu_run([sys.executable, "-m", "seq2seq_eval", "--n_obs", str(args.n),
                                          "--save_dir", str(save)], env)
        plain_out = out / "hf_plain.txt"
        plain_cpu, plain_wall, _ = cpu_run([sys.executable, "-c", PLAIN_HF, str(EMBEDDED), str(SOURCES), str(args.n),
                                            str(plain_out)], env)
        breakdown = json.loads((save / "test_bleu.json").read_text())["throughput"]["time_breakdown"]
        same = lines_of(save / "test_generations.txt") == lines_of(plain_out)
        rounds.append({"tool_cpu": tool_cpu, "plain_cpu": plain_cpu, "tool_wall": tool_wall, "plain_wall": plain_wall,
                       "same_outputs": same, "time_breakdown": breakdown})
        print(f"hf round {r + 1}: tool {tool_cpu:.2f} CPU-s ({tool_wall:.1f} s wall), plain script {plain_cpu:.2f} "
              f"CPU-s ({plain_wall:.1f} s wall), same outputs: {same}", flush=True)
    tool, plain = median_of(rounds, "tool_cpu"), median_of(rounds, "plain_cpu")
    print(f"hf medians: tool {tool:.2f} CPU-s, plain script {plain:.2f} CPU-s: difference {tool - plain:+.2f} CPU-s "
          f"(goal <= +0.50), ratio {tool / plain:.3f}")
    return {"rounds": rounds, "tool_cpu": tool, "plain_cpu": plain, "difference": tool - plain, "ratio": tool / plain}


def ct2_job(args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict[str, Any]:
    from throughput import build_opus_size

    model = build_opus_size(out / "bart-opus-size")
    flags = ["--model_name", str(model), "--data_dir", str(SOURCES.parent), "--engine", "ctranslate2",
             "--max_new_tokens", "64", "--early_stopping", "true", "--n_obs", str(args.n)]
    cpu_run([sys.executable, "-m", "seq2seq_eval", *flags, "--save_dir", str(out / "ct2_convert")], env)
    converted = [p for p in (Path(env["SEQ2SEQ_EVAL_CACHE"]) / "ctranslate2").iterdir() if p.is_dir()]
    if len(converted) != 1:
        raise SystemExit(f"expected one converted model in {env['SEQ2SEQ_EVAL_CACHE']}, found {len(converted)}")
    threads = env["OMP_NUM_THREADS"]
    rounds = []
    for r in range(args.rounds):
        save = out / "ct2_tool"
        shutil.rmtree(save, ignore_errors=True)
        shutil.rmtree(out / "ct2_tool_tmp", ignore_errors=True)
        tool_cpu, tool_wall, _ = cpu_run([sys.executable, "-m", "seq2seq_eval", *flags, "--save_dir", str(save)], env)
        breakdown = json.loads((save / "test_bleu.json").read_text())["throughput"]["time_breakdown"]
        _, _, said = cpu_run([sys.executable, "-c", BARE_CT2_LOAD, str(converted[0]), threads], env)
        bare_load = json.loads(said)
        bare_out = out / "ct2_bare.txt"
        bare_cpu, bare_wall, _ = cpu_run([sys.executable, "-c", BARE_CT2_RUN, str(model), str(converted[0]),
                                          str(SOURCES), str(args.n), str(bare_out), threads], env)
        same = lines_of(save / "test_generations.txt") == lines_of(bare_out)
        rounds.append({"tool_model_load": breakdown["model_load"], "bare_load": bare_load["load_wall"],
                       "bare_load_cpu": bare_load["load_cpu"], "tool_cpu": tool_cpu, "bare_cpu": bare_cpu,
                       "tool_wall": tool_wall, "bare_wall": bare_wall, "same_outputs": same,
                       "time_breakdown": breakdown})
        print(f"ct2 round {r + 1}: model_load tool {breakdown['model_load']:.2f} s, bare Translator "
              f"{bare_load['load_wall']:.2f} s; whole run tool {tool_cpu:.2f} CPU-s, bare {bare_cpu:.2f} CPU-s; "
              f"same outputs: {same}", flush=True)
    load, bare = median_of(rounds, "tool_model_load"), median_of(rounds, "bare_load")
    tool, bare_run = median_of(rounds, "tool_cpu"), median_of(rounds, "bare_cpu")
    print(f"ct2 medians: model_load tool {load:.2f} s, bare Translator {bare:.2f} s (ratio {load / bare:.2f}); "
          f"whole run tool {tool:.2f} CPU-s, bare {bare_run:.2f} CPU-s: difference {tool - bare_run:+.2f} CPU-s, "
          f"ratio {tool / bare_run:.3f}")
    return {"rounds": rounds, "tool_model_load": load, "bare_load": bare, "load_ratio": load / bare,
            "tool_cpu": tool, "bare_cpu": bare_run, "difference": tool - bare_run, "ratio": tool / bare_run}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=8, help="examples per run")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of every process")
    p.add_argument("--jobs", default="hf,ct2")
    p.add_argument("--out", default="bench_startup")
    args = p.parse_args(argv)
    jobs = args.jobs.split(",")
    if set(jobs) - {"hf", "ct2"}:
        p.error(f"--jobs {args.jobs}: expected some of hf, ct2")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "ct2_cache", ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "SEQ2SEQ_EVAL_CACHE": str(out / "ct2_cache"),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    results: dict[str, Any] = {"load_average_at_start": os.getloadavg()}
    if "hf" in jobs:
        results["hf"] = hf_job(args, out, env)
    if "ct2" in jobs:
        results["ct2"] = ct2_job(args, out, env)
    results["load_average_at_end"] = os.getloadavg()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"load average {results['load_average_at_start'][0]:.2f} at the start, "
          f"{results['load_average_at_end'][0]:.2f} at the end; {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
