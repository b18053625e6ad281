"""One rank's run: load, plan, generate its batches with a journal, write its rank file; on
rank 0 also wait, merge by id, score and report."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import engines, numerics
from ..config import EvalConfig
from ..errors import EvalError, Interrupted, RunFailed, RunStateError
from ..inputs.memory import InMemoryInputs
from ..outputs.locations import Role, check_output_locations, run_inputs, try_folders
from ..outputs.transaction import recovered
from ..outputs.publish import report_pending
from ..outputs.record import OutputRecord
from .dist import DistEnv, ProcessGroup, dist_env, resolve_device
from .finish import Outcome, earlier_run, finish, missing_summary
from .model_scores import check_model_metrics, score_model_metrics
from ..scoring import registry
from ..selection.in_run import rank_loader, run_selector
from .prepare import Prepared, describe_plan, idle_ranks_warning, prepare
from .presence import Presence
from .rank import generate_rank
from .sharedtail import write_my_part
from .signals import Signals as _Signals
from .startup import Steps, import_libraries, process_age
from .tmpdir import (
    STOPPED,
    RunLock,
    check_tmp_dir,
    claim_tmp_dir,
    cleanup_tmp_dir,
    finished_journals,
    prepare_tmp_dir,
    recorded_budget,
    refuse_earlier_run,
    new_token,
    remove_finished_tmp_dir,
    tmp_token,
)
from .tmpmarker import read_marker
from .presence import main_rank_state, mark_done, wait_for_ranks_to_leave

MAIN_POLL_S = 0.5
"""How often a rank that has finished generating looks whether rank 0 is still there."""

logger = logging.getLogger("seq2seq_eval")


def run(cfg: EvalConfig, env: DistEnv | None = None, *, process_group: ProcessGroup | None = None,
        model: Any = None, tokenizer: Any = None, also_writes: tuple[Role, ...] = (),
        also_folders: tuple[tuple[str, Path], ...] = (), also: Any = None, inputs: InMemoryInputs | None = None) -> Outcome:
    """One rank's run. The command line passes the config alone; api.evaluate also passes the
    job's group (`process_group`, kept open: the caller closes it) and may pass a model and its
    tokenizer already in memory, which run where they are, as they are. `also_writes` and
    `also_folders`: files (and their folders) the caller writes from the outputs afterwards
    (the legacy form's SAVE_PATH), checked with the run's own before any work; `also` stages
    them, published with the run's outputs as one transaction (outputs.write.write_outputs).
    `inputs`: evaluate()'s in-memory examples, read from the temp
    dir and published with the outputs, in the same transaction."""
    env = env or dist_env()
    t_start = time.perf_counter()
    check_output_locations(cfg, also_writes)
    if inputs is not None:
        _check_copy(cfg, inputs)
        also = _with_copy(inputs, also)
    tmp_dir = Path(cfg.tmp_dir)
    if cfg.dry_run:
        # A dry run is one process that never joins a group: it validates and prints the plan,
        # converting and tokenizing into a throwaway folder (the run's temp dir stays untouched),
        # and makes every check the run makes before its first batch.
        # Under torchrun every rank runs the dry run: rank 0 alone tries the folders (trying
        # creates and removes them: several ranks at once would trip over each other).
        if env.is_main:
            try_folders(cfg, also_writes, also_folders)
        # The run first completes a publish cut short in --save_dir, and with it removes the
        # temp dir of the run that died in it (unless it resumes from it): not checked then.
        removed_first = False
        for folder in _distinct([Path(cfg.save_dir), *(f for _, f in also_folders)]):
            removes = report_pending(folder, say=env.is_main)
            removed_first = removed_first or (removes is not None and removes[1] is not None and not cfg.resume
                                                and removes == (os.path.realpath(tmp_dir), tmp_token(tmp_dir)))
        if not removed_first:
            claim_tmp_dir(tmp_dir, run_inputs(cfg), create=False)
        device, _ = resolve_device(cfg, env)
        numerics.pin(device.type)  # a refused MKL_CBWR is refused by the dry run too
        with tempfile.TemporaryDirectory(prefix="seq2seq_eval_dry_run_") as cache:
            recorded = recorded_budget(tmp_dir) if cfg.resume else None
            prep = prepare(cfg, env, None, Path(cache), device.type, recorded=recorded)
            check_output_locations(cfg, also_writes, n_refs=prep.store.max_references)
            if not removed_first:
                check_tmp_dir(tmp_dir, prep.manifest, cfg.resume)
            earlier_run(cfg, prep)
            check_model_metrics(cfg, prep.store.max_references)
            run_selector(cfg, lambda name: None)  # its checks; nothing is loaded
            return Outcome(plan_text=describe_plan(prep, env.world_size))
    # Seconds per start-up step, in order (throughput.time_breakdown.startup_steps). From the
    # command line, what the process spent before this run began (the interpreter, the CLI's imports).
    clock = Steps({"before_run": age} if process_group is None and (age := process_age()) else None, since=t_start)
    import_libraries(cfg)
    clock.lap("imports")
    if model is not None:
        device = next(model.parameters()).device  # the caller's: its current device is set
    else:
        device, backend = resolve_device(cfg, env)
        if device.type == "cuda":
            import torch

            torch.cuda.set_device(device)
    # Before the first model runs here: MKL takes its mode once, at its first call.
    numerics.pin(device.type)
    pg = process_group if process_group is not None else ProcessGroup(env, backend, cfg.sync_timeout)
    clock.lap("device")
    lock: RunLock | None = None
    prep: Prepared | None = None
    presence: Presence | None = None
    progress: dict[str, Any] = {}
    try:
        with _Signals(), _one_line(tmp_dir, progress):
            lock = _claim_tmp_dir(cfg, env, pg, tmp_dir, also_writes, also_folders, inputs)
            # Resuming (or restarted by torchrun), the earlier run's budget, read once by rank 0
            # (which holds the lock) and sent to all: every rank plans the same batches.
            resuming = cfg.resume or env.restart_count > 0
            recorded = pg.broadcast(recorded_budget(tmp_dir) if resuming and env.is_main else None)
            clock.lap("claim")
            prep = prepare(cfg, env, pg, tmp_dir / "cache", device.type, model, tokenizer, recorded=recorded,
                           read_cfg=inputs.reading(cfg, tmp_dir) if inputs is not None else None)
            clock.seconds.update(prep.timings)
            clock.restart()
            if env.is_main and (idle := idle_ranks_warning(prep, env.world_size)):
                logger.warning("%s", idle)
            n_refs = prep.store.max_references
            _agree(env, pg, lambda: check_output_locations(cfg, also_writes, n_refs=n_refs))
            _agree(env, pg, lambda: _check_manifest(cfg, env, tmp_dir, prep.manifest))
            earlier: list[Any] = []  # --compare_to's run, checked before any generation
            _agree(env, pg, lambda: earlier.append(earlier_run(cfg, prep)))
            _agree(env, pg, lambda: check_model_metrics(cfg, n_refs))  # a model metric's model is found before any generation
            # --select's selector, checked before any generation; a model metric it loads is the
            # rank's one, for --metrics too (loaded at its first use).
            load = rank_loader(cfg, device)
            selector = run_selector(cfg, load)
            if not env.is_main:
                # Before this rank's rank file, without which rank 0 cannot finish: rank 0 removes
                # the temp dir only once this rank has let it go (presence.py).
                presence = Presence(tmp_dir, env.rank)
            clock.lap("run_checks")
            engine = engines.load(cfg, tokenizer=prep.tokenizer, model_config=prep.model_config,
                                  generation_config=prep.generation_config, device=device, env=env, model=model,
                                  kind=prep.kind)
            # The engine's own steps (its model_load apart from its cache or its set-up), else one.
            if getattr(engine, "load_seconds", None):
                clock.seconds.update(engine.load_seconds)
            else:
                clock.lap("model_load")
            t_loaded, steps = time.perf_counter(), clock.seconds
            # What a large run spends before generating anything (benchmarks/scale.py reads it).
            logger.info("rank %d ready to generate after %.1f s (%s)", env.rank, t_loaded - t_start,
                        ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()))
            stats = generate_rank(cfg, env, prep, engine, device, tmp_dir,
                                   {"startup_seconds": t_loaded - t_start, "startup_steps": steps,
                                    "model_load_seconds": steps["model_load"], "prepare_seconds": prep.timings}, selector)
            engine = None  # its memory goes before a model metric's model comes
            model_scores = score_model_metrics(cfg, env, prep, tmp_dir, device, load if selector else registry.load)
            if not env.is_main:
                # With --shared_tail its slice of the outputs first (sharedtail.py); then stay for rank 0.
                if cfg.shared_tail:
                    write_my_part(cfg, env, prep.store, tmp_dir, check=lambda: _main_alive(cfg, env, prep, tmp_dir))
                presence.release()  # type: ignore[union-attr]  # its last read or write there
                if process_group is None:  # evaluate() waits for rank 0's result instead
                    _wait_for_main(cfg, env, prep, tmp_dir)
                return Outcome()
            return finish(cfg, env, prep, tmp_dir, stats, t_start, earlier[0] if earlier else None, model_scores,
                          abort=pg.peer_check, progress=progress, also=also)
    except BaseException as e:
        if env.is_main and lock is not None and isinstance(e, Interrupted) and (e.published or progress):
            done = Interrupted(_after_publish(cfg, env, tmp_dir, e))
            done.published = True  # a caller of evaluate() can tell it too, not only the message
            raise done from e
        if env.is_main and lock is not None:
            # Before the lock goes: a rank that finds the lock free and this file absent knows
            # rank 0 died; with it, rank 0 reports for itself.
            _write_marker(tmp_dir / STOPPED)
            if env.world_size == 1 and not isinstance(e, Interrupted) and not finished_journals(tmp_dir):
                # Nothing to resume: what this run made is removed (with several ranks, another
                # may still be writing there; the next run then starts over in it, see
                # tmpdir.refuse_earlier_run).
                cleanup_tmp_dir(tmp_dir)
        if not isinstance(e, Interrupted) or prep is None:
            raise
        if env.is_main:
            raise Interrupted(f"{e}; {missing_summary(cfg, env, prep, tmp_dir)}") from e
        if main_rank_state(tmp_dir) == "gone":
            # Rank 0 died (its flock went with it) and cannot report; the first surviving rank to
            # take the lock says what is missing, the others stay quiet.
            raise RunFailed(f"rank 0 is gone; {missing_summary(cfg, env, prep, tmp_dir)}") from e
        raise
    finally:
        if presence is not None:
            presence.release()
        if lock is not None:
            lock.release()
        if process_group is None:
            pg.close()


@contextlib.contextmanager
def _one_line(tmp_dir: Path, progress: dict[str, Any]) -> Iterator[None]:
    """A filesystem fault anywhere in the run's own steps (its caches, rank files, journals, the
    model metric's files) as one typed line saying what became of the run, from its state: the
    outputs published or not, and the command that goes on."""
    try:
        yield
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else f"{tmp_dir}: "
        said = f"{where}{e.strerror or e}"
        if progress.get("published"):
            raise RunFailed(f"{said}; the outputs were published before it: the run is complete (the next command in "
                            f"{tmp_dir} removes what is left there)") from e
        raise RunFailed(f"{said}; nothing was published: the batches journaled before it are kept in {tmp_dir}: fix the "
                        "cause (space, permissions), then rerun the same command with --resume") from e


def _after_publish(cfg: EvalConfig, env: DistEnv, tmp_dir: Path, e: Interrupted) -> str:
    """A signal handled once the outputs were published: the run is complete. What it had left
    to do is done (the other ranks told, the temp dir removed once they have left it, as
    finish() would), and the message says so: no resume is needed."""
    said = str(e) if e.published else f"{e} after the outputs were published into {cfg.save_dir}"
    mark_done(tmp_dir)
    if cfg.debug:
        return f"{said}; the run is complete (--debug keeps {tmp_dir})"
    if wait_for_ranks_to_leave(tmp_dir, env.world_size, cfg.sync_timeout):
        return f"{said}; the run is complete, but ranks still use {tmp_dir}: left in place (remove it before the next run there)"
    cleanup_tmp_dir(tmp_dir)
    return f"{said}; the run is complete ({tmp_dir} removed)"


def _write_marker(path: Path) -> None:
    if read_marker(path.parent) is None:
        return  # its cleanup had begun: a file there would make the folder a user's
    try:
        path.write_bytes(b"")
    except OSError:
        pass  # only a hint for the other ranks' messages


def _wait_for_main(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path) -> None:
    """A rank other than 0 that has finished generating stays until rank 0 has written the
    outputs: should rank 0 die after every other rank is done, one of them still says what is
    missing and how to resume. No deadline: rank 0 is alive while it holds the run lock."""
    while True:
        state = main_rank_state(tmp_dir)
        if state == "done":
            return
        if state == "gone":
            raise RunFailed(f"rank 0 is gone; {missing_summary(cfg, env, prep, tmp_dir)}")
        if state == "stopped":
            raise Interrupted("rank 0 stopped the run")  # rank 0 (or another survivor) reports it
        time.sleep(MAIN_POLL_S)


def _main_alive(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path) -> None:
    state = main_rank_state(tmp_dir)
    if state == "gone":
        raise RunFailed(f"rank 0 is gone; {missing_summary(cfg, env, prep, tmp_dir)}")
    if state == "stopped":
        raise Interrupted("rank 0 stopped the run")


def _agree(env: DistEnv, pg: ProcessGroup, check: Any) -> None:
    """Rank 0 runs `check`; every rank learns its verdict from one broadcast, so a refused run
    stops on all ranks before any of them writes a journal line."""
    verdict: str | None = None
    if env.is_main:
        try:
            check()
        except EvalError as e:
            pg.broadcast(str(e))
            raise
    verdict = pg.broadcast(verdict)
    if verdict is not None:
        raise RunStateError(verdict)


def _claim_tmp_dir(cfg: EvalConfig, env: DistEnv, pg: ProcessGroup, tmp_dir: Path, also_writes: tuple[Role, ...],
                   also_folders: tuple[tuple[str, Path], ...], inputs: InMemoryInputs | None) -> RunLock | None:
    """Rank 0 tries the output folders, then creates and locks the temp dir before anything is
    written there (evaluate()'s in-memory examples, then the examples cache), and refuses an
    earlier run's files unless resuming."""
    holder: list[RunLock] = []

    def claim() -> None:
        try_folders(cfg, also_writes, also_folders)
        # Before anything else touches the output folders: a publish a killed run left half done
        # there is completed (or undone), and so is what that run had left to do, its temp dir's
        # removal (while that folder is still that run's: its token); unless this run resumes
        # from that temp dir (--resume, or a torchrun restart): its journals then give every
        # batch again, and only the tail runs.
        resuming = cfg.resume or env.restart_count > 0
        with recovered([Path(cfg.save_dir), *(f for _, f in also_folders if f.is_dir())]) as completed:
            pass
        for intent in completed:
            if intent.get("tmp_dir") and not (resuming and _same(intent["tmp_dir"], tmp_dir)):
                remove_finished_tmp_dir(Path(intent["tmp_dir"]), intent.get("tmp_token"))
        try:
            claim_tmp_dir(tmp_dir, run_inputs(cfg))
        except OSError as e:
            raise RunStateError(f"--tmp_dir {tmp_dir}: not writable ({e.strerror})") from e
        lock = RunLock(tmp_dir)
        lock.acquire()
        try:
            # A worker group restarted by torchrun (--max_restarts) resumes by itself.
            refuse_earlier_run(tmp_dir, cfg.resume or env.restart_count > 0)
            new_token(tmp_dir)  # from now on the temp dir is this run's, whoever made it
            if inputs is not None:
                try:
                    inputs.write_scratch(tmp_dir)
                except OSError as e:
                    raise RunStateError(f"--tmp_dir {tmp_dir}: cannot write the examples there ({e.strerror})") from e
        except EvalError:
            lock.release()
            raise
        holder.append(lock)

    _agree(env, pg, claim)
    return holder[0] if holder else None


_COPY_ROLE = "the examples evaluate() was given"


def _check_copy(cfg: EvalConfig, inputs: InMemoryInputs) -> None:
    """Before any work: the copy of evaluate()'s examples replaces only the tool's file of this
    prefix in --save_dir (again under the folder's lock as it is published)."""
    if Path(cfg.save_dir).is_dir():
        OutputRecord(Path(cfg.save_dir)).check_writable([inputs.path], cfg.output_prefix, {inputs.path: _COPY_ROLE})


def _with_copy(inputs: InMemoryInputs, also: Any) -> Any:
    """The publish's hook (outputs.write.write_outputs) that stages the copy of evaluate()'s
    examples beside the outputs, owned as an input of the run's prefix (never a stale result)."""

    def stage(summary: dict[str, Any], staging: Any) -> list[Any]:
        staging.add(inputs.path.name, inputs.data, (staging.prefix, "input"))
        staging.options["roles"] = {**(staging.options.get("roles") or {}), inputs.path: _COPY_ROLE}
        return also(summary, staging) if also is not None else [staging]

    return stage


def _same(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _distinct(folders: list[Path]) -> list[Path]:
    """Each folder once, however it is written (SAVE_PATH, SCORE_PATH and --save_dir may share one)."""
    return list({os.path.realpath(f): f for f in reversed(folders)}.values())[::-1]


def _check_manifest(cfg: EvalConfig, env: DistEnv, tmp_dir: Path, manifest: dict[str, Any]) -> None:
    found = prepare_tmp_dir(tmp_dir, manifest, cfg.resume or env.restart_count > 0)
    if found:
        logger.info("resuming from %d journal(s) in %s", found, tmp_dir)
