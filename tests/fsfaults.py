"""Every filesystem operation a command makes under given root folders, numbered; and a fault at
the N-th (SQLite's I/O-error and crash tests are the model). No hook in the tool: the primitives
it calls (os.open, os.write, os.fsync, os.rename, ..., builtins.open and the file objects it
returns, pyarrow's OSFile) are wrapped in this process only, so a step the tool adds is counted
without anyone listing it.

What is counted, for a path under one of the roots (a file descriptor's path read from /proc):
  create    os.open with O_CREAT (or for writing), open()/io.open()/Path.open/write_* for writing,
            pyarrow.OSFile for writing, os.link, os.symlink
  write     os.write, os.pwrite, os.sendfile, a write()/writelines() on a file opened for writing,
            os.truncate, os.ftruncate, a file object's truncate()
  fsync     os.fsync, os.fdatasync (of a file or a folder)
  rename    os.rename, os.replace
  unlink    os.unlink, os.remove
  mkdir     os.mkdir (os.makedirs and Path.mkdir call it)
  rmdir     os.rmdir (shutil.rmtree calls it and os.unlink, with dir_fd: resolved)
Not counted: the writes pyarrow's C++ makes through an OSFile (its create is), flock.

The fault at the N-th counted operation (`Plan`): `kill` (SIGKILL to itself, before the
operation), `term` (SIGTERM to itself, then the operation goes on as the run's handler lets it),
or an errno (`EPERM`, `ENOSPC`, `EIO`, `EROFS`): OSError raised in place of the operation, which
is not done. `at_match` instead names the operation by its kind and a part of its path (the k-th
such), for setting up a state (a run killed in its publish).

Before each counted operation a `Reader` may look at the output folders as any reader could at
that instant, and note what it should never see (`violations`).

As a script (`python fsfaults.py SPEC.json ARGS...`, forked from tests/forked.py's warm server):
the tool's command line ARGS (or, with SPEC's "evaluate", api.evaluate with those keyword
arguments) under the instrumentation SPEC describes; the numbered operations go to SPEC's "log",
one line each, written before the operation (so a kill keeps them).
"""

from __future__ import annotations

import builtins
import errno as errno_mod
import io
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ERRNOS = {"EPERM": errno_mod.EPERM, "ENOSPC": errno_mod.ENOSPC, "EIO": errno_mod.EIO, "EROFS": errno_mod.EROFS}
FAULTS = ("kill", "term", "EPERM", "ENOSPC", "EIO")
KINDS = ("create", "write", "fsync", "rename", "unlink", "mkdir", "rmdir")

# The keys of a metric or run-info file that differ between two runs of the same command
# (timings, dates, memory): dropped when two runs' files are compared.
_VOLATILE = re.compile(r"^resume$|date|seconds|_started|_finished|throughput|per_second|memory|timings|^total$|^waiting$")


def normal(name: str, data: bytes) -> str:
    """A file's content as two runs of the same command agree on it: a JSON object without its
    timings and dates, anything else as its bytes (hex digest)."""
    import hashlib

    if name.endswith(".json"):
        try:
            value = json.loads(data)
        except ValueError:
            pass
        else:
            return json.dumps(_drop_volatile(value), sort_keys=True)
    return hashlib.sha256(data).hexdigest()


def _drop_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_volatile(v) for k, v in value.items() if not _VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [_drop_volatile(v) for v in value]
    return value


@dataclass
class Plan:
    """Where the fault goes: at the `at`-th counted operation, or at the `at_match`
    [kind, part of the path, k]-th; `fault` one of FAULTS (or EROFS)."""

    at: int = 0
    fault: str = "kill"
    at_match: list | None = None


_LEGACY = ("preds.txt", "metrics.json")


def _legacy_named(n: str) -> bool:
    return n in _LEGACY


def _run_outputs(n: str) -> bool:
    return n not in _LEGACY


def _group(completion: str) -> Callable[[str], bool]:
    return _legacy_named if completion in _LEGACY else _run_outputs


@dataclass
class Reader:
    """What a reader may find in the output folders at any instant. `sets`: each complete run's
    files per folder (name: normal()), `completion`: the names whose presence says a run
    completed. Whenever one of them is visible, every file of a known run's name visible in any
    of the folders must be that one run's, and all of that run's other files must be there (its
    completion files are moved aside one after another, first, and put back one after another,
    last: while they move, some are there and some not, all of one run, beside its whole set)."""

    folders: list[str]
    sets: dict[str, dict[str, dict[str, str]]]
    completion: list[str]
    violations: list[str] = field(default_factory=list)

    def look(self, real_listdir: Callable, real_open: Callable) -> str | None:
        seen: dict[str, dict[str, str]] = {}
        for folder in self.folders:
            try:
                entries = real_listdir(folder)
            except OSError:
                entries = []
            seen[folder] = {}
            names = {n for s in self.sets.values() for n in s.get(folder, {})}
            for n in entries:
                if n in names:
                    try:
                        with real_open(os.path.join(folder, n), "rb") as f:
                            seen[folder][n] = normal(n, f.read())
                    except OSError:
                        pass
        complete = [(f, n) for f in self.folders for n in seen[f] if n in self.completion]
        if not complete:
            return None
        # What each completion file completes: SCORE_PATH the legacy form's SAVE_PATH, any other the
        # run's own outputs ({type_path}_*, the legacy pseudolabel file), a report itself. A later
        # command of another kind may leave one group and replace the other (each its own run's).
        groups = {id(g): g for c in (n for _, n in complete) for g in [_group(c)]}
        for governed in groups.values():
            if not any(governed(n) for _, n in complete):
                continue
            view = {f: {n: v for n, v in seen[f].items() if governed(n)} for f in self.folders}
            if not self._one_whole_run(view, governed):
                runs = [r for r, files in self.sets.items()
                        if all(files.get(f, {}).get(n) == v for f in self.folders for n, v in view[f].items())]
                what = (f"an incomplete set of {'/'.join(runs)}" if runs else "files of two runs")
                return (f"{', '.join(f'{os.path.basename(f)}/{n}' for f, n in complete if governed(n))} visible "
                        f"beside {what}: " + "; ".join(f"{os.path.basename(f)}: {self._whose(seen[f], f)}" for f in self.folders))
        return None

    def _one_whole_run(self, view: dict[str, dict[str, str]], governed: Callable[[str], bool]) -> bool:
        for files in self.sets.values():
            if all(files.get(f, {}).get(n) == v for f in self.folders for n, v in view[f].items()) and all(
                    view[f].get(n) == v for f in self.folders for n, v in files.get(f, {}).items()
                    if governed(n) and n not in self.completion):
                return True
        return False

    def _whose(self, files: dict[str, str], folder: str) -> str:
        parts = []
        for n, v in sorted(files.items()):
            runs = [r for r, s in self.sets.items() if s.get(folder, {}).get(n) == v]
            parts.append(f"{n}({'/'.join(runs) or '?'})")
        return " ".join(parts) or "nothing"


class Instrument:
    """Installs the wrappers (once per process) and numbers each operation under `roots`."""

    def __init__(self, roots: list[str], plan: Plan | None = None, log: str | None = None,
                 reader: Reader | None = None) -> None:
        self.roots = [os.path.realpath(r) for r in roots]
        self.plan = plan
        self.count = 0
        self.matched = 0
        self.reader = reader
        self._log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644) if log else None
        self._local = threading.local()
        self.real: dict[str, Callable] = {}

    # ------------------------------------------------------------ paths

    def _under(self, path: str) -> bool:
        return any(path == r or path.startswith(r + os.sep) for r in self.roots)

    def _fd_path(self, fd: int) -> str:
        try:
            return self.real["readlink"](f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def _path(self, p: Any, dir_fd: int | None = None) -> str:
        if isinstance(p, int):
            return self._fd_path(p)
        try:
            p = os.fsdecode(os.fspath(p))
        except TypeError:
            return ""
        if dir_fd is not None and not os.path.isabs(p):
            p = os.path.join(self._fd_path(dir_fd), p)
        # The folder resolved, not the last part: a link's own path is what is changed.
        head, tail = os.path.split(os.path.abspath(p))
        return os.path.join(os.path.realpath(head), tail)

    # ------------------------------------------------------------ one operation

    def op(self, kind: str, *paths: str) -> None:
        """Called before each operation; counts it when one of its paths is under a root, and
        brings the planned fault there."""
        if getattr(self._local, "busy", False):
            return
        if not any(self._under(p) for p in paths if p):
            return
        self._local.busy = True
        try:
            self.count += 1
            n = self.count
            where = " -> ".join(p for p in paths if p)
            if self.reader is not None:
                seen = self.reader.look(self.real["listdir"], self.real["open"])
                if seen:
                    self.reader.violations.append(f"before op {n} ({kind} {where}): {seen}")
                    self._write(f"VIOLATION before op {n} ({kind} {where}): {seen}\n")
            self._write(f"{n}\t{kind}\t{where}\n")
            plan = self.plan
            hit = False
            if plan is not None:
                if plan.at_match:
                    want_kind, part, k = plan.at_match
                    if kind == want_kind and part in where:
                        self.matched += 1
                        hit = self.matched == k
                else:
                    hit = n == plan.at
        finally:
            self._local.busy = False
        if not hit:
            return
        self._write(f"FAULT\t{plan.fault}\t{n}\t{kind}\t{where}\n")
        if plan.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif plan.fault == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            code = ERRNOS[plan.fault]
            raise OSError(code, os.strerror(code), paths[0])

    def _write(self, text: str) -> None:
        if self._log_fd is not None:
            self.real["write"](self._log_fd, text.encode("utf-8", "surrogateescape"))

    # ------------------------------------------------------------ the wrappers

    def install(self) -> "Instrument":
        import pyarrow

        for name in ("open", "write", "pwrite", "sendfile", "fsync", "fdatasync", "rename", "replace", "unlink",
                     "remove", "mkdir", "rmdir", "link", "symlink", "truncate", "ftruncate", "readlink", "listdir"):
            self.real[name] = getattr(os, name)
        self.real["open"] = builtins.open
        self.real["os_open"] = os.open
        self.real["OSFile"] = pyarrow.OSFile
        me = self
        writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

        def os_open(path, flags, mode=0o777, *, dir_fd=None):
            if flags & writing:
                me.op("create" if flags & os.O_CREAT else "write", me._path(path, dir_fd))
            return me.real["os_open"](path, flags, mode, dir_fd=dir_fd)

        def by_fd(name: str, kind: str) -> Callable:
            real = me.real[name]

            def wrapped(fd, *args, **kwargs):
                me.op(kind, me._fd_path(fd if isinstance(fd, int) else fd.fileno()))
                return real(fd, *args, **kwargs)
            return wrapped

        def sendfile(out_fd, in_fd, *args, **kwargs):
            me.op("write", me._fd_path(out_fd))
            return me.real["sendfile"](out_fd, in_fd, *args, **kwargs)

        def by_path(name: str, kind: str, two: bool = False) -> Callable:
            real = me.real[name]

            def wrapped(*args, **kwargs):
                if two:
                    paths = (me._path(args[0], kwargs.get("src_dir_fd")), me._path(args[1], kwargs.get("dst_dir_fd")))
                else:
                    paths = (me._path(args[0], kwargs.get("dir_fd")),)
                me.op(kind, *paths)
                return real(*args, **kwargs)
            return wrapped

        def truncate(path, length):
            me.op("write", me._path(path))
            return me.real["truncate"](path, length)

        def opened(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True, opener=None):
            real = me.real["open"](file, mode, buffering, encoding, errors, newline, closefd, opener) \
                if opener is not None or isinstance(file, int) else None
            writes = any(c in mode for c in "wax+")
            path = me._path(file)
            if real is None:
                if writes:
                    me.op("create", path)
                real = me.real["open"](file, mode, buffering, encoding, errors, newline, closefd, opener)
            if writes and me._under(path if path else ""):
                return _Writer(real, me, path)
            return real

        def os_file(path, mode="r"):
            if "w" in mode or "a" in mode:
                me.op("create", me._path(path))
            return me.real["OSFile"](path, mode)

        os.open = os_open
        for name in ("write", "pwrite"):
            setattr(os, name, by_fd(name, "write"))
        os.ftruncate = by_fd("ftruncate", "write")
        os.fsync = by_fd("fsync", "fsync")
        os.fdatasync = by_fd("fdatasync", "fsync")
        os.sendfile = sendfile
        os.rename = by_path("rename", "rename", two=True)
        os.replace = by_path("replace", "rename", two=True)
        os.link = by_path("link", "create", two=True)
        os.symlink = by_path("symlink", "create", two=True)
        os.unlink = by_path("unlink", "unlink")
        os.remove = by_path("remove", "unlink")
        os.mkdir = by_path("mkdir", "mkdir")
        os.rmdir = by_path("rmdir", "rmdir")
        os.truncate = truncate
        builtins.open = io.open = opened  # pathlib's open and write_* call io.open; os.fdopen too
        pyarrow.OSFile = os_file
        return self


class _Writer:
    """A file opened for writing under a root: each write, writelines and truncate counted."""

    def __init__(self, f: Any, inst: Instrument, path: str) -> None:
        self._f, self._inst, self._path = f, inst, path

    def write(self, data):
        self._inst.op("write", self._path)
        return self._f.write(data)

    def writelines(self, lines):
        self._inst.op("write", self._path)
        return self._f.writelines(lines)

    def truncate(self, *args):
        self._inst.op("write", self._path)
        return self._f.truncate(*args)

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


# ---------------------------------------------------------------- as a script


def _evaluate(kwargs: dict) -> int:
    """api.evaluate with in-memory examples, reported as the command line reports: one line."""
    from seq2seq_eval import evaluate
    from seq2seq_eval.errors import EvalError

    try:
        evaluate(**kwargs)
    except EvalError as e:
        print(f"seq2seq_eval: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    plan = Plan(**spec["plan"]) if spec.get("plan") else None
    reader = Reader(**spec["reader"]) if spec.get("reader") else None
    inst = Instrument(spec["roots"], plan, spec.get("log"), reader).install()
    if spec.get("evaluate") is not None:
        code = _evaluate(spec["evaluate"])
    else:
        from seq2seq_eval import pandas_probe
        from seq2seq_eval.cli import main as cli_main

        pandas_probe.skip()  # as `python -m seq2seq_eval` does: the tool's own process
        code = cli_main(argv[1:])
    inst._write(f"END\t{code}\t{inst.count}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
