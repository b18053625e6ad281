"""What makes the bytes depend on the layout (threads per process), recorded as it is in force:
MKL's mode as MKL reports it (not as MKL_CBWR asked), and a model metric's narrow layers (a
checkpoint with a hidden size of 4 to 20) run on one MKL thread, their bits the same at 1 and 2
threads (numerics.py)."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys

import pytest
from conftest import REPO, _env

from seq2seq_eval import numerics

METRICX = REPO / "tests" / "data" / "metricx_tiny"


def mkl() -> bool:
    import torch

    return torch.backends.mkl.is_available()


@pytest.mark.parametrize("code, words", [(0x10002, "AUTO,STRICT"), (0x10003, "COMPATIBLE,STRICT"), (0x2, "AUTO"),
                                         (0x1000E, "AVX512_E1,STRICT"), (0x1, "BRANCH_OFF"), (0x10063, "branch 99,STRICT")])
def test_mkl_s_report_in_mkl_cbwr_s_words(code, words):
    assert numerics.in_force(code) == words


# In a fresh interpreter (MKL takes its mode once): what pin() records, and what MKL reports.
PIN = r"""
import json, logging, sys
logging.basicConfig(stream=sys.stderr)
from seq2seq_eval import numerics
mode = numerics.pin()
print(json.dumps({"mode": mode, "mkl": numerics.in_force(numerics._torch_mkl().mkl_serv_cbwr_get(-1))}))
"""


# MetricX on its tiny 16-wide checkpoint, the same examples at 1 and 2 threads of one process, with
# batches of fewer rows than the layers' 16 columns (the products strict mode leaves to the threads).
NARROW = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from seq2seq_eval import numerics
numerics.pin()
from seq2seq_eval.scoring import registry
from conftest import make_corpus
options = dict(registry.resolve_options({"metricx_model": sys.argv[2], "metricx_tokenizer": sys.argv[3]}))
metric = registry.load("metricx", options)
src, tgt = make_corpus(8, seed=5)
hyp, _ = make_corpus(8, seed=6)
values = {}
for threads in (1, 2):
    torch.set_num_threads(threads)
    values[threads] = [v.hex() for v in metric.score(src, hyp, [[t] for t in tgt], max_tokens=600)]
print(json.dumps({"differ": sum(a != b for a, b in zip(values[1], values[2])), "n": len(values[1]),
                  "narrow": metric.narrow_layers, "found": numerics.narrow_layers(metric.network), "folder": sys.argv[2]}))
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, tuple[dict, str]]:
    """Fresh interpreters, started together: pin() without MKL_CBWR and with one MKL does not
    take, and the narrow MetricX at 1 and 2 threads."""
    if not mkl():
        pytest.skip("this torch has no MKL")
    folder = tmp_path_factory.mktemp("metricx16")
    (folder / "config.json").write_bytes((METRICX / "float32" / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(lzma.decompress((METRICX / "float32" / "model.safetensors.xz").read_bytes()))
    base = {k: v for k, v in _env(None).items() if k != "MKL_CBWR"}
    runs = {"unset": ([PIN], base), "BOGUS,STRICT": ([PIN], {**base, "MKL_CBWR": "BOGUS,STRICT"}),
            "narrow": ([NARROW, str(REPO / "tests"), str(folder), str(METRICX / "tokenizer")], base)}
    started = {name: subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env) for name, (argv, env) in runs.items()}
    out = {}
    for name, proc in started.items():
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
        out[name] = (json.loads(stdout.splitlines()[-1]), stderr)
    return out


def test_the_recorded_mode_is_the_one_mkl_reports_and_a_mode_not_taken_is_said(probes):
    """MKL_CBWR=BOGUS,STRICT: MKL takes none of it (it reports AUTO without STRICT until the tool
    sets it): the record is what MKL has in force, not the text asked for, and one line says so."""
    (unset, quiet), (bogus, said) = probes["unset"], probes["BOGUS,STRICT"]
    assert unset == {"mode": "AUTO,STRICT", "mkl": "AUTO,STRICT"} and "MKL_CBWR" not in quiet
    assert bogus["mode"] == bogus["mkl"] != "BOGUS,STRICT" and bogus["mode"].endswith(",STRICT"), bogus
    assert [line for line in said.splitlines() if "MKL_CBWR=" in line] == [
        f"WARNING:seq2seq_eval:MKL_CBWR=BOGUS,STRICT: MKL reports {bogus['mode']} in force, which the provenance records"]


def test_a_narrow_model_metric_gives_the_same_bits_at_1_and_2_threads_and_records_its_layers(probes):
    """Before, 1 of these 8 examples had other bits at 2 threads than at 1 on this machine (the
    decoder's feed-forward layer, 16 wide, on batches of fewer than 16 rows)."""
    got, _ = probes["narrow"]
    assert got["n"] == 8 and got["differ"] == 0, got
    # Every linear layer 16 wide, recorded: q, k, v and o of each attention, each feed-forward's wo.
    assert len(got["found"]) == 19 and all(name.endswith(" (16)") for name in got["found"])
    assert got["narrow"] == [f"MT5Model.{name}" for name in got["found"]]
    assert any(".DenseReluDense.wo (16)" in name and name.startswith("MT5Model.decoder.") for name in got["narrow"])


def test_a_run_says_and_records_the_narrow_layers_it_ran_on_one_thread(probes, tiny_model, data23, tmp_path):
    """Through the command line: the run logs the narrow layers once and lists them in the metric
    file (throughput.model_metrics.metricx), beside the MKL mode in force on each rank."""
    from conftest import assert_ok, single

    folder = probes["narrow"][0]["folder"]
    proc = single(["--model_name", str(tiny_model), "--data_dir", str(data23), "--metrics", "metricx",
                   "--metricx_model", folder, "--metricx_tokenizer", str(METRICX / "tokenizer"),
                   "--save_dir", str(tmp_path / "out")], cwd=tmp_path)
    assert_ok(proc)
    metric = json.loads((tmp_path / "out" / "test_bleu.json").read_text())
    assert metric["throughput"]["model_metrics"]["metricx"]["narrow_layers_on_one_mkl_thread"] == probes["narrow"][0]["narrow"]
    assert metric["provenance"]["mkl_cbwr_per_rank"] == ["AUTO,STRICT"]
    said = [line for line in proc.stderr.splitlines() if "run on one MKL thread" in line]
    assert len(said) == 1 and said[0].endswith("metricx: 19 linear layer(s) 16 wide run on one MKL thread, whose bits "
                                               "MKL's strict mode would leave depending on the threads per process "
                                               "(numerics.py)"), proc.stderr


def test_narrow_layers_are_covered_on_the_cpu_only_and_once():
    import torch

    if not mkl():
        pytest.skip("this torch has no MKL")
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 24), torch.nn.Linear(24, 3),
                              torch.nn.Linear(3, 4))
    assert numerics.narrow_layers(net) == ["0 (16)", "3 (4)"]  # 24 and 3 columns: outside 4 to 20
    assert numerics.narrow_on_one_mkl_thread(net, "cuda") == []
    assert numerics.narrow_on_one_mkl_thread({"a": net}) == []  # an owner without attributes holds no network
    assert numerics.narrow_on_one_mkl_thread(net) == ["Sequential.0 (16)", "Sequential.3 (4)"]
    # Met again: recorded again (it is in force), hooked once.
    assert numerics.narrow_on_one_mkl_thread(net) == ["Sequential.0 (16)", "Sequential.3 (4)"]
    assert [len(net[i]._forward_pre_hooks) for i in range(4)] == [1, 0, 0, 1]
    x = torch.randn(2, 8)
    assert torch.equal(net(x), net(x))
    # An error inside a layer leaves MKL's threads as they were (the hook runs after an error too).
    lib = numerics._torch_mkl()
    before = lib.MKL_Set_Num_Threads_Local(0)
    lib.MKL_Set_Num_Threads_Local(before)
    with pytest.raises(RuntimeError):
        net(torch.randn(2, 9))
    assert lib.MKL_Set_Num_Threads_Local(before) == before
