"""Shared fixtures: offline hub, a tiny model the tests build, data sets, and a torchrun launcher."""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread per pytest process, as every run the tests start has (_env): the xdist workers share
# the cores, and torch's default of one OpenMP thread per core in each made the in-process model
# tests 3x slower on a 2-core machine (spinning threads fighting over the cores).
os.environ["OMP_NUM_THREADS"] = "1"
# The tests' few runs of 2 threads (1 process of 2 threads against 2 ranks of 1): OpenMP's idle
# threads sleep instead of spinning, which on a shared 2-core machine made such a run 5 to 10x
# slower (17 s against 1.8 s for 23 examples); the wait policy changes no result, only the wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if "torch" in sys.modules:  # imported by a plugin before this file: the variable came too late
    sys.modules["torch"].set_num_threads(1)
# MKL's strict mode in this process too (read at MKL's first call), as the runs the tests start
# set it (seq2seq_eval.numerics): what a test computes here has the bits of a run.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# Models converted for --engine ctranslate2 go to a cache of the test session's own (never the
# user's ~/.cache), shared by the runs this pytest process starts and removed at its exit.
_CT2_CACHE = tempfile.mkdtemp(prefix="s2s_test_cache_")
atexit.register(shutil.rmtree, _CT2_CACHE, ignore_errors=True)
os.environ["SEQ2SEQ_EVAL_CACHE"] = _CT2_CACHE

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forked import ForkServer, free_port  # noqa: E402,F401  (free_port: for the tests)
from tiny_model import build_tiny_t5  # noqa: E402

WORDS = (
    "the cat dog sat on mat a big small red blue runs fast slow house tree élan über naïve "
    "Zürich 42 7 1999 , . ! ? ; café piñata"
).split()


def make_corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) for _ in range(n)]
    tgt = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(n)]
    return src, tgt


def write_legacy(folder: Path, src: list[str], tgt: list[str] | None, type_path: str = "test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{type_path}.source").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    if tgt is not None:
        (folder / f"{type_path}.target").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    src, tgt = make_corpus(200, seed=1)
    return build_tiny_t5(tmp_path_factory.mktemp("tiny") / "model", src + tgt)


@pytest.fixture(scope="session")
def data23(tmp_path_factory) -> Path:
    """23 examples: divisible neither by the batch size 4 nor by world sizes 2 or 3."""
    src, tgt = make_corpus(23, seed=2)
    return write_legacy(tmp_path_factory.mktemp("data23"), src, tgt)


def torchrun(nproc: int, args: list[str], cwd: Path, timeout: float = 240, env: dict | None = None,
             extra: list[str] | None = None) -> subprocess.CompletedProcess:
    """Real ranks: torchrun (standalone rendezvous on loopback, gloo on CPU)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           *(extra or []), "-m", "seq2seq_eval", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(env))


def run_ranks(nproc: int, args: list[str], cwd: Path, timeout: float = 240, env: dict | None = None,
          script: str | Path | None = None) -> subprocess.CompletedProcess:
    """Real ranks (nproc processes, gloo on CPU) forked from the interpreter that has imported
    torch (tests/forked.py), for the tests where the launcher is not the point; `torchrun` starts
    them the way a user does. `script`: `python SCRIPT ARGS` on each rank instead of the tool."""
    return _fork_server().run(args, cwd, timeout, _env(env), ranks=nproc, script=str(script) if script else None)


def _holder(path: Path, timeout: float) -> int:
    """The process that has `path` open (a rank's journal): a forked rank has no environment of
    its own to be found by, but its open files are in /proc."""
    import time

    deadline = time.monotonic() + timeout
    want = os.path.realpath(path)
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fds = list((entry / "fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(fd) == want:
                        return int(entry.name)
                except OSError:
                    continue
        time.sleep(0.02)
    raise TimeoutError(f"no process holds {path} open")


def kill_rank_after_first_line(args: list[str], journal: Path, cwd: Path, timeout: float = 120
                               ) -> subprocess.CompletedProcess | None:
    """2 forked ranks of `args`; the rank holding `journal` open is SIGKILLed once the journal
    holds its first line (the launcher then stops the other). The launch's result, None if it
    did not return within 2 x `timeout`."""
    import signal
    import time

    result: list = []
    launched = threading.Thread(target=lambda: result.append(run_ranks(2, args, cwd=cwd)))
    launched.start()
    try:
        pid = _holder(journal, timeout)
        deadline = time.monotonic() + timeout
        while journal.read_bytes().count(b"\n") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
    finally:
        launched.join(2 * timeout)
    return result[0] if result else None


def single(args: list[str], cwd: Path, timeout: float = 240, env: dict | None = None,
           fresh: bool = False, script: str | Path | None = None) -> subprocess.CompletedProcess:
    """`python -m seq2seq_eval` with no launcher: one process. Forked from an interpreter that
    has imported torch already (tests/forked.py), unless `fresh`: a new interpreter, as a user starts it.
    `script`: `python SCRIPT ARGS` instead of the tool."""
    if fresh:
        start = [str(script)] if script else ["-m", "seq2seq_eval"]
        return subprocess.run([sys.executable, *start, *args], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, env=_env(env))
    return _fork_server().run(args, cwd, timeout, _env(env), script=str(script) if script else None)


_FORK_SERVER: list[ForkServer] = []  # one per pytest process, started by the first single()
_FORK_SERVER_LOCK = threading.Lock()  # tests call single() from thread pools


def _fork_server() -> ForkServer:
    with _FORK_SERVER_LOCK:
        if not _FORK_SERVER:
            _FORK_SERVER.append(ForkServer(_env(None)))
        return _FORK_SERVER[0]


# The files that take longest (measured on a 2-core machine), started first: pytest-xdist hands
# whole files to its 2 workers in collection order (--dist loadfile), and a long file handed out
# last leaves one worker alone at the end while the other core idles.
LONGEST_FIRST = ("test_faults.py", "test_embedded.py", "test_benchmark_smoke.py", "test_steal.py", "test_causal.py", "test_engines.py",
                 "test_comet.py", "test_model_metrics.py", "test_bertscore.py", "test_new_user.py", "test_ecosystem.py",
                 "test_scale_benchmark.py", "test_metrics_more.py", "test_engine_identity.py", "test_zoo.py", "test_api.py",
                 "test_select_in_run.py", "test_select_ranks.py", "test_selection_models.py", "test_budget.py",
                 "test_metrics.py", "test_paths.py", "test_ownership.py", "test_publish.py", "test_transaction.py", "test_shrink.py", "test_threads.py",
                 "test_legacy.py", "test_launcher.py", "test_bad_inputs.py", "test_verdicts.py", "test_effective_settings.py",
                 "test_oom.py", "test_pipeline.py", "test_startup.py", "test_compare.py", "test_engine_settings.py",
                 "test_stop_matrix.py", "test_trainer_subclasses.py", "test_model_files.py")


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch on one thread for a module's in-process model work, as the runs it compares with
    (OMP_NUM_THREADS=1): on a shared 2-core machine more threads only contend."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def package_logger_kept():
    """A test that runs the command line in-process (cli.main) sets up the package logger (a
    handler on that test's captured stderr, no propagation): put back as it was, for the tests
    after it."""
    logger = logging.getLogger("seq2seq_eval")
    state = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = state


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_sessionfinish(session):
    for server in _FORK_SERVER:
        server.close()


def _env(extra: dict | None) -> dict:
    # Not MKL_CBWR: a run sets MKL's mode itself (numerics.py); a test that gives it passes it.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "MKL_CBWR")}
    env["HF_HUB_OFFLINE"] = "1"
    # Same thread count for every world size (torchrun sets 1 only when nproc > 1).
    env["OMP_NUM_THREADS"] = "1"
    # These are CPU tests, also on a machine with a GPU: two ranks on one GPU would need the
    # gloo override, and CPU keeps their outputs comparable. GPU tests pass their own value.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def metrics_of(save_dir: Path, name: str = "test_bleu.json") -> dict:
    return json.loads((save_dir / name).read_text())


def metric_values(m: dict) -> dict:
    """The score keys only (timings and dates legitimately differ between runs)."""
    return {k: v for k, v in m.items()
            if k not in ("throughput", "provenance", "seconds_per_sample", "seconds_per_generated_sample", "n_gpus")}


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}"
