"""The shared tail: each rank writes its slice of the outputs in place, rank 0 completes them.

Once every rank file is there, rank k takes the examples at places [N*k/W, N*(k+1)/W) from all
rank files (merge_by_id on that range: the same checks) and first says how many bytes its slice
adds to each per-example output file (slice_sizes, from the rank files' offsets alone), in
{tmp_dir}/tail_<k>.sizes. Once every rank has, each knows where its bytes go (layout, a pure
function of the sizes) and writes them at those offsets into the output files being assembled in
the temp dir, {tmp_dir}/tail_out.<role>; a scored run's rank also writes each example's metric
statistics and sentence scores (one line each, JSON and JSON separated by a tab) into
tail_<k>.scores. tail_<k>.json, written last, says the slice is complete, with the digests of
the blocks of each file the slice holds whole (outputs/digest.py: the record's digest, without
reading the outputs again). Rank 0 then writes the files' first and last bytes (the legacy
list's brackets), adds up the metric statistics in data order and publishes the files into
--save_dir: exactly the bytes and the arithmetic of writing them itself, with every byte written
once, by the rank that holds it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_error
from ..errors import RunStateError
from .digest import SliceHash, assemble
from .shuffle import ROWS_PER_CHUNK, prefetched

# Per-example output files, by role: the rank-file column whose bytes each holds.
ROLE_COLUMNS = {"gen": "out_gen", "pseudo": "out_gen", "legacy": "out_legacy", "jsonl": "out_jsonl",
                "example": "out_example"}


def roles(cfg: Any) -> list[str]:
    """The per-example output files this run writes, by role (see ROLE_COLUMNS)."""
    names = ["gen"]
    if cfg.pseudolabels:
        names += ["legacy", "jsonl"] + (["pseudo"] if cfg.pseudo_target else [])
    if cfg.scored and not cfg.no_examples_file:
        names.append("example")
    return names


def line_columns(cfg: Any) -> list[str]:
    """The rank-file columns whose bytes this run's per-example output files hold."""
    return list(dict.fromkeys(ROLE_COLUMNS[r] for r in roles(cfg)))


def columns_taken(role_names: Sequence[str], scored: bool) -> list[str]:
    """The rank-file columns a tail takes to write these outputs: the lines' bytes and, when
    scored, the metric statistics (the rest, the predictions' lists above all, cost most of a take)."""
    return list(dict.fromkeys(ROLE_COLUMNS[r] for r in role_names)) + (["metric_stats", "sentence_scores"] if scored else [])


def legacy_ends(n_rows: int) -> tuple[bytes, bytes]:
    """pseudolabel_results.json's first and last bytes around its elements (json.dumps of a list,
    indent=1): an empty list is "[]" and a newline."""
    return (b"[", b"\n]\n") if n_rows else (b"[]", b"\n")


@dataclass(frozen=True)
class SliceInfo:
    """What a rank's slice adds to the outputs: its places [start, end), rows, bytes per column."""

    rank: int
    start: int
    end: int
    rows: int
    sizes: Mapping[str, int]


@dataclass(frozen=True)
class Placement:
    """Where one slice's bytes go in one output file: at `offset`, less the first `skip` bytes
    (the comma before the legacy list's first element)."""

    offset: int
    skip: int


def layout(slices: Sequence[SliceInfo], role_names: Sequence[str]) -> tuple[list[dict[str, Placement]], dict[str, int]]:
    """Each slice's placement in each output file (slices in data order), and each file's length:
    the slices' bytes end to end after the file's first bytes, then its last bytes."""
    n_rows = sum(s.rows for s in slices)
    head, tail = legacy_ends(n_rows)
    placements: list[dict[str, Placement]] = [{} for _ in slices]
    lengths: dict[str, int] = {}
    for role in role_names:
        column = ROLE_COLUMNS[role]
        at = len(head) if role == "legacy" else 0
        before = 0
        for k, s in enumerate(slices):
            skip = 1 if role == "legacy" and before == 0 and s.rows else 0
            placements[k][role] = Placement(at, skip)
            at += s.sizes[column] - skip
            before += s.rows
        lengths[role] = at + (len(tail) if role == "legacy" else 0)
    return placements, lengths


@dataclass(frozen=True)
class Parts:
    """The ranks' slices of a run's outputs, complete: the output files assembled in the temp dir
    (by role) and their lengths, and each slice's file stem (tail_<k>, whose .scores a scored run
    adds up), rows and, by role, the digests of the blocks it wrote whole (digest.SliceHash), in
    data order."""

    stems: Sequence[Path]
    counts: Sequence[int]
    assembled: Mapping[str, Path]
    lengths: Mapping[str, int]
    blocks: Sequence[Mapping[str, Any]] = ()

    @property
    def rows(self) -> int:
        return sum(self.counts)


def _offsets(array: Any, column: str) -> Any:
    import numpy as np

    if array.null_count:
        raise RunStateError(f"rank files lack the serialized {column!r} of some examples; "
                            "expected every row written with its output lines (outputs.write.output_lines)")
    _, offsets_buf, _ = array.buffers()
    return np.frombuffer(offsets_buf, np.int32)[array.offset : array.offset + len(array) + 1]


def concatenated(part: Any, column: str) -> memoryview:
    """The values of a binary column, end to end, without a Python object per row."""
    array = part.column(column).combine_chunks()
    if len(array) == 0:
        return memoryview(b"")
    offsets = _offsets(array, column)
    return memoryview(array.buffers()[2])[int(offsets[0]) : int(offsets[-1])]


def slice_sizes(outputs: Sequence[Any], lo: int, hi: int, columns: Sequence[str]) -> dict[str, int]:
    """Bytes the examples at places [lo, hi) hold in each column of the rank files, from the
    columns' offsets alone (no value is read), record batch by record batch."""
    import numpy as np

    sizes = dict.fromkeys(columns, 0)
    for out in outputs:
        for batch in out.table.to_batches():
            positions = batch.column("position").to_numpy()
            mine = (positions >= lo) & (positions < hi)
            if mine.any():
                for column in columns:
                    sizes[column] += int(np.diff(_offsets(batch.column(column), column))[mine].sum())
            out.releaser(batch)()
    return sizes


def scores_of(part: Any) -> tuple[list[Any], list[Any]]:
    stats = [json.loads(x) for x in part.column("metric_stats").to_pylist()]
    sentence = [json.loads(x) for x in part.column("sentence_scores").to_pylist()]
    return stats, sentence


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def write_slice(cfg: Any, rows: Iterable[Any], targets: Mapping[str, tuple[Path, Placement]],
                stem: Path) -> tuple[int, dict[str, Any]]:
    """This rank's slice, in place: `rows`, tables of its examples in data order (shuffle.in_chunks
    or shuffle.in_data_order), their bytes written into each assembled output file at its
    placement (`targets`, by role) and, when scored, their statistics into stem.scores. Returns
    the number of rows and, by role, the digests of the blocks the slice holds whole
    (digest.SliceHash, hashed as they are written). The caller marks the slice complete afterwards."""
    fds: dict[str, int] = {}
    scores = None
    at = {role: placement.offset for role, (_, placement) in targets.items()}
    skip = {role: placement.skip for role, (_, placement) in targets.items()}
    hashes = {role: SliceHash(placement.offset) for role, (_, placement) in targets.items()}
    path = stem
    n_rows = 0
    try:
        for role, (path, _) in targets.items():
            # No O_TRUNC: the other ranks write their slices into the same file at the same time.
            # O_NOFOLLOW: the temp dir's files are the tool's, never written through a link.
            fds[role] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        if cfg.scored:
            path = stem.with_name(f"{stem.name}.scores")
            scores = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666), "wb")
        for part in prefetched(rows):
            n_rows += part.num_rows
            for role, fd in fds.items():
                data = concatenated(part, ROLE_COLUMNS[role])[skip[role]:]
                skip[role] = 0
                path = targets[role][0]
                _pwrite_all(fd, data, at[role])
                hashes[role].update(data)
                at[role] += len(data)
            if scores is not None:
                path = scores.name
                scores.write("".join(
                    f"{m}\t{s}\n" for m, s in zip(part.column("metric_stats").to_pylist(),
                                                   part.column("sentence_scores").to_pylist())).encode("utf-8"))
        # No fsync: rank 0 reads the files back within the run (from the page cache, or on a
        # shared filesystem after close) and fsyncs them before they become outputs; after a
        # crash --resume writes every slice again.
    except OSError as e:
        raise write_error(Path(path), e) from e
    finally:
        for fd in fds.values():
            os.close(fd)
        if scores is not None:
            scores.close()
    return n_rows, {role: h.result() for role, h in hashes.items()}


def complete(parts: Parts) -> dict[str, tuple[int, str]]:
    """Rank 0, once every slice is written: each assembled file's first and last bytes, its exact
    length (whatever an earlier attempt left there) and an fsync, before it is moved into place.
    Returns each file's size and content digest: the slices' blocks, and the few blocks no slice
    held whole read back (digest.assemble)."""
    head, tail = legacy_ends(parts.rows)
    done: dict[str, tuple[int, str]] = {}
    for role, path in parts.assembled.items():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            try:
                if role == "legacy":
                    _pwrite_all(fd, memoryview(head), 0)
                    _pwrite_all(fd, memoryview(tail), parts.lengths[role] - len(tail))
                os.ftruncate(fd, parts.lengths[role])
                os.fsync(fd)
            finally:
                os.close(fd)
            done[role] = (parts.lengths[role], assemble(path, parts.lengths[role], [b[role] for b in parts.blocks]))
        except OSError as e:
            raise write_error(path, e) from e
    return done


def add_scores(parts: Parts, totals: Any) -> None:
    """A scored run's metric statistics, slice by slice in data order, added to `totals`."""
    for stem in parts.stems:
        with open(stem.with_name(f"{stem.name}.scores"), encoding="utf-8") as f:
            while True:
                lines = [line for _, line in zip(range(ROWS_PER_CHUNK), f)]
                if not lines:
                    break
                pairs = [line.rstrip("\n").split("\t") for line in lines]
                totals.add([json.loads(m) for m, _ in pairs], [json.loads(s) for _, s in pairs])
