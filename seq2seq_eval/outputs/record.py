"""What the tool wrote into a folder, so that it writes over and removes only its own files.

{folder}/.seq2seq_eval_outputs.json lists every file the tool published there (outputs/publish.py:
a run's outputs in --save_dir, evaluate()'s copy of its examples, the legacy form's SAVE_PATH and
SCORE_PATH, compare's --report), by name, with

- `prefix`: the output prefix of the run that wrote it (--type_path, or a dataset's --split); none
  for a file the user named on the command line (SAVE_PATH, --score_path, --report);
- `kind`: "output" (a run's result), "input" (evaluate()'s examples) or "named";
- `size` and `sha256`, the content digest (outputs/digest.py), computed while it was written;
- `stamp`, once it was in place: modification and change times (ns), inode and device.

The rule: a file is the tool's own when its bytes are those recorded. The stamp is a shortcut:
while size and stamp all match, the file is taken as unchanged without reading it (any write
changes the change time, which no user can set back: `touch -r` restores the modification time
only); otherwise the file is read and its digest compared. So a `cp -a` copy of a save folder is
the tool's (the same bytes), and an edit that keeps size and modification time is not. A file of
the tool's is written over only by a command of the same prefix (or, for a named file, by another
named file), and stale results are removed only by a run of their prefix: a prefix owns its files.

While a publish is under way (or was cut short), {folder}/.seq2seq_eval_publish.json names the
files it puts in place: their new bytes count as the tool's too, until the publish is completed
or undone (publish.recover).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import dumps, write_atomic
from ..errors import OutputError
from .digest import file_digest

RECORD = ".seq2seq_eval_outputs.json"
INTENT = ".seq2seq_eval_publish.json"
STAGING = ".seq2seq_eval_staging"
"""Where files are written before they are published (publish.py); hidden, inside the folder."""
FORMAT = 2
"""Format 1 (before content digests) recorded size, modification time and inode only: its entries
cannot tell a file from an edit that keeps those, so they are never taken for the tool's."""


@dataclass(frozen=True)
class Entry:
    """One recorded file."""

    prefix: str | None
    kind: str
    size: int
    sha256: str | None  # None: an entry of format 1, which kept no digest
    stamp: tuple[int, ...] | None = None
    completion: bool = False  # a run's metric or run-info file: its presence means the run completed

    def as_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "kind": self.kind, "size": self.size, "sha256": self.sha256,
                "stamp": list(self.stamp) if self.stamp else None, "completion": self.completion}


def stamp_of(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _entry(value: Any) -> Entry:
    if not isinstance(value, dict) or not isinstance(value.get("size"), int):
        raise ValueError(f"an entry is {value!r}")
    stamp = value.get("stamp")
    return Entry(value.get("prefix"), value.get("kind", "output"), value["size"], value.get("sha256"),
                 tuple(stamp) if isinstance(stamp, list) else None, bool(value.get("completion")))


def _plain(name: Any) -> bool:
    """A file name in the folder itself: a record or intent naming anything else is not the
    tool's (nothing outside the folder is ever replaced or removed through one)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on the folder itself, which leaves no lock file behind: every publish,
    recovery and record update of a folder holds it (the kernel drops it if the holder dies)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_intent(folder: Path) -> dict[str, Any] | None:
    """The intent of a publish under way or cut short in `folder`, or None."""
    path = folder / INTENT
    if not os.path.lexists(path):
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("files"), list):
            raise ValueError("not this tool's intent")
        names = ([f.get("name") for f in data["files"]] + list(data.get("remove") or [])
                 + list(data.get("completions") or []) + [data.get("run")])
        if not all(_plain(n) for n in names):
            raise ValueError("a name that is not a plain file name")
        # The run's token, which its staging folder carries too (outputs/intent.py): without it
        # the intent is not known to be the tool's, whatever its name.
        if not isinstance(data.get("token"), str) or not data["token"]:
            raise ValueError("no run token")
        txn = data.get("txn")
        if txn is not None and not (isinstance(txn, dict) and isinstance(txn.get("token"), str)
                                    and isinstance(txn.get("folders"), list)
                                    and all(isinstance(f, str) and os.path.isabs(f) for f in txn["folders"])
                                    and txn.get("coordinator") in txn["folders"]
                                    and os.path.abspath(folder) in txn["folders"]):
            raise ValueError("a transaction that does not name this folder among absolute ones")
    except (OSError, ValueError) as e:
        raise OutputError(f"{path}: unreadable record of an interrupted publish ({e}); expected the file "
                          "seq2seq_eval writes while it moves outputs into place: remove it, check the folder "
                          "by hand, or pick another folder") from e
    return data


class OutputRecord:
    """The record of one folder, and the files of a publish under way there (read-only until
    `commit`, which the publisher calls under `locked`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / RECORD
        self.files = self._read()
        intent = read_intent(folder) if folder.is_dir() else None
        self.pending: dict[str, Entry] = {}
        if intent is not None:
            for f in intent["files"]:
                self.pending[f["name"]] = Entry(f.get("prefix", intent.get("prefix")),
                                                f.get("kind", intent.get("kind", "output")), f["size"], f["sha256"])
        self._verified: dict[str, tuple[int, ...]] = {}  # names found the tool's by their bytes: new stamps

    def _read(self) -> dict[str, Entry]:
        if not os.path.lexists(self.path):
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") not in (1, FORMAT) or not isinstance(data.get("files"), dict):
                raise ValueError("not this tool's record")
            if not all(_plain(name) for name in data["files"]):
                raise ValueError("a name that is not a plain file name")
            return {name: _entry(v) for name, v in data["files"].items()}
        except (OSError, ValueError, AttributeError) as e:
            raise OutputError(
                f"{self.path}: unreadable record of the files seq2seq_eval wrote here ({e}); remove it "
                "(the files it listed are then kept as the user's) or pick another folder"
            ) from e

    def _matches(self, path: Path, entry: Entry) -> bool:
        """Whether `path` holds the bytes `entry` recorded (the stamp first, else the digest)."""
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size or entry.sha256 is None:
            return False
        if entry.stamp is not None and stamp_of(st) == entry.stamp:
            return True
        try:
            same = file_digest(path) == entry.sha256
        except OSError:
            return False
        if same:
            self._verified[path.name] = stamp_of(st)
        return same

    def tool_entry(self, path: Path) -> Entry | None:
        """The entry whose bytes `path` holds (the record's, else a pending publish's), or None
        when it is not a file the tool wrote here."""
        if path.parent != self.folder:
            return None
        for entry in (self.files.get(path.name), self.pending.get(path.name)):
            if entry is not None and self._matches(path, entry):
                return entry
        return None

    def owns(self, path: Path) -> bool:
        return self.tool_entry(path) is not None

    def _why_not(self, path: Path) -> str:
        entry = self.files.get(path.name)
        if os.path.islink(path):
            return "is a symbolic link"
        if not path.is_file():
            return "is not a regular file"
        if entry is None:
            return f"exists and seq2seq_eval did not write it (no entry in {RECORD} there)"
        if entry.sha256 is None:
            return (f"is listed in {RECORD} by an earlier release, which kept no digest of its bytes, so it "
                    "cannot be told from a file changed since")
        return f"is not the file seq2seq_eval wrote here (its bytes differ from those in {RECORD})"

    def check_writable(self, paths: Iterable[Path], prefix: str | None, roles: Mapping[Path, str] | None = None,
                       way_out: str = "move it away or pick another --save_dir") -> None:
        """Refuse to write over a file that is not the tool's, or the tool's file of another prefix
        (`prefix` None: a file the user named)."""
        for path in paths:
            if not os.path.lexists(path):
                continue
            what = f" ({roles[path]})" if roles and path in roles else ""
            entry = self.tool_entry(path)
            if entry is None:
                raise OutputError(f"{path}{what}: {self._why_not(path)}; {way_out}: the tool writes over only its "
                                  "own earlier outputs")
            if entry.prefix != prefix:
                if entry.prefix is None:
                    whose = "a file seq2seq_eval wrote where its command line named it (SAVE_PATH, --score_path or --report)"
                else:
                    whose = f"an output of the run with prefix {entry.prefix!r} (--type_path or --split)"
                if prefix is None:
                    raise OutputError(f"{path}{what}: is {whose}, which a file named on the command line does not "
                                      "replace; name another file")
                legacy = " (it keeps its legacy name, without a prefix)" if path.name == "pseudolabel_results.json" else ""
                raise OutputError(f"{path}{what}: is {whose}{legacy}, and a folder holds each output for one prefix, "
                                  f"so a run of prefix {prefix!r} does not replace it; give this run another --save_dir")

    def stale(self, prefix: str, keep: Iterable[str], inputs: Iterable[str] = ()) -> list[Path]:
        """Results of an earlier run of `prefix` that this one does not write: exactly the names
        the record gives to outputs of that prefix, and to evaluate()'s copy of the examples that
        run was given (beside this run's outputs it would be another run's inputs), while they
        hold the bytes recorded, never a file this run reads (`inputs`: real paths)."""
        keep, reads = set(keep), set(inputs)
        found = []
        # A completion file first: a publish moves it out of place before the files it completes.
        for name, entry in sorted(self.files.items(), key=lambda item: (not item[1].completion, item[0])):
            path = self.folder / name
            if (entry.kind in ("output", "input") and entry.prefix == prefix and name not in keep
                    and os.path.realpath(path) not in reads and self._matches(path, entry)):
                found.append(path)
        return found

    def commit(self, written: Mapping[str, Entry], removed: Iterable[str] = (), scratch: Path | None = None) -> None:
        """Write the record (the caller holds `locked`; its temporary goes to `scratch`, see
        atomic.write_atomic): `written` entries added (their stamps taken now, in place),
        `removed` ones dropped, and so are entries whose file is gone."""
        files = dict(self.files)
        for name in removed:
            files.pop(name, None)
        for name, st_stamp in self._verified.items():
            if name in files and files[name].sha256 is not None:
                e = files[name]
                files[name] = Entry(e.prefix, e.kind, e.size, e.sha256, st_stamp, e.completion)
        for name, e in written.items():
            files[name] = Entry(e.prefix, e.kind, e.size, e.sha256, stamp_of(os.lstat(self.folder / name)), e.completion)
        files = {n: e for n, e in files.items() if os.path.lexists(self.folder / n)}
        self.files = files
        if files:
            write_atomic(self.path, dumps({"format": FORMAT, "files": {n: e.as_json() for n, e in sorted(files.items())}}),
                         scratch)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def bookkeeping(folder: Path) -> set[str]:
    """The real paths of the tool's own bookkeeping in `folder`: the record, the intent of a
    publish and the staging folders' files."""
    found = {os.path.realpath(folder / name) for name in (RECORD, INTENT)}
    staging = folder / STAGING
    if staging.is_dir() and not staging.is_symlink():
        found |= {os.path.realpath(p) for p in staging.rglob("*")}
    return found


def tool_files(folder: Path) -> set[str]:
    """The real paths of the files in `folder` that are the tool's: its bookkeeping, and the files
    whose bytes are those recorded. What a folder the run reads as a whole (the model's) does not
    count among its inputs, so that a folder reused as --save_dir is the same run after run."""
    if not folder.is_dir():
        return set()
    found = bookkeeping(folder)
    try:
        record = OutputRecord(folder)
    except OutputError:
        return found
    return found | {os.path.realpath(folder / name) for name in record.files if record.owns(folder / name)}
