"""What the tool wrote into a --save_dir, so that it writes over and removes only its own files.

{save_dir}/.seq2seq_eval_outputs.json lists every file a run (or evaluate()) wrote there, by
name, with the size, modification time and inode it had when written. A file counts as the
tool's only while all three still match: a file the user made, copied in, edited or replaced
since is the user's, and the tool neither writes over it nor removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..atomic import dumps, write_atomic
from ..errors import OutputError

RECORD = ".seq2seq_eval_outputs.json"
FORMAT = 1


def _stamp(path: Path) -> dict[str, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


class OutputRecord:
    """The record of one --save_dir (read-only until `update`)."""

    def __init__(self, save_dir: Path) -> None:
        self.save_dir = save_dir
        self.path = save_dir / RECORD
        self.files = self._read()

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
                raise ValueError("not this tool's record")
        except (OSError, ValueError, AttributeError) as e:
            raise OutputError(
                f"{self.path}: unreadable record of the files seq2seq_eval wrote here ({e}); remove it "
                "(the files it listed are then kept as the user's) or pick another --save_dir"
            ) from e
        return data["files"]

    def owns(self, path: Path) -> bool:
        """Whether `path` (in this save_dir) is a file the tool wrote and nobody changed since."""
        entry = self.files.get(path.name)
        return path.parent == self.save_dir and entry is not None and _stamp(path) == entry

    def check_writable(self, paths: Iterable[Path], roles: dict[Path, str] | None = None) -> None:
        """Refuse, before any work, to write over a file of the user's."""
        for path in paths:
            if path.is_symlink() or (path.exists() and not self.owns(path)):
                what = f" ({roles[path]})" if roles and path in roles else ""
                why = ("is a symbolic link" if path.is_symlink() else
                       "was changed since seq2seq_eval wrote it" if path.name in self.files else
                       "exists and seq2seq_eval did not write it")
                raise OutputError(
                    f"{path}{what}: {why} (see {self.path.name} there); move it away or pick another --save_dir: "
                    "the tool writes over only its own earlier outputs"
                )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Two runs with different --tmp_dir may finish into one --save_dir at the same time: the
        # read-modify-write of the record is serialized by an flock on the folder itself, which
        # leaves no lock file behind.
        fd = os.open(self.save_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def update(self, written: Iterable[Path] = (), removed: Iterable[Path] = ()) -> None:
        """Record `written` (as they are now) and forget `removed`."""
        with self._locked():
            self.files = self._read()
            for path in removed:
                self.files.pop(path.name, None)
            for path in written:
                stamp = _stamp(path)
                if stamp is not None:
                    self.files[path.name] = stamp
            if self.files:
                write_atomic(self.path, dumps({"format": FORMAT, "files": dict(sorted(self.files.items()))}))
            else:
                self.path.unlink(missing_ok=True)
