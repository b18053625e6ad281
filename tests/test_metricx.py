"""MetricX-24/23 (scoring/metricx) against google-research/metricx's own model and input code on a
tiny random MT5ForRegression checkpoint (scripts/make_metricx_fixture.py): per example within
1e-5 of its 25-point scale (float32; bfloat16 as the checkpoint says), the same token ids, at
batch sizes 1 and 8, and lower is better."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import pytest
from conftest import REPO

from seq2seq_eval.errors import ConfigError, ModelError
from seq2seq_eval.scoring import registry

DATA = REPO / "tests" / "data" / "metricx_tiny"
REF = json.loads((DATA / "reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The fixture's checkpoints as the hub holds them: config.json and model.safetensors."""
    out = {}
    for dtype in ("float32", "bfloat16"):
        folder = tmp_path_factory.mktemp(dtype)
        (folder / "config.json").write_bytes((DATA / dtype / "config.json").read_bytes())
        (folder / "model.safetensors").write_bytes(lzma.decompress((DATA / dtype / "model.safetensors.xz").read_bytes()))
        out[dtype] = str(folder)
    return out


def _metric(checkpoints, case, tokenizer="tokenizer"):
    c = REF["cases"][case]
    given = {"metricx_model": checkpoints[c["dtype"]], "metricx_tokenizer": str(DATA / tokenizer),
             "metricx_version": c["version"], "metricx_qe": c["qe"], "metricx_max_length": c["max_length"]}
    resolved = dict(registry.resolve_options(given))
    registry.check("metricx", resolved)
    return registry.load("metricx", resolved)


@pytest.mark.parametrize("case", list(REF["cases"]))
def test_scores_equal_the_official_code(checkpoints, case):
    metric = _metric(checkpoints, case)
    refs = [] if REF["cases"][case]["qe"] else [(r,) for r in REF["ref"]]
    refs = refs or [()] * len(REF["mt"])
    ids, _ = metric._inputs(REF["src"], REF["mt"], refs)
    assert ids == REF["ids"][case]  # the tokenizer's ids, truncation and end token removal
    tolerance = 1e-5 if REF["cases"][case]["dtype"] == "float32" else 0.07  # bf16: half its last bit at 16
    expected = REF["scores"][case]
    # One input per pass (batch size 1, as the official script) and all of them padded together.
    for budget in ((1, 100000) if case == "24" else (100000,)):
        got = metric.score(REF["src"], REF["mt"], refs, max_tokens=budget)
        assert max(abs(a - b) for a, b in zip(got, expected)) <= tolerance, (case, budget)
    assert any(v > 1 for v in expected) and len(set(round(v, 2) for v in expected)) > 8  # a fixture that can fail
    if case == "24":
        # What the ranks do: each planned batch scored alone, in any order, on any rank; the
        # values are the same bits as one process scoring them all (so at any world size).
        from seq2seq_eval.scoring.model_metric import model_batches, score_all

        whole = score_all(metric, REF["src"], REF["mt"], refs, max_tokens=64)
        batches = model_batches(metric.lengths(REF["src"], REF["mt"], refs), 64)
        assert len(batches) > 2
        for members in reversed(batches):
            alone = metric.score([REF["src"][m] for m in members], [REF["mt"][m] for m in members],
                                 [refs[m] for m in members], max_tokens=64)
            assert alone == [whole[m] for m in members]


def test_a_tokenizer_json_alone_gives_the_same_ids(checkpoints):
    full, alone = _metric(checkpoints, "24"), _metric(checkpoints, "24", "tokenizer_json_only")
    refs = [(r,) for r in REF["ref"]]
    assert alone._inputs(REF["src"], REF["mt"], refs)[0] == REF["ids"]["24"]
    assert alone.score(REF["src"], REF["mt"], refs) == full.score(REF["src"], REF["mt"], refs)



def test_a_spiece_model_alone_gives_the_same_ids_or_says_what_it_needs(checkpoints, tmp_path):
    """google/mt5-xl's layout (spiece.model, no tokenizer.json): transformers 5 converts it only
    with protobuf; with it the ids are the reference's, without it one line says so."""
    for name in ("spiece.model", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((DATA / "tokenizer" / name).read_bytes())
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        with pytest.raises(ModelError, match=r"not loaded \(transformers 5 reads a spiece.model alone only with "
                                             r"protobuf installed\); expected"):
            _metric(checkpoints, "24", str(tmp_path))
        return
    metric = _metric(checkpoints, "24", str(tmp_path))
    assert metric._inputs(REF["src"], REF["mt"], [(r,) for r in REF["ref"]])[0] == REF["ids"]["24"]


def test_inputs_direction_and_refusals(checkpoints, tmp_path):
    import seq2seq_eval

    plain = dict(registry.resolve_options({}))
    assert registry.inputs("metricx", plain) == (True, True) and not registry.higher_is_better("metricx")
    assert registry.inputs("metricx", dict(registry.resolve_options({"metricx_qe": True}))) == (True, False)
    assert registry.inputs("metricx", dict(registry.resolve_options({"metricx_version": "23"}))) == (False, True)
    got = seq2seq_eval.score(REF["mt"][:4], None, metrics="metricx", sources=REF["src"][:4], metricx_qe=True,
                             metricx_model=checkpoints["float32"], metricx_tokenizer=str(DATA / "tokenizer"))
    assert got["metricx"] == pytest.approx(sum(REF["scores"]["24_qe"][:4]) / 4, abs=1e-5)
    # compare: the lower error wins, by MetricX's own per-example scores.
    options = {"metricx_model": checkpoints["float32"], "metricx_tokenizer": str(DATA / "tokenizer")}
    scores = REF["scores"]["24"][:8]
    good = REF["mt"][:8]
    worse = [REF["mt"][(i + 1) % 8] for i in range(8)]
    out = seq2seq_eval.compare({"a": worse, "b": good}, REF["ref"][:8], sources=REF["src"][:8], metrics="metricx",
                               n_samples=20, **options)
    low = min(("a", "b"), key=lambda k: out["results"][k]["metricx"]["score"])
    assert out["best"] == {"metricx": low} and out["results"]["b"]["metricx"]["better"] is (low == "b")
    assert out["results"]["b"]["metricx"]["score"] == pytest.approx(sum(scores) / 8, abs=1e-5)
    for value in ("25", 24):  # the number 24 too: the option is a text, as the command line gives it
        with pytest.raises(ConfigError, match=rf"^--metricx_version {value!r}: expected 24 or 23 \(as text: '24', '23'\)$"):
            registry.resolve_options({"metricx_version": value})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelError, match="expected an mT5 regression checkpoint"):
        registry.check("metricx", dict(registry.resolve_options({"metricx_model": str(tmp_path)})))
    # Before any work, the tokenizer too: a folder without one is refused in one line.
    with pytest.raises(ModelError, match=r"^--metricx_tokenizer .*: no tokenizer in .*; expected one of tokenizer.json, "
                                         r"spiece.model \(mT5's, as google/mt5-xl\)$"):
        registry.check("metricx", dict(registry.resolve_options({"metricx_model": checkpoints["float32"],
                                                                 "metricx_tokenizer": str(tmp_path)})))
    # A tokenizer that does not load is found by the checks too, not after generation.
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelError, match=r"^--metricx_tokenizer .*: not loaded \("):
        registry.check("metricx", dict(registry.resolve_options({"metricx_model": checkpoints["float32"],
                                                                 "metricx_tokenizer": str(tmp_path)})))


def test_a_reference_free_run_on_sources_alone_and_the_refusals_beside_it(checkpoints, tmp_path, capsys):
    """A data dir with only test.source, --metrics metricx --metricx_qe: every example's score
    is the metric's own on the run's predictions, no text metric is computed, the highest errors
    rank the lowest-scoring examples; BLEU beside it, or MetricX with references wanted, is
    refused in one line, as --input_path without references is."""
    from conftest import assert_ok, single

    from seq2seq_eval.cli import main
    from seq2seq_eval.config import EvalConfig

    data = tmp_path / "data"
    data.mkdir()
    (data / "test.source").write_text("".join(s + "\n" for s in REF["src"][:3]), encoding="utf-8")
    flags = ["--metricx_model", checkpoints["float32"], "--metricx_tokenizer", str(DATA / "tokenizer")]
    proc = single(["--data_dir", str(data), "--metrics", "metricx", "--metricx_qe", *flags, "--save_dir",
                   str(tmp_path / "out")], tmp_path)
    assert_ok(proc)
    rows = [json.loads(x) for x in (tmp_path / "out" / "test_examples.jsonl").read_text(encoding="utf-8").splitlines()]
    metric = registry.load("metricx", dict(registry.resolve_options({"metricx_qe": True, **dict(zip(
        ["metricx_model", "metricx_tokenizer"], flags[1::2]))})))
    direct = metric.score([r["source"] for r in rows], [r["prediction"] for r in rows], [()] * 3)
    assert [r["metricx"] for r in rows] == pytest.approx(direct, abs=1e-6) and all(r["references"] == [] for r in rows)
    scores = json.loads((tmp_path / "out" / "test_bleu.json").read_text(encoding="utf-8"))
    assert "bleu" not in scores and scores["metricx"] == pytest.approx(sum(direct) / 3, abs=1e-6)
    worst = max(range(3), key=lambda i: direct[i])
    assert re.search(rf"^lowest metricx ids +{worst} \(", proc.stdout, flags=re.M), proc.stdout
    proc = single(["--data_dir", str(data), "--metrics", "metricx,bleu", "--metricx_qe", *flags, "--dry_run",
                   "--save_dir", str(tmp_path / "no")], tmp_path)
    assert proc.returncode != 0 and proc.stderr.strip() == (
        f"seq2seq_eval: error: --metrics metricx,bleu: bleu needs references ({data / 'test.target'}: file not found); "
        "only reference-free metrics run without them (docs/metrics.md#model-metrics)"), proc.stderr
    assert EvalConfig(input_path=str(data / "test.source"), metrics="metricx",
                      metric_options={"metricx_qe": True}).metric_names == ()
    from seq2seq_eval.legacy import build_legacy

    # run_eval.py's form writes SCORE_PATH where the run scores: here without --reference_path.
    assert build_legacy(["m", str(data / "test.source"), str(tmp_path / "o.txt"), "--metrics", "metricx",
                         "--metricx_qe"])[1].score_path is not None
    assert build_legacy(["m", str(data / "test.source"), str(tmp_path / "o.txt")])[1].score_path is None
    with pytest.raises(ConfigError, match=r"^--metrics metricx: metricx needs references \(--input_path without "
                                          r"--reference_path gives none\); only reference-free metrics run without"):
        EvalConfig(input_path=str(data / "test.source"), metrics="metricx")
    (tmp_path / "p").write_text("".join(r["prediction"] + "\n" for r in rows), encoding="utf-8")
    assert main(["score", "--metrics", "metricx", "--metricx_qe", *flags, "--sources", str(data / "test.source"),
                 "--predictions", str(tmp_path / "p")]) == 0
    assert json.loads(capsys.readouterr().out)["metricx"] == pytest.approx(sum(direct) / 3, abs=1e-6)


def test_weights_that_do_not_fit_config_json_are_refused_before_any_work(checkpoints, tmp_path):
    """Read from the files' headers by the checks (a hub checkpoint is GBs: nothing is loaded),
    as safetensors and as a torch file; the load says the same."""
    import torch
    from safetensors.torch import load_file, save_file

    from seq2seq_eval.scoring.metricx import load

    src = Path(checkpoints["float32"])
    config = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    dropped = dict(state)
    del dropped["decoder.final_layer_norm.weight"]
    renamed = {("encoder.blocks.0" + k[len("encoder.block.0"):] if k.startswith("encoder.block.0.") else k): v
               for k, v in state.items()}
    cases = {
        "other sizes": ({**config, "d_ff": 64}, state, r"encoder\.block\.0\.layer\.1\.DenseReluDense\.wi_0\.weight "
                        r"has shape \[32, 16\] where config\.json's sizes give \[64, 16\]"),
        "a tensor missing": (config, dropped, r"missing \['decoder\.final_layer_norm\.weight'\], unexpected \[\]"),
        "other names": (config, renamed, r"missing \['encoder\.block\.0\.layer\.0\.SelfAttention\.q\.weight', .* "
                        r"unexpected \['encoder\.blocks\.0\."),
    }
    for i, (case, (cfg, weights, why)) in enumerate(cases.items()):
        folder = tmp_path / f"c{i}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        if i % 2:
            torch.save(weights, folder / "pytorch_model.bin")
        else:
            save_file(weights, str(folder / "model.safetensors"))
        options = dict(registry.resolve_options({"metricx_model": str(folder), "metricx_tokenizer": str(DATA / "tokenizer")}))
        message = rf"^--metricx_model {folder}: the weights do not match MT5ForRegression of its config\.json's sizes \({why}"
        with pytest.raises(ModelError, match=message):
            registry.check("metricx", options)
        with pytest.raises(ModelError, match=message):
            load(options)
    # A sharded checkpoint whose index names a shard that is not there.
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model-00001-of-00002.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "shared.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    options = dict(registry.resolve_options({"metricx_model": str(folder), "metricx_tokenizer": str(DATA / "tokenizer")}))
    with pytest.raises(ModelError, match=r"model\.safetensors\.index\.json: names model-00002-of-00002\.safetensors, "
                                         r"which is not in .*; expected every shard it names$"):
        registry.check("metricx", options)
