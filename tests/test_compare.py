"""`seq2seq_eval compare`: paired tests against sacrebleu and a direct computation, run folders,
one-line errors, and the HTML report (opened in headless Chromium when one is installed).

Real data comes from ../shared/realdata beside the checkout; those tests skip when it is absent.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import PairedTest

from seq2seq_eval.comparison import details as report_data
from seq2seq_eval.comparison import paired
from seq2seq_eval.cli import main
from seq2seq_eval.comparison.command import compare_main
from seq2seq_eval.comparison.details import sentence_scores
from seq2seq_eval.comparison.paired import metric_names, rouge_baseline_interval, rouge_paired_test
from seq2seq_eval.comparison.runs import load_run
from seq2seq_eval.comparison.systems import compare_systems
from seq2seq_eval.inputs.files import load_jsonl, load_legacy, read_lines
from seq2seq_eval.inputs.store import fingerprint
from seq2seq_eval.errors import ConfigError, DataError
from seq2seq_eval.comparison.html import PALETTE, render_report
from seq2seq_eval.scoring.results import ROUGE_KEYS
from seq2seq_eval.scoring.rouge import rouge_example_scores, rouge_from_example_scores

SHARED = Path(__file__).resolve().parents[2] / "shared"
REALDATA = SHARED / "realdata"
WMT17 = REALDATA / "sacrebleu_wmt17_en_de"
XSUM_CSV = REALDATA / "xsum_hallucination_annotations" / "hallucination_annotations_xsum_summaries.csv"

# Three real WMT17 en-de systems with close BLEU (26.60, 26.56, 26.65 on all 3004 lines), so the
# p-values are not all at their floor of 1 / (n + 1).
WMT17_SYSTEMS = ("LIUM-NMT.4900", "LMU-nmt-single.4893", "online-B.0")
WMT17_LINES = 400  # a prefix keeps the test to seconds; sacrebleu's equality holds at any size


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not found: real test data lives in ../shared/realdata beside the checkout")
    return path


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------
# Metric names
# ---------------------------------------------------------------------------

METRIC_CASES = [
    ("bleu", ("bleu",)),
    ("BLEU,chrf++", ("bleu", "chrf++")),
    (["bleu", "chrf,ter"], ("bleu", "chrf", "ter")),
    ("rouge", ROUGE_KEYS),
    ("rougeL,rouge", ("rougeL", "rouge1", "rouge2", "rougeLsum")),
    ("bleu,bleu", ("bleu",)),
]


@pytest.mark.parametrize("spec, expected", METRIC_CASES)
def test_metric_names(spec, expected):
    assert metric_names(spec) == expected


@pytest.mark.parametrize("spec", ["meteor", "bleu,rougeX", ","])
def test_unknown_metric_is_a_config_error_listing_valid_names(spec):
    with pytest.raises(ConfigError, match="valid: bleu, chrf, chrf\\+\\+, ter, rouge"):
        metric_names(spec)


@pytest.mark.parametrize("task, expected", [
    ("translation", ("bleu",)),
    ("translation_en_to_de", ("bleu",)),
    ("summarization", ROUGE_KEYS),
])
def test_default_metrics(task, expected):
    assert paired.default_metrics(task) == expected


# ---------------------------------------------------------------------------
# The ROUGE paired tests against a direct computation
# ---------------------------------------------------------------------------


def direct_bootstrap(base, sys_, n_samples, seed):
    """Paired bootstrap written out plainly: one index matrix, one resample at a time."""
    base, sys_ = np.asarray(base, dtype=np.float64), np.asarray(sys_, dtype=np.float64)
    n = len(base)
    idxs = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    mb = np.array([np.mean(base[row]) for row in idxs])
    ms = np.array([np.mean(sys_[row]) for row in idxs])
    observed = abs(sum(sorted(sys_.tolist())) / n - sum(sorted(base.tolist())) / n)
    d = np.abs(ms - mb)
    centred = d - d.mean()
    p = (sum(1 for x in centred if x > observed) + 1) / (n_samples + 1)
    # The interval: sorted resampled means, 1/40 in from each end, half their distance around the mean.
    srt = np.sort(ms)
    lo_i = n_samples // 40
    half = 0.5 * (srt[n_samples - lo_i - 1] - srt[lo_i])
    base_srt = np.sort(mb)
    base_half = 0.5 * (base_srt[n_samples - lo_i - 1] - base_srt[lo_i])
    return p, (ms.mean() - half, ms.mean() + half), (mb.mean() - base_half, mb.mean() + base_half)


def direct_randomization(base, sys_, n_samples, seed, n_conf=1000):
    """Approximate randomization written out plainly: per trial, swap each example's pair of
    scores on a fair coin; then n_conf bootstrap resamples from the same generator."""
    base, sys_ = np.asarray(base, dtype=np.float64), np.asarray(sys_, dtype=np.float64)
    n = len(base)
    rng = np.random.default_rng(seed)
    coins = rng.integers(2, size=(n_samples, n), dtype=bool)
    observed = abs(sum(sorted(sys_.tolist())) / n - sum(sorted(base.tolist())) / n)
    count = 0
    for row in coins:
        a = np.mean(np.where(row, base, sys_))
        b = np.mean(np.where(row, sys_, base))
        count += abs(a - b) > observed
    p = (count + 1) / (n_samples + 1)
    idxs = rng.choice(n, size=(n_conf, n), replace=True)
    ms = np.array([np.mean(sys_[row]) for row in idxs])
    srt = np.sort(ms)
    half = 0.5 * (srt[n_conf - n_conf // 40 - 1] - srt[n_conf // 40])
    return p, (ms.mean() - half, ms.mean() + half)


def test_paired_bootstrap_hand_case():
    # Identical systems: every resampled difference is 0 and nothing is strictly above the
    # observed 0, so p is sacrebleu's floor 1 / (n + 1); it is not called significant.
    scores = [10.0, 20.0, 30.0, 40.0]
    r = rouge_paired_test(scores, scores, "bs", n_samples=9, seed=1)
    assert r.score == 25.0 and r.p_value == 0.1
    r = rouge_paired_test(scores, scores, "ar", n_samples=9, seed=1)
    assert r.p_value == 0.1
    out = compare_systems({"a": ["x"] * 4, "b": ["x"] * 4}, [["x y"] * 4], ["rouge1"], "bs", 9, 1,
                          rouge_scores={k: [{"rouge1": s} for s in scores] for k in "ab"})
    assert out["results"]["b"]["rouge1"]["p_value"] == 0.1
    assert out["results"]["b"]["rouge1"]["significant"] is False


def test_paired_bootstrap_detects_a_clear_difference():
    base = [0.0] * 50
    better = [100.0] * 50
    assert rouge_paired_test(base, better, "bs", n_samples=99, seed=3).p_value == 0.01
    assert rouge_paired_test(base, better, "ar", n_samples=99, seed=3).p_value == 0.01


def test_index_chunks_draw_the_same_indices_as_one_call(monkeypatch):
    monkeypatch.setattr(paired, "_CHUNK_ELEMENTS", 17)  # 17 // 5 = 3 rows per chunk
    chunks = list(paired._index_chunks(np.random.default_rng(5), 5, 11))
    assert [len(c) for c in chunks] == [3, 3, 3, 2]
    one = np.random.default_rng(5).choice(5, size=(11, 5), replace=True)
    assert (np.concatenate(chunks) == one).all()


@pytest.mark.parametrize("chunk", [1 << 22, 50])
def test_rouge_tests_equal_a_direct_computation_on_synthetic_scores(monkeypatch, chunk):
    monkeypatch.setattr(paired, "_CHUNK_ELEMENTS", chunk)
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 100, 37)
    sys_ = np.clip(base + rng.normal(2, 15, 37), 0, 100)
    p, ci, base_ci = direct_bootstrap(base, sys_, 200, 7)
    r = rouge_paired_test(base, sys_, "bs", 200, 7)
    assert r.p_value == p
    assert (r.ci_low, r.ci_high) == pytest.approx(ci, rel=1e-12)
    b = rouge_baseline_interval(base, "bs", 200, 7)
    assert (b.ci_low, b.ci_high) == pytest.approx(base_ci, rel=1e-12)
    p, ci = direct_randomization(base, sys_, 300, 7)
    r = rouge_paired_test(base, sys_, "ar", 300, 7)
    assert r.p_value == p
    assert (r.ci_low, r.ci_high) == pytest.approx(ci, rel=1e-12)


def _xsum(n_docs: int) -> tuple[list[str], dict[str, list[str]]]:
    """Gold summaries and three systems' summaries of the first n_docs XSum documents (by bbcid)."""
    by_doc: dict[str, dict[str, str]] = {}
    with open(_require(XSUM_CSV), encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            by_doc.setdefault(row["bbcid"], {})[row["system"]] = row["summary"].replace("\\'", "'")
    docs = sorted(by_doc)[:n_docs]
    systems = {name: [by_doc[d][name] for d in docs] for name in ("TranS2S", "BERTS2S", "PtGen")}
    return [by_doc[d]["Gold"] for d in docs], systems


@pytest.fixture(scope="module")
def xsum():
    gold, systems = _xsum(150)
    scores = {name: rouge_example_scores(preds, gold) for name, preds in systems.items()}
    return gold, systems, scores


@pytest.mark.parametrize("paired_test, n_samples", [("bs", 1000), ("ar", 2000)])
def test_rouge_paired_test_on_xsum_equals_a_direct_computation(xsum, paired_test, n_samples):
    gold, systems, scores = xsum
    out = compare_systems(systems, [gold], ["rouge"], paired_test, n_samples, seed=12345)
    names = list(systems)
    assert out["systems"] == names and out["metrics"] == list(ROUGE_KEYS)
    for key in ROUGE_KEYS:
        col = {name: [row[key] for row in scores[name]] for name in names}
        # The score is the main run's ROUGE: the exact mean.
        for name in names:
            assert out["results"][name][key]["score"] == rouge_from_example_scores(scores[name]).scores[key]
        for name in names[1:]:
            if paired_test == "bs":
                p, ci, base_ci = direct_bootstrap(col[names[0]], col[name], n_samples, 12345)
            else:
                p, ci = direct_randomization(col[names[0]], col[name], n_samples, 12345)
            got = out["results"][name][key]
            assert got["p_value"] == p, (key, name)
            assert (got["ci_low"], got["ci_high"]) == pytest.approx(ci, rel=1e-12)
        assert out["results"][names[0]][key]["p_value"] is None
    # Both outcomes on real data: BERTS2S is about 6 points above TranS2S, PtGen 1.3 rougeL below
    # on 150 documents, which is not significant (p = 0.07 with bs, 0.20 with ar).
    assert all(out["results"]["BERTS2S"][k]["significant"] for k in ROUGE_KEYS)
    assert not out["results"]["PtGen"]["rougeL"]["significant"]


# ---------------------------------------------------------------------------
# bleu and chrf: sacrebleu's PairedTest, to the last digit
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wmt17(tmp_path_factory):
    _require(WMT17)
    folder = tmp_path_factory.mktemp("wmt17")
    ref = read_lines(WMT17 / "newstest2017-ende-ref.de.txt")[:WMT17_LINES]
    paths = {}
    systems = {}
    for name in WMT17_SYSTEMS:
        lines = read_lines(WMT17 / f"newstest2017.{name}.en-de.txt")[:WMT17_LINES]
        systems[name] = lines
        paths[name] = _write(folder / f"{name}.txt", lines)
    return _write(folder / "ref.txt", ref), paths, systems, ref


def _sacrebleu_paired(systems, ref, test_type, n_samples, seed, monkeypatch):
    monkeypatch.setenv("SACREBLEU_SEED", str(seed))
    test = PairedTest(list(systems.items()), {"bleu": BLEU(), "chrf": CHRF()}, [ref], test_type=test_type,
                      n_samples=n_samples, n_ar_confidence=1000 if test_type == "ar" else -1)
    return test()[1]


@pytest.mark.parametrize("paired_test, n_samples, seed", [("bs", 1000, 12345), ("ar", 2000, 777)])
def test_wmt17_p_values_equal_sacrebleu(wmt17, monkeypatch, capsys, paired_test, n_samples, seed):
    ref_path, paths, systems, ref = wmt17
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    rc = main(["compare", "--predictions", *map(str, paths.values()), "--references", str(ref_path),
               "--task", "translation", "--metrics", "bleu,chrf", "--paired_test", paired_test,
               "--n_samples", str(n_samples), "--seed", str(seed), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["systems"] == list(WMT17_SYSTEMS) and out["metrics"] == ["bleu", "chrf"]
    expected = _sacrebleu_paired(systems, ref, paired_test, n_samples, seed, monkeypatch)
    for ours, theirs in (("bleu", "BLEU"), ("chrf", "chrF2")):
        for name, res in zip(WMT17_SYSTEMS, expected[theirs]):
            got = out["results"][name][ours]
            assert got["score"] == res.score
            assert got["p_value"] == res.p_value
            assert got["ci_low"] == float(res.mean) - float(res.ci)
            assert got["ci_high"] == float(res.mean) + float(res.ci)
    assert out["results"][WMT17_SYSTEMS[0]]["bleu"]["p_value"] is None
    assert f"seed:{seed}" in out["signatures"]["bleu"] and f"{paired_test}:{n_samples}" in out["signatures"]["bleu"]
    # Some p-value is above its floor: the test is not trivially "everything differs".
    assert max(out["results"][n]["bleu"]["p_value"] for n in WMT17_SYSTEMS[1:]) > 0.05


def test_sacrebleu_seed_is_restored(monkeypatch):
    monkeypatch.setenv("SACREBLEU_SEED", "99")
    compare_systems({"a": ["a b c"], "b": ["a b d"]}, [["a b c"]], ["bleu"], "bs", 10, 5)
    assert paired.os.environ["SACREBLEU_SEED"] == "99"


def test_sentence_scores_are_sacrebleus(wmt17):
    import sacrebleu

    _, _, systems, ref = wmt17
    hyps = systems[WMT17_SYSTEMS[0]][:30]
    refs = [ref[:30]]
    cases = {
        "bleu": lambda h, r: sacrebleu.sentence_bleu(h, [r]).score,
        "chrf": lambda h, r: sacrebleu.sentence_chrf(h, [r]).score,
        "chrf++": lambda h, r: CHRF(word_order=2).sentence_score(h, [r]).score,
        "ter": lambda h, r: TER().sentence_score(h, [r]).score,
    }
    for metric, fn in cases.items():
        _, scores = sentence_scores(metric, hyps, refs)
        assert scores == [fn(h, r) for h, r in zip(hyps, refs[0])], metric


def test_table_output(wmt17, capsys):
    ref_path, paths, _, _ = wmt17
    rc = main(["compare", "--predictions", *map(str, paths.values()), "--references", str(ref_path),
               "--task", "translation", "--n_samples", "200", "--names", "A", "B", "C"])
    text = capsys.readouterr().out
    assert rc == 0
    lines = text.splitlines()
    assert lines[0].startswith("paired bootstrap resampling (200 resamples, seed 12345); 400 examples")
    assert lines[1].split() == ["system", "metric", "score", "95%", "CI", "p-value"]
    assert re.match(r"A +bleu +\d+\.\d\d +\[\d+\.\d\d, \d+\.\d\d\] +baseline$", lines[2])
    assert re.match(r"B +bleu +\d+\.\d\d +\[\d+\.\d\d, \d+\.\d\d\] +0\.\d{4}( +\*)?$", lines[3])
    assert lines[-2].startswith("* p < 0.05")
    # The last line names the system with the highest BLEU (higher is better), read off the table.
    scores = {line.split()[0]: float(line.split()[2]) for line in lines[2:5]}
    assert lines[-1] == f"best: bleu {max(scores, key=scores.get)}", (lines[-1], scores)


# ---------------------------------------------------------------------------
# Run folders
# ---------------------------------------------------------------------------


def make_run(save_dir: Path, data: Path, preds: list[str], task: str = "translation", type_path: str = "test",
             n_obs: int | None = None, sha256: str | None = None) -> Path:
    """A save_dir as the main run writes it: generations and a metric file with provenance."""
    _write(save_dir / f"{type_path}_generations.txt", preds)
    if sha256 is None:
        examples = load_jsonl(data, False) if data.suffix == ".jsonl" else load_legacy(data, type_path, False)
        examples = type(examples)(examples.items[:n_obs] if n_obs else examples.items, examples.origin)
        sha256 = fingerprint(examples.items)
    metric = "bleu" if "translation" in task else "rouge"
    config = {"model_name": "m", "data_dir": str(data), "dataset": None, "task": task, "type_path": type_path, "n_obs": n_obs}
    (save_dir / f"{type_path}_{metric}.json").write_text(json.dumps(
        {metric: 1.0, "provenance": {"config": config, "data": {"origin": str(data), "sha256": sha256}}}), encoding="utf-8")
    return save_dir


SRC = ["the cat sat on the mat", "a dog ran", "it rains today in the old town", "hello", "one two three four"]
TGT = ["die Katze sass auf der Matte", "ein Hund lief", "heute regnet es in der Altstadt", "hallo", "eins zwei drei vier"]
SYS_A = ["die Katze sass auf Matte", "ein Hund rannte", "es regnet heute in der Altstadt", "hallo", "eins zwei drei"]
SYS_B = ["eine Katze sitzt auf der Matte", "Hund lief", "heute regnet es in Altstadt", "hallo du", "eins zwei drei vier"]


@pytest.fixture
def legacy(tmp_path):
    data = tmp_path / "data"
    _write(data / "test.source", SRC)
    _write(data / "test.target", TGT)
    return data


def test_load_run_reads_references_sources_ids_and_task(tmp_path, legacy):
    run = load_run(make_run(tmp_path / "a", legacy, SYS_A))
    assert run.predictions == SYS_A
    assert run.references == [TGT] and run.sources == SRC and run.ids == [0, 1, 2, 3, 4]
    assert run.task == "translation" and run.type_path == "test"
    preds, refs, *_ = run  # a tuple too, for --compare_to
    assert preds == SYS_A


def test_load_run_applies_n_obs_and_jsonl_ids(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"x{i}", "source": s, "target": t}) + "\n"
                            for i, (s, t) in enumerate(zip(SRC, TGT))), encoding="utf-8")
    run = load_run(make_run(tmp_path / "a", data, SYS_A[:3], n_obs=3))
    assert run.ids == ["x0", "x1", "x2"] and run.references == [TGT[:3]] and run.sources == SRC[:3]


def test_changed_data_falls_back_to_debug_target_or_needs_references(tmp_path, legacy):
    save = make_run(tmp_path / "a", legacy, SYS_A, sha256="0" * 64)
    run = load_run(save)
    assert run.references is None and "has changed since the run" in run.references_note
    _write(save / "test_references.txt", TGT)  # what --debug writes
    assert load_run(save).references == [TGT]


def test_compare_two_run_folders_without_references(tmp_path, legacy, capsys):
    a = make_run(tmp_path / "run_a", legacy, SYS_A)
    b = make_run(tmp_path / "run_b", legacy, SYS_B)
    report = tmp_path / "r.html"
    rc = main(["compare", "--predictions", str(a), str(b), "--json", "--n_samples", "100", "--report", str(report)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["systems"] == ["run_a", "run_b"] and out["metrics"] == ["bleu"] and out["task"] == "translation"
    expected = compare_systems({"run_a": SYS_A, "run_b": SYS_B}, [TGT], ["bleu"], "bs", 100)
    assert out["results"] == expected["results"]
    page = report.read_text(encoding="utf-8")
    assert "quintiles of the source length" in page and "the cat sat on the mat" in page


def _one_line_error(capsys, argv, *fragments, code=None):
    rc = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc != 0 and (code is None or rc == code)
    assert len(err.splitlines()) == 1, err
    assert err.startswith("seq2seq_eval: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_mismatched_ids_are_one_line(tmp_path, capsys):
    d1, d2 = tmp_path / "d1.jsonl", tmp_path / "d2.jsonl"
    for path, ids in ((d1, ["a", "b", "c", "d", "e"]), (d2, ["a", "b", "X", "d", "e"])):
        path.write_text("".join(json.dumps({"id": i, "source": s, "target": t}) + "\n"
                                for i, s, t in zip(ids, SRC, TGT)), encoding="utf-8")
    a, b = make_run(tmp_path / "a", d1, SYS_A), make_run(tmp_path / "b", d2, SYS_B)
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b)], "example 2 has id 'X'", "has id 'c'")


def test_mismatched_lengths_are_one_line(tmp_path, legacy, capsys):
    a = _write(tmp_path / "a.txt", SYS_A)
    b = _write(tmp_path / "b.txt", SYS_B[:4])
    ref = legacy / "test.target"
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b), "--references", str(ref), "--task", "translation"],
                    f"{b}: 4 lines but {ref} has 5")
    r2 = _write(tmp_path / "r2.txt", TGT[:3])
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(a), "--references", str(ref), str(r2),
                             "--task", "translation"], f"{r2}: 3 lines but {ref} has 5")


def test_run_folders_on_different_n_obs_are_one_line(tmp_path, legacy, capsys):
    a = make_run(tmp_path / "a", legacy, SYS_A)
    b = make_run(tmp_path / "b", legacy, SYS_B[:3], n_obs=3)
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b)], "test_generations.txt: 3 lines but", "has 5")


@pytest.mark.parametrize("extra, fragments, code", [
    (["--metrics", "bleu,meteor"], ["unknown metric 'meteor'", "valid names: bleu, chrf, chrf++, ter, rouge"], 2),
    (["--paired_test", "xx"], ["--paired_test", "invalid choice"], 2),
    (["--n_samples", "0"], ["--n_samples must be an integer >= 1, got 0"], 2),
    (["--seed", "0"], ["--seed must be an integer >= 1"], 2),
    (["--names", "A"], ["--names: 1 names for 2 predictions"], 2),
    (["--names", "A", "A"], ["--names: 'A' given twice"], 2),
])
def test_bad_options_are_one_line(tmp_path, legacy, capsys, extra, fragments, code):
    a, b = _write(tmp_path / "a.txt", SYS_A), _write(tmp_path / "b.txt", SYS_B)
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b), "--references", str(legacy / "test.target"),
                             "--task", "translation", *extra], *fragments, code=code)


def test_bare_files_need_references_and_task(tmp_path, legacy, capsys):
    a, b = _write(tmp_path / "a.txt", SYS_A), _write(tmp_path / "b.txt", SYS_B)
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b), "--task", "translation"],
                    "compare --metrics bleu: bleu needs references (pass --references; a prediction is a bare file)")
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b), "--references", str(legacy / "test.target")],
                    "--task is required")
    _one_line_error(capsys, ["compare", "--predictions", str(a), "--references", str(legacy / "test.target"),
                             "--task", "translation"], "at least 2 systems")
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(tmp_path / "nope.txt"),
                             "--references", str(legacy / "test.target"), "--task", "translation"], "nope.txt: no such file")


# ---------------------------------------------------------------------------
# The HTML report
# ---------------------------------------------------------------------------


def _synthetic_summaries(n: int) -> tuple[list[str], dict[str, list[str]]]:
    """Seeded stand-in for the XSum systems when ../shared is absent: references and three
    systems that copy a decreasing share of each reference's words."""
    rng = random.Random(4)
    words = "the council said on monday that new rules for water bills would start in june after a long review".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 20))) for _ in range(n)]
    systems = {}
    for name, keep in (("A", 0.6), ("B", 0.8), ("C", 0.4)):
        systems[name] = [" ".join(w if rng.random() < keep else rng.choice(words) for w in r.split()) for r in refs]
    return refs, systems


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    """The report of three real XSum systems (synthetic ones without ../shared), given no
    sources: (path, metrics, baseline name)."""
    gold, systems = _xsum(60) if XSUM_CSV.exists() else _synthetic_summaries(60)
    folder = tmp_path_factory.mktemp("report")
    paths = [_write(folder / f"{name}.txt", preds) for name, preds in systems.items()]
    ref = _write(folder / "gold.txt", gold)
    out = folder / "report.html"
    text = compare_main(["--predictions", *map(str, paths), "--references", str(ref), "--task", "summarization",
                         "--metrics", "rouge,bleu", "--n_samples", "200", "--report", str(out)])
    assert text.endswith(f"report: {out}")
    return out, ["rouge1", "rouge2", "rougeL", "rougeLsum", "bleu"], next(iter(systems))


def test_report_is_self_contained_and_complete(report_page):
    path, metrics, base = report_page
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    # No network: nothing is fetched (no src/href), no script.
    assert not re.search(r"\b(src|href)\s*=", page) and "<script" not in page and "@import" not in page
    assert set(re.findall(r'data-chart="([^"]+)"', page)) == {f"{kind}-{m}" for kind in ("buckets", "dist") for m in metrics}
    assert "No sources were given" in page and "reference</strong> length" in page
    # 10 examples per non-baseline system, with both predictions side by side.
    assert page.count('<div class="ex">') == 2 * paired.TOP_EXAMPLES
    assert page.count(f'class="label">baseline: {base}') == 2 * paired.TOP_EXAMPLES


def test_report_is_deterministic(tmp_path, legacy):
    args = ["--predictions", *(str(_write(tmp_path / f"{n}.txt", s)) for n, s in (("a", SYS_A), ("b", SYS_B))),
            "--references", str(legacy / "test.target"), "--sources", str(legacy / "test.source"),
            "--task", "translation", "--metrics", "bleu,ter", "--n_samples", "50"]
    compare_main([*args, "--report", str(tmp_path / "1.html")])
    compare_main([*args, "--report", str(tmp_path / "2.html")])
    assert (tmp_path / "1.html").read_bytes() == (tmp_path / "2.html").read_bytes()
    assert "quintiles of the source length" in (tmp_path / "1.html").read_text(encoding="utf-8")


def test_length_buckets_hand_cases():
    labels = lambda xs: [(label, len(m)) for label, m in report_data._length_buckets(xs)]  # noqa: E731
    assert labels(list(range(1, 11))) == [("1–2", 2), ("3–4", 2), ("5–6", 2), ("7–8", 2), ("9–10", 2)]
    assert labels([5] * 7) == [("5–5", 7)]
    assert labels([1, 1, 1, 1, 9]) == [("1–1", 4), ("9–9", 1)]


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


_PROBE = """<script>
const charts = [...document.querySelectorAll('svg.chart')].map(s => {
  const r = s.getBoundingClientRect();
  const bars = [...s.querySelectorAll('rect')].filter(b => b.getBBox().height > 0).length;
  return [s.dataset.chart, Math.round(r.width), Math.round(r.height), bars];
});
const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(charts);
document.body.appendChild(pre);
</script></body>"""


def _png_pixels(path: Path) -> tuple[int, int, bytes, int]:
    """(width, height, unfiltered RGB(A) rows, bytes per pixel) of an 8-bit non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, out, prev = zlib.decompress(idat), width * bpp, bytearray(), bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return width, height, bytes(out), bpp


def test_report_renders_in_headless_chromium(report_page, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium / chromium-browser / google-chrome on PATH (Debian: apt-get install -y chromium)")
    path, metrics, _ = report_page
    probe = tmp_path / "probe.html"
    probe.write_text(path.read_text(encoding="utf-8").replace("</body>", _PROBE), encoding="utf-8")
    flags = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--window-size=1200,1400"]
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout)
    assert match, dom.stderr[-2000:]
    charts = json.loads(match.group(1).replace("&quot;", '"'))
    assert {c[0] for c in charts} == {f"{kind}-{m}" for kind in ("buckets", "dist") for m in metrics}
    for chart_id, width, height, bars in charts:
        assert width > 300 and height > 150 and bars >= 3, (chart_id, width, height, bars)
    # The screenshot shows the charts: the first three palette colours (one per system) are on it.
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120, check=True)
    width, height, pixels, bpp = _png_pixels(shot)
    assert (width, height) == (1200, 1400)
    colours = {pixels[i:i + 3] for i in range(0, len(pixels), bpp)}
    for hex_colour in PALETTE[:3]:
        assert bytes.fromhex(hex_colour[1:]) in colours, hex_colour
    assert len(colours) > 20  # text, bars and background, not a blank page


def _long_token_report(tmp_path: Path) -> Path:
    """A report whose example shows one 20,000-character token (a URL, base64, a run of digits)."""
    token = "x" * 20_000
    refs = ["the cat sat on the mat", f"a dog {token}", "it is red"]
    systems = {"a": ["the cat sat", f"a dog {token}", "it is blue"], "b": ["the cat sat on the mat", "a dog", "it is red"]}
    paths = [_write(tmp_path / f"{name}.txt", lines) for name, lines in systems.items()]
    out = tmp_path / "long.html"
    compare_main(["--predictions", *map(str, paths), "--references", str(_write(tmp_path / "r.txt", refs)),
                  "--task", "translation", "--n_samples", "10", "--report", str(out)])
    return out


def test_a_long_token_wraps_inside_its_box(tmp_path):
    """The example boxes wrap a token anywhere, and their grid cells may shrink below its width:
    without both, one long token widens the page to hundreds of thousands of pixels."""
    page = _long_token_report(tmp_path).read_text(encoding="utf-8")
    rules = dict(re.findall(r"^(\.ex [^{]+?)\s*\{([^}]*)\}", page, flags=re.M))
    assert "overflow-wrap: anywhere" in rules[".ex .text"] and "min-width: 0" in rules[".ex .text"]
    assert "min-width: 0" in rules[".ex .grid > div"]


def test_a_long_token_keeps_the_page_width_in_headless_chromium(tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium / chromium-browser / google-chrome on PATH (Debian: apt-get install -y chromium)")
    page = _long_token_report(tmp_path).read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    width_probe = ("<script>const pre = document.createElement('pre'); pre.id = 'probe'; "
                   "pre.textContent = document.documentElement.scrollWidth; document.body.appendChild(pre);</script></body>")
    probe.write_text(page.replace("</body>", width_probe), encoding="utf-8")
    dom = subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--window-size=1200,1400",
                          "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="probe">(\d+)</pre>', dom.stdout)
    assert match, dom.stderr[-2000:]
    assert int(match.group(1)) <= 1200


def test_render_report_escapes_text():
    comparison = compare_systems({"<a>": ["x & y"], "b": ["<script>"]}, [["x & y"]], ["bleu"], "bs", 10)
    details = report_data.report_details(comparison, {"<a>": ["x & y"], "b": ["<script>"]}, [["x & y"]])
    page = render_report(comparison, details)
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;a&gt;" in page


def test_run_folders_on_different_references_are_one_line(tmp_path, legacy, capsys):
    other = tmp_path / "other"
    _write(other / "test.source", SRC)
    _write(other / "test.target", TGT[:2] + ["something else"] + TGT[3:])
    a, b = make_run(tmp_path / "a", legacy, SYS_A), make_run(tmp_path / "b", other, SYS_B)
    _one_line_error(capsys, ["compare", "--predictions", str(a), str(b)],
                    f"{b}: reference 2 differs from {a}'s; the runs were scored on different data")
    # --references replaces the runs' own references: no check, and the comparison runs.
    assert main(["compare", "--predictions", str(a), str(b), "--references", str(legacy / "test.target"),
                 "--n_samples", "20"]) == 0


def test_several_reference_streams():
    import sacrebleu

    refs = [TGT, ["die Katze sass auf Matte", "ein Hund rannte", "es regnet heute", "hallo", "eins zwei drei"]]
    out = compare_systems({"a": SYS_A, "b": SYS_B}, refs, ["bleu", "chrf", "rouge1"], "bs", 50)
    assert out["n_references"] == 2 and "nrefs:2" in out["signatures"]["bleu"]
    assert out["results"]["a"]["bleu"]["score"] == sacrebleu.corpus_bleu(SYS_A, refs).score
    assert out["results"]["b"]["chrf"]["score"] == sacrebleu.corpus_chrf(SYS_B, refs).score
    # ROUGE: per example, the best F-measure over the references (rouge-score's score_multi).
    per_ref = [rouge_example_scores(SYS_A, r) for r in refs]
    best = [max(s[i]["rouge1"] for s in per_ref) for i in range(len(SYS_A))]
    assert out["results"]["a"]["rouge1"]["score"] == math.fsum(best) / len(best)
    with pytest.raises(DataError, match="reference stream 2 has 4 lines but stream 1 has 5"):
        compare_systems({"a": SYS_A, "b": SYS_B}, [TGT, TGT[:4]])


# ---------------------------------------------------------------------------
# --compare_to in the main run
# ---------------------------------------------------------------------------


def test_main_run_compares_to_an_earlier_run(tiny_model, data23, tmp_path, capsys):
    """The metric file's `comparison` is what `compare` gives on the two save dirs, and the summary
    shows the table; a run on other data is refused before anything is generated."""
    from conftest import REPO, assert_ok, metrics_of, single

    base = ["--model_name", str(tiny_model), "--data_dir", str(data23), "--metrics", "bleu,chrf"]
    assert_ok(single(base + ["--save_dir", str(tmp_path / "a")], cwd=tmp_path))
    run = single(base + ["--num_beams", "1", "--save_dir", str(tmp_path / "b"), "--compare_to", str(tmp_path / "a")],
                 cwd=tmp_path)
    assert_ok(run)
    comparison = metrics_of(tmp_path / "b")["comparison"]
    assert comparison["systems"] == ["a (--compare_to)", "this run"] and comparison["metrics"] == ["bleu", "chrf"]
    assert main(["compare", "--predictions", str(tmp_path / "a"), str(tmp_path / "b"), "--json",
                 "--metrics", "bleu,chrf"]) == 0
    direct = json.loads(capsys.readouterr().out)
    for metric in ("bleu", "chrf"):
        assert comparison["results"]["this run"][metric] == direct["results"]["b"][metric]
    # The keys are compare --json's (docs/compare.md says so; the metric file sorts them).
    assert sorted(comparison) == sorted(direct)
    assert comparison["inputs"] == {"a (--compare_to)": str(tmp_path / "a"), "this run": str(tmp_path / "b")}
    assert "p-value" in run.stdout and "this run" in run.stdout
    # A model metric is not tested against the earlier run here: said in the file and the table.
    comet = REPO / "tests" / "data" / "comet_tiny" / "wmt22_like"
    with_comet = single([*base[:-2], "--metrics", "bleu,comet", "--comet_model", str(comet), "--save_dir",
                         str(tmp_path / "d"), "--compare_to", str(tmp_path / "a")], cwd=tmp_path)
    assert_ok(with_comet)
    comparison = metrics_of(tmp_path / "d")["comparison"]
    assert comparison["metrics"] == ["bleu"] and list(comparison["not_compared"]) == ["comet"]
    assert (f"not compared: --compare_to tests the text metrics; for comet: seq2seq_eval compare --predictions "
            f"{tmp_path / 'a'} {tmp_path / 'd'} --metrics comet") in with_comet.stdout
    other = tmp_path / "other"  # the first 22 examples only
    other.mkdir()
    for name in ("test.source", "test.target"):
        (other / name).write_text("".join((data23 / name).read_text().splitlines(keepends=True)[:22]))
    refused = single(base + ["--data_dir", str(other), "--save_dir", str(tmp_path / "c"), "--compare_to",
                             str(tmp_path / "a")], cwd=tmp_path)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert [line for line in refused.stderr.splitlines() if line.strip()][-1].startswith("seq2seq_eval: error: ")
    assert not (tmp_path / "c_tmp").exists() or not list((tmp_path / "c_tmp").glob("journal_rank_*.jsonl"))


def test_compare_to_refuses_a_run_scored_on_other_references(tiny_model, data23, tmp_path):
    """The same sources and ids, other references: the earlier run's metric file records a
    fingerprint of the references it was scored on, so the comparison is refused even when its
    data has changed since and it wrote no examples file (its references cannot be read back)."""
    import shutil

    from conftest import assert_ok, metrics_of, single

    data = tmp_path / "d"
    shutil.copytree(data23, data)
    base = ["--model_name", str(tiny_model), "--data_dir", str(data), "--num_beams", "1"]
    assert_ok(single(base + ["--save_dir", str(tmp_path / "a"), "--no_examples_file"], cwd=tmp_path))
    assert len(metrics_of(tmp_path / "a")["provenance"]["references"]["sha256"]) == 1
    target = data / "test.target"
    target.write_text("".join(" ".join(reversed(line.split())) + "\n" for line in target.read_text().splitlines()))
    refused = single(base + ["--save_dir", str(tmp_path / "b"), "--compare_to", str(tmp_path / "a")], cwd=tmp_path)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    last = [line for line in refused.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"seq2seq_eval: error: {tmp_path / 'a'}: scored on other references than this run"), last
    assert not (tmp_path / "b" / "test_bleu.json").exists()


def test_a_dataset_run_folder_is_compared_without_debug_or_references(tiny_model, tmp_path, capsys):
    """Its own examples file carries the ids, sources and references (docs/compare.md)."""
    from conftest import assert_ok, make_corpus, single

    src, tgt = make_corpus(7, seed=33)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"x{i}", "source": s, "target": t}) + "\n"
                            for i, (s, t) in enumerate(zip(src, tgt))))
    for name, beams in (("a", "2"), ("b", "1")):
        assert_ok(single(["--model_name", str(tiny_model), "--dataset", str(data), "--split", "test",
                          "--num_beams", beams, "--save_dir", str(tmp_path / name)], cwd=tmp_path))
        assert not (tmp_path / name / "test_references.txt").exists()
    assert main(["compare", "--predictions", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_examples"] == 7 and out["systems"] == ["a", "b"]
