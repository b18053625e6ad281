"""MetricX speed: the tool's native scorer against google-research/metricx's per-example loop (its
`predict.py` cannot pad, so it scores one example per batch), same checkpoint, threads and
inputs, in one invocation.

    python benchmarks/metricx.py [--n 128] [--threads 2] [--rounds 2] [--size small]
                                 [--metricx_python /work/side/venv-metricxref/bin/python]
                                 [--metricx_repo /work/side/metricx] [--out bench_metricx]
                                 [--device cpu|cuda] [--dtype float32|bfloat16]

Builds a random checkpoint shaped as MetricX's MT5ForRegression with mT5-small's architecture
(d_model 512, d_ff 1024, 8 encoder and 8 decoder layers, 6 heads of 64, its 250,112-entry
vocabulary and an untied output layer: 1 GB in float32) and uses the test tokenizer
(tests/data/metricx_tiny/tokenizer); --size tiny makes a small one for a smoke test. Inputs:
the embedded translation set's sources and references, with translations of four kinds (as
scripts/make_metricx_fixture.py), MetricX-24's format with references.

Per round, in turns: the official loop in the side environment (scripts/make_metricx_fixture.py
says how to build it: transformers 4.30.2 and the metricx checkout; `MT5ForRegression` one example
at a time, as predict.py with batch size 1), and the tool's `score_all` under the default CPU
budget. Both time scoring only (model loaded), with torch.set_num_threads(--threads). Prints
samples/s, the ratio of the two medians over rounds and the largest per-example difference; writes
{out}/results.json.

Without the side environment (a GPU machine has no transformers 4.30.2), the baseline is the same
loop run in this process: transformers' MT5ForConditionalGeneration (the class MT5ForRegression
subclasses) one example at a time, its full 250,112-entry logits at one decoder step from id 0,
then the logit of id 250089 clamped to [0, 25], as MT5ForRegression.forward computes it. The
report names which baseline ran. --device cuda runs both on the GPU (with synchronisation before
each clock reading).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "metricx_tiny" / "tokenizer"
SIZES = {
    "small": {"d_model": 512, "d_ff": 1024, "num_layers": 8, "num_decoder_layers": 8, "num_heads": 6, "d_kv": 64},
    "tiny": {"d_model": 16, "d_ff": 32, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 2, "d_kv": 8},
    # No layer 4 to 20 wide, the widths MKL's strict mode leaves to the threads (docs/outputs.md):
    # tests/test_comet.py's checkpoint for the same bytes at any threads and ranks.
    "tiny32": {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 4, "d_kv": 8},
}

SIDE = r'''
import json, sys, time
import torch, transformers
sys.path.insert(0, sys.argv[1])
from metricx24 import models
folder, tok, data, threads, rounds = sys.argv[2], sys.argv[3], json.loads(open(sys.argv[4]).read()), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
tokenizer = transformers.AutoTokenizer.from_pretrained(tok)
model = models.MT5ForRegression.from_pretrained(folder, torch_dtype="auto").eval()
times, scores = [], []
for _ in range(rounds):
    t = time.perf_counter()
    scores = []
    for s, h, r in zip(data["src"], data["mt"], data["ref"]):
        enc = tokenizer("source: " + s + " candidate: " + h + " reference: " + r, max_length=1536, truncation=True)
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([enc["input_ids"][:-1]]),
                         attention_mask=torch.tensor([enc["attention_mask"][:-1]])).predictions
        scores.append(float(pred[0]))
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "scores": scores}))
'''


def samples(n: int) -> dict[str, list[str]]:
    data = ROOT / "data_samples" / "translation"
    src = (data / "test.source").read_text(encoding="utf-8").splitlines()
    ref = (data / "test.target").read_text(encoding="utf-8").splitlines()
    src, ref = (src * (n // len(src) + 1))[:n], (ref * (n // len(ref) + 1))[:n]
    mt = []
    for i, r in enumerate(ref):
        words = r.split()
        mt.append([r, " ".join(reversed(words)), ref[(i + 5) % len(ref)], " ".join(words[: max(1, len(words) // 2)])][i % 4])
    return {"src": src, "mt": mt, "ref": ref}


def make_checkpoint(folder: Path, size: str, dtype: str = "float32") -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import MT5Config, MT5ForConditionalGeneration

    if (folder / "model.safetensors").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = MT5Config(vocab_size=250112, dropout_rate=0.0, feed_forward_proj="gated-gelu", **SIZES[size])
    model = MT5ForConditionalGeneration(config).eval()
    # MetricX's checkpoints have their own output layer (transformers 5's MT5Config ties it).
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * 0.05)
    # The score row along the decoder's mean output, so the scores fall inside [0, 25] and vary
    # with the input (a random row gives mostly clamped zeros: nothing to compare).
    with torch.no_grad():
        ids = torch.randint(5, 1000, (16, 24), generator=torch.Generator().manual_seed(1))
        out = model(input_ids=ids, decoder_input_ids=torch.zeros((16, 1), dtype=torch.long),
                    output_hidden_states=True).decoder_hidden_states[-1][:, 0]
        mean = out.mean(0)
        model.lm_head.weight[250089] = mean / mean.dot(mean) * 12.0
    state = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in model.state_dict().items() if "embed_tokens" not in k}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.update(architectures=["MT5ForRegression"], torch_dtype=dtype, tie_word_embeddings=False)
    cfg.pop("dtype", None)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


def inprocess_loop(folder: Path, data: dict[str, list[str]], rounds: int, device: str, dtype: str) -> dict:
    """MT5ForRegression.forward's arithmetic, one example per call, in this process."""
    import torch
    from transformers import AutoTokenizer, MT5ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    model = MT5ForConditionalGeneration.from_pretrained(str(folder), dtype=getattr(torch, dtype)).eval().to(device)
    times, scores = [], []
    for _ in range(rounds):
        sync(device)
        t = time.perf_counter()
        scores = []
        for s, h, r in zip(data["src"], data["mt"], data["ref"]):
            enc = tokenizer("source: " + s + " candidate: " + h + " reference: " + r, max_length=1536, truncation=True)
            with torch.no_grad():
                ids = torch.tensor([enc["input_ids"][:-1]], device=device)
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                               decoder_input_ids=torch.zeros((1, 1), dtype=torch.long, device=device)).logits
                scores.append(float(torch.clamp(logits[:, 0, 250089], 0, 25)[0]))
        sync(device)
        times.append(time.perf_counter() - t)
    return {"times": times, "scores": scores}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--metricx_python", default="/work/side/venv-metricxref/bin/python")
    parser.add_argument("--metricx_repo", default="/work/side/metricx")
    parser.add_argument("--out", default="bench_metricx")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()

    import torch

    from seq2seq_eval.scoring import registry
    from seq2seq_eval.scoring.model_metric import score_all

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    folder = out / f"checkpoint_{args.size}_{args.dtype}"
    make_checkpoint(folder, args.size, args.dtype)
    data = samples(args.n)
    (out / "data.json").write_text(json.dumps(data), encoding="utf-8")
    options = dict(registry.resolve_options({"metricx_model": str(folder), "metricx_tokenizer": str(TOKENIZER)}))
    metric = registry.load("metricx", options, args.device)
    refs = [(r,) for r in data["ref"]]
    ours, scores = [], []
    have_side = (args.device == "cpu" and args.dtype == "float32" and Path(args.metricx_python).exists()
                 and Path(args.metricx_repo, "metricx24").is_dir())
    device_type = args.device.split(":")[0]
    for _ in range(args.rounds):
        sync(args.device)
        t = time.perf_counter()
        scores = score_all(metric, data["src"], data["mt"], refs, device_type=device_type)
        sync(args.device)
        ours.append(time.perf_counter() - t)
    baseline = "official per-example loop, transformers 4.30.2 (side environment)"
    if not have_side:
        del metric
        baseline = f"per-example loop in this process (MT5ForConditionalGeneration, transformers {__import__('transformers').__version__})"
        side = inprocess_loop(folder, data, args.rounds, args.device, args.dtype)
    else:
        script = out / "side.py"
        script.write_text(SIDE, encoding="utf-8")
        env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python", "PYTHONPATH": ""}
        done = subprocess.run([args.metricx_python, str(script), args.metricx_repo, str(folder), str(TOKENIZER),
                               str(out / "data.json"), str(args.threads), str(args.rounds)],
                              capture_output=True, text=True, check=True, env=env)
        side = json.loads(done.stdout.strip().splitlines()[-1])
    result = {"n": args.n, "size": args.size, "threads": args.threads, "device": device_name(args.device),
              "dtype": args.dtype, "baseline": baseline,
              "tool_s": ours, "tool_samples_per_s": args.n / statistics.median(ours)}
    print(f"tool:      {result['tool_samples_per_s']:.2f} samples/s (median of {args.rounds})")
    result.update(baseline_s=side["times"], baseline_samples_per_s=args.n / statistics.median(side["times"]),
                  ratio=statistics.median(side["times"]) / statistics.median(ours),
                  max_abs_diff=max(abs(a - b) for a, b in zip(scores, side["scores"])))
    print(f"baseline:  {result['baseline_samples_per_s']:.2f} samples/s ({baseline})")
    print(f"ratio:     {result['ratio']:.2f}x (of the medians)   largest per-example difference: "
          f"{result['max_abs_diff']:.2e}")
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
