"""--select in a run (selection/in_run.py): each example's generation is the candidate chosen of its
--num_return_sequences candidates, on the rank that generated them, journaled; the outputs carry
the selection, --metrics score it, and the bytes are the same at 1, 2 and 3 ranks and after a
rank is killed and the run resumed. The checks come before any generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_ok, kill_rank_after_first_line, make_corpus, run_ranks, single, write_legacy
from sacrebleu.metrics import BLEU, CHRF

from seq2seq_eval.cli import build_config, main
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.selection.command import selection_lines

OUTPUTS = ("test_generations.txt", "test_examples.jsonl", "test_pseudolabels.jsonl", "pseudolabel_results.json",
           "test.pseudo.target")


def args_for(tiny_model: Path, data: Path, *more: str) -> list[str]:
    # One budget at every world size (the default depends on it on a set this small); batches of
    # 2 examples, so that the ranks share 12 batches and a killed rank leaves some undone.
    return ["--model_name", str(tiny_model), "--data_dir", str(data), "--num_return_sequences", "4",
            "--select", "mbr", "--select_metric", "chrf", "--metrics", "bleu,chrf", "--pseudo_target", "--bs", "2",
            *more]


@pytest.fixture(scope="module")
def runs(tiny_model, data23, tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("select_in_run")
    out = {n: root / f"w{n}" for n in (1, 2, 3)}
    assert_ok(single(args_for(tiny_model, data23, "--save_dir", str(out[1])), cwd=root))
    for n in (2, 3):
        assert_ok(run_ranks(n, args_for(tiny_model, data23, "--save_dir", str(out[n])), cwd=root))
    return out


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def assert_selected(save: Path, mode: str, metric: str, resolved: dict | None = None,
                    pseudo_target: bool = True) -> list[dict]:
    """The run's generations are its selected candidates, and what `select` chooses over the run's
    own pseudolabel file, with the same scores; the run's --pseudo_target file holds them too.
    Returns the examples file's records."""
    generations = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    examples = lines(save / "test_examples.jsonl")
    assert [e["candidates"][e["selected"]] for e in examples] == [e["prediction"] for e in examples] == generations
    selected = [json.loads(x) for x in selection_lines(save / "test_pseudolabels.jsonl", mode, metric, resolved)]
    assert [s["prediction"] for s in selected] == generations
    assert [s["select_scores"] for s in selected] == [e["select_scores"] for e in examples]
    target = save / "test.pseudo.target"
    if pseudo_target:
        assert target.read_text(encoding="utf-8").splitlines() == generations
    else:
        assert not target.exists()
    return examples


def test_the_generation_is_the_selected_candidate(runs, data23):
    save = runs[1]
    generations = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    examples = lines(save / "test_examples.jsonl")
    pseudo = lines(save / "test_pseudolabels.jsonl")
    assert len(generations) == len(examples) == len(pseudo) == 23
    for g, e, p in zip(generations, examples, pseudo):
        assert len(e["candidates"]) == len(e["scores"]) == len(e["select_scores"]) == 4
        assert e["candidates"] == p["candidates"] and e["scores"] == p["scores"]  # generation order, both files
        assert (e["selected"], e["select_scores"]) == (p["selected"], p["select_scores"])
        assert e["prediction"] == g == e["candidates"][e["selected"]]
        assert e["scores"] == sorted(e["scores"], reverse=True)  # the beams' order, not the selection's
    # Not the beam's best everywhere: the selection changed something on this set.
    assert any(e["selected"] != 0 for e in examples)
    # `select` over the run's own pseudolabel file chooses the same, with the same scores;
    # --pseudo_target is the selection.
    assert assert_selected(save, "mbr", "chrf") == examples
    # The legacy file keeps its shape, the selected candidate first.
    legacy = json.loads((save / "pseudolabel_results.json").read_text(encoding="utf-8"))
    assert [r["preds"][0] for r in legacy] == generations
    assert [sorted(r["preds"]) for r in legacy] == [sorted(e["candidates"]) for e in examples]


def test_metrics_score_the_selection(runs, data23):
    save = runs[1]
    generations = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    refs = (data23 / "test.target").read_text(encoding="utf-8").splitlines()
    metrics = json.loads((save / "test_bleu.json").read_text(encoding="utf-8"))
    assert metrics["bleu"] == pytest.approx(BLEU().corpus_score(generations, [refs]).score, abs=1e-4)
    assert metrics["chrf"] == pytest.approx(CHRF().corpus_score(generations, [refs]).score, abs=1e-4)
    assert metrics["select_signature"].startswith("mbr:chrf|sacrebleu:")
    assert metrics["provenance"]["config"]["selection"] == {"select": "mbr", "select_metric": "chrf"}


def test_the_same_bytes_at_1_2_and_3_ranks(runs):
    for name in [*OUTPUTS]:
        assert (runs[1] / name).read_bytes() == (runs[2] / name).read_bytes() == (runs[3] / name).read_bytes(), name


def test_a_killed_rank_resumes_without_selecting_again(runs, tiny_model, data23, tmp_path):
    save = tmp_path / "out"
    tmp = Path(f"{save}_tmp")
    args = args_for(tiny_model, data23, "--save_dir", str(save))
    result = kill_rank_after_first_line(args, tmp / "select_rank_1.jsonl", tmp_path)
    assert result is not None and result.returncode != 0
    selected_before = sorted(json.loads(x)["batch"] for p in tmp.glob("select_rank_*.jsonl")
                             for x in p.read_text().splitlines())
    assert 0 < len(selected_before) < 12
    # --debug keeps the temp dir: each batch selected once over both attempts.
    assert_ok(run_ranks(3, args + ["--resume", "--debug"], cwd=tmp_path))
    selected = sorted(json.loads(x)["batch"] for p in tmp.glob("select_rank_*.jsonl") for x in p.read_text().splitlines())
    assert selected == list(range(12))
    per_rank = json.loads((save / "test_bleu.json").read_text())["throughput"]["per_rank"]
    assert sum(r["resumed_selections"] for r in per_rank) >= len(selected_before)
    for name in OUTPUTS:
        assert (save / name).read_bytes() == (runs[1] / name).read_bytes(), name
    # Resumed again with another utility: the generation is the journal's, the selection made anew.
    bleu = [a if a != "chrf" else "bleu" for a in args]
    assert_ok(single(bleu + ["--resume", "--debug"], cwd=tmp_path))
    per_rank = json.loads((save / "test_bleu.json").read_text())["throughput"]["per_rank"]
    assert (per_rank[0]["resumed_batches"], per_rank[0]["resumed_selections"]) == (12, 0)
    assert json.loads((save / "test_bleu.json").read_text())["select_signature"].startswith("mbr:bleu|")
    generations = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    assert generations == [json.loads(x)["prediction"]
                           for x in selection_lines(save / "test_pseudolabels.jsonl", "mbr", "bleu")]


# Sampled candidates (seeded, epsilon sampling) of a decoder-only model: 8 examples in batches of
# 2, 4 candidates of at most 8 new tokens each; one process of 1 thread, the same of 2 torch
# threads (OMP_NUM_THREADS), and 2 ranks.
SAMPLED = ["--do_sample", "true", "--epsilon_cutoff", "0.02", "--seed", "3", "--num_return_sequences", "4",
           "--max_new_tokens", "8", "--bs", "2", "--select", "mbr", "--select_metric", "bleu", "--pseudo_target"]


@pytest.fixture(scope="module")
def sampled_causal(tmp_path_factory) -> dict[str, Path]:
    from tiny_causal import build_tiny_llama

    root = tmp_path_factory.mktemp("select_causal")
    llama = build_tiny_llama(root / "llama", sum(make_corpus(100, seed=1), []))
    data = write_legacy(root / "data", *make_corpus(8, seed=4))
    args = ["--model_name", str(llama), "--data_dir", str(data), *SAMPLED]
    out = {name: root / name for name in ("w1_t1", "w1_t2", "w2_t1")}
    assert_ok(single(args + ["--save_dir", str(out["w1_t1"])], cwd=root))
    assert_ok(single(args + ["--save_dir", str(out["w1_t2"])], cwd=root, env={"OMP_NUM_THREADS": "2"}))
    assert_ok(run_ranks(2, args + ["--save_dir", str(out["w2_t1"])], cwd=root))
    return out


def test_sampled_candidates_of_a_decoder_only_model(sampled_causal):
    """--select over seeded samples from the HF engine on a decoder-only model: the generations are
    what `select` chooses over the run's own candidates, and every output is the same bytes at 1
    and 2 torch threads and at 1 and 2 ranks."""
    examples = assert_selected(sampled_causal["w1_t1"], "mbr", "bleu")
    assert len(examples) == 8 and all(len(e["candidates"]) == 4 for e in examples)
    assert sum(len(set(e["candidates"])) > 1 for e in examples) >= 4  # draws, not one text 4 times
    assert any(e["selected"] != 0 for e in examples)  # the selection changed something
    for name in OUTPUTS:
        assert len({(save / name).read_bytes() for save in sampled_causal.values()}) == 1, name


@pytest.mark.parametrize("flags, said", [
    (["--select", "mbr", "--select_metric", "chrf"], "--select mbr chooses one of each example's candidates: it needs "
                                                     "--num_return_sequences N > 1, got 1"),
    (["--num_return_sequences", "4", "--select", "mbr"], "--select mbr needs --select_metric"),
    (["--num_return_sequences", "4", "--select_metric", "chrf"], "--select_metric chrf needs --select mbr or --select qe"),
    (["--num_return_sequences", "4", "--select", "qe", "--select_metric", "bleu"], "--select qe --select_metric bleu: bleu needs a reference"),
    (["--num_return_sequences", "4", "--select", "mbr", "--select_metric", "ter"], "--select mbr --select_metric 'ter' is not a mbr metric here"),
    (["--num_return_sequences", "4", "--select", "best", "--select_metric", "chrf"], "--select 'best': expected one of mbr, qe"),
])
def test_refused_before_any_work(flags, said):
    with pytest.raises(ConfigError) as e:
        build_config(flags)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_metrics_without_select_are_still_refused_for_pseudolabels():
    with pytest.raises(ConfigError, match="pseudolabels .* are not scored"):
        build_config(["--num_return_sequences", "4", "--metrics", "bleu"])


def test_a_selector_whose_check_fails_stops_the_run_before_generation(tiny_model, data23, tmp_path, capsys):
    """A selector's own check (a model that does not fit its mode, in the model selectors) is made
    before the engine loads: one line, and no batch journaled."""
    from seq2seq_eval.selection import selectors

    class Refusing(selectors.TextMBR):
        def check(self) -> None:
            raise ConfigError("--select mbr --select_metric refusing: this selector refuses the options given")

    selectors.register("mbr", "refusing", lambda resolved, load: Refusing("chrf"))
    try:
        save = tmp_path / "out"
        rc = main(["--model_name", str(tiny_model), "--data_dir", str(data23), "--num_return_sequences", "4",
                   "--select", "mbr", "--select_metric", "refusing", "--save_dir", str(save)])
    finally:
        del selectors._SELECTORS[("mbr", "refusing")]
    err = capsys.readouterr().err
    assert rc != 0 and "this selector refuses the options given" in err
    assert not save.exists() or not any(save.iterdir())
    assert not list(Path(f"{save}_tmp").glob("journal_rank_*.jsonl"))


def test_without_references_the_run_info_records_the_selection(tiny_model, data23, tmp_path):
    """--input_path alone: nothing is scored; the generations are still the selections, and the
    run-info file carries the selection's signature."""
    sources = tmp_path / "src.txt"
    sources.write_text("".join((data23 / "test.source").read_text().splitlines(keepends=True)[:5]))
    save = tmp_path / "out"
    assert_ok(single(["--model_name", str(tiny_model), "--input_path", str(sources), "--num_return_sequences", "3",
                      "--select", "mbr", "--select_metric", "bleu", "--save_dir", str(save)], cwd=tmp_path))
    assert sorted(p.name for p in save.iterdir() if not p.name.startswith(".")) == [
        "pseudolabel_results.json", "test_generations.txt", "test_pseudolabels.jsonl", "test_run_info.json"]
    info = json.loads((save / "test_run_info.json").read_text())
    assert info["select_signature"].startswith("mbr:bleu|sacrebleu:")
    pseudo = lines(save / "test_pseudolabels.jsonl")
    assert (save / "test_generations.txt").read_text(encoding="utf-8").splitlines() == [
        p["candidates"][p["selected"]] for p in pseudo]


COMET_TINY = Path(__file__).resolve().parent / "data" / "comet_tiny"


@pytest.mark.parametrize("mode, checkpoint, metrics", [("mbr", "wmt22_like", "bleu,comet"), ("qe", "kiwi_like", "comet")])
def test_a_model_selector_in_a_run_loads_its_model_once_for_metrics_too(tiny_model, data23, tmp_path, monkeypatch,
                                                                          mode, checkpoint, metrics):
    """The two commands of docs/selection.md on a tiny COMET: the generations are what `select`
    chooses over the run's own candidates, --metrics' COMET scores those generations, and the
    COMET model is loaded once in the process for both."""
    from seq2seq_eval.scoring import registry

    data = tmp_path / "data"
    data.mkdir()
    for name in ("test.source", "test.target"):
        (data / name).write_text("".join((data23 / name).read_text().splitlines(keepends=True)[:5]))
    loads: list[str] = []
    real = registry.load

    def counted(name, *a, **k):
        loads.append(name)
        return real(name, *a, **k)

    monkeypatch.setattr(registry, "load", counted)
    save = tmp_path / "out"
    model = str(COMET_TINY / checkpoint)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--num_return_sequences", "3", "--select", mode,
            "--select_metric", "comet", "--comet_model", model, "--metrics", metrics, "--bs", "2"]
    assert main([*args, "--save_dir", str(save)]) == 0
    assert loads == ["comet"]
    generations = (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    resolved = dict(registry.resolve_options({"comet_model": model}))
    assert_selected(save, mode, "comet", resolved, pseudo_target=False)
    scored = json.loads((save / "test_bleu.json").read_text(encoding="utf-8"))
    refs = [[r] for r in (data / "test.target").read_text().splitlines()]
    expected = registry.corpus_scores(["comet"], resolved, (data / "test.source").read_text().splitlines(),
                                      generations, refs)["comet"]
    assert scored["comet"] == pytest.approx(expected, abs=1e-6)
    assert scored["select_signature"].startswith(f"{mode}:comet|")
    if mode == "mbr":
        # One process of 2 torch threads (OMP_NUM_THREADS) and 2 ranks (3 batches of 2 examples):
        # the bytes of this single-threaded one, --metrics' COMET scores in the examples file included.
        for name, launch in (("2 threads", lambda a: single(a, cwd=tmp_path, env={"OMP_NUM_THREADS": "2"})),
                             ("2 ranks", lambda a: run_ranks(2, a, cwd=tmp_path))):
            assert_ok(launch([*args, "--save_dir", str(tmp_path / name)]))
            for output in OUTPUTS[:4]:
                assert (tmp_path / name / output).read_bytes() == (save / output).read_bytes(), (name, output)
