"""BERTScore natively on transformers: parity with bert-score 0.3.13's own `score()` on a tiny
BERT-style and a tiny RoBERTa-style encoder (scripts/make_bertscore_fixture.py made them and
their scores; a live test runs bert-score itself where it is installed), its options and
refusals, and `--metrics bertscore` on the ranks: identical at 1 rank of 2 threads and at 2 and 3
ranks of 1 thread, through `score` and `compare`. (A run stopped at each step of its BERTScore
phase and resumed without rescoring what was journaled: tests/test_transaction.py.)"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, assert_ok, run_ranks, single

from seq2seq_eval.errors import ConfigError

DATA = REPO / "tests" / "data" / "bertscore_tiny"
REFERENCE = json.loads((DATA / "reference_scores.json").read_text(encoding="utf-8"))
SAMPLES = REFERENCE["samples"]
LAYERS = REFERENCE["layers"]


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _options(**given):
    from seq2seq_eval.scoring.bertscore import METRIC

    return {o.name: o.default for o in METRIC.options} | given


def _load(kind: str, **given):
    from seq2seq_eval.scoring.bertscore import load

    return load(_options(bertscore_model=str(DATA / kind), bertscore_num_layers=LAYERS, **given))


def _refs(name: str) -> list[tuple[str, ...]]:
    return [(r,) for r in SAMPLES["ref"]] if name == "ref" else list(zip(SAMPLES["ref"], SAMPLES["ref2"]))


def _worst(got, expected) -> float:
    return max(max(abs(f - ef), abs(p - ep), abs(r - er))
               for (f, p, r), ef, ep, er in zip(got, expected["F"], expected["P"], expected["R"]))


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("idf", [False, True])
@pytest.mark.parametrize("refs", ["ref", "two"])
def test_scores_equal_bert_score(kind, idf, refs):
    """Per example P, R and F1 within 1e-5 of bert-score's (its batches of 8 texts against the
    tool's token budgets: two of them), and the system score (the mean F1) within 1e-6."""
    from seq2seq_eval.scoring.model_metric import score_all

    metric = _load(kind, bertscore_idf=idf)
    expected = REFERENCE["scores"][f"{kind}|idf={idf}|{refs}"]
    for budget in (40, 4096):
        got = score_all(metric, SAMPLES["mt"], SAMPLES["mt"], _refs(refs), max_tokens=budget)
        assert _worst(got, expected) < 1e-5
        assert abs(metric.aggregate([f for f, _, _ in got]) - math.fsum(expected["F"]) / len(got)) < 1e-6
    assert max(expected["F"]) - min(expected["F"]) > 0.05  # the tiny encoders tell the candidates apart
    if idf:  # the weights are not all alike: idf changes the scores
        assert REFERENCE["scores"][f"{kind}|idf=False|{refs}"]["F"] != pytest.approx(expected["F"], abs=1e-4)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_rescaled_with_a_baseline_file_equals_bert_score(kind):
    from seq2seq_eval.scoring.model_metric import score_all

    metric = _load(kind, bertscore_idf=True, bertscore_rescale_with_baseline=True,
                   bertscore_baseline_path=str(DATA / "baseline.tsv"))
    got = score_all(metric, SAMPLES["mt"], SAMPLES["mt"], _refs("two"))
    assert _worst(got, REFERENCE["scores"][f"{kind}|idf=True|two|rescaled"]) < 1e-5
    assert metric.signature.startswith(f"{DATA / kind}_L{LAYERS}_idf_version=0.3.13(hug_trans=")
    assert "-custom-rescaled|baseline:P=0.35,R=0.38,F=0.365|refs:max|seq2seq_eval:" in metric.signature


def _side_python() -> str | None:
    """A python with bert-score 0.3.13: this one, $BERTSCORE_PYTHON, or the side environment
    scripts/make_bertscore_fixture.py describes."""
    import importlib.util

    if importlib.util.find_spec("bert_score") is not None:
        return sys.executable
    for python in (os.environ.get("BERTSCORE_PYTHON"), "/work/venv-bertscore/bin/python"):
        if python and Path(python).exists() and subprocess.run([python, "-c", "import bert_score"],
                                                               capture_output=True).returncode == 0:
            return python
    return None


def test_live_parity_with_bert_score_itself():
    """bert-score run now, where it is installed: its scores are still those of the fixture, and
    the tool's equal them; its layer table is the tool's."""
    python = _side_python()
    if python is None:
        pytest.skip("bert-score 0.3.13 is not installed here (scripts/make_bertscore_fixture.py: the side environment)")
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_bertscore_fixture import side_scores
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from seq2seq_eval.scoring.bertscore.layers import MODEL_LAYERS
    from seq2seq_eval.scoring.model_metric import score_all

    live = side_scores(python, DATA, SAMPLES)
    assert live["versions"]["bert-score"] == "0.3.13"
    for key, expected in live["scores"].items():
        kind, idf, refs = key.split("|")[:3]
        given = {"bertscore_idf": idf == "idf=True"}
        if key.endswith("rescaled"):
            given.update(bertscore_rescale_with_baseline=True, bertscore_baseline_path=str(DATA / "baseline.tsv"))
        got = score_all(_load(kind, **given), SAMPLES["mt"], SAMPLES["mt"], _refs(refs))
        assert _worst(got, expected) < 1e-5, key
        for k in "PRF":
            assert expected[k] == pytest.approx(REFERENCE["scores"][key][k], abs=1e-6), key
    table = subprocess.run([python, "-c", "import json; from bert_score.utils import model2layers as t; print(json.dumps(t))"],
                           capture_output=True, text=True, check=True)
    assert json.loads(table.stdout) == MODEL_LAYERS


LIVE = r"""
import json, sys
import torch
from bert_score import score

torch.set_num_threads(1)
folder, layers, data = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
p, r, f = score(data["mt"], data["refs"], model_type=folder, num_layers=layers, idf=True, batch_size=8, nthreads=0,
                device="cpu")
print(json.dumps({"P": p.tolist(), "R": r.tolist(), "F": f.tolist()}))
"""


@pytest.fixture(scope="module")
def encoder_decoders(tmp_path_factory) -> dict[str, Path]:
    """A tiny random BART (its encoder's `layers`) and T5 (T5EncoderModel's `encoder.block`, taken
    as bert-score takes it: by "t5" in the name), 3 encoder layers each, on the fixture's tokenizers."""
    import torch
    from transformers import AutoTokenizer, BartConfig, BartModel, T5Config, T5Model

    root = tmp_path_factory.mktemp("encoder_decoders")
    torch.manual_seed(3)
    out = {}
    for name, tokenizer in (("tiny-bart", "roberta"), ("tiny-t5", "bert")):
        folder = root / name
        shutil.copytree(DATA / tokenizer, folder, ignore=shutil.ignore_patterns("config.json", "model.safetensors"))
        tok = AutoTokenizer.from_pretrained(str(folder))
        if name == "tiny-bart":
            model = BartModel(BartConfig(vocab_size=len(tok), d_model=32, encoder_layers=3, decoder_layers=1,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, init_std=0.1))
        else:
            model = T5Model(T5Config(vocab_size=len(tok), d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=3,
                                     num_decoder_layers=1, pad_token_id=tok.pad_token_id, decoder_start_token_id=0))
        model.save_pretrained(str(folder))
        out[name] = folder
    return out


def test_encoder_decoder_models_score_with_their_encoder_cut_as_bert_score_cuts_it(encoder_decoders):
    from seq2seq_eval.scoring.model_metric import score_all

    refs = _refs("two")
    python = _side_python()
    for name, folder in encoder_decoders.items():
        metric = _load_folder(folder, 2)
        layers = metric.model.layers if name == "tiny-bart" else metric.model.encoder.block
        assert len(layers) == 2 and not hasattr(metric.model, "decoder")
        got = score_all(metric, SAMPLES["mt"], SAMPLES["mt"], refs)
        assert got[0] == pytest.approx((1.0, 1.0, 1.0), abs=1e-6)  # the prediction is its reference
        assert max(f for f, _, _ in got) - min(f for f, _, _ in got) > 0.01
        if python is not None:  # bert-score itself, where it is installed
            data = {"mt": SAMPLES["mt"], "refs": [list(r) for r in refs]}
            proc = subprocess.run([python, "-c", LIVE, str(folder), "2", json.dumps(data)], capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert _worst(got, json.loads(proc.stdout.strip().splitlines()[-1])) < 1e-5, name


def _load_folder(folder: Path, layers: int):
    from seq2seq_eval.scoring.bertscore import load

    return load(_options(bertscore_model=str(folder), bertscore_num_layers=layers, bertscore_idf=True))


def test_a_tokenizer_without_model_max_length_is_refused(tmp_path):
    from seq2seq_eval.errors import ModelError

    folder = tmp_path / "bert"
    shutil.copytree(DATA / "bert", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["model_max_length"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    from seq2seq_eval.scoring import registry

    for call in (lambda: _load_folder(folder, 2),  # by loading, and before any work by the checks
                 lambda: registry.check("bertscore", dict(registry.resolve_options(
                     {"bertscore_model": str(folder), "bertscore_num_layers": 2})))):
        with pytest.raises(ModelError, match=r"its tokenizer sets no model_max_length, which bert-score truncates"):
            call()


def test_weights_that_do_not_fit_the_config_are_refused_before_any_work(tmp_path):
    """Built on the meta device by the checks (transformers reads the checkpoint's names and
    shapes) and by the load, in one line: a tensor of another shape, or one the encoder reads that
    the checkpoint lacks (transformers would initialise it at random); a checkpoint without the
    pooler, which is not read, scores."""
    from safetensors.torch import load_file, save_file

    from seq2seq_eval.errors import ModelError
    from seq2seq_eval.scoring import registry

    state = load_file(str(DATA / "bert" / "model.safetensors"))
    cases = {
        "wider": (lambda c: {**c, "intermediate_size": 2 * c["intermediate_size"]}, state,
                  r"the weights do not fit its config\.json \(encoder\.layer\.0\.intermediate\.dense\.bias has another "
                  r"shape: \[64\] against \[128\]; 12 tensor\(s\) in all\)$"),
        "missing": (lambda c: c, {k: v for k, v in state.items() if k != "encoder.layer.1.output.dense.weight"},
                    r"the weights do not fit its config\.json \(missing \['encoder\.layer\.1\.output\.dense\.weight'\]: "
                    r"they would be initialised at random\)$"),
        "no pooler": (lambda c: c, {k: v for k, v in state.items() if not k.startswith("pooler.")}, None),
    }
    for case, (config, weights, why) in cases.items():
        folder = tmp_path / case.replace(" ", "_")
        shutil.copytree(DATA / "bert", folder)
        (folder / "config.json").write_text(json.dumps(config(json.loads((folder / "config.json").read_text()))))
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        steps = (lambda: _load_folder(folder, 2), lambda: registry.check("bertscore", dict(registry.resolve_options(
            {"bertscore_model": str(folder), "bertscore_num_layers": 2}))))
        for step in steps:
            if why is None:
                step()
                continue
            with pytest.raises(ModelError, match=rf"^--bertscore_model {folder}: {why}"):
                step()


def test_an_empty_prediction_scores_0():
    """bert-score 0.3.13 fails on one under transformers 5 (build_inputs_with_special_tokens is
    gone); under transformers 4 it scored P = R = F = 0, as the tool does."""
    metric = _load("roberta")
    got = metric.score(["", "", ""], ["", "  ", SAMPLES["ref"][0]], [(SAMPLES["ref"][0],)] * 3)
    assert got[:2] == [(0.0, 0.0, 0.0)] * 2 and got[2] == pytest.approx((1.0, 1.0, 1.0), abs=1e-6)


def test_the_layer_comes_from_bert_score_s_table_or_is_needed():
    from seq2seq_eval.scoring.bertscore import check, num_layers

    assert num_layers(_options()) == 17  # roberta-large, bert-score's English default
    assert num_layers(_options(bertscore_model="bert-base-uncased")) == 9
    assert num_layers(_options(bertscore_model="bert-base-uncased", bertscore_num_layers=4)) == 4
    with pytest.raises(ConfigError, match=r"^--bertscore_num_layers is needed for --bertscore_model .*tiny/bert: "
                                          r"bert-score's table has no layer for it"):
        check(_options(bertscore_model=str(DATA / "bert")))
    with pytest.raises(ConfigError, match=r"^--bertscore_num_layers 5: .* has 4 layers; expected 0 to 4$"):
        check(_options(bertscore_model=str(DATA / "bert"), bertscore_num_layers=5))


def _fake_bert_score(root: Path, monkeypatch, *tables: str) -> None:
    """An installed bert-score as far as its baselines go: the package folder and its files."""
    import importlib

    for table in tables:
        path = root / "bert_score" / "rescale_baseline" / table
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((DATA / "baseline.tsv").read_text())
    (root / "bert_score" / "__init__.py").write_text("raise ImportError('its code is not run')\n")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()


def test_bert_score_s_baselines_are_read_from_an_installed_bert_score_or_refused_by_name(tmp_path, monkeypatch):
    from seq2seq_eval.scoring.bertscore import check
    from seq2seq_eval.scoring.bertscore.baseline import bert_score_folder, read_baseline

    model = str(DATA / "roberta")
    rescaled = dict(bertscore_model=model, bertscore_num_layers=LAYERS, bertscore_rescale_with_baseline=True)
    if bert_score_folder() is None:
        with pytest.raises(ConfigError, match=r"^--bertscore_rescale_with_baseline: bert-score's baselines are read "
                                              r"from an installed bert-score, which is not installed"):
            check(_options(**rescaled))
    _fake_bert_score(tmp_path, monkeypatch, "en/roberta-large.tsv", "en/microsoft/deberta-base.tsv", "de/bert.tsv")
    with pytest.raises(ConfigError, match=r"no baseline for .*roberta in en \(bert-score has them for en: "
                                          r"microsoft/deberta-base, roberta-large\)"):
        check(_options(**rescaled))
    with pytest.raises(ConfigError, match=r"bert-score has none for --bertscore_lang xx"):
        check(_options(**rescaled, bertscore_lang="xx"))
    from seq2seq_eval.scoring.bertscore import _baseline

    # A model bert-score has a baseline for, by its name; the row of the layer used.
    assert _baseline(_options(**{**rescaled, "bertscore_model": "roberta-large"}), 3) == ((0.35, 0.38, 0.365), "bert-score")
    (tmp_path / "roberta.tsv").write_text((DATA / "baseline.tsv").read_text())
    with pytest.raises(ConfigError, match="no baseline for"):  # a path is no escape from bert-score's folder
        check(_options(**{**rescaled, "bertscore_model": str(tmp_path / "roberta")}))
    path = tmp_path / "bert_score" / "rescale_baseline" / "en" / "roberta-large.tsv"
    assert read_baseline(path, 3) == (0.35, 0.38, 0.365)  # row 3: layer 3's P, R, F
    with pytest.raises(ConfigError, match=r"--bertscore_num_layers 5: .* has baselines for layers 0 to 4"):
        read_baseline(path, 5)
    with pytest.raises(ConfigError, match="^--bertscore_baseline_path needs --bertscore_rescale_with_baseline$"):
        check(_options(bertscore_model=model, bertscore_num_layers=3, bertscore_baseline_path=str(path)))
    with pytest.raises(ConfigError, match="^--bertscore_lang needs --bertscore_rescale_with_baseline$"):
        check(_options(bertscore_model=model, bertscore_num_layers=3, bertscore_lang="de"))
    with pytest.raises(ConfigError, match="^--bertscore_lang picks one of bert-score's baseline files; with "
                                          "--bertscore_baseline_path it is not read"):
        check(_options(**rescaled, bertscore_lang="de", bertscore_baseline_path=str(path)))


# --- on the ranks ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_refs(tmp_path_factory) -> Path:
    """24 examples of the embedded set with two references each (the second its words rotated)."""
    folder = tmp_path_factory.mktemp("bertscore_data")
    src = (REPO / "data_samples" / "translation" / "test.source").read_text(encoding="utf-8").splitlines()[:24]
    tgt = (REPO / "data_samples" / "translation" / "test.target").read_text(encoding="utf-8").splitlines()[:24]
    with open(folder / "test.jsonl", "w", encoding="utf-8") as f:
        for s, t in zip(src, tgt):
            f.write(json.dumps({"source": s, "target": [t, " ".join(t.split()[1:] + t.split()[:1])]}) + "\n")
    return folder / "test.jsonl"


BUDGET = 32  # forward passes of 1 or 2 texts; batches of a few examples, enough to share and kill in


def _run(data: Path) -> list[str]:
    return ["--data_dir", str(data), "--metrics", "bleu,bertscore", "--bertscore_model", str(DATA / "roberta"),
            "--bertscore_num_layers", str(LAYERS), "--bertscore_idf", "--bs", "8", "--model_metric_max_tokens", str(BUDGET)]


def _outputs(save_dir: Path) -> dict[str, bytes]:
    metric = json.loads((save_dir / "test_bleu.json").read_text())
    keys = ("bleu", "bertscore", "bertscore_precision", "bertscore_recall", "bertscore_signature")
    return {"examples": (save_dir / "test_examples.jsonl").read_bytes(),
            "generations": (save_dir / "test_generations.txt").read_bytes(),
            "scores": json.dumps({k: metric[k] for k in keys}).encode()}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, two_refs):
    """One process of 2 threads, the ranks below 1 thread each: the same bytes (numerics.py)."""
    out = tmp_path_factory.mktemp("bertscore1") / "out"
    assert_ok(single([*_run(two_refs), "--save_dir", str(out)], out.parent, env={"OMP_NUM_THREADS": "2"}))
    return out


def test_bertscore_in_the_metric_file_and_examples(one_rank):
    from seq2seq_eval.scoring.model_metric import score_all

    metric = json.loads((one_rank / "test_bleu.json").read_text())
    rows = [json.loads(line) for line in (one_rank / "test_examples.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and all(len(r["references"]) == 2 for r in rows)
    direct = score_all(_load("roberta", bertscore_idf=True), [r["source"] for r in rows], [r["prediction"] for r in rows],
                       [tuple(r["references"]) for r in rows], max_tokens=BUDGET)
    assert [(r["bertscore"], r["bertscore_precision"], r["bertscore_recall"]) for r in rows] == direct
    for key, k in (("bertscore", 0), ("bertscore_precision", 1), ("bertscore_recall", 2)):
        assert metric[key] == math.fsum(v[k] for v in direct) / 24
    assert metric["bertscore_signature"].startswith(f"{DATA / 'roberta'}_L{LAYERS}_idf_version=0.3.13")
    assert metric["throughput"]["model_metrics"]["bertscore"]["batches"] >= 6
    assert not any(p.name.startswith("model_scores") for p in one_rank.parent.rglob("*"))  # cleaned up


@pytest.mark.parametrize("ranks", [2, 3])
def test_identical_at_2_and_3_ranks(one_rank, two_refs, tmp_path, ranks):
    out = tmp_path / "out"
    assert_ok(run_ranks(ranks, [*_run(two_refs), "--save_dir", str(out)], tmp_path))
    assert _outputs(out) == _outputs(one_rank)


def test_score_and_compare_over_files(one_rank, tmp_path):
    import seq2seq_eval

    rows = [json.loads(line) for line in (one_rank / "test_examples.jsonl").read_text().splitlines()]
    metric = json.loads((one_rank / "test_bleu.json").read_text())
    pred = [r["prediction"] for r in rows]
    streams = [[r["references"][k] for r in rows] for k in range(2)]
    for name, lines in (("pred", pred), ("ref1", streams[0]), ("ref2", streams[1]), ("other", pred[1:] + pred[:1])):
        (tmp_path / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    options = ["--bertscore_model", str(DATA / "roberta"), "--bertscore_num_layers", str(LAYERS), "--bertscore_idf",
               "--model_metric_max_tokens", str(BUDGET)]
    proc = single(["score", "--metrics", "bertscore", "--predictions", str(tmp_path / "pred"), "--references",
                   str(tmp_path / "ref1"), str(tmp_path / "ref2"), *options], tmp_path)
    assert_ok(proc)
    printed = json.loads(proc.stdout)
    assert {k: printed[k] for k in ("bertscore", "bertscore_precision", "bertscore_recall")} == \
        {k: metric[k] for k in ("bertscore", "bertscore_precision", "bertscore_recall")}  # no sources needed
    api = seq2seq_eval.score(pred, streams, metrics="bertscore", reference_layout="streams", bertscore_idf=True,
                             bertscore_model=str(DATA / "roberta"), bertscore_num_layers=LAYERS,
                             model_metric_max_tokens=BUDGET)
    assert api == printed
    proc = single(["compare", "--task", "translation", "--metrics", "bertscore", "--n_samples", "100", "--predictions",
                   str(tmp_path / "pred"), str(tmp_path / "other"), "--references", str(tmp_path / "ref1"),
                   str(tmp_path / "ref2"), *options, "--json"], tmp_path)
    assert_ok(proc)
    comparison = json.loads(proc.stdout)
    assert comparison["results"]["pred"]["bertscore"]["score"] == pytest.approx(metric["bertscore"], abs=1e-12)
    assert comparison["results"]["other"]["bertscore"]["p_value"] is not None
    assert comparison["signatures"]["bertscore"].startswith(f"{DATA / 'roberta'}_L{LAYERS}_idf")


def test_refused_before_any_work(tmp_path, two_refs):
    args = [a for a in _run(two_refs) if a not in ("--bertscore_num_layers", str(LAYERS))]
    for extra, said in (([], "--bertscore_num_layers is needed for --bertscore_model"),
                        (["--bertscore_num_layers", "9"], "--bertscore_num_layers 9: "),
                        (["--bertscore_num_layers", "3", "--bertscore_rescale_with_baseline", "--bertscore_baseline_path",
                          str(tmp_path / "none.tsv")], "none.tsv: cannot read it")):
        proc = single([*args, *extra, "--save_dir", str(tmp_path / "out"), "--dry_run"], tmp_path)
        assert proc.returncode != 0 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists()
