"""Examples in a memory-mapped Arrow file, written once per run and read by position.

A million examples as Python objects cost every rank gigabytes; as one Arrow file in the temp
dir they cost the page cache once per node, and each rank reads only the rows a batch needs.
Rank 0 writes the file from the input (any format) in fixed-size record batches; every rank then
maps it. Columns:

    id      the example id as JSON text ("17" for a line number, "\\"abc\\"" for a string id), so
            that int and str ids survive unchanged
    source  the source text
    target  list of reference texts (one or more), null when the input has none

The fingerprint is a sha256 over the Arrow buffers as they are written: the same examples give
the same digest whatever file format they came from, and it costs one pass over bytes already in
memory, not a JSON dump per example.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .examples import BLOCK_ROWS, Block, Example, ExampleId, blocks_of, target_of

ROWS_PER_BATCH = BLOCK_ROWS
"""Rows per Arrow record batch: the blocks inputs are read in; fixed, because the fingerprint
hashes batch buffers."""

SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("target", pa.list_(pa.string()))])


def _record_batch(block: Block) -> pa.RecordBatch:
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
    return pa.record_batch([ids, pa.array(block.sources, pa.string()), targets], schema=SCHEMA)


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


def write_blocks(path: Path, blocks: Iterable[Block]) -> tuple[int, str]:
    """Write `blocks` (any iterable, consumed once; every block but the last of ROWS_PER_BATCH
    examples, as the fingerprint hashes batch buffers) to `path` atomically; returns the number
    of rows and the fingerprint. Memory stays at one block whatever the input size."""
    h = hashlib.sha256()
    n = 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
            short = False
            for block in blocks:
                if short or len(block) > ROWS_PER_BATCH:
                    raise ValueError(f"blocks must hold {ROWS_PER_BATCH} examples, all but the last")
                short = len(block) < ROWS_PER_BATCH
                batch = _record_batch(block)
                _hash_batch(h, batch)
                writer.write_batch(batch)
                n += len(block)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return n, h.hexdigest()


class ExampleStore:
    """Read access by position to a store file; nothing is loaded until asked for."""

    def __init__(self, path: Path, origin: str, n_obs: int | None = None) -> None:
        self.path = path
        self.origin = origin  # where the examples came from, for messages
        # A memory map: the OS pages rows in as batches read them, and ranks on one node share them.
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        self._table = table.slice(0, n_obs) if n_obs is not None else table

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def has_targets(self) -> bool:
        return self._table.column("target").null_count < len(self)

    @property
    def id_column(self) -> Any:
        """The ids as JSON text (an Arrow column), for vectorized checks."""
        return self._table.column("id")

    @property
    def reference_counts(self) -> tuple[int, int]:
        """The fewest and the most references any example has (0, 0 without targets)."""
        import pyarrow.compute as pc

        counts = pc.fill_null(pc.list_value_length(self._table.column("target")), 0)
        low, high = pc.min(counts).as_py(), pc.max(counts).as_py()
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
        return [Example(i, s, target_of(t)) for i, s, t in
                zip(ids, part.column("source").to_pylist(), part.column("target").to_pylist())]

    def _take(self, column: str, positions: Sequence[int]) -> list[Any]:
        return self._table.column(column).take(pa.array(positions, pa.int64())).to_pylist()

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
            yield self._table.column("source").slice(lo, min(rows, end - lo)).to_pylist()
