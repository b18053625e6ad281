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


class RowTaker:
    """Rows of the rank files (numbered as in merge_by_id's table), gathered record batch by
    record batch, with each batch's pages let go of as soon as its rows are copied.

    Arrow's take on a chunked column concatenates the whole column first: taking one chunk of
    data-order rows from a million-row merged table copied every rank file again, for every
    chunk, which made rank 0's tail grow as N squared. Here each record batch gives only its own
    rows, and one small take puts them back in the order asked for. Data order is a random walk
    through the rank files, and every row read maps dozens of KB of file around it (the kernel's
    fault-around): without letting go, a million pseudolabels' rank files, gigabytes, would all
    end up counted in rank 0's resident memory."""

    def __init__(self, outputs: Sequence[RankOutput]) -> None:
        self._schema = outputs[0].table.schema
        self._batches: list[pa.RecordBatch] = []
        self._release: list[Any] = []
        for out in outputs:
            for batch in out.table.to_batches():
                self._batches.append(batch)
                self._release.append(out.releaser(batch))
        self._bounds = np.cumsum([0] + [b.num_rows for b in self._batches], dtype=np.int64)

    def take(self, rows: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows, in the order given; only `columns` when named (the others, the predictions'
        lists above all, cost most of a take and are not read)."""
        rows = np.asarray(rows, np.int64)
        which = np.searchsorted(self._bounds, rows, side="right") - 1
        by_batch = np.argsort(which, kind="stable")
        grouped = which[by_batch]
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if len(rows) else np.zeros(0, np.int64)
        pieces = []
        for a, b in zip(starts, np.r_[starts[1:], len(rows)].astype(np.int64)):
            k = int(grouped[a])
            batch = self._batches[k] if columns is None else self._batches[k].select(columns)
            pieces.append(batch.take(pa.array(rows[by_batch[a:b]] - self._bounds[k])))
            self._release[k]()
        schema = self._schema if columns is None else pa.schema([self._schema.field(c) for c in columns])
        gathered = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
        inverse = np.empty_like(by_batch)
        inverse[by_batch] = np.arange(len(rows))
        return gathered.take(pa.array(inverse))
