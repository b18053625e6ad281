"""Selection with a model metric (seq2seq_eval/selection/models.py, docs/selection.md): COMET,
MetricX and BERTScore as MBR utilities, CometKiwi and MetricX-QE as QE rerankers, on the tiny
checkpoints the project's metric tests ship.

In the project's environment (CI): the expected utilities equal the project's own scorer applied
to every (candidate, pseudo-reference) pair one at a time (brute force), the QE scores the scorer
applied to each candidate alone; an example's scores do not depend on the examples handed over
with it; the lower-is-better rule of MetricX; the refusals before any model loads; `select`
end to end. Where mbrs 0.1.8's side environment is installed (docs/selection.md), parity with
its COMET-MBR (`DecoderMBR` + `MetricCOMET`) and CometKiwi reranking (`DecoderRerank` +
`MetricCOMETkiwi`), skipped where it is not.
"""

from __future__ import annotations

import json
import lzma
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, assert_ok, run_ranks, single

from seq2seq_eval.cli import main
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.scoring import registry
from seq2seq_eval.selection.candidates import CandidateSet
from seq2seq_eval.selection.models import choose
from seq2seq_eval.selection.selectors import make_selector

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SELECTION = REPO / "tests" / "data" / "selection"
FIXTURES = {"beam8": SELECTION / "beam8.jsonl", "sample16": SELECTION / "sample16.jsonl"}
"""The embedded model's candidates (tests/test_selection.py says how they were made): 8 from beam
search, all distinct; 16 sampled, many repeated."""
COMET = REPO / "tests" / "data" / "comet_tiny"
METRICX = REPO / "tests" / "data" / "metricx_tiny"
BERTSCORE = REPO / "tests" / "data" / "bertscore_tiny"
MBRS_PYTHON = Path(os.environ.get("S2S_MBRS_PYTHON", "/work/side/venv-mbrs/bin/python"))
TOLERANCE = 1e-6


def sets(name: str, first: int | None = None) -> list[CandidateSet]:
    lines = FIXTURES[name].read_text(encoding="utf-8").splitlines()[:first]
    return [CandidateSet(r["id"], r["source"], tuple(r["candidates"])) for r in map(json.loads, lines)]


def resolved(**given) -> dict:
    return dict(registry.resolve_options(given))


@pytest.fixture(scope="module")
def metricx_folder(tmp_path_factory) -> str:
    """The float32 MetricX fixture as the hub holds it (config.json and model.safetensors)."""
    folder = tmp_path_factory.mktemp("metricx")
    (folder / "config.json").write_bytes((METRICX / "float32" / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(lzma.decompress((METRICX / "float32" / "model.safetensors.xz").read_bytes()))
    return str(folder)


def metricx_options(folder: str, qe: bool) -> dict:
    return resolved(metricx_model=folder, metricx_tokenizer=str(METRICX / "tokenizer"), metricx_qe=qe)


BERTSCORE_OPTIONS = {"bertscore_model": str(BERTSCORE / "roberta"), "bertscore_num_layers": 2}


def brute_force_mbr(metric, s: CandidateSet) -> list[float]:
    """Each candidate's mean over every candidate (itself and duplicates included) of the scorer
    applied to that one (candidate, pseudo-reference) pair alone, in float64."""
    n = len(s.candidates)
    alone: dict[tuple[str, str], float] = {}  # a repeated pair of texts is scored alone once
    for h in s.candidates:
        for r in s.candidates:
            if (h, r) not in alone:
                value = metric.score([s.source], [h], [(r,)])[0]
                alone[h, r] = float(value[0] if isinstance(value, tuple) else value)
    return [sum(alone[h, r] for r in s.candidates) / n for h in s.candidates]


def spread(values: list[float]) -> float:
    return max(values) - min(values)


# --- the project's own scorer, pair by pair (CI) ------------------------------------------------

@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_comet_mbr_equals_the_scorer_on_every_pair(name):
    options = resolved(comet_model=str(COMET / "wmt22_like"))
    selector = make_selector("mbr", "comet", options)
    examples = sets(name, 1 if name == "beam8" else 2)  # 8 and 14 distinct candidates
    metric = selector.loaded  # the same loaded scorer, applied pair by pair
    for s, chosen in zip(examples, selector.select(examples)):
        expected = brute_force_mbr(metric, s)
        assert chosen.scores == pytest.approx(expected, abs=TOLERANCE, rel=0)
        assert spread(expected) > 100 * TOLERANCE  # a fixture whose candidates the utility tells apart
        assert chosen.index == choose(chosen.scores, True)
        # Duplicates (the sampled set's repeats) get the same bits; the first copy is chosen.
        for i, c in enumerate(s.candidates):
            first = s.candidates.index(c)
            assert chosen.scores[i] == chosen.scores[first]
    assert selector.signature().startswith("mbr:comet|uniform|float64|max|model:")


def test_an_example_s_scores_do_not_depend_on_what_else_is_handed_over():
    """The ranks hand a selector other batches at other world sizes: each example's scores are the
    same bits alone, in a batch, and in another order."""
    options = resolved(comet_model=str(COMET / "wmt22_like"))
    selector = make_selector("mbr", "comet", options)
    examples = sets("beam8", 2) + sets("sample16", 2)
    together = selector.select(examples)
    alone = [selector.select([s])[0] for s in examples]
    backwards = selector.select(examples[::-1])[::-1]
    assert together == alone == backwards


def test_cometkiwi_qe_equals_the_scorer_on_each_candidate():
    options = resolved(comet_model=str(COMET / "kiwi_like"))
    selector = make_selector("qe", "comet", options)
    metric = selector.loaded  # the same loaded scorer, applied pair by pair
    for s, chosen in zip(sets("sample16", 2), selector.select(sets("sample16", 2))):
        alone = [metric.score([s.source], [c], [()])[0] for c in s.candidates]
        assert chosen.scores == pytest.approx(alone, abs=TOLERANCE, rel=0)
        assert spread(alone) > 100 * TOLERANCE
        assert chosen.index == choose(chosen.scores, True)
    assert selector.signature().startswith("qe:comet|max|model:")


@pytest.mark.parametrize("mode", ["mbr", "qe"])
def test_xcomet_selects_in_either_mode(mode):
    """XCOMET reads a reference where there is one: its score with the pseudo-reference for mbr,
    without one for qe (its error spans are not part of the selection)."""
    options = resolved(comet_model=str(COMET / "xcomet_like"))
    selector = make_selector(mode, "comet", options)
    metric = selector.loaded  # the same loaded scorer, applied pair by pair
    s = sets("beam8", 1)[0]
    s = CandidateSet(s.id, s.source, s.candidates[:3])
    chosen = selector.select([s])[0]
    if mode == "mbr":
        expected = brute_force_mbr(metric, s)
    else:
        expected = [metric.score([s.source], [c], [()])[0][0] for c in s.candidates]
    assert chosen.scores == pytest.approx(expected, abs=TOLERANCE, rel=0)
    assert spread(expected) > 100 * TOLERANCE and chosen.index == choose(chosen.scores, True)


@pytest.mark.parametrize("qe", [False, True], ids=["mbr", "qe"])
def test_metricx_selects_the_lowest_error(metricx_folder, qe):
    """MetricX is an error (0 best): the selection is the candidate of the LOWEST expected error
    (mbr) or QE score, the scores written as the metric gives them."""
    options = metricx_options(metricx_folder, qe)
    selector = make_selector("qe" if qe else "mbr", "metricx", options)
    metric = selector.loaded
    examples = [CandidateSet(s.id, s.source, s.candidates[:4]) for s in sets("beam8", 2)]  # 16 pairs each
    for s, chosen in zip(examples, selector.select(examples)):
        if qe:
            expected = [metric.score([s.source], [c], [()])[0] for c in s.candidates]
        else:
            expected = brute_force_mbr(metric, s)
        assert chosen.scores == pytest.approx(expected, abs=1e-5, rel=0)  # the MetricX tests' tolerance (25-point scale)
        assert spread(expected) > 1e-3
        assert chosen.scores[chosen.index] == min(chosen.scores)
        assert chosen.index != max(range(len(expected)), key=expected.__getitem__)
    assert selector.signature().startswith(("qe" if qe else "mbr") + ":metricx|")
    assert "|min|" in selector.signature()


def test_bertscore_mbr_equals_the_scorer_on_every_pair():
    options = resolved(**BERTSCORE_OPTIONS)
    selector = make_selector("mbr", "bertscore", options)
    metric = selector.loaded
    for s, chosen in zip(sets("beam8", 2), selector.select(sets("beam8", 2))):
        expected = brute_force_mbr(metric, s)  # F1, the main key
        assert chosen.scores == pytest.approx(expected, abs=TOLERANCE, rel=0)
        assert spread(expected) > 100 * TOLERANCE
        assert chosen.index == choose(chosen.scores, True)


def test_ties_go_to_the_earlier_candidate_either_way():
    assert choose([0.5, 0.7, 0.7, 0.1], True) == 1
    assert choose([3.0, 1.0, 2.0, 1.0], False) == 1
    assert choose([2.0, 2.0], False) == choose([2.0, 2.0], True) == 0


def test_identical_candidates_tie_and_the_first_is_chosen(metricx_folder):
    s = sets("beam8", 1)[0]
    same = CandidateSet(s.id, s.source, (s.candidates[3], s.candidates[3], s.candidates[3]))
    chosen = make_selector("mbr", "metricx", metricx_options(metricx_folder, False)).select([same])[0]
    assert chosen.index == 0 and len(set(chosen.scores)) == 1


# --- checks before any model loads ---------------------------------------------------------------

def _never(name):
    raise AssertionError(f"{name} loaded before the selection's checks")


@pytest.mark.parametrize("mode,metric,given,said", [
    ("qe", "comet", {"comet_model": str(COMET / "wmt22_like")},
     r"^--select qe --select_metric comet: --comet_model .*wmt22_like needs a reference, and qe scores each "
     r"candidate against its source alone; expected a reference-free model"),
    ("mbr", "comet", {"comet_model": str(COMET / "kiwi_like")},
     r"^--select mbr --select_metric comet: --comet_model .*kiwi_like is reference-free .*expected a "
     r"reference-based model \(or --select qe\)$"),
    ("mbr", "metricx", {"metricx_qe": True},
     r"^--select mbr --select_metric metricx: --metricx_qe makes MetricX reference-free"),
    ("qe", "metricx", {},
     r"^--select qe --select_metric metricx: qe scores each candidate against its source alone; expected --metricx_qe"),
    ("mbr", "bertscore", {**BERTSCORE_OPTIONS, "bertscore_idf": True},
     r"^--select mbr --select_metric bertscore: --bertscore_idf is not supported in selection"),
    ("qe", "bertscore", BERTSCORE_OPTIONS,
     r"^--select qe --select_metric bertscore: qe with bertscore is not built; expected comet or metricx$"),
    ("qe", "bleu", {}, r"^--select qe --select_metric bleu: bleu needs a reference"),
])
def test_what_a_mode_cannot_use_is_refused_before_any_model_loads(mode, metric, given, said):
    with pytest.raises(ConfigError, match=said):
        make_selector(mode, metric, resolved(**given), load=_never)


def test_a_model_that_is_not_there_is_refused_before_it_loads(tmp_path):
    from seq2seq_eval.errors import ModelError

    with pytest.raises(ModelError, match=rf"--comet_model {tmp_path / 'nothing'}"):
        make_selector("mbr", "comet", resolved(comet_model=str(tmp_path / "nothing")), load=_never)


def test_a_model_that_does_not_fit_stops_a_run_before_generation(tmp_path, capsys):
    """A COMET checkpoint whose weights do not fit its encoder's config, named for --select in a
    run: one line naming it, before the generator loads; nothing written, nothing journaled."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(COMET / "wmt22_like", bad)
    config = json.loads((bad / "tiny-xlmr" / "config.json").read_text())
    config["hidden_size"] *= 2
    (bad / "tiny-xlmr" / "config.json").write_text(json.dumps(config))
    save = tmp_path / "out"
    rc = main(["--n_obs", "4", "--num_return_sequences", "4", "--num_beams", "4", "--select", "mbr",
               "--select_metric", "comet", "--comet_model", str(bad), "--save_dir", str(save)])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("seq2seq_eval: error:")]
    assert rc != 0 and len(said) == 1 and f"--comet_model {bad}: the checkpoint does not match" in said[0], err
    assert not save.exists() and not Path(f"{save}_tmp").exists()  # no temp dir claimed: nothing generated


# --- the command -------------------------------------------------------------------------------

def test_select_with_comet_end_to_end(capsys, tmp_path):
    model = str(COMET / "wmt22_like")
    path = tmp_path / "c.jsonl"
    path.write_text("".join(line + "\n" for line in FIXTURES["sample16"].read_text(encoding="utf-8").splitlines()[:2]),
                    encoding="utf-8")
    assert main(["select", "--candidates", str(path), "--select", "mbr", "--select_metric", "comet",
                 "--comet_model", model]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(x) for x in out.splitlines()]
    expected = make_selector("mbr", "comet", resolved(comet_model=model)).select(sets("sample16", 2))
    assert [x["id"] for x in lines] == [s.id for s in sets("sample16", 2)]
    assert [(x["selected"], tuple(x["select_scores"])) for x in lines] == [(e.index, e.scores) for e in expected]
    assert all(x["prediction"] == s.candidates[x["selected"]] for x, s in zip(lines, sets("sample16", 2)))
    # The model's kind is checked before the file is scored: a CometKiwi for mbr is one line.
    assert main(["select", "--candidates", str(path), "--select", "mbr", "--select_metric", "comet",
                 "--comet_model", str(COMET / "kiwi_like")]) != 0
    out, err = capsys.readouterr()
    assert not out and len(err.strip().splitlines()) == 1 and "is reference-free" in err


def test_select_with_comet_is_the_same_bytes_at_any_threads_and_ranks(tmp_path):
    """COMET-MBR's selections published by one process of 2 torch threads (OMP_NUM_THREADS) and
    by 2 ranks of 1: the bytes this single-threaded process selects. The sampled fixture (its
    largest example 16 distinct candidates: 256 pairs in one pass) 4 times under new ids: 2 of
    select's batches."""
    from seq2seq_eval.selection.ranks import PER_BATCH, selection_lines

    records = [json.loads(line) for line in FIXTURES["sample16"].read_text(encoding="utf-8").splitlines()]
    examples = [CandidateSet(f"{c}-{r['id']}", r["source"], tuple(r["candidates"])) for c in range(4) for r in records]
    assert len(examples) > PER_BATCH
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": e.id, "source": e.source, "candidates": list(e.candidates)}) + "\n"
                            for e in examples), encoding="utf-8")
    model = str(COMET / "wmt22_like")
    want = selection_lines(examples, make_selector("mbr", "comet", resolved(comet_model=model)))
    args = ["select", "--candidates", str(path), "--select", "mbr", "--select_metric", "comet", "--comet_model", model]
    for name, launch in (("2 threads", lambda a: single(a, cwd=tmp_path, env={"OMP_NUM_THREADS": "2"})),
                         ("2 ranks", lambda a: run_ranks(2, a, cwd=tmp_path))):
        out = tmp_path / f"{name}.jsonl"
        assert_ok(launch([*args, "--output", str(out)]))
        assert out.read_text(encoding="utf-8").splitlines() == want, name


# --- parity with mbrs 0.1.8 (side environment) --------------------------------------------------

@pytest.fixture(scope="module")
def mbrs_models() -> dict:
    """mbrs' COMET-MBR and CometKiwi reranking on both fixtures, one side process each."""
    if not MBRS_PYTHON.is_file():
        pytest.skip(f"no mbrs side environment at {MBRS_PYTHON} (docs/selection.md says how to make one)")
    out = {}
    for kind, model in (("comet", "wmt22_like"), ("cometkiwi", "kiwi_like")):
        side = subprocess.run([str(MBRS_PYTHON), str(REPO / "tests" / "mbrs_models_side.py"), kind, str(COMET / model),
                               *map(str, FIXTURES.values())], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
        assert side.returncode == 0, side.stderr[-2000:]
        out[kind] = json.loads(side.stdout)
    return out


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("kind", ["comet", "cometkiwi"])
def test_parity_with_mbrs(mbrs_models, name, kind):
    model, mode = ("wmt22_like", "mbr") if kind == "comet" else ("kiwi_like", "qe")
    examples = sets(name)
    ours = make_selector(mode, "comet", resolved(comet_model=str(COMET / model))).select(examples)
    theirs = mbrs_models[kind][str(FIXTURES[name])]
    compared = 0
    for s, mine, m in zip(examples, ours, theirs, strict=True):
        assert m["id"] == s.id
        assert mine.scores == pytest.approx(m["expected"], abs=TOLERANCE, rel=0)
        if kind == "comet":
            n = len(s.candidates)
            assert mine.scores == pytest.approx([sum(row) / n for row in m["pairs"]], abs=TOLERANCE, rel=0)
        top = sorted(m["expected"], reverse=True)
        if top[0] - top[1] > TOLERANCE:
            assert mine.index == m["selected"]
            compared += 1
    assert compared > 0, "no example with a unique best: the fixture compares no selection"
