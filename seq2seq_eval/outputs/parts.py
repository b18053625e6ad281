"""The shared tail: each rank writes one slice of the outputs, rank 0 joins the slices.

Once every rank file is there, rank k takes the examples at places [N*k/W, N*(k+1)/W) from all
rank files (merge_by_id on that range: the same checks), and writes their bytes for each
per-example output file, in data order, into {tmp_dir}/tail_<k>.<column>, and for a scored run
each example's metric statistics and sentence scores (one line each, JSON and JSON separated by a
tab) into tail_<k>.scores; tail_<k>.json, written last, says the slice is complete. Rank 0 then
only joins: it copies the slices' bytes end to end into the output files and adds up the metric
statistics in data order, exactly the bytes and the arithmetic of writing them itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_error
from ..errors import RunStateError

COPY_BYTES = 16 << 20
"""Bytes copied at a time while joining: memory stays at this, whatever the slices' size."""

ROWS_PER_CHUNK = 20_000
"""Examples taken from the rank files at a time while writing, in data order (here and in
write.py). Each chunk costs a call per record batch of the rank files (merge.RowTaker), so the
number of calls grows with (N / chunk) * N; at 5,000 those calls were half of rank 0's tail on a million pseudolabels.
20,000 such rows are about 50 MB."""


@dataclass(frozen=True)
class Parts:
    """The slices of a run's outputs, in data order: each slice's file stem (tail_<k>) and rows."""

    stems: Sequence[Path]
    counts: Sequence[int]

    @property
    def rows(self) -> int:
        return sum(self.counts)


def line_columns(cfg: Any) -> list[str]:
    """The rank-file columns whose bytes this run's per-example output files hold."""
    columns = ["out_gen"]
    if cfg.pseudolabels:
        columns += ["out_legacy", "out_jsonl"]
    if cfg.scored and not cfg.no_examples_file:
        columns.append("out_example")
    return columns


def concatenated(part: Any, column: str) -> memoryview:
    """The values of a binary column, end to end, without a Python object per row."""
    import numpy as np

    array = part.column(column).combine_chunks()
    if array.null_count:
        raise RunStateError(f"rank files lack the serialized {column!r} of some examples; "
                            "expected every row written with its output lines (outputs.write.output_lines)")
    if len(array) == 0:
        return memoryview(b"")
    _, offsets_buf, data = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32)[array.offset : array.offset + len(array) + 1]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


def scores_of(part: Any) -> tuple[list[Any], list[Any]]:
    stats = [json.loads(x) for x in part.column("metric_stats").to_pylist()]
    sentence = [json.loads(x) for x in part.column("sentence_scores").to_pylist()]
    return stats, sentence


def write_part(cfg: Any, rows: Any, order: Any, stem: Path) -> int:
    """This rank's slice: the rows `order` names (data order), taken from `rows` (a merge.RowTaker)
    a chunk at a time, their bytes appended to stem.<column> and, when scored, their statistics to
    stem.scores. Returns the number of rows. The caller marks the slice complete afterwards."""
    columns = line_columns(cfg)
    names = [*columns, *(["scores"] if cfg.scored else [])]
    paths = {name: stem.with_name(f"{stem.name}.{name}") for name in names}
    files: dict[str, Any] = {}
    try:
        for name, path in paths.items():
            files[name] = open(path, "wb")
        for start in range(0, len(order), ROWS_PER_CHUNK):
            part = rows.take(order[start : start + ROWS_PER_CHUNK])
            for column in columns:
                files[column].write(concatenated(part, column))
            if cfg.scored:
                files["scores"].write("".join(
                    f"{m}\t{s}\n" for m, s in zip(part.column("metric_stats").to_pylist(),
                                                   part.column("sentence_scores").to_pylist())).encode("utf-8"))
        for f in files.values():
            # No fsync: a slice is read back by rank 0 within the run (from the page cache, or on
            # a shared filesystem after close); after a crash --resume writes every slice again.
            f.flush()
    except OSError as e:
        raise write_error(stem, e) from e
    finally:
        for f in files.values():
            f.close()
    return len(order)


def _copy(path: Path, sink: Any, skip: int = 0) -> int:
    """Copy a slice file into an output file a block at a time; returns the bytes copied. The
    first `skip` bytes are left out (the legacy list's comma before its first element)."""
    copied = 0
    with open(path, "rb") as f:
        if skip:
            f.seek(skip)
        while block := f.read(COPY_BYTES):
            sink.write(block)
            copied += len(block)
    return copied


def join_parts(parts: Parts, gen: Any, pseudo: Any, legacy: Any, jsonl: Any, examples_file: Any, totals: Any) -> None:
    """Rank 0's part of the shared tail: the slices end to end, and the metric added up in order."""
    legacy_started = False
    for stem in parts.stems:
        def path(column: str, stem: Path = stem) -> Path:
            return stem.with_name(f"{stem.name}.{column}")

        _copy(path("out_gen"), gen)
        if pseudo is not None:
            _copy(path("out_gen"), pseudo)
        if legacy is not None and jsonl is not None:
            # No comma before the first element of the whole list.
            legacy_started = _copy(path("out_legacy"), legacy, skip=0 if legacy_started else 1) > 0 or legacy_started
            _copy(path("out_jsonl"), jsonl)
        if examples_file is not None:
            _copy(path("out_example"), examples_file)
        if totals is not None:
            with open(path("scores"), encoding="utf-8") as f:
                while True:
                    lines = [line for _, line in zip(range(ROWS_PER_CHUNK), f)]
                    if not lines:
                        break
                    pairs = [line.rstrip("\n").split("\t") for line in lines]
                    totals.add([json.loads(m) for m, _ in pairs], [json.loads(s) for _, s in pairs])
