"""Examples in a memory-mapped Arrow file, written once per run and read by position.

A million examples as Python objects cost every rank gigabytes; as one Arrow file in the temp
dir they cost the page cache once per node, and each rank reads only the rows a batch needs.
Rank 0 writes the file from the input (any format) in fixed-size record batches; every rank then
maps it. Columns:

    id      the example id as JSON text ("17" for a line number, "\\"abc\\"" for a string id), so
            that int and str ids survive unchanged
    source  the source text
    target  list of reference texts (one or more), null when the input has none
    fields  only when a decoder-only model's prompt template names other columns: those columns
            of the example as a JSON object (text)

The fingerprint is a sha256 over the Arrow buffers as they are written: the same examples give
the same digest whatever file format they came from, and it costs one pass over bytes already in
memory, not a JSON dump per example.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..mapped import read_mapped
from .examples import BLOCK_ROWS, Block, Example, ExampleId, blocks_of, target_of

ROWS_PER_BATCH = BLOCK_ROWS
"""Rows per Arrow record batch: the blocks inputs are read in; fixed, because the fingerprint
hashes batch buffers."""

SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("target", pa.list_(pa.string()))])
FIELDS_SCHEMA = SCHEMA.append(pa.field("fields", pa.string()))


def _record_batch(block: Block, with_fields: bool = False) -> pa.RecordBatch:
    n = len(block)
    if isinstance(block.ids, range):
        ids = pa.array(map(str, block.ids), pa.string(), size=n)
    else:
        ids = pa.array([str(i) if type(i) is int else json.dumps(i, ensure_ascii=False) for i in block.ids], pa.string())
    if block.reference_sets is not None:
        # Every example has one reference per set: a list array straight from the texts, the
        # same buffers as converting a Python list per example, without building those lists.
        sets = block.reference_sets
        texts = sets[0] if len(sets) == 1 else [t for row in zip(*sets) for t in row]
        offsets = pa.array(np.arange(0, n * len(sets) + 1, len(sets), dtype=np.int32))
        targets = pa.ListArray.from_arrays(offsets, pa.array(texts, pa.string()))
    else:
        targets = pa.array(block.targets if block.targets is not None else [None] * n, pa.list_(pa.string()))
    columns = [ids, pa.array(block.sources, pa.string()), targets]
    if not with_fields:
        return pa.record_batch(columns, schema=SCHEMA)
    fields = block.fields if block.fields is not None else [{}] * n
    columns.append(pa.array([json.dumps(f, ensure_ascii=False, sort_keys=True) for f in fields], pa.string()))
    return pa.record_batch(columns, schema=FIELDS_SCHEMA)


def _hash_batch(h: Any, batch: pa.RecordBatch) -> None:
    for column in batch.columns:
        for array in (column, *([column.values] if isinstance(column, pa.ListArray) else [])):
            for buf in array.buffers():
                if buf is not None:
                    h.update(memoryview(buf))


def fingerprint(examples: Iterable[Example]) -> str:
    """The digest `write_store` records for the same examples, computed in memory."""
    h = hashlib.sha256()
    for block in blocks_of(examples, ROWS_PER_BATCH):
        _hash_batch(h, _record_batch(block))
    return h.hexdigest()


def write_store(path: Path, examples: Iterable[Example]) -> tuple[int, str]:
    """write_blocks for examples one by one (tests, benchmarks)."""
    return write_blocks(path, blocks_of(examples, ROWS_PER_BATCH))


def write_blocks(path: Path, blocks: Iterable[Block], with_fields: bool = False) -> tuple[int, str]:
    """Write `blocks` (any iterable, consumed once; every block but the last of ROWS_PER_BATCH
    examples, as the fingerprint hashes batch buffers) to `path` atomically; returns the number
    of rows and the fingerprint. Memory stays at one block whatever the input size. `with_fields`:
    the store has the fields column (a run whose prompt template names other columns)."""
    h = hashlib.sha256()
    n = 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, \
                pa.ipc.new_file(sink, FIELDS_SCHEMA if with_fields else SCHEMA) as writer:
            short = False
            for block in blocks:
                if short or len(block) > ROWS_PER_BATCH:
                    raise ValueError(f"blocks must hold {ROWS_PER_BATCH} examples, all but the last")
                short = len(block) < ROWS_PER_BATCH
                batch = _record_batch(block, with_fields)
                _hash_batch(h, batch)
                writer.write_batch(batch)
                n += len(block)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return n, h.hexdigest()


class ExampleStore:
    """Read access by position to a store file; nothing is loaded until asked for.

    Rows are taken record batch by record batch: Arrow's take on a chunked column concatenates
    the whole column first (a million sources copied for each batch of 64), and every page read
    is let go of once copied (madvise), so a rank's resident memory does not grow to the file's
    size as tokenizing and generation walk through it (the pages stay in the page cache)."""

    def __init__(self, path: Path, origin: str, n_obs: int | None = None) -> None:
        self.path = path
        self.origin = origin  # where the examples came from, for messages
        # A memory map: the OS pages rows in as batches read them, and ranks on one node share them.
        self._map, table = read_mapped(path)
        self._table = table.slice(0, n_obs) if n_obs is not None else table
        self._base = pa.py_buffer(self._map).address if self._map is not None else 0
        lengths = [len(c) for c in self._table.column("id").chunks]
        self._bounds = np.cumsum([0, *lengths], dtype=np.int64)

    def __len__(self) -> int:
        return self._table.num_rows

    def release(self, arrays: Iterable[Any]) -> None:
        """Let go of this process's mapping of the pages behind `arrays` (parts of the file)."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        spans = [(buf.address, buf.address + buf.size) for array in arrays for column in _flat(array)
                 for buf in column.buffers() if buf is not None and buf.size]
        if not spans:
            return
        lo = (min(a for a, _ in spans) - self._base) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = max(b for _, b in spans) - self._base
        if 0 <= lo < hi <= len(self._map):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def _chunked_take(self, column: str, positions: Sequence[int]) -> pa.Array:
        pos = np.asarray(positions, np.int64)
        if len(pos) == 0:
            return pa.array([], self._table.column(column).type)
        chunks = self._table.column(column).chunks
        which = np.searchsorted(self._bounds, pos, side="right") - 1
        by_chunk = np.argsort(which, kind="stable")
        grouped = which[by_chunk]
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        pieces = []
        for a, b in zip(starts.tolist(), np.r_[starts[1:], len(pos)].tolist()):
            k = int(grouped[a])
            pieces.append(chunks[k].take(pa.array(pos[by_chunk[a:b]] - self._bounds[k])))
            self.release([chunks[k]])
        gathered = pa.concat_arrays(pieces)
        inverse = np.empty_like(by_chunk)
        inverse[by_chunk] = np.arange(len(pos))
        return gathered.take(pa.array(inverse))

    @property
    def has_targets(self) -> bool:
        return self._table.column("target").null_count < len(self)

    @property
    def id_column(self) -> Any:
        """The ids as JSON text (an Arrow column), for vectorized checks."""
        return self._table.column("id")

    def id_range(self, start: int, n: int) -> pa.Array:
        """The ids of examples start..start+n-1 as one Arrow array (JSON text), copied out of the map."""
        part = self._table.column("id").slice(start, n)
        array = part.combine_chunks() if part.num_chunks != 1 else pa.concat_arrays([part.chunk(0)])
        self.release(part.chunks)
        return array

    @property
    def reference_counts(self) -> tuple[int, int]:
        """The fewest and the most references any example has (0, 0 without targets)."""
        import pyarrow.compute as pc

        low = high = None
        for chunk in self._table.column("target").chunks:
            counts = pc.fill_null(pc.list_value_length(chunk), 0)
            lo, hi = pc.min(counts).as_py(), pc.max(counts).as_py()
            if lo is not None:
                low = lo if low is None else min(low, lo)
                high = hi if high is None else max(high, hi)
            self.release([chunk])
        return (low or 0, high or 0)

    @property
    def max_references(self) -> int:
        return max(1, self.reference_counts[1])

    @property
    def sacrebleu_num_refs(self) -> int:
        """What sacrebleu's signature reports: the reference count, or -1 when it varies."""
        low, high = self.reference_counts
        return high if low == high else -1

    def slice(self, start: int, n: int) -> list[Example]:
        """Examples start..start+n-1, in data order."""
        part = self._table.slice(start, n)
        ids = [json.loads(i) for i in part.column("id").to_pylist()]
        examples = [Example(i, s, target_of(t)) for i, s, t in
                    zip(ids, part.column("source").to_pylist(), part.column("target").to_pylist())]
        self.release(c for name in ("id", "source", "target") for c in part.column(name).chunks)
        return examples

    def _take(self, column: str, positions: Sequence[int]) -> list[Any]:
        return self._chunked_take(column, positions).to_pylist()

    def ids(self, positions: Sequence[int]) -> list[ExampleId]:
        return [json.loads(i) for i in self._take("id", positions)]

    def sources(self, positions: Sequence[int]) -> list[str]:
        return self._take("source", positions)

    def targets(self, positions: Sequence[int]) -> list[str | tuple[str, ...] | None]:
        return [target_of(t) for t in self._take("target", positions)]

    def examples(self, positions: Sequence[int]) -> list[Example]:
        return [Example(i, s, t) for i, s, t in zip(self.ids(positions), self.sources(positions),
                                                   self.targets(positions))]

    def iter_sources(self, start: int, end: int, rows: int) -> Iterator[list[str]]:
        for lo in range(start, end, rows):
            part = self._table.column("source").slice(lo, min(rows, end - lo))
            yield part.to_pylist()
            self.release(part.chunks)

    def chunks(self, *columns: str) -> Iterator[tuple[pa.Array, ...]]:
        """The named columns' arrays, record batch by record batch, each let go of once read."""
        for arrays in zip(*(self._table.column(c).chunks for c in columns)):
            yield arrays
            self.release(arrays)

    def iter_fields(self, start: int, end: int, rows: int) -> Iterator[list[dict[str, str]]] | None:
        """The columns a prompt template names, as iter_sources gives the sources; None when the
        store has none."""
        if "fields" not in self._table.column_names:
            return None

        def chunks() -> Iterator[list[dict[str, str]]]:
            for lo in range(start, end, rows):
                part = self._table.column("fields").slice(lo, min(rows, end - lo))
                yield [json.loads(f) for f in part.to_pylist()]
                self.release(part.chunks)

        return chunks()


def _flat(array: Any) -> list[Any]:
    """An array and, for a list array, its values: the arrays whose buffers hold its bytes."""
    if isinstance(array, pa.ChunkedArray):
        return [a for chunk in array.chunks for a in _flat(chunk)]
    if isinstance(array, pa.ListArray):
        return [array, *_flat(array.values)]
    return [array]
