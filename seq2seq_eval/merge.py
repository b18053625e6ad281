"""Rank 0's merge: rank files joined by example id and checked against the plan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .data import ExampleId
from .errors import MergeError
from .runfiles import RankOutput


def _preview(ids: Sequence[ExampleId], limit: int = 10) -> str:
    shown = ", ".join(repr(i) for i in ids[:limit])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def merge_by_id(outputs: Sequence[RankOutput], planned_ids: Sequence[ExampleId]) -> list[dict[str, Any]]:
    """Records in plan order. Every planned id exactly once: a duplicate, a missing id or an
    id that was never planned is an error naming it, never a silently shifted score."""
    by_id: dict[ExampleId, dict[str, Any]] = {}
    origin: dict[ExampleId, str] = {}
    for out in outputs:
        for record in out.records:
            ex_id = record["id"]
            if ex_id in by_id:
                where = "twice" if origin[ex_id] == out.path.name else f"again (first in {origin[ex_id]})"
                raise MergeError(f"{out.path.name}: example id {ex_id!r} appears {where}")
            by_id[ex_id] = record
            origin[ex_id] = out.path.name
    planned = set(planned_ids)
    unexpected = [i for i in by_id if i not in planned]
    if unexpected:
        raise MergeError(
            f"{origin[unexpected[0]]}: example id(s) {_preview(unexpected)} are not in the evaluated data"
        )
    missing = [i for i in planned_ids if i not in by_id]
    if missing:
        raise MergeError(f"rank files are missing example id(s) {_preview(missing)}")
    return [by_id[i] for i in planned_ids]
