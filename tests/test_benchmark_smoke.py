"""benchmarks/throughput.py end to end on tiny data: each kind of method runs and every column prints.

No timing is asserted: on a shared CI machine the figures say nothing; the point is that the
real torchrun jobs (both baseline workers, seq2seq_eval on each engine, the bare CTranslate2
loop; one worker each here, as each start costs a few seconds of imports), the tail
micro-benchmark and the report all work. (c), (f) and (h) are (d) and (e) with other flags.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, assert_ok, single

COLUMNS = ("method", "samples/s", "gen tok/s", "wall s", "src pad", "gen pad", "imbal", "tail s", "tail %",
           "peak MB/rank", "BLEU")
METHODS = ("(a) tutorial", "(b) legacy split", "(d) s2s --max_tokens", "(e) s2s ct2 float32", "(g) bare ct2 loop")


def bench(script: str, args: list[str], cwd: Path, timeout: int = 300, check: bool = True
          ) -> subprocess.CompletedProcess:
    """`python benchmarks/<script> ARGS` in a process of its own, checked to have exited cleanly
    (unless not `check`). Forked from the fork server (conftest.single): the script's own
    imports of torch and transformers cost a new interpreter ~4 CPU s each time; the processes
    it starts itself (torchrun jobs, workers) are new interpreters as a user's are."""
    proc = single(args, cwd, timeout, script=REPO / "benchmarks" / script)
    if check:
        assert_ok(proc)
    return proc


def header_in_order(lines: list[str], first: str, columns: tuple[str, ...]) -> str:
    """The table's header line: it names every column, in order."""
    header = next(line for line in lines if line.startswith(first))
    positions = [header.find(c) for c in columns]
    assert -1 not in positions and positions == sorted(positions), header
    return header


def load_benchmark(script: str):
    """benchmarks/<script> as a module, for its pure functions."""
    import importlib.util

    name = Path(script).stem + "_bench"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_benchmark_prints_every_column(tiny_model, tmp_path):
    """One round of real jobs; what several rounds add (turns, medians) is the report's, tested
    below on figures made up for it."""
    pytest.importorskip("ctranslate2")  # methods e and g run the CTranslate2 engine
    out = tmp_path / "bench"
    proc = bench("throughput.py", ["--model", str(tiny_model), "--n", "12", "--nproc", "1", "--bs", "4", "--num_beams", "2",
                                   "--tail_records", "200", "--rounds", "1", "--methods", "abdeg", "--out", str(out)],
                 tmp_path, timeout=600)
    lines = proc.stdout.splitlines()
    header_in_order(lines, "method", COLUMNS)
    for name in METHODS:
        rows = [line for line in lines if line.startswith(name)]
        assert len(rows) == 1 and all(len(row[len(name):].split()) == len(COLUMNS) - 1 for row in rows), rows
    assert sum(line.startswith("samples/s ratios: d/a ") and "e/best HF" in line and "e/g" in line for line in lines) == 1
    assert sum(line.startswith("identical generations: e=d ") for line in lines) == 1
    assert not [line for line in lines if line.startswith(("round ", "median of"))]
    verdicts = [line for line in lines if line.startswith(("PASS ", "MISS "))]
    assert len(verdicts) == 8, proc.stdout
    assert not any(line.startswith("WARNING") for line in lines), proc.stdout

    report = json.loads((out / "results.json").read_text())
    assert [r["order"] for r in report["rounds"]] == [["a", "b", "d", "e", "g"]]
    for r in report["rounds"]:
        assert sorted(r["methods"]) == ["a", "b", "d", "e", "g"]
        assert all(m["n"] == 12 for m in r["methods"].values())
        # Generated tokens are counted from the ids, for every method.
        assert all(m["generated_tokens"] > 0 for m in r["methods"].values())
    assert report["settings"]["same_generation_settings"]
    assert report["micro_tail"]["records"] == 200


def test_rounds_turn_and_the_report_takes_medians(tmp_path, capsys):
    """Several rounds, on made-up figures: each round's table and ratios, the order turning by one
    method a round, the medians over rounds, and the goals judged on them."""
    bench_module = load_benchmark("throughput.py")
    assert [bench_module.round_order(list("abdeg"), i) for i in (0, 1, 5)] == [
        list("abdeg"), list("bdega"), list("abdeg")]

    texts = {"a": "x y z", "b": "x y z", "d": "x y z", "e": "x y w", "g": "x y w"}

    def result(key: str, round_: int, seconds: float):
        save = tmp_path / f"r{round_}" / key
        save.mkdir(parents=True)
        (save / "test_generations.txt").write_text(texts[key].replace(" ", "\n") + "\n")
        per_rank = [{"generation_seconds": seconds, "source_tokens": 90, "padded_source_tokens": 100,
                     "peak_memory_bytes": 2**20, "batches": 2}] * 2
        return bench_module.MethodResult(key=key, name=bench_module.METHODS[key], n=3, wall_seconds=2 * seconds,
                                         per_rank=per_rank, bleu=50.0, tail_seconds=0.01, generated_tokens=30,
                                         padded_generated_tokens=40, generation={"num_beams": 2},
                                         extra={"save": str(save), "other_cores_busy": 0.0})

    # samples/s = 3 / seconds; (d) against (a): 4x in round 1, 2x in round 2, median 3x.
    seconds = [{"a": 1.0, "b": 0.5, "d": 0.25, "e": 0.1, "g": 0.1}, {"a": 1.0, "b": 0.5, "d": 0.5, "e": 0.2, "g": 0.2}]
    rounds = [{k: result(k, i, s) for k, s in by.items()} for i, by in enumerate(seconds)]
    checked, same = bench_module.print_rounds(rounds, list("abdeg"), None)
    lines = capsys.readouterr().out.splitlines()
    assert same
    assert [line for line in lines if line.startswith("round ")] == ["round 1", "round 2"]
    assert [line for line in lines if line.startswith("samples/s ratios: ")][1].startswith(
        "samples/s ratios: d/a 2.00x, d/b 1.00x")
    assert [line for line in lines if line.startswith("identical generations: ")] == [
        "identical generations: e=d 2/3, e=g 3/3"] * 2
    median = next(line for line in lines if line.startswith("median of 2 rounds: "))
    assert median.startswith("median of 2 rounds: samples/s (a) 3.00, (b) 6.00, (d) 9.00, (e) 22.50, (g) 22.50; ratios ")
    assert "d/a 3.00x" in median
    first = checked[0]
    assert first[0].startswith("(d) samples/s >= 1.5x (a) and >= 1.2x (b)") and "3.00x, 1.50x (median of 2 rounds)" in first[0]
    assert first[1]  # 3x (a) and 1.5x (b), BLEU equal
    bare = next(text for text, _ in checked if text.startswith("(e) samples/s within 5% of the bare loop"))
    assert "1.000x (median of 2 rounds)" in bare


def test_beam_cache_benchmark_compares_and_finds_identical_outputs(tiny_model, tmp_path):
    proc = bench("beam_cache.py", ["--model", str(tiny_model), "--n", "12", "--max_tokens", "64", "--rounds", "1"], tmp_path)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("12 examples, ") and "num_beams 2" in lines[0], proc.stdout
    assert sum("samples/s" in line for line in lines[1:4]) == 3, proc.stdout
    assert lines[-1].startswith("identical predictions and token counts; median samples/s "), proc.stdout


def test_budget_benchmark_measures_every_budget_on_each_engine(tiny_model, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "budget"
    proc = bench("budget.py", ["--model", str(tiny_model), "--n", "12", "--bs", "4,8", "--max_tokens", "64",
                               "--out", str(out)], tmp_path)
    report = json.loads((out / "budget.json").read_text())
    for engine in ("hf", "ctranslate2"):
        rates = report["engines"][engine]["samples_per_second"]
        assert sorted(rates) == ["--bs 4", "--bs 8", "--max_tokens 64"] and all(v > 0 for v in rates.values())
        assert report["engines"][engine]["best"] == max(rates, key=rates.get)
        assert any(line.startswith(f"{engine}: best ") for line in proc.stdout.splitlines()), proc.stdout


# ---------------------------------------------------------------- benchmarks/gpu.py on CPU


def _gpu_bench():
    return load_benchmark("gpu.py")


GPU_COLUMNS = ("configuration", "method", "samples/s", "gen tok/s", "peak MB", "BLEU", "same as a", "x (a)", "x (b)")


def test_gpu_benchmark_runs_every_step_on_cpu_in_tiny_mode(tmp_path):
    """The GPU script's own paths (worker per configuration, the methods in process, the CTranslate2
    rows, a half-precision dtype, the --max_tokens sweep on both engines, the profile, the table) on
    a tiny model."""
    import importlib.util

    ct2 = importlib.util.find_spec("ctranslate2") is not None
    out = tmp_path / "gpu"
    proc = bench("gpu.py", ["--device", "cpu", "--tiny", "--skip_tests", "--out", str(out)], tmp_path)
    lines = proc.stdout.splitlines()
    header = header_in_order(lines, "configuration", GPU_COLUMNS)
    start = lines.index(header) + 2
    methods = ["(a) tutorial", "(b) legacy split", "(d) s2s", "(d0) d, generate()'s cache"]
    methods += ["(e16) d, ct2 float32", "(e8) d, ct2 int8"] if ct2 else []
    rows = lines[start:start + len(methods)]
    assert [r[20:49].split(" --")[0].strip() for r in rows] == methods, rows
    assert all(len(r[49:].split()) == len(GPU_COLUMNS) - 2 for r in rows), rows
    assert rows[0].startswith("marian-tiny bf16")
    sweeps = [line for line in lines if line.startswith("marian-tiny bf16    ") and "-> best" in line]
    assert [line[20:25].strip() for line in sweeps] == (["d", "e16"] if ct2 else ["d"]), proc.stdout
    assert all(line[25:].startswith("32: ") for line in sweeps), sweeps
    assert any(line.startswith("marian-tiny bf16    5 rows x ") for line in lines), proc.stdout
    assert sum(line.startswith(("PASS ", "MISS ")) for line in lines) == 1, proc.stdout
    suggested = [line for line in lines if line.startswith("suggested GPU default, --engine ")]
    assert [line.split()[4].rstrip(":") for line in suggested] == (["hf", "ctranslate2"] if ct2 else ["hf"]), proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    config = summary["configs"][0]
    keys = ["a", "b", "d", "d0"] + (["e16", "e8"] if ct2 else [])
    assert config["status"] == "ok" and config["rounds_done"] == 1 and sorted(config["methods"]) == sorted(keys)
    # Equal outputs: the tiny model's predictions do not depend on the batching (CTranslate2 runs
    # float32 and int8 here, against bf16).
    assert all(config["methods"][k]["identical_to_a"] == 1.0 for k in ("a", "b", "d", "d0"))
    assert all(sorted(points, key=int) == ["32", "96"] for points in config["sweep"].values())
    assert sorted(config["sweep"]) == (["d", "e16"] if ct2 else ["d"])
    assert summary["suggested_max_tokens"]["hf"]["value"] in (32, 96)
    assert len(config["profile"]["files"]) == 2 and all(Path(f).exists() for f in config["profile"]["files"])


def test_gpu_benchmark_configs_picks_by_name_and_refuses_unknown_names_first(tmp_path):
    proc = bench("gpu.py", ["--device", "cpu", "--tiny", "--configs", "nope", "--out", str(tmp_path / "gpu")], tmp_path,
                 check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "gpu.py: --configs nope: no such configuration; expected some of 'marian-tiny bf16'")
    assert not (tmp_path / "gpu").exists()  # refused before any step
    gpu = _gpu_bench()
    assert gpu.config_names(gpu.parse_args(["--device", "cuda"])) == [
        "embedded fp32", "marian-opus fp32", "marian-opus fp16", "marian-opus bf16"]
    small = ["--device", "cpu", "--n_embedded", "8", "--n_marian", "8", "--n_sweep", "8", "--n_sweep_embedded", "8"]
    data = REPO / "data_samples" / "translation"
    every = gpu.plan_configs(gpu.parse_args(small), tmp_path / "all", data)
    assert [c["name"] for c in every] == gpu.config_names(gpu.parse_args(small))
    picked = gpu.plan_configs(gpu.parse_args([*small, "--configs", "marian-opus fp32,embedded fp32"]), tmp_path / "some",
                              data)
    assert [c["name"] for c in picked] == ["embedded fp32", "marian-opus fp32"]


def test_gpu_benchmark_skips_steps_it_has_no_time_for(tmp_path):
    out = tmp_path / "gpu"
    proc = bench("gpu.py", ["--device", "cpu", "--tiny", "--budget", "1", "--out", str(out)], tmp_path, timeout=120)
    assert "pytest -m gpu: skipped: no time left, no counts" in proc.stdout
    assert "marian-tiny bf16    (skipped: no time left)" in proc.stdout
    assert "MISS  pytest -m gpu: every GPU test passed, none skipped" in proc.stdout


@pytest.mark.parametrize("xml, counts", [
    ('<testsuites><testsuite tests="9" failures="1" errors="0" skipped="2"/></testsuites>',
     {"passed": 6, "failed": 1, "errors": 0, "skipped": 2}),
    ('<testsuite tests="3" failures="0" errors="1" skipped="0"/>', {"passed": 2, "failed": 0, "errors": 1, "skipped": 0}),
    ("<testsuites><testsuite", None),  # killed while writing
])
def test_gpu_benchmark_reads_pytest_counts(tmp_path, xml, counts):
    path = tmp_path / "junit.xml"
    path.write_text(xml)
    assert _gpu_bench().pytest_counts(path) == counts


def test_gpu_batches_replays_the_deal_with_stealing_and_projects_from_timings(tmp_path):
    """benchmarks/gpu_batches.py without a GPU: the replay of measured batch times (three equal
    batches dealt [[0, 2], [1]] on 2 ranks) and the projection from a timings file."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_batches

    from seq2seq_eval.run.plan import make_batches

    plan = make_batches([10, 10, 10], bs=1)
    # Batch 0 is slow: rank 1 finishes batch 1 at 1 s and takes batch 2 from the end of rank 0's share.
    assert gpu_batches.replay(plan, [5.0, 1.0, 1.0], 2) == (5.0, 0)
    # Batch 2 is slow: rank 0 had started it at 1 s (its own share), nothing is left to take.
    assert gpu_batches.replay(plan, [1.0, 1.0, 5.0], 2) == (6.0, 0)
    assert gpu_batches.replay(plan, [1.0, 1.0, 1.0], 4) == (1.0, 1)
    lengths = [40] * 20 + [12] * 60
    timings = {str(b): [[len(x.members) * 4, x.padded_len, min(x.padded_len, 120), 0.01 * x.padded_len + 0.001 * len(x.members)]
                        for x in make_batches(lengths, max_tokens=b)]
               for b in (65536, 512, 256)}
    data = {"settings": {"text": "synthetic", "max_steps": 120}, "lengths": lengths, "timings": {"float16": timings}}
    text = gpu_batches.project(data, [1, 2, 8])
    rows = [line.split() for line in text.splitlines() if line.strip() and line.split()[0] in ("1", "2", "8")]
    assert [r[0] for r in rows] == ["1", "2", "8"] and rows[0][1] == "65536"
    assert "step overhead fitted" in text


def test_bertscore_benchmark_runs(tmp_path):
    """benchmarks/bertscore.py on a tiny encoder, the tool alone (bert-score's side is what
    tests/test_bertscore.py runs live where it is installed; starting it here would cost the
    suite tens of seconds): the figures print and go to results.json."""
    out = tmp_path / "bertscore"
    proc = bench("bertscore.py", ["--size", "tiny", "--n", "24", "--bs", "8", "--rounds", "1", "--out", str(out),
                                  "--bertscore_python", str(tmp_path / "none")], tmp_path)
    assert "measuring the tool alone" in proc.stdout and "tool (token budget " in proc.stdout
    report = json.loads((out / "results.json").read_text())
    assert report["n"] == 24 and len(report["tool_samples_per_second"]) == 1 and "median_ratio" not in report


def test_comet_benchmark_runs(tmp_path):
    """benchmarks/comet.py on a tiny XCOMET-class checkpoint, the tool alone (unbabel-comet's side
    is what tests/test_comet_unified.py's fixtures were built with): scoring and a whole run of the
    `score` command are timed, the tokens the encoder is given are counted, and the floor (the
    matrix products no scorer of these numbers can skip, at the GEMM rate measured in the run) is
    below what the tool took."""
    out = tmp_path / "comet"
    proc = bench("comet.py", ["--size", "tiny", "--n", "8", "--rounds", "1", "--threads", "1", "--classes", "xcomet",
                              "--out", str(out), "--comet_python", str(tmp_path / "none")], tmp_path)
    assert "measuring the tool alone" in proc.stdout and "xcomet: floor: " in proc.stdout, proc.stdout
    entry = json.loads((out / "results.json").read_text())["classes"]["xcomet"]
    row = entry["rounds"][0]
    assert row["tool_whole_s"] > 0 and row["tool_whole_cpu"] > 0 and "median_ratio" not in entry
    # Three inputs per example (with references), each of more than 5 tokens.
    assert 8 * 3 * 5 < entry["tool_real_tokens"] <= entry["tool_padded_tokens"]
    assert 0 < entry["floor_cpu_seconds"] < row["tool_cpu"]


def test_causal_benchmark_runs(tmp_path):
    """benchmarks/causal.py on a tiny model in one invocation: the loop against the tool's HF
    engine and, where CTranslate2 is installed, against (e), CTranslate2 alone on the conversion
    the tool made (the tool's CTranslate2 contenders are whole runs of the engine
    tests/test_ct2_causal.py runs; starting them here would cost the suite seconds for nothing
    new): the loop's outputs (greedy, float32), ratios printed and recorded."""
    try:
        import ctranslate2  # noqa: F401

        contenders = ["tool", "bare ct2"]
    except ImportError:
        contenders = ["tool"]
    out = tmp_path / "causal"
    proc = bench("causal.py", ["--size", "tiny", "--n", "6", "--max_new_tokens", "4", "--threads", "2",
                               "--contenders", ",".join(contenders), "--out", str(out)], tmp_path)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("identical outputs: "))
    assert line == "identical outputs: " + ", ".join(f"{name} = loop: 6 of 6" for name in contenders), line
    report = json.loads((out / "results.json").read_text())
    assert set(report["rounds"][0]) == {"loop", *contenders} and set(report["median_ratios"]) == set(contenders)
    assert all(report["rounds"][0][name] > 0 for name in contenders)


def test_ct2_layout_benchmark_runs(tmp_path):
    """benchmarks/ct2_layout.py on a small model: both layouts run (the one-worker layout is set by
    replacing the engine's cpu_layout in the child: a renamed method would fail here) and give the
    same generations. One job of the two (the other differs only in its flags): each costs three
    fresh processes."""
    pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')
    out = tmp_path / "layout"
    bench("ct2_layout.py", ["--small", "--rounds", "1", "--jobs", "translate", "--n_translate", "8", "--out", str(out)],
          tmp_path)
    report = json.loads((out / "results.json").read_text())
    assert {job: r["same_generations"] for job, r in report.items() if job != "threads"} == {"translate": True}
    assert all(set(r["rounds"][0]) == {"workers", "one worker"} for job, r in report.items() if job != "threads")


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
def test_balance_benchmark_jobs_pass_the_dry_run_on_each_engine(tiny_model, tmp_path, engine):
    """benchmarks/balance.py's job arguments, on a model that searches with beams, pass the dry run
    on both engines: a setting one engine refuses (CTranslate2 refuses generate()'s default
    early_stopping with beams) would otherwise surface only in a 10-minute benchmark run."""
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
    balance = load_benchmark("balance.py")
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.source").write_text("a b c\nd e\n")
    (data / "test.target").write_text("a b\nd\n")
    args = balance.job_args(str(tiny_model), data, engine, 2, 8, [], tmp_path / "out")
    proc = single([*args, "--num_beams", "2", "--dry_run"], tmp_path)
    assert_ok(proc)


def test_bare_benchmark_runs_the_tool_and_the_bare_translator_loop(tmp_path):
    """benchmarks/bare.py's translate job on the embedded model at one process, one round: the
    conversion made once beforehand, then the tool's CTranslate2 engine and the bare Translator
    loop in fresh processes, with the same outputs, timed, a ratio and its goal line. One job of
    the five: each costs fresh interpreters; the rest of the script is tested on made-up figures
    below."""
    pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')
    out = tmp_path / "bare"
    proc = bench("bare.py", ["--small", "--n", "6", "--rounds", "1", "--only", "translate", "--procs", "1",
                             "--out", str(out)], tmp_path, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a goal missed, which timings on CI say nothing about
    lines = proc.stdout.splitlines()
    row = next(line for line in lines if line.startswith("ct2 Translator "))
    assert row.split()[2] == "1" and row.split()[-1] == "6/6", row  # 1 process; the bare loop's outputs are the tool's
    verdicts = [line for line in lines if line.startswith(("PASS ", "MISS "))]
    assert len(verdicts) == 1 and "ct2 Translator at 1 process(es): bare/tool >= 0.9: " in verdicts[0], proc.stdout
    report = json.loads((out / "results.json").read_text())
    (result,) = report["rounds"][0].values()
    assert result["identical"] == result["n"] == 6
    assert result["ratio"] == pytest.approx(result["bare"]["wall_seconds"] / result["tool"]["wall_seconds"])
    assert all(result[side]["cpu_seconds"] > 0 for side in ("tool", "bare"))
    assert report["goals"][0]["pass"] == (result["ratio"] >= 0.9)


def test_bare_benchmark_reads_batches_merges_shares_and_judges_goals(tmp_path, capsys):
    """bare.py's own parts on made-up inputs: the tool's batches from its journals (a split batch
    refused: its members ran in parts), strided shares back in data order, and the goals judged on
    the medians over rounds."""
    bare = load_benchmark("bare.py")
    assert bare.merge_strided([["a", "c", "e"], ["b", "d"]]) == ["a", "b", "c", "d", "e"]
    assert bare.merge_strided([["x"]]) == ["x"]
    journals = tmp_path / "tmp"
    journals.mkdir()
    (journals / "journal_rank_0.jsonl").write_text(
        '{"batch": 1, "records": [{"id": 4}, {"id": 0}], "seconds": 1.0}\n{"other": 1}\n'
        '{"batch": 0, "records": [{"id": 2}], "seconds": 0.5}\n')
    (journals / "journal_rank_1.jsonl").write_text('{"batch": 2, "records": [{"id": 1}, {"id": 3}], "seconds": 1.0}\n')
    assert bare.journal_batches(journals) == [[4, 0], [2], [1, 3]]
    (journals / "journal_rank_1.jsonl").write_text('{"batch": 2, "split": [0, 2], "of": 2, "into": [[0, 1], [1, 2]]}\n')
    with pytest.raises(SystemExit, match="batch 2 was split"):
        bare.journal_batches(journals)
    with pytest.raises(SystemExit, match="no finished batch"):
        bare.journal_batches(tmp_path)

    def pair(job, procs, tool, bare_s, imbalance=None, tool_cpu=1.0, bare_cpu=1.0):
        return {"job": job, "procs": procs, "tool": {"wall_seconds": tool, "cpu_seconds": tool_cpu, "rank_imbalance": imbalance},
                "bare": {"wall_seconds": bare_s, "cpu_seconds": bare_cpu}, "ratio": bare_s / tool,
                "cpu_difference": tool_cpu - bare_cpu, "identical": 5, "n": 5}

    # Medians over 3 rounds: translate at 2 processes 0.95 (PASS), imbalance 1.2 (MISS); hf 0.9 (MISS);
    # start-up 0.4 CPU seconds over the plain script (PASS).
    rounds = [{"translate 2": pair("translate", 2, 10.0, b, i), "hf 1": pair("hf", 1, 10.0, h),
               "startup 1": pair("startup", 1, 5.0, 4.0, tool_cpu=c, bare_cpu=5.0)}
              for b, i, h, c in ((9.5, 1.2, 9.0, 5.4), (8.0, 1.0, 9.9, 5.2), (9.9, 1.3, 8.0, 6.0))]
    goals = bare.report(rounds, [("translate", 2), ("hf", 1), ("startup", 1)], "made up")
    lines = capsys.readouterr().out.splitlines()
    assert [ok for _, ok in goals] == [True, False, False, True]
    assert [line.split(":")[-1].strip() for line in lines if line.startswith(("PASS", "MISS"))] == [
        "0.950", "1.200", "0.900", "5.40 - 5.00 = +0.40"]
    row = next(line for line in lines if line.startswith("ct2 Translator"))
    assert row.split()[2:] == ["2", "10.0", "9.5", "0.950", "1.00", "1.00", "1.200", "5/5"], row


def test_bare_benchmark_refuses_an_unknown_job_before_any_work(tmp_path, capsys):
    bare = load_benchmark("bare.py")
    with pytest.raises(SystemExit) as e:
        bare.parse_args(["--only", "translate,nope", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert "--only: nope: no such job; expected some of translate, generate, hf, imbalance, startup" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
