"""Which examples form which batch, and which rank runs which batch. Pure functions.

Batches are cut globally from the length-sorted examples, before any rank is involved. For a given
budget, a batch's members, and so every example's padding and its generated text, therefore do
not depend on the world size; only the dealing of whole batches to ranks does. That is what makes
1, 2 and 3 processes give identical generations, and what lets a resumed run reuse batches
finished under another world size. The default budget of a run given neither --bs nor
--max_tokens (batch_budget) depends on the engine, the device, the precision and the model's kind,
never on the world size: the same bytes at any world size by default. Only --budget_for_world_size
lowers it on a small set so that every rank has work (default_plan); the run then records and
says so, and that budget pinned gives the same batches at any world size. A token budget's batch
above 1/MAX_BATCH_SHARE of the set's bound cost (every output at the length limit) is cut into
pieces (split.py), from the lengths and the generation settings only, so that a small set's
last batches are small whatever its outputs turn out to be: still the same at any world size.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .split import split_costly


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


def estimate_cost(n: int, padded_len: int, out_len: float, beams: int, step_overhead: float = 0.0) -> float:
    """Encoder work plus decoder steps: a beam batch runs until its longest member ends, each step
    costing n*beams times a term that grows with the source length (cross-attention), plus the
    step's fixed cost on the device (`step_overhead`, STEP_OVERHEAD: 0 on CPU)."""
    cost = n * padded_len + n * beams * out_len * (1.0 + padded_len / 256.0)
    return cost + out_len * step_overhead if step_overhead else cost


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


def _batch_costs(first_lengths: np.ndarray, bounds: np.ndarray, out_ratio: float, out_cap: int | None, beams: int,
                 step_overhead: float, out_floor: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each batch's padded length and estimated cost (estimate_cost), for the batches that start
    at `bounds` in length order; `first_lengths`: each batch's first member's length. Sorted
    longest first, a batch's first member is its longest. `out_floor`: the fewest tokens an
    output can have (min_new_tokens): the estimated output length is never below it."""
    padded = first_lengths.astype(np.int64)
    sizes = np.diff(bounds)
    # The same float operations, in the same order, as estimate_cost on Python numbers, so the
    # costs (and the deal that sorts by them) are bit for bit what they were.
    ratio = padded * float(out_ratio)
    out_len = ratio if out_cap is None else np.where(ratio <= out_cap, ratio, float(out_cap))
    if out_floor:
        out_len = np.maximum(out_len, float(out_floor))
    cost = (sizes * padded) + (sizes * beams) * out_len * (1.0 + padded / 256.0)
    if step_overhead:
        cost = cost + out_len * float(step_overhead)
    return padded.astype(np.int32), cost.astype(np.float64)


def bound_costs(first_lengths: np.ndarray, bounds: np.ndarray, out_ratio: float, out_cap: int | None, beams: int,
                step_overhead: float, out_floor: int = 0) -> np.ndarray:
    """Each batch's cost (estimate_cost) with every output at the length limit (`out_cap`:
    max_new_tokens, else max_length), whatever the source's length: what the batch can cost at
    most, which grows with its decoder rows (examples x beams). Without a limit, the estimate
    (_batch_costs). Why a bound beside the estimate: the estimate guesses the outputs from the
    sources and can fall far short (every output of issue 63's runs, a random model's, reached
    the limit: a batch of 77 short sources ran 64 decoder steps, estimated 20), and the batches the
    deal leaves last are those it believes cheap; sized by the bound, no batch of the cut is
    large whatever its outputs turn out to be (split.py)."""
    if out_cap is None:
        return _batch_costs(first_lengths, bounds, out_ratio, out_cap, beams, step_overhead, out_floor)[1]
    # The estimate with an output ratio no source keeps under the limit: every output at it.
    with np.errstate(invalid="ignore"):  # a 0-length source: 0 x inf, then the limit all the same
        return _batch_costs(first_lengths, bounds, np.inf, out_cap, beams, step_overhead, out_floor)[1]


def _token_plan(order: np.ndarray, sorted_lengths: np.ndarray, max_tokens: int, out_ratio: float, out_cap: int | None,
                beams: int, step_overhead: float, out_floor: int) -> Plan:
    """The plan of a token budget: the cut (_cut_by_tokens), its batches above their share of
    the set's bound cost split (split.py), and the batches' padded lengths and estimated
    costs (_batch_costs: the deal's)."""
    bounds = _cut_by_tokens(sorted_lengths, max_tokens)
    bound = bound_costs(sorted_lengths[bounds[:-1]], bounds, out_ratio, out_cap, beams, step_overhead, out_floor)
    bounds = split_costly(bounds, bound, beams, step_overhead)
    padded, cost = _batch_costs(sorted_lengths[bounds[:-1]], bounds, out_ratio, out_cap, beams, step_overhead, out_floor)
    return Plan(order, bounds, padded, cost)


def make_batches(
    lengths: Sequence[int],
    *,
    bs: int | None = None,
    max_tokens: int | None = None,
    out_ratio: float = 1.0,
    out_cap: int | None = None,
    beams: int = 1,
    step_overhead: float = 0.0,
    out_floor: int = 0,
) -> Plan:
    """Cut length-sorted examples into batches of `bs` examples (exactly: the user's size), or of
    at most `max_tokens` padded source tokens (an example longer than the budget gets a batch of
    its own), a token budget's costliest batches split (split.py).
    `out_cap`: the length limit; `step_overhead`: a decoder step's fixed cost on the device, in
    the cost's units (STEP_OVERHEAD); `out_floor`: the fewest new tokens an output can have."""
    if (bs is None) == (max_tokens is None):
        raise ValueError("give exactly one of bs and max_tokens")
    lengths = _as_lengths(lengths)
    order = _length_order(lengths)
    n = len(order)
    if bs is None:
        return _token_plan(order, lengths[order], max_tokens, out_ratio, out_cap, beams, step_overhead,  # type: ignore[arg-type]
                           out_floor)
    bounds = np.r_[np.arange(0, n, bs, dtype=np.int64), n] if n else np.zeros(1, np.int64)
    padded, cost = _batch_costs(lengths[order[bounds[:-1]]], bounds, out_ratio, out_cap, beams, step_overhead, out_floor)
    return Plan(order, bounds, padded, cost)


DEFAULT_MAX_TOKENS = {"hf": {"cpu": 1024, "cuda": 32768}, "ctranslate2": {"cpu": 2048, "cuda": 65536},
                      "hf_half": {"cpu": 1024, "cuda": 65536}}
"""The batch budget of a run given neither --bs nor --max_tokens, at any world size (lowered for
the world size only with --budget_for_world_size: default_plan), per engine and device type: the measured best for one
device (benchmarks/budget.py on CPU for both engines: the HF engine peaks at 1024 on the
embedded model and is within 3% of its best there at opus-mt size; CTranslate2 peaks at 2048 on
both, 10% ahead of 1024 at opus-mt size; on an H100, benchmarks/gpu.py's curve at opus-mt size:
the HF engine in fp32 peaks at 32768, CTranslate2 at 65536 in float32 and in float16; on an H200,
the HF engine with --fp16/--bf16 ran 1.25x/1.58x faster at 65536 than at 32768, where fp32 was
level, docs/gpu.md). Unlisted devices take the CPU's. A budget too large for a GPU's memory costs
a split (run/oom.py), not the run."""


CAUSAL_MAX_TOKENS = {"hf": {"cpu": 4096}, "ctranslate2": {"cpu": 8192}}
"""The same for a decoder-only model in greedy search, where a batch's rows are its prompts (an
encoder-decoder's defaults above were measured with 4 beams: four rows a source). Measured on
CPU (benchmarks/budget.py, 2 threads, a random 59M-parameter Llama-style model, 250 prompts of
6 to 97 tokens, 32 new tokens, one round; samples/s at 1024, 2048, 4096, 8192): the HF engine 14.9, 17.0,
17.5, 16.5; CTranslate2 9.4, 11.4, 12.2, 13.0, with one worker of 2 threads. With 2 workers of
1 thread (the engine's layout since), whole runs of 500 such prompts took 31.6, 28.8, 27.8 s at
2048, 4096, 8192 and 27.3 s at 16384, one round each: 8192 kept. With beams the budget is divided
by num_beams, so that a batch holds the rows it holds in greedy search (a decoder step's cost grows with its
rows; not measured with beams). Not measured on a GPU: there a decoder-only model takes
DEFAULT_MAX_TOKENS."""


def _engine_key(engine: str, half: bool) -> str:
    """The key of DEFAULT_MAX_TOKENS and STEP_OVERHEAD: the engine, or the HF engine in fp16/bf16."""
    return "hf_half" if engine == "hf" and half else engine


def batch_budget(bs: int | None, max_tokens: int | None, device_type: str, engine: str = "hf",
                 half: bool = False, causal: bool = False, beams: int = 1) -> tuple[int | None, int | None]:
    """(bs, max_tokens), exactly one of them set: --max_tokens when given, else --bs when given,
    else the engine's default token budget for the device (`half`: the HF engine in fp16/bf16;
    `causal`: a decoder-only model searching with `beams` beams, CAUSAL_MAX_TOKENS). No world
    size here: the default is the same on any number of ranks (default_plan lowers it only when
    the user asks, --budget_for_world_size)."""
    if max_tokens is not None:
        return None, max_tokens
    if bs is not None:
        return bs, None
    budgets = DEFAULT_MAX_TOKENS.get(_engine_key(engine, half), DEFAULT_MAX_TOKENS["hf"])
    if causal and (device_type == "cpu" or device_type not in budgets):  # unlisted devices take the CPU's
        return None, max(1, CAUSAL_MAX_TOKENS.get(engine, CAUSAL_MAX_TOKENS["hf"])["cpu"] // max(1, beams))
    return None, budgets.get(device_type, budgets["cpu"])


STEP_OVERHEAD = {"hf": {"cpu": 16.0, "cuda": 900.0}, "ctranslate2": {"cpu": 16.0, "cuda": 900.0},
                 "hf_half": {"cpu": 16.0, "cuda": 3000.0}}
"""A decoder step's fixed cost, in the cost estimate's units (one row, an example's beam, at one
step), per engine and device type: what a step costs whatever the batch's size (kernel launches,
the host's share). On an H200 at opus-mt size, each planned batch of newstest2017 timed on its
own (benchmarks/gpu_batches.py, docs/gpu.md) fits 880 in fp32 and 3,140 in fp16; CTranslate2
was not timed there and takes fp32's. On CPU, 1.4 ms a step beside 0.34 ms an example at 4 beams
on the embedded model (benchmarks/README.md) makes about 16. Unlisted devices take the CPU's."""

BATCHES_PER_RANK = 8
"""A set that gives every rank this many batches at the device's default budget keeps it; below
that, --budget_for_world_size's rule (default_plan) tries the budgets that give 1, 2, ..., this many per rank."""

WALL_TOLERANCE = 1.05
"""Of the budgets --budget_for_world_size's rule tries, it takes the largest whose predicted wall time is within
this factor of the lowest (default_plan)."""


def step_overhead(device_type: str, engine: str = "hf", half: bool = False) -> float:
    """STEP_OVERHEAD for the engine and device (`half`: the HF engine in fp16/bf16)."""
    overheads = STEP_OVERHEAD.get(_engine_key(engine, half), STEP_OVERHEAD["hf"])
    return overheads.get(device_type, overheads["cpu"])


def rank_loads(batches: Sequence[Batch] | Plan, world_size: int, deal: list[list[int]] | None = None) -> np.ndarray:
    """Each rank's estimated cost under assign_batches' deal (`deal`: that deal, already made);
    a rank with no batch has 0."""
    costs = _costs(batches)
    shares = deal if deal is not None else assign_batches(batches, world_size)
    return np.asarray([costs[np.asarray(share, np.int64)].sum() for share in shares])


def _largest_budget(sorted_lengths: np.ndarray, batches: int, upper: int) -> int:
    """The largest budget up to `upper` whose cut gives at least `batches` batches (at most one
    per example: a budget of 1 gives that). A larger budget never gives more batches (each batch
    reaches at least as far into the sorted order), so the budgets that do are 1 up to the answer."""
    count = lambda budget: len(_cut_by_tokens(sorted_lengths, budget)) - 1  # noqa: E731
    if count(upper) >= batches:
        return upper
    good, bad = 1, upper  # count(good) >= batches > count(bad)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if count(mid) >= batches else (good, mid)
    return good


def default_plan(lengths: Sequence[int], world_size: int, default: int, *, out_ratio: float = 1.0,
                 out_cap: int | None = None, beams: int = 1, step_overhead: float = 0.0,
                 out_floor: int = 0) -> tuple[int, Plan]:
    """The batch budget of a run given --budget_for_world_size (and neither --bs nor
    --max_tokens) on `world_size` ranks, and its plan. The rule, a pure function of the lengths, the world size and the device's defaults
    (`default` from DEFAULT_MAX_TOKENS, `step_overhead` from STEP_OVERHEAD):

    - one rank, or a set that gives every rank at least BATCHES_PER_RANK batches at `default`,
      takes `default`, the measured best for one device (on large sets nothing changes);
    - otherwise the candidates are `default` and, for k = 1 .. BATCHES_PER_RANK, the largest
      budget that gives at least k batches per rank (a batch per example, where there are fewer
      examples than that). Each is cut and dealt as the run would be
      (make_batches, assign_batches); its predicted wall time is the busiest rank's estimated
      cost. The budget is the largest candidate that gives a batch to as many ranks as any
      candidate does (every rank, when there are at least as many examples as ranks) and whose
      predicted wall time is within WALL_TOLERANCE of the lowest among those.

    On a CPU a step's fixed cost (STEP_OVERHEAD) is small beside its rows': smaller batches cost
    little and the rule evens the ranks out. On a GPU it is the cost of hundreds of rows, so the
    rule keeps batches as large as keeping every rank busy allows: one batch per rank where more,
    smaller ones would cost more in steps than the imbalance. The budget depends on the world
    size, which is why it is an option and not the default: the run records it (the manifest's
    "plan") and says so, and --max_tokens with that value gives the same batches at any world size."""
    lengths = _as_lengths(lengths)
    order = _length_order(lengths)
    sorted_lengths = lengths[order]

    def plan_for(budget: int) -> Plan:
        return _token_plan(order, sorted_lengths, budget, out_ratio, out_cap, beams, step_overhead, out_floor)

    first = plan_for(default)
    if world_size == 1 or len(first) >= BATCHES_PER_RANK * world_size:
        return default, first
    # k batches per rank, or a batch per example where there are fewer examples than that.
    budgets = sorted({_largest_budget(sorted_lengths, min(k * world_size, len(order)), default)
                      for k in range(1, BATCHES_PER_RANK + 1)} | {default}, reverse=True)
    plans = [(b, first if b == default else plan_for(b)) for b in budgets]
    loads = [rank_loads(plan, world_size) for _, plan in plans]
    busy = [int(np.count_nonzero(load)) for load in loads]
    walls = [float(load.max()) if len(load) else 0.0 for load in loads]
    lowest = min(w for w, b in zip(walls, busy) if b == max(busy))
    return next(p for p, w, b in zip(plans, walls, busy) if b == max(busy) and w <= WALL_TOLERANCE * lowest)


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
