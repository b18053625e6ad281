"""evaluate()'s ranks agree or fail together (tests/api_agree.py on 2 gloo ranks):
different settings stop every rank naming the fields, a rank's refused arguments or its failure
mid-run reach every rank with that rank's message, a rank that never calls is named, and the
job's group and the next evaluate() work afterwards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from conftest import assert_ok, run_ranks

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("agree")
    assert_ok(run_ranks(2, ["--model", str(EMBEDDED_MODEL), "--data", str(EMBEDDED_DATA["translation"]), "--out", str(out)],
                    out, timeout=300, script=HERE / "api_agree.py"))
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]


def _outcomes(ranks: list[dict], case: str) -> list[tuple[str | None, str | None]]:
    return [(r[case]["raised"], r[case].get("message")) for r in ranks]


AGREE = "expected the same settings, model and tokenizer on every rank"


@pytest.mark.parametrize("case, fields", [
    # the option as given, and the effective setting it makes
    ("eos", "eos_token_id (2 vs 3); generation.eos_token_id (2 vs 3)"),
    ("n_obs", "n_obs (6 vs 5)"),
])
def test_different_settings_stop_every_rank_naming_the_field(ranks, case, fields):
    expected = ("RanksDisagree", f"rank 1 differs from rank 0 in {fields}; {AGREE}")
    assert _outcomes(ranks, case) == [expected, expected]


@pytest.mark.parametrize("case, fields", [
    ("weights", r'weights \("[0-9a-f]{64}" vs "[0-9a-f]{64}"\)'),
    ("generation", r"generation\.no_repeat_ngram_size \(0 vs 1\); generation\.repetition_penalty \(1\.0 vs 3\.0\)"),
    ("tokenizer", r"tokenizer\.model_max_length \(1024 vs 4\)"),
])
def test_ranks_whose_objects_differ_stop_before_generating(ranks, case, fields):
    """The same arguments on both ranks, and one rank's model (its weights one ulp apart, or its
    generation_config) or tokenizer another: every rank raises, naming what differs, and nothing
    was generated."""
    outcomes = _outcomes(ranks, case)
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "RanksDisagree", outcomes
    assert re.fullmatch(rf"rank 1 differs from rank 0 in {fields}; {AGREE}", outcomes[0][1]), outcomes[0][1]
    assert all(r[case]["outputs"] == [] for r in ranks)


def test_ranks_whose_objects_are_alike_evaluate(ranks):
    assert [r["same_objects"]["raised"] for r in ranks] == [None, None]
    assert ranks[0]["same_objects"]["bleu"] == ranks[1]["same_objects"]["bleu"] > 0


def test_a_ranks_refused_arguments_reach_every_rank(ranks):
    assert _outcomes(ranks, "refused") == [("ConfigError", "rank 1: --bs must be an integer >= 1, got 0"),
                                          ("ConfigError", "--bs must be an integer >= 1, got 0")]


def test_a_rank_failing_mid_run_gives_every_rank_its_error(ranks):
    # Rank 0 was in a collective when rank 1 left: not gloo's "Connection reset by peer".
    text = f"{EMBEDDED_DATA['translation']}/test.source: no such file on this node"
    assert _outcomes(ranks, "fails_in_prepare") == [("DataError", f"rank 1: {text}"), ("DataError", text)]


def test_rank_0_s_refusal_while_reading_the_examples_is_every_rank_s_of_its_type(ranks):
    """Rank 0 reads the examples for all (ProcessGroup.main_first); its ConfigError reaches the
    other ranks as a ConfigError (the same exit code), named as rank 0's, whichever of the two
    ways a rank hears of a peer's failure comes first (this broadcast, or the error rank 0 publishes)."""
    text = f"{EMBEDDED_DATA['translation']}: example id 'b': refused while reading"
    assert _outcomes(ranks, "refused_while_reading") == [("ConfigError", text), ("ConfigError", f"rank 0: {text}")]


def test_a_rank_that_never_calls_is_named(ranks):
    expected = ("SyncTimeoutError", "rank(s) 1 of 2 never called evaluate() within --sync_timeout 3 s; every rank "
                "of the group must call evaluate(), with the same arguments, or raise sync_timeout")
    # Rank 1, arriving after rank 0 gave up, is told so instead of joining a group nobody else joins.
    assert _outcomes(ranks, "absent") == [expected, expected]


def test_the_job_goes_on(ranks):
    assert all(case["all_reduce"] == 2.0 for r in ranks for case in r.values())
    assert [r["ok"]["raised"] for r in ranks] == [None, None] and ranks[0]["ok"]["bleu"] == ranks[1]["ok"]["bleu"] > 50
