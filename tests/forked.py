"""`python -m seq2seq_eval` without paying for torch's import each time.

A run spends most of its few seconds importing torch and transformers (3-4 s of CPU on this
machine), and the suite starts a few hundred. `ForkServer` starts one interpreter per pytest
process that imports them once, then forks a child per run. The child is a process of its own,
set up the way `python -m` sets one up: the run's environment (torch's threads from its
OMP_NUM_THREADS included), working directory, argv,
sys.path[0] and a fresh __main__, then runpy's `_run_module_as_main` (what -m calls); stdin from
/dev/null; stdout and stderr on its own file descriptors (library output lands there too);
SystemExit made the exit code, any other exception printed by the interpreter's hook with exit
code 1 (the same bytes as a fresh interpreter's, timings aside). What the imports themselves
print would have appeared on every run's stderr: the server refuses to start if they print anything.

The same server forks the ranks of a multi-process job (`run_ranks(n, ...)` in conftest): n
children with the environment a launcher without an agent gives its workers (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT; rank 0 serves the store, as under srun), stopped together as
torchrun stops its workers when one fails. The ranks are real processes talking over gloo; only
their start is cheaper. Fresh interpreters remain wherever the launch is the point: torchrun
itself (`torchrun(n, ...)`: its agent store, restarts and failure report), run_eval.sh, the
tests that signal or kill a process, and `single(..., fresh=True)`.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# What every run that gets past its flags imports (the model's libraries, the metrics' and the
# rank files', this package's own), the bulk of its start-up. Not pandas: a run keeps it out
# (seq2seq_eval/pandas_probe.py), and a run forked from here does the same. Not `datasets`: it reads its cache location from the environment when
# imported, and runs set their own.
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "transformers.generation", "sacrebleu",
           "rouge_score.rouge_scorer", "pyarrow", "seq2seq_eval.cli", "seq2seq_eval.run.runner",
           # What transformers imports lazily on a run's first from_pretrained and generate(), and
           # the modelling code of the two models most runs load (the tests' tiny T5, the embedded
           # Marian): imported in every run otherwise.
           "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
           "transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_sentencepiece",
           "transformers.generation.utils", "transformers.masking_utils", "transformers.modeling_layers",
           "transformers.models.t5.modeling_t5", "transformers.models.marian.modeling_marian",
           "seq2seq_eval.engines.hf", "seq2seq_eval.legacy", "seq2seq_eval.comparison.runs")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (a rendezvous or store port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ForkServer:
    def __init__(self, env: dict[str, str]) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="s2s_fork_"))  # short: a socket path is at most 107 bytes
        self._socket = self._dir / "socket"
        self._log = self._dir / "server.log"
        self._ids = itertools.count()  # names the runs' output files (next() is atomic: single() runs in threads)
        with open(self._log, "w") as log:
            # stdin stays open while this process lives: at EOF the server knows its client is gone.
            self._proc = subprocess.Popen([sys.executable, __file__, str(self._socket)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        first = self._proc.stdout.readline()  # type: ignore[union-attr]
        if first != "ready\n":
            raise RuntimeError(f"fork server did not start: {first}{self._proc.stdout.read()}{self._log.read_text()}")

    def run(self, argv: list[str], cwd: Path, timeout: float, env: dict[str, str], ranks: int = 0,
            script: str | None = None) -> subprocess.CompletedProcess:
        """`python -m seq2seq_eval ARGV` (or `python SCRIPT ARGV`): one process, or with `ranks`
        one process per rank of a job."""
        n = next(self._ids)
        out, err = (self._dir / f"{n}.{s}" for s in ("out", "err"))
        request = {"argv": argv, "cwd": str(cwd), "env": env, "timeout": timeout, "out": str(out), "err": str(err),
                   "ranks": ranks, "script": script}
        args = [sys.executable, *([script] if script else ["-m", "seq2seq_eval"]), *argv]
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(timeout + 30)  # the run is killed at `timeout`; this is for a lost server
                conn.connect(str(self._socket))
                conn.sendall(json.dumps(request).encode() + b"\n")
                reply = json.loads(conn.makefile().readline())
        except (OSError, json.JSONDecodeError) as e:
            raise RuntimeError(f"no answer from the fork server ({e}):\n{self._log.read_text()[-3000:]}") from e
        try:
            # Read as subprocess.run(text=True) reads a pipe: locale encoding, universal newlines.
            return subprocess.CompletedProcess(args, reply["returncode"], out.read_text(), err.read_text())
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    def close(self) -> None:
        self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            self._proc.wait(timeout=30)  # it waits for runs still going (each killed at its timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


# ---------------------------------------------------------------- the server (run as a script)


def _serve(path: str) -> None:
    _preload()
    # Out of the collector's sight: a child's first full collection would otherwise walk every
    # object imported here, writing to each one's page, and copy the whole preloaded heap page by
    # page (copy-on-write) into every run.
    gc.freeze()
    handlers: set[int] = set()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(16)
        print("ready", flush=True)
        while True:
            # Wake up now and then to reap finished handlers (waited for, their runs' CPU time
            # is counted in this process's children, and so in pytest's).
            readable, _, _ = select.select([server, sys.stdin], [], [], 1.0)
            handlers -= {pid for pid in handlers if os.waitpid(pid, os.WNOHANG)[0]}
            if sys.stdin in readable:  # EOF: the pytest process closed its end or died
                for pid in handlers:
                    os.waitpid(pid, 0)
                return
            if server in readable:
                conn, _ = server.accept()
                pid = os.fork()
                if pid == 0:
                    server.close()
                    _handle(conn)
                handlers.add(pid)
                conn.close()


def _preload() -> None:
    """Import PRELOAD with stdout and stderr caught; anything printed aborts the server."""
    import importlib

    caught = tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    os.dup2(caught.fileno(), 1)
    os.dup2(caught.fileno(), 2)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        # A process's first from_pretrained builds transformers' table of checkpoint conversions
        # (a thousand regular expressions, for every model type) into a module global: built
        # here once, each run forked after finds it built instead of building it again.
        from transformers import conversion_mapping

        if hasattr(conversion_mapping, "get_checkpoint_conversion_mapping"):
            conversion_mapping.get_checkpoint_conversion_mapping("t5")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    caught.seek(0)
    printed = caught.read().decode(errors="replace")
    if printed:
        print(f"importing {', '.join(PRELOAD)} printed (every run would print it too):\n{printed}", flush=True)
        raise SystemExit(1)


def _handle(conn: socket.socket) -> None:
    """Start one run (or one process per rank), wait for it, answer with its exit code; never returns."""
    try:
        request = json.loads(conn.makefile().readline())
        if request.get("ranks"):
            code = _run_ranks(request, conn)
        else:
            pid = os.fork()
            if pid == 0:
                conn.close()
                _become_run(request)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
    finally:
        os._exit(0)


def _run_ranks(request: dict, conn: socket.socket) -> int:
    """One forked process per rank, set up as a launcher without an agent sets them up (the
    environment `init_process_group("env://")` reads; rank 0 serves the store), and treated as
    torchrun treats its workers: the first rank that fails stops the others, and the job's exit
    code is 1. Each rank's output is appended to the job's, rank by rank."""
    n = int(request["ranks"])
    port = free_port()  # for rank 0's store (torchrun --standalone does the same)
    pids: dict[int, int] = {}
    for rank in range(n):
        env = {**request["env"], "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        pid = os.fork()
        if pid == 0:
            conn.close()
            _become_run({**request, "env": env, "out": f"{request['out']}.{rank}", "err": f"{request['err']}.{rank}"})
        pids[pid] = rank
    failed = False
    while pids:
        pid, status = os.wait()
        pids.pop(pid, None)
        if os.waitstatus_to_exitcode(status) != 0 and not failed:
            failed = True
            for other in pids:
                os.kill(other, signal.SIGTERM)
    for stream in ("out", "err"):
        with open(request[stream], "wb") as joined:
            for rank in range(n):
                part = Path(f"{request[stream]}.{rank}")
                joined.write(part.read_bytes())
                part.unlink()
    return 1 if failed else 0


def _become_run(request: dict) -> None:
    """Turn this fork into `python -m seq2seq_eval ARGV` (or `python SCRIPT ARGV`); never returns."""
    import atexit
    import builtins
    import runpy
    import types

    code = 1
    try:
        signal.alarm(int(request["timeout"]) or 1)  # as subprocess.run(timeout=...): a hung run is killed
        write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, target, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], write), (2, request["err"], write)):
            opened = os.open(target, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        try:
            os.environ.clear()
            os.environ.update(request["env"])
            # torch read OMP_NUM_THREADS once, when this server imported it: a run given another
            # value gets that many threads, as a fresh interpreter would (the server has never
            # started a parallel region, so the child starts OpenMP's threads anew).
            threads = os.environ.get("OMP_NUM_THREADS", "")
            torch = sys.modules["torch"]
            if threads.isdigit() and int(threads) > 0 and int(threads) != torch.get_num_threads():
                torch.set_num_threads(int(threads))
            os.chdir(request["cwd"])
            main = types.ModuleType("__main__")  # a fresh __main__, not this script's
            main.__builtins__ = builtins
            sys.modules["__main__"] = main
            script = request.get("script")
            if script:  # `python SCRIPT ARGV`
                sys.path[0] = os.path.dirname(os.path.abspath(script))
                sys.argv = [script, *request["argv"]]
                runpy.run_path(script, run_name="__main__")
            else:
                sys.path[0] = os.getcwd()  # -m puts the working directory first
                sys.argv = ["-m", *request["argv"]]  # the module's path replaces "-m", as with -m
                runpy._run_module_as_main("seq2seq_eval")  # what `python -m` calls
            code = 0
        except SystemExit as e:  # what the interpreter does with it
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            error = sys.exc_info()[1]
            error = error.with_traceback(error.__traceback__.tb_next)  # from runpy on, as with -m
            sys.excepthook(type(error), error, error.__traceback__)
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(sys.argv[1])
