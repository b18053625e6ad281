"""Model metrics as plug-ins: each declares itself once (scoring/model_metric.py's ModelMetricSpec)
and the registry (scoring/registry.py) is the only place that names it. Every entry point reads
it from there: the run's, `score`'s and `compare`'s flags, the API's keywords, the config, the
docs' list."""

from __future__ import annotations

import math
import re

import pytest
from conftest import REPO

import seq2seq_eval
from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import ConfigError, ModelError
from seq2seq_eval.scoring import registry
from seq2seq_eval.scoring.model_metric import ModelMetric, ModelMetricSpec, Option

DOCS = REPO / "docs" / "metrics.md"


def _flags(parser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def test_the_docs_list_every_metric_and_every_option():
    from seq2seq_eval.scoring.names import accepted_metric_names

    text = DOCS.read_text(encoding="utf-8")
    table = re.findall(r"^\| `([a-z0-9+]+)` +\|", text, flags=re.M)
    assert table == list(accepted_metric_names())
    for option in registry.options():
        for name in (option.name, *option.aliases):
            assert f"--{name}" in text, name


def test_every_option_is_a_flag_of_the_run_score_and_compare(monkeypatch, capsys):
    from seq2seq_eval.cli import main
    from seq2seq_eval.comparison.command import build_parser as compare_parser
    from seq2seq_eval.options import build_parser

    wanted = {f"--{n}" for o in registry.options() for n in (o.name, *o.aliases)}
    assert wanted <= _flags(build_parser())
    assert wanted <= _flags(compare_parser())
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    shown = capsys.readouterr().out
    assert all(flag in shown for flag in wanted)


def test_options_reach_the_config_from_every_entry_point(tmp_path):
    from seq2seq_eval.api import _config
    from seq2seq_eval.cli import build_config
    from seq2seq_eval.legacy import build_legacy

    cfg = build_config(["--metrics", "bleu,comet", "--comet-model", "m", "--comet_max_tokens", "7"])
    assert dict(cfg.metric_options)["comet_model"] == "m" and dict(cfg.metric_options)["model_metric_max_tokens"] == 7
    legacy, _ = build_legacy(["model", str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), "--reference_path",
                              str(tmp_path / "ref.txt"), "--metrics", "bleu,comet", "--comet_model", "m2"])
    assert dict(legacy.metric_options)["comet_model"] == "m2"
    cfg = _config(None, False, None, None, None, None, {"metrics": "comet", "comet_model": "m3", "num_beams": 2, "bs": 4})
    assert dict(cfg.metric_options)["comet_model"] == "m3" and cfg.generate_kwargs == (("num_beams", 2),)
    # Every option, given or not, is in the config (the provenance records what was used).
    assert [k for k, _ in cfg.metric_options] == [o.name for o in registry.options()]
    assert cfg.to_dict()["metric_options"]["model_metric_max_tokens"] is None


@pytest.mark.parametrize("call, message", [
    (lambda: seq2seq_eval.score(["a"], ["a"], comet_modle="x"), "score(): unknown model-metric option 'comet_modle'"),
    (lambda: seq2seq_eval.compare({"a": ["a"], "b": ["b"]}, ["a"], comet_max_tokens=0),
     "compare(): --comet_max_tokens 0: expected an integer >= 1"),
    (lambda: seq2seq_eval.score(["a"], ["a"], comet_max_tokens=4, model_metric_max_tokens=4),
     "score(): --model_metric_max_tokens is given twice (as model_metric_max_tokens, comet_max_tokens)"),
    (lambda: seq2seq_eval.score(["a"], ["a"], comet_model=3), "score(): --comet_model 3: expected a text"),
    (lambda: seq2seq_eval.evaluate(metric_options={"comet_model": "x"}), "evaluate(): metric_options: pass each"),
    (lambda: seq2seq_eval.evaluate(model_metric_max_tokens=True), "--model_metric_max_tokens True: expected an integer"),
])
def test_a_wrong_option_is_one_typed_line(call, message):
    with pytest.raises(ConfigError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("call, message", [
    (lambda: EvalConfig(metrics="bleu,comet", metric_options={"bertscore_idf": True}),
     "--bertscore_idf applies to --metrics bertscore, which --metrics 'bleu,comet' does not name; add it there"),
    (lambda: EvalConfig(metric_options={"comet_max_tokens": 64}),
     "--model_metric_max_tokens applies to the model metrics (comet, bertscore, metricx), none of which the task's default "
     "metric names"),
    (lambda: EvalConfig(num_return_sequences=2, generate_kwargs=(("num_beams", 2),), metric_options={"comet_model": "x"}),
     "--comet_model applies to --metrics comet, which the task's default metric does not name"),
    (lambda: seq2seq_eval.score(["a"], ["a"], metrics="chrf", bertscore_model="x"),
     "--bertscore_model applies to --metrics bertscore, which metrics='chrf' does not name"),
    (lambda: seq2seq_eval.compare({"a": ["a"], "b": ["b"]}, ["a"], model_metric_max_tokens=8),
     "--model_metric_max_tokens applies to the model metrics"),
])
def test_an_option_that_would_change_nothing_is_refused(call, message):
    """A model metric's option for a metric --metrics does not name (or the shared budget with no
    model metric) would be silently ignored: it is refused in one line, as other options that
    cannot apply are; its default, given or not, is no option set."""
    with pytest.raises(ConfigError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert EvalConfig(metrics="bleu", metric_options={"comet_model": "Unbabel/wmt22-comet-da", "bertscore_idf": False})


def test_compare_subcommand_refuses_an_option_for_a_metric_it_does_not_compute(tmp_path, capsys):
    from seq2seq_eval.cli import main

    for name in ("a", "b", "r"):
        (tmp_path / name).write_text("x y\n")
    assert main(["compare", "--task", "translation", "--metrics", "bleu", "--predictions", str(tmp_path / "a"),
                 str(tmp_path / "b"), "--references", str(tmp_path / "r"), "--bertscore_idf"]) == 2
    assert capsys.readouterr().err.strip() == ("seq2seq_eval: error: --bertscore_idf applies to --metrics bertscore, "
                                               "which --metrics 'bleu' does not name; add it there, or leave out "
                                               "--bertscore_idf")


def _spec(name: str, *options: Option, keys: tuple[str, ...] = ()) -> ModelMetricSpec:
    return ModelMetricSpec(name=name, what="", load=lambda o, d: None, check=lambda o: None, options=options, keys=keys)


@pytest.mark.parametrize("spec, message", [
    (_spec("bleu"), "metric name 'bleu' is taken"),
    (_spec("comet"), "metric name 'comet' is taken"),
    (_spec("Big"), "metric name 'Big' is taken or not lower-case"),
    (_spec("new", Option("comet_model", "", "")), "option 'comet_model': expected a new name new_<what>"),
    (_spec("new", Option("new_model", "", ""), Option("new_model", "", "")), "option 'new_model': expected a new name"),
    (_spec("new", Option("new_thing", "", "", aliases=("comet_max_tokens",))), "option 'comet_max_tokens'"),
    (_spec("new", keys=("new_p", "new")), "keys ('new_p', 'new'): expected distinct keys, 'new' first"),
    (_spec("new", keys=("new", "bleu")), "keys ('new', 'bleu')"),
])
def test_a_registration_that_would_clash_is_refused(spec, message, monkeypatch):
    monkeypatch.setattr(registry, "_registered", registry.specs())
    with pytest.raises(ConfigError, match=re.escape(message)):
        registry.register(spec)
    assert spec.name not in registry.names() or spec.name == "comet"


def test_a_metric_gets_its_own_options_only(monkeypatch):
    seen = {}
    spec = _spec("mine", Option("mine_model", "m", ""))
    spec = ModelMetricSpec(name="mine", what="", load=lambda o, d: seen.setdefault("load", o),
                           check=lambda o: seen.setdefault("check", o), options=spec.options)
    monkeypatch.setattr(registry, "_registered", registry.specs())
    registry.register(spec)
    resolved = dict(registry.resolve_options({"comet_model": "c", "mine_model": "x"}))
    registry.check("mine", resolved)
    registry.load("mine", resolved)
    assert seen == {"check": {"mine_model": "x"}, "load": {"mine_model": "x"}}


# --- the ranks' model-metric phase, whoever finishes first ------------------------------------

COMET_TINY = REPO / "tests" / "data" / "comet_tiny" / "wmt22_like"

LATE_RANK = '''
"""The tool, with rank 1's model-metric phase held (at its start, or once it has read the rank
files) until rank 0 has scored every batch (it takes them all: stealing) and written the outputs."""
import sys, time
from pathlib import Path

import seq2seq_eval.run.runner as runner
from seq2seq_eval.cli import main

import seq2seq_eval.run.model_scores as model_scores


def wait_for_rank_0(tmp_dir):
    deadline = time.monotonic() + 120
    # rank0.done: rank 0 wrote the outputs; no manifest: it removed the temp dir already.
    while (Path(tmp_dir) / "manifest.json").exists() and not (Path(tmp_dir) / "rank0.done").exists():
        if time.monotonic() > deadline:
            raise SystemExit("rank 0 never finished without rank 1")
        time.sleep(0.01)
    time.sleep(1.0)  # and whatever rank 0 does next, it has done


def delayed(module, name, before):
    real = getattr(module, name)

    def call(cfg, env, prep, tmp_dir, *args, **kwargs):
        if env.rank == 1 and before:
            wait_for_rank_0(tmp_dir)
        out = real(cfg, env, prep, tmp_dir, *args, **kwargs)
        if env.rank == 1 and not before:
            wait_for_rank_0(tmp_dir)
        return out

    setattr(module, name, call)


if sys.argv[1] == "start":  # before the phase
    delayed(runner, "score_model_metrics", before=True)
else:  # once it has read the rank files (the predictions)
    delayed(model_scores, "_predictions", before=False)
sys.exit(main(sys.argv[2:]))
'''


@pytest.mark.parametrize("held", ["start", "after_reading"])
def test_a_rank_whose_scoring_comes_after_rank_0_has_finished_every_batch(tmp_path, held):
    """Rank 0 scores every model-metric batch (taking rank 1's) and writes the outputs before
    rank 1 starts its model-metric phase (or goes on with it once it has read the rank files):
    rank 1 still finds the files it reads, has nothing left to score and leaves; rank 0 removes
    the temp dir after it, and the run passes."""
    import json

    from conftest import assert_ok, run_ranks

    script = tmp_path / "late_rank.py"
    script.write_text(LATE_RANK, encoding="utf-8")
    out = tmp_path / "out"
    args = ["--metrics", "bleu,comet", "--comet_model", str(COMET_TINY), "--n_obs", "12", "--bs", "4",
            "--comet_max_tokens", "40", "--sync_timeout", "30", "--save_dir", str(out)]
    proc = run_ranks(2, [held, *args], tmp_path, script=script)
    assert_ok(proc)
    stats = json.loads((out / "test_bleu.json").read_text())["throughput"]["model_metrics"]["comet"]
    assert stats["rank0_scored_batches"] == stats["batches"] > stats["rank0_planned_batches"], stats
    assert not (tmp_path / "out_tmp").exists()  # nothing left behind, by either rank
    rows = [json.loads(line) for line in (out / "test_examples.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(isinstance(r["comet"], float) for r in rows)


def test_rank_0_waits_for_a_rank_present_in_the_temp_dir_and_not_for_a_dead_one(tmp_path):
    import signal
    import subprocess
    import sys

    from seq2seq_eval.run.presence import Presence, wait_for_ranks_to_leave

    held = Presence(tmp_path, 1)  # a lock taken on another open file: it conflicts within one process too
    assert wait_for_ranks_to_leave(tmp_path, 3, 0.2) == [1]  # rank 2 never came: not waited for
    held.release()
    assert wait_for_ranks_to_leave(tmp_path, 3, 5) == []
    code = ("import sys, time; from pathlib import Path; from seq2seq_eval.run.presence import Presence; "
            f"p = Presence(Path({str(tmp_path)!r}), 2); print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        assert wait_for_ranks_to_leave(tmp_path, 3, 0.2) == [2]
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert wait_for_ranks_to_leave(tmp_path, 3, 5) == []  # the kernel dropped the dead rank's lock
    finally:
        child.kill()
        child.wait()


def test_rank_0_cleaning_up_between_a_rank_s_open_and_flock_of_its_lock_is_done_not_gone(tmp_path, monkeypatch):
    """A rank that opens run.lock just before rank 0 removes it and releases the lock would get
    the lock: the file it holds is no longer linked, so rank 0 finished; it is not reported as
    gone, and nothing is written into the folder."""
    import os

    from seq2seq_eval.run import tmpdir

    (tmp_path / tmpdir.LOCK).write_bytes(b"")
    real_open = os.open

    def open_then_cleaned_up(path, flags, *args):
        fd = real_open(path, flags, *args)
        if str(path).endswith(tmpdir.LOCK):
            os.unlink(path)  # rank 0's cleanup, then its lock released
        return fd

    monkeypatch.setattr(os, "open", open_then_cleaned_up)
    assert tmpdir.main_rank_state(tmp_path) == "done"
    assert list(tmp_path.iterdir()) == []


# --- a model metric defined here, through every entry point, with no change to the package ----


class ToyMetric(ModelMetric):
    """A model metric of this file's own: each example's prediction words found in its closest
    reference, weighted by each word's rarity among all references (a corpus statistic, taken
    in `prepare` on every rank, as BERTScore's idf), times --toy_scale; and its word count."""

    name = "toy"

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.rarity: dict[str, float] = {}

    @property
    def signature(self) -> str:
        return f"toy|scale:{self.scale:g}"

    def prepare(self, sources, predictions, references) -> None:
        docs = [set(r.split()) for refs in references for r in refs]
        self.rarity = {w: 1 / sum(w in d for d in docs) for d in docs for w in d}

    def lengths(self, sources, predictions, references) -> list[int]:
        return [max(len(p.split()), *(len(r.split()) for r in refs)) + 2 for p, refs in zip(predictions, references)]

    def score(self, sources, predictions, references, max_tokens=None) -> list[tuple[float, float]]:
        out = []
        for p, refs in zip(predictions, references):
            words = p.split()
            found = max(sum(self.rarity.get(w, 0.0) for w in words if w in r.split()) for r in refs)
            out.append((self.scale * found / max(1, len(words)), float(len(words))))
        return out


def _toy_check(options):
    if options["toy_scale"] == 13:
        raise ModelError("--toy_scale 13: the toy model refuses it")


TOY = ModelMetricSpec(
    name="toy", what="a test's own", load=lambda options, device: ToyMetric(options["toy_scale"]), check=_toy_check,
    options=(Option("toy_scale", 1.0, "the toy's factor", kind=float, valid=lambda v: v > 0, expected="a number > 0"),),
    keys=("toy", "toy_words"), decimals=3)

TOY_MAIN = f'''
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
from test_model_metrics import TOY  # defined in the test file
from seq2seq_eval.scoring.registry import register

register(TOY)
from seq2seq_eval.cli import main

sys.exit(main(sys.argv[1:]))
'''


@pytest.fixture
def toy(monkeypatch):
    """TOY registered in this process for one test, as a script registers it before the tool."""
    monkeypatch.setattr(registry, "_registered", registry.specs())
    registry.register(TOY)
    return TOY


def _direct(rows, scale=1.0):
    metric = ToyMetric(scale)
    refs = [tuple(r["references"]) for r in rows]
    metric.prepare([], [r["prediction"] for r in rows], refs)
    return metric.score([], [r["prediction"] for r in rows], refs)


def test_a_metric_of_one_s_own_through_the_run_on_1_and_2_ranks_score_and_compare(tmp_path):
    import json

    from conftest import assert_ok, run_ranks, single

    main = tmp_path / "toy_main.py"
    main.write_text(TOY_MAIN, encoding="utf-8")
    run = ["--metrics", "bleu,toy", "--toy_scale", "2", "--n_obs", "20", "--bs", "4", "--model_metric_max_tokens", "16"]
    one = single([*run, "--save_dir", str(tmp_path / "one")], tmp_path, script=main)
    assert_ok(one)
    assert "toy_words" in one.stdout and re.search(r"^toy +\d", one.stdout, flags=re.M)  # the summary
    metric = json.loads((tmp_path / "one" / "test_bleu.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "one" / "test_examples.jsonl").read_text().splitlines()]
    direct = _direct(rows, 2.0)
    assert [(r["toy"], r["toy_words"]) for r in rows] == direct
    assert metric["toy"] == math.fsum(v for v, _ in direct) / 20 and metric["toy_signature"] == "toy|scale:2"
    assert metric["toy_words"] == math.fsum(w for _, w in direct) / 20 and "bleu" in metric
    assert metric["throughput"]["model_metrics"]["toy"]["options"] == {"toy_scale": 2.0}
    assert metric["throughput"]["model_metrics"]["toy"]["batches"] > 2  # batches enough to share
    two = run_ranks(2, [*run, "--save_dir", str(tmp_path / "two")], tmp_path, script=main)
    assert_ok(two)
    for name in ("test_examples.jsonl", "test_generations.txt"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert {k: v for k, v in json.loads((tmp_path / "two" / "test_bleu.json").read_text()).items() if "toy" in k} == \
        {k: v for k, v in metric.items() if "toy" in k}
    # The run's refusals: the option's check before any work, and the metric's own check.
    for value, said in (("0", "--toy_scale 0.0: expected a number > 0"), ("13", "the toy model refuses it")):
        proc = single([*run[:2], "--toy_scale", value, "--dry_run", "--save_dir", str(tmp_path / "no")], tmp_path,
                      script=main)
        assert proc.returncode != 0 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # score and compare over files: the same values, the option taken by both.
    for name, key in (("pred", "prediction"), ("ref", "references"), ("other", "references")):
        lines = [r[key][0] if key == "references" else r[key] for r in rows]
        lines = lines[1:] + lines[:1] if name == "other" else lines
        (tmp_path / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    scored = single(["score", "--metrics", "toy", "--toy-scale", "2", "--predictions", str(tmp_path / "pred"),
                     "--references", str(tmp_path / "ref")], tmp_path, script=main)
    assert_ok(scored)
    assert json.loads(scored.stdout) == {k: v for k, v in metric.items() if k.startswith("toy") and k != "toy_signature"} | \
        {"toy_signature": "toy|scale:2"}
    compared = single(["compare", "--task", "translation", "--metrics", "bleu", "toy", "--toy_scale", "2", "--n_samples",
                       "50", "--predictions", str(tmp_path / "pred"), str(tmp_path / "other"), "--references",
                       str(tmp_path / "ref")], tmp_path, script=main)
    assert_ok(compared)
    line = next(x for x in compared.stdout.splitlines() if x.startswith("pred") and " toy " in x)
    assert f"{metric['toy']:.3f}" in line  # the metric's own decimals


def test_a_metric_of_one_s_own_in_score_compare_and_evaluate(toy, tmp_path):
    from seq2seq_eval.config import EMBEDDED_MODEL

    preds, refs = ["the cat sat", "a dog ran off", "hello"], [["the cat sat down", "cat sat"], ["a dog ran"], ["bye"]]
    got = seq2seq_eval.score(preds, refs, metrics="toy", toy_scale=3)
    metric = ToyMetric(3.0)
    metric.prepare([], preds, refs)
    values = metric.score([], preds, refs)
    assert got == {"toy": math.fsum(v for v, _ in values) / 3, "toy_words": 8 / 3, "toy_signature": "toy|scale:3"}
    comparison = seq2seq_eval.compare({"a": preds, "b": ["x", "y", "z"]}, refs, metrics="toy", n_samples=20, toy_scale=3,
                                      reference_layout="examples")
    assert comparison["results"]["a"]["toy"]["score"] == got["toy"] and comparison["results"]["b"]["toy"]["score"] == 0
    result = seq2seq_eval.evaluate(str(EMBEDDED_MODEL), sources=["Hello world.", "The cat sat on the mat."],
                                   references=["Hallo Welt.", "Die Katze saß auf der Matte."], metrics="bleu,toy",
                                   toy_scale=0.5, save_dir=str(tmp_path / "out"), return_examples=True)
    rows = result.examples
    assert [(r["toy"], r["toy_words"]) for r in rows] == _direct(rows, 0.5)
    assert result.metrics["toy_signature"] == "toy|scale:0.5" and "bleu" in result.metrics
