"""benchmarks/throughput.py end to end on tiny data: every method runs and every column prints.

No timing is asserted: on a shared CI machine the figures say nothing; the point is that the
four real multi-process jobs, the tail micro-benchmark and the report all work.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, _env, assert_ok

COLUMNS = ("method", "samples/s", "gen tok/s", "wall s", "src pad", "gen pad", "imbal", "tail s", "tail %",
           "peak MB/rank", "BLEU")
METHODS = ("(a) tutorial", "(b) legacy split", "(c) s2s --bs", "(d) s2s --max_tokens")


def test_benchmark_prints_every_column(tiny_model, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "throughput.py"), "--model", str(tiny_model), "--n", "30",
         "--nproc", "2", "--bs", "4", "--num_beams", "2", "--tail_records", "200", "--rounds", "2", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=_env(None),
    )
    assert_ok(proc)
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("method"))
    positions = [header.find(c) for c in COLUMNS]
    assert -1 not in positions and positions == sorted(positions), header
    for name in METHODS:
        rows = [line for line in lines if line.startswith(name)]
        assert len(rows) == 2 and all(len(row[len(name):].split()) == len(COLUMNS) - 1 for row in rows), rows
    assert sum(line.startswith("samples/s ratios: c/a ") for line in lines) == 2
    assert ["round 1", "round 2"] == [line for line in lines if line.startswith("round ")]
    assert any(line.startswith("median of 2 rounds: samples/s (a) ") for line in lines)
    verdicts = [line for line in lines if line.startswith(("PASS ", "MISS "))]
    assert len(verdicts) == 5, proc.stdout
    assert not any(line.startswith("WARNING") for line in lines), proc.stdout

    report = json.loads((out / "results.json").read_text())
    assert [r["order"] for r in report["rounds"]] == [["a", "b", "c", "d"], ["b", "c", "d", "a"]]
    for r in report["rounds"]:
        assert sorted(r["methods"]) == ["a", "b", "c", "d"]
        assert all(m["n"] == 30 for m in r["methods"].values())
        # Generated tokens are counted from the ids, for every method.
        assert all(m["generated_tokens"] > 0 for m in r["methods"].values())
    assert report["settings"]["same_generation_settings"]
    assert report["micro_tail"]["records"] == 200


def test_beam_cache_benchmark_compares_and_finds_identical_outputs(tiny_model, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "beam_cache.py"), "--model", str(tiny_model), "--n", "12",
         "--max_tokens", "64", "--rounds", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_env(None),
    )
    assert_ok(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("12 examples, ") and "num_beams 2" in lines[0], proc.stdout
    assert sum("samples/s" in line for line in lines[1:3]) == 2, proc.stdout
    assert lines[-1].startswith("identical predictions and token counts; median samples/s "), proc.stdout
