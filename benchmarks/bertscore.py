"""BERTScore speed: the tool's native scorer against bert-score 0.3.13's `BERTScorer.score`, same
model, layer, threads and batches, in one invocation.

    python benchmarks/bertscore.py [--n 400] [--bs 64] [--threads 2] [--rounds 3] [--size base]
                                   [--bertscore_python /work/venv-bertscore/bin/python] [--out bench_bertscore]

Builds a random encoder with roberta-base's architecture (12 layers, hidden 768, 12 heads,
intermediate 3072; layer 10, bert-score's for roberta-base) on the tiny test RoBERTa tokenizer
(tests/data/bertscore_tiny/roberta, its 800 pieces in place of roberta-base's 50,265: the
embedding lookup costs the same per token) with model_max_length 512. --size tiny makes a small
one for a smoke test. Examples: the embedded translation set's references, with predictions of
four kinds (the reference, its words reversed, another example's reference, its first half), as
the COMET benchmark and scripts/make_bertscore_fixture.py.

Per round, in turns: bert-score's `BERTScorer(...).score(cands, refs, batch_size=--bs)` in the
side environment (scripts/make_bertscore_fixture.py says how to build it), and the tool's
`score_all` with a token budget of --bs times the mean text length, so a forward pass holds about
as many tokens as one of bert-score's (its passes are --bs texts sorted by word count; the tool's
are sorted by tokens and pad less). Both time scoring only (model loaded), idf off, with
torch.set_num_threads(--threads). Prints samples/s, the median ratio over rounds and the largest
per-example difference of P, R and F1; writes {out}/results.json. Without the side environment
it says so and measures the tool alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "bertscore_tiny" / "roberta"
SIZES = {
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "layer": 10},
    "tiny": {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 64, "layer": 3},
}

SIDE = r'''
import json, sys, time
import torch
from bert_score import BERTScorer
folder, data, layer, bs, threads = sys.argv[1], json.loads(open(sys.argv[2]).read()), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
scorer = BERTScorer(model_type=folder, num_layers=layer, batch_size=bs, nthreads=threads, device="cpu")
t, c = time.perf_counter(), time.process_time()
p, r, f = scorer.score(data["mt"], data["ref"], batch_size=bs)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
                  "scores": [list(x) for x in zip(f.tolist(), p.tolist(), r.tolist())]}))
'''


def make_model(folder: Path, size: str) -> None:
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    s = SIZES[size]
    shutil.copytree(TOKENIZER, folder, ignore=shutil.ignore_patterns("config.json", "model.safetensors"), dirs_exist_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["model_max_length"] = 512
    config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    model = RobertaModel(RobertaConfig(vocab_size=len(tok), hidden_size=s["hidden_size"], num_hidden_layers=s["num_hidden_layers"],
                                       num_attention_heads=s["num_attention_heads"], intermediate_size=s["intermediate_size"],
                                       max_position_embeddings=514, pad_token_id=tok.pad_token_id,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(str(folder))


def examples(n: int) -> dict[str, list[str]]:
    data = ROOT / "data_samples" / "translation"
    ref = ((data / "test.target").read_text(encoding="utf-8").splitlines() + (data / "val.target").read_text(encoding="utf-8").splitlines())[:n]
    mt = []
    for i, r in enumerate(ref):
        words = r.split()
        mt.append([r, " ".join(reversed(words)), ref[(i + 5) % len(ref)], " ".join(words[: max(1, len(words) // 2)])][i % 4])
    return {"mt": mt, "ref": ref}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--bertscore_python", default=os.environ.get("BERTSCORE_PYTHON", "/work/venv-bertscore/bin/python"))
    ap.add_argument("--out", default="bench_bertscore")
    args = ap.parse_args()
    import torch

    from seq2seq_eval.scoring.bertscore import METRIC, load
    from seq2seq_eval.scoring.model_metric import score_all

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    folder = out / f"roberta_{args.size}"
    if not (folder / "config.json").exists():
        make_model(folder, args.size)
    layer = SIZES[args.size]["layer"]
    data = examples(args.n)
    (out / "data.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    options = {o.name: o.default for o in METRIC.options} | {"bertscore_model": str(folder.resolve()),
                                                              "bertscore_num_layers": layer}
    metric = load(options)
    refs = [(r,) for r in data["ref"]]
    lengths = metric.lengths(data["mt"], data["mt"], refs)
    budget = args.bs * math.ceil(statistics.mean(lengths))
    side = Path(args.bertscore_python)
    have_side = side.exists() and subprocess.run([str(side), "-c", "import bert_score"], capture_output=True).returncode == 0
    if not have_side:
        print(f"bert-score's side environment ({side}) is missing: measuring the tool alone "
              "(scripts/make_bertscore_fixture.py says how to build it)")
    tool_s, theirs_s, ratios, tool_cpu, theirs_cpu = [], [], [], [], []
    tool_scores = theirs_scores = None
    for _ in range(args.rounds):
        if have_side:
            proc = subprocess.run([str(side), "-c", SIDE, str(folder.resolve()), str((out / "data.json").resolve()), str(layer),
                                   str(args.bs), str(args.threads)], capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
            if proc.returncode:
                raise SystemExit(f"bert-score failed:\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            theirs_s.append(result["seconds"])
            theirs_cpu.append(result["cpu_seconds"])
            theirs_scores = result["scores"]
        t, c = time.perf_counter(), time.process_time()
        tool_scores = score_all(metric, data["mt"], data["mt"], refs, max_tokens=budget)
        tool_s.append(time.perf_counter() - t)
        tool_cpu.append(time.process_time() - c)
        if have_side:
            ratios.append(theirs_s[-1] / tool_s[-1])
        # Each round as it ends; CPU seconds beside wall seconds: on a shared machine the wall
        # clock also measures the neighbours.
        print(f"round {len(tool_s)}: tool {args.n / tool_s[-1]:.2f} samples/s ({tool_cpu[-1]:.1f} CPU s)"
              + (f", bert-score {args.n / theirs_s[-1]:.2f} samples/s ({theirs_cpu[-1]:.1f} CPU s)" if have_side else ""),
              flush=True)
    n = args.n
    report = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": args.threads,
              "size": args.size, "n": n, "bs": args.bs, "tool_max_tokens": budget,
              "tool_samples_per_second": [n / s for s in tool_s], "tool_cpu_seconds": tool_cpu,
              "tool_median_samples_per_second": n / statistics.median(tool_s)}
    print(f"tool (token budget {budget}): {report['tool_median_samples_per_second']:.1f} samples/s (median of {args.rounds})")
    if have_side:
        diff = max(abs(a - b) for x, y in zip(tool_scores, theirs_scores) for a, b in zip(x, y))
        report.update(bert_score_samples_per_second=[n / s for s in theirs_s], bert_score_cpu_seconds=theirs_cpu,
                      bert_score_median_samples_per_second=n / statistics.median(theirs_s),
                      median_ratio=statistics.median(ratios), max_abs_difference=diff)
        print(f"bert-score BERTScorer.score (batch_size {args.bs}): {report['bert_score_median_samples_per_second']:.1f} samples/s")
        print(f"ratio (median of per-round ratios): {report['median_ratio']:.2f}x; largest per-example difference {diff:.2e}")
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
