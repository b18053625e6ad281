"""The tool against the bare libraries it drives: whole runs, fresh processes, start-up included,
on the same machine, in one invocation.

    python benchmarks/bare.py [--rounds 3] [--n 240] [--n_imbalance 360] [--procs 1,2]
                              [--only translate,generate,hf,imbalance,startup] [--out bench_bare]

Jobs (each a pair, the tool and the bare loop, run in turns; --procs gives the process counts of
the first two):

  translate  `python -m seq2seq_eval --engine ctranslate2` against the bare CTranslate2 Translator
             loop as its documentation writes it: `ctranslate2.Translator(path, device="cpu",
             inter_threads=1, intra_threads=1)`, the transformers tokenizer, process k of P takes
             sources[k::P], one `translate_batch(tokens, beam_size, max_decoding_length,
             max_batch_size=64)` (the library's own sorting and batching), decode, write. On an
             opus-mt-en-de-size BART with random weights (throughput.py's build_opus_size).
  generate   the same with the Generator (`generate_batch`, `include_prompt_in_result=False`) on
             a Llama-style model with random weights (causal.py's, --llama_size small: 4 layers, hidden
             512, 15M parameters, where the model's work is most of a run's time) and its prompts.
  hf         the tool's HF engine against a plain `model.generate()` loop over the same batches
             (the members the tool ran, read from its journal), one process, on the opus-size BART.
  imbalance  the tool alone on the embedded model, --n_imbalance examples, 2 ranks, on each engine:
             its rank_imbalance.
  startup    8 examples of the embedded model: `python -m seq2seq_eval` with the quickstart's model
             and data on defaults against a plain from_pretrained + generate + sacrebleu script;
             the CPU seconds of each whole process.

Every job: --n examples (the first N of `scripts/make_data.py --bench`), --num_beams 4,
--max_new_tokens 64, early stopping, float32, OMP_NUM_THREADS=1 in every process (P processes of
one thread on P cores); 2 tool ranks go through torchrun, 2 bare processes are started side by
side and the wall time runs until the last exits. The CTranslate2 conversion is made once
beforehand by a one-example run of the tool, into a cache of this benchmark's, and both sides use
it. Prints per round and the medians: seconds of each side, the ratio bare/tool (goals: >= 0.9 on
CTranslate2, >= 0.95 on the HF engine), the tool's rank_imbalance (<= 1.10), the outputs the two
sides have in common, the start-up job's CPU seconds (the tool within 0.5 of the plain script);
writes {out}/results.json.
"""

from __future__ import annotations

# Only the standard library here: the bare workers are this file too, and what they import is
# what their start-up costs.
import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CT2_GOAL, HF_GOAL = 0.9, 0.95
MAX_RANK_IMBALANCE = 1.10
STARTUP_CPU_MARGIN = 0.5
BARE_BATCH = 64  # max_batch_size, as CTranslate2's documentation examples set it
STARTUP_N = 8


def write_lines(path: Path, texts: Sequence[str]) -> None:
    # One line per example, as the tool writes its generations (a newline inside becomes a space).
    path.write_text("".join(" ".join(t.splitlines()) + "\n" for t in texts), encoding="utf-8")


# ============================================================================ the bare workers


def bare_translate(w: dict[str, Any]) -> None:
    """The Translator loop of CTranslate2's documentation (guides/transformers), on process k's
    strided share of the sources."""
    import ctranslate2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(w["model"])
    translator = ctranslate2.Translator(w["ct2"], device="cpu", compute_type="float32", inter_threads=1,
                                        intra_threads=1)
    sources = Path(w["sources"]).read_text(encoding="utf-8").splitlines()[:w["n"]][w["k"]::w["procs"]]
    tokens = [tok.convert_ids_to_tokens(tok.encode(w["prefix"] + s)) for s in sources]
    results = translator.translate_batch(tokens, beam_size=w["beams"], max_decoding_length=w["max_decoding_length"],
                                         max_batch_size=BARE_BATCH)
    write_lines(Path(w["out"]), [tok.decode(tok.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False).strip() for r in results])


def bare_generate(w: dict[str, Any]) -> None:
    """The Generator loop of CTranslate2's documentation, on process k's strided share of the prompts."""
    import ctranslate2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(w["model"])
    generator = ctranslate2.Generator(w["ct2"], device="cpu", compute_type="float32", inter_threads=1, intra_threads=1)
    prompts = Path(w["sources"]).read_text(encoding="utf-8").splitlines()[:w["n"]][w["k"]::w["procs"]]
    tokens = [tok.convert_ids_to_tokens(tok.encode(p)) for p in prompts]
    results = generator.generate_batch(tokens, beam_size=w["beams"], max_length=w["max_decoding_length"],
                                       include_prompt_in_result=False, max_batch_size=BARE_BATCH)
    write_lines(Path(w["out"]), [tok.decode(r.sequences_ids[0], skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False).strip() for r in results])


def hf_loop(w: dict[str, Any]) -> None:
    """A plain generate() loop over the given batches (lists of example indices), in their order."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(w["model"])
    model = AutoModelForSeq2SeqLM.from_pretrained(w["model"]).eval()
    sources = Path(w["sources"]).read_text(encoding="utf-8").splitlines()
    batches = json.loads(Path(w["batches"]).read_text())
    out = [""] * sum(len(b) for b in batches)
    for members in batches:
        batch = tok([w["prefix"] + sources[i] for i in members], return_tensors="pt", padding=True)
        with torch.inference_mode():
            ids = model.generate(**batch, num_beams=w["beams"], max_new_tokens=w["max_new_tokens"], early_stopping=True)
        for i, text in zip(members, tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)):
            out[i] = text.strip()
    write_lines(Path(w["out"]), out)


def plain_script(w: dict[str, Any]) -> None:
    """What a user writes for the tool's 8-example quickstart run: load, generate with the model's
    translation settings, decode, score with sacrebleu, write."""
    import sacrebleu
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(w["model"])
    model = AutoModelForSeq2SeqLM.from_pretrained(w["model"]).eval()
    settings = dict(model.config.task_specific_params["translation"])
    prefix = settings.pop("prefix", "")
    data = Path(w["data"])
    sources = (data / "test.source").read_text(encoding="utf-8").splitlines()[:w["n"]]
    targets = (data / "test.target").read_text(encoding="utf-8").splitlines()[:w["n"]]
    batch = tok([prefix + s for s in sources], return_tensors="pt", padding=True)
    with torch.inference_mode():
        ids = model.generate(**batch, **settings)
    preds = [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)]
    write_lines(Path(w["out"]), preds)
    Path(w["out"]).with_suffix(".json").write_text(json.dumps({"bleu": sacrebleu.corpus_bleu(preds, [targets]).score}))


WORKERS = {"translate": bare_translate, "generate": bare_generate, "hf": hf_loop, "startup": plain_script}


# ============================================================================ the driver


def tool_command(procs: int, flags: list[str]) -> list[str]:
    """The tool as a user starts it: one process without a launcher, several through torchrun."""
    if procs == 1:
        return [sys.executable, "-m", "seq2seq_eval", *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", "-m",
            "seq2seq_eval", *flags]


def worker_command(kind: str, spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--_worker", kind, json.dumps(spec)]


def run_processes(cmds: Sequence[list[str]], env: dict[str, str], log: Path) -> dict[str, float]:
    """Starts `cmds` side by side and waits for all: wall seconds until the last exits, the CPU
    seconds (user + system) of all of them and their children, and the cores other processes kept
    busy meanwhile."""
    from throughput import busy_cpu_seconds, children_cpu_seconds

    log.parent.mkdir(parents=True, exist_ok=True)
    busy0, cpu0 = busy_cpu_seconds(), children_cpu_seconds()
    t0 = time.perf_counter()
    with open(log, "w") as f:
        procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT) for cmd in cmds]
        codes = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    busy1, cpu1 = busy_cpu_seconds(), children_cpu_seconds()
    if any(codes):
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise SystemExit(f"bare.py: {' '.join(cmds[0][:6])} ... failed (exit codes {codes}); log {log}:\n{tail}")
    other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / wall
    return {"wall_seconds": wall, "cpu_seconds": cpu1 - cpu0, "other_cores_busy": other}


def metric_file(save: Path) -> dict[str, Any]:
    """The tool's metric file (test_bleu.json, or the one a run without references writes)."""
    for path in sorted(save.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "throughput" in data:
            return data
    raise SystemExit(f"bare.py: no metric file with throughput figures in {save}")


def journal_batches(tmp_dir: Path) -> list[list[int]]:
    """The example ids of each batch the tool ran, in the order it ran them, from its journals
    (kept with --debug): lines of finished batches ({"batch": i, "records": [{"id": ...}, ...]})."""
    batches = []
    for journal in sorted(tmp_dir.glob("journal_rank_*.jsonl")):
        for line in journal.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if "split" in entry:  # ran out of memory: the members ran in parts (run/oom.py); not on this CPU
                raise SystemExit(f"bare.py: {journal}: batch {entry['batch']} was split; expected whole batches")
            if isinstance(entry.get("records"), list) and "part" not in entry:
                batches.append([int(r["id"]) for r in entry["records"]])
    if not batches:
        raise SystemExit(f"bare.py: no finished batch in the journals of {tmp_dir}")
    return batches


def merge_strided(parts: Sequence[Sequence[str]]) -> list[str]:
    """Process k's lines are examples k, k+P, k+2P, ...: back in data order."""
    out = [""] * sum(len(p) for p in parts)
    for k, part in enumerate(parts):
        out[k::len(parts)] = part
    return out


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


class Bench:
    """The models, data and commands of every job, made once before the rounds."""

    def __init__(self, a: argparse.Namespace) -> None:
        import causal
        from throughput import build_opus_size, child_env

        self.a = a
        self.root = root = Path(a.out).resolve()
        root.mkdir(parents=True, exist_ok=True)
        self.embedded = REPO / "data_samples" / "model"
        # Each model is built once (a later invocation with the same --out finds it), and only
        # where a job asked for needs it.
        self.opus = root / "bart-opus-size"
        if a.small:
            self.opus = self.embedded
        elif {"translate", "hf"} & set(a.only):
            build_opus_size(self.opus)
        size = "tiny" if a.small else a.llama_size
        self.llama = root / f"llama-{size}"
        if "generate" in a.only and not (self.llama / "model.safetensors").exists():
            causal.make_model(self.llama, size, a.max_new_tokens)
        need = max(a.n, a.n_imbalance)
        self.data = root / "data" / "translation"
        if len(read_lines(self.data / "test.source") if (self.data / "test.source").exists() else []) < need:
            subprocess.run([sys.executable, str(REPO / "scripts" / "make_data.py"), "--task", "translation", "--bench",
                            str(need), "--out", str(root / "data")], check=True, capture_output=True, timeout=300)
        self.prompts = root / "prompts.txt"
        write_lines(self.prompts, causal.prompts(a.n))
        self.env = child_env()
        self.prefix = self._prefix(self.opus) if (self.opus / "config.json").exists() else ""

    @staticmethod
    def _prefix(model: Path) -> str:
        config = json.loads((model / "config.json").read_text())
        return ((config.get("task_specific_params") or {}).get("translation") or {}).get("prefix", "")

    def settings(self) -> list[str]:
        return ["--num_beams", str(self.a.num_beams), "--max_new_tokens", str(self.a.max_new_tokens),
                "--early_stopping", "true"]

    def flags(self, job: str, engine: str, save: Path, n: int | None = None, model: Path | None = None) -> list[str]:
        common = [*self.settings(), "--engine", engine, "--save_dir", str(save)]
        if engine == "ctranslate2":
            common += ["--compute_type", "float32"]
        if job == "generate":
            return ["--model_name", str(self.llama), "--input_path", str(self.prompts), *common]
        return ["--model_name", str(model or self.opus), "--data_dir", str(self.data), "--task", "translation",
                "--n_obs", str(n or self.a.n), *common]

    def env_for(self, job: str) -> dict[str, str]:
        """The processes' environment: one thread each, and a CTranslate2 cache of the job's own, so
        that it holds one conversion, the one both sides use."""
        return {**self.env, "SEQ2SEQ_EVAL_CACHE": str(self.root / "ct2_cache" / job.split()[0])}

    def converted(self, job: str) -> str:
        """The folder the tool converted `job`'s model into: a one-example run makes it (once: a
        later invocation finds it cached), as the tool's runs then find it."""
        from causal import converted_folder

        save = self.root / "convert" / job
        fresh_dirs(save)
        flags = self.flags(job, "ctranslate2", save, n=1, model=self.embedded if job.startswith("imbalance") else None)
        if job == "generate":
            one = self.root / "one_prompt.txt"
            write_lines(one, read_lines(self.prompts)[:1])
            flags[flags.index("--input_path") + 1] = str(one)
        run_processes([tool_command(1, flags)], self.env_for(job), self.root / "logs" / f"convert_{job}.log")
        return converted_folder(Path(self.env_for(job)["SEQ2SEQ_EVAL_CACHE"]))


def fresh_dirs(save: Path) -> None:
    """A run's save folder and its temp dir, removed (the tool refuses a temp dir of old files)."""
    from throughput import fresh

    fresh(save)
    fresh(Path(f"{save}_tmp"))


def side_outputs(save: Path, procs: int) -> list[Path]:
    return [save / f"part_{k}.txt" for k in range(procs)]


def run_pair(bench: Bench, job: str, procs: int, order: Sequence[str], ct2: dict[str, str],
             state: dict[str, Any], r: int) -> dict[str, Any]:
    """One round of one job: the tool and the bare side in `order`."""
    a, root = bench.a, bench.root / f"round_{r + 1}" / f"{job}_{procs}"
    result: dict[str, Any] = {"job": job, "procs": procs, "order": list(order)}
    texts: dict[str, list[str]] = {}
    for side in order:
        save = root / side
        fresh_dirs(save)
        save.mkdir(parents=True)
        log = root / f"{side}.log"
        if side == "tool":
            engine = "hf" if job == "hf" else "ctranslate2"
            flags = bench.flags(job, engine, save)
            if job == "hf":  # the journals say which examples each batch held; --debug keeps them
                flags += ["--debug"]
            figures = run_processes([tool_command(procs, flags)], bench.env_for(job), log)
            metrics = metric_file(save)
            tp = metrics["throughput"]
            figures.update(rank_imbalance=tp.get("rank_imbalance"), time_breakdown=tp.get("time_breakdown"),
                           examples_per_rank=[x.get("examples") for x in tp.get("per_rank", [])])
            texts[side] = read_lines(save / "test_generations.txt")
            if job == "hf":
                state["hf_batches"] = journal_batches(Path(f"{save}_tmp"))
        else:
            sources = bench.prompts if job == "generate" else bench.data / "test.source"
            spec = {"model": str(bench.llama if job == "generate" else bench.opus), "sources": str(sources),
                    "n": a.n, "prefix": "" if job == "generate" else bench.prefix, "beams": a.num_beams}
            if job == "hf":
                batches = save / "batches.json"
                batches.write_text(json.dumps(state["hf_batches"]))
                spec.update(batches=str(batches), max_new_tokens=a.max_new_tokens, out=str(save / "part_0.txt"))
                cmds = [worker_command("hf", spec)]
            else:
                spec.update(ct2=ct2[job], procs=procs, max_decoding_length=state[f"limit_{job}"])
                cmds = [worker_command(job, {**spec, "k": k, "out": str(path)})
                        for k, path in enumerate(side_outputs(save, procs))]
            figures = run_processes(cmds, bench.env_for(job), log)
            texts[side] = merge_strided([read_lines(p) for p in side_outputs(save, len(cmds))])
        result[side] = figures
    result["ratio"] = result["bare"]["wall_seconds"] / result["tool"]["wall_seconds"]
    result["identical"] = sum(x == y for x, y in zip(texts["tool"], texts["bare"]))
    result["n"] = len(texts["tool"])
    if len(texts["bare"]) != len(texts["tool"]):
        raise SystemExit(f"bare.py: {job} at {procs}: the tool wrote {len(texts['tool'])} outputs, the bare side "
                         f"{len(texts['bare'])}")
    return result


def run_startup(bench: Bench, order: Sequence[str], r: int) -> dict[str, Any]:
    root = bench.root / f"round_{r + 1}" / "startup"
    result: dict[str, Any] = {"job": "startup", "procs": 1, "order": list(order)}
    texts = {}
    for side in order:
        save = root / side
        fresh_dirs(save)
        save.mkdir(parents=True)
        if side == "tool":
            flags = ["--model_name", str(bench.embedded), "--data_dir", str(REPO / "data_samples" / "translation"),
                     "--n_obs", str(STARTUP_N), "--save_dir", str(save)]
            result[side] = run_processes([tool_command(1, flags)], bench.env, root / "tool.log")
            texts[side] = read_lines(save / "test_generations.txt")
        else:
            spec = {"model": str(bench.embedded), "data": str(REPO / "data_samples" / "translation"), "n": STARTUP_N,
                    "out": str(save / "part_0.txt")}
            result[side] = run_processes([worker_command("startup", spec)], bench.env, root / "bare.log")
            texts[side] = read_lines(save / "part_0.txt")
    result["ratio"] = result["bare"]["wall_seconds"] / result["tool"]["wall_seconds"]
    result["cpu_difference"] = result["tool"]["cpu_seconds"] - result["bare"]["cpu_seconds"]
    result["identical"] = sum(x == y for x, y in zip(texts["tool"], texts["bare"]))
    result["n"] = len(texts["tool"])
    return result


def run_imbalance(bench: Bench, engine: str, r: int) -> dict[str, Any]:
    save = bench.root / f"round_{r + 1}" / f"imbalance_{engine}" / "tool"
    fresh_dirs(save)
    flags = bench.flags("imbalance", engine, save, n=bench.a.n_imbalance, model=bench.embedded)
    figures = run_processes([tool_command(2, flags)], bench.env_for(f"imbalance_{engine}"), save.parent / "tool.log")
    tp = metric_file(save)["throughput"]
    figures.update(rank_imbalance=tp.get("rank_imbalance"), examples_per_rank=[x.get("examples") for x in tp["per_rank"]])
    return {"job": f"imbalance {engine}", "procs": 2, "tool": figures, "n": bench.a.n_imbalance}


def job_list(a: argparse.Namespace, with_ct2: bool) -> list[tuple[str, int]]:
    jobs: list[tuple[str, int]] = []
    for job in a.only:
        if job in ("translate", "generate"):
            jobs += [(job, p) for p in a.procs] if with_ct2 else []
        elif job == "hf":
            jobs.append(("hf", 1))
        elif job == "imbalance":
            jobs += [("imbalance hf", 2)] + ([("imbalance ctranslate2", 2)] if with_ct2 else [])
        else:
            jobs.append(("startup", 1))
    return jobs


def key(job: str, procs: int) -> str:
    return f"{job} {procs}"


def median(rounds: Sequence[dict[str, Any]], k: str, get: Any) -> float | None:
    values = [get(r[k]) for r in rounds if k in r and get(r[k]) is not None]
    return statistics.median(values) if values else None


def report(rounds: Sequence[dict[str, Any]], jobs: Sequence[tuple[str, int]], models: str) -> list[tuple[str, bool]]:
    """The table of medians over rounds and one PASS/MISS line per goal."""
    f = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    print(f"\nmedian of {len(rounds)} round(s); ratio: the bare side's wall seconds over the tool's; " + models)
    print(f"{'job':22}{'procs':>6}{'tool s':>9}{'bare s':>9}{'ratio':>8}{'tool cpu s':>12}{'bare cpu s':>12}"
          f"{'imbalance':>11}{'identical':>11}")
    goals: list[tuple[str, bool]] = []
    for job, procs in jobs:
        k = key(job, procs)
        tool = median(rounds, k, lambda x: x["tool"]["wall_seconds"])
        bare = median(rounds, k, lambda x: x["bare"]["wall_seconds"] if "bare" in x else None)
        ratio = median(rounds, k, lambda x: x.get("ratio"))
        tcpu = median(rounds, k, lambda x: x["tool"]["cpu_seconds"])
        bcpu = median(rounds, k, lambda x: x["bare"]["cpu_seconds"] if "bare" in x else None)
        imb = median(rounds, k, lambda x: x["tool"].get("rank_imbalance") if x["procs"] > 1 else None)
        last = rounds[-1][k]
        same = f"{last['identical']}/{last['n']}" if "identical" in last else ""
        name = LABELS.get(job, job)
        print(f"{name:22}{procs:>6}{f(tool, '.1f'):>9}{f(bare, '.1f'):>9}{f(ratio, '.3f'):>8}{f(tcpu, '.2f'):>12}"
              f"{f(bcpu, '.2f'):>12}{f(imb, '.3f'):>11}{same:>11}")
        if job in ("translate", "generate", "hf"):
            goal = HF_GOAL if job == "hf" else CT2_GOAL
            goals.append((f"{name} at {procs} process(es): bare/tool >= {goal}: {ratio:.3f}", ratio >= goal))
        if imb is not None:
            goals.append((f"{name} at {procs} processes: rank_imbalance <= {MAX_RANK_IMBALANCE}: {imb:.3f}",
                          imb <= MAX_RANK_IMBALANCE))
        if job == "startup":
            diff = median(rounds, k, lambda x: x["cpu_difference"])
            goals.append((f"{name}: the tool's CPU seconds within {STARTUP_CPU_MARGIN} of the plain script's: "
                          f"{tcpu:.2f} - {bcpu:.2f} = {diff:+.2f}", diff <= STARTUP_CPU_MARGIN))
    for text, ok in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    return goals


def write_results(root: Path, a: argparse.Namespace, rounds: Sequence[dict[str, Any]],
                  goals: Sequence[tuple[str, bool]] | None) -> None:
    from throughput import machine

    out = {"machine": machine(), "args": {k: v for k, v in vars(a).items() if not k.startswith("_")},
           "bare_batch": BARE_BATCH, "rounds": list(rounds),
           "goals": None if goals is None else [{"goal": t, "pass": ok} for t, ok in goals]}
    (root / "results.json").write_text(json.dumps(out, indent=1))


JOBS = ("translate", "generate", "hf", "imbalance", "startup")
LABELS = {"translate": "ct2 Translator", "generate": "ct2 Generator", "hf": "HF generate()",
          "imbalance hf": "imbalance, HF", "imbalance ctranslate2": "imbalance, ct2", "startup": f"start-up, {STARTUP_N} ex."}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=240, help="examples (prompts) of the translate, generate and hf jobs")
    p.add_argument("--n_imbalance", type=int, default=360, help="examples of the imbalance job")
    p.add_argument("--procs", default="1,2", help="process counts of the translate and generate jobs")
    p.add_argument("--only", default=",".join(JOBS), help=f"which jobs run, comma-separated: some of {', '.join(JOBS)}")
    p.add_argument("--num_beams", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--llama_size", choices=("small", "base", "large"), default="small",
                   help="causal.py's Llama-style model of the generate job (small: 15M parameters, 4 beams of 64 new "
                        "tokens for 240 prompts take minutes at one thread; base: 59M)")
    p.add_argument("--small", action="store_true",
                   help="the embedded model in place of the opus-size BART and causal.py's tiny model: checks the script")
    p.add_argument("--out", default="bench_bare")
    p.add_argument("--_worker", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._worker:
        return a
    a.only = [j.strip() for j in a.only.split(",") if j.strip()]
    unknown = sorted(set(a.only) - set(JOBS))
    if unknown:
        p.error(f"--only: {', '.join(unknown)}: no such job; expected some of {', '.join(JOBS)}")
    try:
        a.procs = sorted({int(x) for x in a.procs.split(",") if x.strip()})
    except ValueError:
        p.error(f"--procs: expected process counts such as 1,2, got {a.procs!r}")
    if not a.procs or min(a.procs) < 1:
        p.error(f"--procs: expected process counts >= 1, got {a.procs}")
    if a.rounds < 1 or a.n < 1 or a.n_imbalance < 1:
        p.error("--rounds, --n and --n_imbalance must be >= 1")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a._worker:
        WORKERS[a._worker[0]](json.loads(a._worker[1]))
        return 0
    sys.path.insert(0, str(REPO / "benchmarks"))
    from throughput import round_order

    try:
        import ctranslate2  # noqa: F401
        with_ct2 = True
    except ImportError:
        with_ct2 = False
        print("ctranslate2 is not installed: the translate, generate and imbalance ctranslate2 jobs are left out")
    bench = Bench(a)
    jobs = job_list(a, with_ct2)
    ct2: dict[str, str] = {}
    state: dict[str, Any] = {}
    if ("imbalance ctranslate2", 2) in jobs:
        bench.converted("imbalance_ctranslate2")  # not timed: the conversion is made once
    for job in ("translate", "generate"):
        if any(j == job for j, _ in jobs):
            ct2[job] = bench.converted(job)
            # generate() counts a forced end token (forced_eos_token_id, here the end token) in
            # max_new_tokens, and forces it at the last step; CTranslate2 knows no forced end: its
            # search stops one step before, and the end it would add is not text.
            config = json.loads(((bench.llama if job == "generate" else bench.opus) / "generation_config.json").read_text())
            forced = config.get("forced_eos_token_id") is not None and a.num_beams > 1
            state[f"limit_{job}"] = a.max_new_tokens - 1 if forced else a.max_new_tokens
    rounds: list[dict[str, Any]] = []
    for r in range(a.rounds):
        sides = round_order(["tool", "bare"], r)
        if r == 0 or "hf_batches" not in state:
            sides_hf = ["tool", "bare"]  # the loop needs the batches of a tool run
        else:
            sides_hf = sides
        results: dict[str, Any] = {}
        for job, procs in round_order(jobs, r):
            if job == "startup":
                res = run_startup(bench, sides, r)
            elif job.startswith("imbalance"):
                res = run_imbalance(bench, job.split()[1], r)
            else:
                res = run_pair(bench, job, procs, sides_hf if job == "hf" else sides, ct2, state, r)
            results[key(job, procs)] = res
            bare = f", bare {res['bare']['wall_seconds']:.1f} s (cpu {res['bare']['cpu_seconds']:.1f})" if "bare" in res else ""
            imb = f", rank_imbalance {res['tool']['rank_imbalance']:.3f}" if procs > 1 else ""
            same = f", identical {res['identical']}/{res['n']}" if "identical" in res else ""
            load = res["tool"]["other_cores_busy"]
            print(f"round {r + 1} {job} x{procs}: tool {res['tool']['wall_seconds']:.1f} s "
                  f"(cpu {res['tool']['cpu_seconds']:.1f}){bare}{imb}{same}"
                  + ("" if load is None else f"; other load {load:.2f} cores"), flush=True)
        rounds.append(results)
        # After every round, so that a run stopped early keeps the rounds it finished.
        write_results(bench.root, a, rounds, None)
    models = (f"Translator and HF: {bench.opus.name}, Generator: {bench.llama.name}, imbalance and start-up: the embedded "
              f"model; {a.n} examples ({a.n_imbalance} for imbalance), {a.num_beams} beams, {a.max_new_tokens} new tokens")
    goals = report(rounds, jobs, models)
    write_results(bench.root, a, rounds, goals)
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
