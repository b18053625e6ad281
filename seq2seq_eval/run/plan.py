"""Which examples form which batch, and which rank runs which batch. Pure functions.

Batches are cut globally from the length-sorted examples, before any rank is involved. A batch's
members, and so every example's padding and its generated text, therefore do not depend on the
world size; only the dealing of whole batches to ranks does. That is what makes 1, 2 and 3
processes give identical generations, and what lets a resumed run reuse batches finished under
another world size.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Batch:
    index: int
    members: tuple[int, ...]  # positions into the example list
    padded_len: int  # longest source in the batch, in tokens
    cost: float  # estimated generation cost, used only to balance ranks

    @property
    def padded_tokens(self) -> int:
        return self.padded_len * len(self.members)


def sort_by_length(lengths: Sequence[int]) -> list[int]:
    """Longest first, ties by position: the costliest batches (and any out-of-memory) come first.
    numpy's stable sort on the negated lengths is exactly that order, without a key tuple per
    example (a million of them cost seconds and tens of MB)."""
    return _length_order(lengths).tolist()


def _as_lengths(lengths: Any) -> np.ndarray:
    """Lengths as int32 (what the token shards hold): no copy of an int32 array, and no 8-byte
    copy of any, as the plan's transients are what a rank's peak memory grows by per example."""
    array = np.asarray(lengths)
    return array if array.dtype == np.int32 else array.astype(np.int32)


def _length_order(lengths: Any) -> np.ndarray:
    """sort_by_length as an array: int32 positions while they fit (4 bytes an example)."""
    negated = np.negative(_as_lengths(lengths))
    order = np.argsort(negated, kind="stable")
    del negated
    return order.astype(np.int32) if len(order) < 2**31 else order


def estimate_cost(n: int, padded_len: int, out_len: float, beams: int) -> float:
    """Encoder work plus decoder steps: a beam batch runs until its longest member ends, each step
    costing n*beams times a term that grows with the source length (cross-attention)."""
    return n * padded_len + n * beams * out_len * (1.0 + padded_len / 256.0)


class Plan:
    """The batches as arrays, not objects: the examples in length order (`order`), where each
    batch starts in it (`bounds`, one more than there are batches), each batch's padded length and
    estimated cost. A hundred million examples' plan as Batch objects of Python ints would be
    gigabytes on every rank; as arrays it is about 4 bytes an example. Indexing gives one Batch,
    its members made into Python ints then: a rank materializes only the batch it is about to run.
    Same batches, members, costs and deal as the list of Batch objects this replaced."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray, padded: np.ndarray, cost: np.ndarray) -> None:
        self.order, self.bounds, self.padded, self.cost = order, bounds, padded, cost

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch {index} of a plan of {len(self)} batches")
        index %= len(self)
        return Batch(index, tuple(self.members(index).tolist()), int(self.padded[index]), float(self.cost[index]))

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return all(np.array_equal(a, b) for a, b in zip((self.order, self.bounds, self.padded, self.cost),
                                                           (other.order, other.bounds, other.padded, other.cost)))

    __hash__ = None  # type: ignore[assignment]  # mutable arrays

    def members(self, index: int) -> np.ndarray:
        return self.order[self.bounds[index] : self.bounds[index + 1]]

    @property
    def sizes(self) -> np.ndarray:
        """Members per batch."""
        return np.diff(self.bounds)


def _cut_by_tokens(sorted_lengths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Batch starts in length order under a padded-token budget: the first (longest) member fixes
    the width w, and the batch takes max_tokens // w members (at least one; all that are left
    when w is 0), exactly what adding members one by one while (n+1)*w <= max_tokens gives."""
    n = len(sorted_lengths)
    starts, s = [], 0
    while s < n:
        starts.append(s)
        width = int(sorted_lengths[s])
        s = n if width == 0 else s + max(1, max_tokens // width)
    return np.asarray(starts + [n], dtype=np.int64)


def make_batches(
    lengths: Sequence[int],
    *,
    bs: int | None = None,
    max_tokens: int | None = None,
    out_ratio: float = 1.0,
    out_cap: int | None = None,
    beams: int = 1,
) -> Plan:
    """Cut length-sorted examples into batches of `bs` examples, or of at most `max_tokens`
    padded source tokens (an example longer than the budget gets a batch of its own)."""
    if (bs is None) == (max_tokens is None):
        raise ValueError("give exactly one of bs and max_tokens")
    lengths = _as_lengths(lengths)
    order = _length_order(lengths)
    n = len(order)
    if bs is not None:
        bounds = np.r_[np.arange(0, n, bs, dtype=np.int64), n] if n else np.zeros(1, np.int64)
    else:
        bounds = _cut_by_tokens(lengths[order], max_tokens)  # type: ignore[arg-type]
    # Sorted longest first: a batch's first member is its longest.
    padded = lengths[order[bounds[:-1]]].astype(np.int64) if n else np.zeros(0, np.int64)
    sizes = np.diff(bounds)
    # The same float operations, in the same order, as estimate_cost on Python numbers, so the
    # costs (and the deal that sorts by them) are bit for bit what they were.
    ratio = padded * float(out_ratio)
    out_len = ratio if out_cap is None else np.where(ratio <= out_cap, ratio, float(out_cap))
    cost = (sizes * padded) + (sizes * beams) * out_len * (1.0 + padded / 256.0)
    return Plan(order, bounds, padded.astype(np.int32), cost.astype(np.float64))


DEFAULT_MAX_TOKENS = {"hf": {"cpu": 1024, "cuda": 32768}, "ctranslate2": {"cpu": 2048, "cuda": 65536},
                      "hf_half": {"cpu": 1024, "cuda": 65536}}
"""The batch budget of a run given neither --bs nor --max_tokens, per engine and device type: the
measured best (benchmarks/budget.py on CPU for both engines: the HF engine peaks at 1024 on the
embedded model and is within 3% of its best there at opus-mt size; CTranslate2 peaks at 2048 on
both, 10% ahead of 1024 at opus-mt size; on an H100, benchmarks/gpu.py's curve at opus-mt size:
the HF engine in fp32 peaks at 32768, CTranslate2 at 65536 in float32 and in float16; on an H200,
the HF engine with --fp16/--bf16 ran 1.25x/1.58x faster at 65536 than at 32768, where fp32 was
level, docs/gpu.md). Unlisted devices take the CPU's. A budget too large for a GPU's memory costs
a split (run/oom.py), not the run."""


def batch_budget(bs: int | None, max_tokens: int | None, device_type: str, engine: str = "hf",
                 half: bool = False) -> tuple[int | None, int | None]:
    """(bs, max_tokens), exactly one of them set: --max_tokens when given, else --bs when given,
    else the engine's default token budget for the device (`half`: the HF engine in fp16/bf16)."""
    if max_tokens is not None:
        return None, max_tokens
    if bs is not None:
        return bs, None
    key = "hf_half" if engine == "hf" and half else engine
    budgets = DEFAULT_MAX_TOKENS.get(key, DEFAULT_MAX_TOKENS["hf"])
    return None, budgets.get(device_type, budgets["cpu"])


def _costs(batches: Sequence[Batch] | Plan) -> np.ndarray:
    return batches.cost if isinstance(batches, Plan) else np.asarray([b.cost for b in batches], np.float64)


def _sizes(batches: Sequence[Batch] | Plan) -> np.ndarray:
    return batches.sizes if isinstance(batches, Plan) else np.asarray([len(b.members) for b in batches], np.int64)


def assign_batches(batches: Sequence[Batch] | Plan, world_size: int) -> list[list[int]]:
    """Deal batches so ranks finish together: costliest first, each to the least-loaded rank
    (longest-processing-time-first). Ties go to the lower batch index and the lower rank, so the
    deal is deterministic. Each rank runs its batches in the order dealt (costliest first)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    costs = _costs(batches)
    indices = np.arange(len(costs)) if isinstance(batches, Plan) else np.asarray([b.index for b in batches], np.int64)
    heap = [(0.0, rank) for rank in range(world_size)]
    plan: list[list[int]] = [[] for _ in range(world_size)]
    # (-cost, index) order, the key the dealing has always used, without a tuple per batch.
    by_cost = np.lexsort((indices, -costs)) if len(costs) else np.zeros(0, np.int64)
    for index, cost in zip(indices[by_cost].tolist(), costs[by_cost].tolist()):
        load, rank = heapq.heappop(heap)
        plan[rank].append(index)
        heapq.heappush(heap, (load + cost, rank))
    return plan


def plan_digest(batches: Sequence[Batch] | Plan) -> str:
    """Identifies the batch plan (members only): equal digests mean journals can be reused. The
    sha256 of the compact JSON list of member lists, fed a batch at a time (the whole text of a
    hundred million positions would be a gigabyte)."""
    h = hashlib.sha256(b"[")
    first = True
    step = 4096
    for lo in range(0, len(batches), step):
        hi = min(lo + step, len(batches))
        if isinstance(batches, Plan):
            flat = batches.order[batches.bounds[lo] : batches.bounds[hi]].tolist()
            cuts = (batches.bounds[lo : hi + 1] - batches.bounds[lo]).tolist()
            groups = [flat[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
        else:
            groups = [b.members for b in batches[lo:hi]]
        text = ",".join("[" + ",".join(map(str, g)) + "]" for g in groups)
        h.update((text if first else "," + text).encode())
        first = False
    h.update(b"]")
    return h.hexdigest()


def padding_efficiency(batches: Sequence[Batch] | Plan, lengths: Sequence[int]) -> float:
    """Real source tokens / padded source tokens processed."""
    if isinstance(batches, Plan):
        padded = int(np.dot(batches.padded.astype(np.int64), batches.sizes))
    else:
        padded = sum(b.padded_tokens for b in batches)
    return int(np.asarray(lengths).sum(dtype=np.int64)) / padded if padded else 1.0
