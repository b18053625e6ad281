"""The temp dir: manifest, run lock, per-rank batch journals, and the final rank files.

Layout of {tmp_dir}:
    manifest.json           what run these files belong to (model, data, settings, batch plan)
    run.lock                flock'ed by rank 0 while a run is live
    journal_rank_<k>.jsonl  one line per batch rank k finished, appended and fsynced as it finishes
                            (and, for a batch split after running out of memory, one line per
                            split and per finished sub-batch: see JournaledBatch); a batch taken
                            from another rank's share says whose ("from_rank")
    claims/<batch>          which rank runs which batch in this attempt (steal.py)
    rank_<k>_output.arrow   rank k's records, one Arrow record batch per planned batch, renamed into place when done
    rank_<k>_output.json    rank k's stats, written atomically last: its presence means rank k is done
    cache/                  the examples as Arrow and the tokenized sources (see store.py, tokens.py)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import EvalError, RunFailed, RunStateError, SyncTimeoutError
from .steal import CLAIMS, claims_dir

logger = logging.getLogger("seq2seq_eval")

MANIFEST = "manifest.json"
LOCK = "run.lock"
STOPPED = "rank0.stopped"  # rank 0 was interrupted and reports for itself (see runner)


def rank_file(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"rank_{rank}_output.json"


def journal_file(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"journal_rank_{rank}.jsonl"


def journal_files(tmp_dir: Path) -> list[Path]:
    """Every rank's journal, whichever world size wrote it."""
    return sorted(tmp_dir.glob("journal_rank_*.jsonl"))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(path: Path, e: OSError) -> EvalError:
    reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return EvalError(f"{path}: cannot write ({reason}); the previous version, if any, is unchanged")


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, then rename over `path`.

    A reader sees the old file or the new one, never half of one; if the disk fills up the
    temporary file is removed and the old file stays as it was. The rename is atomic only within
    one filesystem, hence the temporary file beside the target rather than in /tmp.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The rename itself is durable only once the directory entry is flushed.
        _fsync_dir(path.parent)
    except OSError as e:
        # Cleaning up must not replace the real reason (a save_dir that is a file makes the
        # unlink fail too).
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _write_error(path, e) from e


class AtomicFile:
    """A file written in pieces that appears complete or not at all: the pieces go to a
    temporary name beside it, which `commit` fsyncs and renames over the target (as
    write_atomic does in one piece). Used for outputs too large to build in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self._f = open(self._tmp, "wb")
        except OSError as e:
            raise _write_error(path, e) from e

    def write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            self.discard()
            raise _write_error(self.path, e) from e

    def commit(self) -> None:
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            self.discard()
            raise _write_error(self.path, e) from e

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()


def dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8")


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, dumps(obj))


# ---------------------------------------------------------------- manifest and lock


def compare_manifests(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [k for k in keys if old.get(k) != new.get(k)]


class RunLock:
    """An exclusive flock on {tmp_dir}/run.lock, held by rank 0 for the whole run.

    flock rather than a pid file: the kernel drops it when the holder dies, however it dies
    (SIGKILL, OOM, node reboot), so a crashed run never blocks the next one.
    """

    def __init__(self, tmp_dir: Path) -> None:
        self.path = tmp_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunStateError(f"{self.path}: cannot create the run lock ({e.strerror}); is --tmp_dir writable?") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            holder = ""
            try:
                holder = f" (held by {self.path.read_text().strip()})"
            except OSError:
                pass
            raise RunStateError(
                f"{self.path.parent}: another run is using this temp dir{holder}; wait for it to finish, "
                "or give this run another --save_dir/--tmp_dir"
            ) from e
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def refuse_earlier_run(tmp_dir: Path, resume: bool) -> None:
    """Before anything is written into the temp dir: without --resume, an earlier run's files
    are an error (check_tmp_dir compares the manifests once this run's is known)."""
    journals = journal_files(tmp_dir)
    if not (tmp_dir / MANIFEST).exists():
        if journals:
            raise RunStateError(f"{tmp_dir} holds journals but no manifest; remove {tmp_dir} to start over")
        return
    if not resume:
        raise RunStateError(
            f"{tmp_dir} holds an earlier run's files ({len(journals)} journal(s)); "
            f"pass --resume to continue it, or remove {tmp_dir} to start over"
        )


def check_tmp_dir(tmp_dir: Path, manifest: Mapping[str, Any], resume: bool) -> bool:
    """Whether the temp dir already belongs to this run (read-only; raises if it may not be used).

    Without --resume a temp dir holding an earlier run's files is an error, so two unrelated runs
    can never be merged; with --resume its manifest must match this run's exactly.
    """
    path = tmp_dir / MANIFEST
    refuse_earlier_run(tmp_dir, resume)
    if not path.exists():
        return False
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunStateError(f"{path}: unreadable manifest ({e}); remove {tmp_dir} to start over") from e
    differ = compare_manifests(old, manifest)
    if differ:
        raise RunStateError(
            f"--resume: {tmp_dir} belongs to a run with different {', '.join(differ)}; "
            f"rerun with the same settings, or remove {tmp_dir} to start over"
        )
    return True


def prepare_tmp_dir(tmp_dir: Path, manifest: Mapping[str, Any], resume: bool) -> int:
    """Rank 0, holding the lock: make the temp dir ready for this run. Returns how many journal
    files a resumed run found."""
    path = tmp_dir / MANIFEST
    if not check_tmp_dir(tmp_dir, manifest, resume):
        write_json_atomic(path, dict(manifest))
    journals = journal_files(tmp_dir)
    # Rank files are re-derived from the journals at the end of every run; an old one left by a
    # run with another world size must never be merged into this one.
    for stale in [*tmp_dir.glob("rank_*_output.*"), tmp_dir / STOPPED]:
        stale.unlink(missing_ok=True)
    # Claims belong to one attempt: a batch claimed by a rank that died before journaling it
    # must be free to run again; a journaled one is reused by whoever claims it.
    claims = claims_dir(tmp_dir)
    if claims.is_dir():
        for stale in claims.iterdir():
            stale.unlink(missing_ok=True)
    claims.mkdir(exist_ok=True)
    return len(journals)


def cleanup_tmp_dir(tmp_dir: Path) -> None:
    """Remove the files a run made in its temp dir, then the folder if nothing else is left.
    Never rmtree: --tmp_dir may name a folder that holds the user's own files."""
    for pattern in (MANIFEST, LOCK, STOPPED, "journal_rank_*.jsonl", "rank_*_output.*", ".*.tmp", "cache/*", "cache/.*",
                    f"{CLAIMS}/*"):
        for path in tmp_dir.glob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()
    for folder in (tmp_dir / "cache", claims_dir(tmp_dir), tmp_dir):
        with contextlib.suppress(OSError):
            folder.rmdir()


# ---------------------------------------------------------------- journals


class Journal:
    """Append-only record of finished batches, one JSON line each, fsynced per batch, so a
    crash loses at most the batch in flight."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._drop_torn_tail()
        self._f = open(path, "ab")

    def _drop_torn_tail(self) -> None:
        # A crash mid-write leaves a last line without its newline; appending after it would
        # glue the next record onto garbage.
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(keep)

    def append(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        start = self._f.tell()
        try:
            self._f.write(line)
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            # Cut a partly written line off, so the journal ends on a whole batch for --resume
            # (a reader would skip a torn line anyway; this keeps the file clean).
            with contextlib.suppress(OSError):
                os.ftruncate(self._f.fileno(), start)
            reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            raise RunFailed(
                f"{self.path}: cannot write ({reason}); the batches journaled before this one are kept: "
                "make room, then rerun the same command with --resume"
            ) from e

    def close(self) -> None:
        # A full disk can also fail the final flush of an already failed journal.
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
            if isinstance(entry, dict) and entry.get("batch") == index and not found.add(entry):
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


# ---------------------------------------------------------------- rank files


RANK_SCHEMA = pa.schema([
    ("position", pa.int64()),  # the example's place in the data, checked against its id by rank 0
    ("id", pa.string()),  # the example id as JSON text
    ("pred", pa.list_(pa.string())),  # candidates, best first
    ("scores", pa.list_(pa.float64())),  # beam scores of the candidates, when returned
    ("n_tokens", pa.int64()),
    ("metric_stats", pa.string()),  # JSON: {metric: statistics}, when scoring
    ("sentence_scores", pa.string()),  # JSON: {key: score}, when scoring
    # The example's bytes in each per-example output file, serialized by this rank (report.output_lines)
    ("out_gen", pa.binary()),
    ("out_legacy", pa.binary()),
    ("out_jsonl", pa.binary()),
    ("out_example", pa.binary()),
])
LINE_COLUMNS = ("out_gen", "out_legacy", "out_jsonl", "out_example")


def rank_table_file(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"rank_{rank}_output.arrow"


class RankWriter:
    """A rank's records as an Arrow file that grows as batches finish, so the rank never holds
    its whole share. Rows go out in record batches of at least ROWS_PER_WRITE: rank 0 takes rows
    from all rank files in data order, and Arrow's take costs grow with the number of record
    batches (one per planned batch made rank 0's tail quadratic). Rows not yet written are safe
    in the journal. Written under a temporary name; `close` renames it into place and then writes
    the small stats file that tells rank 0 the rank is done."""

    ROWS_PER_WRITE = 4096

    def __init__(self, tmp_dir: Path, rank: int) -> None:
        self.tmp_dir, self.rank = tmp_dir, rank
        self.path = rank_table_file(tmp_dir, rank)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._sink = pa.OSFile(str(self._partial), "wb")
        self._writer = pa.ipc.new_file(self._sink, RANK_SCHEMA)
        self._positions: list[int] = []
        self._records: list[Mapping[str, Any]] = []
        self._lines: dict[str, list[bytes | None]] = {name: [] for name in LINE_COLUMNS}

    def add(self, positions: Sequence[int], records: Sequence[Mapping[str, Any]],
            lines: Mapping[str, Sequence[bytes]] | None = None) -> None:
        """`lines`: the records' serialized output lines by column (report.output_lines); a
        column left out is null."""
        self._positions.extend(positions)
        self._records.extend(records)
        for name, values in self._lines.items():
            given = (lines or {}).get(name)
            values.extend(given if given is not None else [None] * len(records))
        if len(self._positions) >= self.ROWS_PER_WRITE:
            self._flush()

    def _flush(self) -> None:
        positions, records, lines = self._positions, self._records, self._lines
        self._positions, self._records = [], []
        self._lines = {name: [] for name in LINE_COLUMNS}

        def js(key: str) -> list[str | None]:
            return [json.dumps(r[key], ensure_ascii=False, separators=(",", ":")) if key in r else None for r in records]

        columns = [
            pa.array(positions, pa.int64()),
            pa.array([json.dumps(r["id"], ensure_ascii=False) for r in records], pa.string()),
            pa.array([r["pred"] if isinstance(r["pred"], list) else [r["pred"]] for r in records], pa.list_(pa.string())),
            pa.array([r.get("scores") for r in records], pa.list_(pa.float64())),
            pa.array([r["n_tokens"] for r in records], pa.int64()),
            pa.array(js("metric_stats"), pa.string()),
            pa.array(js("sentence_scores"), pa.string()),
            *(pa.array(lines[name], pa.binary()) for name in LINE_COLUMNS),
        ]
        try:
            self._writer.write_batch(pa.record_batch(columns, schema=RANK_SCHEMA))
        except OSError as e:
            reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            raise RunFailed(
                f"{self._partial}: cannot write ({reason}); the batches journaled before this one are kept: "
                "make room, then rerun the same command with --resume"
            ) from e

    def close(self, stats: Mapping[str, Any]) -> Path:
        if self._positions:
            self._flush()
        try:
            self._writer.close()
            self._sink.flush()
            os.fsync(self._sink.fileno())
            self._sink.close()
            os.replace(self._partial, self.path)
        except OSError as e:
            raise _write_error(self.path, e) from e
        path = rank_file(self.tmp_dir, self.rank)
        write_atomic(path, dumps({"rank": self.rank, "stats": dict(stats)}))
        return path

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(OSError):
            self._sink.close()
            self._partial.unlink()


@dataclass(frozen=True)
class RankOutput:
    rank: int
    table: Any  # pyarrow.Table with RANK_SCHEMA, memory-mapped
    stats: dict[str, Any]
    path: Path
    mapping: Any = None  # the mmap behind `table`

    def releaser(self, batch: pa.RecordBatch) -> Callable[[], None]:
        """A call that drops this process's mapping of `batch`'s pages (they stay in the page
        cache and are mapped again if read again): see merge.RowTaker for why."""
        if self.mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
            return lambda: None
        base = pa.py_buffer(self.mapping).address
        spans = [(buf.address, buf.address + buf.size) for column in batch.columns
                 for buf in column.buffers() if buf is not None and buf.size]
        if not spans:
            return lambda: None
        lo = (min(a for a, _ in spans) - base) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = max(b for _, b in spans) - base
        if lo < 0 or hi > len(self.mapping):
            return lambda: None  # not memory-mapped from this file after all
        mapping = self.mapping
        return lambda: mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def read_rank_output(path: Path, rank: int) -> RankOutput:
    table_path = rank_table_file(path.parent, rank)
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))["stats"]
        with open(table_path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        table = pa.ipc.open_file(pa.py_buffer(mapping)).read_all()
        if not table.schema.equals(RANK_SCHEMA):
            raise ValueError(f"unexpected columns {table.schema.names}")
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        raise RunStateError(f"{table_path}: unreadable rank file ({e})") from e
    return RankOutput(rank, table, stats, table_path, mapping)


def wait_for_rank_files(
    tmp_dir: Path,
    world_size: int,
    timeout_s: float,
    poll_s: float = 0.1,
    describe_missing: Callable[[list[int]], str] | None = None,
) -> list[Path]:
    """Poll until every rank's file exists or `timeout_s` passes.

    Rank files are renamed into place complete, so existence means readable. We sleep between
    polls rather than spin: a 0.1 s poll costs well under 1% of a core and adds at most 0.1 s to
    the tail; a collective barrier would instead hang on a dead rank.
    """
    deadline = time.monotonic() + timeout_s
    paths = [rank_file(tmp_dir, r) for r in range(world_size)]
    while True:
        missing = [r for r, p in enumerate(paths) if not p.exists()]
        if not missing:
            return paths
        if time.monotonic() >= deadline:
            detail = describe_missing(missing) if describe_missing else ""
            raise SyncTimeoutError(
                f"waited {timeout_s:g} s (--sync_timeout) for rank files; missing from rank(s) "
                f"{', '.join(map(str, missing))}{detail}"
            )
        time.sleep(poll_s)

