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
import json
from collections.abc import Sequence
from dataclasses import dataclass


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
    import numpy as np

    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()


def estimate_cost(n: int, padded_len: int, out_len: float, beams: int) -> float:
    """Encoder work plus decoder steps: a beam batch runs until its longest member ends, each step
    costing n*beams times a term that grows with the source length (cross-attention)."""
    return n * padded_len + n * beams * out_len * (1.0 + padded_len / 256.0)


def make_batches(
    lengths: Sequence[int],
    *,
    bs: int | None = None,
    max_tokens: int | None = None,
    out_ratio: float = 1.0,
    out_cap: int | None = None,
    beams: int = 1,
) -> list[Batch]:
    """Cut length-sorted examples into batches of `bs` examples, or of at most `max_tokens`
    padded source tokens (an example longer than the budget gets a batch of its own)."""
    if (bs is None) == (max_tokens is None):
        raise ValueError("give exactly one of bs and max_tokens")
    order = sort_by_length(lengths)
    groups: list[list[int]] = []
    if bs is not None:
        groups = [order[i : i + bs] for i in range(0, len(order), bs)]
    else:
        current: list[int] = []
        for i in order:
            # Sorted longest first, so the first member fixes the batch's padded length.
            width = lengths[current[0]] if current else lengths[i]
            if current and (len(current) + 1) * width > max_tokens:  # type: ignore[operator]
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
    batches = []
    for index, members in enumerate(groups):
        padded = max(lengths[i] for i in members)
        out_len = padded * out_ratio if out_cap is None else min(padded * out_ratio, out_cap)
        batches.append(Batch(index, tuple(members), padded, estimate_cost(len(members), padded, out_len, beams)))
    return batches


DEFAULT_MAX_TOKENS = {"hf": {"cpu": 1024, "cuda": 32768}, "ctranslate2": {"cpu": 2048, "cuda": 65536}}
"""The batch budget of a run given neither --bs nor --max_tokens, per engine and device type: the
measured best (benchmarks/budget.py on CPU for both engines: the HF engine peaks at 1024 on the
embedded model and is within 3% of its best there at opus-mt size; CTranslate2 peaks at 2048 on
both, 10% ahead of 1024 at opus-mt size; on an H100, benchmarks/gpu.py's curve at opus-mt size:
the HF engine in fp32 peaks at 32768, CTranslate2 at 65536 in float32 and in float16). Unlisted devices
take the CPU's. A budget too large for a GPU's memory costs a split (run/oom.py), not the run."""


def batch_budget(bs: int | None, max_tokens: int | None, device_type: str, engine: str = "hf") -> tuple[int | None, int | None]:
    """(bs, max_tokens), exactly one of them set: --max_tokens when given, else --bs when given,
    else the engine's default token budget for the device."""
    if max_tokens is not None:
        return None, max_tokens
    if bs is not None:
        return bs, None
    budgets = DEFAULT_MAX_TOKENS.get(engine, DEFAULT_MAX_TOKENS["hf"])
    return None, budgets.get(device_type, budgets["cpu"])


def assign_batches(batches: Sequence[Batch], world_size: int) -> list[list[int]]:
    """Deal batches so ranks finish together: costliest first, each to the least-loaded rank
    (longest-processing-time-first). Ties go to the lower batch index and the lower rank, so the
    deal is deterministic. Each rank runs its batches in the order dealt (costliest first)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    heap = [(0.0, rank) for rank in range(world_size)]
    plan: list[list[int]] = [[] for _ in range(world_size)]
    for batch in sorted(batches, key=lambda b: (-b.cost, b.index)):
        load, rank = heapq.heappop(heap)
        plan[rank].append(batch.index)
        heapq.heappush(heap, (load + batch.cost, rank))
    return plan


def plan_digest(batches: Sequence[Batch]) -> str:
    """Identifies the batch plan (members only): equal digests mean journals can be reused."""
    payload = json.dumps([list(b.members) for b in batches], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def padding_efficiency(batches: Sequence[Batch], lengths: Sequence[int]) -> float:
    """Real source tokens / padded source tokens processed."""
    padded = sum(b.padded_tokens for b in batches)
    return sum(lengths) / padded if padded else 1.0
