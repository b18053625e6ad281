"""Nothing lost: killed ranks, signals, restarts, resume, stale and concurrent runs, full disks.

Real processes and real signals throughout: torchrun with gloo on CPU, SIGKILL/SIGTERM/SIGSTOP.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import _env, assert_ok, make_corpus, metric_values, metrics_of, run_ranks, single, write_legacy
from faults import alive, find_worker, wait_for_lines

# 48 examples, one per batch, each forced to decode 30 steps: long enough (a few seconds per
# rank) to kill a rank in the middle, short enough for CI.
SLOW = ["--bs", "1", "--min_length", "30", "--max_length", "30"]


@pytest.fixture(scope="module")
def slow_case(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    src, tgt = make_corpus(48, seed=5)
    data = write_legacy(root / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), *SLOW]
    reference = root / "reference"
    assert_ok(single(args + ["--save_dir", str(reference)], cwd=root))
    return root, args, reference


_LAUNCHED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """A failed test must not leave a torchrun group running on the 2 shared cores."""
    yield
    while _LAUNCHED:
        proc = _LAUNCHED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def launch(nproc: int, args: list[str], cwd: Path, tag: str, max_restarts: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           f"--max_restarts={max_restarts}", "-m", "seq2seq_eval", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env({"S2S_TEST_TAG": tag}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _LAUNCHED.append(proc)
    return proc


def same_result(save: Path, reference: Path) -> None:
    assert (save / "test_generations.txt").read_bytes() == (reference / "test_generations.txt").read_bytes()
    assert metric_values(metrics_of(save)) == metric_values(metrics_of(reference))


@pytest.mark.parametrize("victim", [1, 0])
def test_killed_rank_loses_only_its_batch_in_flight_and_resume_completes(slow_case, tmp_path, victim):
    root, args, reference = slow_case
    save = tmp_path / "out"
    tag = uuid.uuid4().hex
    proc = launch(2, args + ["--save_dir", str(save)], tmp_path, tag)
    pid, survivor = find_worker(tag, victim), find_worker(tag, 1 - victim)
    journal = Path(f"{save}_tmp") / f"journal_rank_{victim}.jsonl"
    wait_for_lines(Path(f"{save}_tmp") / f"journal_rank_{1 - victim}.jsonl", 3)
    # The survivor waits, stopped, for the kill: with work stealing, a survivor that runs far ahead
    # (the victim started late on a loaded machine) can finish every batch left and exit before
    # the kill, and then no rank is left to report it (seen once in a full CI run).
    os.kill(survivor, signal.SIGSTOP)
    try:
        wait_for_lines(journal, 3)
        os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(survivor, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    # The survivor names the missing rank, how much is missing and how to resume.
    assert re.search(rf"rank\(s\) [0-9, ]*\b{victim}\b[0-9, ]* did not finish", err), err
    assert "examples still to generate" in err and "--resume" in err
    assert not (save / "test_bleu.json").exists()
    kept = journal.read_bytes().count(b"\n")
    assert kept >= 3  # what the dead rank finished is still there
    # Resume on a different world size: batches are global, so they carry over.
    resumed = run_ranks(3, args + ["--save_dir", str(save), "--resume"], cwd=tmp_path)
    assert_ok(resumed)
    same_result(save, reference)
    per_rank = metrics_of(save)["throughput"]["per_rank"]
    assert sum(r["resumed_batches"] for r in per_rank) >= kept


def test_rank_0_dying_after_every_other_rank_is_done_is_reported(slow_case, tmp_path):
    """Rank 1 has finished its share and every batch it could take; rank 0 then dies. Rank 1 has
    not exited (it waits for rank 0's outputs), so it says what is missing and how to resume."""
    root, args, reference = slow_case
    save = tmp_path / "out"
    tag = uuid.uuid4().hex
    proc = launch(2, args + ["--save_dir", str(save)], tmp_path, tag)
    rank0 = find_worker(tag, 0)
    tmp = Path(f"{save}_tmp")
    wait_for_lines(tmp / "journal_rank_0.jsonl", 2)
    os.kill(rank0, signal.SIGSTOP)  # mid-batch: the batch it claimed stays unfinished
    try:
        deadline = time.monotonic() + 120
        while not (tmp / "rank_1_output.json").exists():  # rank 1 is done generating
            assert time.monotonic() < deadline and proc.poll() is None, "rank 1 never finished"
            time.sleep(0.05)
        time.sleep(1)  # rank 1 would have exited by now, before the change
        assert proc.poll() is None
        os.kill(rank0, signal.SIGKILL)
    finally:
        if alive(rank0):
            os.kill(rank0, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("seq2seq_eval: error:")]
    assert len(lines) == 1 and lines[0].startswith("seq2seq_eval: error: [rank 1] rank 0 is gone; rank(s) 0 did not "
                                                   "finish"), err
    assert "examples still to generate" in lines[0] and "--resume" in lines[0]
    assert_ok(single(args + ["--save_dir", str(save), "--resume"], cwd=tmp_path))
    same_result(save, reference)


def _wait_for(path: Path, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline and proc.poll() is None, what
        time.sleep(0.05)


def test_rank_killed_in_the_shared_tail_and_resume_completes(slow_case, tmp_path):
    """Every batch is generated; rank 0 has said the sizes of its slice of the outputs and waits
    for rank 1's, and rank 1 is killed in the tail: the run stops saying what is missing and how
    to resume, and --resume (every batch from the journals) writes the same outputs."""
    root, args, reference = slow_case
    save = tmp_path / "out"
    tag = uuid.uuid4().hex
    proc = launch(2, args + ["--save_dir", str(save), "--shared_tail"], tmp_path, tag)
    rank0, rank1 = find_worker(tag, 0), find_worker(tag, 1)
    tmp = Path(f"{save}_tmp")
    wait_for_lines(tmp / "journal_rank_0.jsonl", 2)
    os.kill(rank0, signal.SIGSTOP)  # rank 1 takes every batch left, then waits in the tail
    stopped = [rank0]
    try:
        _wait_for(tmp / "rank_1_output.json", proc, "rank 1 never finished generating")
        os.kill(rank1, signal.SIGSTOP)  # in the shared tail: waiting for rank 0's rank file
        stopped.append(rank1)
        os.kill(rank0, signal.SIGCONT)
        stopped.remove(rank0)
        _wait_for(tmp / "tail_0.sizes", proc, "rank 0 never said its slice's sizes")
        assert not (tmp / "tail_1.sizes").exists() and not (tmp / "tail_0.json").exists()
        os.kill(rank1, signal.SIGKILL)
        stopped.remove(rank1)
    finally:
        for pid in stopped:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not (save / "test_bleu.json").exists()
    lines = [line for line in err.splitlines() if line.startswith("seq2seq_eval: error:")]
    assert any("rank(s) 1 did not write their slice of the outputs" in x and "--resume" in x for x in lines), err[-4000:]
    resumed = run_ranks(2, args + ["--save_dir", str(save), "--resume", "--shared_tail"], cwd=tmp_path)
    assert_ok(resumed)
    same_result(save, reference)
    assert sum(r["resumed_batches"] for r in metrics_of(save)["throughput"]["per_rank"]) == 48
    assert not Path(f"{save}_tmp").exists()


def test_restarted_workers_resume_by_themselves(slow_case, tmp_path):
    """torchrun --max_restarts: a rank killed once costs its batch in flight; the run still
    ends with exit 0 and byte-identical outputs, without --resume."""
    root, args, reference = slow_case
    save = tmp_path / "out"
    tag = uuid.uuid4().hex
    proc = launch(2, args + ["--save_dir", str(save)], tmp_path, tag, max_restarts=2)
    pid = find_worker(tag, 1)
    wait_for_lines(Path(f"{save}_tmp") / "journal_rank_1.jsonl", 3)
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-4000:]
    same_result(save, reference)
    assert sum(r["resumed_batches"] for r in metrics_of(save)["throughput"]["per_rank"]) >= 3


def test_sigterm_flushes_and_resume_completes(slow_case, tmp_path):
    root, args, reference = slow_case
    save = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_eval", *args, "--save_dir", str(save)], cwd=tmp_path,
                            env=_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = Path(f"{save}_tmp") / "journal_rank_0.jsonl"
    wait_for_lines(journal, 4)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    lines = [x for x in err.splitlines() if x.startswith("seq2seq_eval: error:")]
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0] and "--resume" in lines[0]
    assert "Traceback" not in err
    assert journal.read_bytes().count(b"\n") >= 4
    assert_ok(single(args + ["--save_dir", str(save), "--resume"], cwd=tmp_path))
    same_result(save, reference)


def test_rank_that_never_writes_fails_rank0_after_sync_timeout(slow_case, tmp_path):
    root, args, reference = slow_case
    save = tmp_path / "out"
    tag = uuid.uuid4().hex
    proc = launch(2, args + ["--save_dir", str(save), "--sync_timeout", "3"], tmp_path, tag)
    pid = find_worker(tag, 1)
    wait_for_lines(Path(f"{save}_tmp") / "journal_rank_1.jsonl", 1)
    os.kill(pid, signal.SIGSTOP)  # alive but silent: it never writes its rank file
    try:
        err = ""
        for line in proc.stderr:  # type: ignore[union-attr]
            err += line
            if "seq2seq_eval: error:" in line:
                break
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "waited 3 s (--sync_timeout)" in err and "missing from rank(s) 1" in err, err
    assert not (save / "test_bleu.json").exists()


def test_existing_temp_dir_needs_resume(slow_case, tmp_path):
    root, args, reference = slow_case
    save = tmp_path / "out"
    tmp = Path(f"{save}_tmp")
    assert_ok(single(args + ["--save_dir", str(save), "--debug", "--n_obs", "4"], cwd=tmp_path))
    assert (tmp / "manifest.json").exists()  # --debug keeps it
    proc = single(args + ["--save_dir", str(save), "--n_obs", "4"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "pass --resume to continue it, or remove" in proc.stderr and str(tmp) in proc.stderr
    changed = single(args + ["--save_dir", str(save), "--n_obs", "4", "--resume", "--max_source_length", "7"],
                     cwd=tmp_path)
    assert changed.returncode != 0
    assert "belongs to a run with different" in changed.stderr and "max_source_length" in changed.stderr
    beams = single(args + ["--save_dir", str(save), "--n_obs", "4", "--resume", "--num_beams", "3"], cwd=tmp_path)
    assert beams.returncode != 0 and "generation" in beams.stderr


def test_concurrent_run_is_refused_and_dead_holder_is_not(slow_case, tmp_path):
    root, args, reference = slow_case
    save = tmp_path / "out"
    tmp = Path(f"{save}_tmp")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from seq2seq_eval.run.tmpdir import RunLock, "
         "claim_tmp_dir; claim_tmp_dir(Path(sys.argv[1])); RunLock(Path(sys.argv[1])).acquire(); print('locked', "
         "flush=True); time.sleep(120)", str(tmp)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"  # type: ignore[union-attr]
    proc = single(args + ["--save_dir", str(save), "--n_obs", "3"], cwd=tmp_path)
    assert proc.returncode != 0 and "another run is using this temp dir" in proc.stderr, proc.stderr
    holder.kill()
    holder.wait()
    # The kernel dropped the dead holder's flock: the next run proceeds.
    assert_ok(single(args + ["--save_dir", str(save), "--n_obs", "3"], cwd=tmp_path))


def test_full_disk_keeps_the_previous_rank_file(tmp_path):
    from seq2seq_eval.errors import EvalError
    from seq2seq_eval.run.rankfiles import RankWriter, rank_file, read_rank_output

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        first = RankWriter(mnt, 0)
        first.add([0], [{"id": 0, "pred": "first", "n_tokens": 1}])
        first.close({"examples": 1})
        big = RankWriter(mnt, 0)
        with pytest.raises(EvalError, match="disk full"):
            for i in range(200):  # ~200 KB: more than the disk holds
                big.add([i], [{"id": i, "pred": "x" * 1000, "n_tokens": 1}])
            big.close({"examples": 200})
        big.abandon()
        again = read_rank_output(rank_file(mnt, 0), 0)
        assert again.table.column("pred").to_pylist() == [["first"]] and again.stats == {"examples": 1}
        # no partial or temporary file left behind
        assert sorted(p.name for p in mnt.iterdir()) == ["rank_0_output.arrow", "rank_0_output.json"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
