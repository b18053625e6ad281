"""MetricX-24/23 (scoring/metricx) against google-research/metricx's own model and input code on a
tiny random MT5ForRegression checkpoint (scripts/make_metricx_fixture.py): per example within
1e-5 of its 25-point scale (float32; bfloat16 as the checkpoint says), the same token ids, at
batch sizes 1 and 8, and lower is better."""

from __future__ import annotations

import json
import lzma

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


def test_a_tokenizer_json_alone_gives_the_same_ids(checkpoints):
    full, alone = _metric(checkpoints, "24"), _metric(checkpoints, "24", "tokenizer_json_only")
    refs = [(r,) for r in REF["ref"]]
    assert alone._inputs(REF["src"], REF["mt"], refs)[0] == REF["ids"]["24"]
    assert alone.score(REF["src"], REF["mt"], refs) == full.score(REF["src"], REF["mt"], refs)


def test_inputs_direction_and_refusals(checkpoints, tmp_path):
    import seq2seq_eval

    plain = dict(registry.resolve_options({}))
    assert registry.inputs("metricx", plain) == (True, True) and not registry.higher_is_better("metricx")
    assert registry.inputs("metricx", dict(registry.resolve_options({"metricx_qe": True}))) == (True, False)
    assert registry.inputs("metricx", dict(registry.resolve_options({"metricx_version": "23"}))) == (False, True)
    got = seq2seq_eval.score(REF["mt"][:4], None, metrics="metricx", sources=REF["src"][:4], metricx_qe=True,
                             metricx_model=checkpoints["float32"], metricx_tokenizer=str(DATA / "tokenizer"))
    assert got["metricx"] == pytest.approx(sum(REF["scores"]["24_qe"][:4]) / 4, abs=1e-5)
    with pytest.raises(ConfigError, match=r"^--metricx_version '25': expected 24 or 23$"):
        registry.resolve_options({"metricx_version": "25"})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelError, match="expected an mT5 regression checkpoint"):
        registry.check("metricx", dict(registry.resolve_options({"metricx_model": str(tmp_path)})))
