"""Every kind of command, stopped or failed at sampled filesystem steps, then followed by the next
commands (tests/faultloop.py: the kinds, the faults and what is checked; tests/fsfaults.py: how
the steps are numbered). The whole loop, every step with every fault, is
`python scripts/fault_loop.py`; here each kind tries its first step, its last and one chosen with
a fixed seed, each with one fault (the faults taken in turn over the kinds), and fails if a kind
shows fewer steps than its floor (a loop that stopped finding them)."""

from __future__ import annotations

import pytest

from faultloop import KIND_NAMES, kinds, loop, make_inputs
from fsfaults import FAULTS


@pytest.fixture(scope="module")
def inputs(tiny_model, tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("fault_inputs"), tiny_model)


def test_the_kinds_are_those_the_loop_knows(inputs):
    assert tuple(kinds(inputs)) == KIND_NAMES


@pytest.mark.parametrize("name", KIND_NAMES)
def test_a_kind_of_command_faulted_at_sampled_steps_leaves_one_run_and_says_so(inputs, tmp_path, name, capsys):
    said: list[str] = []
    at = KIND_NAMES.index(name)
    outcome = loop(tmp_path, [name], sample=3, faults=FAULTS[at % len(FAULTS):] + FAULTS[:at % len(FAULTS)],
                   faults_per_op=1, seed=at, report=said.append, inputs=inputs, short=True)[name]
    with capsys.disabled():
        print(f"\n{said[-1]}")
    assert outcome.cases == 3, said
    assert not outcome.failures, "\n".join(outcome.failures)
