"""Publishing files into a folder as one unit: a run's whole output set, or one file.

Every command that leaves files in a folder goes through here: a run (its outputs in --save_dir,
the shared tail's assembled files too), evaluate() (its copy of the examples), the legacy form
(SAVE_PATH, SCORE_PATH) and `compare --report`. The files are first written whole into a staging
folder inside the target folder, {folder}/.seq2seq_eval_staging/<run id>/new/ (so that every move
into place is a rename within one filesystem), each hashed as it is written (outputs/digest.py).
Then, holding an flock on the folder for the whole sequence, `Staging.publish`:

1. completes or undoes what a publisher that died there left (recover);
2. checks again that every file it replaces is the tool's and of its own prefix (record.py), and
   takes the stale results of its prefix from the record (exact names, never a pattern);
3. writes the intent, {folder}/.seq2seq_eval_publish.json: the run, each file's name, size and
   digest, the files it removes, the completion file (a run's metric or run-info file, whose
   presence means that a run completed);
4. moves aside (into .../<run id>/old/) the completion files first (the one its own replaces,
   and those among the files it removes), then each other file it removes or replaces, renaming
   each new file into place, its own completion file last;
5. writes the record, .seq2seq_eval_outputs.json, with each new file's digest and stamp;
6. deletes what it moved aside, clears the intent and removes its staging folder.

So no reader finds a completion file beside a mix of two runs' files: from the first move to
the last there is none. A publisher killed anywhere in 3-6 leaves the intent; the next command
on that folder, under the same lock and before anything else, rolls it forward when every new
file is still there (staged, or in place with the bytes the intent names), else rolls it back
(the files moved aside go back). Two publishers into one folder run one after the other. A
staging folder whose owner is gone (its flock is free) and that no intent names is removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..atomic import COPY_BYTES, dumps, fsync_dir, write_atomic, write_error
from ..errors import OutputError, first_line
from .digest import ContentHash, file_digest
from .record import INTENT, STAGING, Entry, OutputRecord, locked, read_intent

logger = logging.getLogger("seq2seq_eval")

WAY_OUT = "move it away or pick another --save_dir"


class StagedFile:
    """One file being written into a staging folder, hashed as it is written."""

    def __init__(self, staging: Staging, name: str) -> None:
        self.staging, self.name = staging, name
        self.target = staging.folder / name
        self._hash = ContentHash()
        try:
            fd = os.open(staging.new / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise write_error(self.target, e) from e
        self._f = os.fdopen(fd, "wb")

    def write(self, data: bytes | memoryview) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            raise write_error(self.target, e) from e
        self._hash.update(data)

    def close(self) -> None:
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except OSError as e:
            raise write_error(self.target, e) from e
        self.staging.staged[self.name] = (self._hash.size, self._hash.hexdigest())

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()


class Staging:
    """A publish in the making: files written whole into {folder}/.seq2seq_eval_staging/<id>/new/
    by this process, which holds an flock on <id>/ until it publishes or discards them.
    `prefix`, `kind`: the record's owner of the files (record.Entry). `tmp_dir`: a run's temp
    dir, removed by a recovery that completes this publish should the run die before it does."""

    def __init__(self, folder: Path, prefix: str | None, kind: str, tmp_dir: Path | None = None) -> None:
        self.folder = Path(os.path.abspath(folder))
        self.prefix, self.kind = prefix, kind
        self.tmp_dir = Path(os.path.abspath(tmp_dir)) if tmp_dir is not None else None
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.root = self.folder / STAGING / self.id
        self.new, self.old, self.tmp = self.root / "new", self.root / "old", self.root / "tmp"
        self.staged: dict[str, tuple[int, str]] = {}
        self._fd: int | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # Made under the folder's lock, and locked before the lock goes: a recovery never
            # takes a staging folder being made for one whose owner is gone.
            with locked(self.folder):
                _recover(self.folder)
                _own_folder(self.folder / STAGING)
                for d in (self.root, self.new, self.old, self.tmp):
                    os.mkdir(d)
                self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as e:
            raise OutputError(f"{self.folder}: cannot write there ({e.strerror or e}); expected a folder the "
                              "command can write") from e

    def file(self, name: str) -> StagedFile:
        return StagedFile(self, name)

    def add(self, name: str, data: bytes) -> None:
        f = self.file(name)
        f.write(data)
        f.close()

    def adopt(self, name: str, source: Path, size: int, digest: str) -> None:
        """A complete, fsynced file written elsewhere (the shared tail's, assembled in the temp
        dir) with its known size and digest: renamed into the staging folder, or, across
        filesystems, copied there (hashed again as it is copied, and checked)."""
        try:
            os.rename(source, self.new / name)
            self.staged[name] = (size, digest)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise write_error(self.folder / name, e) from e
        f = self.file(name)
        try:
            with open(source, "rb") as src:
                while block := src.read(COPY_BYTES):
                    f.write(block)
        except OSError as e:
            f.abandon()
            raise write_error(self.folder / name, e) from e
        f.close()
        if self.staged[name] != (size, digest):
            raise OutputError(f"{source}: changed while it was copied into {self.folder}; expected the "
                              "assembled outputs left alone until the run ends")

    def publish(self, completion: tuple[str, Callable[[list[str]], bytes]] | None = None, stale: bool = False,
                remove: Iterable[str] = (), inputs: Iterable[str] = (), roles: Mapping[Path, str] | None = None,
                way_out: str = WAY_OUT) -> list[str]:
        """Put every staged file in place as one unit (the steps in the module's docstring). The
        completion file, if any, is made under the lock from the names removed and goes last;
        `remove`: names removed if they are still the tool's; `stale`: also the results of this
        prefix this publish does not write, but none of `inputs` (real paths). Returns the
        names removed."""
        intent_written = False
        try:
            with locked(self.folder):
                _recover(self.folder)
                record = OutputRecord(self.folder)
                names = [*self.staged] + ([completion[0]] if completion else [])
                record.check_writable([self.folder / n for n in names], self.prefix, roles, way_out)
                removed = [p.name for p in record.stale(self.prefix, names, inputs)] if stale else []
                removed += [n for n in remove if n not in removed and n not in names and record.owns(self.folder / n)]
                # Completion files first (record.stale orders its own so): moved out of place first.
                removed.sort(key=lambda n: not record.files[n].completion)
                if completion is not None:
                    self.add(completion[0], completion[1](sorted(removed)))
                intent = {"format": 1, "run": self.id, "prefix": self.prefix, "kind": self.kind,
                          "files": [{"name": n, "size": s, "sha256": d} for n, (s, d) in self.staged.items()],
                          "remove": removed, "completion": completion[0] if completion else None,
                          "tmp_dir": str(self.tmp_dir) if self.tmp_dir else None}
                write_atomic(self.folder / INTENT, dumps(intent), self.tmp)
                intent_written = True
                _apply(self.folder, intent)
                _finish(self.folder, intent, record)
        except BaseException as e:
            if not intent_written:
                self.discard()
                raise
            # The intent says what to do: done here, else by the next command in the folder. With
            # no intent of this run's left, its own _finish had cleared it: the publish was whole.
            mine = (read_intent(self.folder) or {}).get("run") == self.id
            try:
                completed = recover(self.folder)
                outcome = ("completed from its staged files" if completed else "undone") if mine else "completed"
            except Exception:
                outcome = "left for the next command in this folder to complete or undo"
            if isinstance(e, OSError):  # a move or a write failed: one line, as any refusal
                raise OutputError(f"{self.folder}: putting the outputs in place failed ({first_line(e)}); the "
                                  f"publish was {outcome}") from e
            raise
        finally:
            self._release()
        return removed

    def discard(self) -> None:
        """Remove what was staged: a command that fails leaves nothing in the folder."""
        _remove_staged(self.root)
        self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def publish_bytes(folder: Path, files: Mapping[str, bytes], prefix: str | None, kind: str,
                  roles: Mapping[Path, str] | None = None, way_out: str = WAY_OUT) -> None:
    """Small files made in memory, published as one unit."""
    staging = Staging(folder, prefix, kind)
    try:
        for name, data in files.items():
            staging.add(name, data)
    except BaseException:
        staging.discard()
        raise
    staging.publish(roles=roles, way_out=way_out)


def pending(folder: Path) -> tuple[dict[str, Any], bool] | None:
    """A publish cut short in `folder`, read only (the dry run's view): its intent, and whether
    the next command completes it (else it undoes it). None when there is none."""
    folder = Path(os.path.abspath(folder))
    intent = read_intent(folder) if folder.is_dir() else None
    if intent is None:
        return None
    return intent, _complete(folder, intent, OutputRecord(folder))


def recover(folder: Path) -> list[dict[str, Any]]:
    """Under the folder's lock: complete, or undo, a publish cut short there, and remove what
    publishers that are gone left staged. Returns the intents completed (their `tmp_dir`: a
    temp dir the dead run had still to remove)."""
    folder = Path(os.path.abspath(folder))
    if not folder.is_dir() or (read_intent(folder) is None and not (folder / STAGING).is_dir()):
        return []
    with locked(folder):
        return _recover(folder)


def _recover(folder: Path) -> list[dict[str, Any]]:
    done = []
    intent = read_intent(folder)
    if intent is not None:
        record = OutputRecord(folder)
        if _complete(folder, intent, record):
            logger.warning("%s: completing the publish of run %s, cut short", folder, intent["run"])
            _apply(folder, intent, record)
            _finish(folder, intent, record)
            done.append(intent)
        else:
            logger.warning("%s: undoing the publish of run %s, cut short with staged files missing", folder, intent["run"])
            _roll_back(folder, intent)
    _remove_abandoned(folder)
    return done


def _dirs(folder: Path, intent: Mapping[str, Any]) -> tuple[Path, Path, Path]:
    """A publish's staging folder: its root, the new files, the files moved aside (its temporary
    files, such as the record's while it is written, go to root/tmp)."""
    root = folder / STAGING / intent["run"]
    return root, root / "new", root / "old"


def _holds(path: Path, f: Mapping[str, Any]) -> bool:
    """Whether `path` is a regular file with the size and digest the intent names."""
    try:
        st = os.lstat(path)
        return stat.S_ISREG(st.st_mode) and st.st_size == f["size"] and file_digest(path) == f["sha256"]
    except OSError:
        return False


def _complete(folder: Path, intent: Mapping[str, Any], record: OutputRecord) -> bool:
    """Whether a publish cut short can be completed: every new file staged whole or in place,
    and nothing but the tool's own file where a staged one goes."""
    _, new, old = _dirs(folder, intent)
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


def _apply(folder: Path, intent: Mapping[str, Any], record: OutputRecord | None = None) -> None:
    """The moves of step 4, each done unless done already (so that a recovery repeats them):
    the completion file's predecessor aside first, the files removed aside, each new file in
    place, the completion file last. `record`: in a recovery, files removed only while they
    are still the tool's."""
    _, new, old = _dirs(folder, intent)
    last = intent.get("completion")

    def aside(name: str) -> None:
        target = folder / name
        if os.path.lexists(target) and not os.path.lexists(old / name):
            os.rename(target, old / name)

    if last is not None and os.path.lexists(new / last):
        aside(last)
    for name in intent["remove"]:
        if record is None or record.owns(folder / name):
            aside(name)
    names = [f["name"] for f in intent["files"]]
    for name in [n for n in names if n != last] + [n for n in names if n == last]:
        if os.path.lexists(new / name):
            if os.path.lexists(folder / name) and os.path.lexists(old / name):
                raise OutputError(f"{folder / name}: appeared after the publish moved the tool's file aside; "
                                  "expected nothing there until the new file is renamed into place")
            aside(name)
            os.rename(new / name, folder / name)
    fsync_dir(folder)


def _finish(folder: Path, intent: Mapping[str, Any], record: OutputRecord) -> None:
    """Steps 5 and 6: the record, then what was moved aside deleted, the intent cleared."""
    written = {f["name"]: Entry(intent.get("prefix"), intent.get("kind", "output"), f["size"], f["sha256"],
                                completion=f["name"] == intent.get("completion")) for f in intent["files"]}
    root, _, old = _dirs(folder, intent)
    os.makedirs(root / "tmp", exist_ok=True)
    record.commit(written, intent["remove"], root / "tmp")
    for path in sorted(old.iterdir()) if old.is_dir() else ():
        os.unlink(path)
    os.unlink(folder / INTENT)
    fsync_dir(folder)
    _remove_staged(root)


def _roll_back(folder: Path, intent: Mapping[str, Any]) -> None:
    """Undo a publish that cannot be completed: each new file in place removed, each file moved
    aside put back. A file moved aside whose place someone has taken since stays in the staging
    folder (said in a warning), never over theirs."""
    root, new, old = _dirs(folder, intent)
    for f in reversed(intent["files"]):
        name = f["name"]
        target = folder / name
        if not os.path.lexists(new / name) and _holds(target, f):
            os.unlink(target)
    for name in [*(f["name"] for f in intent["files"]), *intent["remove"]]:
        if os.path.lexists(old / name):
            if os.path.lexists(folder / name):
                logger.warning("%s: taken since a publish moved the tool's file aside; that file is kept as %s",
                               folder / name, old / name)
                continue
            os.rename(old / name, folder / name)
    os.unlink(folder / INTENT)
    fsync_dir(folder)
    _remove_staged(root)


def _remove_staged(root: Path) -> None:
    """A staging folder's new and temporary files, then its folders if empty (a file moved
    aside stays, and so does anything that is not a regular file: the tool made none)."""
    for sub in (root / "new", root / "tmp"):
        for path in sorted(sub.iterdir()) if sub.is_dir() and not sub.is_symlink() else ():
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
    for d in (root / "new", root / "tmp", root / "old", root, root.parent):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _remove_abandoned(folder: Path) -> None:
    """Staging folders whose owner is gone (their flock is free) and that no intent names."""
    staging = folder / STAGING
    if not staging.is_dir() or staging.is_symlink():
        return
    for root in sorted(staging.iterdir()):
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a folder the tool made: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its owner is writing it
        try:
            _remove_staged(root)
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(staging)


def _own_folder(path: Path) -> None:
    if os.path.lexists(path) and (os.path.islink(path) or not path.is_dir()):
        raise OutputError(f"{path}: not the staging folder seq2seq_eval makes there (a file or a link); "
                          "remove it or pick another folder")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
