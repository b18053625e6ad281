"""--metrics and several references end to end: torchrun at 1, 2 and 3 ranks, the examples file,
`score`, and the one-line errors of bad reference files and metric names."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from seq2seq_eval.run.rankfiles import read_rank_output
from conftest import assert_ok, make_corpus, metric_values, metrics_of, run_ranks, single, write_legacy
from sacrebleu.metrics import BLEU, CHRF, TER

METRICS = "bleu,chrf,ter"
SACRE = {"bleu": BLEU, "chrf": CHRF, "ter": TER}
SENTENCE = {"bleu": lambda: BLEU(effective_order=True), "chrf": CHRF, "ter": TER}
PREFIX = "seq2seq_eval: error: "


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def two_refs(tiny_model, tmp_path_factory):
    """23 examples with two references, at world sizes 1, 2 and 3 (3 with --debug, which keeps
    the rank files and writes the references back)."""
    root = tmp_path_factory.mktemp("two_refs")
    src, tgt = make_corpus(23, seed=2)
    _, tgt2 = make_corpus(23, seed=6)
    data = write_legacy(root / "data", src, tgt)
    _write_lines(data / "test.target.1", tgt2)
    runs = {}
    for n in (1, 2, 3):
        save = root / f"w{n}"
        args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--bs", "4", "--metrics", METRICS,
                "--save_dir", str(save)] + (["--debug"] if n == 3 else [])
        proc = run_ranks(n, args, cwd=root)
        assert_ok(proc)
        runs[n] = (save, proc)
    return {"root": root, "data": data, "refs": (tgt, tgt2), "runs": runs}


def _examples(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "test_examples.jsonl").read_text(encoding="utf-8").splitlines()]


def test_identical_metrics_and_examples_file_at_1_2_3_ranks(two_refs):
    runs = two_refs["runs"]
    values = {n: metric_values(metrics_of(save)) for n, (save, _) in runs.items()}
    assert values[1] == values[2] == values[3]
    assert {"bleu", "chrf", "ter"} <= set(values[1])
    assert all(values[1][f"{k}_signature"].startswith("nrefs:2|") for k in SACRE)
    files = {n: (save / "test_examples.jsonl").read_bytes() for n, (save, _) in runs.items()}
    assert files[1] == files[2] == files[3]
    assert [len(metrics_of(save)["throughput"]["per_rank"]) for save, _ in runs.values()] == [1, 2, 3]


def test_metrics_are_sacrebleus_multi_reference_corpus_scores(two_refs):
    save, _ = two_refs["runs"][2]
    preds = [row["prediction"] for row in _examples(save)]
    tgt, tgt2 = two_refs["refs"]
    m = metrics_of(save)
    for name, make in SACRE.items():
        metric = make()
        assert m[name] == metric.corpus_score(preds, [tgt, tgt2]).score, name
        assert m[f"{name}_signature"] == str(metric.get_signature()), name


def test_examples_file_loads_with_datasets(two_refs, tmp_path):
    import datasets

    save, _ = two_refs["runs"][1]
    ds = datasets.load_dataset("json", data_files=str(save / "test_examples.jsonl"), split="train",
                               cache_dir=str(tmp_path / "cache"))
    assert ds.column_names == ["id", "source", "references", "prediction", "bleu", "chrf", "ter"]
    assert ds["id"] == list(range(23))
    sources = (two_refs["data"] / "test.source").read_text(encoding="utf-8").splitlines()
    assert ds["source"] == sources
    tgt, tgt2 = two_refs["refs"]
    assert ds["references"] == [[a, b] for a, b in zip(tgt, tgt2)]
    for row in ds:
        for name, make in SENTENCE.items():
            expected = make().sentence_score(row["prediction"], row["references"]).score
            assert row[name] == expected, (row["id"], name)


def test_summary_names_the_five_lowest_scoring_ids(two_refs):
    save, proc = two_refs["runs"][1]
    rows = _examples(save)
    worst = sorted(rows, key=lambda r: r["bleu"])[:5]  # sorted() is stable: ties keep id order
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("lowest bleu ids")]
    assert line.split(maxsplit=3)[3] == ", ".join(f"{r['id']} ({r['bleu']:.1f})" for r in worst)


def test_rank_files_carry_statistics_keyed_by_metric(two_refs):
    """Each rank computed the statistics and sentence scores of the examples it generated."""
    from seq2seq_eval.scoring.totals import metric_statistics, sentence_scores

    save, _ = two_refs["runs"][3]
    tgt, tgt2 = two_refs["refs"]
    names = METRICS.split(",")
    sizes = []
    for rank in range(3):
        out = read_rank_output(Path(f"{save}_tmp") / f"rank_{rank}_output.json", rank)
        records = [{"id": json.loads(r["id"]), "pred": r["pred"][0], "metric_stats": json.loads(r["metric_stats"]),
                    "sentence_scores": json.loads(r["sentence_scores"])} for r in out.table.to_pylist()]
        sizes.append(len(records))
        preds = [r["pred"] for r in records]
        refs = [(tgt[r["id"]], tgt2[r["id"]]) for r in records]
        stats = metric_statistics(names, preds, refs)
        assert [r["metric_stats"] for r in records] == stats
        assert [r["sentence_scores"] for r in records] == sentence_scores(names, stats)
    assert sum(sizes) == 23 and len(set(sizes)) > 1  # uneven shards


def test_debug_writes_every_reference_set_back(two_refs):
    save, _ = two_refs["runs"][3]
    tgt, tgt2 = two_refs["refs"]
    assert (save / "test_references.txt").read_text(encoding="utf-8").splitlines() == tgt
    assert (save / "test_references.1.txt").read_text(encoding="utf-8").splitlines() == tgt2


def test_score_prints_the_metric_file_keys(two_refs):
    save, _ = two_refs["runs"][1]
    data = two_refs["data"]
    proc = single(["score", "--metrics", METRICS, "--predictions", str(save / "test_generations.txt"),
                   "--references", str(data / "test.target"), str(data / "test.target.1")], cwd=two_refs["root"])
    assert_ok(proc)
    scored = json.loads(proc.stdout)
    m = metrics_of(save)
    assert scored == {k: m[k] for k in scored}
    assert set(scored) == {"bleu", "bleu_signature", "chrf", "chrf_signature", "ter", "ter_signature"}


def test_summarization_jsonl_reference_lists(tiny_model, tmp_path):
    """JSON Lines with 1 or 2 references per record, ROUGE (rouge-score's score_multi) and BLEU
    (nrefs:var), no examples file."""
    from rouge_score import rouge_scorer

    from seq2seq_eval.scoring.results import ROUGE_KEYS
    from seq2seq_eval.scoring.rouge import prepare_for_rouge

    src, tgt = make_corpus(9, seed=7)
    _, tgt2 = make_corpus(9, seed=8)
    refs = [[a, b] if i % 3 else [a] for i, (a, b) in enumerate(zip(tgt, tgt2))]
    data = tmp_path / "d.jsonl"
    _write_lines(data, [json.dumps({"source": s, "target": r}) for s, r in zip(src, refs)])
    save = tmp_path / "s"
    assert_ok(single(["--model_name", str(tiny_model), "--data_dir", str(data), "--task", "summarization",
                      "--metrics", "rouge,bleu", "--no_examples_file", "--save_dir", str(save)], cwd=tmp_path))
    assert not (save / "test_examples.jsonl").exists()
    m = metrics_of(save, "test_rouge.json")
    preds = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    per = [scorer.score_multi([prepare_for_rouge(r) for r in rs], prepare_for_rouge(p)) for p, rs in zip(preds, refs)]
    for key in ROUGE_KEYS:
        assert m[key] == math.fsum(s[key].fmeasure * 100 for s in per) / len(per), key
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(2)]
    metric = BLEU()
    assert m["bleu"] == metric.corpus_score(preds, streams).score
    assert m["bleu_signature"] == str(metric.get_signature()) and m["bleu_signature"].startswith("nrefs:var|")


# ---------------------------------------------------------------------------
# Bad input: one line naming the culprit
# ---------------------------------------------------------------------------

# id, argv (placeholders: {m} model, {d} inputs folder), fragments of the one error line, exit code
BAD = [
    ("unknown-metric", ["--model_name", "{m}", "--data_dir", "{d}/ok", "--metrics", "bleu,meteor"],
     ["--metrics 'bleu,meteor': unknown metric 'meteor'; valid names: bleu, chrf, chrf++, ter, rouge"], 2),
    ("short-reference-file", ["--model_name", "{m}", "--data_dir", "{d}/short"],
     ["{d}/short/test.target.1: 2 lines but test.source has 3; expected one reference per source line"], 1),
    ("empty-extra-reference", ["--model_name", "{m}", "--data_dir", "{d}/empty"],
     ["{d}/empty/test.target.2 line 2: blank reference (empty or whitespace only)"], 1),
    ("score-unknown-metric", ["score", "--metrics", "chrf,bleurt", "--predictions", "{d}/p.txt", "--references",
                              "{d}/ok/test.target"], ["unknown metric 'bleurt'; valid names: bleu, chrf"], 2),
    ("score-short-reference", ["score", "--predictions", "{d}/p.txt", "--references", "{d}/ok/test.target",
                               "{d}/short/test.target.1"],
     ["{d}/short/test.target.1: 2 lines but {d}/p.txt has 3; expected one reference per prediction line"], 1),
    ("score-empty-reference", ["score", "--metrics", "ter", "--predictions", "{d}/p.txt", "--references",
                               "{d}/empty/test.target.2"], ["{d}/empty/test.target.2 line 2: blank reference (empty or whitespace only)"], 1),
    ("score-missing-file", ["score", "--predictions", "{d}/p.txt", "--references", "{d}/nope.txt"],
     ["{d}/nope.txt: file not found"], 1),
    ("score-empty-predictions", ["score", "--predictions", "{d}/none.txt", "--references", "{d}/ok/test.target"],
     ["{d}/none.txt: no lines; expected one prediction per line"], 1),
]


@pytest.fixture(scope="module")
def bad_runs(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_refs")
    src = ["the cat", "a dog", "a mat"]
    write_legacy(d / "ok", src, ["x", "y", "z"])
    write_legacy(d / "short", src, ["x", "y", "z"])
    _write_lines(d / "short" / "test.target.1", ["x", "y"])
    write_legacy(d / "empty", src, ["x", "y", "z"])
    _write_lines(d / "empty" / "test.target.1", ["x", "y", "z"])
    _write_lines(d / "empty" / "test.target.2", ["x", " ", "z"])
    _write_lines(d / "p.txt", ["x", "y", "z"])
    (d / "none.txt").write_text("", encoding="utf-8")
    names = {"m": tiny_model, "d": d}

    def launch(case_id: str, argv: list[str]):
        return single([a.format(**names) for a in argv] + ([] if argv[0] == "score" else ["--save_dir", str(d / case_id)]),
                      cwd=d, timeout=180)

    # Fresh interpreters (a few seconds each), so they run side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case[0]: pool.submit(launch, case[0], case[1]) for case in BAD}
        return names, {case_id: f.result() for case_id, f in futures.items()}


@pytest.mark.parametrize("case_id, argv, fragments, exit_code", BAD, ids=[c[0] for c in BAD])
def test_bad_reference_input_gives_one_line(bad_runs, case_id, argv, fragments, exit_code):
    names, procs = bad_runs
    proc = procs[case_id]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(PREFIX), lines[0]
    for fragment in fragments:
        assert fragment.format(**names) in lines[0]
    assert proc.returncode == exit_code
    assert proc.stdout.strip() == ""
    save = names["d"] / case_id
    assert not save.exists() or not any(save.iterdir())
