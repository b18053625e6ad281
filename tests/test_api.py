"""The Python API: evaluate() inside a DDP training job on 2 gloo ranks (CPU), the Trainer
callback, and score()/compare() over lists, each against the command line on the same input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import seq2seq_eval
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from seq2seq_eval.errors import ConfigError, DataError
from conftest import assert_ok, metric_values, metrics_of, run_ranks, single

HERE = Path(__file__).resolve().parent
DATA = EMBEDDED_DATA["translation"]
N_OBS = 11  # 3 batches of 4 on 2 ranks: an uneven deal and a short last batch


def launch(nproc: int, script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_ranks(nproc, ["--model", str(EMBEDDED_MODEL), "--data", str(DATA), *args], cwd, timeout=300,
                 script=HERE / script)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[int, Path]:
    """The training job at 2 ranks (with the no-evaluation rerun and the failing evaluation) and
    at 1 rank; each rank's report is in {out}/rank_{r}.json."""
    root = tmp_path_factory.mktemp("api_jobs")
    assert_ok(launch(2, "api_train.py", ["--out", str(root / "w2"), "--n_obs", str(N_OBS), "--compare", "--fault"], root))
    assert_ok(launch(1, "api_train.py", ["--out", str(root / "w1"), "--n_obs", str(N_OBS)], root))
    return {2: root / "w2", 1: root / "w1"}


def reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank_*.json"))]


@pytest.fixture(scope="module")
def cli_on_checkpoints(jobs) -> dict[int, Path]:
    """The command line on the checkpoints the 2-rank job saved right after each evaluation."""
    out = {}
    for epoch in (0, 1):
        save = jobs[2] / f"cli{epoch}"
        assert_ok(single(["--model_name", str(jobs[2] / f"ckpt{epoch}"), "--data_dir", str(DATA), "--n_obs", str(N_OBS),
                          "--bs", "4", "--save_dir", str(save)], cwd=jobs[2]))
        out[epoch] = save
    return out


def test_evaluate_in_training_equals_command_line_on_checkpoint(jobs, cli_on_checkpoints):
    ranks = reports(jobs[2])
    assert [r["rank"] for r in ranks] == [0, 1]
    for epoch, cli in cli_on_checkpoints.items():
        mine = Path(ranks[0]["with"]["epochs"][epoch]["save_dir"])
        assert (mine / "test_generations.txt").read_bytes() == (cli / "test_generations.txt").read_bytes()
        expected = metric_values(metrics_of(cli))
        assert metric_values(metrics_of(mine)) == expected
        for r in ranks:  # returned on every rank: the metric file's content
            got = r["with"]["epochs"][epoch]["metrics"]
            assert metric_values(got) == expected and got["n_gpus"] == 2
    # epoch 1 evaluated in-memory examples and returned them
    lines = (cli_on_checkpoints[1] / "test_generations.txt").read_text().splitlines()
    assert all(r["with"]["epochs"][1]["predictions"] == lines for r in ranks)
    assert len(lines) == N_OBS and metrics_of(cli_on_checkpoints[1])["bleu"] > 10  # the model still translates


def test_training_continues_as_without_evaluations(jobs):
    for r in reports(jobs[2]):
        assert r["with"]["losses"] == r["without"]["losses"]  # dropout and shuffles: the RNG is untouched
        for epoch in r["with"]["epochs"]:
            assert epoch["untouched"] == dict.fromkeys(
                ("training", "requires_grad", "dtype", "device", "grads", "generation_config", "rng"), True)


def test_one_and_two_ranks_give_identical_results(jobs):
    one, two = reports(jobs[1])[0], reports(jobs[2])[0]
    assert one["with"]["losses"] == two["with"]["losses"]  # the same model at both world sizes
    for e1, e2 in zip(one["with"]["epochs"], two["with"]["epochs"], strict=True):
        assert (Path(e1["save_dir"]) / "test_generations.txt").read_bytes() == \
            (Path(e2["save_dir"]) / "test_generations.txt").read_bytes()
        assert metric_values(e1["metrics"]) == metric_values(e2["metrics"])
        assert (e1["metrics"]["n_gpus"], e2["metrics"]["n_gpus"]) == (1, 2)


def test_a_failing_rank_makes_every_rank_raise(jobs):
    """A model that raises in generate() on one rank: that rank raises it, and the other raises
    that rank's error (rank 0 no longer a timeout for rank 1's missing file). The job's own
    group works afterwards."""
    (last0, first0), (last1, first1) = ((r["fault_last"], r["fault_first"]) for r in reports(jobs[2]))
    assert (last1["raised"], last1["message"]) == ("RuntimeError", "injected failure")
    assert (last0["raised"], last0["message"]) == ("RunFailed", "rank 1 failed: RuntimeError: injected failure")
    assert (first0["raised"], first0["message"]) == ("RuntimeError", "injected failure")
    assert (first1["raised"], first1["message"]) == ("RunFailed", "rank 0 failed: RuntimeError: injected failure")
    assert all(f["all_reduce"] == 2.0 for f in (last0, last1, first0, first1))


def test_trainer_callback_logs_the_command_lines_metrics(tmp_path):
    out = tmp_path / "trainer"
    assert_ok(launch(2, "api_trainer.py", ["--out", str(out), "--n_obs", "9"], tmp_path))
    logged = [h for h in json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
              if "eval_bleu" in h]
    assert [h["step"] for h in logged] == [2]
    cli = tmp_path / "cli"
    assert_ok(single(["--model_name", str(out / "checkpoint-2"), "--data_dir", str(DATA), "--n_obs", "9", "--bs", "4",
                      "--save_dir", str(cli)], cwd=tmp_path))
    assert logged[0]["eval_bleu"] == metrics_of(cli)["bleu"]
    ours = out / "seq2seq_eval" / "step_2"
    assert (ours / "test_generations.txt").read_bytes() == (cli / "test_generations.txt").read_bytes()
    assert metrics_of(ours)["n_gpus"] == 2


# ------------------------------------------------------------------ score and compare over lists


@pytest.mark.parametrize("preds, refs, metrics, expected", [
    (["the cat sat on the mat"], ["the cat sat on the mat"], "bleu", {"bleu": 100.0}),
    (["the cat sat on the mat"], [["a dog"], ["the cat sat on the mat"]], "bleu", {"bleu": 100.0}),  # two streams
    (["testing one two"], ["testing"], "rouge", {"rouge1": 50.0}),  # P=1, R=1/3: F=1/2
])
def test_score_table(preds, refs, metrics, expected):
    got = seq2seq_eval.score(preds, refs, metrics=metrics)
    assert {k: round(got[k], 6) for k in expected} == expected


def test_score_is_the_score_subcommand(tmp_path):
    from seq2seq_eval.cli import score_main

    preds, refs = ["the cat sat", "a dog runs fast"], ["the cat sat on the mat", "a dog runs"]
    (tmp_path / "p.txt").write_text("\n".join(preds) + "\n")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n")
    argv = ["--predictions", str(tmp_path / "p.txt"), "--references", str(tmp_path / "r.txt"), "--metrics", "bleu,chrf"]
    assert seq2seq_eval.score(preds, refs, metrics="bleu,chrf") == score_main(argv)


def test_compare_is_the_compare_subcommand(tmp_path):
    from seq2seq_eval.comparison.command import compare_main

    refs = ["the cat sat on the mat", "a dog runs", "it is red"]
    systems = {"a": ["the cat sat", "a dog runs", "it is blue"], "b": ["the cat sat on the mat", "a dog", "it is red"]}
    for name, lines in systems.items():
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n")
    printed = json.loads(compare_main(["--predictions", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--references",
                                       str(tmp_path / "r.txt"), "--task", "translation", "--n_samples", "200", "--json"]))
    printed.pop("inputs")
    assert seq2seq_eval.compare(systems, refs, n_samples=200) == printed


@pytest.mark.parametrize("call, error, message", [
    (lambda: seq2seq_eval.score(["a"], ["b", "c"]), DataError, "references: 2 entries for 1 predictions"),
    (lambda: seq2seq_eval.score(["a"], ["b"], metrics="blue"), ConfigError, "blue"),
    (lambda: seq2seq_eval.compare({"a": ["x"]}, ["y"], task="poetry"), ConfigError, "poetry"),
    (lambda: seq2seq_eval.evaluate(str(EMBEDDED_MODEL), bs=0), ConfigError, "--bs must be an integer >= 1, got 0"),
    (lambda: seq2seq_eval.evaluate(str(EMBEDDED_MODEL), dry_run=True), ConfigError, "dry_run"),
    (lambda: seq2seq_eval.evaluate(str(EMBEDDED_MODEL), num_beams=2, generate_kwargs={"num_beams": 3}), ConfigError,
     "num_beams given twice"),
    (lambda: seq2seq_eval.evaluate(object(), object()), ConfigError, "must be a torch module"),
])
def test_errors_are_typed_not_exits(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_in_memory_data_errors(tmp_path):
    model = str(EMBEDDED_MODEL)
    with pytest.raises(DataError, match=r"ids\[1\]: duplicated id 7 \(first at ids\[0\]\)"):
        seq2seq_eval.evaluate(model, sources=["a b", "c d"], references=["x", "y"], ids=[7, 7], save_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"references: 1 entries for 2 sources"):
        seq2seq_eval.evaluate(model, sources=["a b", "c d"], references=["x"], save_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="sources replace data_dir"):
        seq2seq_eval.evaluate(model, sources=["a"], references=["x"], data_dir=str(DATA), save_dir=str(tmp_path))
