"""Work stealing (steal.py): a rank that runs out of work takes unstarted batches from a slower one.

The slow rank is made slow from outside, as a throttled GPU or a shared node would be: SIGSTOP and
SIGCONT in turns, so it runs half the time. The tool has no hook for it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import _env, assert_ok, free_port, make_corpus, metric_values, metrics_of, run_ranks, single, write_legacy
from faults import Throttle, find_worker, stop_all, wait_for_lines

from seq2seq_eval.run.tmpdir import prepare_tmp_dir
from seq2seq_eval.run.steal import Claims, claims_dir, pick_victim

# 96 examples in batches of 2, each decoding 20 steps: 48 batches, fine enough for the fast rank
# to take over about two thirds of the work, and a few seconds of generation per run.
ARGS = ["--bs", "2", "--min_length", "20", "--max_length", "20"]
N_BATCHES = 48


# --- claims, without a model ---------------------------------------------------------------------


@pytest.mark.parametrize("left, rank, expected", [
    ([(5.0, 2, 0), (9.0, 1, 1), (0.0, 0, 2)], 2, 1),  # most cost left, even with fewer batches
    ([(5.0, 2, 0), (5.0, 3, 1), (0.0, 0, 2)], 2, 1),  # equal cost: more batches left
    ([(5.0, 2, 0), (5.0, 2, 1), (0.0, 0, 2)], 2, 0),  # all equal: the lowest rank
    ([(9.0, 4, 0), (1.0, 1, 1)], 0, 1),  # never itself, however much it has left
    ([(0.0, 0, 0), (0.0, 0, 1)], 0, None),  # nothing left anywhere
])
def test_pick_victim(left, rank, expected):
    assert pick_victim(left, rank) == expected


def _claims(tmp_path: Path, shares, rank: int, steal: bool = True) -> Claims:
    n = sum(len(s) for s in shares)
    return Claims(tmp_path, shares, rank, [float(n - i) for i in range(n)], steal=steal)


def test_a_rank_out_of_work_takes_from_the_end_of_the_fullest_share(tmp_path):
    claims_dir(tmp_path).mkdir()
    shares = [[0, 3, 4, 7], [1, 2, 5, 6, 8, 9], [10]]
    owner = iter(_claims(tmp_path, shares, 1))
    assert [next(owner).index for _ in range(2)] == [1, 2]  # rank 1 has started its share
    thief = [(c.index, c.planned_rank) for c in _claims(tmp_path, shares, 2)]
    # Its own batch, then always the last unstarted batch of the share with the most cost left
    # (batch i costs 11 - i): rank 0's 30 against rank 1's 16 (5, 6, 8, 9 left), and so on.
    assert thief == [(10, 2), (7, 0), (4, 0), (3, 0), (9, 1), (8, 1), (6, 1), (0, 0), (5, 1)]
    assert [c.index for c in owner] == []  # everything left was taken while it was stopped


def test_interleaved_ranks_claim_every_batch_exactly_once(tmp_path):
    claims_dir(tmp_path).mkdir()
    rng = random.Random(3)
    shares = [list(range(r, 60, 3)) for r in range(3)]
    ranks = [iter(_claims(tmp_path, shares, r)) for r in range(3)]
    got: dict[int, list[int]] = {r: [] for r in range(3)}
    live = [0, 1, 2]
    while live:
        r = rng.choice(live)
        try:
            got[r].append(next(ranks[r]).index)
        except StopIteration:
            live.remove(r)
    assert sorted(i for g in got.values() for i in g) == list(range(60))
    assert sorted(int(p.name) for p in claims_dir(tmp_path).iterdir()) == list(range(60))


def test_without_stealing_a_rank_runs_its_own_share_only(tmp_path):
    claims_dir(tmp_path).mkdir()
    shares = [[0, 1], [2, 3, 4]]
    assert [c.index for c in _claims(tmp_path, shares, 0, steal=False)] == [0, 1]
    assert [c.index for c in _claims(tmp_path, shares, 1, steal=False)] == [2, 3, 4]


def test_claims_last_one_attempt(tmp_path):
    """A batch claimed by a rank that died is free again in the next attempt (prepare_tmp_dir)."""
    prepare_tmp_dir(tmp_path, {"run": 1}, resume=False)
    shares = [[0, 1], [2]]
    assert [c.index for c in _claims(tmp_path, shares, 1)] == [2, 1, 0]
    assert prepare_tmp_dir(tmp_path, {"run": 1}, resume=True) == 0
    assert list(claims_dir(tmp_path).iterdir()) == []
    assert [c.index for c in _claims(tmp_path, shares, 0)] == [0, 1, 2]


def test_no_steal_flag():
    from seq2seq_eval.cli import build_parser

    assert build_parser().parse_args(["--model_name", "m", "--no_steal"]).no_steal is True
    assert build_parser().parse_args(["--model_name", "m"]).no_steal is False


# --- real ranks, one of them slowed from outside --------------------------------------------------


@pytest.fixture(scope="module")
def case(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("steal")
    src, tgt = make_corpus(96, seed=11)
    data = write_legacy(root / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), *ARGS]
    reference = root / "reference"  # one process, undisturbed
    assert_ok(single(args + ["--save_dir", str(reference)], cwd=root))
    return root, args, reference


def _same_outputs(save: Path, reference: Path) -> None:
    for name in ("test_generations.txt", "test_examples.jsonl"):
        assert (save / name).read_bytes() == (reference / name).read_bytes(), name
    assert metric_values(metrics_of(save)) == metric_values(metrics_of(reference))


def _finished_lines(tmp_dir: Path) -> Counter:
    """How many times each batch was journaled as finished, over every rank's journal."""
    seen: Counter = Counter()
    for path in tmp_dir.glob("journal_rank_*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "records" in entry and "part" not in entry:
                seen[entry["batch"]] += 1
    return seen


def test_fast_rank_on_another_node_takes_over_a_slow_ranks_work(case, tmp_path):
    """Two torchrun agents as two "nodes" (c10d rendezvous on loopback), one rank each; node 1's
    rank runs half the time. Rank 0 takes batches from the end of rank 1's share through claim
    files in the shared temp dir, and the outputs are those of one undisturbed process."""
    root, args, reference = case
    save, tag = tmp_path / "out", uuid.uuid4().hex
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"steal-{tag[:8]}"
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id,
               "-m", "seq2seq_eval", *args, "--save_dir", str(save), "--debug"]
        log = open(tmp_path / f"node{node}.log", "w+")
        procs.append((subprocess.Popen(cmd, cwd=tmp_path, env=_env({"S2S_TEST_TAG": tag}), stdout=log,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True), log))
    throttle = None
    try:
        pid = find_worker(tag, 1)
        wait_for_lines(Path(f"{save}_tmp") / "journal_rank_1.jsonl", 0)  # it is generating
        throttle = Throttle(pid)
        throttle.start()
        for proc, log in procs:
            proc.wait(timeout=240)
            log.seek(0)
            assert proc.returncode == 0, log.read()[-5000:]
    finally:
        if throttle is not None:
            throttle.finish()
        for proc, log in procs:
            stop_all(proc)
            log.close()
    _same_outputs(save, reference)
    tp = metrics_of(save)["throughput"]
    fast, slow = tp["per_rank"]
    assert fast["examples"] >= 1.6 * slow["examples"], tp["per_rank"]
    assert fast["stolen_batches"] > 0 and tp["moved_batches"] == fast["stolen_batches"] + slow["stolen_batches"]
    assert fast["batches"] + slow["batches"] == N_BATCHES
    assert fast["batches"] == fast["planned_batches"] - slow["stolen_batches"] + fast["stolen_batches"]
    # The journals say which rank generated which batch, and whose share a taken one was.
    tmp = Path(f"{save}_tmp")
    taken = [json.loads(line) for line in (tmp / "journal_rank_0.jsonl").read_text().splitlines()]
    assert sum(e.get("from_rank") == 1 for e in taken) == fast["stolen_batches"]
    assert _finished_lines(tmp) == {i: 1 for i in range(N_BATCHES)}


def test_killed_slow_rank_then_resume_generates_each_batch_once(case, tmp_path):
    root, args, reference = case
    save, tag = tmp_path / "out", uuid.uuid4().hex
    tmp = Path(f"{save}_tmp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "seq2seq_eval", *args, "--save_dir", str(save)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env({"S2S_TEST_TAG": tag}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    throttle = None
    try:
        pid = find_worker(tag, 1)
        wait_for_lines(tmp / "journal_rank_1.jsonl", 0)
        throttle = Throttle(pid)
        throttle.start()
        deadline = time.monotonic() + 120
        journal0 = tmp / "journal_rank_0.jsonl"
        while not (journal0.exists() and b'"from_rank"' in journal0.read_bytes()):  # rank 0 has taken work
            assert time.monotonic() < deadline and proc.poll() is None, "rank 0 never took a batch"
            time.sleep(0.02)
        throttle.finish()
        throttle = None
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "--resume" in err, err[-3000:]
    finally:
        stop_all(proc, throttle)
    before = _finished_lines(tmp)
    assert 0 < len(before) < N_BATCHES and set(before.values()) == {1}
    assert_ok(run_ranks(2, args + ["--save_dir", str(save), "--resume", "--debug"], cwd=tmp_path))
    # Journaled batches were reused, whoever had claimed them; the ones in flight ran once more.
    assert _finished_lines(tmp) == {i: 1 for i in range(N_BATCHES)}
    tp = metrics_of(save)["throughput"]
    assert sum(r["resumed_batches"] for r in tp["per_rank"]) == len(before)
    assert tp["generated_examples"] == 96 - 2 * len(before)
    _same_outputs(save, reference)
