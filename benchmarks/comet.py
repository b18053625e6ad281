"""COMET speed: the tool's native scorer against unbabel-comet's `predict`, same model, threads
and batch size, for each class in one invocation.

    python benchmarks/comet.py [--n 400] [--bs 16] [--threads 2] [--rounds 3] [--size base]
                               [--classes regression,kiwi,xcomet]
                               [--comet_python /work/venv-cometref/bin/python] [--out bench_comet]
                               [--device cpu|cuda]

--classes: `regression` (COMET-22's RegressionMetric), `kiwi` (CometKiwi's UnifiedMetric on
[mt, src], reference-free) and `xcomet` (XCOMETMetric with references: three inputs per example,
error spans) on an XLM-R-XL-style encoder of the same size, so the classes' costs compare.

Builds a random COMET regression checkpoint in the published layout (hparams.yaml,
checkpoints/model.ckpt) with XLM-R-base's architecture (12 layers, hidden 768, 12 heads,
intermediate 3072; the estimator [3072, 1024], sparsemax layer mix, as wmt22-comet-da) and the
tiny test tokenizer (its vocabulary of 606 pieces in place of XLM-R's 250,002: the embedding
lookup costs the same per token, the checkpoint is 0.4 GB smaller). --size tiny makes a small
one for a smoke test. Examples: the embedded translation set's sources and references, with
translations of four kinds (as scripts/make_comet_fixture.py).

Per round, in turns: unbabel-comet's `predict(batch_size=--bs, gpus=0)` in the side environment
(scripts/make_comet_fixture.py says how to build it; its length batching sorts by source length),
and the tool's `score_all` with a token budget of --bs times the mean padded length per forward
pass, so a pass holds about as many tokens as one of unbabel-comet's (the tool's passes pad less
and encode each distinct text once). Both time scoring only (model loaded), with
torch.set_num_threads(--threads). Prints samples/s, the median ratio over rounds and the
largest per-example difference; writes {out}/results.json. Without the side environment it
says so and measures the tool alone; so it does with --device cuda (unbabel-comet 2.2.7 needs
numpy < 2 and transformers 4, which a GPU machine with transformers 5 does not have), with
synchronisation before each clock reading.
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
TOKENIZER = ROOT / "tests" / "data" / "comet_tiny" / "wmt22_like" / "tiny-xlmr"
SIZES = {
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "hidden": [3072, 1024]},
    "tiny": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64, "hidden": [48, 16]},
}

SIDE = r'''
import json, os, sys, time
import torch
from comet.models import load_from_checkpoint
folder, data, bs, threads, rounds = sys.argv[1], json.loads(open(sys.argv[2]).read()), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
os.chdir(folder)
model = load_from_checkpoint(os.path.join(folder, "checkpoints", "model.ckpt"), local_files_only=True)
samples = [{"src": s, "mt": m, "ref": r} for s, m, r in zip(data["src"], data["mt"], data["ref"])]
times, cpu, pred = [], [], None
for _ in range(rounds):
    t, c = time.perf_counter(), time.process_time()
    pred = model.predict(samples, batch_size=bs, gpus=0, progress_bar=False)
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
spans = (pred.get("metadata") or {}).get("error_spans")
print(json.dumps({"seconds": times, "cpu_seconds": cpu, "scores": [float(x) for x in pred.scores], "spans": spans}))
'''


CLASSES = {
    "regression": {"class_identifier": "regression_metric", "encoder_model": "XLM-RoBERTa", "layer": "mix", "pool": "avg"},
    "kiwi": {"class_identifier": "unified_metric", "encoder_model": "XLM-RoBERTa", "sent_layer": "mix",
             "input_segments": ["mt", "src"], "word_level_training": False, "word_layer": 0},
    "xcomet": {"class_identifier": "xcomet_metric", "encoder_model": "XLM-RoBERTa-XL", "sent_layer": "mix",
               "layer_transformation": "sparsemax_patch", "error_labels": ["minor", "major", "critical"]},
}


def make_checkpoint(folder: Path, size: str, kind: str = "regression") -> None:
    """A random COMET model of class `kind` in COMET's layout, made with the tool's network (its
    parameter names are the checkpoint's)."""
    import torch
    import yaml
    from transformers import AutoTokenizer

    from seq2seq_eval.scoring.comet.network import RegressionNetwork, encoder_class
    from seq2seq_eval.scoring.comet.unified import UnifiedNetwork

    s = SIZES[size]
    shutil.copytree(TOKENIZER, folder / "encoder", dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(folder / "encoder"))
    hparams = {"pretrained_model": "encoder", "layer_transformation": "sparsemax", "layer_norm": False,
               "hidden_sizes": s["hidden"], "activations": "Tanh", "final_activation": None, "dropout": 0.1,
               "load_pretrained_weights": False, "local_files_only": True, **CLASSES[kind]}
    if kind == "xcomet":
        hparams["word_layer"] = s["num_hidden_layers"]
    config = encoder_class(hparams)[0](
        vocab_size=len(tok), hidden_size=s["hidden_size"], num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["num_attention_heads"], intermediate_size=s["intermediate_size"],
        max_position_embeddings=514, type_vocab_size=1, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.save_pretrained(str(folder / "encoder"))
    torch.manual_seed(0)
    net = (RegressionNetwork(config, hparams, tok.pad_token_id) if kind == "regression"
           else UnifiedNetwork(config, hparams))
    with torch.no_grad():
        if kind == "xcomet":
            # A random encoder gives every token nearly the same top layer: the tagger's bias is
            # centred on the examples' mean logits, so the label follows each token's own
            # deviation and spans open and close (one label on every token makes a span that is
            # still open at the end, which decode() drops: no spans to compare).
            net.hidden2tag.weight.normal_(0, 0.05)
            texts = examples(16)
            sample = tok(texts["mt"], texts["src"], return_tensors="pt", padding=True, truncation=True, max_length=256)
            hidden = net.encoder.model(input_ids=sample["input_ids"], attention_mask=sample["attention_mask"],
                                       output_hidden_states=True).hidden_states[hparams["word_layer"]]
            logits = net.hidden2tag(hidden)[sample["attention_mask"].bool()]
            net.hidden2tag.bias.sub_(logits.mean(0)).add_(torch.tensor([0.02, 0.0, 0.0, 0.0]))
        for p, w in zip(net.layerwise_attention.scalar_parameters, torch.linspace(-0.5, 0.9, len(net.layerwise_attention.scalar_parameters))):
            p.fill_(float(w))
    state = net.state_dict()
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    # The keys Lightning reads back (its version decides which migrations it applies: none here).
    torch.save({"state_dict": state, "hyper_parameters": hparams, "epoch": 0, "global_step": 0,
                "pytorch-lightning_version": "2.6.6"}, folder / "checkpoints" / "model.ckpt")
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams), encoding="utf-8")


def examples(n: int) -> dict[str, list[str]]:
    data = ROOT / "data_samples" / "translation"
    src = ((data / "test.source").read_text(encoding="utf-8").splitlines() + (data / "val.source").read_text(encoding="utf-8").splitlines())[:n]
    ref = ((data / "test.target").read_text(encoding="utf-8").splitlines() + (data / "val.target").read_text(encoding="utf-8").splitlines())[:n]
    mt = []
    for i, r in enumerate(ref):
        words = r.split()
        mt.append([r, " ".join(reversed(words)), ref[(i + 5) % len(ref)], " ".join(words[: max(1, len(words) // 2)])][i % 4])
    return {"src": src, "mt": mt, "ref": ref}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--classes", default="regression,kiwi,xcomet")
    ap.add_argument("--comet_python", default=os.environ.get("COMET_PYTHON", "/work/venv-cometref/bin/python"))
    ap.add_argument("--out", default="bench_comet")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = examples(args.n)
    (out / "data.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    side = Path(args.comet_python)
    have_side = (args.device == "cpu" and side.exists()
                 and subprocess.run([str(side), "-c", "import comet"], capture_output=True).returncode == 0)
    if not have_side:
        print(f"unbabel-comet's side environment ({side}) is missing: measuring the tool alone "
              "(scripts/make_comet_fixture.py says how to build it)")
    machine = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or platform.machine()
    report = {"machine": machine, "device": args.device, "cpus": os.cpu_count(), "threads": args.threads,
              "size": args.size, "n": args.n, "bs": args.bs, "classes": {}}
    for kind in args.classes.split(","):
        if kind not in CLASSES:
            raise SystemExit(f"--classes: {kind!r}; expected some of {', '.join(CLASSES)}")
        report["classes"][kind] = measure(kind, args, out, data, side if have_side else None)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if have_side:
        print("ratios (median of per-round): " + ", ".join(f"{k} {v['median_ratio']:.2f}x" for k, v in report["classes"].items()))


def measure(kind: str, args: argparse.Namespace, out: Path, data: dict[str, list[str]], side: Path | None) -> dict:
    """One class's rounds: the tool and unbabel-comet in turns; speeds, ratios, differences."""
    from seq2seq_eval.scoring.comet import load
    from seq2seq_eval.scoring.model_metric import score_all

    folder = out / f"comet_{kind}_{args.size}"
    if not (folder / "hparams.yaml").exists():
        make_checkpoint(folder, args.size, kind)
    metric = load(str(folder), args.device)
    refs = [(r,) for r in data["ref"]]
    lengths = metric.lengths(data["src"], data["mt"], refs)
    budget = args.bs * math.ceil(statistics.mean(lengths))
    tool_s, comet_s, ratios, tool_values, result = [], [], [], None, None
    tool_cpu, comet_cpu = [], []
    for _ in range(args.rounds):
        sync(args.device)
        t, c = time.perf_counter(), time.process_time()
        tool_values = score_all(metric, data["src"], data["mt"], refs, max_tokens=budget,
                                device_type=args.device.split(":")[0])
        sync(args.device)
        tool_s.append(time.perf_counter() - t)
        tool_cpu.append(time.process_time() - c)
        if side is not None:
            proc = subprocess.run([str(side), "-c", SIDE, str(folder.resolve()), str((out / "data.json").resolve()), str(args.bs),
                                   str(args.threads), "1"], capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
            if proc.returncode:
                raise SystemExit(f"unbabel-comet failed:\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            comet_s.append(result["seconds"][0])
            comet_cpu.append(result["cpu_seconds"][0])
            ratios.append(comet_s[-1] / tool_s[-1])
        # Each round as it ends: a long run on a slow machine still shows what it measured.
        # CPU seconds beside wall seconds: on a shared machine the wall clock also measures the neighbours.
        print(f"{kind} round {len(tool_s)}: tool {args.n / tool_s[-1]:.2f} samples/s ({tool_cpu[-1]:.1f} CPU s)"
              + (f", unbabel-comet {args.n / comet_s[-1]:.2f} samples/s ({comet_cpu[-1]:.1f} CPU s)" if side else ""),
              flush=True)
    n = args.n
    entry = {"tool_max_tokens": budget, "tool_samples_per_second": [n / s for s in tool_s], "tool_cpu_seconds": tool_cpu,
             "tool_median_samples_per_second": n / statistics.median(tool_s)}
    print(f"{kind}: tool (token budget {budget}): {entry['tool_median_samples_per_second']:.1f} samples/s "
          f"(median of {args.rounds})")
    if side is not None:
        scores = [v[0] if isinstance(v, tuple) else v for v in tool_values]
        diff = max(abs(a - b) for a, b in zip(scores, result["scores"]))
        entry.update(comet_samples_per_second=[n / s for s in comet_s], comet_cpu_seconds=comet_cpu,
                     comet_median_samples_per_second=n / statistics.median(comet_s),
                     median_ratio=statistics.median(ratios), max_abs_difference=diff)
        if result["spans"] is not None:
            strip = lambda spans: [{k: v for k, v in s.items() if k != "confidence"} for s in spans]  # noqa: E731
            entry["examples_with_other_spans"] = sum(strip(v[1]) != strip(s) for v, s in zip(tool_values, result["spans"]))
            entry["spans"] = sum(len(s) for s in result["spans"])
        print(f"{kind}: unbabel-comet predict (batch_size {args.bs}): {entry['comet_median_samples_per_second']:.1f} "
              f"samples/s; ratio (median of per-round ratios) {entry['median_ratio']:.2f}x; largest per-example "
              f"difference {diff:.2e}" + (f"; {entry['examples_with_other_spans']} of {n} examples with other spans "
                                          f"({entry['spans']} spans)" if "spans" in entry else ""))
    return entry


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
