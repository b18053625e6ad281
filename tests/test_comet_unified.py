"""COMET's unified checkpoints (CometKiwi's UnifiedMetric, XCOMET) natively: parity with
unbabel-comet 2.2.7's own `predict` on tiny random checkpoints built with its classes
(scripts/make_comet_fixture.py unified): scores and system scores to 1e-6, error spans equal
(confidences to 1e-6) with and without references, at one and many examples per forward pass;
hparams.yaml's sparsemax_patch read as 2.2.7 reads it; what is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO

from seq2seq_eval.errors import DataError, ModelError

DATA = REPO / "tests" / "data" / "comet_tiny"
REFERENCE = json.loads((DATA / "reference_unified.json").read_text(encoding="utf-8"))
SAMPLES = REFERENCE["samples"]
MODELS = tuple(REFERENCE["models"])  # kiwi_like, unified_spans_like, xcomet_like
TOL = 1e-6


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def loaded():
    from seq2seq_eval.scoring.comet import load

    return {name: load(str(DATA / name)) for name in MODELS}


def _refs(inputs: str) -> list[tuple[str, ...]]:
    return [(r,) for r in SAMPLES["ref"]] if inputs == "with_ref" else [() for _ in SAMPLES["ref"]]


def _split(values):
    """(scores, spans or None) of a metric's per-example values."""
    if isinstance(values[0], tuple):
        return [v[0] for v in values], [v[1] for v in values]
    return list(values), None


def _assert_spans_equal(got, expected):
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert [{k: v for k, v in s.items() if k != "confidence"} for s in mine] == \
               [{k: v for k, v in s.items() if k != "confidence"} for s in theirs]
        assert all(abs(a["confidence"] - b["confidence"]) <= TOL for a, b in zip(mine, theirs))


@pytest.mark.parametrize("inputs", ["with_ref", "no_ref"])
@pytest.mark.parametrize("name", MODELS)
def test_equal_to_unbabel_comet_predict(loaded, monkeypatch, name, inputs):
    import torch

    from seq2seq_eval.scoring.comet import spans
    from seq2seq_eval.scoring.model_metric import score_all

    expected = REFERENCE["models"][name][inputs]
    seen = []
    decode = spans.decode
    monkeypatch.setattr(spans, "decode", lambda probs, *a: seen.append(probs) or decode(probs, *a))
    metric = loaded[name]
    scores, found = _split(score_all(metric, SAMPLES["src"], SAMPLES["mt"], _refs(inputs)))
    assert max(abs(a - b) for a, b in zip(scores, expected["scores"])) <= TOL
    assert abs(metric.aggregate(scores) - expected["system_score"]) <= TOL
    assert max(expected["scores"]) - min(expected["scores"]) > 1e-3  # the scores move with the input
    if expected["error_spans"] is None:
        assert found is None and not seen
        return
    _assert_spans_equal(found, expected["error_spans"])
    # Each token's label is clear: the spans do not rest on float32 ties.
    top2 = torch.cat([torch.topk(p, 2, dim=-1).values for p in seen])
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-4
    # The quirks decode() has are exercised: spans holding special tokens, spans at several
    # severities, a span open at the translation's end (dropped), an empty translation.
    texts = [s["text"] for example in found for s in example]
    assert len({s["severity"] for example in found for s in example}) >= 2
    if name == "xcomet_like":
        assert any("<s>" in t or "</s>" in t for t in texts)
    names = metric.network.labels
    assert any(names[int(p[-1].argmax())] != "O" for p in seen)


def test_batch_sizes_do_not_change_values(loaded):
    """One example per forward pass and all in one: the same spans, scores within 1e-6."""
    from seq2seq_eval.scoring.model_metric import score_all

    metric = loaded["xcomet_like"]
    refs = _refs("with_ref")
    one = metric.score(SAMPLES["src"], SAMPLES["mt"], refs, max_tokens=1)
    many = score_all(metric, SAMPLES["src"], SAMPLES["mt"], refs, max_tokens=100_000)
    assert max(abs(a[0] - b[0]) for a, b in zip(one, many)) <= TOL
    _assert_spans_equal([a[1] for a in one], [b[1] for b in many])


def test_long_inputs_are_cut_as_unbabel_comet_cuts_them(loaded):
    """Each segment is cut to the encoder's positions less 4 with its special tokens; the joined
    input to the positions less 2 (its end token then goes). The fixture's long examples are
    among those the parity above checks."""
    metric = loaded["xcomet_like"]
    rows, mt = metric._inputs(SAMPLES["src"], SAMPLES["mt"], _refs("with_ref"))
    assert metric.max_positions == 128
    assert max(len(ids) for ids in mt["input_ids"]) == 126
    cut = [r for example in rows for r in example if len(r) == 128]
    assert cut and any(r[-1] != metric.tokenizer.sep_token_id for r in cut)
    assert all(len(r) <= 128 for example in rows for r in example)


def _copy(tmp_path, name, **hparams):
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    text = (folder / "hparams.yaml").read_text(encoding="utf-8")
    for key, value in hparams.items():
        text = "\n".join(line for line in text.splitlines() if not line.startswith(f"{key}:")) + f"\n{key}: {value}\n"
    (folder / "hparams.yaml").write_text(text, encoding="utf-8")
    return folder


def test_sparsemax_patch_means_softmax(loaded, tmp_path):
    """xcomet_like's hparams.yaml says sparsemax_patch (as the hub's XCOMET ones do) and its
    reference numbers are 2.2.7's: softmax. Read as sparsemax, the scores move."""
    from seq2seq_eval.scoring.comet import load

    assert loaded["xcomet_like"].network.layerwise_attention.transformation == "softmax"
    sparse = load(str(_copy(tmp_path, "xcomet_like", layer_transformation="sparsemax")))
    assert sparse.network.layerwise_attention.transformation == "sparsemax"
    refs = _refs("with_ref")[:6]
    a = [v[0] for v in loaded["xcomet_like"].score(SAMPLES["src"][:6], SAMPLES["mt"][:6], refs)]
    b = [v[0] for v in sparse.score(SAMPLES["src"][:6], SAMPLES["mt"][:6], refs)]
    assert max(abs(x - y) for x, y in zip(a, b)) > 1e-4


def test_xcomet_reads_one_reference_per_example(loaded):
    with pytest.raises(DataError, match="one reference per example; the example at position 1 has 2") as e:
        loaded["xcomet_like"].lengths(["a", "b"], ["a", "b"], [("a",), ("b", "c")])
    assert "\n" not in str(e.value)
    # CometKiwi reads no reference: any number is fine, and they change nothing.
    kiwi = loaded["kiwi_like"]
    assert kiwi.score(["a b"], ["c d"], [("x", "y")]) == kiwi.score(["a b"], ["c d"], [()])


@pytest.mark.parametrize("hparams, message", [
    ({"class_identifier": "referenceless_regression_metric"}, "COMET-QE.*not supported"),
    ({"class_identifier": "ranking_metric"}, "ranking model.*not supported"),
    ({"class_identifier": "something_else"}, "unknown class_identifier 'something_else'"),
    ({"encoder_model": "BERT"}, "encoder_model 'BERT' is not supported"),
    ({"word_layer": 9}, "word_layer 9: expected 'mix' or a layer in 0..3"),
])
def test_refused_in_one_line(tmp_path, hparams, message):
    """By loading, and before any work by the checks (which read no weights)."""
    from seq2seq_eval.scoring.comet import check, load

    folder = str(_copy(tmp_path, "xcomet_like", **hparams))
    for call in (load, check):
        with pytest.raises(ModelError, match=message) as e:
            call(folder)
        assert "\n" not in str(e.value)


def test_an_encoder_without_its_tokenizer_is_refused_before_any_work(tmp_path):
    from seq2seq_eval.scoring.comet import check

    folder = _copy(tmp_path, "kiwi_like")
    encoder = next(p for p in folder.iterdir() if p.is_dir() and p.name != "checkpoints")
    shutil.rmtree(encoder)
    with pytest.raises(ModelError, match="the encoder's config and tokenizer .* were not found"):
        check(str(folder))


XCOMET_RUN = ["--metrics", "comet,bleu", "--comet_model", str(DATA / "xcomet_like"), "--n_obs", "24", "--bs", "8",
              "--model_metric_max_tokens", "1"]  # one example per scored batch: 24 batches to kill in the middle of


def _files(save_dir):
    metric = json.loads((save_dir / "test_bleu.json").read_text())
    return {"examples": (save_dir / "test_examples.jsonl").read_bytes(),
            "generations": (save_dir / "test_generations.txt").read_bytes(),
            "scores": json.dumps({k: v for k, v in metric.items() if k.startswith(("comet", "bleu"))}).encode()}


def test_xcomet_on_the_ranks_writes_its_spans_per_example(loaded, tmp_path):
    """The run writes `comet` and `comet_error_spans` per example (the spans as predict()'s
    metadata.error_spans), the metric file the system score and no spans; a run killed while it
    scores XCOMET and resumed writes the bytes 3 ranks write, with the values of one process
    scoring the run's pairs directly."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import _env, assert_ok, run_ranks, single

    from seq2seq_eval.scoring.model_metric import score_all

    one, three = tmp_path / "one", tmp_path / "three"
    assert_ok(run_ranks(3, [*XCOMET_RUN, "--save_dir", str(three)], tmp_path))
    journal = tmp_path / "one_tmp" / "model_scores_rank_0.jsonl"
    args = [*XCOMET_RUN, "--save_dir", str(one)]
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_eval", *args], cwd=tmp_path, env=_env(None),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (journal.exists() and journal.read_bytes().count(b"\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, "XCOMET scoring never started"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    kept = journal.read_bytes().count(b"\n")
    assert 1 <= kept < 24, "the kill came after XCOMET scoring ended"
    assert_ok(single([*args, "--resume"], tmp_path))
    assert _files(one) == _files(three)
    rows = [json.loads(line) for line in (one / "test_examples.jsonl").read_text().splitlines()]
    metric = json.loads((one / "test_bleu.json").read_text())
    assert "comet_error_spans" not in metric and "comet" in metric
    assert metric["throughput"]["model_metrics"]["comet"]["resumed_batches"] == kept
    direct = score_all(loaded["xcomet_like"], [r["source"] for r in rows], [r["prediction"] for r in rows],
                       [tuple(r["references"]) for r in rows], max_tokens=1)
    assert [r["comet"] for r in rows] == [v[0] for v in direct]
    assert [r["comet_error_spans"] for r in rows] == [v[1] for v in direct]
    assert any(r["comet_error_spans"] for r in rows)
    assert list(rows[0]["comet_error_spans"][0]) == ["text", "confidence", "severity", "start", "end"]


def test_reference_free_classes_in_score_and_compare_without_references(tmp_path, capsys):
    """`score` and `compare` with no --references: CometKiwi's system score and XCOMET's are the
    fixture's no-reference ones, XCOMET's signature says it had none (refs:all with them); a
    metric that needs references beside them, or XCOMET given two streams, is refused in one line."""
    from seq2seq_eval.cli import main

    files = {"src": SAMPLES["src"], "pred": SAMPLES["mt"], "ref": SAMPLES["ref"], "other": SAMPLES["mt"][1:] + SAMPLES["mt"][:1],
             "ref2": SAMPLES["ref"][1:] + SAMPLES["ref"][:1]}
    for name, lines in files.items():
        (tmp_path / name).write_text("".join(x.replace("\n", " ") + "\n" for x in lines), encoding="utf-8")
    base = ["--sources", str(tmp_path / "src")]
    scored = {}
    for name, refs in (("kiwi_like", []), ("xcomet_like", []), ("xcomet_like", ["--references", str(tmp_path / "ref")])):
        assert main(["score", "--metrics", "comet", "--predictions", str(tmp_path / "pred"), *base, "--comet_model",
                     str(DATA / name), *refs]) == 0
        got = json.loads(capsys.readouterr().out)
        expected = REFERENCE["models"][name]["with_ref" if refs else "no_ref"]["system_score"]
        assert abs(got["comet"] - expected) <= TOL
        scored[name, bool(refs)] = got["comet_signature"]
    assert "refs:" not in scored["kiwi_like", False]
    assert "|refs:none|" in scored["xcomet_like", False] and "|refs:all|" in scored["xcomet_like", True]
    compare = ["compare", "--task", "translation", "--predictions", str(tmp_path / "other"), str(tmp_path / "pred"),
               *base, "--n_samples", "20", "--json"]
    assert main([*compare, "--metrics", "comet", "--comet_model", str(DATA / "xcomet_like")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["results"]["pred"]["comet"]["score"] - REFERENCE["models"]["xcomet_like"]["no_ref"]["system_score"]) <= TOL
    assert out["signatures"]["comet"].startswith(scored["xcomet_like", False]) and out["n_references"] == 0
    two = ["--references", str(tmp_path / "ref"), str(tmp_path / "ref2")]
    for argv, said in (
            (["score", "--metrics", "comet,bleu", "--predictions", str(tmp_path / "pred"), *base], "bleu needs references"),
            ([*compare, "--metrics", "comet,chrf"], "chrf needs references (pass --references; a prediction is a bare file)"),
            ([*compare, "--metrics", "comet", *two], "reads at most 1 reference per example, and --references gives 2")):
        assert main([*argv, "--comet_model", str(DATA / "xcomet_like" if "comet," not in argv[2] else DATA / "kiwi_like")]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("name, reads, references, records", [
    ("wmt22_like", (True, True), (True, None), ()), ("kiwi_like", (True, False), (False, None), ()),
    ("unified_spans_like", (True, False), (True, 1), ("comet_error_spans",)),
    ("xcomet_like", (True, False), (True, 1), ("comet_error_spans",)),
])
def test_what_comet_reads_and_writes_follows_the_checkpoint_s_class(name, reads, references, records):
    """(sources, needs references), (reads references where there are any, the most per example), records."""
    from seq2seq_eval.scoring import registry

    options = dict(registry.resolve_options({"comet_model": str(DATA / name)}))
    assert tuple(registry.inputs("comet", options)) == reads
    spec = registry.get("comet")
    assert (registry.reads_references("comet", options), spec.most_references(registry.own_options(spec, options))) == references
    assert registry.value_keys("comet", options) == ("comet",)
    assert registry.record_keys("comet", options) == records


def test_xcomet_xxl_is_refused_on_a_40_gb_gpu():
    """XCOMET-XXL's encoder (facebook/xlm-roberta-xxl's published config), counted on the meta
    device: its float32 weights exceed an A100-40GB's memory (as cudaGetDeviceProperties gives
    it), so the run stops in one line before any work, where unbabel-comet runs out of memory."""
    from transformers import XLMRobertaXLConfig

    from seq2seq_eval.scoring.comet import refuse_oversized, weights_bytes

    config = XLMRobertaXLConfig(vocab_size=250880, hidden_size=4096, num_hidden_layers=48, num_attention_heads=32,
                                intermediate_size=16384, max_position_embeddings=514)
    hparams = {"class_identifier": "xcomet_metric", "encoder_model": "XLM-RoBERTa-XL", "hidden_sizes": [3072, 1024],
               "word_layer": 48}
    needed = weights_bytes(hparams, config)
    assert 10.6e9 < needed / 4 < 10.8e9  # XLM-R-XXL's 10.7B parameters, and the heads
    a100_40gb = 42_297_524_224
    with pytest.raises(ModelError, match=r"float32 weights take 39\.\d GiB, more than the 39\.4 GiB") as e:
        refuse_oversized("Unbabel/XCOMET-XXL", needed, a100_40gb, "A100-SXM4-40GB has in all")
    assert "\n" not in str(e.value)
    refuse_oversized("Unbabel/XCOMET-XXL", needed, 80 * 2**30, "H100 has in all")  # fits an 80 GB one


def test_layers_above_the_highest_one_read_are_never_run(tmp_path, monkeypatch):
    """kiwi_like with its top layer's mix weight made 0 by sparsemax: that layer is dropped, and
    the scores are those of the whole encoder."""
    import torch

    from seq2seq_eval.scoring.comet import load
    from seq2seq_eval.scoring.comet.unified import UnifiedNetwork

    folder = _copy(tmp_path, "kiwi_like")
    ckpt = folder / "checkpoints" / "model.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    saved["state_dict"]["layerwise_attention.scalar_parameters.3"] = torch.tensor([-0.9])
    torch.save(saved, ckpt)
    dropped = load(str(folder))
    assert len(dropped.network.encoder.model.encoder.layer) == 2
    monkeypatch.setattr(UnifiedNetwork, "drop_unused_layers", lambda self: 3)
    whole = load(str(folder))
    assert len(whole.network.encoder.model.encoder.layer) == 3
    refs = _refs("no_ref")
    assert dropped.score(SAMPLES["src"], SAMPLES["mt"], refs) == whole.score(SAMPLES["src"], SAMPLES["mt"], refs)
    # The tagger's layer stays, whatever the mix weighs: unified_spans_like tags from layer 2.
    folder = _copy(tmp_path, "unified_spans_like")
    ckpt = folder / "checkpoints" / "model.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    for k in (1, 2, 3):  # the mix weighs layer 0 (the embeddings) alone
        saved["state_dict"][f"layerwise_attention.scalar_parameters.{k}"] = torch.tensor([-5.0])
    torch.save(saved, ckpt)
    whole = load(str(folder))
    monkeypatch.undo()
    tagged = load(str(folder))
    assert len(tagged.network.encoder.model.encoder.layer) == 2
    refs = _refs("with_ref")[:8]
    assert tagged.score(SAMPLES["src"][:8], SAMPLES["mt"][:8], refs) == whole.score(SAMPLES["src"][:8], SAMPLES["mt"][:8], refs)
    # XLM-R-XL keeps every layer (its last output alone is layer-normed).
    assert load(str(DATA / "xcomet_like")).network.drop_unused_layers() == 3


@pytest.mark.parametrize("name", ["wmt22_like", "xcomet_like"])
def test_loading_draws_no_random_weights_and_maps_the_checkpoint(name, monkeypatch):
    """Every parameter is the checkpoint's, so no initializer runs (unbabel-comet's random
    initialization of XLM-R-XL takes a minute on a CPU); the checkpoint is mapped, not read
    whole beside the network; the buffers the constructors make (position ids) are intact."""
    import torch

    from seq2seq_eval.scoring.comet import load

    calls, maps = [], []
    for fn in ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "trunc_normal_"):
        original = getattr(torch.nn.init, fn)
        monkeypatch.setattr(torch.nn.init, fn, lambda *a, _f=original, _n=fn, **k: calls.append(_n) or _f(*a, **k))
    torch_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: maps.append(k.get("mmap")) or torch_load(*a, **k))
    network = load(str(DATA / name)).network
    assert calls == [] and maps == [True]
    state = torch_load(DATA / name / "checkpoints" / "model.ckpt", weights_only=False)["state_dict"]
    params = dict(network.named_parameters())
    assert params and all(torch.equal(p, state[k]) for k, p in params.items())
    embeddings = network.encoder.model.embeddings
    assert torch.equal(embeddings.position_ids[0], torch.arange(embeddings.position_ids.shape[1]))
    assert not embeddings.token_type_ids.any()
    # The initializers themselves are left as they were.
    torch.nn.init.zeros_(torch.empty(2))
    assert calls == ["zeros_"]


def test_xcomet_in_a_run_on_references_some_examples_have(loaded, tmp_path, capsys):
    """A run of XCOMET alone on JSON Lines whose examples have a reference or none: each
    example's value and spans are those of the model scoring the run's pairs with the same
    inputs (three inputs, or its [mt, src] fallback), and the signature says 2 of 4 had one, as
    compare's of the run folder does; a text metric beside it there, and two reference streams in
    the dry run, are refused."""
    from seq2seq_eval.cli import main
    from seq2seq_eval.scoring.model_metric import score_all

    rows = [{"source": s, **({"target": r} if i % 2 else {})} for i, (s, r) in
            enumerate(zip(SAMPLES["src"][:4], SAMPLES["ref"][:4]))]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    args = ["--metrics", "comet", "--comet_model", str(DATA / "xcomet_like"), "--save_dir", str(out)]
    assert main(["--data_dir", str(data), *args]) == 0
    capsys.readouterr()  # the run's summary
    got = [json.loads(line) for line in (out / "test_examples.jsonl").read_text().splitlines()]
    direct = score_all(loaded["xcomet_like"], [r["source"] for r in got], [r["prediction"] for r in got],
                       [tuple(r["references"]) for r in got])
    assert [len(r["references"]) for r in got] == [0, 1, 0, 1]
    assert [(r["comet"], r["comet_error_spans"]) for r in got] == [tuple(v) for v in direct]
    signature = json.loads((out / "test_bleu.json").read_text())["comet_signature"]
    assert "|refs:2/4|" in signature
    # compare reads the run folder's references as they are: XCOMET on the same inputs, a text
    # metric refused where examples have none.
    other = tmp_path / "other.txt"
    other.write_text("".join(r["source"] + "\n" for r in got), encoding="utf-8")
    compare = ["compare", "--predictions", str(out), str(other), "--n_samples", "10", "--json", *args[:4]]
    assert main(compare) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["signatures"]["comet"].startswith(signature + "|bs:10")
    assert abs(result["results"]["out"]["comet"]["score"] - json.loads((out / "test_bleu.json").read_text())["comet"]) < 1e-9
    assert main([*compare[:-4], "--metrics", "comet,bleu", *args[2:4]]) == 2
    assert f"bleu needs references (pass --references; 2 of 4 examples of {out} have none)" in capsys.readouterr().err
    data.write_text("".join(json.dumps({**r, "target": [r.get("target", "x"), "y"]}) + "\n" for r in rows),
                    encoding="utf-8")
    assert main(["--data_dir", str(data), *args[:-1], str(tmp_path / "no"), "--dry_run"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "reads at most 1 reference per example, and the data has 2 for an example; give at most 1")


def test_a_model_not_found_is_named_before_what_it_would_read(tmp_path):
    """What a COMET model that cannot be read reads is unknown: the run, score and compare say
    it is not found, not that references (or sources) are missing."""
    import seq2seq_eval
    from seq2seq_eval.config import EvalConfig

    src = tmp_path / "src.txt"
    src.write_text("a b\n", encoding="utf-8")
    nope = str(tmp_path / "nope")
    for call in (lambda: EvalConfig(input_path=str(src), metrics="comet", metric_options={"comet_model": nope}),
                 lambda: seq2seq_eval.score(["a"], None, metrics="comet", comet_model=nope),
                 lambda: seq2seq_eval.compare({"a": ["a"], "b": ["b"]}, None, metrics="comet", comet_model=nope)):
        with pytest.raises(ModelError, match=rf"^--comet_model {nope}: no such folder$"):
            call()
