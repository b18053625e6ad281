"""Where this process sits in the job: rank, local rank, world size. Read in one place.

torchrun exports RANK/LOCAL_RANK/WORLD_SIZE; `srun` without torchrun exports SLURM_PROCID/
SLURM_LOCALID/SLURM_NTASKS; a plain `python -m seq2seq_eval` has neither and is rank 0 of 1.
Everything else in the package asks `DistEnv` and never reads these variables itself, so one
process and N processes share one code path.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, TypeVar

from ..config import EvalConfig
from ..errors import ConfigError, EvalError, RunFailed, as_error, first_line

T = TypeVar("T")

logger = logging.getLogger("seq2seq_eval")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launcher: str = "single"  # "torchrun", "slurm" or "single"
    restart_count: int = 0  # >0 when torchrun restarted the worker group (--max_restarts)
    local_world_size: int | None = None  # ranks on this node, when the launcher says
    rdzv_endpoint: str | None = None  # torchrun's rendezvous host:port (MASTER_ADDR:MASTER_PORT)
    run_id: str | None = None  # torchrun's --rdzv_id

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(environ: Mapping[str, str], key: str) -> int:
    value = environ[key]
    try:
        return int(value)
    except ValueError as e:
        raise ConfigError(f"environment variable {key} must be an integer, got {value!r}") from e


def _tasks_per_node(value: str) -> int | None:
    # SLURM_STEP_TASKS_PER_NODE looks like "8(x2),4": the first node's count.
    head = value.split(",")[0].split("(")[0]
    return int(head) if head.isdigit() else None


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    environ = os.environ if environ is None else environ
    if "RANK" in environ and "WORLD_SIZE" in environ:
        env = DistEnv(
            rank=_int(environ, "RANK"),
            local_rank=_int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0,
            world_size=_int(environ, "WORLD_SIZE"),
            launcher="torchrun",
            restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT")
            if "TORCHELASTIC_RESTART_COUNT" in environ
            else 0,
            local_world_size=_int(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else None,
            rdzv_endpoint=f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
            if "MASTER_ADDR" in environ and "MASTER_PORT" in environ else None,
            run_id=environ.get("TORCHELASTIC_RUN_ID"),
        )
    elif "RANK" in environ or "WORLD_SIZE" in environ:
        raise ConfigError("RANK and WORLD_SIZE must be set together (torchrun sets both); got only one")
    elif "SLURM_PROCID" in environ and ("SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ):
        # Only srun starts a job step. An salloc/sbatch shell also carries SLURM_NTASKS (the
        # allocation's size), and a plain `python -m seq2seq_eval` typed there is one process.
        size_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
        if size_key not in environ:
            return DistEnv()
        per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_NTASKS_PER_NODE") or ""
        env = DistEnv(
            rank=_int(environ, "SLURM_PROCID"),
            local_rank=_int(environ, "SLURM_LOCALID") if "SLURM_LOCALID" in environ else 0,
            world_size=_int(environ, size_key),
            launcher="slurm",
            local_world_size=_tasks_per_node(per_node),
        )
    else:
        return DistEnv()
    if env.world_size < 1 or not 0 <= env.rank < env.world_size:
        raise ConfigError(f"rank {env.rank} is outside world size {env.world_size}")
    return env


def choose_device(device: str, backend: str, env: DistEnv, cuda_count: int) -> tuple[str, str]:
    """Which device this rank uses and which process-group backend the job uses, from
    --device, --dist_backend, the rank's place on its node and the GPUs it sees. Pure, so the
    decision is tested with any GPU count on a machine without one.

    nccl refuses two ranks on one GPU ("Duplicate GPU detected") only after the data is
    prepared; more local ranks than GPUs is therefore refused here, before any work."""
    if device == "cpu" or (device == "auto" and cuda_count == 0):
        if backend == "nccl":
            raise ConfigError("--dist_backend nccl needs GPUs, and this run is on CPU; use --dist_backend gloo (or auto)")
        return "cpu", "gloo"
    if cuda_count == 0:
        raise ConfigError("--device cuda: no CUDA GPU is visible (torch.cuda.is_available() is False); use --device cpu or auto")
    chosen = "nccl" if backend == "auto" else backend
    local = env.local_world_size
    if chosen == "nccl" and env.world_size > 1 and local is not None and local > cuda_count:
        raise ConfigError(
            f"{local} ranks on this node but {cuda_count} visible GPU(s), and nccl needs a GPU per rank; "
            f"start at most {cuda_count} process(es) per node (--nproc_per_node / NPROC), "
            "run on CPU with --device cpu, or let ranks share GPUs with --dist_backend gloo"
        )
    return f"cuda:{env.local_rank % cuda_count}", chosen


def _join(env: DistEnv, timeout_s: float, poll_s: float = 0.05) -> Any:
    """Connect to the job's store and wait until every rank has checked in, naming the ranks
    that did not within --sync_timeout. torch's own rendezvous would fail with a DistStoreError
    that says neither which rank is missing nor which option sets the wait."""
    import torch.distributed as tdist

    timeout = datetime.timedelta(seconds=timeout_s)
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ConfigError(f"rank {env.rank} of {env.world_size}: MASTER_ADDR and MASTER_PORT must be set "
                          "(torchrun sets them; see docs/ecosystem.md for srun)")
    # Under torchrun the agent already serves the store; otherwise rank 0 serves it. Rank 0's
    # server does not wait for clients here: the check-in below does, and can say who is late.
    serve = env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    try:
        store = tdist.TCPStore(addr, int(port), env.world_size, serve, timeout=timeout, wait_for_workers=False)
    except (RuntimeError, ValueError) as e:  # DistStoreError and DistNetworkError are RuntimeErrors
        raise RunFailed(
            f"rank {env.rank}: cannot reach the job's store at {addr}:{port} within --sync_timeout "
            f"{timeout_s:g} s ({first_line(e)})"
        ) from e
    prefix = f"seq2seq_eval/restart_{env.restart_count}/joined/"
    store.set(f"{prefix}{env.rank}", "1")
    deadline = time.monotonic() + timeout_s
    keys = [f"{prefix}{r}" for r in range(env.world_size)]
    while True:
        # check() does not block, unlike wait(), so the missing ranks can be named at the end.
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:
            return store
        if time.monotonic() >= deadline:
            raise RunFailed(
                f"rank(s) {', '.join(map(str, missing))} of {env.world_size} did not join within "
                f"--sync_timeout {timeout_s:g} s; check that every rank was started (and can reach "
                f"{addr}:{port}), or raise --sync_timeout"
            )
        time.sleep(poll_s)


class ProcessGroup:
    """A thin wrapper over torch.distributed that becomes the identity with one process.

    It is used only for the few decisions every rank must share (may this run proceed, is the
    data prepared). Results travel through files, not collectives, so a dead rank can never leave
    the others hanging in a collective during the long generation phase.
    """

    def __init__(self, env: DistEnv, backend: str, timeout_s: float) -> None:
        self.env = env
        self._active = False
        self._group: Any = None  # None: the default group, which this object initialized
        self._src = 0  # the global rank of the group's rank 0
        # evaluate()'s: raises the error another rank published (run.agree), so rank 0's wait
        # for rank files ends when a rank has failed instead of after --sync_timeout.
        self.peer_check: Callable[[], None] | None = None
        if env.world_size == 1:
            return
        import torch.distributed as tdist

        if env.launcher == "slurm":
            # srun sets no rendezvous address; SLURM users pass MASTER_ADDR/MASTER_PORT (docs/ecosystem.md).
            os.environ.setdefault("RANK", str(env.rank))
            os.environ.setdefault("WORLD_SIZE", str(env.world_size))
            os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
            if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
                raise ConfigError(
                    "started by srun with SLURM_NTASKS>1 but MASTER_ADDR/MASTER_PORT are not set; "
                    "export them (see the SLURM recipe in docs/ecosystem.md) or launch through torchrun"
                )
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _join(env, timeout_s)
        # Keys are namespaced by torchrun's restart count: a worker group restarted after a
        # failure must never read the peer addresses its dead predecessors published (seen as
        # gloo "connectFullMesh ... Connection refused" on the first restart).
        store = tdist.PrefixStore(f"seq2seq_eval/restart_{env.restart_count}", store)
        # The timeout bounds every collective: a rank that never arrives fails the others
        # after --sync_timeout instead of hanging the job for torch's default 30 minutes.
        tdist.init_process_group(
            backend=backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
        )
        self._active = True

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self._active:
            return obj
        import torch.distributed as tdist

        box = [obj if self.env.is_main else None]
        try:
            tdist.broadcast_object_list(box, src=self._src, group=self._group)
        except RuntimeError as e:  # DistBackendError: a peer is gone or --sync_timeout passed
            if self._group is None:
                raise  # the command line's own group: as before
            raise RunFailed(f"rank {self.env.rank}: a rank did not take part in a collective within "
                            f"--sync_timeout ({first_line(e)})") from e
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self._active:
            return [obj]
        import torch.distributed as tdist

        out: list[Any] = [None] * self.env.world_size
        tdist.all_gather_object(out, obj, group=self._group)
        return out

    def main_first(self, fn: Callable[[], T]) -> T:
        """Run `fn` on rank 0 first, then on the others (e.g. to build a datasets cache once).

        Rank 0's failure is broadcast, so the other ranks fail with its error, of its type (so the
        same exit code) and named as rank 0's, instead of waiting forever at a barrier rank 0 will
        never reach.
        """
        if not self._active:
            return fn()
        if self.env.is_main:
            try:
                result = fn()
            except EvalError as e:
                self.broadcast((type(e).__name__, str(e)))
                raise
            self.broadcast(None)
            return result
        error = self.broadcast(None)
        if error is not None:
            raise as_error(0, *error)
        return fn()

    def barrier(self) -> None:
        """Wait for every rank (bounded by --sync_timeout, as every collective here)."""
        if self._active:
            import torch.distributed as tdist

            try:
                tdist.barrier(group=self._group)
            except RuntimeError as e:
                if self._group is None:
                    raise
                raise RunFailed(f"rank {self.env.rank}: a rank did not reach a barrier within "
                                f"--sync_timeout ({first_line(e)})") from e

    def close(self) -> None:
        """Destroy the group this object made: the default group it initialized, or the control
        group it made over an adopted one; never the group it was given."""
        if self._active:
            import torch.distributed as tdist

            tdist.destroy_process_group(self._group)
            self._active = False

    @classmethod
    def adopt(cls, base: DistEnv, group: Any, timeout_s: float) -> tuple["ProcessGroup", DistEnv]:
        """Run on a group the caller already initialized (a training job's default group, or
        a group of it): every rank of the job calls this, in the same order as its other
        new_group calls. Returns the wrapper and this process's place in that group.

        The few decisions shared here travel on a new gloo group over the same ranks, not on
        the caller's group: its timeout is --sync_timeout (a training job's group waits 30
        minutes or more before it notices a missing rank), it works whatever the job's backend
        (nccl would need CUDA tensors and the right current device), and a failed run leaves
        nothing half-sent on the job's own group: the new group is destroyed with it."""
        import torch.distributed as tdist

        ranks = tdist.get_process_group_ranks(group)
        if tdist.get_rank() not in ranks:
            raise ConfigError(f"rank {tdist.get_rank()} is not in the process group it was given (ranks "
                              f"{ranks}); every rank evaluates, so pass a group of every rank, or none")
        env = DistEnv(
            rank=tdist.get_rank(group), local_rank=base.local_rank, world_size=len(ranks),
            launcher=base.launcher, local_world_size=base.local_world_size,
            rdzv_endpoint=base.rdzv_endpoint, run_id=base.run_id,
            # restart_count stays 0: a restarted training job must not take its predecessor's
            # half-finished evaluation for its own (the weights have changed since).
        )
        self = cls(DistEnv(), "gloo", timeout_s)
        self.env = env
        if len(ranks) == 1:
            return self, env
        # Not use_local_synchronization: its group is named by a hash of the ranks, so the next
        # evaluation's group would reuse the destroyed one's store keys and read its dead peers'
        # addresses (gloo "connectFullMesh ... Connection refused"). A name from the job-wide
        # group count is new each time, at the price of every rank of the job calling this.
        self._group = tdist.new_group(ranks=ranks, timeout=datetime.timedelta(seconds=timeout_s), backend="gloo")
        self._src = ranks[0]
        self._active = True
        return self, env


def resolve_device(cfg: EvalConfig, env: Any) -> tuple[Any, str]:
    """This rank's torch device and the job's process-group backend (see choose_device)."""
    import torch

    count = torch.cuda.device_count() if cfg.device != "cpu" and torch.cuda.is_available() else 0
    name, backend = choose_device(cfg.device, cfg.dist_backend, env, count)
    if name == "cpu" and cfg.fp16:
        # float16 on CPU runs, slowly, and changes outputs; the legacy script refuses it too.
        raise ConfigError("--fp16 needs a GPU and this run is on CPU; use --bf16 for half precision on CPU")
    return torch.device(name), backend
