"""One input, one verdict, whatever the entry point: the run (text files, JSON Lines through
--data_dir and through --dataset), `evaluate()`, `score` and `compare` (command line and Python)
accept or refuse the same examples alike, and a refusal names the same rule (inputs/checks.py).

Each case is a small set of examples (sources, references, ids, two systems' predictions); each
entry point gets it in the form it takes, where that form can hold it (a text file has no ids; the
run takes no predictions). The runs are real processes, side by side; the rest run in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import seq2seq_eval
from seq2seq_eval.cli import main
from seq2seq_eval.errors import DataError, EvalError
from conftest import single

SOURCES = ["the cat sat on the mat", "a dog runs in the park", "it is a red house"]
REFERENCES = ["the cat sat on a mat", "a dog runs", "it is red"]
PREDICTIONS = ["the cat sat", "a dog runs fast", "it is a red house"]
OTHER = ["a cat sat on the mat", "the dog runs", "it is red"]

# The rules' words (inputs/checks.py and the count checks), as a refusal says them.
EMPTY_REFERENCE = r"blank reference \((empty|whitespace only)"
EMPTY_SOURCE = r"blank source \((empty or )?whitespace only"
NOT_A_TEXT = "expected a non-empty string"
EMPTY_LIST = "an empty list; expected one or more references"
COUNT = r"\b(\d+) (lines|entries)\b.*\b(but|for)\b.*\d+"
DUPLICATE = "duplicated id"
BAD_ID = "an id must be a string or an integer"
NOTHING = r"no (examples|records|lines)|: empty;|hold no examples"
SURROGATE = r"holds a lone surrogate \(U\+D[89A-F][0-9A-F]{2} at character \d+"

# id, what differs from the examples above, the verdict (None: accepted; else the rule, a regex).
CASES = [
    ("accepted", {}, None),
    ("empty-reference", {"references": ["the cat", "", "it is red"]}, EMPTY_REFERENCE),
    ("whitespace-reference", {"references": ["the cat", " \t ", "it is red"]}, EMPTY_REFERENCE),
    ("line-separator-reference", {"references": ["the cat", "\u2028\x85", "it is red"]}, EMPTY_REFERENCE),
    ("empty-source", {"sources": ["the cat", "   ", "it is red"]}, EMPTY_SOURCE),
    ("fewer-references", {"references": ["the cat", "a dog"]}, COUNT),
    ("more-references", {"references": ["the cat", "a dog", "red", "blue"]}, COUNT),
    ("null-reference", {"references": ["the cat", None, "red"]}, NOT_A_TEXT),
    ("empty-reference-list", {"references": [["the cat"], [], ["red"]]}, EMPTY_LIST),
    ("empty-reference-in-list", {"references": [["the cat", "a cat"], ["a dog", ""], ["red"]]}, EMPTY_REFERENCE),
    ("duplicated-id", {"ids": [5, "x", 5]}, DUPLICATE),
    ("mixed-id-types", {"ids": [0, "0", "007"]}, None),
    ("bool-id", {"ids": [1, True, 2]}, BAD_ID),
    ("float-id", {"ids": [1, 2.5, 3]}, BAD_ID),
    ("empty-prediction", {"predictions": ["the cat", "", "it is red"]}, None),
    ("no-examples", {"sources": [], "references": [], "predictions": [], "other": []}, NOTHING),
    # A JSON escape ("\\udcff") or a Python string can hold a lone surrogate; no file the tool
    # writes (UTF-8) can, nor the tokenizer take it.
    ("surrogate-reference", {"references": ["the cat", "a dog \udcff", "red"]}, SURROGATE),
    ("surrogate-source", {"sources": ["the cat", "a \ud83d dog", "it is red"]}, SURROGATE),
    ("surrogate-in-reference-list", {"references": [["the cat", "a \ud800"], ["a dog"], ["red"]]}, SURROGATE),
    ("surrogate-id", {"ids": [1, "x\udfff", 3]}, SURROGATE),
    ("surrogate-prediction", {"predictions": ["the cat", "a dog \udc80", "it is red"]}, SURROGATE),
]


def _case(changes: dict) -> dict:
    return {"sources": SOURCES, "references": REFERENCES, "ids": None, "predictions": PREDICTIONS, "other": OTHER,
            **changes}


def _as_text_file(values: list) -> bool:
    """Whether a text file (one text per line) can hold these values."""
    return all(isinstance(v, str) and "\n" not in v and "\r" not in v and _utf8(v) for v in values)


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:  # a lone surrogate
        return False


def _write_lines(path: Path, values: list[str]) -> Path:
    path.write_text("".join(v + "\n" for v in values), encoding="utf-8")
    return path


# ------------------------------------------------------------------ the entry points
# Each returns None (accepted) or the one-line message of its refusal; any other outcome fails.


def _cli_line(rc: int, stderr: str) -> str | None:
    """The command line's verdict: None for exit 0; else its one error line (exit 1, a DataError),
    or what it printed instead (which matches no rule)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if rc == 0:
        return None
    if rc == 1 and len(lines) == 1 and lines[0].startswith("seq2seq_eval: error: "):
        return lines[0]
    return f"not a one-line refusal (exit {rc}): {stderr[-400:]!r}"


def _in_process(call: Any) -> str | None:
    try:
        call()
    except DataError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001  (an untyped error is a verdict no case expects)
        return f"untyped {type(e).__name__}: {e}"
    return None


def _main(argv: list[str]) -> str | None:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(argv)
    return _cli_line(rc, err.getvalue())


def run_inputs(case: dict, folder: Path) -> dict[str, list[str]]:
    """The run's command lines for this case: the legacy text files, and one JSON Lines file
    through --data_dir and through --dataset (where a record per example can hold it)."""
    folder.mkdir(parents=True)
    runs = {}
    refs, ids = case["references"], case["ids"]
    if ids is None and _as_text_file(case["sources"]) and _as_text_file(refs):
        _write_lines(folder / "test.source", case["sources"])
        _write_lines(folder / "test.target", refs)
        runs["run: text files"] = ["--data_dir", str(folder)]
    if len(refs) == len(case["sources"]):
        records = [{"source": s, "target": t} | ({} if ids is None else {"id": i})
                   for s, t, i in zip(case["sources"], refs, ids or [None] * len(refs))]
        data = folder / "test.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        runs["run: --data_dir JSON Lines"] = ["--data_dir", str(data)]
        runs["run: --dataset JSON Lines"] = ["--dataset", str(data)]
    return runs


def evaluate_lists(case: dict, model: Path, folder: Path) -> str | None:
    # The options a script passes through from its own argparse, unset: None means not given.
    unset = dict(data_dir=None, dataset=None, input_path=None, reference_path=None, n_obs=None, metrics=None)
    return _in_process(lambda: seq2seq_eval.evaluate(
        str(model), sources=case["sources"], references=case["references"], ids=case["ids"], bs=4,
        save_dir=str(folder / "save"), tmp_dir=str(folder / "tmp"), **unset))


def evaluate_file(data: Path, model: Path, folder: Path) -> str | None:
    return _in_process(lambda: seq2seq_eval.evaluate(str(model), data_dir=str(data), bs=4, save_dir=str(folder / "save"),
                                                     tmp_dir=str(folder / "tmp")))


def score_cli(case: dict, folder: Path) -> str | None:
    folder.mkdir(parents=True)
    return _main(["score", "--predictions", str(_write_lines(folder / "p.txt", case["predictions"])),
                  "--references", str(_write_lines(folder / "r.txt", case["references"])),
                  "--sources", str(_write_lines(folder / "s.txt", case["sources"]))])


def score_python(case: dict) -> str | None:
    return _in_process(lambda: seq2seq_eval.score(case["predictions"], case["references"], sources=case["sources"],
                                                  task=None, comet_model=None))


def compare_cli(case: dict, folder: Path) -> str | None:
    folder.mkdir(parents=True)
    return _main(["compare", "--predictions", str(_write_lines(folder / "a.txt", case["predictions"])),
                  str(_write_lines(folder / "b.txt", case["other"])),
                  "--references", str(_write_lines(folder / "r.txt", case["references"])),
                  "--sources", str(_write_lines(folder / "s.txt", case["sources"])),
                  "--task", "translation", "--n_samples", "10"])


def compare_python(case: dict) -> str | None:
    return _in_process(lambda: seq2seq_eval.compare({"a": case["predictions"], "b": case["other"]}, case["references"],
                                                    sources=case["sources"], n_samples=10, seed=None, paired_test=None))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("verdicts")


@pytest.fixture(scope="module")
def verdicts(tiny_model, root) -> dict[str, dict[str, str | None]]:
    """Every case through every entry point that can take it: case id -> entry point -> verdict.
    A case that changes only the predictions goes to score and compare alone."""
    found: dict[str, dict[str, Any]] = {case_id: {} for case_id, _, _ in CASES}
    launches = []
    for case_id, changes, _ in CASES:
        case, folder = _case(changes), root / case_id
        if not changes or set(changes) - {"predictions", "other"}:
            for name, args in run_inputs(case, folder / "data").items():
                save = folder / re.sub(r"\W+", "_", name)
                launches.append((case_id, name, ["--model_name", str(tiny_model), *args, "--bs", "4",
                                                 "--save_dir", str(save)]))
            found[case_id]["evaluate(): lists"] = evaluate_lists(case, tiny_model, folder / "evaluate")
            if (folder / "data" / "test.jsonl").exists():
                found[case_id]["evaluate(): data_dir"] = evaluate_file(folder / "data" / "test.jsonl", tiny_model,
                                                                       folder / "evaluate_file")
        if case["ids"] is None:  # score and compare take no ids
            if all(_as_text_file(case[k]) for k in ("predictions", "other", "references", "sources")):
                found[case_id]["score: command line"] = score_cli(case, folder / "score")
                found[case_id]["compare: command line"] = compare_cli(case, folder / "compare")
            found[case_id]["score()"] = score_python(case)
            found[case_id]["compare()"] = compare_python(case)

    def launch(argv: list[str]) -> str | None:
        proc = single(argv, cwd=root, timeout=180)
        return _cli_line(proc.returncode, proc.stderr)

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [(case_id, name, pool.submit(launch, argv)) for case_id, name, argv in launches]
        for case_id, name, future in futures:
            found[case_id][name] = future.result()
    return found


@pytest.mark.parametrize("case_id, changes, rule", CASES, ids=[c[0] for c in CASES])
def test_every_entry_point_gives_the_same_verdict(verdicts, case_id, changes, rule):
    said = verdicts[case_id]
    # The case reached several entry points (a prediction no file can hold: score() and compare()).
    assert len(said) >= (2 if case_id == "surrogate-prediction" else 4), said
    if rule is None:
        assert said == dict.fromkeys(said), said
    else:
        wrong = {name: message for name, message in said.items() if message is None or not re.search(rule, message)}
        assert wrong == {}, f"expected every entry point to refuse it with {rule!r}: {said}"


def test_mixed_id_types_stay_as_given(verdicts, root):
    """0, "0" and "007" are three ids to every entry point, written back as given."""
    case = root / "mixed-id-types"
    saves = (case / "run_data_dir_JSON_Lines", case / "run_dataset_JSON_Lines", case / "evaluate" / "save",
             case / "evaluate_file" / "save")
    for save in saves:
        rows = [json.loads(line) for line in (save / "test_examples.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [r["id"] for r in rows] == [0, "0", "007"], save


@pytest.mark.parametrize("call", [
    lambda m: seq2seq_eval.evaluate(m, data_dir=None, sources=["a b"], references=["x"], ids=[1, 1]),
    lambda m: seq2seq_eval.evaluate(m, input_path=None, reference_path=None, dataset=None, sources=["a b", " "]),
    lambda m: seq2seq_eval.evaluate(m, data_dir="", sources=["a b"], references=["x"], ids=[True]),
])
def test_none_means_not_given(call, tmp_path, monkeypatch):
    """A script passing its unset options through (data_dir=args.data_dir) gets the data checks,
    not a TypeError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError):
        call(str(tmp_path / "no_model_needed"))


@pytest.mark.parametrize("call", [
    lambda: seq2seq_eval.evaluate(generate_kwargs=[("num_beams", 2)]),
    lambda: seq2seq_eval.score(["a"], ["b"], comet_max_tokens="many"),
    lambda: seq2seq_eval.compare({"a": ["x"], "b": ["y"]}, ["z"], seed="one"),
])
def test_wrong_types_are_typed_errors(call):
    with pytest.raises(EvalError):
        call()
