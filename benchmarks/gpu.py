"""GPU checks and throughput on one single-GPU machine, in one invocation, printed as one table.

    bash benchmarks/gpu.sh                                   # on the GPU machine: wheels, CUDA check, then this
    python benchmarks/gpu.py --out bench_out                 # the same steps, dependencies already there
    python benchmarks/gpu.py --device cpu --tiny --skip_tests   # a quick CPU run of this script (tests use it)

The steps share one time budget (--budget seconds, 540 by default) and each runs under its own
timeout in its own process group, so a hung step costs its timeout and the table still prints:

  1. `python -m pytest -m gpu tests` (tests/test_gpu.py): nccl at world size 1, two ranks sharing the
     GPU through gloo, the beam cache on CUDA in fp32/fp16/bf16, fp16/bf16 BLEU on the embedded model,
     a real out-of-memory split. Counts from its JUnit XML.
  2. Throughput, one worker process per configuration (model x dtype), loading everything once:
       (a) the tutorial loop and (b) the legacy split: benchmarks/throughput.py's own workers, run in
           process (a gloo group of one), batches of --bs;
       (d) seq2seq_eval --max_tokens (--bs x the mean source length: as many batches as (a) and (b));
       (d0) the same with generate()'s own cache instead of seq2seq_eval's beam cache: a diagnostic;
       (e32), (e16), (e8) (d) on the CTranslate2 engine, --compute_type float32 (what `--engine
           ctranslate2` alone gives a model converted from fp32), float16 and int8_float16, in the fp32
           configurations, when the ctranslate2 package is importable (its wheel in .whl/);
     --rounds times in turns (the order rotates); goals on the median over rounds, ratios taken within
     a round. Configurations: the embedded model in fp32; a randomly initialised Marian at
     Helsinki-NLP/opus-mt-en-de's published size (6+6 layers, d_model 512, 8 heads, ffn 2048, with the
     embedded tokenizer) in fp32, fp16 and bf16 with --max_new_tokens 64.
  3. The --max_tokens sweep: seq2seq_eval's samples/s and peak memory at several budgets (median of
     --rounds), embedded model and opus-size Marian in fp32, on the HF engine (d) and, for the Marian,
     on the CTranslate2 engine too ((e32), (e16)). The best measured budget for the Marian is printed
     as each engine's suggested GPU default (the embedded model is too small to stand for real models).
  4. A profile (torch.profiler) of seq2seq_eval's largest planned batch on the Marian in fp32 and bf16,
     with its beam cache and with generate()'s own, written to {out}/profile_*.txt.

Everything lands in --out (default ${OUT:-bench_out}): table.txt, summary.json, per-step logs, and per
configuration its result.json (written after every round, so a step that runs out of time keeps
what it finished).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import throughput as tp  # noqa: E402  (benchmarks/throughput.py: the methods and their figures)

EMBEDDED = REPO / "data_samples" / "model"

# Helsinki-NLP/opus-mt-en-de's published config (config.json on the hub): the sizes that matter
# for speed and memory. The vocabulary is the embedded tokenizer's (3,000): 46.7M parameters
# instead of opus-mt-en-de's 74M, almost all of the difference in the embeddings.
MARIAN_SIZES = {
    "opus": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                 max_position_embeddings=512, activation_function="swish"),
    "tiny": dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                 max_position_embeddings=512, activation_function="swish"),
}

METHOD_NAMES = {
    "a": "(a) tutorial",
    "b": "(b) legacy split",
    "d": "(d) s2s --max_tokens",
    "d0": "(d0) d, generate()'s cache",
    "db": "(db) s2s --bs",
    "dk": "(dk) d, cuDNN attention allowed",
    "ax": "(ax) a, no cuDNN attention",
}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
MIN_STEP_S = 20  # a step with less time left than this is skipped, not started


# ============================================================================ models


def build_marian(out_dir: Path, size: str = "opus", seed: int = 0) -> Path:
    """A randomly initialised Marian of `size` with the embedded model's tokenizer and task
    settings (prefix "translate: ", 4 beams), saved to `out_dir`; the same weights for the same
    seed. Built once: an existing folder is reused."""
    if (out_dir / "model.safetensors").exists():
        return out_dir
    import torch
    from transformers import AutoConfig, MarianConfig, MarianMTModel

    base = AutoConfig.from_pretrained(EMBEDDED)
    config = MarianConfig(
        vocab_size=base.vocab_size, decoder_vocab_size=base.vocab_size, pad_token_id=base.pad_token_id,
        eos_token_id=base.eos_token_id, decoder_start_token_id=base.decoder_start_token_id,
        forced_eos_token_id=base.eos_token_id, share_encoder_decoder_embeddings=True, scale_embedding=True,
        task_specific_params={"translation": {"num_beams": 4, "prefix": "translate: "}},
        **MARIAN_SIZES[size],
    )
    torch.manual_seed(seed)
    return tp.save_with_embedded_tokenizer(MarianMTModel(config).eval(), out_dir)


def model_path(name: str, models_dir: Path) -> Path:
    if name == "embedded":
        return EMBEDDED
    size = name.split("-", 1)[1]  # "marian-opus", "marian-tiny"
    return build_marian(models_dir / name, size)


# ============================================================================ worker: one configuration


@contextlib.contextmanager
def group_of_one():
    """throughput.py's workers gather through torch.distributed: a gloo group of one, in memory."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def own_cache():
    """seq2seq_eval with generate()'s own cache (its HF engine looks beam_cache up at call time)."""
    from seq2seq_eval.engines import hf

    saved = hf.beam_cache
    hf.beam_cache = lambda model, gc: None
    try:
        yield
    finally:
        hf.beam_cache = saved


@contextlib.contextmanager
def cudnn_attention_allowed():
    """seq2seq_eval's HF engine as it was before it kept generate() off cuDNN's attention kernels
    (its HF engine looks attention_backends up at call time)."""
    from seq2seq_eval.engines import hf

    saved = hf.attention_backends
    hf.attention_backends = lambda device: contextlib.nullcontext()
    try:
        yield
    finally:
        hf.attention_backends = saved


def no_cudnn_attention(device: str) -> Any:
    """The tutorial loop with the attention kernels seq2seq_eval's HF engine allows."""
    import torch

    from seq2seq_eval.engines import hf

    return hf.attention_backends(torch.device(device))


# The context each method runs in, beyond its own code.
METHOD_CONTEXT = {"d0": lambda device: own_cache(), "dk": lambda device: cudnn_attention_allowed(),
                  "ax": no_cudnn_attention}


def fresh_memory(device: str) -> None:
    """Between methods: nothing of the previous one left, and the peak counter restarted, so each
    method's peak is its own (model weights included)."""
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# --compute_type of the CTranslate2 methods; on a CPU (the script's own check) the nearest CPU types.
CT2_COMPUTE = {"cuda": {"e32": "float32", "e16": "float16", "e8": "int8_float16"},
               "cpu": {"e16": "float32", "e8": "int8"}}


def method_name(key: str, device: str) -> str:
    """The row label: the CTranslate2 methods name the compute type they run at on this device."""
    return METHOD_NAMES.get(key) or f"({key}) d, ct2 {CT2_COMPUTE[device][key]}"


def peak_counted(key: str, device: str) -> bool:
    """Whether the peak memory figure means anything: on a GPU it is torch's allocator's, and
    CTranslate2 allocates outside it."""
    return not (device == "cuda" and key in CT2_COMPUTE["cuda"])


# The engine a sweep's method runs on, for the suggested defaults.
ENGINE_OF = {"d": "hf", "e32": "ctranslate2", "e16": "ctranslate2", "e8": "ctranslate2"}


def s2s_config(spec: dict[str, Any], model: Path, data_dir: Path, save: Path, max_tokens: int | None,
               compute_type: str | None = None, bs: int | None = None) -> Any:
    from seq2seq_eval.config import EvalConfig

    engine = {"engine": "ctranslate2", "compute_type": compute_type} if compute_type else {}

    gen: list[tuple[str, Any]] = [("num_beams", spec["num_beams"])]
    if spec["num_beams"] > 1:  # as every method (throughput.STOPPING)
        gen.append(("early_stopping", True))
    if spec.get("max_new_tokens"):
        gen.append(("max_new_tokens", spec["max_new_tokens"]))
    return EvalConfig(
        model_name=str(model), data_dir=str(data_dir), task=tp.TASK, save_dir=str(save), tmp_dir=f"{save}_tmp",
        max_tokens=None if bs else max_tokens, bs=bs, device=spec["device"], fp16=spec["dtype"] == "float16" and not compute_type,
        bf16=spec["dtype"] == "bfloat16" and not compute_type,
        debug=True,  # --debug keeps the journals collect_seq2seq_eval reads
        generate_kwargs=tuple(gen), **engine,
    )


def run_method(key: str, spec: dict[str, Any], model: Path, data_dir: Path, where: Path, max_tokens: int
               ) -> tuple[Any, list[str]]:
    """One method on this configuration, in this process. Returns its throughput.MethodResult and
    its predictions."""
    from seq2seq_eval.run import runner
    from seq2seq_eval.run.dist import DistEnv

    save = tp.fresh(where / f"{key}")
    fresh_memory(spec["device"])
    context = METHOD_CONTEXT.get(key, lambda device: contextlib.nullcontext())(spec["device"])
    if key in ("a", "b", "ax"):
        args = argparse.Namespace(
            model=str(model), data_dir=str(data_dir), save_dir=str(save), bs=spec["bs"], num_beams=spec["num_beams"],
            device=spec["device"], dtype=spec["dtype"], max_new_tokens=spec.get("max_new_tokens"),
        )
        t0 = time.perf_counter()
        with group_of_one(), context:
            worker = tp.Worker(args)
            (tp.run_legacy if key == "b" else tp.run_tutorial)(worker)
        result = tp.collect_baseline("a" if key == "ax" else key, save, time.perf_counter() - t0, None)
        result.key, result.name = key, method_name(key, spec["device"])
    else:
        tp.fresh(Path(f"{save}_tmp"))
        cfg = s2s_config(spec, model, data_dir, save, max_tokens, CT2_COMPUTE[spec["device"]].get(key),
                         bs=spec["bs"] if key == "db" else None)
        t0 = time.perf_counter()
        with context:
            runner.run(cfg, DistEnv())
        result = tp.collect_seq2seq_eval("d", str(model), save, Path(f"{save}_tmp"), time.perf_counter() - t0, None,
                                         max_tokens)
        result.key, result.name = key, method_name(key, spec["device"])
    preds = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    return result, preds


def describe_device(device: str) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                            "cuda": torch.version.cuda, "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1))
    else:
        info.update(name=f"CPU ({os.cpu_count()} cores)")
    return info


def warm_up(spec: dict[str, Any], model: Path, data_dir: Path, where: Path) -> None:
    """One small seq2seq_eval run before any timing: CUDA context, cuBLAS handles and kernel
    selection are paid here, not by whichever method happens to run first."""
    from seq2seq_eval.run import runner
    from seq2seq_eval.run.dist import DistEnv

    sub = tp.fresh(where / "warm_up_data")
    sub.mkdir(parents=True)
    for name in ("test.source", "test.target"):
        lines = (data_dir / name).read_text(encoding="utf-8").splitlines()[:16]
        (sub / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    save = tp.fresh(where / "warm_up")
    tp.fresh(Path(f"{save}_tmp"))
    runner.run(s2s_config(spec, model, sub, save, 4096), DistEnv())


def profile_batch(spec: dict[str, Any], model: Path, data_dir: Path, max_tokens: int, out: Path) -> dict[str, Any]:
    """seq2seq_eval's costliest planned batch under torch.profiler, with its beam cache and with
    generate()'s own (fp32), or with and without cuDNN's attention kernels (fp16/bf16): wall seconds
    of an unprofiled call each, and the top operators by self time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from seq2seq_eval.model import settings as model_settings

    from seq2seq_eval.run import runner
    from seq2seq_eval.engines.hf import HFEngine

    import tempfile

    from seq2seq_eval.run.dist import DistEnv

    cfg = s2s_config(spec, model, data_dir, out / "unused", max_tokens)
    prep = runner.prepare(cfg, DistEnv(), None, Path(tempfile.mkdtemp(prefix="gpu_profile_")))
    device = torch.device(spec["device"])
    loaded = model_settings.load_model(cfg, device)
    batch = max(prep.batches, key=lambda b: b.cost)
    ids = [prep.tokens.ids(m) for m in batch.members]
    gen = HFEngine(loaded, prep.tokenizer, prep.generation_config, device)
    cuda = spec["device"] == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    found: dict[str, Any] = {"rows": len(ids), "padded_len": batch.padded_len, "seconds": {}, "top": {}, "files": []}
    slug = f"{spec['model']}_{DTYPE_SHORT[spec['dtype']]}"
    # fp32 never reaches cuDNN's attention: there the question is the beam cache's worth.
    variants = ((("beam_cache", contextlib.nullcontext), ("own_cache", own_cache)) if spec["dtype"] == "float32"
                else (("no_cudnn_attention", contextlib.nullcontext), ("cudnn_attention", cudnn_attention_allowed)))
    for label, patch in variants:
        with patch():
            gen.generate(ids, 0)  # warm
            t0 = time.perf_counter()
            gen.generate(ids, 0)
            found["seconds"][label] = time.perf_counter() - t0
            with profile(activities=activities) as prof:
                gen.generate(ids, 0)
        events = prof.key_averages()
        path = out / f"profile_{slug}_{label}.txt"
        path.write_text(events.table(sort_by=sort_key, row_limit=30) + "\n", encoding="utf-8")
        found["files"].append(str(path))
        ranked = sorted(events, key=lambda e: getattr(e, sort_key), reverse=True)[:5]
        found["top"][label] = [[e.key, getattr(e, sort_key) / 1e6] for e in ranked]
    return found


def worker_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])
    result_path = out / "result.json"
    data_dir = Path(spec["data_dir"])
    model = model_path(spec["model"], Path(spec["models_dir"]))
    result: dict[str, Any] = {"spec": spec, "machine": describe_device(spec["device"]), "rounds": [], "sweep": {},
                              "profile": None, "complete": False}
    max_tokens = tp.default_max_tokens(str(model), data_dir, spec["bs"])
    result["max_tokens"] = max_tokens

    def save() -> None:
        tp.write_json_atomic(result_path, result)

    save()
    warm_up(spec, model, data_dir, out)
    methods = spec["methods"]
    for i in range(spec["rounds"]):
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        by: dict[str, Any] = {}
        preds: dict[str, list[str]] = {}
        for key in order:
            by[key], preds[key] = run_method(key, spec, model, data_dir, out / f"round_{i + 1}", max_tokens)
            print(f"  {spec['name']} round {i + 1}/{spec['rounds']} {method_name(key, spec['device'])}: "
                  f"{by[key].samples_per_second:.1f} samples/s", flush=True)
        summaries = {}
        for key in methods:
            s = by[key].summary()
            s["identical_to_a"] = (sum(p == q for p, q in zip(preds[key], preds["a"])) / len(preds["a"])
                                   if "a" in preds else None)
            summaries[key] = s
        result["rounds"].append({"order": order, "methods": summaries})
        save()
    sweep_dir = Path(spec["sweep_data_dir"]) if spec.get("sweep_data_dir") else data_dir
    for key in spec.get("sweep_methods", ["d"]) if spec.get("sweep") else []:
        result["sweep"][key] = {}
        for value in spec["sweep"]:
            runs = []
            for i in range(spec["rounds"]):
                r, _ = run_method(key, spec, model, sweep_dir, out / "sweep", value)
                runs.append({"samples_per_second": r.samples_per_second, "peak_memory_mb": max(r.peak_mb),
                             "batches": sum(x["batches"] for x in r.per_rank), "n": r.n})
            result["sweep"][key][str(value)] = runs
            print(f"  {spec['name']} {method_name(key, spec['device'])} --max_tokens {value}: "
                  f"{statistics.median(x['samples_per_second'] for x in runs):.1f} samples/s", flush=True)
            save()
    if spec.get("profile"):
        result["profile"] = profile_batch(spec, model, data_dir, max_tokens, out)
        save()
    result["complete"] = True
    save()
    return 0


# ============================================================================ driver


class Budget:
    """The time left for the whole invocation; each step gets min(its own cap, what is left)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, cap: float) -> float | None:
        left = self.left() - 5  # why: time to print the table after the last step
        return None if left < MIN_STEP_S else min(cap, left)


def run_step(cmd: list[str], timeout: float, log: Path, env: dict[str, str]) -> tuple[int | None, float]:
    """Runs `cmd` in its own process group with its output to `log`. Returns the exit code (None:
    killed at the timeout) and the seconds it took."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The whole group: pytest-xdist's workers and torchrun's ranks would outlive their parent.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    return code, time.perf_counter() - t0


def pytest_counts(junit: Path) -> dict[str, int] | None:
    """passed/failed/errors/skipped from pytest's JUnit XML."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            "failed": total["failures"], "errors": total["errors"], "skipped": total["skipped"]}


def run_tests(out: Path, budget: Budget, cap: float, env: dict[str, str]) -> dict[str, Any]:
    timeout = budget.timeout(cap)
    if timeout is None:
        return {"status": "skipped: no time left"}
    import importlib.util

    junit = out / "pytest_gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-rfEs", "-p", "no:cacheprovider",
           f"--junitxml={junit}"]
    if importlib.util.find_spec("xdist") is not None:
        # Most GPU tests wait on a fresh interpreter's CUDA start-up (10-20 s each), not on the GPU:
        # spread them test by test (the project's --dist loadfile would keep one file on one worker).
        cmd += ["-n", "6", "--dist", "load"]
    cmd += ["--durations", "25"]
    print(f"step: pytest -m gpu (timeout {timeout:.0f} s)", flush=True)
    code, seconds = run_step(cmd, timeout, out / "pytest_gpu.log", env)
    counts = pytest_counts(junit) if code is not None else None
    status = "timed out" if code is None else "ok" if code == 0 else f"exit {code}"
    return {"status": status, "seconds": seconds, "counts": counts, "log": str(out / "pytest_gpu.log")}


def write_subset(src: Path, dst: Path, n: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("test.source", "test.target"):
        lines = (src / name).read_text(encoding="utf-8").splitlines()
        if len(lines) < n:
            raise SystemExit(f"gpu.py: {src / name} has {len(lines)} lines, fewer than the {n} asked for")
        (dst / name).write_text("".join(x + "\n" for x in lines[:n]), encoding="utf-8")
    return dst


def config_names(a: argparse.Namespace) -> list[str]:
    """The configurations plan_configs makes for these arguments, by name (what --configs picks from)."""
    if a.tiny:
        return ["marian-tiny bf16"]
    return ["embedded fp32"] + [f"marian-opus {DTYPE_SHORT[d]}" for d in ("float32", "float16", "bfloat16")
                                if not (a.device == "cpu" and d == "float16")]


def plan_configs(a: argparse.Namespace, out: Path, data: Path) -> list[dict[str, Any]]:
    """The configurations, most important first (a step that runs out of budget is the last)."""
    marian = "marian-tiny" if a.tiny else "marian-opus"
    embedded = "marian-tiny" if a.tiny else "embedded"
    dtypes = ["float32", "float16", "bfloat16"]
    if a.device == "cpu":
        dtypes.remove("float16")  # seq2seq_eval refuses --fp16 on CPU
    common = {"device": a.device, "bs": a.bs, "num_beams": a.num_beams, "rounds": a.rounds,
              "methods": ["a", "b", "d", "d0"], "models_dir": str(out / "models")}
    # The CTranslate2 engine beside the fp32 runs, where the package is there (its wheel in .whl/).
    have_ct2 = importlib.util.find_spec("ctranslate2") is not None
    ct2 = (["e32", "e16", "e8"] if a.device == "cuda" else ["e16", "e8"]) if have_ct2 else []
    # The Marian's sweep also on CTranslate2, at the compute type `--engine ctranslate2` gives by
    # default (float32 for a model saved in fp32) and at float16, to choose that engine's default.
    marian_sweep = ["d"] + (["e32", "e16"] if have_ct2 else [])
    configs = [{**common, "methods": common["methods"] + ct2, "name": f"{embedded} fp32", "model": embedded, "dtype": "float32",
                "data_dir": str(write_subset(data, out / "data" / f"n{a.n_embedded}", a.n_embedded)),
                "sweep": a.sweep_embedded, "sweep_methods": ["d"], "sweep_data_dir": str(write_subset(data, out / "data" / f"n{a.n_sweep_embedded}",
                                                                              a.n_sweep_embedded)),
                "max_new_tokens": a.max_new_tokens_embedded, "cap": a.config_timeout}]
    for dtype in dtypes:
        fp32 = dtype == "float32"
        configs.append({
            **common, "methods": common["methods"] + (ct2 if fp32 else []),
            "name": f"{marian} {DTYPE_SHORT[dtype]}", "model": marian, "dtype": dtype,
            "data_dir": str(write_subset(data, out / "data" / f"n{a.n_marian}", a.n_marian)),
            "max_new_tokens": a.max_new_tokens, "sweep": a.sweep if fp32 or a.sweep_half else [],
            "sweep_methods": marian_sweep if fp32 else ["d"],
            "sweep_data_dir": str(write_subset(data, out / "data" / f"n{a.n_sweep}", a.n_sweep)) if fp32 or a.sweep_half else None,
            "profile": dtype in ("float32", "bfloat16") and not a.no_profile, "cap": a.config_timeout,
        })
    if a.tiny:
        # One configuration that goes through every path (a half-precision dtype, the sweep, the
        # profile), so that the check stays short.
        configs = [{**configs[-1], "sweep": a.sweep, "sweep_data_dir": configs[1]["sweep_data_dir"], "profile": True,
                    "methods": common["methods"] + ct2, "sweep_methods": ["d"] + ct2[:1]}]
    if a.configs:
        configs = [c for c in configs if c["name"] in a.configs]
    if a.methods:
        # The CTranslate2 methods only where the configuration had them (fp32, package there).
        for c in configs:
            c["methods"] = [m for m in a.methods if m in METHOD_NAMES or m in c["methods"]]
    for c in configs:
        c["out"] = str(out / "configs" / re.sub(r"[^A-Za-z0-9]+", "_", c["name"]))
    return configs


def run_config(spec: dict[str, Any], budget: Budget, env: dict[str, str]) -> dict[str, Any]:
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1) + "\n")
    timeout = budget.timeout(spec["cap"])
    if timeout is None:
        return {"spec": spec, "status": "skipped: no time left"}
    print(f"step: {spec['name']} (timeout {timeout:.0f} s)", flush=True)
    code, seconds = run_step([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)], timeout,
                             out / "worker.log", env)
    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        result = {"spec": spec, "rounds": [], "sweep": {}, "profile": None, "complete": False}
    result["status"] = "timed out" if code is None else "ok" if code == 0 else f"exit {code}"
    result["seconds"] = seconds
    progress = [line for line in (out / "worker.log").read_text(errors="replace").splitlines()
                if line.startswith("  ") and line.strip()]
    print("\n".join(progress) + f"\n  {spec['name']}: {result['status']} in {seconds:.0f} s", flush=True)
    if code not in (0, None):
        tail = (out / "worker.log").read_text(errors="replace").splitlines()[-15:]
        result["log_tail"] = tail
        print("\n".join(f"    | {line}" for line in tail), flush=True)
    return result


# ---------------------------------------------------------------------------- the table


def median_of(rounds: list[dict[str, Any]], key: str, figure: str) -> float | None:
    values = [r["methods"][key][figure] for r in rounds if key in r["methods"] and r["methods"][key][figure] is not None]
    return statistics.median(values) if values else None


def ratio(rounds: list[dict[str, Any]], x: str, y: str) -> float | None:
    values = [r["methods"][x]["samples_per_second"] / r["methods"][y]["samples_per_second"]
              for r in rounds if x in r["methods"] and y in r["methods"]]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


THROUGHPUT_COLUMNS = (("configuration", 20), ("method", 29), ("samples/s", 10), ("gen tok/s", 10),
                      ("peak MB", 9), ("BLEU", 7), ("same as a", 10), ("x (a)", 7), ("x (b)", 7))


def row(cells: Sequence[str], columns: Sequence[tuple[str, int]]) -> str:
    return "".join(f"{c:<{w}}" if i < 2 else f"{c:>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, columns)))


def render(tests: dict[str, Any] | None, results: list[dict[str, Any]], a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The one table, the goal lines and the suggested default; and the same as JSON."""
    lines: list[str] = []
    machine = next((r["machine"] for r in results if r.get("machine")), None)
    if machine:
        lines.append(f"device: {machine['name']}" + (f" ({machine['memory_gib']} GiB)" if "memory_gib" in machine else "")
                     + f", torch {machine['torch']} (CUDA {machine['cuda']}), transformers {machine['transformers']}")
    verdicts: list[tuple[str, bool]] = []
    if tests is not None:
        c = tests.get("counts")
        counts = (f"{c['passed']} passed, {c['failed']} failed, {c['errors']} errors, {c['skipped']} skipped"
                  if c else "no counts")
        lines.append(f"pytest -m gpu: {tests['status']}, {counts}" + (f" in {tests['seconds']:.0f} s" if "seconds" in tests else ""))
        verdicts.append(("pytest -m gpu: every GPU test passed, none skipped",
                         bool(c) and tests["status"] == "ok" and c["failed"] == c["errors"] == c["skipped"] == 0 and c["passed"] > 0))
    head = "".join(f"{n:<{w}}" if i < 2 else f"{n:>{w}}" for i, (n, w) in enumerate(THROUGHPUT_COLUMNS))
    lines += ["", f"throughput, median of {a.rounds} round(s) (x (a), x (b): samples/s ratios within a round, median)",
              head, "-" * len(head)]
    summary: dict[str, Any] = {"tests": tests, "configs": [], "machine": machine}
    for r in results:
        spec, rounds = r["spec"], r.get("rounds", [])
        status = r.get("status", "")
        entry = {"name": spec["name"], "device": spec["device"], "status": status, "rounds_done": len(rounds), "max_tokens": r.get("max_tokens"),
                 "methods": {}, "sweep": {}, "profile": r.get("profile")}
        if not rounds:
            lines.append(row([spec["name"], f"({status or 'no result'})"] + [""] * 7, THROUGHPUT_COLUMNS))
        for j, key in enumerate(spec["methods"]):
            if not rounds:
                break
            label = method_name(key, spec["device"]) + (f" {r['max_tokens']}" if key == "d" else f" --bs {spec['bs']}" if key in ("a", "b") else "")
            m = {f: median_of(rounds, key, f) for f in ("samples_per_second", "generated_tokens_per_second", "bleu",
                                                          "identical_to_a")}
            peak = (statistics.median(max(x["methods"][key]["peak_memory_mb_per_rank"]) for x in rounds)
                    if peak_counted(key, spec["device"]) else None)
            m["peak_memory_mb"] = peak
            m["vs_a"] = ratio(rounds, key, "a") if key != "a" else None
            m["vs_b"] = ratio(rounds, key, "b") if key not in ("a", "b") else None
            entry["methods"][key] = m
            name = spec["name"] + ("" if len(rounds) == spec["rounds"] else f" [{len(rounds)} rd]")
            lines.append(row([name if j == 0 else "", label, fmt(m["samples_per_second"], ".1f"),
                              fmt(m["generated_tokens_per_second"], ".0f"), fmt(peak, ".0f"), fmt(m["bleu"], ".2f"),
                              fmt(None if m["identical_to_a"] is None else 100 * m["identical_to_a"], ".1f") + "%",
                              fmt(m["vs_a"], ".2f"), fmt(m["vs_b"], ".2f")], THROUGHPUT_COLUMNS))
        if rounds and {"a", "b", "d"} <= set(spec["methods"]):
            d_a, d_b = entry["methods"]["d"]["vs_a"], entry["methods"]["d"]["vs_b"]
            gap = max(abs(x["methods"]["d"]["bleu"] - x["methods"]["a"]["bleu"]) for x in rounds)
            ok = d_a is not None and d_b is not None and d_a >= tp.SPEEDUP_VS_TUTORIAL and d_b >= tp.SPEEDUP_VS_LEGACY \
                and gap <= tp.BLEU_TOLERANCE
            verdicts.append((f"{spec['name']}: (d) >= {tp.SPEEDUP_VS_TUTORIAL}x (a) and >= {tp.SPEEDUP_VS_LEGACY}x (b), "
                             f"BLEU within {tp.BLEU_TOLERANCE} of (a): {fmt(d_a, '.2f')}x, {fmt(d_b, '.2f')}x, "
                             f"|BLEU gap| <= {gap:.2f} ({len(rounds)} round(s))", ok))
        # In the spec's order (result.json is written with sorted keys): an engine's first swept
        # method is the one its suggested default comes from.
        sweeps = r.get("sweep", {})
        for key in [k for k in spec.get("sweep_methods", ["d"]) if k in sweeps]:
            values = dict(sorted(sweeps[key].items(), key=lambda kv: int(kv[0])))
            entry["sweep"][key] = {value: {
                "samples_per_second": statistics.median(x["samples_per_second"] for x in runs),
                "peak_memory_mb": max(x["peak_memory_mb"] for x in runs), "batches": runs[0]["batches"],
                "rounds": len(runs), "n": runs[0]["n"],
            } for value, runs in values.items()}
        summary["configs"].append(entry)
    # The sweep, one line per configuration that has one.
    swept = [e for e in summary["configs"] if any(e["sweep"].values())]
    suggestions: dict[str, dict[str, Any]] = {}
    if swept:
        lines += ["", "seq2seq_eval samples/s (peak MB) as --max_tokens varies, median of rounds"]
        for e in swept:
            e["best_max_tokens"] = {}
            for key, points in e["sweep"].items():
                if not points:
                    continue
                cells = [f"{v}: {s['samples_per_second']:.1f} ("
                         + (f"{s['peak_memory_mb']:.0f} MB, " if peak_counted(key, e["device"]) else "")
                         + f"{s['batches']} batches)"
                         for v, s in points.items()]
                best = max(points, key=lambda v: points[v]["samples_per_second"])
                e["best_max_tokens"][key] = int(best)
                lines.append(f"{e['name']:<20}{key:<5}" + "; ".join(cells) + f"  -> best {best}")
        # Each engine's default from the Marian (the embedded model is too small to stand for real
        # models), at the settings that engine's user gets without flags: its first swept method.
        marian = [e for e in swept if e["name"].startswith("marian")]
        chosen = (marian or swept)[0]
        for key, best in chosen["best_max_tokens"].items():
            suggestions.setdefault(ENGINE_OF[key], {"value": best, "from": f"{chosen['name']} {method_name(key, chosen['device'])}"})
        summary["suggested_max_tokens"] = suggestions
    profiles = [e for e in summary["configs"] if e.get("profile")]
    if profiles:
        lines += ["", "one planned batch (the costliest), unprofiled seconds per variant (fp32: seq2seq_eval's beam "
                  "cache vs generate()'s own; fp16/bf16: without and with cuDNN's attention)"]
        for e in profiles:
            p = e["profile"]
            first = next(iter(p["seconds"]))
            top = p["top"][first][0] if p["top"].get(first) else ["-", 0.0]
            seconds = ", ".join(f"{label} {value:.2f} s" for label, value in p["seconds"].items())
            lines.append(f"{e['name']:<20}{p['rows']} rows x {p['padded_len']} tokens: {seconds}; "
                         f"top op ({first}) {top[0]} {top[1]:.2f} s (see profile_*.txt)")
    lines.append("")
    for text, ok in verdicts:
        lines.append(f"{'PASS' if ok else 'MISS'}  {text}")
    for engine, s in suggestions.items():
        lines.append(f"suggested GPU default, --engine {engine}: --max_tokens {s['value']} (best measured samples/s, "
                     f"{s['from']})")
    summary["goals"] = [{"goal": t, "pass": ok} for t, ok in verdicts]
    return "\n".join(lines), summary


# ---------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker_main(Path(a.worker))
    unknown = sorted(set(a.configs or ()) - set(config_names(a)))
    if unknown:  # before the tests step: a typo must not cost a lent machine's minutes
        print(f"gpu.py: --configs {', '.join(unknown)}: no such configuration; expected some of "
              f"{', '.join(repr(n) for n in config_names(a))}", file=sys.stderr)
        return 2
    budget = Budget(a.budget)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = tp.child_env()
    env["PYTHONUNBUFFERED"] = "1"
    if a.device == "cuda":
        # Workers and tests see the GPU (throughput.py's CPU jobs would pin one thread each).
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(key, None)
    tests = None if a.skip_tests else run_tests(out, budget, a.tests_timeout, env)
    n_max = max(a.n_embedded, a.n_sweep_embedded, a.n_marian, a.n_sweep)
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_data.py"), "--task", tp.TASK, "--bench", str(n_max),
                    "--out", str(out / "data" / "bench")], check=True, capture_output=True, timeout=120)
    data = out / "data" / "bench" / tp.TASK
    results = [run_config(spec, budget, env) for spec in plan_configs(a, out, data)]
    table, summary = render(tests, results, a)
    print("\n" + table, flush=True)
    (out / "table.txt").write_text(table + "\n", encoding="utf-8")
    summary["settings"] = vars(a)
    tp.write_json_atomic(out / "summary.json", summary)
    print(f"\nwrote {out / 'table.txt'} and {out / 'summary.json'}")
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out", default=os.environ.get("OUT") or "bench_out", help="results folder (default ${OUT:-bench_out})")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny random Marian for every configuration, few examples: checks this script, measures nothing")
    p.add_argument("--skip_tests", action="store_true", help="do not run pytest -m gpu")
    p.add_argument("--no_profile", action="store_true", help="skip the torch.profiler step")
    p.add_argument("--budget", type=float, default=540, help="seconds for all steps together")
    p.add_argument("--tests_timeout", type=float, default=240)
    p.add_argument("--config_timeout", type=float, default=150, help="seconds per configuration at most")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bs", type=int, default=64, help="batch size of (a) and (b); (d) gets --bs x mean source length tokens")
    p.add_argument("--num_beams", type=int, default=4)
    p.add_argument("--n_embedded", type=int, default=1000, help="examples for the embedded model's comparison")
    p.add_argument("--n_marian", type=int, default=512, help="examples for the opus-size Marian's comparisons")
    p.add_argument("--n_sweep_embedded", type=int, default=2000)
    p.add_argument("--n_sweep", type=int, default=1000, help="examples for the opus-size Marian's --max_tokens sweep")
    p.add_argument("--sweep", type=_ints, default=[4096, 8192, 16384, 32768], help="--max_tokens values, Marian fp32")
    p.add_argument("--sweep_half", action="store_true",
                   help="sweep the opus-size Marian's fp16 and bf16 configurations too (HF engine)")
    p.add_argument("--sweep_embedded", type=_ints, default=[4096, 8192, 16384, 32768])
    p.add_argument("--max_new_tokens", type=int, default=64, help="for the Marian configurations")
    p.add_argument("--max_new_tokens_embedded", type=int, default=None,
                   help="for the embedded model (default: its own max_length 120; it stops at EOS)")
    p.add_argument("--configs", type=lambda text: [x.strip() for x in text.split(",") if x.strip()], default=None,
                   help="only these configurations, by name, comma-separated (e.g. 'embedded fp32,marian-opus fp32')")
    p.add_argument("--methods", type=lambda text: [x.strip() for x in text.split(",") if x.strip()], default=None,
                   help="comma-separated methods for every configuration, in this order (default a,b,d,d0 and the "
                        "CTranslate2 ones): " + ", ".join(sorted(METHOD_NAMES)) + ", e32, e16, e8")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.tiny:
        # Small enough for a test on 2 CPU cores; the figures mean nothing.
        a.rounds, a.bs, a.num_beams, a.max_new_tokens = 1, 4, 2, 6
        a.n_embedded = a.n_marian = a.n_sweep_embedded = a.n_sweep = 12
        a.sweep, a.sweep_embedded = [32, 96], []
    unknown = [m for m in a.methods or () if m not in METHOD_NAMES and m not in CT2_COMPUTE["cuda"]]
    if unknown:
        p.error(f"--methods: unknown {', '.join(unknown)}; expected some of {', '.join([*METHOD_NAMES, *CT2_COMPUTE['cuda']])}")
    for flag in ("rounds", "bs", "num_beams", "n_embedded", "n_marian", "n_sweep", "n_sweep_embedded"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(a, flag)}")
    return a


if __name__ == "__main__":
    sys.exit(main())
