"""What "identical" means across world sizes and threads per rank, exactly as docs/outputs.md
states it: 1 process with 2 threads and 2 processes with 1 thread each write the same bytes,
pseudolabel beam scores included (MKL's strict mode, numerics.py); the mechanism on its own, op
by op, in an interpreter whose MKL has not started; and what the provenance records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _env, assert_ok, run_ranks, single


@pytest.fixture(scope="module")
def runs(tiny_model, data23, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("threads")
    # One budget at every world size: the default depends on it on a set this small (plan.default_plan).
    args = ["--model_name", str(tiny_model), "--data_dir", str(data23), "--num_return_sequences", "2",
            "--pseudo_target", "--max_tokens", "1024"]
    out = {name: root / name for name in ("w1_t1", "w2_t1", "w1_t2")}
    # conftest._env gives every run OMP_NUM_THREADS=1: 1 thread in each of the 2 ranks, against
    # 1 process of 2 threads (the fork server sets a run's threads from its OMP_NUM_THREADS).
    assert_ok(single(args + ["--save_dir", str(out["w1_t1"])], cwd=root))
    assert_ok(run_ranks(2, args + ["--save_dir", str(out["w2_t1"])], cwd=root))
    assert_ok(single(args + ["--save_dir", str(out["w1_t2"])], cwd=root, env={"OMP_NUM_THREADS": "2"}))
    return out


def test_pseudolabels(runs, data23):
    save = runs["w2_t1"]
    legacy = json.loads((save / "pseudolabel_results.json").read_text())
    sources = (data23 / "test.source").read_text().splitlines()
    targets = (data23 / "test.target").read_text().splitlines()
    assert [r["id"] for r in legacy] == list(range(23))
    assert all(len(r["preds"]) == 2 and r["source"] == sources[r["id"]] for r in legacy)
    assert all(r["target"] == [targets[r["id"]]] for r in legacy)  # a list, also for one reference
    assert not (save / "test_bleu.json").exists()  # no metric is computed for pseudolabels
    lines = [json.loads(x) for x in (save / "test_pseudolabels.jsonl").read_text().splitlines()]
    assert [x["candidates"] for x in lines] == [r["preds"] for r in legacy]
    assert [x["target"] for x in lines] == [r["target"] for r in legacy]
    assert all(len(x["scores"]) == 2 and x["scores"][0] >= x["scores"][1] for x in lines)
    best = (save / "test.pseudo.target").read_text().splitlines()
    assert best == [r["preds"][0] for r in legacy]



def test_the_same_bytes_at_any_world_size_and_any_threads_per_rank(runs):
    for name in ("test_pseudolabels.jsonl", "pseudolabel_results.json", "test_generations.txt", "test.pseudo.target"):
        one = runs["w1_t1"] / name
        assert one.read_bytes() == (runs["w2_t1"] / name).read_bytes() == (runs["w1_t2"] / name).read_bytes(), name


def test_threads_per_rank_are_recorded(runs):
    def threads(save: Path) -> list[int]:
        return json.loads((save / "test_run_info.json").read_text())["provenance"]["torch_threads_per_rank"]

    def modes(save: Path) -> list[str | None]:
        return json.loads((save / "test_run_info.json").read_text())["provenance"]["mkl_cbwr_per_rank"]

    assert (threads(runs["w1_t1"]), threads(runs["w2_t1"]), threads(runs["w1_t2"])) == ([1], [1, 1], [2])
    import torch

    strict = "AUTO,STRICT" if torch.backends.mkl.is_available() else None
    assert (modes(runs["w1_t1"]), modes(runs["w2_t1"]), modes(runs["w1_t2"])) == ([strict], [strict] * 2, [strict])


# ---------------------------------------------------------------- the mechanism, op by op

# In an interpreter whose MKL has not computed yet (MKL takes its mode once): each op at 1 and 2
# threads of the same process, without the strict mode ("none", then numerics.pin() too late),
# with it set by numerics.pin() ("pin") and with it from the environment ("env").
PROBE = r"""
import json, sys, torch
from seq2seq_eval import numerics

case = sys.argv[1]
mode = numerics.pin() if case != "none" else None
torch.manual_seed(0)
q, k = torch.randn(1, 8, 1, 64), torch.randn(1, 8, 3000, 64)
x, w = torch.randn(1, 8192), torch.randn(64, 8192)
a, b = torch.randn(8, 5, 4096), torch.randn(8, 4096, 7)
xn, wn = torch.randn(5, 48), torch.randn(16, 48)


def narrow():
    with numerics.one_mkl_thread():
        return torch.nn.functional.linear(xn, wn)


ops = {
    # One query against a long key: a decoder's step, SDPA's CPU kernel calling MKL's GEMM.
    "sdpa_one_query": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, k),
    "linear_long_k": lambda: torch.nn.functional.linear(x, w),
    "bmm_long_k": lambda: torch.bmm(a, b),
    # 16 output columns, 5 rows: a product strict mode leaves to MKL's threads, on one thread.
    "narrow_linear_on_one_mkl_thread": narrow,
}
same = {}
for name, op in ops.items():
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out[threads] = op()
    same[name] = torch.equal(out[1], out[2])
if case == "none":
    mode = numerics.pin()  # MKL has computed: too late
print(json.dumps({"mode": mode, "same": same}))
"""


@pytest.fixture(scope="module")
def probes() -> dict[str, tuple[dict, str]]:
    base = _env(None)
    envs = {"none": base, "pin": base, "env": {**base, "MKL_CBWR": "COMPATIBLE,STRICT"}}
    started = {case: subprocess.Popen([sys.executable, "-c", PROBE, case], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env) for case, env in envs.items()}
    out = {}
    for case, proc in started.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out[case] = (json.loads(stdout.splitlines()[-1]), stderr)
    return out


def test_strict_mode_gives_every_op_the_same_bits_at_1_and_2_threads(probes):
    import torch

    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    (pinned, _), (from_env, _) = probes["pin"], probes["env"]
    assert pinned["mode"] == "AUTO,STRICT" and from_env["mode"] == "COMPATIBLE,STRICT"
    assert all(pinned["same"].values()) and all(from_env["same"].values()), (pinned, from_env)


def test_without_strict_mode_an_op_differs_and_a_late_pin_says_so(probes):
    import torch

    from seq2seq_eval.numerics import OFF

    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    unpinned, stderr = probes["none"]
    assert unpinned["mode"] == OFF
    assert "before seq2seq_eval could set its strict mode" in stderr
    if all(unpinned["same"].values()):
        pytest.skip(f"this CPU's MKL gives these ops the same bits at 1 and 2 threads without strict mode: {unpinned}")
    assert not unpinned["same"]["sdpa_one_query"]


def test_a_whole_example_sum_does_not_follow_the_threads():
    """A sum to one value of 32768 terms or more is split among torch's threads, whatever MKL's
    mode: COMET's layer norm over a batch of one sums per token first."""
    import torch

    from seq2seq_eval.scoring.comet.network import _masked_layer_norm

    torch.manual_seed(0)
    h = torch.randn(1, 77, 768)
    mask = torch.ones(1, 77)
    before = torch.get_num_threads()
    try:
        out, plain = {}, {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out[threads] = _masked_layer_norm(h, mask.unsqueeze(-1), mask)
            plain[threads] = h.view(1, -1).sum(1)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[1], out[2])
    if torch.equal(plain[1], plain[2]):
        pytest.skip("this torch sums 59136 terms to one value the same way at 1 and 2 threads")


def test_mkl_cbwr_without_strict_is_refused_in_one_line(tiny_model, data23, tmp_path):
    proc = single(["--model_name", str(tiny_model), "--data_dir", str(data23), "--save_dir", str(tmp_path / "out"),
                   "--dry_run"], cwd=tmp_path, env={"MKL_CBWR": "AVX2"})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "seq2seq_eval: error: environment variable MKL_CBWR='AVX2' lacks STRICT, so MKL's float sums would depend on "
        "the threads per process; set MKL_CBWR=AVX2,STRICT or leave it unset (seq2seq_eval then sets AUTO,STRICT)"]


def test_bertscore_matching_of_one_pair_does_not_follow_the_threads():
    """One pair, its reference longer than its prediction: a narrow product (numerics.one_mkl_thread)."""
    import torch

    from seq2seq_eval.scoring.bertscore.matching import greedy_scores

    torch.manual_seed(0)
    hyp, ref = torch.nn.functional.normalize(torch.randn(10, 768), dim=-1), torch.nn.functional.normalize(torch.randn(16, 768), dim=-1)
    weights = [torch.ones(10)], [torch.ones(16)]
    before = torch.get_num_threads()
    try:
        out, plain = {}, {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out[threads] = greedy_scores([hyp], [ref], *weights)
            plain[threads] = torch.bmm(hyp[None], ref[None].transpose(1, 2))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[1], out[2])
    if torch.equal(plain[1], plain[2]):
        pytest.skip("this MKL multiplies 10 x 768 by 768 x 16 the same way at 1 and 2 threads")


def test_a_word_level_comet_model_does_not_follow_the_threads():
    """CometKiwi/XCOMET-style checkpoints: their estimator and tagger are narrow products too
    (numerics.one_mkl_thread); scores and spans the same at 1 and 2 threads."""
    import torch

    from seq2seq_eval.scoring.comet import load
    from seq2seq_eval.scoring.model_metric import score_all

    data = Path(__file__).resolve().parents[1] / "data_samples" / "translation"
    src = (data / "test.source").read_text(encoding="utf-8").splitlines()[:48]
    mt = (data / "test.target").read_text(encoding="utf-8").splitlines()[:48]
    metric = load(str(Path(__file__).resolve().parent / "data" / "comet_tiny" / "unified_spans_like"))
    before = torch.get_num_threads()
    try:
        out = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out[threads] = repr(score_all(metric, src, mt, [(t,) for t in mt[::-1]], max_tokens=4000))
    finally:
        torch.set_num_threads(before)
    assert out[1] == out[2]
