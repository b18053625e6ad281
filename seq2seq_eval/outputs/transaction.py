"""A publish cut short, completed or undone: one transaction over every folder a command writes.

The intent names the transaction (its own token and every folder in it) and its coordinator, the
folder whose intent is written last: that write is the commit point. So a recovery, holding
every folder's lock, completes every folder of a transaction whose coordinator holds its intent
(and whose new files are all there), and undoes every folder of any other: one verdict for the
whole transaction. The on-disk steps themselves are outputs/intent.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EvalError, OutputError, first_line
from .intent import apply_all, check_owned, clean, commit_record, completable, remove_abandoned, roll_back_all
from .record import INTENT, OutputRecord, locked, read_intent

logger = logging.getLogger("seq2seq_eval")

def members(folder: Path, intent: Mapping[str, Any]) -> list[Path]:
    """Every folder of the transaction `intent` belongs to (the folder alone for a publish of one)."""
    txn = intent.get("txn")
    return [Path(p) for p in txn["folders"]] if txn else [folder]


def _peek(folder: Path) -> list[Path]:
    """The folders a publish cut short in `folder` involves, read without its lock (the caller
    locks them all, then reads again)."""
    try:
        intent = read_intent(folder) if folder.is_dir() else None
    except OutputError:
        return [folder]
    return members(folder, intent) if intent else [folder]


@contextlib.contextmanager
def locked_all(folders: Iterable[Path]) -> Iterator[None]:
    """The flocks of several folders, always taken in one order (sorted real paths), so that two
    commands locking overlapping sets never wait for each other in a circle."""
    with contextlib.ExitStack() as stack:
        for folder in sorted({os.path.realpath(f) for f in folders}):
            if os.path.isdir(folder):
                stack.enter_context(locked(Path(folder)))
        yield


@contextlib.contextmanager
def recovered(folders: Iterable[Path]) -> Iterator[list[dict[str, Any]]]:
    """Every folder in `folders`, and every folder a publish cut short there involves, locked;
    those publishes completed or undone, whole (recover_locked); yields the intents completed."""
    wanted = {Path(os.path.abspath(f)) for f in folders}
    while True:
        involved = set(wanted)
        for f in wanted:
            involved.update(_peek(f))
        with locked_all(involved):
            # Read again under the locks: a publish may have begun or ended meanwhile.
            now = set(wanted)
            for f in wanted:
                now.update(_peek(f))
            if {os.path.realpath(f) for f in now} <= {os.path.realpath(f) for f in involved}:
                try:
                    with signals_held():  # a signal mid-recovery would leave what it recovers half done
                        completed = recover_locked(involved)
                except OSError as e:
                    raise recovery_error(sorted(involved), e) from e
                except EvalError as e:
                    if not isinstance(e.__cause__, OSError):  # a refusal (an intent not the tool's): as it is
                        raise
                    raise recovery_error(sorted(involved), e.__cause__) from e
                yield completed
                return


def recovery_error(folders: Iterable[Path], e: OSError) -> OutputError:
    """A publish cut short that the next command could neither complete nor undo (the same fault
    again: a file made immutable, a read-only or full disk): one line, what is there, what to do."""
    where = ", ".join(str(f) for f in folders)
    return OutputError(f"{where}: finishing a publish cut short there failed midway ({e.strerror or e}"
                       f"{': ' + e.filename if getattr(e, 'filename', None) else ''}), so the folder may hold part of "
                       f"it; its intent {INTENT} and staged files are kept, left for the next command to complete or "
                       "undo: fix that (permissions, space, a file's flags), then run the command again")


def recover_locked(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """With every folder's lock held: each transaction cut short there completed (its
    coordinator holds its intent: past the commit point) or undone, every folder of it, the
    coordinator last; then staging folders whose owner is gone removed. Returns the intents
    completed."""
    done: list[dict[str, Any]] = []
    folders = sorted({Path(os.path.abspath(f)) for f in folders})
    for folder in folders:
        intent = read_intent(folder) if folder.is_dir() else None
        if intent is None:
            continue
        check_owned(folder, intent)
        group = members(folder, intent)
        if not {os.path.realpath(f) for f in group} <= {os.path.realpath(f) for f in folders}:
            continue  # a transaction over folders not locked here: the next command on one of them
        coordinator = Path(intent["txn"]["coordinator"]) if intent.get("txn") else folder
        parts = [(folder, intent)] if not intent.get("txn") else []
        for f in group if intent.get("txn") else ():
            other = read_intent(f) if f.is_dir() else None
            if other is not None and (other.get("txn") or {}).get("token") == intent["txn"]["token"]:
                check_owned(f, other)
                parts.append((f, other))
        committed = any(f == coordinator and not i.get("undo") for f, i in parts)
        records = {f: OutputRecord(f) for f, _ in parts}
        # One verdict for the whole transaction: completed in every folder, or undone in every one.
        if committed and all(completable(f, i, records[f]) for f, i in parts):
            for f, i in parts:
                logger.warning("%s: completing the publish of run %s, cut short", f, i["run"])
            apply_all([(f, i, records[f]) for f, i in parts])
            for f, i in parts:
                commit_record(f, i, records[f])
            # The coordinator last: its intent, the commit point, stays until every other folder is done.
            ordered = sorted(parts, key=lambda p: p[0] == coordinator)
            for k, (f, i) in enumerate(ordered):
                try:
                    clean(f, i)
                except OSError as e:
                    # Every folder holds the publish's files and record: it is complete. What it
                    # had moved aside, and its intent if not yet removed, are the next command's
                    # to clean, as a publish leaves them (meet_fault, once whole): a warning, not
                    # a recovery that failed; the folders after it keep their intents (the
                    # coordinator's is the commit point), so no folder of it is ever undone.
                    logger.warning("%s: the publish of run %s, cut short, is completed; removing what it had moved "
                                   "aside failed (%s%s): the next command in it removes it", f, i["run"],
                                   e.strerror or e, f": {e.filename}" if getattr(e, "filename", None) else "")
                    done.extend(intent for _, intent in ordered[k:])
                    break
                done.append(i)
        else:
            why = ("with staged files missing" if committed else "before it was whole" if any(i.get("undo") for _, i in parts)
                   else "before every folder of it was ready")
            # The coordinator first: once its intent is gone, a kill here leaves the rest to be undone too.
            ordered = sorted(parts, key=lambda p: p[0] != coordinator)
            for f, i in ordered:
                logger.warning("%s: undoing the publish of run %s, cut short %s", f, i["run"], why)
            roll_back_all(ordered)
    for folder in folders:
        if folder.is_dir():
            remove_abandoned(folder)
    return done


def meet_fault(stagings: Sequence[Any], intents: list[dict[str, Any]], written: list[Any], whole: bool,
               e: BaseException) -> None:
    """A step of publish.publish_together (its `stagings`, their `intents`, those `written`) failed
    with `e`, under the locks: undone at once, or, once every
    folder held its new files and record, left whole with its leftovers; raises the one line
    that says which, unless the publish is whole (then a warning, and the command goes on)."""
    where = ", ".join(str(s.folder) for s in stagings)
    cause = e.__cause__ if isinstance(e, EvalError) and isinstance(e.__cause__, OSError) else e
    # A write's own line says "the previous version is unchanged": here the publish says what is.
    reason = first_line(cause) if isinstance(cause, EvalError) else f"{cause.strerror or cause}" + (
        f": {cause.filename}" if getattr(cause, "filename", None) else "")
    if whole:
        logger.warning("%s: the outputs are published; removing what the publish had moved aside failed (%s): "
                       "the next command in %s removes it", where, reason, "these folders" if len(stagings) > 1 else "it")
        return
    by_id = {s.id: intent for s, intent in zip(stagings, intents)}
    coordinator = stagings[-1]
    try:
        # The coordinator first: once its intent is gone, what a kill leaves here is undone too.
        roll_back_all([(s.folder, by_id[s.id]) for s in sorted(written, key=lambda s: s is not coordinator)])
    except OSError as again:
        raise OutputError(f"{where}: putting the outputs in place failed ({reason}), and undoing it failed too "
                          f"({again.strerror or again}); the intent {INTENT} and the staged files are kept: fix the "
                          "cause, then run any command on the folder, which completes or undoes it first"
                          f"{_resume(stagings)}") from e
    raise OutputError(f"{where}: putting the outputs in place failed ({reason}); undone: "
                      f"{'each folder holds' if len(stagings) > 1 else 'it holds'} what it held before{_resume(stagings)}") from e


def _resume(stagings: Sequence[Any]) -> str:
    tmp = next((s.tmp_dir for s in stagings if s.tmp_dir is not None), None)
    return (f"; this run's batches are kept in {tmp}: fix the cause, then rerun the same command with --resume"
            if tmp is not None else "; fix the cause, then run the command again")


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held from the first intent to the last folder done, where the command
    turns them into an exception (the run's handler, Python's KeyboardInterrupt): raised between
    two renames, it would leave the folders for the next command to complete, and the command
    could not say whether its outputs were published. Held, it is raised once they are. Where the
    signal's default action applies (it ends the process) it is not held: that is a kill, which
    the next command recovers from. Only the main thread sets handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            old[sig] = handler
            signal.signal(sig, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if came:
        old[came[0]](came[0], None)
