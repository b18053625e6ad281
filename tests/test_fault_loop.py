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


def test_the_instrumentation_numbers_every_primitive_and_fails_the_nth(tmp_path):
    """Each primitive the package writes with (grep seq2seq_eval for os.open, os.write, os.fsync,
    os.replace, os.unlink, os.mkdir, os.rmdir, open, Path.write_*, pyarrow.OSFile, shutil) is
    counted once under the root and not outside it; the planned errno replaces the N-th
    operation, which is then not done. In a forked child: the wrappers are process-wide."""
    import json
    import os
    import shutil

    from fsfaults import Instrument, Plan

    root, outside, report = tmp_path / "root", tmp_path / "outside", tmp_path / "report.json"
    root.mkdir()
    outside.mkdir()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import pyarrow

            inst = Instrument([str(root)], Plan(at=17, fault="EIO"), str(tmp_path / "ops.log")).install()
            steps = []

            def did(what):
                steps.append((what, inst.count))

            for base in (outside, root):  # outside first: nothing of it is counted
                fd = os.open(base / "a", os.O_WRONLY | os.O_CREAT, 0o644)
                os.write(fd, b"x")
                os.fsync(fd)
                os.close(fd)
                did("os.open+write+fsync")
                with open(base / "b", "w") as f:
                    f.write("y")
                did("open+write")
                (base / "c").write_bytes(b"z")
                did("write_bytes")
                os.replace(base / "c", base / "d")
                os.unlink(base / "d")
                did("replace+unlink")
                os.makedirs(base / "e" / "f")
                (base / "e" / "f" / "g").write_text("w")
                shutil.rmtree(base / "e")  # with dir_fd: unlink g, rmdir f, rmdir e
                did("makedirs+rmtree")
                try:
                    pyarrow.OSFile(str(base / "h"), "wb").close()
                except OSError as e:
                    steps.append(("OSFile failed", e.errno))
                steps.append(("h made", (base / "h").exists()))
                did("OSFile")
            os.rename(root / "a", root / "a2")
            did("rename after the fault")
            report.write_text(json.dumps(steps))
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    steps = [tuple(s) for s in json.loads(report.read_text())]
    # Outside the root: 0 all along; then create, write, fsync (3); create, write (5); create and
    # write through io.open (7); rename, unlink (9); two mkdirs, create, write, unlink, two rmdirs
    # (16); the OSFile's create (17), which fails with EIO and makes nothing; the rename after it
    # is counted (18) and done.
    import errno

    assert steps[:7] == [("os.open+write+fsync", 0), ("open+write", 0), ("write_bytes", 0), ("replace+unlink", 0),
                         ("makedirs+rmtree", 0), ("h made", True), ("OSFile", 0)], steps
    assert steps[7:] == [("os.open+write+fsync", 3), ("open+write", 5), ("write_bytes", 7), ("replace+unlink", 9),
                         ("makedirs+rmtree", 16), ("OSFile failed", errno.EIO), ("h made", False), ("OSFile", 17),
                         ("rename after the fault", 18)], steps
    assert (root / "a2").exists() and not (root / "e").exists()
