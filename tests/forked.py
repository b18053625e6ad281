"""Many short `python -m seq2seq_eval` runs for the price of one interpreter start.

`run_forked(cases, work)` starts one interpreter that imports torch and transformers (what every
run that gets past its flags imports: 3-5 s of the few seconds such a run takes), then forks once
per case. Each child is a process of its own, started as `python -m` starts one: its working
directory, argv and sys.path[0], stdout and stderr on its own file descriptors (so library output
is caught too), SystemExit turned into the exit code and any other exception printed by the
interpreter's hook with exit code 1. What the parent's imports print is what every fresh
interpreter would have printed on each run's stderr: the parent fails if they print anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PARALLEL = 2  # children at once: the runs are short, and the suite runs on 2 cores


def run_forked(cases: dict[str, tuple[list[str], Path]], work: Path, env: dict | None = None,
               timeout: float = 180) -> dict[str, subprocess.CompletedProcess]:
    """{case id: (argv after `python -m seq2seq_eval`, cwd)} -> {case id: CompletedProcess}."""
    from conftest import _env

    work.mkdir(parents=True, exist_ok=True)
    plan = [{"id": case_id, "argv": argv, "cwd": str(cwd), "timeout": timeout} for case_id, (argv, cwd) in cases.items()]
    (work / "plan.json").write_text(json.dumps(plan))
    driver = subprocess.run([sys.executable, __file__, str(work)], capture_output=True, text=True,
                            timeout=timeout * len(plan), env=_env(env))
    assert (driver.returncode, driver.stdout, driver.stderr) == (0, "", ""), \
        f"fork driver exit {driver.returncode}\nSTDOUT:\n{driver.stdout[-3000:]}\nSTDERR:\n{driver.stderr[-3000:]}"
    codes = json.loads((work / "exit_codes.json").read_text())
    return {case["id"]: subprocess.CompletedProcess(
        [sys.executable, "-m", "seq2seq_eval", *case["argv"]], codes[case["id"]],
        (work / f"{case['id']}.out").read_text(), (work / f"{case['id']}.err").read_text()) for case in plan}


# ---------------------------------------------------------------- the driver (run as a script)


def _child(case: dict, work: Path) -> None:
    """Become `python -m seq2seq_eval ARGV` in case["cwd"]; never returns."""
    import atexit
    import runpy
    import signal

    code = 1
    try:
        signal.alarm(int(case["timeout"]))  # a hung run dies instead of hanging the parent
        os.chdir(case["cwd"])
        for fd, suffix in ((1, "out"), (2, "err")):
            target = os.open(work / f"{case['id']}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.path[0] = os.getcwd()  # -m puts the working directory first
        sys.argv = ["-m", *case["argv"]]  # run_module replaces argv[0] with the module's path
        try:
            runpy.run_module("seq2seq_eval", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:  # what the interpreter does with it
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            sys.excepthook(*sys.exc_info())
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _drive(work: Path) -> int:
    # Imported once here instead of in every run; anything they print fails the caller's check.
    import torch  # noqa: F401
    import transformers  # noqa: F401

    sys.stdout.flush()
    sys.stderr.flush()
    plan = json.loads((work / "plan.json").read_text())
    codes: dict[str, int] = {}
    running: dict[int, str] = {}
    for case in plan:
        if len(running) == PARALLEL:
            pid, status = os.wait()
            codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        pid = os.fork()
        if pid == 0:
            _child(case, work)
        running[pid] = case["id"]
    while running:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    (work / "exit_codes.json").write_text(json.dumps(codes))
    return 0


if __name__ == "__main__":
    raise SystemExit(_drive(Path(sys.argv[1])))
