"""Throughput benchmark: seq2seq_eval's batching against the usual approaches, in one invocation.

    python benchmarks/throughput.py [--model data_samples/model] [--n 2000] [--nproc 2] [--bs 16]
                                    [--max_tokens N] [--num_beams 4] [--rounds 3] [--out bench_out]

Writes a seeded, length-varied translation test set (scripts/make_data.py --bench N), then runs
up to eight real multi-process jobs (torchrun, gloo, CPU, OMP_NUM_THREADS=1 per process) on the
same model, data, process count and generation settings:

  (a) tutorial   DistributedSampler(shuffle=False) in file order, fixed batches of --bs padded
                 per batch, predictions gathered with all_gather_object, BLEU on rank 0;
  (b) legacy     every k-th example per rank, sorted by length, batches of --bs, rank files
                 merged by rank 0 (Hugging Face's legacy run_distributed_eval.py);
  (c) s2s --bs   seq2seq_eval with --bs;
  (d) s2s --max_tokens  seq2seq_eval with a padded-source-token budget per batch;
  (e) s2s ct2 float32   seq2seq_eval --engine ctranslate2, no batch flag (its default budget);
  (f) s2s ct2 int8      the same with --compute_type int8;
  (g) bare ct2 loop     translate_batch over (e)'s planned batches, nothing of the tool around it;
  (h) s2s defaults      seq2seq_eval with no batch flag (the HF engine's default budget).

(a), (b) and (g) are this script's worker mode (`torchrun ... throughput.py --worker tutorial ...`).
They run --rounds times, in turns; ratios are taken within a round, goals judged on the
median over rounds (a shared machine's speed drifts by more than the margins at stake). Then it
times rank 0's merge+combine+write path of seq2seq_eval on 100,000 synthetic records,
prints one table with the goals, and writes everything to {out}/results.json.
benchmarks/README.md explains every column.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The inputs and the bookkeeping every method shares come from seq2seq_eval itself (reading the
# data files, the task parameters, token counts, atomic writes), so the methods differ only in
# what is being compared: sharding, batching, generation and the hand-over to rank 0.
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # tail.py, shared with scale.py
from seq2seq_eval.model import settings as model_settings  # noqa: E402
from seq2seq_eval.engines.hf import generated_lengths  # noqa: E402
from seq2seq_eval.inputs.files import read_lines  # noqa: E402
from seq2seq_eval.atomic import write_json_atomic  # noqa: E402
from seq2seq_eval.run.plan import DEFAULT_MAX_TOKENS  # noqa: E402
TASK = "translation"  # BLEU: the goals compare scores, and BLEU is the cheap one to compute
MAX_SOURCE_LENGTH = 1024  # seq2seq_eval's default --max_source_length, used by every method
POLL_S = 0.1  # the legacy merge polls for rank files as often as seq2seq_eval does

METHODS = {
    "a": "(a) tutorial",
    "b": "(b) legacy split",
    "c": "(c) s2s --bs",
    "d": "(d) s2s --max_tokens",
    "e": "(e) s2s ct2 float32",
    "f": "(f) s2s ct2 int8",
    "g": "(g) bare ct2 loop",
    "h": "(h) s2s defaults",
}
# How each seq2seq_eval method runs: its batching ("bs", "max_tokens" or None for the defaults)
# and engine flags. (e) and (f) batch as the tool does by default for CTranslate2 (its measured
# best budget, plan.DEFAULT_MAX_TOKENS), as (h) does for the HF engine; (g) runs (e)'s planned
# batches with nothing around them.
S2S_METHODS = {
    "c": ("bs", []), "d": ("max_tokens", []),
    "e": (None, ["--engine", "ctranslate2", "--compute_type", "float32"]),
    "f": (None, ["--engine", "ctranslate2", "--compute_type", "int8"]),
    "h": (None, []),
}

# Column header and width of the printed table, in order.
COLUMNS = (
    ("method", 21), ("samples/s", 10), ("gen tok/s", 10), ("wall s", 8), ("src pad", 8),
    ("gen pad", 8), ("imbal", 6), ("tail s", 7), ("tail %", 7), ("peak MB/rank", 13), ("BLEU", 7),
)

# The goals, as (threshold, ...) constants so the printed lines and the JSON agree.
SPEEDUP_VS_TUTORIAL = 1.5
SPEEDUP_VS_LEGACY = 1.2
BLEU_TOLERANCE = 0.5
CT2_FLOAT32_SPEEDUP = 1.3  # (e) over the HF engine's best of (c) and (d)
CT2_INT8_SPEEDUP = 1.8  # (f) over the same
BARE_LOOP_FRACTION = 0.95  # (e) within 5% of (g)
DEFAULTS_VS_LEGACY = 1.2  # (h) over (b)
MIN_SOURCE_PADDING_EFFICIENCY = 0.95
MAX_RANK_IMBALANCE = 1.10
MAX_TAIL_FRACTION = 0.02
MICRO_RECORDS = 100_000
MICRO_LIMIT_S = 5.0
MAX_OTHER_LOAD = 0.25  # cores busy with other processes above which a run's figures are flagged


# ============================================================================ shared helpers


OPUS_SIZE = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                 encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512)
"""Helsinki-NLP/opus-mt-en-de's published sizes (config.json on the hub)."""


def build_opus_size(out_dir: Path, seed: int = 0) -> Path:
    """A randomly initialised BART at opus-mt-en-de's size (6+6 layers, d_model 512, FFN 2048, 8
    heads) with the embedded model's tokenizer and translation settings (prefix "translate: ", 4
    beams): 46.2M parameters, the model the engines were compared on. Built once; the same weights
    for the same seed."""
    if (out_dir / "model.safetensors").exists():
        return out_dir
    import torch
    from transformers import AutoConfig, BartConfig, BartForConditionalGeneration

    embedded = REPO / "data_samples" / "model"
    base = AutoConfig.from_pretrained(embedded)
    config = BartConfig(vocab_size=base.vocab_size, pad_token_id=base.pad_token_id, eos_token_id=base.eos_token_id,
                        bos_token_id=None, decoder_start_token_id=base.eos_token_id, forced_eos_token_id=base.eos_token_id,
                        task_specific_params={"translation": {"num_beams": 4, "prefix": "translate: "}}, **OPUS_SIZE)
    torch.manual_seed(seed)
    return save_with_embedded_tokenizer(BartForConditionalGeneration(config).eval(), out_dir)


def save_with_embedded_tokenizer(model: Any, out_dir: Path) -> Path:
    """`model` saved to `out_dir` with the embedded model's tokenizer files."""
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REPO / "data_samples" / "model" / name, tmp / name)
    tmp.rename(out_dir)  # why: a process killed mid-save must not leave a folder that looks built
    return out_dir


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# ============================================================================ worker mode (a), (b)


@dataclass
class BatchCounter:
    """Per-rank instrumentation, the same figures seq2seq_eval keeps in its rank stats."""

    rank: int
    examples: int = 0
    batches: int = 0
    generation_seconds: float = 0.0
    generated_tokens: int = 0  # tokens of the returned sequences up to their first EOS (engines.hf.generated_lengths)
    generated_tokens_reencoded: int = 0  # the decoded predictions re-tokenized: a cross-check
    padded_generated_tokens: int = 0  # rows x longest returned sequence, per batch
    decode_steps: int = 0  # longest returned sequence, summed over batches
    source_tokens: int = 0
    padded_source_tokens: int = 0
    peak_memory_bytes: int = 0

    def add(self, attention_mask: Any, width: int, lengths: list[int], reencoded: list[int], seconds: float) -> None:
        rows = int(attention_mask.shape[0])
        self.examples += rows
        self.batches += 1
        self.generation_seconds += seconds
        self.generated_tokens += sum(lengths)
        self.generated_tokens_reencoded += sum(reencoded)
        self.padded_generated_tokens += rows * width
        self.decode_steps += width
        self.source_tokens += int(attention_mask.sum())
        self.padded_source_tokens += int(attention_mask.numel())


def reencoded_lengths(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Token counts of decoded predictions, re-tokenized (EOS included, as the tokenizer appends
    it): a cross-check of the counts taken from the ids, recorded for all four methods."""
    return [len(ids) for ids in tokenizer(list(texts))["input_ids"]]


class Worker:
    """What both baselines share: the process group, the model, the settings and the decode."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        if not dist.is_initialized():  # benchmarks/gpu.py runs the methods in process, in a group of one
            dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.args = args
        self.save_dir = Path(args.save_dir)
        data_dir = Path(args.data_dir)
        self.sources = read_lines(data_dir / "test.source")
        self.targets = read_lines(data_dir / "test.target")
        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
        device = getattr(args, "device", "cpu")
        if device == "cuda":  # one GPU per local rank, as seq2seq_eval places its ranks
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}"
        self.device = torch.device(device)
        dtype = getattr(torch, getattr(args, "dtype", "float32"))
        # As seq2seq_eval's load_model: cast, then move.
        self.model = AutoModelForSeq2SeqLM.from_pretrained(args.model).to(dtype).to(self.device).eval()
        params = model_settings.task_params(self.model.config, TASK)
        self.prefix = params.pop("prefix", None) or getattr(self.model.config, "prefix", None) or ""
        # The model's generation defaults, then its task parameters, then --num_beams: the
        # order seq2seq_eval applies them in, so all four methods generate with one setting.
        from transformers import GenerationConfig

        known = set(GenerationConfig().to_dict())
        self.gc = copy.deepcopy(self.model.generation_config)
        for key, value in params.items():
            if key in known:
                setattr(self.gc, key, value)
        self.gc.num_beams = args.num_beams
        if args.num_beams > 1:
            self.gc.early_stopping = True  # STOPPING
        if getattr(args, "max_new_tokens", None):
            self.gc.max_new_tokens = args.max_new_tokens
        self.gc.num_return_sequences = 1  # spelled out, as seq2seq_eval records it
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.counter = BatchCounter(self.rank)
        self.torch = torch

    def generate(self, sources: Sequence[str], encoded: Any = None) -> list[str]:
        """One batch: pad (unless given padded ids), generate, decode exactly as seq2seq_eval does."""
        torch = self.torch
        t0 = time.perf_counter()
        if encoded is None:
            encoded = self.tokenizer(
                [self.prefix + s for s in sources], padding=True, truncation=True,
                max_length=MAX_SOURCE_LENGTH, return_tensors="pt",
            )
        with torch.inference_mode():
            sequences = self.model.generate(
                input_ids=encoded["input_ids"].to(self.device), attention_mask=encoded["attention_mask"].to(self.device),
                generation_config=self.gc,
            )
        # One transfer per batch, then decode on the host, as seq2seq_eval's HF engine does.
        sequences = sequences.cpu()
        texts = [t.strip() for t in self.tokenizer.batch_decode(
            sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )]
        seconds = time.perf_counter() - t0
        # Instrumentation after the clock stops.
        self.counter.add(encoded["attention_mask"], int(sequences.shape[1]) - 1,
                         generated_lengths(sequences, self.gc.eos_token_id, self.pad_id).tolist(),
                         reencoded_lengths(self.tokenizer, texts), seconds)
        return texts

    def finish_generation(self) -> None:
        # Measured where seq2seq_eval measures it: right after the rank's last batch.
        self.counter.peak_memory_bytes = (int(self.torch.cuda.max_memory_allocated(self.device))
                                          if self.device.type == "cuda" else peak_rss_bytes())

    def settings(self) -> dict[str, Any]:
        """Every field as generate() fills it in, as seq2seq_eval records its settings."""
        from seq2seq_eval.model.generation import effective, full_dict

        every = full_dict(effective(self.gc, self.model.config))
        return json.loads(json.dumps(every, sort_keys=True, default=str))

    def write_metrics(self, preds: Sequence[str]) -> float:
        """Rank 0: BLEU with sacrebleu, then the generations and the metric file (written last,
        as seq2seq_eval does). Returns the wall-clock time the metric file was written."""
        import sacrebleu

        bleu = sacrebleu.corpus_bleu(list(preds), [self.targets]).score
        self.save_dir.mkdir(parents=True, exist_ok=True)
        (self.save_dir / "test_generations.txt").write_text("".join(p + "\n" for p in preds), encoding="utf-8")
        (self.save_dir / "test_bleu.json").write_text(json.dumps({"bleu": bleu, "n_obs": len(preds)}) + "\n")
        return time.time()

    def write_bench_stats(self, per_rank: list[dict[str, Any]], handover: list[float], written: float) -> None:
        stats = {"per_rank": per_rank, "handover_times": handover, "metrics_written": written,
                 "generation": self.settings(), "prefix": self.prefix}
        (self.save_dir / "bench_stats.json").write_text(json.dumps(stats, indent=1) + "\n")

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def run_tutorial(w: Worker) -> None:
    """(a) The tutorial loop: a DistributedSampler in file order, fixed batches, all_gather_object."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    class Sources(Dataset):
        def __len__(self) -> int:
            return len(w.sources)

        def __getitem__(self, i: int) -> tuple[int, str]:
            return i, w.sources[i]

    sampler = DistributedSampler(Sources(), num_replicas=w.world, rank=w.rank, shuffle=False)
    loader = DataLoader(Sources(), batch_size=w.args.bs, sampler=sampler, collate_fn=list)
    results: list[tuple[int, str]] = []
    for batch in loader:
        indices = [i for i, _ in batch]
        results.extend(zip(indices, w.generate([s for _, s in batch])))
    w.finish_generation()
    handover = time.time()
    gathered: list[Any] = [None] * w.world
    dist.all_gather_object(gathered, {"results": results, "stats": asdict(w.counter), "handover": handover})
    if w.rank == 0:
        # DistributedSampler pads the last round with repeats so ranks get equal counts: keep
        # each example once.
        by_index = {i: text for part in gathered for i, text in part["results"]}
        written = w.write_metrics([by_index[i] for i in range(len(w.sources))])
        w.write_bench_stats([p["stats"] for p in gathered], [p["handover"] for p in gathered], written)
    w.close()


def run_legacy(w: Worker) -> None:
    """(b) The legacy split: strided shares sorted by length, rank files, rank 0 merges."""
    mine = list(range(w.rank, len(w.sources), w.world))
    # Tokenized once before the loop (not timed, like seq2seq_eval's up-front tokenization), so
    # the share is sorted by token length: a stronger baseline than legacy's character lengths.
    ids = w.tokenizer([w.prefix + w.sources[i] for i in mine], truncation=True, max_length=MAX_SOURCE_LENGTH)["input_ids"]
    order = sorted(range(len(mine)), key=lambda j: (-len(ids[j]), j))
    results: list[dict[str, Any]] = []
    bs = w.args.bs
    for start in range(0, len(order), bs):
        chunk = order[start : start + bs]
        encoded = w.tokenizer.pad({"input_ids": [ids[j] for j in chunk]}, return_tensors="pt")
        texts = w.generate([], encoded)
        results.extend({"id": mine[j], "pred": t} for j, t in zip(chunk, texts))
    w.finish_generation()
    tmp = w.save_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # Atomically, with seq2seq_eval's own writer: rank 0 never reads half a file, and (b) pays
    # what seq2seq_eval pays for it.
    write_json_atomic(tmp / f"rank_{w.rank}_output.json", {"records": results, "stats": asdict(w.counter)})
    if w.rank == 0:
        paths = [tmp / f"rank_{r}_output.json" for r in range(w.world)]
        while not all(p.exists() for p in paths):
            time.sleep(POLL_S)  # why: the same poll interval as seq2seq_eval, so tails compare
        parts = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
        records = sorted((r for part in parts for r in part["records"]), key=lambda r: r["id"])
        written = w.write_metrics([r["pred"] for r in records])
        w.write_bench_stats([p["stats"] for p in parts], [p.stat().st_mtime for p in paths], written)
    w.close()


def run_bare_worker(args: argparse.Namespace) -> int:
    """(g) CTranslate2's translate_batch over this rank's share of the plan (e) runs, with
    nothing of seq2seq_eval around it: no journal, no rank file, no per-batch decode or
    bookkeeping inside the timed loop. The preparation is seq2seq_eval's own (runner.prepare),
    so the batches are (e)'s exactly; the tokens are converted to strings before the clock starts."""
    import tempfile

    import ctranslate2
    import torch.distributed as dist

    from seq2seq_eval.run import runner
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.engines import ct2
    from seq2seq_eval.run.plan import assign_batches

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = [("num_beams", args.num_beams)] + ([("max_new_tokens", args.max_new_tokens)] if args.max_new_tokens else [])
    gen += [("early_stopping", True)] if args.num_beams > 1 else []  # as every method (STOPPING)
    cfg = EvalConfig(model_name=args.model, data_dir=args.data_dir, task=TASK, max_tokens=args.max_tokens,
                     engine="ctranslate2", compute_type="float32", device=args.device, generate_kwargs=tuple(gen))
    with tempfile.TemporaryDirectory(prefix="bare_") as cache:
        prep = runner.prepare(cfg, DistEnv(), None, Path(cache))
    tok = prep.tokenizer
    path = ct2.converted_model(args.model, 600)
    translator = ctranslate2.Translator(str(path), device="cpu", compute_type="float32", inter_threads=1,
                                        intra_threads=ct2.cpu_threads(world))
    mapping = ct2.translate_options(prep.generation_config, tok)
    mine = [prep.batches[i] for i in assign_batches(prep.batches, world)[rank]]
    inputs = [[tok.convert_ids_to_tokens(prep.tokens.ids(m)) for m in b.members] for b in mine]
    counter = BatchCounter(rank)
    results = []
    for batch, tokens in zip(mine, inputs):
        t0 = time.perf_counter()
        out = translator.translate_batch(tokens, **mapping.options)
        hyps = [tok.convert_tokens_to_ids(r.hypotheses[0]) for r in out]
        if mapping.forced_in_beams:  # forced_eos_token_id in beam search: ended and ranked as generate() does
            hyps = [ct2._force_end([(tok.convert_tokens_to_ids(h), s) for h, s in zip(r.hypotheses, r.scores)],
                                   mapping, mapping.options["length_penalty"])[0][0] for r in out]
        seconds = time.perf_counter() - t0
        texts = [tok.decode(h, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip() for h in hyps]
        lengths = [len(h) for h in hyps]
        widths = [len(tokens[j]) for j in range(len(tokens))]
        counter.examples += len(tokens)
        counter.batches += 1
        counter.generation_seconds += seconds
        counter.generated_tokens += sum(lengths)
        counter.padded_generated_tokens += len(tokens) * max(lengths)
        counter.decode_steps += max(lengths)
        counter.source_tokens += sum(widths)
        counter.padded_source_tokens += len(tokens) * max(widths)
        results += [{"id": int(m), "pred": t} for m, t in zip(batch.members, texts)]
    counter.peak_memory_bytes = peak_rss_bytes()
    save = Path(args.save_dir)
    (save / "tmp").mkdir(parents=True, exist_ok=True)
    write_json_atomic(save / "tmp" / f"rank_{rank}_output.json", {"records": results, "stats": asdict(counter)})
    dist.barrier()
    if rank == 0:
        paths = [save / "tmp" / f"rank_{r}_output.json" for r in range(world)]
        parts = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
        records = sorted((r for part in parts for r in part["records"]), key=lambda r: r["id"])
        import sacrebleu

        preds = [r["pred"] for r in records]
        targets = read_lines(Path(args.data_dir) / "test.target")
        (save / "test_generations.txt").write_text("".join(p + "\n" for p in preds), encoding="utf-8")
        (save / "test_bleu.json").write_text(json.dumps({"bleu": sacrebleu.corpus_bleu(preds, [targets]).score,
                                                         "n_obs": len(preds)}) + "\n")
        stats = {"per_rank": [p["stats"] for p in parts], "handover_times": [p.stat().st_mtime for p in paths],
                 "metrics_written": time.time(), "generation": prep.manifest["generation"], "prefix": prep.prefix}
        (save / "bench_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    dist.destroy_process_group()
    return 0


def worker_main(args: argparse.Namespace) -> int:
    if args.worker == "bare":
        return run_bare_worker(args)
    w = Worker(args)
    {"tutorial": run_tutorial, "legacy": run_legacy}[args.worker](w)
    return 0


# ============================================================================ driver


@dataclass
class MethodResult:
    key: str
    name: str
    n: int
    wall_seconds: float
    per_rank: list[dict[str, Any]]
    bleu: float
    tail_seconds: float
    generated_tokens: int
    padded_generated_tokens: int
    generation: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def generation_seconds(self) -> float:
        return max(r["generation_seconds"] for r in self.per_rank)

    @property
    def samples_per_second(self) -> float:
        return self.n / self.generation_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds

    @property
    def source_padding_efficiency(self) -> float:
        return sum(r["source_tokens"] for r in self.per_rank) / sum(r["padded_source_tokens"] for r in self.per_rank)

    @property
    def generated_padding_efficiency(self) -> float:
        return self.generated_tokens / self.padded_generated_tokens

    @property
    def rank_imbalance(self) -> float:
        times = [r["generation_seconds"] for r in self.per_rank]
        return max(times) / (sum(times) / len(times))

    @property
    def tail_fraction(self) -> float:
        return self.tail_seconds / self.wall_seconds

    @property
    def peak_mb(self) -> list[float]:
        return [r["peak_memory_bytes"] / 2**20 for r in self.per_rank]

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name, "n": self.n, "samples_per_second": self.samples_per_second,
            "generated_tokens_per_second": self.tokens_per_second, "generation_seconds": self.generation_seconds,
            "wall_seconds": self.wall_seconds, "source_padding_efficiency": self.source_padding_efficiency,
            "generated_padding_efficiency": self.generated_padding_efficiency,
            "rank_imbalance": self.rank_imbalance, "tail_seconds": self.tail_seconds,
            "tail_fraction_of_wall": self.tail_fraction, "peak_memory_mb_per_rank": self.peak_mb,
            "bleu": self.bleu, "generated_tokens": self.generated_tokens,
            "padded_generated_tokens": self.padded_generated_tokens, "per_rank": self.per_rank,
            "batches": sum(r["batches"] for r in self.per_rank), "generation": self.generation, **self.extra,
        }


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    # One thread per process for every method: with N ranks on N cores, more threads would only
    # make the ranks fight over cores, and torchrun sets 1 only when nproc > 1.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (all processes, all cores), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    # Includes torchrun's ranks: torchrun waits for them and we wait for torchrun.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(name: str, nproc: int, target: list[str], log: Path) -> tuple[float, float | None]:
    """A real multi-process job through torchrun. Returns its wall-clock seconds and the cores
    other processes kept busy meanwhile (on a shared machine, the figures are only as good as
    that number is small)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *target]
    log.parent.mkdir(parents=True, exist_ok=True)
    busy0, ours0 = busy_cpu_seconds(), children_cpu_seconds()
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    busy1, ours1 = busy_cpu_seconds(), children_cpu_seconds()
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise SystemExit(f"benchmark: {name} failed with exit code {proc.returncode}; log {log}:\n{tail}")
    other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall
    return wall, other


def fresh(path: Path) -> Path:
    """Removes an earlier benchmark's folder (seq2seq_eval refuses a temp dir holding old files)."""
    if path.exists():
        shutil.rmtree(path)
    return path


def run_baseline(key: str, worker: str, a: argparse.Namespace, data_dir: Path, root: Path) -> MethodResult:
    save = fresh(root / "runs" / worker)
    target = [str(Path(__file__).resolve()), "--worker", worker, "--model", str(a.model), "--data_dir", str(data_dir),
              "--bs", str(a.bs), "--num_beams", str(a.num_beams), "--save_dir", str(save), *device_args(a, "worker")]
    wall, other = launch(METHODS[key], a.nproc, target, root / "logs" / f"{worker}.log")
    return collect_baseline(key, save, wall, other)


def collect_baseline(key: str, save: Path, wall: float, other: float | None) -> MethodResult:
    """A finished (a) or (b) job's figures, from the files its rank 0 wrote."""
    stats = json.loads((save / "bench_stats.json").read_text())
    metrics = json.loads((save / "test_bleu.json").read_text())
    per_rank = stats["per_rank"]
    return MethodResult(
        key, METHODS[key], metrics["n_obs"], wall, per_rank, metrics["bleu"],
        tail_seconds=stats["metrics_written"] - max(stats["handover_times"]),
        generated_tokens=sum(r["generated_tokens"] for r in per_rank),
        padded_generated_tokens=sum(r["padded_generated_tokens"] for r in per_rank),
        generation=stats["generation"],
        extra={"other_cores_busy": other, "save": str(save), "decode_steps": sum(r["decode_steps"] for r in per_rank),
               "generated_tokens_reencoded": sum(r["generated_tokens_reencoded"] for r in per_rank)},
    )


STOPPING = "early_stopping=True with beams in every method: the stop CTranslate2's beam search makes (engines/ct2_rules.py)"


def stopping(a: argparse.Namespace) -> list[str]:
    return ["--early_stopping", "true"] if a.num_beams > 1 else []


def run_seq2seq_eval(key: str, a: argparse.Namespace, data_dir: Path, root: Path, max_tokens: int | None) -> MethodResult:
    batching, engine = S2S_METHODS[key]
    name = f"s2s_{key}"
    save = fresh(root / "runs" / name)
    tmp = fresh(root / "runs" / f"{name}_tmp")
    flags = {"bs": ["--bs", str(a.bs)], "max_tokens": ["--max_tokens", str(max_tokens)], None: []}[batching]
    # --debug keeps the temp dir: its journals give per-batch generated lengths and its rank
    # files the moment each rank handed over.
    target = ["-m", "seq2seq_eval", "--model_name", str(a.model), "--data_dir", str(data_dir), "--task", TASK,
              *flags, *engine, "--num_beams", str(a.num_beams), *stopping(a), "--save_dir", str(save), "--tmp_dir", str(tmp),
              "--debug", *device_args(a, "seq2seq_eval")]
    wall, other = launch(METHODS[key], a.nproc, target, root / "logs" / f"{name}.log")
    return collect_seq2seq_eval(key, a.model, save, tmp, wall, other, max_tokens if batching == "max_tokens" else None)


def run_bare(key: str, a: argparse.Namespace, data_dir: Path, root: Path, max_tokens: int) -> MethodResult:
    save = fresh(root / "runs" / "bare")
    target = [str(Path(__file__).resolve()), "--worker", "bare", "--model", str(a.model), "--data_dir", str(data_dir),
              "--max_tokens", str(max_tokens), "--num_beams", str(a.num_beams), "--save_dir", str(save),
              *device_args(a, "worker")]
    wall, other = launch(METHODS[key], a.nproc, target, root / "logs" / "bare.log")
    return collect_baseline(key, save, wall, other)


def device_args(a: argparse.Namespace, who: str) -> list[str]:
    """--device, the dtype and --max_new_tokens, spelled for this script's workers or for seq2seq_eval."""
    args = ["--device", a.device]
    if who == "worker":
        args += ["--dtype", a.dtype]
    elif a.dtype != "float32":
        args += ["--fp16" if a.dtype == "float16" else "--bf16"]
    if a.max_new_tokens:
        args += ["--max_new_tokens", str(a.max_new_tokens)]
    return args


def collect_seq2seq_eval(key: str, model: str, save: Path, tmp: Path, wall: float, other: float | None,
                         max_tokens: int | None) -> MethodResult:
    """A finished seq2seq_eval run's figures, from its metric file and its (kept) temp dir."""
    metrics_path = save / "test_bleu.json"
    metrics = json.loads(metrics_path.read_text())
    tp = metrics["throughput"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    generated = reencoded = padded = steps = 0
    for journal in sorted(tmp.glob("journal_rank_*.jsonl")):
        for line in journal.read_text().splitlines():
            entry = json.loads(line)
            if "records" not in entry:
                continue  # a split after running out of memory (seq2seq_eval/run/oom.py): its halves follow
            records = entry["records"]
            # n_tokens: the example's generated tokens up to its first EOS, as engines.hf.generated_lengths
            # counts them for (a)/(b); the longest of a batch is its number of decoder steps.
            width = max(r["n_tokens"] for r in records)
            generated += sum(r["n_tokens"] for r in records)
            reencoded += sum(reencoded_lengths(tokenizer, [r["pred"] for r in records]))
            padded += len(records) * width
            steps += width
    rank_files = sorted(tmp.glob("rank_*_output.json"))  # each rank's last write
    handover = max(p.stat().st_mtime for p in rank_files)
    per_rank = [{k: r[k] for k in ("rank", "examples", "batches", "generation_seconds", "new_generated_tokens",
                                   "source_tokens", "padded_source_tokens", "peak_memory_bytes")} for r in tp["per_rank"]]
    for r in per_rank:
        r["generated_tokens"] = r.pop("new_generated_tokens")
    return MethodResult(
        key, METHODS[key], metrics["n_obs"], wall, per_rank, metrics["bleu"],
        tail_seconds=metrics_path.stat().st_mtime - handover,
        generated_tokens=generated, padded_generated_tokens=padded,
        generation=metrics["provenance"]["generation"],
        extra={"other_cores_busy": other, "save": str(save), "max_tokens": max_tokens, "decode_steps": steps,
               "generated_tokens_reencoded": reencoded, "package_time_breakdown": tp["time_breakdown"]},
    )


def default_max_tokens(model: str, data_dir: Path, bs: int) -> int:
    """--bs times the mean tokenized source length: as many batches as --bs makes (so batches
    are as large on average, in rows), only cut by length instead of by count."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prefix = model_settings.task_params(AutoConfig.from_pretrained(model), TASK).get("prefix") or ""
    sources = read_lines(data_dir / "test.source")
    lengths = [len(ids) for ids in tokenizer([prefix + s for s in sources], truncation=True,
                                             max_length=MAX_SOURCE_LENGTH)["input_ids"]]
    return math.ceil(bs * sum(lengths) / len(lengths))


# ---------------------------------------------------------------------------- rank 0's tail at scale


def micro_tail(work: Path, n_records: int, n_ranks: int = 3, repeats: int = 3) -> dict[str, Any]:
    """Times seq2seq_eval's own rank-0 path (read rank files, merge by id, combine the metric,
    write the outputs) on `n_records` synthetic predictions in `n_ranks` rank files. Everything
    a rank would do (generating, per-example BLEU statistics, writing its file) is untimed."""
    from tail import make_rank_files, run_tail

    fresh(work)
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_data.py"), "--task", TASK, "--bench",
                    str(n_records), "--out", str(work / "data")], check=True, capture_output=True)
    sources = read_lines(work / "data" / TASK / "test.source")
    targets = read_lines(work / "data" / TASK / "test.target")
    make_rank_files(work / "files", sources, targets, n_ranks)
    times = []
    bleu = None
    for k in range(repeats):
        seconds, summary = run_tail(work / "files", fresh(work / f"out{k}"), n_ranks)
        times.append(seconds)
        bleu = summary["bleu"]
    return {"records": n_records, "rank_files": n_ranks, "seconds": times, "median_seconds": statistics.median(times),
            "max_seconds": max(times), "bleu": bleu}


# ---------------------------------------------------------------------------- report


def format_table(results: Sequence[MethodResult]) -> str:
    head = "".join(f"{name:<{w}}" if i == 0 else f"{name:>{w}}" for i, (name, w) in enumerate(COLUMNS))
    lines = [head, "-" * len(head)]
    for r in results:
        cells = (
            r.name, f"{r.samples_per_second:.2f}", f"{r.tokens_per_second:.1f}", f"{r.wall_seconds:.1f}",
            f"{r.source_padding_efficiency:.3f}", f"{r.generated_padding_efficiency:.3f}", f"{r.rank_imbalance:.3f}",
            f"{r.tail_seconds:.3f}", f"{100 * r.tail_fraction:.2f}", "/".join(f"{m:.0f}" for m in r.peak_mb), f"{r.bleu:.2f}",
        )
        lines.append("".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS))))
    return "\n".join(lines)


RATIOS = [(x, y) for x in ("c", "d") for y in ("a", "b")] + [
    ("e", "best HF"), ("f", "best HF"), ("e", "g"), ("h", "b"), ("h", "best HF")]


def speedups(by: dict[str, MethodResult]) -> dict[str, float]:
    """Samples/s ratios between the methods that ran; "best HF" is the better of (c) and (d)."""
    rate = {k: r.samples_per_second for k, r in by.items()}
    if "c" in rate or "d" in rate:
        rate["best HF"] = max(rate.get("c", 0.0), rate.get("d", 0.0))
    return {f"{x}/{y}": rate[x] / rate[y] for x, y in RATIOS if x in rate and y in rate}


def identical_outputs(by: dict[str, MethodResult], x: str, y: str) -> int | None:
    """Examples whose generations are the same in methods x and y (their generations files)."""
    if x not in by or y not in by:
        return None
    a, b = (Path(by[k].extra["save"]) / "test_generations.txt" for k in (x, y))
    return sum(p == q for p, q in zip(a.read_text().splitlines(), b.read_text().splitlines()))


def median_over(rounds: Sequence[dict[str, MethodResult]], figure: Any) -> float:
    return statistics.median(figure(by) for by in rounds)


def goals(rounds: Sequence[dict[str, MethodResult]], micro: dict[str, Any] | None) -> list[tuple[str, bool]]:
    """Each goal whose methods ran, on the median over rounds; a speed ratio is taken within each
    round first, so the machine drifting between rounds does not enter it."""
    ran = set(rounds[0])
    of = f" (median of {len(rounds)} rounds)" if len(rounds) > 1 else ""
    ratio = lambda name: median_over(rounds, lambda by: speedups(by)[name])  # noqa: E731
    checked = []
    if {"a", "b", "d"} <= ran:
        d_a, d_b = ratio("d/a"), ratio("d/b")
        bleu_gap = max(abs(by["d"].bleu - by["a"].bleu) for by in rounds)
        checked.append((f"(d) samples/s >= {SPEEDUP_VS_TUTORIAL}x (a) and >= {SPEEDUP_VS_LEGACY}x (b), BLEU within "
                        f"{BLEU_TOLERANCE} of (a): {d_a:.2f}x, {d_b:.2f}x{of}, |BLEU (d) - BLEU (a)| <= {bleu_gap:.2f}",
                        d_a >= SPEEDUP_VS_TUTORIAL and d_b >= SPEEDUP_VS_LEGACY and bleu_gap <= BLEU_TOLERANCE))
    if "d" in ran:
        src_pad = min(by["d"].source_padding_efficiency for by in rounds)  # the same plan every round
        imbalance = median_over(rounds, lambda by: by["d"].rank_imbalance)
        tail = median_over(rounds, lambda by: by["d"].tail_seconds)
        tail_fraction = median_over(rounds, lambda by: by["d"].tail_fraction)
        checked += [
            (f"(d) source padding efficiency >= {MIN_SOURCE_PADDING_EFFICIENCY}: {src_pad:.3f}",
             src_pad >= MIN_SOURCE_PADDING_EFFICIENCY),
            (f"(d) rank imbalance <= {MAX_RANK_IMBALANCE:.2f}: {imbalance:.3f}{of}", imbalance <= MAX_RANK_IMBALANCE),
            (f"(d) rank 0's tail <= {100 * MAX_TAIL_FRACTION:.0f}% of wall: {tail:.3f} s = {100 * tail_fraction:.2f}%{of}",
             tail_fraction <= MAX_TAIL_FRACTION),
        ]
    for key, goal in (("e", CT2_FLOAT32_SPEEDUP), ("f", CT2_INT8_SPEEDUP)):
        if key in ran and ran & {"c", "d"}:
            r = ratio(f"{key}/best HF")
            checked.append((f"({key}) samples/s >= {goal}x the HF engine's best of (c) and (d): {r:.2f}x{of}", r >= goal))
        if key in ran and "a" in ran:
            gap = max(abs(by[key].bleu - by["a"].bleu) for by in rounds)
            checked.append((f"({key}) BLEU within {BLEU_TOLERANCE} of (a): |BLEU ({key}) - BLEU (a)| <= {gap:.2f}",
                            gap <= BLEU_TOLERANCE))
    if {"e", "g"} <= ran:
        r = ratio("e/g")
        checked.append((f"(e) samples/s within {100 * (1 - BARE_LOOP_FRACTION):.0f}% of the bare loop (g): "
                        f"{r:.3f}x{of}", r >= BARE_LOOP_FRACTION))
    if {"h", "b"} <= ran:
        r = ratio("h/b")
        checked.append((f"(h) defaults (no batch flag) samples/s >= {DEFAULTS_VS_LEGACY}x (b): {r:.2f}x{of}",
                        r >= DEFAULTS_VS_LEGACY))
    if micro is not None:
        checked.append((f"rank 0's tail for {micro['records']:,} synthetic predictions < {MICRO_LIMIT_S:g} s: "
                        f"{micro['median_seconds']:.2f} s (median of {len(micro['seconds'])}, max {micro['max_seconds']:.2f} s)",
                        micro["median_seconds"] < MICRO_LIMIT_S and micro["records"] >= MICRO_RECORDS))
    return checked


def round_order(keys: Sequence[str], i: int) -> list[str]:
    """Round i's order: it turns by one method each round, so that no method always runs first or
    right after the slow one while the machine's speed drifts."""
    return list(keys[i % len(keys):]) + list(keys[:i % len(keys)])


def print_rounds(rounds: Sequence[dict[str, MethodResult]], keys: Sequence[str],
                 micro: dict[str, Any] | None) -> tuple[list[tuple[str, bool]], bool]:
    """Prints each round's table and ratios, the medians over rounds and the goals; returns the
    goals checked and whether every method generated with the same settings."""
    generations = [r.generation for by in rounds for r in by.values()]
    same_settings = all(g == generations[0] for g in generations)
    for i, by in enumerate(rounds):
        print(f"\nround {i + 1}" if len(rounds) > 1 else "")
        print(format_table(list(by.values())))
        print("samples/s ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in speedups(by).items()))
        same = {f"{x}={y}": identical_outputs(by, x, y) for x, y in (("e", "d"), ("f", "d"), ("e", "g"))}
        same = {k: v for k, v in same.items() if v is not None}
        if same:
            n = next(iter(by.values())).n
            print("identical generations: " + ", ".join(f"{k} {v}/{n}" for k, v in same.items()))
        others = {r.key: r.extra.get("other_cores_busy") for r in by.values()}
        if all(v is not None for v in others.values()):
            print("other processes kept busy (cores, mean over each run): "
                  + ", ".join(f"({k}) {v:.2f}" for k, v in others.items()))
            if max(others.values()) > MAX_OTHER_LOAD:
                print(f"NOTE: more than {MAX_OTHER_LOAD} core of other load during a run; its figures are disturbed")
    print()
    if len(rounds) > 1:
        ratios = {k: median_over(rounds, lambda by, k=k: speedups(by)[k]) for k in speedups(rounds[0])}
        rates = {k: median_over(rounds, lambda by, k=k: by[k].samples_per_second) for k in keys}
        print(f"median of {len(rounds)} rounds: samples/s " + ", ".join(f"({k}) {v:.2f}" for k, v in rates.items())
              + "; ratios " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    if not same_settings:
        print("WARNING: the methods generated with different settings: "
              + "; ".join(f"{r.name} {json.dumps(r.generation, sort_keys=True)}" for r in rounds[0].values()))
    checked = goals(rounds, micro)
    for text, ok in checked:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    return checked, same_settings


def machine() -> dict[str, Any]:
    from importlib import metadata

    versions = {p: metadata.version(p) for p in ("torch", "transformers", "sacrebleu")}
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor(), "loadavg": os.getloadavg(), **versions}


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker_main(a)
    root = Path(a.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if a.model == "opus":
        a.model = str(build_opus_size(root / "models" / "bart-opus-size"))
    a.model = str(Path(a.model).resolve()) if Path(a.model).exists() else a.model
    load_before = os.getloadavg()
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_data.py"), "--task", TASK, "--bench", str(a.n),
                    "--out", str(root / "data")], check=True, capture_output=True)
    data_dir = root / "data" / TASK
    max_tokens = a.max_tokens or default_max_tokens(a.model, data_dir, a.bs)
    print(f"{a.n} examples, {a.nproc} processes, --bs {a.bs}, --max_tokens {max_tokens}, --num_beams {a.num_beams}, "
          f"model {a.model}", flush=True)
    runners = {
        "a": lambda where: run_baseline("a", "tutorial", a, data_dir, where),
        "b": lambda where: run_baseline("b", "legacy", a, data_dir, where),
        **{k: (lambda where, k=k: run_seq2seq_eval(k, a, data_dir, where, max_tokens)) for k in S2S_METHODS},
        "g": lambda where: run_bare("g", a, data_dir, where, DEFAULT_MAX_TOKENS["ctranslate2"][a.device]),
    }
    keys = [k for k in METHODS if k in a.methods]
    rounds: list[dict[str, MethodResult]] = []
    for i in range(a.rounds):
        order = round_order(keys, i)
        where = root / f"round_{i + 1}"
        by: dict[str, MethodResult] = {}
        for key in order:
            by[key] = runners[key](where)
            print(f"  round {i + 1}/{a.rounds} {METHODS[key]}: done in {by[key].wall_seconds:.1f} s", flush=True)
        rounds.append({key: by[key] for key in keys})
    micro = None
    if a.tail_records:
        micro = micro_tail(root / "micro", a.tail_records)
        print(f"  rank 0's tail on {a.tail_records:,} synthetic records: done", flush=True)
    checked, same_settings = print_rounds(rounds, keys, micro)
    report = {
        "settings": {"n": a.n, "nproc": a.nproc, "bs": a.bs, "max_tokens": max_tokens, "num_beams": a.num_beams,
                     "rounds": a.rounds, "model": a.model, "generation": rounds[0][keys[0]].generation,
                     "same_generation_settings": same_settings},
        "machine": {**machine(), "loadavg_before": load_before},
        "rounds": [{"order": round_order(keys, i),
                    "methods": {k: r.summary() for k, r in by.items()},
                    "samples_per_second_ratios": speedups(by)} for i, by in enumerate(rounds)],
        "micro_tail": micro,
        "identical_generations": [{f"{x}={y}": identical_outputs(by, x, y) for x, y in (("e", "d"), ("f", "d"), ("e", "g"))
                                   if identical_outputs(by, x, y) is not None} for by in rounds],
        "goals": [{"goal": text, "pass": ok} for text, ok in checked],
    }
    (root / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {root / 'results.json'}")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model", default=str(REPO / "data_samples" / "model"),
                   help="model folder or hub name, or 'opus': a random BART at opus-mt-en-de's size (built once under --out)")
    p.add_argument("--n", type=int, default=2000, help="benchmark examples (make_data.py --bench N)")
    p.add_argument("--nproc", type=int, default=2, help="processes per job")
    p.add_argument("--bs", type=int, default=16, help="examples per batch for (a), (b), (c)")
    p.add_argument("--max_tokens", type=int, default=None,
                   help="padded source tokens per batch for (d) (default: --bs x mean source length)")
    p.add_argument("--num_beams", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3,
                   help="times each method runs, in turns; goals are judged on the median over rounds")
    p.add_argument("--out", default="bench_out", help="folder for data, runs, logs and results.json")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where every method generates (cuda: use --nproc 1 per GPU, or see benchmarks/gpu.py)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="model dtype for every method (seq2seq_eval's --fp16/--bf16)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="generated tokens cap for every method")
    p.add_argument("--tail_records", type=int, default=MICRO_RECORDS,
                   help="synthetic predictions for the rank-0 tail micro-benchmark (0: skip it)")
    p.add_argument("--methods", default="".join(METHODS),
                   help=f"which methods to run, as letters (default: all of {''.join(METHODS)}): " + "; ".join(METHODS.values()))
    # Worker mode, run by torchrun for (a) and (b).
    p.add_argument("--worker", choices=("tutorial", "legacy", "bare"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--data_dir", help=argparse.SUPPRESS)
    p.add_argument("--save_dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = sorted(set(a.methods) - set(METHODS))
    if unknown or not a.methods:
        p.error(f"--methods takes letters of {''.join(METHODS)}, got {a.methods!r}")
    if a.tail_records < 0:
        p.error(f"--tail_records must be >= 0, got {a.tail_records}")
    for flag in ("n", "nproc", "bs", "num_beams", "rounds"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(a, flag)}")
    if a.max_tokens is not None and a.max_tokens < 1:
        p.error(f"--max_tokens must be >= 1, got {a.max_tokens}")
    return a


if __name__ == "__main__":
    sys.exit(main())
