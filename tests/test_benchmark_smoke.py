"""benchmarks/throughput.py end to end on tiny data: each kind of method runs and every column prints.

No timing is asserted: on a shared CI machine the figures say nothing; the point is that the
real multi-process jobs (both baseline workers, seq2seq_eval on each engine, the bare
CTranslate2 loop), the tail micro-benchmark and the report all work. (c), (f) and (h) are (d)
and (e) with other flags.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, _env, assert_ok

COLUMNS = ("method", "samples/s", "gen tok/s", "wall s", "src pad", "gen pad", "imbal", "tail s", "tail %",
           "peak MB/rank", "BLEU")
METHODS = ("(a) tutorial", "(b) legacy split", "(d) s2s --max_tokens", "(e) s2s ct2 float32", "(g) bare ct2 loop")


def bench(script: str, args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """benchmarks/<script> run as a user runs it, checked to have exited cleanly."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(None))
    assert_ok(proc)
    return proc


def header_in_order(lines: list[str], first: str, columns: tuple[str, ...]) -> str:
    """The table's header line: it names every column, in order."""
    header = next(line for line in lines if line.startswith(first))
    positions = [header.find(c) for c in columns]
    assert -1 not in positions and positions == sorted(positions), header
    return header


def test_benchmark_prints_every_column(tiny_model, tmp_path):
    out = tmp_path / "bench"
    proc = bench("throughput.py", ["--model", str(tiny_model), "--n", "30", "--nproc", "2", "--bs", "4", "--num_beams", "2",
                                   "--tail_records", "200", "--rounds", "2", "--methods", "abdeg", "--out", str(out)],
                 tmp_path, timeout=600)
    lines = proc.stdout.splitlines()
    header_in_order(lines, "method", COLUMNS)
    for name in METHODS:
        rows = [line for line in lines if line.startswith(name)]
        assert len(rows) == 2 and all(len(row[len(name):].split()) == len(COLUMNS) - 1 for row in rows), rows
    assert sum(line.startswith("samples/s ratios: d/a ") and "e/best HF" in line and "e/g" in line for line in lines) == 2
    assert sum(line.startswith("identical generations: e=d ") for line in lines) == 2
    assert ["round 1", "round 2"] == [line for line in lines if line.startswith("round ")]
    assert any(line.startswith("median of 2 rounds: samples/s (a) ") for line in lines)
    verdicts = [line for line in lines if line.startswith(("PASS ", "MISS "))]
    assert len(verdicts) == 8, proc.stdout
    assert not any(line.startswith("WARNING") for line in lines), proc.stdout

    report = json.loads((out / "results.json").read_text())
    assert [r["order"] for r in report["rounds"]] == [["a", "b", "d", "e", "g"], ["b", "d", "e", "g", "a"]]
    for r in report["rounds"]:
        assert sorted(r["methods"]) == ["a", "b", "d", "e", "g"]
        assert all(m["n"] == 30 for m in r["methods"].values())
        # Generated tokens are counted from the ids, for every method.
        assert all(m["generated_tokens"] > 0 for m in r["methods"].values())
    assert report["settings"]["same_generation_settings"]
    assert report["micro_tail"]["records"] == 200


def test_beam_cache_benchmark_compares_and_finds_identical_outputs(tiny_model, tmp_path):
    proc = bench("beam_cache.py", ["--model", str(tiny_model), "--n", "12", "--max_tokens", "64", "--rounds", "1"], tmp_path)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("12 examples, ") and "num_beams 2" in lines[0], proc.stdout
    assert sum("samples/s" in line for line in lines[1:3]) == 2, proc.stdout
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
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPU_COLUMNS = ("configuration", "method", "samples/s", "gen tok/s", "peak MB", "BLEU", "same as a", "x (a)", "x (b)")


def test_gpu_benchmark_runs_every_step_on_cpu_in_tiny_mode(tmp_path):
    """The GPU script's own paths (worker per configuration, the four methods in process, a
    half-precision dtype, the --max_tokens sweep, the profile, the table) on a tiny model."""
    out = tmp_path / "gpu"
    proc = bench("gpu.py", ["--device", "cpu", "--tiny", "--skip_tests", "--out", str(out)], tmp_path)
    lines = proc.stdout.splitlines()
    header = header_in_order(lines, "configuration", GPU_COLUMNS)
    start = lines.index(header) + 2
    rows = lines[start:start + 4]
    assert [r[20:49].split(" --")[0].strip() for r in rows] == [
        "(a) tutorial", "(b) legacy split", "(d) s2s", "(d0) d, generate()'s cache"], rows
    assert all(len(r[49:].split()) == len(GPU_COLUMNS) - 2 for r in rows), rows
    assert rows[0].startswith("marian-tiny bf16")
    assert any(line.startswith("marian-tiny bf16    32: ") and "-> best" in line for line in lines), proc.stdout
    assert any(line.startswith("marian-tiny bf16    5 rows x ") for line in lines), proc.stdout
    assert sum(line.startswith(("PASS ", "MISS ")) for line in lines) == 1, proc.stdout
    assert lines[-3].startswith("suggested GPU default: --max_tokens "), proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    config = summary["configs"][0]
    assert config["status"] == "ok" and config["rounds_done"] == 1 and sorted(config["methods"]) == ["a", "b", "d", "d0"]
    # Equal outputs: the tiny model's predictions do not depend on the batching.
    assert all(m["identical_to_a"] == 1.0 for m in config["methods"].values())
    assert sorted(config["sweep"], key=int) == ["32", "96"]
    assert summary["suggested_max_tokens"]["value"] in (32, 96)
    assert len(config["profile"]["files"]) == 2 and all(Path(f).exists() for f in config["profile"]["files"])


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
