"""The on-disk steps of a publish (outputs/publish.py), and how a publish cut short is completed
or undone (the recovery itself: outputs/transaction.py): one transaction over every folder a command writes.

Each folder of a transaction holds, while it is under way, its staging folder
{folder}/.seq2seq_eval_staging/<run>/ (new/: the files to put in place, old/: the files moved
aside, tmp/: temporaries) and its intent {folder}/.seq2seq_eval_publish.json. Ownership is by
token, never by name: the staging folder holds STAGE_MARKER with the run's random token, and the
intent names that token; a folder with the tool's names and no such token (a user's
`.seq2seq_eval_staging/notes/`, an intent written by hand) is left alone, with one line saying
why. The intent also names the transaction (its own token and every folder in it) and its
coordinator, the folder whose intent is written last: that write is the commit point. So a
recovery, holding every folder's lock, completes every folder of a transaction whose
coordinator holds its intent, and undoes every folder of one whose coordinator does not (it was
killed before the commit point). The coordinator's intent is cleared last, after every other
folder is done, so it is there whenever another folder still holds its intent.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..atomic import fsync_dir, write_atomic
from ..errors import OutputError
from .digest import file_digest
from .record import INTENT, RECORD, STAGING, Entry, OutputRecord, read_intent

logger = logging.getLogger("seq2seq_eval")

STAGE_MARKER = ".seq2seq_eval_stage"
"""In each staging folder the tool makes, an empty file `STAGE_MARKER.<token>`, the run's random
token (made in one step, so a kill never leaves half of one). Without it, not the tool's."""
_TOKEN = re.compile(r"[0-9a-f]{32}")
_SAID: set[str] = set()
"""Folders this process said it leaves alone: a command recovers a folder several times (as it
stages, as it publishes), and says so once."""


def stage_token(root: Path) -> str | None:
    """The token of the staging folder `root` if the tool made it (it holds exactly one marker,
    a regular file, named with a token), else None."""
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return None
        found = [n for n in os.listdir(root) if n.startswith(STAGE_MARKER + ".")]
        if len(found) != 1 or not stat.S_ISREG(os.lstat(root / found[0]).st_mode):
            return None
    except OSError:
        return None
    token = found[0][len(STAGE_MARKER) + 1:]
    return token if _TOKEN.fullmatch(token) else None


def mark(root: Path, token: str) -> None:
    """Make `root` (just created, empty) the staging folder of the run with `token`."""
    os.close(os.open(root / f"{STAGE_MARKER}.{token}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


def dirs(folder: Path, intent: Mapping[str, Any]) -> tuple[Path, Path, Path]:
    """A publish's staging folder: its root, the new files, the files moved aside."""
    root = folder / STAGING / intent["run"]
    return root, root / "new", root / "old"


def check_owned(folder: Path, intent: Mapping[str, Any]) -> None:
    """Refuse to act on an intent whose staging folder does not carry the intent's token: an
    intent written by hand, one whose staging folder was removed or replaced, or another run's
    under that name. The tool clears an intent before it removes its staging folder, so its own
    intents always have theirs."""
    root = dirs(folder, intent)[0]
    if stage_token(root) != intent["token"]:
        raise OutputError(f"{folder / INTENT}: names run {intent['run']}, but {root} is missing or does not carry "
                          f"that run's token ({STAGE_MARKER}.<token>), so neither is known to be seq2seq_eval's; "
                          "nothing is moved: check the folder by hand and remove them, or pick another folder")


def _holds(path: Path, f: Mapping[str, Any]) -> bool:
    """Whether `path` is a regular file with the size and digest the intent names."""
    try:
        st = os.lstat(path)
        return stat.S_ISREG(st.st_mode) and st.st_size == f["size"] and file_digest(path) == f["sha256"]
    except OSError:
        return False


def completable(folder: Path, intent: Mapping[str, Any], record: OutputRecord) -> bool:
    """Whether a folder's part of a publish cut short can be completed: every new file staged
    whole or in place, and nothing but the tool's own file where a staged one goes."""
    _, new, old = dirs(folder, intent)
    for f in intent["files"]:
        staged, target = new / f["name"], folder / f["name"]
        if os.path.lexists(staged):
            if os.lstat(staged).st_size != f["size"]:
                return False
            if os.path.lexists(target) and (os.path.lexists(old / f["name"]) or not record.owns(target)):
                return False
        elif not _holds(target, f):
            return False
    return True


RECORD_OLD = "record.old"
"""In a staging folder: the folder's record as it was before this publish (a hard link, made
before the new one is written), put back if the publish is undone."""


def completions(intent: Mapping[str, Any]) -> list[str]:
    """The completion files of a folder's part of a publish: the metric or run-info file, SCORE_PATH,
    a report... (an intent of format 2 names one, `completion`)."""
    if "completions" in intent:
        return list(intent["completions"])
    return [intent["completion"]] if intent.get("completion") else []


def _aside(folder: Path, old: Path, name: str) -> None:
    target = folder / name
    if os.path.lexists(target) and not os.path.lexists(old / name):
        os.rename(target, old / name)


def _removed(folder: Path, intent: Mapping[str, Any], record: OutputRecord | None) -> list[str]:
    """The names this part removes: in a recovery, only while they are still the tool's."""
    return [n for n in intent["remove"] if record is None or record.owns(folder / n)]


def apply_all(parts: list[tuple[Path, Mapping[str, Any], OutputRecord | None]]) -> None:
    """The moves of every folder of a transaction, each done unless done already (so that a
    recovery repeats them), in three rounds over all the folders: every completion file there
    moved aside (the ones replaced and the stale ones removed), so that from the first change
    in any folder no folder shows a completion file; then, folder after folder, the other files
    removed moved aside and each new file renamed into place; then every new completion file
    put in place. A reader therefore never finds, in any folder, a completion file beside files
    of another run. `record`: in a recovery, files removed only while they are still the tool's."""
    for folder, intent, record in parts:
        _, new, old = dirs(folder, intent)
        last = set(completions(intent))
        for name in [*(n for n in last if os.path.lexists(new / n)), *(n for n in _removed(folder, intent, record) if n in last)]:
            _aside(folder, old, name)
    for folder, intent, record in parts:
        _, new, old = dirs(folder, intent)
        last = set(completions(intent))
        for name in _removed(folder, intent, record):
            _aside(folder, old, name)
        for name in [f["name"] for f in intent["files"] if f["name"] not in last]:
            _put(folder, new, old, name)
    for folder, intent, _ in parts:
        _, new, old = dirs(folder, intent)
        for name in [f["name"] for f in intent["files"] if f["name"] in set(completions(intent))]:
            _put(folder, new, old, name)
    for folder, _, _ in parts:
        fsync_dir(folder)


def _put(folder: Path, new: Path, old: Path, name: str) -> None:
    if os.path.lexists(new / name):
        if os.path.lexists(folder / name) and os.path.lexists(old / name):
            raise OutputError(f"{folder / name}: appeared after the publish moved the tool's file aside; "
                              "expected nothing there until the new file is renamed into place")
        _aside(folder, old, name)
        os.rename(new / name, folder / name)


def commit_record(folder: Path, intent: Mapping[str, Any], record: OutputRecord) -> None:
    """The folder's record rewritten for this publish; the record it replaces kept first (a hard
    link in the staging folder), so that the publish can still be undone until it is cleaned."""
    written = {f["name"]: Entry(f.get("prefix", intent.get("prefix")), f.get("kind", intent.get("kind", "output")),
                                f["size"], f["sha256"], completion=f["name"] in completions(intent))
               for f in intent["files"]}
    root = dirs(folder, intent)[0]
    os.makedirs(root / "tmp", exist_ok=True)
    if os.path.lexists(folder / RECORD) and not os.path.lexists(root / RECORD_OLD):
        try:
            os.link(folder / RECORD, root / RECORD_OLD)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                raise
            # A filesystem without hard links (FAT, some network and FUSE mounts): a copy.
            write_atomic(root / RECORD_OLD, (folder / RECORD).read_bytes(), root / "tmp")
    record.commit(written, intent["remove"], root / "tmp")


def clean(folder: Path, intent: Mapping[str, Any]) -> None:
    """After every folder's record: what was moved aside deleted, the intent cleared, the staging
    folder removed. From the first of these on, the publish is whole; what a kill leaves here
    is cleaned by the next command."""
    root, _, old = dirs(folder, intent)
    for path in sorted(old.iterdir()) if old.is_dir() else ():
        os.unlink(path)
    if os.path.lexists(root / RECORD_OLD):
        os.unlink(root / RECORD_OLD)
    if os.path.lexists(folder / INTENT):
        os.unlink(folder / INTENT)
    fsync_dir(folder)
    remove_staged(root)


def roll_back_all(parts: list[tuple[Path, Mapping[str, Any]]]) -> None:
    """Undo a publish that cannot be completed, in every folder of it, in the reverse of
    apply_all's rounds: each new completion file in place removed, in every folder; then, folder
    after folder, each other new file removed and each file moved aside put back; then the
    completion files moved aside put back, each folder's record as it was, its intent cleared.
    So at no instant does a completion file stand beside files of another run, in any folder.
    A file moved aside whose place someone has taken since stays in the staging folder (said in
    a warning), never over theirs."""

    def unplace(folder: Path, intent: Mapping[str, Any], which: bool) -> None:
        new = dirs(folder, intent)[1]
        for f in reversed(intent["files"]):
            if (f["name"] in completions(intent)) == which and not os.path.lexists(new / f["name"]) and _holds(folder / f["name"], f):
                os.unlink(folder / f["name"])

    def put_back(folder: Path, intent: Mapping[str, Any], which: bool) -> None:
        old = dirs(folder, intent)[2]
        for name in dict.fromkeys([*(f["name"] for f in intent["files"]), *intent["remove"]]):
            if (name in completions(intent)) != which or not os.path.lexists(old / name):
                continue
            if os.path.lexists(folder / name):
                logger.warning("%s: taken since a publish moved the tool's file aside; that file is kept as %s",
                               folder / name, old / name)
                continue
            os.rename(old / name, folder / name)

    for folder, intent in parts:
        unplace(folder, intent, True)
    for folder, intent in parts:
        unplace(folder, intent, False)
        put_back(folder, intent, False)
    for folder, intent in parts:
        root = dirs(folder, intent)[0]
        put_back(folder, intent, True)
        if os.path.lexists(root / RECORD_OLD):
            os.replace(root / RECORD_OLD, folder / RECORD)  # a no-op on the same file: then unlinked
            with contextlib.suppress(FileNotFoundError):
                os.unlink(root / RECORD_OLD)
        elif intent.get("had_record") is False and os.path.lexists(folder / RECORD):
            os.unlink(folder / RECORD)  # this publish wrote the first one (under the lock: no one else did)
        if os.path.lexists(folder / INTENT):  # a publish undone at once may have failed writing it
            os.unlink(folder / INTENT)
        fsync_dir(folder)
        remove_staged(root)


def remove_staged(root: Path) -> None:
    """A staging folder's new and temporary files, its marker, then its folders if empty (a file
    moved aside stays, and so does anything that is not a regular file: the tool made none).
    Only a folder that carries the tool's token (stage_token): the caller checked whose."""
    token = stage_token(root)
    if token is None:
        return
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.lstat(root / RECORD_OLD).st_mode):
            os.unlink(root / RECORD_OLD)
    for sub in (root / "new", root / "tmp"):
        for path in sorted(sub.iterdir()) if sub.is_dir() and not sub.is_symlink() else ():
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
    for d in (root / "new", root / "tmp", root / "old"):
        with contextlib.suppress(OSError):
            os.rmdir(d)
    # The marker goes only once nothing but it is left: a folder still holding files stays marked.
    with contextlib.suppress(OSError):
        if len(os.listdir(root)) == 1:
            os.unlink(root / f"{STAGE_MARKER}.{token}")
    for d in (root, root.parent):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def remove_abandoned(folder: Path) -> None:
    """Staging folders whose owner is gone (their flock is free), that carry the tool's token and
    that no intent names. Any other folder there is left alone, said in one line."""
    import fcntl

    staging = folder / STAGING
    if not staging.is_dir() or staging.is_symlink():
        return
    intent = read_intent(folder)
    for root in sorted(staging.iterdir()):
        if intent is not None and root.name == intent["run"]:
            continue
        if stage_token(root) is None:
            with contextlib.suppress(OSError):
                os.rmdir(root)  # an empty folder loses nothing (a run killed as it made it)
                continue
            if str(root) in _SAID:
                continue
            _SAID.add(str(root))
            logger.warning("%s: left alone: not a staging folder seq2seq_eval made (no %s.<token> in it)", root, STAGE_MARKER)
            continue
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its owner is writing it
        try:
            remove_staged(root)
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(staging)
