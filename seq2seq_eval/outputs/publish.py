"""Publishing files into folders as one unit: a command's whole output set, in every folder it
writes, or one file.

Every command that leaves files in a folder goes through here: a run (its outputs in --save_dir,
the shared tail's assembled files too), evaluate() (its copy of the examples), the legacy form
(--save_dir, SAVE_PATH and SCORE_PATH: one transaction over their folders) and `compare
--report`. The files are first written whole into a staging folder inside each target folder,
{folder}/.seq2seq_eval_staging/<run id>/new/ (so that every move into place is a rename within one
filesystem), each hashed as it is written (outputs/digest.py); the staging folder carries the
run's random token (intent.STAGE_MARKER). Then, holding the flock of every folder of the
transaction for the whole sequence (taken in one order), `publish_together`:

1. completes or undoes what a publisher that died there left (transaction.recovered);
2. checks again that every file it replaces is the tool's and of its own prefix (record.py), and
   takes the stale results of its prefix from the record (exact names, never a pattern);
3. writes each folder's intent, {folder}/.seq2seq_eval_publish.json: the run and its token, each
   file's name, size and digest, the files it removes, the completion file (a run's metric or
   run-info file, whose presence means that a run completed) and, with several folders, the
   transaction: its token, its folders and its coordinator, whose intent is written last (the
   commit point);
4. moves aside (into .../<run id>/old/) the completion files of every folder first (the metric or
   run-info file, SCORE_PATH, a report, the legacy pseudolabel file), then, folder after folder,
   each other file it removes or replaces, renaming each new file into place, and every new
   completion file last (intent.apply_all);
5. writes each folder's record, .seq2seq_eval_outputs.json, the one it replaces kept as a hard
   link in the staging folder: from here the publish is whole;
6. in each folder, the coordinator last: deletes what it moved aside, clears the intent and
   removes its staging folder.

SIGINT and SIGTERM wait from step 3 to the end of step 6 (when the command handles them), so a
signal there ends the command with the outputs published, and says so. A fault in 3-5 (a move
or a write that fails) is undone at once, under the same locks, in every folder (intent.roll_back_all);
one in 6 leaves the publish whole and its leftovers to the next command. A publisher killed
anywhere in 3-6 leaves intents; the next command on any of those folders, under the locks of
them all and before anything else, completes every folder (past the commit point, with every
new file still there: staged, or in place with the bytes the intent names) or undoes every one
(the files moved aside go back, the records as they were). Two publishers into one folder run
one after the other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import COPY_BYTES, dumps, write_atomic, write_error
from ..errors import EvalError, Interrupted, OutputError, first_line
from ..run.tmpmarker import mark_published
from .digest import ContentHash
from .intent import apply_all, check_owned, clean, commit_record, completable, mark, remove_staged
from .transaction import meet_fault, recovered, signals_held
from .record import INTENT, RECORD, STAGING, OutputRecord, read_intent

logger = logging.getLogger("seq2seq_eval")

WAY_OUT = "move it away or pick another --save_dir"


NAMED_WAY_OUT = "move it away or name another file"

Owner = tuple[str | None, str]
"""The record's owner of a file (record.Entry): a run's prefix (None for a file named on the
command line) and its kind."""


class StagedFile:
    """One file being written into a staging folder, hashed as it is written."""

    def __init__(self, staging: Staging, name: str, owner: Owner | None = None) -> None:
        self.staging, self.name, self.owner = staging, name, owner
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
        if self.owner is not None:
            self.staging.owners[self.name] = self.owner

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()


class Staging:
    """A folder's part of a publish in the making: files written whole into
    {folder}/.seq2seq_eval_staging/<id>/new/ by this process, which holds an flock on <id>/ until
    it publishes or discards them; <id>/ carries a random token (intent.STAGE_MARKER) that the
    intent names. `prefix`, `kind`: the record's owner of the files (record.Entry), unless a file
    names its own. `tmp_dir`, `tmp_token`: a run's temp dir and the token its marker carries in
    this run, removed by a recovery that completes this publish should the run die before it
    does (only while the marker still carries that token)."""

    def __init__(self, folder: Path, prefix: str | None, kind: str, tmp_dir: Path | None = None,
                 tmp_token: str | None = None) -> None:
        self.folder = Path(os.path.abspath(folder))
        self.prefix, self.kind = prefix, kind
        self.tmp_dir = Path(os.path.abspath(tmp_dir)) if tmp_dir is not None else None
        self.tmp_token = tmp_token
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.token = secrets.token_hex(16)
        self.root = self.folder / STAGING / self.id
        self.new, self.old, self.tmp = self.root / "new", self.root / "old", self.root / "tmp"
        self.staged: dict[str, tuple[int, str]] = {}
        self.owners: dict[str, Owner] = {}
        self.options: dict[str, Any] = {}
        self._fd: int | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # Made under the folder's lock, and locked before the lock goes: a recovery never
            # takes a staging folder being made for one whose owner is gone.
            with recovered([self.folder]):
                _own_folder(self.folder / STAGING)
                os.mkdir(self.root)
                self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                mark(self.root, self.token)
                for d in (self.new, self.old, self.tmp):
                    os.mkdir(d)
        except OSError as e:
            raise OutputError(f"{self.folder}: cannot write there ({e.strerror or e}); expected a folder the "
                              "command can write") from e

    def file(self, name: str, owner: Owner | None = None) -> StagedFile:
        return StagedFile(self, name, owner)

    def add(self, name: str, data: bytes, owner: Owner | None = None) -> None:
        f = self.file(name, owner)
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

    def plan(self, completion: tuple[str, Callable[[list[str]], bytes]] | None = None, stale: bool = False,
             remove: Iterable[str] = (), inputs: Iterable[str] = (), roles: Mapping[Path, str] | None = None,
             way_out: str = WAY_OUT, drop_folder: bool = False, completes: Iterable[str] = ()) -> Staging:
        """What this folder's publish does besides putting the staged files in place. The
        completion file, if any, is made under the lock from the names removed and goes last;
        `remove`: names removed if they are still the tool's; `stale`: also the results of this
        prefix this publish does not write, but none of `inputs` (real paths); `drop_folder`: the
        folder is removed at the end if nothing is left in it (the legacy form's hidden --save_dir);
        `completes`: staged files that are completion files too (SCORE_PATH, a report, the legacy
        pseudolabel file): moved aside before anything changes in any folder, put in place last."""
        self.options = dict(completion=completion, stale=stale, remove=list(remove), inputs=list(inputs),
                            roles=roles, way_out=way_out, drop_folder=drop_folder, completes=list(completes))
        return self

    def publish(self, *args: Any, **options: Any) -> list[str]:
        """This folder alone (the arguments of plan). Returns the names removed."""
        return publish_together([self.plan(*args, **options)])[0]

    def unstage(self) -> None:
        """Drop every file staged so far (this folder then publishes only its removals)."""
        for name in [*self.staged]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.new / name)
        self.staged.clear()
        self.owners.clear()

    def discard(self) -> None:
        """Remove what was staged: a command that fails leaves nothing in the folder."""
        remove_staged(self.root)
        self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _intent(self, record: OutputRecord, txn: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
        """Under the locks: the checks again, the completion file made, the intent."""
        o = self.options or self.plan().options
        completion = o["completion"]
        names = [*self.staged] + ([completion[0]] if completion else [])
        for prefix in dict.fromkeys([self.owners.get(n, (self.prefix, self.kind))[0] for n in names]):
            mine = [self.folder / n for n in names if self.owners.get(n, (self.prefix, self.kind))[0] == prefix]
            record.check_writable(mine, prefix, o["roles"], o["way_out"] if prefix == self.prefix else NAMED_WAY_OUT)
        removed = [p.name for p in record.stale(self.prefix, names, o["inputs"])] if o["stale"] else []
        removed += [n for n in o["remove"] if n not in removed and n not in names and record.owns(self.folder / n)]
        # Completion files first (record.stale orders its own so): moved out of place first.
        removed.sort(key=lambda n: not record.files[n].completion)
        if completion is not None:
            self.add(completion[0], completion[1](sorted(removed)))
        files = []
        for n, (size, digest) in self.staged.items():
            prefix, kind = self.owners.get(n, (self.prefix, self.kind))
            files.append({"name": n, "size": size, "sha256": digest, "prefix": prefix, "kind": kind})
        last = [n for n in o.get("completes", ()) if n in self.staged and (not completion or n != completion[0])]
        last += [completion[0]] if completion else []
        intent = {"format": 3, "run": self.id, "token": self.token, "prefix": self.prefix, "kind": self.kind,
                  "files": files, "remove": removed, "completions": last,
                  "had_record": os.path.lexists(self.folder / RECORD),
                  "tmp_dir": str(self.tmp_dir) if self.tmp_dir else None, "tmp_token": self.tmp_token}
        if txn is not None:
            intent["txn"] = txn
        return intent, removed


def publish_together(stagings: Sequence[Staging], on_whole: Callable[[], None] | None = None) -> list[list[str]]:
    """Put every staging's files in place, in every folder, as one transaction (the steps in the
    module's docstring); one staging per folder, the last one the coordinator. Returns the
    names removed in each folder. `on_whole`: called once every folder holds the new files and
    its record (and each staging's temp dir is marked published), before the publish's own
    files are cleaned.

    A fault at any step (a move or a write that fails: EPERM, ENOSPC, EIO, EROFS...) is met at
    once, under the same locks: before every folder holds its new files and record, the publish
    is undone in every folder (the files moved aside put back, the record as it was); after,
    it is whole, and only its leftovers remain, for the next command to clean. The message
    says which, from what the folders hold."""
    folders = [s.folder for s in stagings]
    if len({os.path.realpath(f) for f in folders}) != len(folders):
        raise ValueError(f"one staging per folder, got {folders}")
    txn = None
    if len(stagings) > 1:
        txn = {"token": secrets.token_hex(16), "folders": [str(f) for f in folders], "coordinator": str(folders[-1])}
    written: list[Staging] = []
    done = False
    try:
        with recovered(folders):
            records = [OutputRecord(s.folder) for s in stagings]
            planned = [s._intent(r, txn) for s, r in zip(stagings, records)]
            with signals_held():
                whole = False
                try:
                    # The coordinator's intent last: once it is written, the transaction completes.
                    for s, (intent, _) in zip(stagings, planned):
                        # Counted before it is written: a fault after its rename (the folder's
                        # fsync) leaves it on disk, and the undo must clear it.
                        written.append(s)
                        write_atomic(s.folder / INTENT, dumps(intent), s.tmp)
                    apply_all([(s.folder, intent, None) for s, (intent, _) in zip(stagings, planned)])
                    for s, r, (intent, _) in zip(stagings, records, planned):
                        commit_record(s.folder, intent, r)
                    whole = True
                    # A staging that names a run's temp dir (a run, `select --output`) marks it
                    # published here, before anything of the publish is cleaned: the intent says
                    # so until then, the marker from then on, so that a kill at any step after
                    # leaves a temp dir the next command clears, never one it refuses as an
                    # unfinished run to --resume. Here for every publisher, not left to each.
                    for s in stagings:
                        if s.tmp_dir is not None:
                            mark_published(s.tmp_dir, s.tmp_token)
                    if on_whole is not None:
                        on_whole()
                    # The coordinator last: its intent stays until every other folder is clean.
                    for s, (intent, _) in zip(stagings, planned):
                        clean(s.folder, intent)
                    for s in stagings:
                        if s.options.get("drop_folder"):
                            with contextlib.suppress(OSError):
                                os.rmdir(s.folder)
                except (OSError, EvalError) as e:
                    if not written:
                        raise
                    meet_fault(stagings, [intent for intent, _ in planned], written, whole, e)
                done = True
    except BaseException as e:
        if done:
            # A signal held during the publish, handled now: the outputs are all in place.
            where = ", ".join(str(f) for f in folders)
            err = Interrupted(f"{first_line(e)} after the outputs were published into {where}")
            err.published = True
            raise err from e
        if not written:
            for s in stagings:
                s.discard()
        raise
    finally:
        for s in stagings:
            s._release()
    return [removed for _, removed in planned]


def publish_bytes(folder: Path, files: Mapping[str, bytes], prefix: str | None, kind: str,
                  roles: Mapping[Path, str] | None = None, way_out: str = WAY_OUT, completes: Iterable[str] = ()) -> None:
    """Small files made in memory, published as one unit (`completes`: Staging.plan)."""
    staging = Staging(folder, prefix, kind)
    try:
        for name, data in files.items():
            staging.add(name, data)
    except BaseException:
        staging.discard()
        raise
    staging.publish(roles=roles, way_out=way_out, completes=completes)


def pending(folder: Path) -> tuple[dict[str, Any], bool] | None:
    """A publish cut short in `folder`, read only (the dry run's view): its intent, and whether
    the next command completes it (else it undoes it). None when there is none."""
    folder = Path(os.path.abspath(folder))
    intent = read_intent(folder) if folder.is_dir() else None
    if intent is None:
        return None
    check_owned(folder, intent)
    txn = intent.get("txn")
    if txn is not None:
        coordinator = Path(txn["coordinator"])
        other = read_intent(coordinator) if coordinator.is_dir() else None
        if other is None or (other.get("txn") or {}).get("token") != txn["token"]:
            return intent, False
    return intent, completable(folder, intent, OutputRecord(folder))


def recover(folder: Path) -> list[dict[str, Any]]:
    """Under the locks of `folder` and of every folder a publish cut short there involves:
    complete, or undo, that publish, and remove what publishers that are gone left staged.
    Returns the intents completed (their `tmp_dir`: a temp dir the dead run had still to
    remove)."""
    folder = Path(os.path.abspath(folder))
    if not folder.is_dir() or (read_intent(folder) is None and not (folder / STAGING).is_dir()):
        return []
    with recovered([folder]) as completed:
        return completed


def _own_folder(path: Path) -> None:
    if os.path.lexists(path) and (os.path.islink(path) or not path.is_dir()):
        raise OutputError(f"{path}: not the staging folder seq2seq_eval makes there (a file or a link); "
                          "remove it or pick another folder")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)


def report_pending(folder: Path, say: bool = True) -> tuple[str, str | None] | None:
    """The dry run writes nothing: a publish cut short in an output folder is said, and left to
    the command that runs next, which completes (or undoes) it before anything else. Returns the
    real path of the temp dir that completing it removes, and the token it must carry, if any."""
    found = pending(folder)
    if found is None:
        return None
    intent, completes = found
    if say:  # rank 0 (every rank of a torchrun dry run gets here)
        logger.warning("%s: holds a publish cut short (run %s, %d file(s)); the run %s it before anything else",
                       folder, intent.get("run"), len(intent["files"]),
                       "completes" if completes else "undoes (it did not reach its commit point, or some of its files are gone)")
    if not completes or not intent.get("tmp_dir"):
        return None
    return os.path.realpath(intent["tmp_dir"]), intent.get("tmp_token")
