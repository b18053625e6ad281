"""`select` through a temp dir, on one rank or many: the candidates file cut into batches of
consecutive examples (candidates.index_candidates), dealt to the ranks as a run's batches are
(plan.assign_batches) and claimed before each is selected, a rank out of work taking the
unstarted batches of the slowest share (steal.py); each batch's output lines journaled and
fsynced as it is done (journal.py's journal_rank_<k>.jsonl, with the temp dir's token), so a
resumed selection (--resume, after a kill at any step) selects only the batches no journal
holds. Rank 0 reads the journals in batch order and prints the lines, or streams them into the
staged --output, published by the tool's rules (outputs/publish.py) with the temp dir named, then
removes the temp dir once the other ranks have left it (presence.py), as a run does.

A batch's members are the file's, whatever the world size, and a selection depends on its
example alone (Selector's promise): the lines are the same bytes at any number of ranks."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EvalError, Interrupted, RunFailed, SyncTimeoutError, as_error
from ..outputs.jsonl import encode_line
from ..outputs.locations import Role
from ..run.dist import DistEnv, ProcessGroup
from ..run.journal import Journal, journal_file, journal_files
from ..run.plan import assign_batches
from ..run.presence import Presence, main_rank_state, mark_done, wait_for_ranks_to_leave
from ..run.signals import Signals
from ..run.steal import Claims
from ..run.tmpdir import (STOPPED, RunLock, claim_tmp_dir, cleanup_tmp_dir, finished_journals, new_token,
                          prepare_tmp_dir, refuse_earlier_run)
from ..run.tmpmarker import mark_published, read_marker, tmp_token
from .candidates import CandidateIndex, CandidateSet, index_candidates
from .base import Selector

logger = logging.getLogger("seq2seq_eval")

PER_BATCH = 32
"""Examples per batch: a claim file and a journal line per 32 examples (31,250 of each for a
million), and a rank's memory holds one batch's candidates and scores."""
POLL_S = 0.1
"""How often rank 0 looks for the batches it waits for (a stat and a read of what was appended)."""


@dataclass(frozen=True)
class SelectJob:
    candidates: Path
    mode: str
    metric: str
    tmp_dir: Path
    resume: bool
    steal: bool
    sync_timeout: float
    output: Path | None


def selection_lines(examples: list[CandidateSet], selector: Selector) -> list[str]:
    """One JSON line per example: its id, the selected index and text, every candidate's score."""
    chosen = selector.select(examples)
    return [encode_line({"id": e.id, "selected": c.index, "prediction": e.candidates[c.index],
                         "select_scores": list(c.scores)}) for e, c in zip(examples, chosen)]


def manifest(job: SelectJob, index: CandidateIndex, signature: str) -> dict[str, Any]:
    """What the journals belong to: the file's bytes, the selection and its batches. A resume with
    any of them changed is refused (tmpdir.check_tmp_dir), never merged."""
    plan = hashlib.sha256(json.dumps([index.starts, index.sizes]).encode()).hexdigest()
    return {"model": signature, "data": {"candidates": index.digest, "examples": index.examples},
            "generation": {"select": job.mode, "select_metric": job.metric},
            "plan": {"select_batches": plan, "per_batch": PER_BATCH, "bs": None, "max_tokens": None}}


class _Journaled:
    """Where each journaled batch's line is (journal, offset, length), from every rank's journal,
    reading only what was appended since the last look: rank 0 polls it while it waits, and holds
    three numbers a batch, not the lines."""

    def __init__(self, tmp_dir: Path, key: str) -> None:
        self.tmp_dir, self.key = tmp_dir, key
        self.token = (read_marker(tmp_dir) or {}).get("folder")
        self.found: dict[int, tuple[Path, int, int]] = {}
        self._offsets: dict[Path, int] = {}

    def read(self) -> dict[int, tuple[Path, int, int]]:
        for path in journal_files(self.tmp_dir):
            pos = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(pos)
                for line in f:  # a line at a time: a journal of a million examples is gigabytes
                    if not line.endswith(b"\n"):
                        break  # a line still being written (or torn by a crash) waits
                    here, pos = pos, pos + len(line)
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if (isinstance(entry, dict) and entry.get("select") == self.key and entry.get("tmp") == self.token
                            and isinstance(entry.get("lines"), list)):
                        self.found.setdefault(int(entry["batch"]), (path, here, len(line) - 1))
            self._offsets[path] = pos
        return self.found


def _lines_of(where: tuple[Path, int, int]) -> list[str]:
    path, offset, length = where
    with open(path, "rb") as f:
        f.seek(offset)
        return json.loads(f.read(length))["lines"]


def _agree(env: DistEnv, pg: ProcessGroup, check: Callable[[], Any]) -> Any:
    """Rank 0 runs `check`; every rank gets its result, or raises its error (the run's rule:
    runner._agree), so a refused selection stops on all ranks before any journal line."""
    if env.is_main:
        try:
            result = check()
        except EvalError as e:
            pg.broadcast(("error", type(e).__name__, str(e)))
            raise
        return pg.broadcast(("ok", result))[1]
    verdict = pg.broadcast(None)
    if verdict[0] == "error":
        raise as_error(0, verdict[1], verdict[2])
    return verdict[1]


def select_on_ranks(job: SelectJob, selector: Selector, env: DistEnv, write: Callable[[str], None]) -> int:
    """This rank's share of the selection; rank 0 also prints or publishes every line. Returns
    the number of examples."""
    pg = ProcessGroup(env, "gloo", job.sync_timeout)
    holder: list[RunLock] = []  # rank 0's lock on the temp dir, from its claim on
    presence: Presence | None = None
    progress: dict[str, bool] = {}
    try:
        with Signals():

            def claim() -> CandidateIndex:
                index = index_candidates(job.candidates, job.mode, PER_BATCH)
                if job.output is not None and job.output.parent.is_dir():
                    _recover(job, env)
                claim_tmp_dir(job.tmp_dir, [Role(job.candidates, "--candidates")])
                taken = RunLock(job.tmp_dir)
                taken.acquire()
                holder.append(taken)
                refuse_earlier_run(job.tmp_dir, job.resume or env.restart_count > 0)
                new_token(job.tmp_dir)
                found = prepare_tmp_dir(job.tmp_dir, manifest(job, index, selector.signature()),
                                        job.resume or env.restart_count > 0)
                if found:
                    logger.info("resuming from %d journal(s) in %s", found, job.tmp_dir)
                return index

            index = _agree(env, pg, claim)
            if not env.is_main:
                presence = Presence(job.tmp_dir, env.rank)
            # Every rank present before any starts: rank 0, which may select every batch itself,
            # removes the temp dir only once the others have left it (presence.py).
            pg.barrier()
            _select_share(job, selector, env, index)
            if not env.is_main:
                presence.release()  # type: ignore[union-attr]
                _wait_for_main(job.tmp_dir)
                return index.examples
            _emit(job, env, index, _key(job, index, selector), write, progress)
            return index.examples
    except BaseException as e:
        # Out (published, or every line printed): the selection is complete whatever comes
        # after, a signal or a fault while the temp dir is removed (the run's rule, runner's
        # _after_publish and _one_line), and the message says so, never "--resume".
        out = progress.get("out") or bool(getattr(e, "published", False))
        marker = read_marker(job.tmp_dir) if env.is_main and holder else None
        if marker is not None and not marker.get("published"):
            try:
                (job.tmp_dir / STOPPED).write_bytes(b"")
            except OSError:
                pass
            if env.world_size == 1 and not isinstance(e, Interrupted) and not finished_journals(job.tmp_dir):
                cleanup_tmp_dir(job.tmp_dir)  # nothing to resume
        if isinstance(e, Interrupted) and env.is_main and out:
            raise Interrupted(_after_out(job, env, e)) from e
        if isinstance(e, Interrupted) and env.is_main:
            raise Interrupted(f"{e}; the selected batches are journaled in {job.tmp_dir}: rerun the same command "
                              "with --resume to select only the others") from e
        if isinstance(e, OSError) and not isinstance(e, BrokenPipeError):
            # A filesystem fault in any of its own steps (the temp dir, its claims and journals,
            # the staging): one line saying what became of the selection (the run's rule:
            # runner._one_line), from its state, never a traceback.
            raise RunFailed(_fault_line(job, e, out)) from e
        raise
    finally:
        if presence is not None:
            presence.release()
        for lock in holder:
            lock.release()
        pg.close()


def _out_where(job: SelectJob) -> str:
    return f"the selections were published into {job.output}" if job.output is not None else "every selection was printed"


def _after_out(job: SelectJob, env: DistEnv, e: Interrupted) -> str:
    """A signal handled once the selections were out: what was left to do is done (the other
    ranks told, the temp dir removed once they have left it, as _emit would), and said."""
    said = str(e) if getattr(e, "published", False) else f"{e} after {_out_where(job)}"
    mark_done(job.tmp_dir)
    if wait_for_ranks_to_leave(job.tmp_dir, env.world_size, job.sync_timeout):
        return f"{said}; the selection is complete, but ranks still use {job.tmp_dir}: left in place"
    cleanup_tmp_dir(job.tmp_dir)
    return f"{said}; the selection is complete ({job.tmp_dir} removed)"


def _fault_line(job: SelectJob, e: OSError, published: bool) -> str:
    """What a filesystem fault left: the selections out (published or printed: complete), or
    not, and then whether batches are journaled to resume from."""
    said = f"{e.filename if getattr(e, 'filename', None) else job.tmp_dir}: {e.strerror or e}"
    if published:
        return (f"{said}; {_out_where(job)} before it: the selection is complete (the next command there removes "
                f"what is left in {job.tmp_dir})")
    nothing = "nothing was published" if job.output is not None else "the selections were not printed"
    if finished_journals(job.tmp_dir):
        return (f"{said}; {nothing}: the batches selected before it are journaled in {job.tmp_dir}: fix the cause "
                "(space, permissions), then rerun the same command with --resume")
    return f"{said}; {nothing}: fix the cause (space, permissions), then rerun the same command"


def _recover(job: SelectJob, env: DistEnv) -> None:
    """Rank 0, before it claims the temp dir (the run's order, runner._claim_tmp_dir): a publish
    of --output cut short by a kill is completed (or undone), and so is what that command had
    left to do, its temp dir's removal, unless this command resumes from that temp dir."""
    import os

    from ..outputs.transaction import recovered
    from ..run.tmpdir import remove_finished_tmp_dir

    assert job.output is not None
    with recovered([job.output.parent]) as completed:
        pass
    resuming = job.resume or env.restart_count > 0
    for intent in completed:
        same = intent.get("tmp_dir") and os.path.realpath(intent["tmp_dir"]) == os.path.realpath(job.tmp_dir)
        if intent.get("tmp_dir") and not (resuming and same):
            remove_finished_tmp_dir(Path(intent["tmp_dir"]), intent.get("tmp_token"))


def _key(job: SelectJob, index: CandidateIndex, selector: Selector) -> str:
    return hashlib.sha256(json.dumps(manifest(job, index, selector.signature()), sort_keys=True).encode()).hexdigest()[:16]


def _select_share(job: SelectJob, selector: Selector, env: DistEnv, index: CandidateIndex) -> None:
    key = _key(job, index, selector)
    done = _Journaled(job.tmp_dir, key).read()
    n = len(index.sizes)
    shares = [[i for i in share if i not in done]
              for share in assign_batches(_Costed(index.costs), env.world_size)]
    claims = Claims(job.tmp_dir, shares, env.rank, list(index.costs), steal=job.steal, prefix="select_")
    journal: Journal | None = None
    selected = stolen = 0
    t0 = time.perf_counter()
    try:
        for claimed in claims:
            lines = selection_lines(index.batch(job.candidates, job.mode, claimed.index), selector)
            entry: dict[str, Any] = {"select": key, "batch": claimed.index, "lines": lines}
            if claimed.stolen_by(env.rank):
                entry["from_rank"] = claimed.planned_rank
                stolen += 1
            journal = journal or Journal(journal_file(job.tmp_dir, env.rank))
            journal.append(entry)
            selected += 1
    finally:
        if journal is not None:
            journal.close()
    logger.info("rank %d selected %d of %d batch(es) (%d taken from slower ranks) in %.1f s, %d journaled before",
                env.rank, selected, n, stolen, time.perf_counter() - t0, len(done))


class _Costed(list):
    """assign_batches' view of the batches: an index and a cost each."""

    def __init__(self, costs: tuple[float, ...]) -> None:
        super().__init__(_Batch(i, c) for i, c in enumerate(costs))


@dataclass(frozen=True)
class _Batch:
    index: int
    cost: float


def _in_order(job: SelectJob, index: CandidateIndex, key: str) -> Iterator[str]:
    """Rank 0: every line, in file order, each batch's as soon as it is journaled."""
    journaled = _Journaled(job.tmp_dir, key)
    deadline = time.monotonic() + job.sync_timeout
    for b in range(len(index.sizes)):
        while b not in journaled.found:
            journaled.read()
            if b in journaled.found:
                break
            if time.monotonic() >= deadline:
                missing = sum(1 for i in range(len(index.sizes)) if i not in journaled.found)
                raise SyncTimeoutError(f"waited {job.sync_timeout:g} s (--sync_timeout) for the selections; {missing} of "
                                       f"{len(index.sizes)} batches are not journaled in {job.tmp_dir}; rerun with "
                                       "--resume to select only those")
            time.sleep(POLL_S)
        yield from _lines_of(journaled.found[b])


def reader_gone() -> None:
    """stdout's reader has gone: stdout goes to /dev/null, so that what is still buffered, and the
    interpreter's last flush, do not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _emit(job: SelectJob, env: DistEnv, index: CandidateIndex, key: str, write: Callable[[str], None],
          progress: dict[str, bool]) -> None:
    """Rank 0: the lines printed, or published as --output (`progress["out"]` once they are);
    then the temp dir goes, once the other ranks have left it."""
    token = tmp_token(job.tmp_dir)
    if job.output is None:
        try:
            for line in _in_order(job, index, key):
                write(line)
            sys.stdout.flush()  # a line still in the buffer is not out
        except BrokenPipeError:
            # The reader stopped reading (`| head`), as in one process: nothing more to say to
            # it, no traceback, and the selection is whole (every batch journaled): the temp dir
            # goes as after the last line, not left to --resume.
            reader_gone()
        # Every line is out: the temp dir is marked published (as a publish marks it), so that a
        # kill from here on, while it is removed, leaves a folder the next command clears, never
        # one it refuses as an unfinished selection to --resume.
        progress["out"] = True
        mark_published(job.tmp_dir, token)
    else:
        from ..outputs.publish import Staging

        staging = Staging(job.output.parent, None, "named", job.tmp_dir, token)
        try:
            f = staging.file(job.output.name)
            try:
                for line in _in_order(job, index, key):
                    f.write((line + "\n").encode("utf-8"))
            except BaseException:
                f.abandon()
                raise
            f.close()
        except BaseException:
            staging.discard()
            raise
        # The publish marks the temp dir published at its commit (the staging names it).
        staging.publish(roles={job.output: "--output"}, way_out="move it away or name another file",
                        completes=[job.output.name])
        progress["out"] = True
    mark_done(job.tmp_dir)
    staying = wait_for_ranks_to_leave(job.tmp_dir, env.world_size, job.sync_timeout)
    if staying:
        logger.warning("rank(s) %s still use %s after --sync_timeout %g s; left in place", ", ".join(map(str, staying)),
                       job.tmp_dir, job.sync_timeout)
    else:
        cleanup_tmp_dir(job.tmp_dir)


def _wait_for_main(tmp_dir: Path) -> None:
    """A rank other than 0, its share done: stays until rank 0 has printed or published, so that
    one of them says it should rank 0 die without a word."""
    while True:
        state = main_rank_state(tmp_dir)
        if state == "done":
            return
        if state == "gone":
            raise RunFailed(f"rank 0 is gone; the selected batches are journaled in {tmp_dir}: rerun the same "
                            "command with --resume")
        if state == "stopped":
            raise Interrupted("rank 0 stopped the selection")
        time.sleep(POLL_S)
