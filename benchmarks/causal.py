"""Decoder-only models: the tool on defaults against the loop lm-evaluation-harness runs, and
`--engine ctranslate2` against both, whole runs with start-up, in one invocation.

    python benchmarks/causal.py [--n 500] [--size base] [--max_new_tokens 32] [--threads 2]
                                [--rounds 1] [--bs 16] [--out bench_causal]
                                [--device cuda --dtype float16 [--more_loops 64]]

Builds a Llama-style model with random weights (--size base: 8 layers, hidden 768, 12 heads,
intermediate 2048, tied embeddings on the embedded demo's 3,000-token tokenizer: 59M parameters;
--size large: 24 layers, hidden 1024, 16 heads, intermediate 2816: 310M; --size small: 4 layers,
hidden 512, 8 heads, intermediate 1536: 15M, bare.py's; --size tiny: a small one for a smoke
test), its generation config saying greedy search and --max_new_tokens new tokens, and
--n prompts (the embedded translation and summarization sources, as plain prompts: the tokenizer
adds BOS; past their 708 they repeat in order). Then, per round, in turns, each as a new process timed
from its start to its exit (imports, model loading, tokenizing, generating, writing):

  (a) loop         the plain left-padded batched generate() loop of lm-evaluation-harness's
                   generate_until: prompts sorted longest first, batches of --bs (its 16),
                   tokenizer(padding_side="left"), model.generate(max_new_tokens, greedy), each
                   continuation cut by position and decoded without special tokens;
  (b) tool         python -m seq2seq_eval --model_name M --input_path P (defaults: the HF engine,
                   its default batch budget, one process);
  (c) tool ct2     the same with --engine ctranslate2 (float32; converted once before the rounds,
                   the conversion's time reported apart, as a later run finds it cached);
  (d) tool ct2 int8  the same with --compute_type int8: CTranslate2's own arithmetic, so not the
                   same outputs (their agreement is printed); no goal, a figure for the reader;
  (e) bare ct2     CTranslate2 alone, what (c) could at best be: the converted model of (c), every
                   prompt in one generate_batch call (float32, --threads workers of one thread,
                   its own length-sorted parts of --bare_part prompts), nothing of the tool around
                   it; no goal.

On a GPU (--device cuda) every contender runs there in --dtype: the loop's model in that dtype,
the tool with --fp16/--bf16 (HF engine) and --compute_type float16 (CTranslate2; (d) takes
int8_float16), (e) with one worker on the GPU. --more_loops adds loops of other batch sizes
("loop bs N"), reported against the same baseline (a), since on a GPU the batch size decides.

Every process gets OMP_NUM_THREADS=--threads (torch's threads, CTranslate2's intra_threads). The
outputs are compared line by line (the number of identical continuations). Prints the seconds,
the ratios within each round and their medians against the goals (tool >= 1.2x the loop,
CTranslate2 >= 2x the loop), and writes {out}/results.json. Random weights rarely end a
continuation early: every prompt generates about --max_new_tokens tokens, on every contender.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_samples" / "causal_model"
SIZES = {
    "base": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 12, "intermediate_size": 2048},
    "small": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 1536},
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64},
    "large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 2816},
}
GOALS = {"tool": 1.2, "tool ct2": 2.0}


def make_model(folder: Path, size: str, max_new_tokens: int) -> int:
    """The model and its tokenizer in `folder`; returns its number of parameters."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, folder / name)
    tok = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=True,
                         num_key_value_heads=SIZES[size]["num_attention_heads"], **SIZES[size])
    model = LlamaForCausalLM(config).eval()
    model.generation_config.max_new_tokens = max_new_tokens
    model.generation_config.max_length = None
    model.generation_config.do_sample, model.generation_config.num_beams = False, 1
    model.save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


def prompts(n: int) -> list[str]:
    lines: list[str] = []
    for task in ("translation", "summarization"):
        lines += (ROOT / "data_samples" / task / "test.source").read_text(encoding="utf-8").splitlines()
    return [lines[i % len(lines)] for i in range(n)]


def loop(model_dir: str, prompt_file: str, out_file: str, bs: int, max_new_tokens: int, device: str = "cpu",
         dtype: str = "float32") -> None:
    """(a): lm-evaluation-harness's generate_until, reduced to what decides its speed and outputs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token  # as lm-evaluation-harness does
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    texts = Path(prompt_file).read_text(encoding="utf-8").splitlines()
    lengths = [len(ids) for ids in tok(texts)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])  # longest first, as its Collator
    out = [""] * len(texts)
    for start in range(0, len(order), bs):
        members = order[start:start + bs]
        batch = tok([texts[i] for i in members], return_tensors="pt", padding="longest").to(device)
        with torch.inference_mode():
            generated = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                       pad_token_id=tok.pad_token_id)
        for i, row in zip(members, generated[:, batch["input_ids"].shape[1]:].tolist()):
            out[i] = tok.decode(row, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()
    # One line per example, as the tool writes its generations (a newline inside becomes a space).
    Path(out_file).write_text("".join(" ".join(line.splitlines()) + "\n" for line in out), encoding="utf-8")


def bare(ct2_dir: str, model_dir: str, prompt_file: str, out_file: str, part: int, max_new_tokens: int,
         device: str = "cpu", compute_type: str = "float32") -> None:
    """(e): the tokens of the prompts the tool's tokenizer gives, one generate_batch call."""
    import ctranslate2
    from transformers import AutoTokenizer

    threads = int(os.environ["OMP_NUM_THREADS"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    if device == "cpu":
        generator = ctranslate2.Generator(ct2_dir, device="cpu", compute_type=compute_type, inter_threads=threads,
                                          intra_threads=1)
    else:  # one worker holds the GPU
        generator = ctranslate2.Generator(ct2_dir, device=device, compute_type=compute_type)
    texts = Path(prompt_file).read_text(encoding="utf-8").splitlines()
    prompts = [tok.convert_ids_to_tokens(ids) for ids in tok(texts)["input_ids"]]
    results = generator.generate_batch(prompts, max_batch_size=part, max_length=max_new_tokens,
                                       include_prompt_in_result=False, end_token=tok.eos_token)
    out = [tok.decode(r.sequences_ids[0], skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()
           for r in results]
    Path(out_file).write_text("".join(" ".join(line.splitlines()) + "\n" for line in out), encoding="utf-8")


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def converted_folder(cache: Path) -> str:
    """The one conversion in the tool's cache (made before the rounds)."""
    found = sorted({str(f.parent) for f in cache.rglob("model.bin")})
    if len(found) != 1:
        raise SystemExit(f"{cache}: expected one converted model, found {len(found)}")
    return found[0]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--size", choices=sorted(SIZES), default="base")
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--bs", type=int, default=16, help="the loop's batch size (lm-evaluation-harness's 16)")
    p.add_argument("--out", default="bench_causal")
    p.add_argument("--contenders", default="loop,tool,tool ct2,tool ct2 int8,bare ct2",
                   help="which of (a)-(e) to run, comma-separated (the loop always runs: it is the baseline)")
    p.add_argument("--bare_part", type=int, default=64, help="(e)'s max_batch_size")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="the loop's and the tool's dtype; CTranslate2's compute type (bfloat16 -> bfloat16)")
    p.add_argument("--more_loops", default="", help="other loop batch sizes, comma-separated (contenders 'loop bs N')")
    p.add_argument("--_loop", nargs=7, help=argparse.SUPPRESS)
    p.add_argument("--_bare", nargs=8, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._loop:
        model_dir, prompt_file, out_file, bs, new, device, dtype = args._loop
        loop(model_dir, prompt_file, out_file, int(bs), int(new), device, dtype)
        return 0
    if args._bare:
        ct2_dir, model_dir, prompt_file, out_file, part, new, device, compute_type = args._bare
        bare(ct2_dir, model_dir, prompt_file, out_file, int(part), int(new), device, compute_type)
        return 0

    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model_dir, prompt_file, cache = out / "model", out / "prompts.txt", out / "ct2_cache"
    parameters = make_model(model_dir, args.size, args.max_new_tokens)
    prompt_file.write_text("".join(line + "\n" for line in prompts(args.n)), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "SEQ2SEQ_EVAL_CACHE": str(cache),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           # the checkout first, then what the caller put there (a GPU machine's private wheels)
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    tool = [sys.executable, "-m", "seq2seq_eval", "--model_name", str(model_dir), "--input_path", str(prompt_file),
            "--device", args.device]
    half = {"float16": ["--fp16"], "bfloat16": ["--bf16"]}.get(args.dtype, [])
    ct2_type = args.dtype
    ct2_int8 = "int8" if args.device == "cpu" else f"int8_{'float16' if args.dtype == 'float32' else args.dtype}"
    me = [sys.executable, str(Path(__file__).resolve())]
    wanted = {"loop", *(name.strip() for name in args.contenders.split(",")),
              *(f"loop bs {b.strip()}" for b in args.more_loops.split(",") if b.strip())}
    try:
        import ctranslate2  # noqa: F401
        with_ct2 = bool(wanted & {"tool ct2", "tool ct2 int8", "bare ct2"})
    except ImportError:
        with_ct2 = False
        print("ctranslate2 is not installed: (c) and (d) are left out")
    conversion = None
    if with_ct2:  # converted once, as a later run finds it cached
        conversion = timed([*tool, "--engine", "ctranslate2", "--compute_type", ct2_type, "--n_obs", "1",
                            "--save_dir", str(out / "convert")], env)
    more = [int(b) for b in args.more_loops.split(",") if b.strip()]
    commands = {
        "loop": [*me, "--_loop", str(model_dir), str(prompt_file), str(out / "loop.txt"), str(args.bs),
                 str(args.max_new_tokens), args.device, args.dtype],
        **{f"loop bs {b}": [*me, "--_loop", str(model_dir), str(prompt_file), str(out / f"loop_bs{b}.txt"), str(b),
                            str(args.max_new_tokens), args.device, args.dtype] for b in more},
        "tool": [*tool, *half, "--save_dir", str(out / "tool")],
        **({"tool ct2": [*tool, "--engine", "ctranslate2", "--compute_type", ct2_type, "--save_dir", str(out / "tool_ct2")],
            "tool ct2 int8": [*tool, "--engine", "ctranslate2", "--compute_type", ct2_int8,
                              "--save_dir", str(out / "tool_ct2_int8")],
            "bare ct2": [*me, "--_bare", converted_folder(cache), str(model_dir), str(prompt_file),
                         str(out / "bare_ct2.txt"), str(args.bare_part), str(args.max_new_tokens), args.device,
                         ct2_type]} if with_ct2 else {}),
    }
    commands = {name: cmd for name, cmd in commands.items() if name in wanted}
    outputs = {"loop": out / "loop.txt", "tool": out / "tool" / "test_generations.txt",
               "tool ct2": out / "tool_ct2" / "test_generations.txt",
               "tool ct2 int8": out / "tool_ct2_int8" / "test_generations.txt", "bare ct2": out / "bare_ct2.txt",
               **{f"loop bs {b}": out / f"loop_bs{b}.txt" for b in more}}
    rounds = []
    for r in range(args.rounds):
        seconds = {}
        for name, cmd in commands.items():
            if outputs[name].parent != out and outputs[name].parent.exists():
                shutil.rmtree(outputs[name].parent)  # the tool's save folder, from the round before
            seconds[name] = timed(cmd, env)
        rounds.append(seconds)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    texts = {name: lines_of(outputs[name]) for name in commands}
    same = {f"{a} = {b}": sum(x == y for x, y in zip(texts[a], texts[b]))
            for a, b in (("tool", "loop"), ("tool ct2", "loop"), ("tool ct2", "tool"), ("tool ct2 int8", "tool"),
                         ("bare ct2", "loop"), *((f"loop bs {b}", "loop") for b in more))
            if a in texts and b in texts}
    ratios = {name: statistics.median(rd["loop"] / rd[name] for rd in rounds) for name in commands if name != "loop"}
    if "tool ct2" in ratios:
        ratios["tool ct2 / tool"] = statistics.median(rd["tool"] / rd["tool ct2"] for rd in rounds)
    print(f"\n{parameters / 1e6:.1f}M parameters, {args.n} prompts, {args.max_new_tokens} new tokens, greedy, "
          f"{args.threads} thread(s), {platform.processor() or platform.machine()}, {args.device} {args.dtype}"
          + (f" ({gpu_name()})" if args.device == "cuda" else ""))
    if conversion is not None:
        print(f"CTranslate2 conversion (once, cached): {conversion:.1f} s (a whole run of one example)")
    print(f"{'':18}{'seconds (median)':>18}{'x the loop':>12}{'goal':>8}")
    for name in commands:
        median = statistics.median(rd[name] for rd in rounds)
        ratio = "" if name == "loop" else f"{ratios[name]:.2f}"
        goal = f">= {GOALS[name]}" if name in GOALS else ""
        met = "" if name not in GOALS else (" met" if ratios[name] >= GOALS[name] else " MISSED")
        print(f"{name:18}{median:>18.1f}{ratio:>12}{goal:>8}{met}")
    if "tool ct2 / tool" in ratios:
        print(f"CTranslate2 against the tool's HF engine: {ratios['tool ct2 / tool']:.2f}x")
    print("identical outputs: " + ", ".join(f"{k}: {v} of {args.n}" for k, v in same.items()))
    results = {"n": args.n, "size": args.size, "parameters": parameters, "max_new_tokens": args.max_new_tokens,
               "threads": args.threads, "loop_bs": args.bs, "device": args.device, "dtype": args.dtype, "rounds": rounds, "median_ratios": ratios,
               "identical": same, "conversion_seconds": conversion, "goals": GOALS,
               "python": platform.python_version(), "machine": platform.machine()}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
