"""Model files as a hostile user would give them. No code from a file the tool reads: a torch pickle
(COMET's model.ckpt, a MetricX, BERTScore or generation model's pytorch_model.bin) naming a
function beside its tensors is refused in one line naming it, before any work, and the function
never runs; the containers real checkpoints hold beside tensors still load. Model-metric inputs
checked to fit: every id a tokenizer gives within the model's embeddings, its special ids those
the model was trained with, hparams.yaml's faults in one line, signatures naming what was read."""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import REPO, single

from seq2seq_eval.errors import ModelError

COMET = REPO / "tests" / "data" / "comet_tiny"
TINY = COMET / "wmt22_like"
SAMPLES = json.loads((COMET / "reference_scores.json").read_text(encoding="utf-8"))["samples"]
METRICX = REPO / "tests" / "data" / "metricx_tiny"
BERT = REPO / "tests" / "data" / "bertscore_tiny" / "bert"

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class _System:
    """Unpickled, runs `touch marker` through os.system (pickled as posix.system)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Subprocess(_System):
    def __reduce__(self):
        return subprocess.call, (["touch", str(self.marker)],)


class _Exec(_System):
    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


PAYLOADS = {"posix.system": _System, "subprocess.call": _Subprocess, "builtins.exec": _Exec}


def _with(path: Path, extra: dict, **save) -> None:
    """The torch file at `path` rewritten with `extra`'s entries beside its own."""
    import torch

    saved = torch.load(path, weights_only=False)
    saved.update(extra)
    torch.save(saved, path, **save)


def _comet_copy(tmp_path: Path, name: str = "model") -> Path:
    folder = tmp_path / name
    shutil.copytree(TINY, folder)
    return folder


def _one_line_refusal(text: str, path: Path, global_name: str) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert f"{path}: holds a pickled {global_name}, which is not a tensor" in lines[0], text
    assert "refused: reading it would run code from the file" in lines[0]


@pytest.mark.parametrize("global_name", list(PAYLOADS))
def test_a_comet_checkpoint_that_would_run_code_is_refused_everywhere_and_never_runs(tmp_path, global_name):
    """check() and load(), the run's dry run, a run and `score`: one line naming the global, and
    the payload's marker file never appears."""
    from seq2seq_eval.scoring.comet import check, load

    marker = tmp_path / "ran"
    folder = _comet_copy(tmp_path)
    ckpt = folder / "checkpoints" / "model.ckpt"
    # Hidden in the hyper-parameters, as a value among plain ones.
    _with(ckpt, {"hyper_parameters": {"layer": "mix", "pool": PAYLOADS[global_name](marker)}})
    for step in (check, load):
        with pytest.raises(ModelError) as e:
            step(str(folder))
        _one_line_refusal(str(e.value), ckpt, global_name)
    if global_name != "posix.system":
        assert not marker.exists()
        return  # the command line's ways in, once (each a process: seconds)
    for dry in (["--dry_run"], []):
        proc = single(["--metrics", "bleu,comet", "--comet_model", str(folder), "--n_obs", "8",
                       "--save_dir", str(tmp_path / "out"), *dry], tmp_path)
        assert proc.returncode != 0
        _one_line_refusal(proc.stderr, ckpt, global_name)
        assert not (tmp_path / "out").exists()
    for name in ("src", "pred", "ref"):
        (tmp_path / name).write_text("a b c\n", encoding="utf-8")
    proc = single(["score", "--metrics", "comet", "--comet_model", str(folder), "--predictions", str(tmp_path / "pred"),
                   "--references", str(tmp_path / "ref"), "--sources", str(tmp_path / "src")], tmp_path)
    assert proc.returncode != 0
    _one_line_refusal(proc.stderr, ckpt, global_name)
    assert not marker.exists()


def test_every_shape_of_a_hostile_pickle_is_refused_and_runs_nothing(tmp_path):
    """torch's legacy format, a payload inside an allowed container (a Namespace's attribute), and
    pickle protocol 4 (whose STACK_GLOBAL names its function from the stack)."""
    from seq2seq_eval.scoring.comet import check

    marker = tmp_path / "ran"
    cases = {"legacy format": ({"x": _System(marker)}, {"_use_new_zipfile_serialization": False}, "posix.system"),
             "inside a Namespace": ({"hparams": argparse.Namespace(a=1, b=_Exec(marker))}, {}, "builtins.exec"),
             "protocol 4": ({"x": _Subprocess(marker)}, {"pickle_protocol": 4}, "<a global given by the STACK_GLOBAL op>")}
    for case, (extra, save, name) in cases.items():
        folder = _comet_copy(tmp_path, case.replace(" ", "_"))
        ckpt = folder / "checkpoints" / "model.ckpt"
        _with(ckpt, extra, **save)
        with pytest.raises(ModelError) as e:
            check(str(folder))
        _one_line_refusal(str(e.value), ckpt, name)
    assert not marker.exists()
    # Allowed containers where the tensors should be: one line, not a traceback from their use.
    import torch

    folder = _comet_copy(tmp_path, "odd_state")
    ckpt = folder / "checkpoints" / "model.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    saved["state_dict"]["estimator.ff.0.weight"] = argparse.Namespace(shape=(48, 192))
    torch.save(saved, ckpt)
    with pytest.raises(ModelError) as e:
        check(str(folder))
    assert str(e.value) == f"{ckpt}: state_dict['estimator.ff.0.weight'] is a Namespace; expected a tensor"


def _fake_lightning(monkeypatch) -> type:
    """Lightning's AttributeDict as Lightning defines it, in a module of its real name (Lightning is
    not installed here), so that torch.save pickles it under that name."""
    for name in ("lightning_fabric", "lightning_fabric.utilities", "lightning_fabric.utilities.data"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    class AttributeDict(dict):
        def __getattr__(self, key):
            try:
                return self[key]
            except KeyError as e:
                raise AttributeError(key) from e

        def __setattr__(self, key, value):
            self[key] = value

    AttributeDict.__module__, AttributeDict.__qualname__ = "lightning_fabric.utilities.data", "AttributeDict"
    sys.modules["lightning_fabric.utilities.data"].AttributeDict = AttributeDict
    return AttributeDict


def test_a_checkpoint_with_lightning_s_containers_loads_and_scores_as_before(tmp_path, monkeypatch):
    """Lightning's hyper-parameter dict, an argparse Namespace (older Lightning), numpy scalars and
    dtypes, callback states: read (the zip format and the legacy one), the scores equal the plain
    checkpoint's exactly."""
    import numpy as np

    from seq2seq_eval.scoring.comet import load

    attribute_dict = _fake_lightning(monkeypatch)
    extra = {"hyper_parameters": attribute_dict(layer="mix", hidden_sizes=[48], nr_frozen_epochs=0.3),
             "hparams_name": "kwargs", "module_arguments": argparse.Namespace(batch_size=16, pool="avg"),
             "callbacks": {"ModelCheckpoint{'monitor': 'val_kendall'}": {"best_model_score": np.float64(0.31),
                                                                         "dtype": np.dtype("float32"),
                                                                         "steps": np.int64(12)}},
             "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 2}}}}}
    refs = [(r,) for r in SAMPLES["ref"][:6]]
    before = load(str(TINY)).score(SAMPLES["src"][:6], SAMPLES["mt"][:6], refs)
    for legacy in (False, True):
        folder = _comet_copy(tmp_path, f"lightning_{legacy}")
        _with(folder / "checkpoints" / "model.ckpt", extra, _use_new_zipfile_serialization=not legacy)
        # (Read by name: torch's weights-only reader imports nothing.)
        assert load(str(folder)).score(SAMPLES["src"][:6], SAMPLES["mt"][:6], refs) == before


def test_the_same_rule_for_metricx_weights(tmp_path):
    """A pytorch_model.bin (the hub's MetricX-23 checkpoints' format): one naming a function is
    refused by the checks before any work and by the load, in one line; a plain one scores as
    the safetensors copy does."""
    import torch
    from safetensors.torch import load_file

    from seq2seq_eval.scoring import registry

    marker = tmp_path / "ran"
    source = tmp_path / "safetensors"
    source.mkdir()
    (source / "config.json").write_bytes((METRICX / "float32" / "config.json").read_bytes())
    (source / "model.safetensors").write_bytes(lzma.decompress((METRICX / "float32" / "model.safetensors.xz").read_bytes()))
    state = load_file(str(source / "model.safetensors"))
    for name, extra in (("plain", {}), ("hostile", {"note": _System(marker)})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_bytes((source / "config.json").read_bytes())
        torch.save({**state, **extra}, folder / "pytorch_model.bin")
    given = {"metricx_tokenizer": str(METRICX / "tokenizer"), "metricx_max_length": 64}
    scores = {}
    for name in ("safetensors", "plain"):
        resolved = dict(registry.resolve_options({**given, "metricx_model": str(tmp_path / name)}))
        registry.check("metricx", resolved)
        scores[name] = registry.load("metricx", resolved).score(["a b"], ["c d e"], [("c d",)])
    assert scores["plain"] == scores["safetensors"]
    # Sharded, the function in the second shard.
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_bytes((source / "config.json").read_bytes())
    keys = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": keys[:5], "pytorch_model-00002-of-00002.bin": keys[5:]}
    for i, (shard, names) in enumerate(shards.items()):
        torch.save({**{k: state[k] for k in names}, **({"note": _Subprocess(marker)} if i else {})}, sharded / shard)
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for shard, names in shards.items() for k in names}}), encoding="utf-8")
    for folder, file, name in ((tmp_path / "hostile", "pytorch_model.bin", "posix.system"),
                               (sharded, "pytorch_model-00002-of-00002.bin", "subprocess.call")):
        resolved = dict(registry.resolve_options({**given, "metricx_model": str(folder)}))
        for step in (registry.check, registry.load):
            with pytest.raises(ModelError) as e:
                step("metricx", resolved)
            _one_line_refusal(str(e.value), folder / file, name)
    assert not marker.exists()


def _bin_copy(source: Path, folder: Path, extra: dict) -> Path:
    """A model folder's copy whose weights are a pytorch_model.bin with `extra` beside them."""
    import torch
    from safetensors.torch import load_file

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({**load_file(str(source / "model.safetensors")), **extra}, folder / "pytorch_model.bin")
    return folder


def test_the_same_rule_for_bertscore_and_the_generation_model(tmp_path, tiny_model):
    """transformers reads a pytorch_model.bin with weights_only=True; the tool refuses one naming a
    function first, in one line, by the checks before any work (the dry run's)."""
    from seq2seq_eval.scoring.bertscore import check

    marker = tmp_path / "ran"
    bert = _bin_copy(BERT, tmp_path / "bert", {"x": _System(marker)})
    with pytest.raises(ModelError) as e:
        check({"bertscore_model": str(bert), "bertscore_num_layers": 2, "bertscore_idf": False,
               "bertscore_rescale_with_baseline": False, "bertscore_lang": "en", "bertscore_baseline_path": None})
    _one_line_refusal(str(e.value), bert / "pytorch_model.bin", "posix.system")
    from seq2seq_eval.scoring.bertscore import load  # `score`'s way in: no check first

    with pytest.raises(ModelError) as e:
        load({"bertscore_model": str(bert), "bertscore_num_layers": 2, "bertscore_idf": False,
              "bertscore_rescale_with_baseline": False, "bertscore_lang": "en", "bertscore_baseline_path": None})
    _one_line_refusal(str(e.value), bert / "pytorch_model.bin", "posix.system")
    model = _bin_copy(tiny_model, tmp_path / "model", {"x": _Exec(marker)})
    for engine in ("hf", "ctranslate2"):
        proc = single(["--model_name", str(model), "--engine", engine, "--n_obs", "4", "--save_dir",
                       str(tmp_path / "out"), "--dry_run"], tmp_path)
        assert proc.returncode != 0
        _one_line_refusal(proc.stderr, model / "pytorch_model.bin", "builtins.exec")
    assert not marker.exists()


# --- Inputs that fit -------------------------------------------------------------------------


def _one_line(text: str, *parts: str) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    for part in parts:
        assert part in lines[0], text


@pytest.fixture(scope="module")
def metricx_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("metricx")
    (folder / "config.json").write_bytes((METRICX / "float32" / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(lzma.decompress((METRICX / "float32" / "model.safetensors.xz").read_bytes()))
    return folder


def _metricx_tokenizer(folder: Path, pieces: int | None = None, post_processor: bool = True) -> Path:
    """The fixture's mT5-style tokenizer (tokenizer.json), its vocabulary grown to `pieces` entries
    (each a piece the text `far<i>` gives), or without its post-processor (no end token)."""
    folder.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).write_bytes((METRICX / "tokenizer" / name).read_bytes())
    spec = json.loads((METRICX / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))
    if pieces is not None:
        spec["model"]["vocab"] += [[f"\u2581far{i}", -30.0] for i in range(pieces - len(spec["model"]["vocab"]))]
    if not post_processor:
        # transformers' T5Tokenizer makes its own post-processor: the generic class keeps the file's.
        spec["post_processor"] = None
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return folder


def test_a_metricx_tokenizer_that_does_not_fit_the_model_is_refused_before_any_work(tmp_path, metricx_model):
    """The issue's ids past the vocabulary (255,625 tokens against 250,112 embeddings: an
    IndexError after generation before), an XLM-R tokenizer (pad 1, end 2, `<s>` first: a
    meaningless number before), and one that adds no end token (predict.py removes the last token
    as the end token: a text token was dropped): refused in one line by the checks (the dry run's)
    and by the load (`score`'s)."""
    from seq2seq_eval.api import score
    from seq2seq_eval.scoring import registry

    cases = {
        "past": (_metricx_tokenizer(tmp_path / "past", pieces=255_625),
                 "its ids reach 255624 ('\u2581far255124') (255625 tokens with the added ones), past the model's 250112 embeddings"),
        "xlm-r": (TINY / "tiny-xlmr", f"its pad id is 1 where --metricx_model {metricx_model}'s config.json says 0"),
        "no end": (_metricx_tokenizer(tmp_path / "no_end", post_processor=False),
                   "it frames a text as [3, 12, 3, 499] (the text alone: [3, 12, 3, 499]) where the model's tokenizer gives the "
                   "text's ids then the end token 1"),
    }
    for case, (tokenizer, why) in cases.items():
        given = {"metricx_model": str(metricx_model), "metricx_tokenizer": str(tokenizer)}
        with pytest.raises(ModelError) as e:
            registry.check("metricx", dict(registry.resolve_options(given)))
        _one_line(str(e.value), f"--metricx_tokenizer {tokenizer}: {why}; expected the model's own tokenizer")
        if case == "xlm-r":  # (the big tokenizer is loaded once: seconds)
            with pytest.raises(ModelError, match="its pad id is 1 where"):
                score(["a b"], ["a b"], metrics="metricx", sources=["a"], **given)
    fits = {"metricx_model": str(metricx_model), "metricx_tokenizer": str(METRICX / "tokenizer")}
    registry.check("metricx", dict(registry.resolve_options(fits)))


def _comet_with(tmp_path: Path, name: str, tokens: int = 0, no_start: bool = False, **config) -> Path:
    """The tiny COMET model with `tokens` tokens added to its encoder's tokenizer, or a tokenizer
    that puts no start token ahead of a text, or its encoder's config.json changed."""
    from transformers import AutoTokenizer

    folder = _comet_copy(tmp_path, name)
    encoder = folder / "tiny-xlmr"
    if no_start:
        spec = json.loads((encoder / "tokenizer.json").read_text(encoding="utf-8"))
        spec["post_processor"]["single"] = spec["post_processor"]["single"][1:]
        (encoder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
        # transformers' XLM-R class makes its own post-processor: the generic one keeps the file's.
        spec = json.loads((encoder / "tokenizer_config.json").read_text(encoding="utf-8"))
        spec["tokenizer_class"] = "PreTrainedTokenizerFast"
        (encoder / "tokenizer_config.json").write_text(json.dumps(spec), encoding="utf-8")
    if tokens:
        tok = AutoTokenizer.from_pretrained(str(encoder))
        tok.add_tokens([f"zzadded{i}" for i in range(tokens)])
        tok.save_pretrained(str(encoder))
    if config:
        spec = json.loads((encoder / "config.json").read_text(encoding="utf-8"))
        spec.update(config)
        (encoder / "config.json").write_text(json.dumps(spec), encoding="utf-8")
    return folder


def test_a_comet_encoder_tokenizer_that_does_not_fit_is_refused_everywhere_before_any_work(tmp_path):
    """The issue's 840 ids against 602 embeddings, a config whose pad or end id is not the
    tokenizer's (XLM-R numbers positions from the config's pad id: a wrong number before), a
    tokenizer that puts no start token first (the unified models read the first token's
    embedding): by check() and load(), the dry run and `score`, in one line."""
    from seq2seq_eval.scoring.comet import check, load

    cases = {"past": (_comet_with(tmp_path, "past", tokens=238), "its ids reach 839 ('zzadded237') (840 tokens with "
                      "the added ones), past the model's 602 embeddings"),
             "pad": (_comet_with(tmp_path, "pad", pad_token_id=3), "its pad id is 1 where its config.json says 3"),
             "eos": (_comet_with(tmp_path, "eos", eos_token_id=5), "its eos id is 2 where its config.json says 5"),
             "no start": (_comet_with(tmp_path, "no_start", no_start=True),
                          "it frames a text as [4, 13, 4, 600, 2] (the text alone: [4, 13, 4, 600]) where the model's "
                          "tokenizer gives the start token 0, the text's ids, the end token 2 (XLM-R's)")}
    for name in ("src", "pred", "ref"):
        (tmp_path / name).write_text("a b c\n", encoding="utf-8")
    for case, (folder, why) in cases.items():
        line = f"--comet_model {folder}: the encoder's tokenizer ('{folder / 'tiny-xlmr'}', hparams.yaml's pretrained_model) " \
               f"does not fit its config.json: {why}"
        for step in (check, load):
            with pytest.raises(ModelError) as e:
                step(str(folder))
            _one_line(str(e.value), line)
        if case == "past":
            proc = single(["--metrics", "bleu,comet", "--comet_model", str(folder), "--n_obs", "8",
                           "--save_dir", str(tmp_path / "out"), "--dry_run"], tmp_path)
            assert proc.returncode != 0 and not (tmp_path / "out").exists()
            _one_line(proc.stderr, line)
            proc = single(["score", "--metrics", "comet", "--comet_model", str(folder), "--predictions",
                           str(tmp_path / "pred"), "--references", str(tmp_path / "ref"), "--sources", str(tmp_path / "src")],
                          tmp_path)
            assert proc.returncode != 0
            _one_line(proc.stderr, line)


@pytest.mark.parametrize("text, why", [
    ("# the whole file\nlayer: [mix\n", r"not YAML at line 3, column 1 \(expected ',' or '\]', but got '<stream end>'\)"),
    ("# the whole file\na: 1\n  b: 2\n", r"not YAML at line 3, column 4 \(mapping values are not allowed here\)"),
    ("# the whole file\n- regression_metric\n", r"holds a list; expected a mapping of COMET's hyper-parameters"),
    ("# the whole file\n", r"holds nothing; expected a mapping"),
    ("hidden_sizes: abc\n", r"hidden_sizes is 'abc'; expected a list of positive integers"),
    ("hidden_sizes: [48, 0]\n", r"hidden_sizes is \[48, 0\]; expected a list of positive integers"),
    ("pool: mean\n", r"pool is 'mean'; expected avg, max, cls or default"),
    ("layer: top\n", r"layer is 'top'; expected mix or a layer number"),
    ("layer_norm: 'no'\n", r"layer_norm is 'no'; expected true or false"),
    ("class_identifier: [regression_metric]\n", r"class_identifier is \['regression_metric'\]; expected a class name"),
    ("pretrained_model: 7\n", r"pretrained_model is 7; expected a hub name or a folder"),
])
def test_a_malformed_hparams_yaml_is_one_line_naming_the_file_and_the_place(tmp_path, text, why):
    from seq2seq_eval.scoring.comet import check

    folder = _comet_copy(tmp_path)
    path = folder / "hparams.yaml"
    if text.startswith(("hidden_sizes", "pool", "layer", "class_identifier", "pretrained_model")):
        key = text.split(":")[0]
        text = "".join(line + "\n" for line in path.read_text(encoding="utf-8").splitlines()
                       if not line.startswith((f"{key}:", "- 48", "- 16") if key == "hidden_sizes" else f"{key}:")) + text
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ModelError) as e:
        check(str(folder))
    assert len(str(e.value).splitlines()) == 1
    assert __import__("re").match(rf"--comet_model {folder}: {path}: {why}", str(e.value)), str(e.value)


def test_a_bertscore_tokenizer_that_does_not_fit_the_model_is_refused_before_any_work(tmp_path):
    """Ids past the embeddings (added tokens) and texts cut past the position embeddings."""
    from transformers import AutoTokenizer

    from seq2seq_eval.scoring.bertscore import check, load

    options = {"bertscore_num_layers": 2, "bertscore_idf": False, "bertscore_rescale_with_baseline": False,
               "bertscore_lang": "en", "bertscore_baseline_path": None}
    past = tmp_path / "past"
    shutil.copytree(BERT, past)
    tok = AutoTokenizer.from_pretrained(str(past), use_fast=False)
    tok.add_tokens(["zzadded0", "zzadded1"])
    tok.save_pretrained(str(past))
    long = tmp_path / "long"
    shutil.copytree(BERT, long)
    spec = json.loads((long / "tokenizer_config.json").read_text(encoding="utf-8"))
    spec["model_max_length"] = 100
    (long / "tokenizer_config.json").write_text(json.dumps(spec), encoding="utf-8")
    for folder, why in ((past, "its ids reach 801 ('zzadded1') (802 tokens with the added ones), past the model's 800 "
                               "embeddings"),
                        (long, "texts are cut to its model_max_length 100, whose positions reach 99, past the model's 64 "
                               "position embeddings")):
        for step in (check, lambda o: load(o)):
            with pytest.raises(ModelError) as e:
                step({"bertscore_model": str(folder), **options})
            _one_line(str(e.value), f"--bertscore_model {folder}: its tokenizer does not fit the model: {why}")
    check({"bertscore_model": str(BERT), **options})


def test_signatures_name_only_what_was_read(metricx_model):
    """A metric that read no reference says nothing of references (MetricX-QE said refs:mean,
    CometKiwi says nothing); one that read them says how they combine."""
    from seq2seq_eval.scoring import registry

    cases = {("metricx", True): {"metricx_model": str(metricx_model), "metricx_tokenizer": str(METRICX / "tokenizer"),
                                 "metricx_qe": True},
             ("metricx", False): {"metricx_model": str(metricx_model), "metricx_tokenizer": str(METRICX / "tokenizer")},
             ("comet", True): {"comet_model": str(COMET / "kiwi_like")},
             ("comet", False): {"comet_model": str(TINY)}}
    for (name, reference_free), given in cases.items():
        resolved = dict(registry.resolve_options(given))
        assert registry.reads_references(name, resolved) is not reference_free
        metric = registry.load(name, resolved)
        refs = [()] if reference_free else [("a b",)]
        signature = registry.signature(name, resolved, metric, refs)
        assert ("refs:" in signature) is not reference_free, signature


def test_a_file_fetched_after_the_checks_is_refused_by_transformers_in_one_line(tmp_path, tiny_model, monkeypatch):
    """A hub model's weights are fetched at the load, after the checks scanned what was cached:
    transformers reads them with weights_only=True, and its several lines of advice (one of them
    to run the file's code) become the tool's one line naming the global."""
    import seq2seq_eval.pickles
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.model.settings import load_model
    from seq2seq_eval.scoring.bertscore.encoder import load_model as bertscore_model

    monkeypatch.setattr(seq2seq_eval.pickles, "transformers_weights", lambda name: [])  # as for a hub name not cached
    marker = tmp_path / "ran"
    bert = _bin_copy(BERT, tmp_path / "bert", {"x": _System(marker)})
    with pytest.raises(ModelError) as e:
        bertscore_model(str(bert), 2, "cpu")
    _one_line_refusal(str(e.value), Path(f"--bertscore_model {bert}"), "posix.system")
    model = _bin_copy(tiny_model, tmp_path / "model", {"x": _Exec(marker)})
    with pytest.raises(ModelError) as e:
        load_model(EvalConfig(model_name=str(model)), "cpu")
    _one_line_refusal(str(e.value), Path(f"--model_name {model}"), "exec")
    assert not marker.exists()
