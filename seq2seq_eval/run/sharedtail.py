"""The shared tail, rank by rank: once every rank file is there, each rank says how many bytes its
slice of the outputs holds; once every rank has, spills its own rank file's rows to every slice's
buckets (outputs/shuffle.py); once every rank has, reads its slice's rows back in data order and
writes them in place (outputs/parts.py); rank 0 waits for every slice and completes the files
(finish.py).

A rank dying here is survived as one dying in generation: its slice is simply never marked
complete, torchrun stops the group, rank 0 says what is missing; every batch is journaled, so
`--resume` derives the rank files from the journals and writes the slices again (prepare_tmp_dir
removes an attempt's slices with its rank files)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..atomic import dumps, write_atomic
from ..errors import RunStateError, SyncTimeoutError
from ..inputs.tokens import shard_range
from ..outputs.merge import merge_by_id
from ..outputs.parts import Parts, SliceInfo, columns_taken, layout, line_columns, roles, slice_sizes, write_slice
from ..outputs.shuffle import Buckets, column_bytes, in_chunks, in_data_order, memory_available, spill, spills
from .rankfiles import rank_file, read_rank_output

POLL_S = 0.1


def part_stem(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"tail_{rank}"


def part_sizes(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"tail_{rank}.sizes"


def part_done(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"tail_{rank}.json"


def part_spilled(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"tail_{rank}.spilled"


def spill_file(tmp_dir: Path, source: int | str, slice_: int) -> Path:
    """Rows of rank `source`'s file (or of every rank file: "all") for slice `slice_` (shuffle.py)."""
    return tmp_dir / f"tail_spill_{source}_{slice_}.arrow"


def assembled(tmp_dir: Path, role: str) -> Path:
    return tmp_dir / f"tail_out.{role}"


def _slices(tmp_dir: Path, world_size: int) -> list[SliceInfo]:
    infos = [json.loads(part_sizes(tmp_dir, r).read_text()) for r in range(world_size)]
    return [SliceInfo(i["rank"], i["start"], i["end"], i["rows"], i["sizes"]) for i in infos]


def missing_parts(tmp_dir: Path, world_size: int) -> list[int]:
    """The ranks holding the shared tail up: those that have not said their slice's sizes (every
    rank waits for all of them before spilling), else those that have not spilled their rows
    (every rank waits for all of them before writing), else those that have not finished writing."""
    for marker in (part_sizes, part_spilled, part_done):
        missing = [r for r in range(world_size) if not marker(tmp_dir, r).exists()]
        if missing:
            return missing
    return []


def _wait(paths: list[Path], what: str, timeout_s: float, describe: Callable[[list[int]], str] | None,
          check: Callable[[], None] | None) -> None:
    """Poll until every path exists; `check` runs at each poll (a rank other than 0 looks
    whether rank 0 is still there)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r, p in enumerate(paths) if not p.exists()]
        if not missing:
            return
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            raise SyncTimeoutError(f"waited {timeout_s:g} s (--sync_timeout) for {what}; missing from rank(s) "
                                   f"{', '.join(map(str, missing))}{describe(missing) if describe else ''}")
        time.sleep(POLL_S)


def write_my_part(cfg: Any, env: Any, store: Any, tmp_dir: Path, describe: Callable[[list[int]], str] | None = None,
                  check: Callable[[], None] | None = None, available: int | None = None) -> None:
    """This rank's slice of the outputs, once every rank file is there: its sizes; once every
    rank's are known, its slice's rows gathered, at random from the rank files or, once they
    outgrow the memory (the least any rank has: `available`, else what the kernel says), by
    spilling: its own rank file's rows to every slice's buckets, and once every rank has, its
    slice's buckets read back (shuffle.py); then its slice's bytes in place."""
    world = env.world_size
    _wait([rank_file(tmp_dir, r) for r in range(world)], "rank files", cfg.sync_timeout, describe, check)
    outputs = [read_rank_output(rank_file(tmp_dir, r), r) for r in range(world)]
    lo, hi = shard_range(len(store), env.rank, world)
    _, order = merge_by_id(outputs, store, lo, hi)
    sizes = slice_sizes(outputs, lo, hi, line_columns(cfg))
    write_atomic(part_sizes(tmp_dir, env.rank),
                 dumps({"rank": env.rank, "start": lo, "end": hi, "rows": len(order), "sizes": sizes,
                        "memory_available": available if available is not None else memory_available()}))
    _wait([part_sizes(tmp_dir, r) for r in range(world)], "the sizes of the ranks' slices of the outputs",
          cfg.sync_timeout, describe, check)
    slices = _slices(tmp_dir, world)
    columns = columns_taken(roles(cfg), cfg.scored)
    # Every rank decides alike, from what every rank said: the spill needs all of them.
    least = min(json.loads(part_sizes(tmp_dir, r).read_text())["memory_available"] for r in range(world))
    if spills(column_bytes(outputs, columns), least):
        destinations = [Buckets.sized(s.start, s.end, sum(s.sizes.values())) for s in slices]
        spill([outputs[env.rank]], columns, [(b, spill_file(tmp_dir, env.rank, r)) for r, b in enumerate(destinations)])
        outputs = []  # the rank files are memory-mapped: let them go before they may be removed
        write_atomic(part_spilled(tmp_dir, env.rank), dumps({"rank": env.rank}))
        _wait([part_spilled(tmp_dir, r) for r in range(world)], "the ranks' rows spilled to the slices",
              cfg.sync_timeout, describe, check)
        gathered = in_data_order([spill_file(tmp_dir, r, env.rank) for r in range(world)], destinations[env.rank])
    else:
        write_atomic(part_spilled(tmp_dir, env.rank), dumps({"rank": env.rank, "spilled": False}))
        gathered = in_chunks(outputs, order, columns)
    placements, _ = layout(slices, roles(cfg))
    targets = {role: (assembled(tmp_dir, role), placement) for role, placement in placements[env.rank].items()}
    rows, blocks = write_slice(cfg, gathered, targets, part_stem(tmp_dir, env.rank))
    gathered = outputs = []  # the rank files are memory-mapped: let them go before they may be removed
    if rows != len(order):
        raise RunStateError(f"the tail's slice {env.rank} wrote {rows} examples; expected {len(order)}")
    write_atomic(part_done(tmp_dir, env.rank),
                 dumps({"rank": env.rank, "start": lo, "end": hi, "rows": rows, "blocks": blocks}))


def wait_for_parts(cfg: Any, world_size: int, tmp_dir: Path, describe: Callable[[list[int]], str] | None = None) -> Parts:
    """Rank 0: every rank's slice, in data order, once all are complete."""
    _wait([part_done(tmp_dir, r) for r in range(world_size)], "the ranks' slices of the outputs", cfg.sync_timeout,
          describe, None)
    slices = _slices(tmp_dir, world_size)
    names = roles(cfg)
    _, lengths = layout(slices, names)
    blocks = [json.loads(part_done(tmp_dir, r).read_text())["blocks"] for r in range(world_size)]
    return Parts([part_stem(tmp_dir, r) for r in range(world_size)], [s.rows for s in slices],
                 {role: assembled(tmp_dir, role) for role in names}, lengths, blocks)
