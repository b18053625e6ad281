"""Rank 0's merge: rank files joined to the data by example id and checked against it.

Each record carries its example's id and its place in the data. The id must be the data's id at
that place, every place must be covered exactly once, and nothing else may appear: a duplicate,
a missing id or an id that is not in the data is an error naming it, never a silently shifted
score. The check runs on Arrow columns (vectorized), and the result is an order of the rank
files' rows, so the outputs can be written in data order without loading every record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.examples import ExampleId
from ..errors import MergeError
from ..run.rankfiles import RankOutput


def _preview(ids: Sequence[ExampleId], limit: int = 10, total: int | None = None) -> str:
    shown = ", ".join(repr(i) for i in ids[:limit])
    total = len(ids) if total is None else total
    return shown + (f", ... ({total} in all)" if total > limit else "")


def merge_by_id(outputs: Sequence[RankOutput], store: Any, lo: int = 0, hi: int | None = None) -> tuple[pa.Table, np.ndarray]:
    """All rank files' rows as one table and the row order that lists the examples at places
    lo..hi-1 (all of them by default) in data order: a rank sharing the tail checks and writes
    only its own slice. Checked record batch by record batch, each batch's pages let go of once
    read (RankOutput.releaser says why), so no column of every row is ever copied whole."""
    import json

    table = pa.concat_tables([o.table for o in outputs]) if outputs else None
    n = len(store)
    hi = n if hi is None else hi
    if table is None or table.num_rows == 0:
        if hi > lo:
            raise MergeError(f"rank files are missing example id(s) {_preview(store.ids(range(lo, min(hi, lo + 10))), total=hi - lo)}")
        return table, np.zeros(0, np.int64)
    names = np.repeat(np.arange(len(outputs)), [o.table.num_rows for o in outputs])

    def where(row: int) -> str:
        return outputs[int(names[row])].path.name

    def got(row: int) -> ExampleId:
        return json.loads(table.column("id")[row].as_py())

    expected_ids = store.id_range(lo, hi - lo)
    rows_in, places = [], []
    offset = 0
    for out in outputs:
        for batch in out.table.to_batches():
            positions = batch.column("position").to_numpy()
            outside = np.nonzero((positions < 0) | (positions >= n))[0]
            if len(outside):
                row = offset + int(outside[0])
                raise MergeError(f"{where(row)}: example id(s) {got(row)!r} are not in the evaluated data")
            mine = np.nonzero((positions >= lo) & (positions < hi))[0]
            if len(mine):
                expected = expected_ids.take(pa.array(positions[mine] - lo))
                differ = pc.invert(pc.equal(expected, batch.column("id").take(pa.array(mine)))).to_numpy(zero_copy_only=False)
                if differ.any():
                    k = int(np.argmax(differ))
                    raise MergeError(
                        f"{where(offset + int(mine[k]))}: example id(s) {got(offset + int(mine[k]))!r} are not in the "
                        f"evaluated data at that place (expected id {json.loads(expected[k].as_py())!r})"
                    )
                rows_in.append(mine + offset)
                places.append(positions[mine].copy())
            out.releaser(batch)()
            offset += batch.num_rows
    rows = np.concatenate(rows_in) if rows_in else np.zeros(0, np.int64)
    positions = np.concatenate(places) if places else np.zeros(0, np.int64)
    by_place = np.argsort(positions, kind="stable")
    order = rows[by_place]
    ordered = positions[by_place]
    again = np.nonzero(ordered[1:] == ordered[:-1])[0]
    if len(again):
        first, second = int(order[again[0]]), int(order[again[0] + 1])
        dup = "twice" if names[first] == names[second] else f"again (first in {where(first)})"
        raise MergeError(f"{where(second)}: example id {got(second)!r} appears {dup}")
    if len(ordered) < hi - lo:
        seen = np.zeros(hi - lo, bool)
        seen[positions - lo] = True
        missing = np.nonzero(~seen)[0] + lo
        raise MergeError(f"rank files are missing example id(s) {_preview(store.ids(missing[:10].tolist()), total=len(missing))}")
    return table, order
