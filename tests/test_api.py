"""The Python API: evaluate() inside a DDP training job on 2 gloo ranks (CPU), the Trainer
callback, and score()/compare() over lists, each against the command line on the same input."""

from __future__ import annotations

import json
import re
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
    # The engine's own failure is one typed line naming the batch and the engine's reason, and the
    # other rank raises it as that rank's, of its type.
    engine = re.compile(r"batch \d+ \(example ids .*\): the engine failed \(RuntimeError: injected failure\); the "
                        r"batches journaled before it are kept: .*--resume goes on")
    assert last1["raised"] == "RunFailed" and engine.fullmatch(last1["message"]), last1
    assert last0["raised"] == "RunFailed" and last0["message"] == f"rank 1: {last1['message']}", last0
    assert first0["raised"] == "RunFailed" and engine.fullmatch(first0["message"]), first0
    assert first1["raised"] == "RunFailed" and first1["message"] == f"rank 0: {first0['message']}", first1
    assert all(f["all_reduce"] == 2.0 for f in (last0, last1, first0, first1))


def test_trainer_callback_scores_belong_to_the_weights(tmp_path):
    """A Seq2SeqTrainer whose translations get worse at each step: load_best_model_at_end loads an
    earlier checkpoint, and trainer.evaluate() then gives the command line's scores on that
    checkpoint (not the last evaluation's), under the prefix it was called with (each name's data
    declared); weights loaded by hand give their own checkpoint's scores."""
    out = tmp_path / "trainer"
    assert_ok(launch(2, "api_trainer.py", ["--out", str(out), "--n_obs", "9"], tmp_path))
    history = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    logged = {h["step"]: h["eval_bleu"] for h in history if "eval_bleu" in h}
    assert sorted(logged) == [2, 4, 6]
    after = json.loads((out / "after.json").read_text())
    best = Path(after["best"]).name
    assert best != "checkpoint-6" and logged[int(best.split("-")[1])] > logged[6], (best, logged)
    cli = tmp_path / "cli"
    assert_ok(single(["--model_name", str(out / best), "--data_dir", str(DATA), "--type_path", "val", "--n_obs", "9",
                      "--bs", "4", "--save_dir", str(cli / "val")], cwd=tmp_path))
    val = metrics_of(cli / "val", "val_bleu.json")["bleu"]
    assert after["evaluate"]["eval_bleu"] == val != logged[6]
    assert after["evaluate_test"]["test_bleu"] == val  # "test" is declared as val's files
    assert not any(k.startswith("eval_") for k in after["evaluate_test"])  # test_loss beside test_bleu
    by_hand = after["by_hand"]
    assert by_hand["evaluate"]["eval_bleu"] == logged[int(by_hand["checkpoint"].split("-")[1])]
    ours = out / "seq2seq_eval" / "eval" / f"step_{best.split('-')[1]}"
    assert (ours / "val_generations.txt").read_bytes() == (cli / "val" / "val_generations.txt").read_bytes()
    assert metrics_of(ours, "val_bleu.json")["n_gpus"] == 2


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


def test_a_model_objects_evaluation_leaves_a_command_lines_run_alone(tmp_path):
    """evaluate() with a model object removes a failed earlier evaluation of a model object from
    its tmp_dir, but not a command line's run kept there (it can still be resumed): that is
    refused in one line, and every file of it is left as it was."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from seq2seq_eval.errors import EvalError

    save, tmp = tmp_path / "out", tmp_path / "out_tmp"
    assert_ok(single(["--model_name", str(EMBEDDED_MODEL), "--data_dir", str(DATA), "--n_obs", "3", "--debug",
                      "--save_dir", str(save)], cwd=tmp_path))  # --debug keeps the temp dir and its manifest
    before = {f: f.read_bytes() for f in tmp.rglob("*") if f.is_file()}
    assert tmp / "manifest.json" in before
    model = AutoModelForSeq2SeqLM.from_pretrained(EMBEDDED_MODEL)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL)
    with pytest.raises(EvalError, match=r"out_tmp: holds an earlier run of .* that is not a model object's"):
        seq2seq_eval.evaluate(model, tokenizer=tok, data_dir=str(DATA), n_obs=3, save_dir=str(tmp_path / "api"),
                              tmp_dir=str(tmp))
    assert {f: f.read_bytes() for f in tmp.rglob("*") if f.is_file()} == before


def test_callback_reuses_a_result_only_for_the_same_weights_data_and_options(tmp_path, monkeypatch, caplog):
    """The callback's cache, in-process with evaluate() recorded: a result is reused for the same
    weights and data (another step, another name with the same data), never for other weights,
    other data file contents, other in-memory examples or other options; a second set of weights
    at one step gets its own folder."""
    import logging
    import types

    import torch
    from transformers import AutoTokenizer

    from seq2seq_eval import callback as cb
    from seq2seq_eval.api import EvalResult

    runs: list[str] = []

    def recorded(model, tokenizer, *, save_dir, **options):
        runs.append(Path(save_dir).name)
        return EvalResult(metrics={"bleu": float(len(runs)), "n_obs": 1})

    monkeypatch.setattr(cb, "evaluate", recorded)
    data = tmp_path / "d.jsonl"
    data.write_text('{"source": "a", "target": "b"}\n', encoding="utf-8")
    model, tokenizer = torch.nn.Linear(3, 2), AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL))
    from seq2seq_eval.trainer_view import Rows

    held = [{"input_ids": [1]}]  # the Trainer's rows the declared data is of
    state = types.SimpleNamespace(global_step=0)
    handler = types.SimpleNamespace(eval_dataloader=None)

    def loop(dataloader, description, metric_key_prefix="eval"):  # what Trainer.evaluation_loop does, in short
        handler.eval_dataloader = dataloader
        return types.SimpleNamespace(metrics={f"{metric_key_prefix}_loss": 1.0, f"{metric_key_prefix}_bleu": 50.0})

    trainer = types.SimpleNamespace(  # what the callback reads of a Trainer
        model=model, processing_class=tokenizer, state=state, callback_handler=handler,
        args=types.SimpleNamespace(output_dir=str(tmp_path), world_size=1), evaluation_loop=loop)
    callback = cb.EvalCallback(trainer, data={"eval_other": {"data_dir": str(data)}}, data_dir=str(data), bs=4)

    def evaluation(step: int, name: str = "eval", dataset=held) -> dict:
        state.global_step = step
        return callback.scores(name, Rows(dataset=dataset))

    assert evaluation(2) == {"eval_bleu": 1.0} and runs == ["step_2"]
    assert evaluation(2, "eval_other") == {"eval_other_bleu": 1.0} and runs == ["step_2"]  # the same data
    assert evaluation(2, "test") == {} and runs == ["step_2"]  # no data for "test": no score
    first = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight[0, 0] = torch.nextafter(model.weight[0, 0], torch.tensor(2.0))  # one bit of one weight
    assert evaluation(4)["eval_bleu"] == 2.0 and runs == ["step_2", "step_4"]
    model.load_state_dict(first)  # the step-2 weights again, at a later step (load_best_model_at_end)
    assert evaluation(6, "eval_other") == {"eval_other_bleu": 1.0} and len(runs) == 2
    with torch.no_grad():
        model.bias.add_(1.0)
    assert evaluation(6)["eval_bleu"] == 3.0
    with torch.no_grad():
        model.bias.add_(1.0)
    assert evaluation(6)["eval_bleu"] == 4.0  # other weights at the same step: another folder
    assert runs[2:] == ["step_6", "step_6_2"]
    data.write_text('{"source": "a", "target": "c d"}\n', encoding="utf-8")  # the data changed (and its size)
    assert evaluation(8)["eval_bleu"] == 5.0
    callback.options["bs"] = 8  # the options changed
    assert evaluation(8)["eval_bleu"] == 6.0
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(num_beams=1)  # generate()'s defaults are read there
    assert evaluation(10)["eval_bleu"] == 7.0
    model.generation_config = GenerationConfig(num_beams=2)
    assert evaluation(10)["eval_bleu"] == 8.0
    model.generation_config = GenerationConfig(num_beams=1)
    assert evaluation(12)["eval_bleu"] == 7.0 and len(runs) == 8
    rows = [{"source": "a", "target": "b"}]  # a dataset that carries its examples
    assert evaluation(12, "test", rows) == {"test_bleu": 9.0}
    assert evaluation(14, "test", [{"source": "a", "target": "b"}]) == {"test_bleu": 9.0}  # equal examples
    assert evaluation(14, "test", [{"source": "a", "target": "x"}]) == {"test_bleu": 10.0}
    assert evaluation(14, "eval")["eval_bleu"] == 7.0  # declared data, of the rows first evaluated as "eval"
    assert evaluation(14, "eval", rows) == {"eval_bleu": 9.0}  # other rows: their own examples
    assert evaluation(14, "eval", [{"source": "a", "target": "x"}]) == {"eval_bleu": 10.0}
    assert evaluation(14, "eval", [{"input_ids": [1]}]) == {} and len(runs) == 10
    # Through the Trainer's loop: a compute_metrics score of the same name is replaced, with one warning.
    loader = torch.utils.data.DataLoader(held)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        outputs = [trainer.evaluation_loop(loader, "Evaluation", metric_key_prefix=n) for n in ("eval", "eval", "x")]
    assert [o.metrics for o in outputs] == \
        [{"eval_loss": 1.0, "eval_bleu": 7.0}] * 2 + [{"x_loss": 1.0, "x_bleu": 50.0}]
    assert caplog.text.count("eval_bleu: the Trainer's compute_metrics gives it too") == 1
