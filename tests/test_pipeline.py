"""End to end through real ranks: gloo on CPU at 1, 2 and 3 processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from seq2seq_eval.run.rankfiles import read_rank_output
from conftest import assert_ok, make_corpus, metric_values, metrics_of, run_ranks, single, write_legacy


@pytest.fixture(scope="module")
def runs23(tiny_model, data23, tmp_path_factory):
    """The same evaluation at world sizes 1, 2 and 3 (and once as one plain process)."""
    root = tmp_path_factory.mktemp("runs23")
    out = {}
    for n in (1, 2, 3):
        save = root / f"w{n}"
        assert_ok(run_ranks(n, ["--model_name", str(tiny_model), "--data_dir", str(data23), "--bs", "4",
                               "--save_dir", str(save)], cwd=root))
        out[n] = save
    save = root / "plain"
    assert_ok(single(["--model_name", str(tiny_model), "--data_dir", str(data23), "--bs", "4",
                      "--save_dir", str(save)], cwd=root))
    out["plain"] = save
    return out


def test_generations_identical_across_world_sizes(runs23):
    texts = {n: (save / "test_generations.txt").read_bytes() for n, save in runs23.items()}
    assert texts[1] == texts[2] == texts[3] == texts["plain"]
    assert len(texts[1].decode().splitlines()) == 23


def test_metrics_identical_across_world_sizes(runs23):
    values = {n: metric_values(metrics_of(save)) for n, save in runs23.items()}
    assert values[1] == values[2] == values[3] == values["plain"]
    assert values[1]["n_obs"] == 23
    assert 0 <= values[1]["bleu"] <= 100
    assert values[1]["bleu_signature"].startswith("nrefs:1|")


def test_every_example_generated_exactly_once(runs23):
    for n in (1, 2, 3):
        m = metrics_of(runs23[n])
        per_rank = m["throughput"]["per_rank"]
        assert len(per_rank) == n == m["n_gpus"]
        assert sum(r["examples"] for r in per_rank) == 23
        assert sum(r["batches"] for r in per_rank) == 6  # ceil(23 / 4): no padding-in of examples


def test_bleu_is_sacrebleu_on_the_written_generations(runs23, data23):
    import sacrebleu

    preds = (runs23[2] / "test_generations.txt").read_text().splitlines()
    refs = (data23 / "test.target").read_text().splitlines()
    assert metrics_of(runs23[2])["bleu"] == sacrebleu.corpus_bleu(preds, [refs]).score


def test_temp_dir_removed_after_success(runs23):
    for save in runs23.values():
        assert not Path(f"{save}_tmp").exists()


def test_more_ranks_than_batches(tiny_model, tmp_path):
    """5 examples in 2 batches on 3 ranks: the idle rank still writes its (empty) rank file
    (--no_steal: otherwise it may take a batch that a slower-starting rank has not begun)."""
    src, tgt = make_corpus(5, seed=3)
    data = write_legacy(tmp_path / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--bs", "4"]
    assert_ok(run_ranks(3, args + ["--save_dir", str(tmp_path / "w3"), "--debug", "--no_steal"], cwd=tmp_path))
    assert_ok(single(args + ["--save_dir", str(tmp_path / "w1")], cwd=tmp_path))
    assert (tmp_path / "w3" / "test_generations.txt").read_bytes() == (tmp_path / "w1" / "test_generations.txt").read_bytes()
    rank2 = read_rank_output(tmp_path / "w3_tmp" / "rank_2_output.json", 2)
    assert rank2.table.num_rows == 0 and rank2.stats["examples"] == 0
    # --debug keeps the temp dir and writes the ordered references
    assert (tmp_path / "w3" / "test_references.txt").read_text().splitlines() == tgt


def test_summarization_rouge_keys(tiny_model, data23, tmp_path):
    proc = single(["--model_name", str(tiny_model), "--data_dir", str(data23), "--task", "summarization",
                   "--save_dir", str(tmp_path / "s")], cwd=tmp_path)
    assert_ok(proc)
    m = metrics_of(tmp_path / "s", "test_rouge.json")
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert m[f"{key}_ci_low"] <= m[key] <= m[f"{key}_ci_high"]
    # the metric is rouge-score's on the written generations, recomputed by `score`
    preds_file = tmp_path / "s" / "test_generations.txt"
    scored = single(["score", "--task", "summarization", "--predictions", str(preds_file),
                     "--references", str(data23 / "test.target")], cwd=tmp_path)
    assert_ok(scored)
    rescored = json.loads(scored.stdout)
    assert {k: rescored[k] for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")} == \
           {k: m[k] for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}


# test_pseudolabels: in tests/test_threads.py, with the same run at other world sizes and threads.
