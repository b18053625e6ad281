"""The rank files' rows in data order: a tail's gather, at random while the rank files fit in the
page cache, by sequential reads once they do not.

The rank files hold their rows in plan order (by length), so data order is a random walk through
them. Gathered row by row, every 4 KB page holding rows of several chunks is read once per chunk,
which is free while the files fit in the page cache and is the whole cost once they do not (10M
pseudolabels with 2 candidates: 27 GB of rank files on a 24 GB machine). Spilled, each rank file
is read once, front to back, a group of record batches at a time; each row is appended to the
spill file of its destination (the range of data places a tail writes), in the bucket of its
place, a range of places whose bytes fit in memory. A destination's buckets are then read back
one at a time, from every spill file that has rows for it, sorted by place and handed on in data
order: one sequential read of the rank files and one write and read of the spill, in place of
reading them at random. Spill files are LZ4-compressed (the rows are JSON text, about 3.3x), so
the spill is a few GB where the rows are tens.

The shared tail spills across ranks (each rank spills its own rank file to every rank's slice,
then reads back its own slice's buckets), the one-rank tail within rank 0 (every rank file to one
destination). Every place of a bucket must be there exactly once: checked as each is read back."""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..atomic import dumps, write_atomic, write_error
from ..errors import RunStateError

ROWS_PER_CHUNK = 20_000
"""Rows taken at a time when gathering at random (in_chunks), and lines where a tail goes through
every example's scores or references (parts.py, write.py): about 50 MB of pseudolabel rows.
Each chunk costs a call per record batch of the rank files (merge.RowTaker)."""

BUCKET_BYTES = 64 << 20
"""Bytes of rows a bucket holds: it is read back whole, then sorted (a copy), so a tail holds about
twice this at once."""

GROUP_BYTES = 32 << 20
"""Bytes of a rank file's rows read at a time while spilling: each group is split by bucket with
one take, so the spill files hold about (rank-file bytes / this) record batches per bucket."""

_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


@dataclass(frozen=True)
class Buckets:
    """A destination's places [lo, hi) cut into `count` buckets of (nearly) equal numbers of places."""

    lo: int
    hi: int
    count: int

    @classmethod
    def sized(cls, lo: int, hi: int, nbytes: int, budget: int | None = None) -> Buckets:
        """As many buckets as it takes for each to hold about `budget` of the range's `nbytes`."""
        budget = BUCKET_BYTES if budget is None else budget
        return cls(lo, hi, max(1, min(hi - lo, -(-nbytes // budget))))

    def of(self, places: np.ndarray) -> np.ndarray:
        return (places - self.lo) * self.count // max(self.hi - self.lo, 1)

    def places(self, b: int) -> tuple[int, int]:
        """Bucket b's places [start, end): those p with of(p) == b."""
        n = max(self.hi - self.lo, 1)
        return self.lo + -(-b * n // self.count), min(self.hi, self.lo + -(-(b + 1) * n // self.count))


def column_bytes(outputs: Sequence[Any], columns: Sequence[str]) -> int:
    """Bytes the rank files hold in these columns (their buffers' sizes: no value is read)."""
    return sum(buf.size for out in outputs for batch in out.table.to_batches() for c in columns
               for buf in batch.column(c).buffers() if buf is not None)


def _index_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.index")


def spill(outputs: Sequence[Any], columns: Sequence[str], destinations: Sequence[tuple[Buckets, Path]]) -> None:
    """One pass over the rank files, front to back: each row whose place falls in a destination's
    range goes, with `columns` and its place, to that destination's spill file (Arrow IPC, one
    record batch per bucket of each group read), and each file's index (the bucket of each of
    its record batches) is written beside it, last."""
    names = ["position", *columns]
    schema = pa.schema([outputs[0].table.schema.field(c) for c in names]) if outputs else None
    writers: list[Any] = []
    sinks: list[Any] = []
    indexes: list[list[int]] = [[] for _ in destinations]
    spans: list[list[tuple[int, int]]] = [[] for _ in destinations]
    path = Path(".")
    try:
        for _, path in destinations:
            sinks.append(pa.OSFile(str(path), "wb"))
            writers.append(pa.ipc.new_file(sinks[-1], schema, options=_OPTIONS))
        for out in outputs:
            group: list[pa.RecordBatch] = []
            releases: list[Any] = []
            held = 0
            batches = out.table.to_batches()
            for i, batch in enumerate(batches):
                group.append(batch.select(names))
                releases.append(out.releaser(batch))
                held += group[-1].nbytes
                if held >= GROUP_BYTES or i == len(batches) - 1:
                    table = pa.Table.from_batches(group, schema=schema).combine_chunks()
                    for release in releases:
                        release()  # copied: the rank file's pages may go (RankOutput.releaser says why)
                    group, releases, held = [], [], 0
                    places = table.column("position").to_numpy()
                    for k, (buckets, path) in enumerate(destinations):
                        mine = np.flatnonzero((places >= buckets.lo) & (places < buckets.hi))
                        if not len(mine):
                            continue
                        which = buckets.of(places[mine])
                        by_bucket = np.argsort(which, kind="stable")
                        rows = table.take(pa.array(mine[by_bucket]))
                        which = which[by_bucket]
                        starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
                        for a, b in zip(starts, np.r_[starts[1:], len(which)]):
                            for piece in rows.slice(int(a), int(b - a)).to_batches():
                                start = sinks[k].tell()
                                writers[k].write_batch(piece)
                                indexes[k].append(int(which[a]))
                                spans[k].append((start, sinks[k].tell()))
        for k, (_, path) in enumerate(destinations):
            writers[k].close()
            write_atomic(_index_path(path), dumps({"buckets": indexes[k], "spans": spans[k]}))
    except OSError as e:
        raise write_error(path, e) from e
    finally:
        for w in writers:
            try:
                w.close()
            except (OSError, pa.ArrowInvalid):
                pass


class _Prefetch:
    """Asks the kernel to read a spill file's record batches before they are read.

    A bucket's batches lie one per group read, scattered through the spill file, tens of KB each.
    Read one by one, each read waits on the disk alone and brings in the kernel's readahead
    window about it (4x a 64 KB read where read_ahead_kb is 8 MB): the 10M one-rank tail read
    32 GB back for a 6.8 GB spill. Asked for at once, the next bucket's batches are read while
    this one is written, many at a time and no more than they are."""

    def __init__(self, path: Path, spans: np.ndarray) -> None:
        self.spans = spans
        self.fd = os.open(path, os.O_RDONLY) if hasattr(os, "posix_fadvise") else None

    def ask(self, batches: np.ndarray) -> None:
        if self.fd is None:
            return
        for start, end in self.spans[batches]:
            os.posix_fadvise(self.fd, int(start), int(end - start), os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def in_data_order(paths: Sequence[Path], buckets: Buckets, remove: bool = True) -> Iterator[pa.Table]:
    """A destination's rows in data order, a bucket at a time, from the spill files written for
    it (by spill), each bucket checked to hold each of its places exactly once. With `remove`, the
    spill files go once read (compressed, they still hold about 30% of the outputs' share)."""
    readers = []
    try:
        for path in paths:
            saved = json.loads(_index_path(path).read_text())
            index = np.asarray(saved["buckets"], np.int64)
            source = pa.OSFile(str(path))
            prefetch = _Prefetch(path, np.asarray(saved["spans"], np.int64).reshape(-1, 2))
            readers.append((pa.ipc.open_file(source), index, source, prefetch))

        def ask(bucket: int) -> None:
            for _, index, _, prefetch in readers:
                prefetch.ask(np.flatnonzero(index == bucket))

        ask(0)
        for b in range(buckets.count):
            pieces = [reader.get_batch(int(i)) for reader, index, _, _ in readers for i in np.flatnonzero(index == b)]
            ask(b + 1)  # read while this bucket is sorted and written
            start, end = buckets.places(b)
            if not pieces:
                if end > start:
                    raise RunStateError(f"the tail's spill files lack data places {start}..{end - 1}; "
                                        "expected every place once (rerun with --resume)")
                continue
            table = pa.Table.from_batches(pieces).combine_chunks()
            places = table.column("position").to_numpy()
            order = np.argsort(places, kind="stable")
            if not np.array_equal(places[order], np.arange(start, end)):
                raise RunStateError(f"the tail's spill files hold data places {start}..{end - 1} other than once "
                                    "each; expected every place once (rerun with --resume)")
            yield table.take(pa.array(order))
    except FileNotFoundError as e:
        raise RunStateError(f"{e.filename}: a spill file of the tail is missing; rerun with --resume") from e
    finally:
        for _, _, source, prefetch in readers:
            source.close()
            prefetch.close()
    if remove:
        for path in paths:
            for p in (path, _index_path(path)):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass


def memory_available() -> int:
    """The memory the kernel says is available for new work (MemAvailable: free memory and the
    page cache it can reclaim), or the memory limit of this process's cgroup where that is less
    (a Slurm job's or a container's: the page cache of the files it reads counts against it), in
    bytes; 0 where the kernel does not say (then a tail spills)."""
    available = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            limit = cgroup_memory_limit(f.read(), Path("/sys/fs/cgroup"))
    except (OSError, ValueError, IndexError):
        return available
    return min(available, limit) if limit is not None else available


def cgroup_memory_limit(membership: str, root: Path) -> int | None:
    """The memory limit of the cgroup named in `membership` (/proc/self/cgroup's text) under `root`:
    cgroup v2's memory.max or v1's memory.limit_in_bytes; None where there is none ("max", or v1's
    near-2^63 for no limit) or it cannot be read."""
    for line in membership.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            where = root / path.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            where = root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        try:
            text = where.read_text().strip()
        except OSError:
            continue
        if text != "max" and int(text) < 1 << 60:
            return int(text)
    return None


def spills(read_bytes: int, available: int) -> bool:
    """Whether a tail gathers its rows by spilling (sequential reads) rather than at random from
    the rank files: once the bytes it reads from them outgrow half the memory available, beside
    the outputs going through the page cache too. While they fit, reading at random costs nothing
    more than reading in order, and the spill's write, compression and read back would be extra
    work; once they do not, reading at random re-reads pages from disk for every chunk (docs/scale.md
    measures both cases)."""
    return read_bytes > available // 2


def in_chunks(outputs: Sequence[Any], order: np.ndarray, columns: Sequence[str]) -> Iterator[pa.Table]:
    """The rows `order` names (merge_by_id's numbering, in data order), with `columns` and their
    place, taken at random from the rank files, ROWS_PER_CHUNK at a time."""
    from .merge import RowTaker

    taker = RowTaker(outputs)
    for start in range(0, len(order), ROWS_PER_CHUNK):
        yield taker.take(order[start : start + ROWS_PER_CHUNK], ["position", *columns])


def prefetched(parts: Iterable[Any]) -> Iterator[Any]:
    """`parts`, each made in a thread while the caller writes the one before: gathering is work for
    the CPU and writing the disk's (a write waits whenever the page cache holds too much not yet
    written, most of the time once the outputs outgrow it), so they overlap. An error making a
    part is raised here, at that part; a caller that stops early stops the thread after the part
    in the making (at most one more is held), waiting for it a few seconds at most: the first
    part of a spilled gather is the whole spill, minutes at 10M, and an interrupted run should not
    wait for it (the thread is a daemon; a run that stops keeps its temp dir for --resume)."""
    handoff: queue.Queue[tuple[BaseException | None, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def give(item: tuple[BaseException | None, Any]) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def make() -> None:
        try:
            for part in parts:
                if not give((None, part)):
                    return
            give((None, end))
        except BaseException as e:  # raised again in the caller's thread
            give((e, None))

    thread = threading.Thread(target=make, name="seq2seq_eval-gather", daemon=True)
    thread.start()
    try:
        while True:
            error, part = handoff.get()
            if error is not None:
                raise error
            if part is end:
                return
            yield part
    finally:
        stop.set()
        thread.join(timeout=5.0)


def gathered(outputs: Sequence[Any], order: np.ndarray, columns: Sequence[str], spill_path: Path,
             available: int | None = None) -> Iterator[pa.Table]:
    """Every row of the rank files in data order (`order`, from merge_by_id), with `columns` and
    their place: the one-rank tail's gather. Spilled to one file beside the rank files and read
    back a bucket at a time once they outgrow the memory (spills), else taken at random."""
    read_bytes = column_bytes(outputs, columns)
    if not spills(read_bytes, memory_available() if available is None else available):
        yield from in_chunks(outputs, order, columns)
        return
    buckets = Buckets.sized(0, len(order), read_bytes)
    spill(outputs, columns, [(buckets, spill_path)])
    yield from in_data_order([spill_path], buckets)
