"""Model metrics as plug-ins: each declares itself once (scoring/model_metric.py's ModelMetricSpec)
and the registry (scoring/registry.py) is the only place that names it. Every entry point reads
it from there: the run's, `score`'s and `compare`'s flags, the API's keywords, the config, the
docs' list."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

import seq2seq_eval
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.scoring import registry
from seq2seq_eval.scoring.model_metric import ModelMetricSpec, Option

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
    assert cfg.metric_option("comet_model") == "m" and cfg.metric_option("model_metric_max_tokens") == 7
    legacy, _ = build_legacy(["model", str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), "--comet_model", "m2"])
    assert legacy.metric_option("comet_model") == "m2"
    cfg = _config(None, False, None, None, None, None, {"comet_model": "m3", "num_beams": 2, "bs": 4})
    assert cfg.metric_option("comet_model") == "m3" and cfg.generate_kwargs == (("num_beams", 2),)
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
