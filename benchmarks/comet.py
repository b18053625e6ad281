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
and encode each distinct text once). Scoring alone is timed with the model loaded, with
torch.set_num_threads(--threads); whole runs are timed as fresh processes from start to exit
(the tool's `score` command with --model_metric_max_tokens at that budget; unbabel-comet's
imports, load_from_checkpoint and predict), with OMP_NUM_THREADS=--threads, their CPU seconds from
the kernel's accounting of the children. Each side's encoder counts the tokens it is given.

Prints samples/s, the median ratios over rounds (wall and CPU seconds, scoring and whole runs),
the largest per-example difference, and a bound measured in the same run: the encoder's linear
layers on the real tokens alone, at the rate a plain float32 matrix product of the encoder's
widest shape runs now, are the least CPU time any scorer computing the same numbers needs;
unbabel-comet's CPU seconds over that are the largest ratio any such scorer can reach. One PASS
or MISS line per class against the goal (2x in CPU seconds, scoring alone). Writes
{out}/results.json. Without the side environment it says so and measures the tool alone; so it
does with --device cuda (unbabel-comet 2.2.7 needs numpy < 2 and transformers 4, which a GPU
machine with transformers 5 does not have), with synchronisation before each clock reading.
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
tokens = [0, 0]  # padded, real: what the encoder is given
def count(module, args, kwargs):
    ids, mask = kwargs.get("input_ids", args[0] if args else None), kwargs.get("attention_mask")
    tokens[0] += ids.numel()
    tokens[1] += int(mask.sum()) if mask is not None else ids.numel()
model.encoder.model.register_forward_pre_hook(count, with_kwargs=True)
samples = [{"src": s, "mt": m, "ref": r} for s, m, r in zip(data["src"], data["mt"], data["ref"])]
times, cpu, pred = [], [], None
for _ in range(rounds):
    t, c = time.perf_counter(), time.process_time()
    pred = model.predict(samples, batch_size=bs, gpus=0, progress_bar=False)
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
spans = (pred.get("metadata") or {}).get("error_spans")
print(json.dumps({"seconds": times, "cpu_seconds": cpu, "scores": [float(x) for x in pred.scores], "spans": spans,
                  "padded_tokens": tokens[0] // rounds, "real_tokens": tokens[1] // rounds}))
'''


GOAL = 2.0
"""unbabel-comet's CPU seconds over the tool's, scoring alone (#55's goal for CometKiwi and XCOMET)."""

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
        for k, v in report["classes"].items():
            limit = (f"; the most any scorer computing the same numbers could reach here: {v['bound_cpu_ratio']:.2f}x"
                     if "bound_cpu_ratio" in v else "")
            print(f"{'PASS' if v['median_cpu_ratio'] >= GOAL else 'MISS'}  {k}: unbabel-comet's CPU seconds / the tool's "
                  f">= {GOAL}x: scoring {v['median_cpu_ratio']:.2f}x, whole runs {v['median_whole_cpu_ratio']:.2f}x "
                  f"(wall: {v['median_ratio']:.2f}x, {v['median_whole_ratio']:.2f}x){limit}")


def measure(kind: str, args: argparse.Namespace, out: Path, data: dict[str, list[str]], side: Path | None) -> dict:
    """One class's rounds, the tool and unbabel-comet in turns: scoring alone (model loaded) and
    whole runs (a fresh process from start to exit: the tool's `score` command, unbabel-comet's
    load_from_checkpoint and predict); speeds, ratios, the tokens each encodes, differences."""
    from seq2seq_eval.scoring.comet import load
    from seq2seq_eval.scoring.model_metric import score_all

    folder = out / f"comet_{kind}_{args.size}"
    if not (folder / "hparams.yaml").exists():
        make_checkpoint(folder, args.size, kind)
    metric = load(str(folder), args.device)
    refs = [(r,) for r in data["ref"]]
    lengths = metric.lengths(data["src"], data["mt"], refs)
    budget = args.bs * math.ceil(statistics.mean(lengths))
    tokens = [0, 0]  # padded, real: what the tool's encoder is given
    metric.network.encoder.model.register_forward_pre_hook(
        lambda module, a, k: tokens.__setitem__(slice(None), [tokens[0] + k["input_ids"].numel(),
                                                               tokens[1] + int(k["attention_mask"].sum())]),
        with_kwargs=True)
    command = whole_command(kind, out, folder, budget)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the whole runs on the CPU too, as the scoring alone (a GPU host)
    rows = []
    for _ in range(args.rounds):
        row = {}
        sync(args.device)
        tokens[:] = [0, 0]
        t, c = time.perf_counter(), time.process_time()
        tool_values = score_all(metric, data["src"], data["mt"], refs, max_tokens=budget,
                                device_type=args.device.split(":")[0])
        sync(args.device)
        row.update(tool_s=time.perf_counter() - t, tool_cpu=time.process_time() - c, tool_tokens=list(tokens))
        row["tool_whole_s"], row["tool_whole_cpu"], _ = child(command, env)
        if side is not None:
            row["comet_whole_s"], row["comet_whole_cpu"], stdout = child(
                [str(side), "-c", SIDE, str(folder.resolve()), str((out / "data.json").resolve()), str(args.bs),
                 str(args.threads), "1"], env)
            result = json.loads(stdout.strip().splitlines()[-1])
            row.update(comet_s=result["seconds"][0], comet_cpu=result["cpu_seconds"][0],
                       comet_tokens=[result["padded_tokens"], result["real_tokens"]])
        rows.append(row)
        # Each round as it ends: a long run on a slow machine still shows what it measured.
        # CPU seconds beside wall seconds: on a shared machine the wall clock also measures the neighbours.
        print(f"{kind} round {len(rows)}: scoring: tool {args.n / row['tool_s']:.2f} samples/s ({row['tool_cpu']:.1f} CPU s)"
              + (f", unbabel-comet {args.n / row['comet_s']:.2f} samples/s ({row['comet_cpu']:.1f} CPU s)" if side else "")
              + f"; whole runs: tool {row['tool_whole_s']:.1f} s ({row['tool_whole_cpu']:.1f} CPU s)"
              + (f", unbabel-comet {row['comet_whole_s']:.1f} s ({row['comet_whole_cpu']:.1f} CPU s)" if side else ""),
              flush=True)
    n = args.n
    median = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    entry = {"tool_max_tokens": budget, "rounds": rows, "tool_padded_tokens": rows[-1]["tool_tokens"][0],
             "tool_real_tokens": rows[-1]["tool_tokens"][1], "tool_median_samples_per_second": n / median("tool_s")}
    print(f"{kind}: tool (token budget {budget}): {entry['tool_median_samples_per_second']:.1f} samples/s "
          f"(median of {args.rounds}), {entry['tool_padded_tokens']} tokens encoded ({entry['tool_real_tokens']} real)")
    if args.device == "cpu":
        entry.update(bound(metric, data, refs, budget, entry["tool_real_tokens"]))
        print(f"{kind}: floor: the encoder's matrix products on the {entry['tool_real_tokens']} real tokens alone (the top "
              f"layer's only where an output reads it), at this machine's best plain float32 GEMM rate over the encoder's "
              f"shapes ({entry['gemm_gflops']:.0f} GFLOP/s at {args.threads} thread(s), measured now), take "
              f"{entry['floor_cpu_seconds']:.1f} CPU s; the tool's {median('tool_cpu'):.1f} CPU s are "
              f"{entry['floor_cpu_seconds'] / median('tool_cpu'):.0%} of that floor's speed")
    if side is None:
        return entry
    ratios = {key: statistics.median(r[f"comet_{key}"] / r[f"tool_{key}"] for r in rows)
              for key in ("s", "cpu", "whole_s", "whole_cpu")}
    scores = [v[0] if isinstance(v, tuple) else v for v in tool_values]
    diff = max(abs(a - b) for a, b in zip(scores, result["scores"]))
    entry.update(comet_median_samples_per_second=n / median("comet_s"), comet_padded_tokens=rows[-1]["comet_tokens"][0],
                 median_ratio=ratios["s"], median_cpu_ratio=ratios["cpu"], median_whole_ratio=ratios["whole_s"],
                 median_whole_cpu_ratio=ratios["whole_cpu"], max_abs_difference=diff)
    if result["spans"] is not None:
        strip = lambda spans: [{k: v for k, v in s.items() if k != "confidence"} for s in spans]  # noqa: E731
        entry["examples_with_other_spans"] = sum(strip(v[1]) != strip(s) for v, s in zip(tool_values, result["spans"]))
        entry["spans"] = sum(len(s) for s in result["spans"])
    print(f"{kind}: unbabel-comet predict (batch_size {args.bs}): {entry['comet_median_samples_per_second']:.1f} samples/s, "
          f"{entry['comet_padded_tokens']} tokens encoded; ratios (medians of per-round ratios): scoring "
          f"{ratios['s']:.2f}x wall, {ratios['cpu']:.2f}x CPU; whole runs {ratios['whole_s']:.2f}x wall, "
          f"{ratios['whole_cpu']:.2f}x CPU; largest per-example difference {diff:.2e}"
          + (f"; {entry['examples_with_other_spans']} of {n} examples with other spans ({entry['spans']} spans)"
             if "spans" in entry else ""))
    if "floor_cpu_seconds" in entry:
        entry["bound_cpu_ratio"] = median("comet_cpu") / entry["floor_cpu_seconds"]
        print(f"{kind}: bound: no scorer computing these numbers can beat unbabel-comet's {median('comet_cpu'):.1f} CPU s "
              f"by more than {entry['bound_cpu_ratio']:.2f}x here (they over the floor)")
    return entry


def whole_command(kind: str, out: Path, folder: Path, budget: int) -> list[str]:
    """The tool's `score` command on the benchmark's files (references only for a class that reads them)."""
    files = {}
    data = json.loads((out / "data.json").read_text(encoding="utf-8"))
    for key in ("src", "mt", "ref"):
        files[key] = out / f"{key}.txt"
        files[key].write_text("".join(line + "\n" for line in data[key]), encoding="utf-8")
    command = [sys.executable, "-m", "seq2seq_eval", "score", "--metrics", "comet", "--comet_model", str(folder),
               "--sources", str(files["src"]), "--predictions", str(files["mt"]),
               "--model_metric_max_tokens", str(budget)]
    if "ref" in CLASSES[kind].get("input_segments", ["ref"]):
        command += ["--references", str(files["ref"])]
    return command


def child(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of a process run from start to exit."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{command[0]} {' '.join(command[1:3])} failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def bound(metric, data: dict[str, list[str]], refs: list[tuple[str, ...]], budget: int, real_tokens: int) -> dict:
    """The floor: the least CPU time any scorer computing the same numbers needs, the encoder's
    matrix products it cannot skip (floor_flops) at the best rate this machine multiplies float32
    matrices of the encoder's shapes now (at the threads set); unbabel-comet's CPU seconds over it
    bound the ratio any such scorer can reach."""
    import torch
    from torch import nn

    shapes = {(m.in_features, m.out_features) for m in metric.network.encoder.model.encoder.modules()
              if isinstance(m, nn.Linear)}
    rate = 0.0
    for width, height in sorted(shapes):
        a, w = torch.randn(budget, width), torch.randn(height, width)
        torch.nn.functional.linear(a, w)
        repeats, c = 5, time.process_time()
        for _ in range(repeats):
            torch.nn.functional.linear(a, w)
        rate = max(rate, repeats * 2 * budget * width * height / (time.process_time() - c))
    floor = floor_flops(metric, data, refs, real_tokens) / rate
    return {"gemm_gflops": rate / 1e9, "floor_cpu_seconds": floor}


def floor_flops(metric, data: dict[str, list[str]], refs: list[tuple[str, ...]], real_tokens: int) -> float:
    """The float32 operations of the encoder's matrix products no scorer of these numbers can skip:
    every layer's linear maps and attention products on every real token, except in the top layer,
    whose queries, attention, output projection and feed-forward only the positions an output reads
    need (the first token for a unified class's sentence score; with a tagger, the translation's
    tokens too). COMET-22's average pools every token, and a layer mix that normalizes reads every
    token of every layer: there, every position of the top layer counts."""
    from torch import nn

    layers = metric.network.encoder.model.encoder.layer
    cost = lambda module, names=None: sum(  # noqa: E731
        2 * m.in_features * m.out_features for name, m in module.named_modules()
        if isinstance(m, nn.Linear) and (names is None or name.rsplit(".", 1)[-1] in names))
    per_layer, kv = cost(layers[0]), cost(layers[-1], ("key", "value"))
    hidden = metric.network.encoder.model.config.hidden_size
    mix = getattr(metric.network, "layerwise_attention", None)
    if not hasattr(metric, "_inputs") or (mix is not None and mix.layer_norm):
        return real_tokens * per_layer * len(layers)  # attention left out: the floor only gets lower
    inputs, mt = metric._inputs(data["src"], data["mt"], refs)
    total = 0
    for example, mt_ids in zip(inputs, mt["input_ids"]):
        for row in example:
            n = len(row)
            read = min(n, len(mt_ids)) if metric.network.word_level else 1
            attention = 2 * 2 * n * hidden  # per query: its scores over n keys and its mix of n values
            total += (len(layers) - 1) * n * (per_layer + attention) + n * kv + read * (per_layer - kv + attention)
    return total


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
