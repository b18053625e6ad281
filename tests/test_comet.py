"""COMET natively on transformers 5: parity with unbabel-comet's own `predict` on tiny random
checkpoints in the published layout (scripts/make_comet_fixture.py made them and their scores
with unbabel-comet 2.2.7), the loader's refusals, and `--metrics comet` on the ranks: identical
at 1, 2 and 3 ranks, under --engine ctranslate2, refused early. (A run stopped at each step of
its COMET phase and resumed without rescoring what was journaled: tests/test_transaction.py.)"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO, _env, assert_ok, metrics_of, run_ranks, single, torchrun

from seq2seq_eval.errors import ConfigError, ModelError

DATA = REPO / "tests" / "data" / "comet_tiny"
REFERENCE = json.loads((DATA / "reference_scores.json").read_text(encoding="utf-8"))
SAMPLES = REFERENCE["samples"]
TINY = DATA / "wmt22_like"


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module", params=["wmt22_like", "wmt20_like"])
def variant(request):
    from seq2seq_eval.scoring.comet import load

    return request.param, load(str(DATA / request.param))


@pytest.mark.parametrize("refs", ["ref", "ref2"])
def test_scores_equal_unbabel_comet_predict(variant, refs):
    from seq2seq_eval.scoring.model_metric import score_all

    name, comet = variant
    expected = REFERENCE["scores"][name][refs]
    got = score_all(comet, SAMPLES["src"], SAMPLES["mt"], [(r,) for r in SAMPLES[refs]])
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5
    assert abs(comet.aggregate(got) - sum(expected) / len(expected)) < 1e-6
    # Scores move with the translation: the tiny models are not constant.
    assert max(expected) - min(expected) > 1e-3


def test_several_references_score_their_mean(variant):
    name, comet = variant
    both = comet.score(SAMPLES["src"], SAMPLES["mt"], list(zip(SAMPLES["ref"], SAMPLES["ref2"])))
    expected = [(a + b) / 2 for a, b in zip(REFERENCE["scores"][name]["ref"], REFERENCE["scores"][name]["ref2"])]
    assert max(abs(a - b) for a, b in zip(both, expected)) < 1e-5


def test_the_wmt22_layer_mix_is_sparse():
    import torch

    from seq2seq_eval.scoring.comet.network import sparsemax

    w = sparsemax(torch.tensor([0.2, -0.5, 0.4, 0.9]))
    # Sorted 0.9, 0.4, 0.2, -0.5: the support is the top 3, tau = (1.5 - 1) / 3.
    assert w.tolist() == pytest.approx([0.2 - 1 / 6, 0.0, 0.4 - 1 / 6, 0.9 - 1 / 6])
    assert float(w.sum()) == pytest.approx(1.0)


def _copy_model(tmp_path: Path, **hparams) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(TINY, folder)
    text = (folder / "hparams.yaml").read_text(encoding="utf-8")
    for key, value in hparams.items():
        text = "\n".join(line for line in text.splitlines() if not line.startswith(f"{key}:")) + f"\n{key}: {value}\n"
    (folder / "hparams.yaml").write_text(text, encoding="utf-8")
    return folder


def test_layers_above_the_last_one_the_mix_weighs_are_never_run(tmp_path, monkeypatch):
    """Sparsemax gives the top layer a weight of exactly 0 here: it is dropped, and the scores
    are those of the whole encoder."""
    import torch

    from seq2seq_eval.scoring.comet import load
    from seq2seq_eval.scoring.comet.network import RegressionNetwork

    folder = _copy_model(tmp_path)
    ckpt = folder / "checkpoints" / "model.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    saved["state_dict"]["layerwise_attention.scalar_parameters.3"] = torch.tensor([-0.9])
    torch.save(saved, ckpt)
    refs = [(r,) for r in SAMPLES["ref"]]
    dropped = load(str(folder))
    assert len(dropped.network.encoder.model.encoder.layer) == 2
    got = dropped.score(SAMPLES["src"], SAMPLES["mt"], refs)
    monkeypatch.setattr(RegressionNetwork, "drop_unused_layers", lambda self: 3)
    whole = load(str(folder))
    assert len(whole.network.encoder.model.encoder.layer) == 3
    assert got == whole.score(SAMPLES["src"], SAMPLES["mt"], refs)


def test_a_reference_free_regression_model_is_refused_by_name(tmp_path):
    from seq2seq_eval.scoring.comet import load

    with pytest.raises(ModelError, match="COMET-QE.*not supported") as e:
        load(str(_copy_model(tmp_path, class_identifier="referenceless_regression_metric")))
    assert "\n" not in str(e.value)


def test_the_encoder_comes_from_an_absolute_path_or_the_folder_beside_hparams(tmp_path):
    from seq2seq_eval.scoring.comet import load

    encoder = tmp_path / "elsewhere"
    folder = _copy_model(tmp_path, pretrained_model=str(encoder))
    shutil.move(str(folder / "tiny-xlmr"), encoder)
    got = load(str(folder)).score(SAMPLES["src"][:3], SAMPLES["mt"][:3], [(r,) for r in SAMPLES["ref"][:3]])
    assert got == pytest.approx(REFERENCE["scores"]["wmt22_like"]["ref"][:3], abs=1e-5)
    (tmp_path / "bare").mkdir()
    with pytest.raises(ModelError, match="hparams.yaml is missing"):
        load(str(tmp_path / "bare"))


def test_comet_without_references_is_refused_before_any_work(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("a b c\n", encoding="utf-8")
    from seq2seq_eval.config import EvalConfig

    with pytest.raises(ConfigError, match=r"^--metrics bleu,comet: bleu, comet need references \(--input_path without "
                                          r"--reference_path gives none\)"):
        EvalConfig(input_path=str(src), metrics="bleu,comet")
    proc = single(["--input_path", str(src), "--metrics", "comet", "--comet_model", str(TINY), "--save_dir",
                   str(tmp_path / "out"), "--dry_run"], tmp_path)
    assert proc.returncode != 0 and "comet needs references (--input_path without --reference_path" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_missing_comet_model_is_refused_in_the_dry_run(tmp_path):
    proc = single(["--metrics", "bleu,comet", "--comet_model", str(tmp_path / "nope"), "--n_obs", "8",
                   "--save_dir", str(tmp_path / "out"), "--dry_run"], tmp_path)
    assert proc.returncode != 0 and "no such folder" in proc.stderr, proc.stderr


def test_a_checkpoint_that_does_not_fit_its_class_is_refused_before_any_work(tmp_path):
    """Names and shapes, from the checkpoint mapped rather than read (its zip format), or read
    whole (torch's legacy format): by the checks (the dry run's) and by the load alike."""
    import torch

    from seq2seq_eval.scoring.comet import check, load

    cases = {"shape": r"estimator\.ff\.0\.weight has shape \[48, 193\] where hparams\.yaml and the encoder's config "
                      r"give \[48, 192\]\)$",
             "missing": r"missing \['estimator\.ff\.0\.weight'\], unexpected \[\]\)$",
             "renamed": r"missing \['estimator\.ff\.0\.weight'\], unexpected \['estimator\.ff\.0\.weights'\]\)$",
             "legacy format": None}
    for case, why in cases.items():
        folder = tmp_path / case.replace(" ", "_")
        shutil.copytree(TINY, folder)
        ckpt = torch.load(folder / "checkpoints" / "model.ckpt", weights_only=False)
        state = ckpt["state_dict"]
        if case == "shape":
            state["estimator.ff.0.weight"] = torch.zeros(48, 193)
        elif case != "legacy format":
            weight = state.pop("estimator.ff.0.weight")
            if case == "renamed":
                state["estimator.ff.0.weights"] = weight
        torch.save(ckpt, folder / "checkpoints" / "model.ckpt", _use_new_zipfile_serialization=case != "legacy format")
        if why is None:
            check(str(folder))
            assert load(str(folder)).signature
            continue
        for step in (check, load):
            with pytest.raises(ModelError, match=rf"^--comet_model {folder}: the checkpoint does not match its class "
                                                 rf"regression_metric \({why}"):
                step(str(folder))
    proc = single(["--metrics", "bleu,comet", "--comet_model", str(tmp_path / "shape"), "--n_obs", "8",
                   "--save_dir", str(tmp_path / "out"), "--dry_run"], tmp_path)
    assert proc.returncode != 0 and "estimator.ff.0.weight has shape [48, 193]" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


BUDGET = 40  # forward passes of 1 to 4 texts; 20 planned batches of 40 examples, enough to share and steal
RUN = ["--metrics", "bleu,chrf,comet", "--comet_model", str(TINY), "--n_obs", "40", "--bs", "8", "--comet_max_tokens", str(BUDGET)]
METRICX = REPO / "tests" / "data" / "metricx_tiny"


@pytest.fixture(scope="module")
def run_args(tmp_path_factory) -> list[str]:
    """RUN with MetricX beside COMET: the same bytes at any world size and with stolen batches hold
    for both metrics. A random MetricX-24 checkpoint (benchmarks/metricx.py's, in the hub's layout:
    config.json naming MT5ForRegression, model.safetensors without a tokenizer; test_metricx.py's
    tokenizer) 32 wide: test_metricx.py's parity checkpoint is 16 wide, a product MKL's strict mode
    leaves to the threads (docs/outputs.md, "Narrow products"), so its bits move between 1 and 2
    threads."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("metricx_bench", REPO / "benchmarks" / "metricx.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    folder = tmp_path_factory.mktemp("metricx")
    bench.make_checkpoint(folder, "tiny32")  # the score row set so that scores vary inside [0, 25]
    return [*RUN[:1], "bleu,chrf,comet,metricx", *RUN[2:], "--metricx_model", str(folder),
            "--metricx_tokenizer", str(METRICX / "tokenizer")]


def _outputs(save_dir: Path) -> dict[str, bytes]:
    metric = json.loads((save_dir / "test_bleu.json").read_text())
    return {"examples": (save_dir / "test_examples.jsonl").read_bytes(),
            "generations": (save_dir / "test_generations.txt").read_bytes(),
            "scores": json.dumps({k: metric.get(k) for k in ("bleu", "chrf", "comet", "comet_signature", "metricx",
                                                             "metricx_signature")}).encode()}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, run_args):
    """One process of 2 threads, the ranks below 1 thread each: the same bytes (numerics.py)."""
    out = tmp_path_factory.mktemp("comet1") / "out"
    assert_ok(single([*run_args, "--save_dir", str(out)], out.parent, env={"OMP_NUM_THREADS": "2"}))
    return out


def test_comet_in_the_metric_file_and_examples(one_rank):
    metric = json.loads((one_rank / "test_bleu.json").read_text())
    rows = [json.loads(line) for line in (one_rank / "test_examples.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and all(isinstance(r["comet"], float) and "bleu" in r for r in rows)
    assert metric["comet"] == pytest.approx(math.fsum(r["comet"] for r in rows) / 40, abs=1e-12)
    assert str(TINY) in metric["comet_signature"]
    # The same values as one process scoring the pairs directly (the run's predictions).
    from seq2seq_eval.scoring.comet import load
    from seq2seq_eval.scoring.model_metric import score_all

    direct = score_all(load(str(TINY)), [r["source"] for r in rows], [r["prediction"] for r in rows],
                       [tuple(r["references"]) for r in rows], max_tokens=BUDGET)
    assert [r["comet"] for r in rows] == direct
    assert not any(p.name.startswith("model_scores") for p in one_rank.parent.rglob("*"))  # cleaned up


def test_identical_at_3_ranks(one_rank, tmp_path, run_args):
    out = tmp_path / "out"
    assert_ok(run_ranks(3, [*run_args, "--save_dir", str(out)], tmp_path))
    assert _outputs(out) == _outputs(one_rank)
    rows = [json.loads(line) for line in (out / "test_examples.jsonl").read_text().splitlines()]
    assert all(0 <= r["metricx"] <= 25 for r in rows)  # MetricX's scale


def test_under_ctranslate2(tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "out"
    assert_ok(single([*RUN, "--engine", "ctranslate2", "--save_dir", str(out)], tmp_path))
    rows = [json.loads(line) for line in (out / "test_examples.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and all("comet" in r for r in rows)


def test_resume_after_a_kill_during_metricx_scoring_nothing_journaled(one_rank, tmp_path, run_args):
    """One example per model-metric batch, so scoring lasts long enough to be killed in the
    middle of MetricX's phase (COMET's, before it, is done); the resumed run scores every batch of
    each metric once. A stop at each step of a model metric's phase: test_transaction.py."""
    killed_in = "metricx"
    budget = run_args.index("--comet_max_tokens") + 1
    args = [*run_args[:budget], "1", *run_args[budget + 1:], "--save_dir", str(tmp_path / "out"), "--debug"]
    journal = tmp_path / "out_tmp" / "model_scores_rank_0.jsonl"

    def of_killed(data: bytes) -> list[bytes]:
        return [line for line in data[: data.rfind(b"\n") + 1].splitlines() if json.loads(line)["metric"] == killed_in]

    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_eval", *args], cwd=tmp_path, env=_env(None),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (journal.exists() and of_killed(journal.read_bytes())):
            assert proc.poll() is None and time.monotonic() < deadline, f"{killed_in} scoring never started"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    before = journal.read_bytes()
    kept = before[: before.rfind(b"\n") + 1].splitlines()
    assert 1 <= len(of_killed(before)) < 40, f"the kill came after {killed_in} scoring ended"
    assert_ok(single([*args, "--resume"], tmp_path))
    lines = journal.read_bytes().splitlines()
    assert lines[: len(kept)] == kept
    for name in ("comet", "metricx"):
        batches = [json.loads(line)["batch"] for line in lines if json.loads(line)["metric"] == name]
        assert sorted(batches) == list(range(40)), name  # each batch scored once: the journaled ones not again
    rows = [json.loads(line) for line in (tmp_path / "out" / "test_examples.jsonl").read_text().splitlines()]
    first = [json.loads(line) for line in (one_rank / "test_examples.jsonl").read_text().splitlines()]
    for name in ("comet", "metricx"):
        assert [r[name] for r in rows] == pytest.approx([r[name] for r in first], abs=1e-5), name


def test_identical_at_2_ranks_with_a_slow_rank_s_comet_batches_taken_over(one_rank, tmp_path, run_args):
    """Rank 1 runs half the time once it has generated (stopped and continued from outside, as
    on a shared node): rank 0 scores COMET batches dealt to rank 1, and the outputs are those of
    one process."""
    from faults import Throttle, find_worker, stop_all, wait_for_lines

    out, tag = tmp_path / "out", uuid.uuid4().hex
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "seq2seq_eval",
           *run_args, "--save_dir", str(out)]
    with open(tmp_path / "log", "w+") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env({"S2S_TEST_TAG": tag}), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        throttle = None
        try:
            pid = find_worker(tag, 1)
            wait_for_lines(tmp_path / "out_tmp" / "rank_1_output.json", 0)  # rank 1 has generated its share
            throttle = Throttle(pid)
            throttle.start()
            proc.wait(timeout=240)
            log.seek(0)
            assert proc.returncode == 0, log.read()[-5000:]
        finally:
            stop_all(proc, throttle)
    stats = metrics_of(out)["throughput"]["model_metrics"]["comet"]
    assert stats["batches"] == 20 and stats["rank0_stolen_batches"] > 0, stats
    assert stats["rank0_scored_batches"] > stats["rank0_planned_batches"], stats
    assert _outputs(out) == _outputs(one_rank)


def test_score_and_compare_over_files(one_rank, tmp_path):
    from seq2seq_eval.api import score

    rows = [json.loads(line) for line in (one_rank / "test_examples.jsonl").read_text().splitlines()]
    src, pred, ref = ([r[k] for r in rows] for k in ("source", "prediction", "references"))
    ref = [r[0] for r in ref]
    got = score(pred, ref, metrics="comet", sources=src, comet_model=str(TINY))
    assert set(got) == {"comet", "comet_signature"}
    for name, lines in (("src", src), ("pred", pred), ("ref", ref), ("other", ref[1:] + ref[:1])):
        (tmp_path / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    scoring = ["score", "--metrics", "bleu,comet", "--predictions", str(tmp_path / "pred"), "--references",
               str(tmp_path / "ref"), "--sources", str(tmp_path / "src"), "--comet_model", str(TINY), "--comet_max_tokens", "1"]
    proc = single(scoring, tmp_path)
    assert_ok(proc)
    printed = json.loads(proc.stdout)
    assert printed["comet"] == pytest.approx(got["comet"], abs=1e-6) and "bleu" in printed
    # Under torchrun the ranks share COMET's batches (one per example here) and rank 0 prints.
    two = torchrun(2, scoring, tmp_path)
    assert_ok(two)
    assert json.loads(two.stdout) == printed
    refused = single(["score", "--metrics", "comet", "--predictions", str(tmp_path / "pred"), "--references",
                      str(tmp_path / "ref")], tmp_path)
    assert refused.returncode != 0 and "comet needs sources (pass --sources" in refused.stderr
    proc = single(["compare", "--task", "translation", "--metrics", "comet", "--predictions", str(tmp_path / "pred"),
                   str(tmp_path / "other"), "--references", str(tmp_path / "ref"), "--sources", str(tmp_path / "src"),
                   "--comet_model", str(TINY), "--json", "--report", str(tmp_path / "r.html")], tmp_path)
    assert_ok(proc)
    comparison = json.loads(proc.stdout.split("\nreport:")[0])
    assert comparison["results"]["pred"]["comet"]["score"] == pytest.approx(got["comet"], abs=1e-6)
    assert comparison["results"]["other"]["comet"]["p_value"] is not None
    assert "comet" in (tmp_path / "r.html").read_text()
    # The Python compare() takes the same two arguments and gives what the subcommand printed.
    import seq2seq_eval

    api = seq2seq_eval.compare({"pred": pred, "other": ref[1:] + ref[:1]}, ref, metrics="comet", sources=src,
                               comet_model=str(TINY))
    import torch

    if torch.cuda.is_available():
        # This process scores on the GPU, the subcommand on CPU (conftest hides the GPU from the
        # runs it starts): float32 sums in another order, equal to 1e-6.
        assert _close(api["results"], comparison["results"])
    else:
        assert api["results"] == comparison["results"]
    with pytest.raises(ConfigError, match="needs sources"):
        seq2seq_eval.compare({"pred": pred, "other": pred}, ref, metrics="comet")


def test_comet_in_evaluate(tmp_path):
    from seq2seq_eval import evaluate

    result = evaluate(str(REPO / "data_samples" / "model"), sources=SAMPLES["src"][:6], references=SAMPLES["ref"][:6],
                      metrics="bleu,comet", comet_model=str(TINY), save_dir=str(tmp_path / "out"), return_examples=True)
    assert 0 < abs(result.metrics["comet"]) < 1 and "comet_signature" in result.metrics
    rows = [json.loads(line) for line in (tmp_path / "out" / "test_examples.jsonl").read_text().splitlines()]
    assert result.metrics["comet"] == pytest.approx(math.fsum(r["comet"] for r in rows) / 6, abs=1e-12)


def _close(a, b, tol: float = 1e-6) -> bool:
    """Equal, floats to within `tol`, through nested dicts and lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    return a == b
