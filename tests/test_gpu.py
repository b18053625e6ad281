"""GPU tests: `python -m pytest -m gpu` on a machine with CUDA; every test here skips without it.

conftest._env hides the GPUs from the tests' subprocesses (CPU tests stay CPU tests on a GPU
machine); these tests pass one GPU back through CUDA_VISIBLE_DEVICES. benchmarks/gpu.sh runs them.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
from pathlib import Path

import pytest

from conftest import REPO, assert_ok, metrics_of, single, torchrun, write_legacy
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL, EvalConfig

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def _one_gpu() -> str:
    """The first GPU this process sees, as the subprocesses' only visible GPU: the sharing tests
    need exactly one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0] if visible else "0"


# single(..., fresh=True) with it: the GPU runs start their own interpreter, which sets up CUDA
# for that GPU alone, as a user's run does (not a fork of one started for CPU runs).
GPU = {"CUDA_VISIBLE_DEVICES": _one_gpu()}
EMBEDDED = ["--model_name", str(EMBEDDED_MODEL), "--data_dir", str(EMBEDDED_DATA["translation"]),
            "--task", "translation", "--bs", "64"]


def generations(save: Path) -> list[str]:
    return (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def cuda_fp32(tmp_path_factory) -> Path:
    """The embedded model on the embedded translation set, one process, CUDA, fp32."""
    save = tmp_path_factory.mktemp("cuda_fp32") / "out"
    assert_ok(single([*EMBEDDED, "--device", "cuda", "--save_dir", str(save)], cwd=save.parent, env=GPU, fresh=True))
    return save


# ---------------------------------------------------------------- process groups on one GPU


def test_nccl_at_world_size_1(cuda_fp32, tmp_path):
    """torchrun with one rank and --dist_backend nccl runs on the GPU, with the single process's
    generations. (One rank creates no process group: there is nothing to exchange.)"""
    save = tmp_path / "out"
    proc = torchrun(1, [*EMBEDDED, "--device", "cuda", "--dist_backend", "nccl", "--save_dir", str(save)],
                    cwd=tmp_path, env=GPU)
    assert_ok(proc)
    m = metrics_of(save)
    assert m["provenance"]["device_type"] == "cuda" and m["provenance"]["config"]["dist_backend"] == "nccl"
    assert m["throughput"]["per_rank"][0]["device"] == "cuda:0"
    assert generations(save) == generations(cuda_fp32)
    assert m["bleu"] >= 90  # 93.49 in the README (CPU), the same on CUDA in GPU.md


def test_two_ranks_share_one_gpu_through_gloo(cuda_fp32, tmp_path):
    save = tmp_path / "out"
    proc = torchrun(2, [*EMBEDDED, "--device", "cuda", "--dist_backend", "gloo", "--save_dir", str(save)],
                    cwd=tmp_path, env=GPU)
    assert_ok(proc)
    m = metrics_of(save)
    assert m["n_gpus"] == 2 and [r["device"] for r in m["throughput"]["per_rank"]] == ["cuda:0", "cuda:0"]
    assert all(r["examples"] > 0 for r in m["throughput"]["per_rank"])
    assert generations(save) == generations(cuda_fp32)
    assert m["bleu"] == metrics_of(cuda_fp32)["bleu"]


def test_two_ranks_on_one_gpu_with_nccl_are_refused_in_one_line(tmp_path):
    proc = torchrun(2, [*EMBEDDED, "--device", "cuda", "--save_dir", str(tmp_path / "out")], cwd=tmp_path, env=GPU)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seq2seq_eval: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "2 ranks on this node but 1 visible GPU(s)" in errors[0] and "--dist_backend gloo" in errors[0]


# ---------------------------------------------------------------- half precision


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_keeps_bleu_on_the_embedded_model(cuda_fp32, tmp_path, dtype):
    save = tmp_path / "out"
    assert_ok(single([*EMBEDDED, "--device", "cuda", f"--{dtype}", "--save_dir", str(save)], cwd=tmp_path, env=GPU, fresh=True))
    half, full = metrics_of(save)["bleu"], metrics_of(cuda_fp32)["bleu"]
    assert abs(half - full) <= 0.5, (dtype, half, full)


# ---------------------------------------------------------------- the CTranslate2 engine on CUDA


@pytest.fixture(scope="module")
def ct2_env(tmp_path_factory) -> dict[str, str]:
    """The GPU, and a conversion cache of this module's own (converted once, by the first run)."""
    pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')
    return {**GPU, "SEQ2SEQ_EVAL_CACHE": str(tmp_path_factory.mktemp("ct2_cache"))}


@pytest.fixture(scope="module")
def ct2_fp32(ct2_env, tmp_path_factory) -> Path:
    save = tmp_path_factory.mktemp("ct2_fp32") / "out"
    assert_ok(single([*EMBEDDED, "--device", "cuda", "--engine", "ctranslate2", "--compute_type", "float32",
                      "--save_dir", str(save)], cwd=save.parent, env=ct2_env, fresh=True))
    return save


def test_ctranslate2_on_cuda_agrees_with_the_hf_engine(cuda_fp32, ct2_fp32):
    """The #22 agreement bar on the GPU: >= 95% identical generations, BLEU within 0.3."""
    m = metrics_of(ct2_fp32)
    assert m["provenance"]["engine"]["name"] == "ctranslate2" and m["provenance"]["engine"]["compute_type"] == "float32"
    assert m["throughput"]["per_rank"][0]["device"] == "cuda:0"
    ours, theirs = generations(ct2_fp32), generations(cuda_fp32)
    assert len(ours) == len(theirs) and sum(a == b for a, b in zip(ours, theirs)) >= 0.95 * len(theirs)
    assert abs(m["bleu"] - metrics_of(cuda_fp32)["bleu"]) <= 0.3


@pytest.mark.parametrize("compute_type", ["float16", "int8_float16"])
def test_ctranslate2_half_and_int8_keep_bleu(ct2_env, ct2_fp32, tmp_path, compute_type):
    save = tmp_path / "out"
    assert_ok(single([*EMBEDDED, "--device", "cuda", "--engine", "ctranslate2", "--compute_type", compute_type,
                      "--save_dir", str(save)], cwd=tmp_path, env=ct2_env, fresh=True))
    m = metrics_of(save)
    assert m["provenance"]["engine"]["compute_type"] == compute_type
    assert abs(m["bleu"] - metrics_of(ct2_fp32)["bleu"]) <= 0.5, (compute_type, m["bleu"])


def test_ctranslate2_two_ranks_share_one_gpu_through_gloo(ct2_env, ct2_fp32, tmp_path):
    save = tmp_path / "out"
    proc = torchrun(2, [*EMBEDDED, "--device", "cuda", "--dist_backend", "gloo", "--engine", "ctranslate2",
                        "--compute_type", "float32", "--save_dir", str(save)], cwd=tmp_path, env=ct2_env)
    assert_ok(proc)
    m = metrics_of(save)
    assert [r["device"] for r in m["throughput"]["per_rank"]] == ["cuda:0", "cuda:0"]
    assert generations(save) == generations(ct2_fp32) and m["bleu"] == metrics_of(ct2_fp32)["bleu"]


# ---------------------------------------------------------------- the beam cache on CUDA

# The CPU version's builders: tiny random models whose beam searches move beams around.
_generate_spec = importlib.util.spec_from_file_location("test_generate_builders", REPO / "tests" / "test_generate.py")
builders = importlib.util.module_from_spec(_generate_spec)
_generate_spec.loader.exec_module(builders)
spare_slot_appends = builders.spare_slot_appends  # the fixture, under its name


def _generate_on_cuda(model, gc, cache: bool, seed: int = 0):
    from seq2seq_eval.engines.beam_cache import beam_cache, cache_kwarg

    ids, mask = builders._batch(model)
    torch.manual_seed(seed)
    extra = {cache_kwarg(model): beam_cache(model, gc)} if cache else {}
    if cache:
        assert extra[cache_kwarg(model)] is not None
    with torch.inference_mode():
        return model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), generation_config=gc, **extra)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("family", ["t5", "bart", "marian", "mbart", "pegasus", "m2m100"])
@pytest.mark.parametrize("options", [
    {},
    {"num_return_sequences": 3},
    {"do_sample": True, "top_k": 20},
    {"length_penalty": 0.6, "no_repeat_ngram_size": 2, "early_stopping": True, "min_length": 8},
], ids=["plain", "three_returned", "beam_sampling", "penalties"])
def test_beam_cache_on_cuda_is_bit_identical_to_generates_own(family, dtype, options, spare_slot_appends):
    model = builders._tiny(family).to("cuda", getattr(torch, dtype))
    gc = builders._gc(model, **options)
    ours, theirs = _generate_on_cuda(model, gc, cache=True), _generate_on_cuda(model, gc, cache=False)
    # The spare slot is used on CUDA too (index_select into a strided view is accepted there).
    assert spare_slot_appends["spare"] > 0 and spare_slot_appends["concatenated"] == 0
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.sequences_scores, theirs.sequences_scores)
    steps = theirs.beam_indices[:, 1:-1]
    assert ((steps >= 0) & (steps != steps[:, :1])).any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_generation_calls_no_cudnn_attention(dtype):
    """In fp16/bf16 torch may pick cuDNN's attention, which plans anew for every shape beam search
    brings (a new key length each step): the HF engine keeps generate() off it."""
    from torch.profiler import ProfilerActivity, profile

    from seq2seq_eval.engines.hf import HFEngine
    from seq2seq_eval.inputs.files import read_lines
    from seq2seq_eval.model import settings as model_settings

    cfg = EvalConfig(model_name=str(EMBEDDED_MODEL), generate_kwargs=(("num_beams", 4),))
    tokenizer = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    gc = model_settings.generation_config_for(model_config, base, tokenizer, cfg)
    device = torch.device("cuda")
    model = model_settings.load_model(cfg, device).to(getattr(torch, dtype))
    sources = read_lines(EMBEDDED_DATA["translation"] / "test.source")[:16]
    ids, _ = model_settings.encode_sources(tokenizer, sources, "translate: ", 128)
    engine = HFEngine(model, tokenizer, gc, device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = engine.generate(ids, 0)
    names = {e.key for e in prof.key_averages()}
    assert any("scaled_dot_product" in n for n in names), sorted(names)  # attention ran through SDPA
    assert not [n for n in names if "cudnn_attention" in n]
    assert len(out.preds) == len(ids)


# ---------------------------------------------------------------- out of memory, for real


def _gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def long_sources(tmp_path_factory):
    """A randomly initialised Marian at opus-mt-en-de's size, and 256 sources of 3 joined
    summarization passages (a few hundred tokens each): 4 beams x 64 new tokens of them fill
    gigabytes in one batch, tens of megabytes alone."""
    root = tmp_path_factory.mktemp("oom")
    model = _gpu_bench().build_marian(root / "marian", "opus")
    passages = (EMBEDDED_DATA["summarization"] / "test.source").read_text(encoding="utf-8").splitlines()
    sources = [" ".join(passages[(3 * i + k) % len(passages)] for k in range(3)) for i in range(256)]
    data = write_legacy(root / "data", sources, ["x"] * len(sources))
    return model, data


def _oom_config(model: Path, data: Path, save: Path, **kw) -> EvalConfig:
    return EvalConfig(model_name=str(model), data_dir=str(data), save_dir=str(save), device="cuda", debug=True,
                      generate_kwargs=(("num_beams", 4), ("max_new_tokens", 64)), **kw)


def _calibrate(cfg: EvalConfig) -> tuple[int, int]:
    """Memory the allocator holds with the model loaded (what runner.run will hold before its first
    batch), and the peak of the longest example generated alone, in bytes."""
    import tempfile

    from seq2seq_eval.model import settings as model_settings

    from seq2seq_eval.run import runner
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.engines.hf import HFEngine

    device = torch.device("cuda")
    gc.collect()
    torch.cuda.empty_cache()  # what earlier tests left cached would count as held
    prep = runner.prepare(cfg, DistEnv(), None, Path(tempfile.mkdtemp(prefix="gpu_calibrate_")))
    model = model_settings.load_model(cfg, device)
    held = torch.cuda.memory_reserved(device)
    gen = HFEngine(model, prep.tokenizer, prep.generation_config, device)
    longest = prep.batches[0].members[0]
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    gen.generate([prep.tokens.ids(longest)], 0)
    one = torch.cuda.max_memory_allocated(device) - base
    del gen, model
    gc.collect()
    torch.cuda.empty_cache()
    return held, one


def _run_limited(cfg: EvalConfig, limit: int):
    """runner.run with this process's CUDA allocator capped at `limit` bytes."""
    from seq2seq_eval.run import runner

    # With its index: set_per_process_memory_fraction refuses a bare torch.device("cuda").
    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    try:
        return runner.run(cfg)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        gc.collect()
        torch.cuda.empty_cache()


def test_out_of_memory_split_for_real(long_sources, tmp_path):
    """One planned batch of 256 cannot fit under the cap; it is split in halves until the pieces
    fit, and every example gets its prediction."""
    model, data = long_sources
    save = tmp_path / "out"
    cfg = _oom_config(model, data, save, bs=256)
    held, one = _calibrate(cfg)
    outcome = _run_limited(cfg, held + 16 * one + (256 << 20))
    preds = generations(save)
    assert len(preds) == 256 and all(preds)
    stats = outcome.metrics["throughput"]["per_rank"][0]
    assert outcome.metrics["throughput"]["split_batches"] == 1 and stats["out_of_memory_errors"] >= 1
    assert stats["generated_examples"] == 256
    assert "split_batches" in outcome.table
    lines = [json.loads(x) for x in (Path(f"{save}_tmp") / "journal_rank_0.jsonl").read_text().splitlines()]
    splits, parts = [e for e in lines if "split" in e], [e for e in lines if "part" in e]
    assert splits[0]["split"] == [0, 256] and len(splits) == stats["out_of_memory_errors"]
    assert sum(len(e["records"]) for e in parts) == 256


def test_an_example_that_cannot_fit_alone_fails_in_one_line(long_sources, tmp_path):
    from seq2seq_eval.errors import OutOfMemory

    model, data = long_sources
    cfg = _oom_config(model, data, tmp_path / "out", bs=8, n_obs=8)
    held, one = _calibrate(cfg)
    with pytest.raises(OutOfMemory, match=r"^example id \d+ \(source \d+ tokens, batch 0\) ran out of memory alone") as e:
        _run_limited(cfg, held + one // 3)
    assert "\n" not in str(e.value)
