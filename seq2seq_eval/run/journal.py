"""Per-rank batch journals: one fsynced line per finished batch, read back by a resumed run.

{tmp_dir}/journal_rank_<k>.jsonl holds the batches rank k finished, whichever rank's share they
were planned in (a batch taken from another share says whose: "from_rank"). A crash loses at most
the batch in flight; a resumed run under any world size reuses every journaled batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import resumable_write_error
from .tmpmarker import folder_token

logger = logging.getLogger("seq2seq_eval")


def journal_file(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"journal_rank_{rank}.jsonl"


def journal_files(tmp_dir: Path) -> list[Path]:
    """Every rank's journal, whichever world size wrote it."""
    return sorted(tmp_dir.glob("journal_rank_*.jsonl"))


class Journal:
    """Append-only record of finished batches, one JSON line each, fsynced per batch, so a
    crash loses at most the batch in flight."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Unbuffered: after a failed write nothing of the line may stay in a buffer, where a later
        # flush (at close, once the truncation below has freed some space) would append its tail.
        # O_NOFOLLOW: a link in the journal's place is refused (ELOOP), never read, cut or
        # appended through.
        self._f = open(path, "ab", buffering=0, opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW, 0o666))
        # Every line carries the temp dir's token (its marker's): a line of another folder's
        # (a journal copied in) is never read as this one's (JournalIndex).
        self._token = folder_token(path.parent)
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        # A crash mid-write leaves a last line without its newline; appending after it would
        # glue the next record onto garbage.
        if not os.fstat(self._f.fileno()).st_size:
            return
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            os.ftruncate(self._f.fileno(), keep)

    def append(self, entry: Mapping[str, Any]) -> None:
        if self._token is not None:
            entry = {**entry, "tmp": self._token}
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        start = self._f.tell()
        try:
            view = memoryview(line)
            while view:
                view = view[self._f.write(view):]
            os.fsync(self._f.fileno())
        except OSError as e:
            # Cut a partly written line off, so the journal ends on a whole batch for --resume
            # (a reader would skip a torn line anyway; this keeps the file clean).
            with contextlib.suppress(OSError):
                os.ftruncate(self._f.fileno(), start)
            raise resumable_write_error(self.path, e) from e

    def close(self) -> None:
        # Nothing is buffered to flush, but close(2) itself may report a deferred write error (NFS).
        with contextlib.suppress(OSError):
            self._f.close()


Range = tuple[int, int]  # [start, stop) into a planned batch's members


@dataclass
class JournaledBatch:
    """What the journals hold for one planned batch.

    Three kinds of line carry a batch index (older journals have only the first):

    - a finished batch: ``{"batch": i, "records": [...], "seconds": s}``, records in member order;
    - a split: ``{"batch": i, "split": [a, b], "of": n, "into": [[a, m], [m, b]], "ids": [...]}``,
      written when members a..b-1 of the n ran out of memory together, before the halves run;
    - a finished sub-batch: ``{"batch": i, "part": [a, b], "of": n, "records": [...], "seconds": s}``.

    A resumed run reuses finished sub-batches and goes straight to the halves of a range that
    split, instead of running out of memory on it again.
    """

    whole: dict[str, Any] | None = None
    parts: dict[Range, dict[str, Any]] = field(default_factory=dict)
    splits: dict[Range, dict[str, Any]] = field(default_factory=dict)

    def add(self, entry: dict[str, Any]) -> bool:
        """Files one journal line; False for a line of none of the three kinds. The first line
        for a batch, range or split wins, as for whole batches before splits existed."""
        if "split" in entry:
            span, size = _range(entry.get("split")), entry.get("of")
            into = entry.get("into")
            if span is None or not isinstance(size, int) or span[1] > size or not isinstance(into, list):
                return False
            ranges = [_range(r) for r in into]
            # The halves must tile the range exactly and each be smaller, so following splits
            # always ends.
            if (len(ranges) < 2 or None in ranges or ranges[0][0] != span[0] or ranges[-1][1] != span[1]  # type: ignore[index]
                    or any(a[1] != b[0] for a, b in zip(ranges, ranges[1:]))):  # type: ignore[index]
                return False
            self.splits.setdefault(span, {**entry, "into": ranges})
            return True
        if not isinstance(entry.get("records"), list):
            return False
        if "part" in entry:
            span, size = _range(entry.get("part")), entry.get("of")
            if span is None or not isinstance(size, int) or span[1] > size or len(entry["records"]) != span[1] - span[0]:
                return False
            self.parts.setdefault(span, entry)
            return True
        if self.whole is None:
            self.whole = entry
        return True

    def size(self) -> int | None:
        """The batch's size as its split or sub-batch lines recorded it."""
        for entry in (*self.splits.values(), *self.parts.values()):
            return int(entry["of"])
        return None

    def finished(self) -> dict[str, Any] | None:
        """The batch as one finished entry: the whole-batch line, or its sub-batches put back
        together along the recorded splits when they cover every member; else None."""
        if self.whole is not None:
            return self.whole
        size = self.size()
        pieces = self.cover((0, size)) if size else None
        if pieces is None:
            return None
        first = next(iter(self.splits.values()), None) or next(iter(self.parts.values()))
        return {
            "batch": first["batch"],
            "records": [r for p in pieces for r in p["records"]],
            "seconds": sum(float(p.get("seconds") or 0.0) for p in pieces),
            "parts": [list(_range(p["part"]) or ()) for p in pieces],
        }

    def cover(self, span: Range) -> list[dict[str, Any]] | None:
        """Finished sub-batches that make up `span`, in member order, following the splits."""
        if span in self.parts:
            return [self.parts[span]]
        split = self.splits.get(span)
        if split is None:
            return None
        pieces: list[dict[str, Any]] = []
        for sub in split["into"]:
            got = self.cover(sub)
            if got is None:
                return None
            pieces.extend(got)
        return pieces


def _range(value: Any) -> Range | None:
    if (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] < value[1]):
        return value[0], value[1]
    return None


class JournalIndex:
    """Where each batch's journal lines are (file and byte offset), whichever world size wrote
    them. Only the index is held; a batch's lines are read when the batch comes up, so resuming
    a run of a million examples does not load every prediction on every rank."""

    def __init__(self, tmp_dir: Path) -> None:
        self._where: dict[int, list[tuple[Path, int]]] = {}
        self._token = folder_token(tmp_dir) if tmp_dir.is_dir() else None
        for path in journal_files(tmp_dir) if tmp_dir.is_dir() else []:
            offset = 0
            with open(path, "rb") as f:
                for line in f:
                    start, offset = offset, offset + len(line)
                    if not line.endswith(b"\n"):
                        continue  # a torn last line from a crash while it was written: that batch runs again
                    try:
                        # Every line starts with {"batch":N,...}: the index needs no full parse.
                        index = int(line[:64].split(b":", 1)[1].split(b",", 1)[0])
                    except (IndexError, ValueError):
                        logger.debug("%s: skipping an unreadable journal line", path)
                        continue
                    self._where.setdefault(index, []).append((path, start))

    def batch(self, index: int) -> JournaledBatch | None:
        """Everything journaled for batch `index`, or None."""
        if index not in self._where:
            return None
        found = JournaledBatch()
        for path, offset in self._where[index]:
            with open(path, "rb") as f:
                f.seek(offset)
                try:
                    entry = json.loads(f.readline())
                except ValueError:
                    continue
            if not isinstance(entry, dict) or self._token is not None and entry.get("tmp") != self._token:
                logger.debug("%s: skipping a journal line without this temp dir's token", path)
                continue
            if entry.get("batch") == index and not found.add(entry):
                logger.debug("%s: skipping a journal line of no known kind for batch %d", path, index)
        return found

    def finished(self) -> set[int]:
        """The batches whose journal lines make them complete (each read and let go: a million
        examples' predictions are not held here)."""
        return {i for i in self._where if (b := self.batch(i)) is not None and b.finished() is not None}

    def finished_entries(self) -> dict[int, dict[str, Any]]:
        """Each complete batch as one finished entry (JournaledBatch.finished), by batch index."""
        done = {}
        for index in sorted(self._where):
            batch = self.batch(index)
            entry = batch.finished() if batch is not None else None
            if entry is not None:
                done[index] = entry
        return done


def read_journals(tmp_dir: Path) -> dict[int, dict[str, Any]]:
    """Finished batches from every journal in the temp dir, whichever world size wrote them, read
    the way a resumed run reads them; a batch that was split is finished when its sub-batches
    cover all its members (see JournaledBatch.finished)."""
    return JournalIndex(tmp_dir).finished_entries()
