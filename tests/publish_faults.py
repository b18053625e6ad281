"""`python publish_faults.py FOLDER MODE ARGS...`: the tool's command line (ARGS), with every rename
and removal that touches FOLDER (one of its paths lies directly in FOLDER) watched from outside,
for the tests of what a publish leaves behind (tests/test_publish.py). No hook in the tool:
os.rename, os.replace, os.unlink and fcntl.flock are wrapped in this process only.

MODE `kill:K`: the process SIGKILLs itself just before the K-th such change (K >= 1); `term:K`
sends itself SIGTERM there instead. `kill:K:tree` and `term:K:tree` count the changes in FOLDER's
folders too (a command that writes several folders inside it).
MODE `race:SECONDS:BARRIER`: at the first such change, or the first flock on FOLDER, whichever
comes first, the process creates BARRIER.<pid> and waits (up to 60 s) until another process has
made one too; from then on each change touching FOLDER, or a folder inside it, waits SECONDS
first: two runs started together then publish at the same time, and their moves interleave unless
something serializes them.
"""

from __future__ import annotations

import fcntl
import glob
import os
import signal
import sys
import time

FOLDER = os.path.realpath(sys.argv[1])
MODE = sys.argv[2].split(":")
_real = {name: getattr(os, name) for name in ("rename", "replace", "unlink")}
_real_flock = fcntl.flock
_state = {"changes": 0, "met": False}


def _parent(path: object) -> str:
    return os.path.dirname(os.path.realpath(os.path.abspath(os.fspath(path))))  # type: ignore[arg-type]


def _meet() -> None:
    if _state["met"]:
        return
    _state["met"] = True
    barrier = MODE[2]
    mine = f"{barrier}.{os.getpid()}"
    open(mine, "w").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [p for p in glob.glob(f"{barrier}.*") if p != mine]:
        time.sleep(0.02)


def _watch(name: str):
    def wrapped(*args, **kwargs):
        paths = args[:2] if name != "unlink" else args[:1]
        parents = [_parent(p) for p in paths]
        tree = MODE[-1] == "tree"
        if FOLDER in parents or tree and FOLDER in [os.path.dirname(p) for p in parents]:
            _state["changes"] += 1
            if MODE[0] in ("kill", "term") and _state["changes"] == int(MODE[1]):
                os.kill(os.getpid(), signal.SIGKILL if MODE[0] == "kill" else signal.SIGTERM)
        if MODE[0] == "race" and any(p == FOLDER or p.startswith(FOLDER + os.sep) for p in parents):
            _meet()
            time.sleep(float(MODE[1]))
        return _real[name](*args, **kwargs)
    return wrapped


def _flock(fd, operation):
    if MODE[0] == "race" and os.path.realpath(f"/proc/self/fd/{fd}") == FOLDER:
        _meet()
    return _real_flock(fd, operation)


for _name in _real:
    setattr(os, _name, _watch(_name))
fcntl.flock = _flock

from seq2seq_eval.cli import main  # noqa: E402  (after the wrapping, which it must not bypass)

sys.exit(main(sys.argv[3:]))
