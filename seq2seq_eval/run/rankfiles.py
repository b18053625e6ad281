"""Rank files: each rank's records as an Arrow file plus a small stats file written last.

{tmp_dir}/rank_<k>_output.arrow holds rank k's records, one Arrow record batch per few thousand
rows, renamed into place when done; {tmp_dir}/rank_<k>_output.json, written atomically after it,
tells rank 0 that rank k is done. Rank 0 polls for them (wait_for_rank_files) and merges by id.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..atomic import dumps, resumable_write_error, write_atomic, write_error
from ..errors import RunStateError, SyncTimeoutError
from ..mapped import read_mapped


def rank_file(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"rank_{rank}_output.json"


RANK_SCHEMA = pa.schema([
    ("position", pa.int64()),  # the example's place in the data, checked against its id by rank 0
    ("id", pa.string()),  # the example id as JSON text
    ("pred", pa.list_(pa.string())),  # candidates, best first
    ("scores", pa.list_(pa.float64())),  # beam scores of the candidates, when returned
    ("n_tokens", pa.int64()),
    ("metric_stats", pa.string()),  # JSON: {metric: statistics}, when scoring
    ("sentence_scores", pa.string()),  # JSON: {key: score}, when scoring
    # The example's bytes in each per-example output file, serialized by this rank (outputs.write.output_lines)
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
        """`lines`: the records' serialized output lines by column (outputs.write.output_lines); a
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
            raise resumable_write_error(self._partial, e) from e

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
            raise write_error(self.path, e) from e
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
        cache and are mapped again if read again). Every page a process reads through the map, and
        the dozens of KB the kernel maps around it (fault-around), stay counted in its resident
        memory until it lets go: a million pseudolabels' rank files, gigabytes, would otherwise
        end up counted in rank 0's, once its tail had read them."""
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
        mapping, table = read_mapped(table_path)
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
    abort: Callable[[], None] | None = None,
) -> list[Path]:
    """Poll until every rank's file exists or `timeout_s` passes.

    Rank files are renamed into place complete, so existence means readable. We sleep between
    polls rather than spin: a 0.1 s poll costs well under 1% of a core and adds at most 0.1 s to
    the tail; a collective barrier would instead hang on a dead rank. `abort`, called at each
    poll, may raise to end the wait early.
    """
    deadline = time.monotonic() + timeout_s
    paths = [rank_file(tmp_dir, r) for r in range(world_size)]
    while True:
        missing = [r for r, p in enumerate(paths) if not p.exists()]
        if not missing:
            return paths
        if abort is not None:
            abort()  # raises when a missing rank has said it failed (evaluate(): run.agree)
        if time.monotonic() >= deadline:
            detail = describe_missing(missing) if describe_missing else ""
            raise SyncTimeoutError(
                f"waited {timeout_s:g} s (--sync_timeout) for rank files; missing from rank(s) "
                f"{', '.join(map(str, missing))}{detail}"
            )
        time.sleep(poll_s)
