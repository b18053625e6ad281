"""Planning is a pure function of (lengths, settings, world size): tested with no model."""

from __future__ import annotations

import hashlib
import random

import pytest

from seq2seq_eval.run.plan import (
    Batch, assign_batches, batch_budget, bound_costs, default_plan, estimate_cost, make_batches,
    padding_efficiency, plan_digest, sort_by_length,
)
from seq2seq_eval.run.split import MAX_BATCH_SHARE


def members(batches: list[Batch]) -> list[tuple[int, ...]]:
    return [b.members for b in batches]


def random_lengths(seed: int, n: int = 60) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 50) for _ in range(n)]


def batch(index: int, cost: float) -> Batch:
    return Batch(index=index, members=(index,), padded_len=1, cost=cost)


# ---------------------------------------------------------------- make_batches


def test_sort_longest_first_ties_by_position():
    assert sort_by_length([3, 1, 4, 1, 5]) == [4, 2, 0, 1, 3]
    assert sort_by_length([2, 2, 2]) == [0, 1, 2]
    assert sort_by_length([]) == []


@pytest.mark.parametrize(
    "lengths, bs, expected, padded",
    [
        ([3, 1, 4, 1, 5], 2, [(4, 2), (0, 1), (3,)], [5, 3, 1]),
        ([3, 1, 4, 1, 5], 5, [(4, 2, 0, 1, 3)], [5]),
        ([3, 1, 4, 1, 5], 9, [(4, 2, 0, 1, 3)], [5]),
        ([3, 1, 4, 1, 5], 1, [(4,), (2,), (0,), (1,), (3,)], [5, 4, 3, 1, 1]),
        ([7], 4, [(0,)], [7]),
        ([], 4, [], []),
    ],
)
def test_fixed_batch_size(lengths, bs, expected, padded):
    batches = make_batches(lengths, bs=bs)
    assert members(batches) == expected
    assert [b.padded_len for b in batches] == padded
    assert [b.index for b in batches] == list(range(len(expected)))


@pytest.mark.parametrize(
    "lengths, max_tokens, expected",
    [
        # 5 alone (2*5 > 8); 4+3 pad to 4: 2*4 = 8 fits exactly; the 1s pad to 1
        ([5, 4, 3, 1, 1], 8, [(0,), (1, 2), (3, 4)]),
        # 4+3 would pad to 8 > 7; 3+1 pads to 6; a third member would pad to 9
        ([5, 4, 3, 1, 1], 7, [(0,), (1,), (2, 3), (4,)]),
        ([5, 4, 3, 1, 1], 100, [(0, 1, 2, 3, 4)]),
        # an example longer than the budget still gets a batch of its own
        ([2, 20, 2], 10, [(1,), (0, 2)]),
        ([20, 30], 10, [(1,), (0,)]),
        ([4, 4, 4, 4], 8, [(0, 1), (2, 3)]),
    ],
)
def test_token_budget(lengths, max_tokens, expected):
    assert members(make_batches(lengths, max_tokens=max_tokens)) == expected


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", [{"bs": 7}, {"max_tokens": 120}, {"max_tokens": 30}])
def test_batch_invariants(seed, mode):
    lengths = random_lengths(seed)
    batches = make_batches(lengths, **mode)
    flat = [i for b in batches for i in b.members]
    assert sorted(flat) == list(range(len(lengths)))  # every example exactly once
    assert flat == sort_by_length(lengths)  # batches are consecutive runs of the sorted order
    for b in batches:
        assert b.padded_len == max(lengths[i] for i in b.members) == lengths[b.members[0]]
        if "max_tokens" in mode and len(b.members) > 1:
            assert b.padded_tokens <= mode["max_tokens"]
        if "bs" in mode:
            assert len(b.members) <= mode["bs"]
    assert [b.padded_len for b in batches] == sorted((b.padded_len for b in batches), reverse=True)
    assert make_batches(list(lengths), **mode) == batches  # deterministic


def test_budget_batches_are_full():
    """Greedy: a batch is closed only when the next example would break the budget."""
    lengths = random_lengths(7)
    batches = make_batches(lengths, max_tokens=60)
    for b, nxt in zip(batches, batches[1:]):
        assert (len(b.members) + 1) * b.padded_len > 60


# ---------------------------------------------------------------- issue 63: no batch too large a share of a small set

SHORT_TAIL = [64] * 16 + [4] * 256  # 16 long sources fill one batch of 1024 tokens; 256 short ones another
TRANSLATE = {"max_tokens": 1024, "out_cap": 64, "beams": 4}


def test_a_batch_of_many_short_sources_is_cut_by_what_it_can_cost():
    """The token cut gives [16, 256]; at the length limit the 256 short sources are 92% of what
    the set can cost (256 * 4 rows for up to 64 steps, against 16 * 4), while the estimate from
    the sources' lengths (4-token outputs) calls them the cheaper batch, which the deal then leaves
    to the end of a share. Hand-checked: bounds 6,144 and 67,584, a share of 73,728 / 16 = 4,608,
    so ceil(67584 * 16 / 73728) = 15 pieces of 256 * j // 15; the long batch (2 pieces by cost)
    keeps its 16 members: pieces keep 64 rows, 16 examples at 4 beams."""
    plan = make_batches(SHORT_TAIL, **TRANSLATE)
    assert plan.sizes.tolist() == [16] + [17] * 14 + [18]
    first = make_batches(SHORT_TAIL, max_tokens=1024, out_cap=64, beams=4, step_overhead=900.0)
    assert first.sizes.tolist() == [16, 256]  # a GPU's step costs 3,600 rows at 4 beams: no piece is worth it
    bound = bound_costs(first.padded, first.bounds, 1.0, 64, 4, 0.0)
    assert bound.tolist() == [16 * 64 + 16 * 4 * 64 * (1 + 64 / 256), 256 * 4 + 256 * 4 * 64 * (1 + 4 / 256)]
    assert first.cost[1] < first.cost[0]  # the estimate: the short sources look cheap


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beams", [1, 4])
def test_split_pieces_keep_the_cut_s_order_and_their_share(seed, beams):
    """Every piece is a consecutive run of the length order inside one batch of the token cut,
    at most 1/MAX_BATCH_SHARE of the set's bound cost unless it is at the row floor, and at
    least 64 rows; the cut and the split do not depend on the world size (they do not take it)."""
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(2, 8), rng.randint(20, 90)]) for _ in range(600)]
    plan = make_batches(lengths, max_tokens=1024, out_cap=64, beams=beams)
    cut = make_batches(lengths, max_tokens=1024, out_cap=64, beams=beams, step_overhead=10**6)  # no piece worth it
    flat = [i for b in plan for i in b.members]
    assert flat == [i for b in cut for i in b.members] == sort_by_length(lengths)
    assert set(cut.bounds.tolist()) <= set(plan.bounds.tolist())  # pieces of the cut's batches, never across them
    assert len(plan) > len(cut)  # short sources at 1024 tokens: some batches are split
    share = bound_costs(cut.padded, cut.bounds, 1.0, 64, beams, 0.0).sum() / MAX_BATCH_SHARE
    bound = bound_costs(plan.padded, plan.bounds, 1.0, 64, beams, 0.0)
    least = -(-64 // beams)
    whole = {tuple(b.members) for b in cut}
    for b, cost in zip(plan, bound):
        assert len(b.members) >= least or tuple(b.members) in whole  # a piece keeps 64 rows
        # Within its share (up to one example's rounding), unless too small to cut in two.
        assert cost <= share + cost / len(b.members) or len(b.members) < 2 * least
        assert b.padded_tokens <= 1024 and b.padded_len == lengths[b.members[0]]


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_is_never_below_the_estimate(seed):
    """bound_costs charges every output the length limit, which no estimate of the deal exceeds
    (out_ratio, out_floor, the step cost: each only moves the estimate below or up to it); without
    a limit it is the estimate."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(400)]
    for ratio, cap, floor, overhead in [(1.0, 64, 0, 16.0), (0.25, 142, 56, 0.0), (2.0, 20, 20, 900.0), (1.0, 8, 30, 16.0)]:
        plan = make_batches(lengths, bs=7, out_ratio=ratio, out_cap=cap, beams=4, step_overhead=overhead, out_floor=floor)
        bound = bound_costs(plan.padded, plan.bounds, ratio, cap, 4, overhead, floor)
        assert (bound >= plan.cost).all()
        if cap == 64:  # sources shorter than the limit: their estimate is below it
            assert (bound > plan.cost).any()
        unbounded = make_batches(lengths, bs=7, out_ratio=ratio, beams=4, step_overhead=overhead, out_floor=floor)
        assert bound_costs(unbounded.padded, unbounded.bounds, ratio, None, 4, overhead, floor).tolist() == unbounded.cost.tolist()


def test_a_set_of_many_batches_is_not_split():
    """A set whose batches are all below their share at its budget (2,000 sentences of 10 to
    50 tokens) keeps the token cut."""
    lengths = [n + 9 for n in random_lengths(5, n=2000) if n <= 41]
    plan = make_batches(lengths, max_tokens=1024, out_cap=64, beams=4)
    assert (plan.sizes * plan.padded <= 1024).all()
    assert all((len(b.members) + 1) * b.padded_len > 1024 for b in plan[:-1])  # every batch full: no piece cut


def test_a_given_batch_size_is_never_split():
    assert make_batches(SHORT_TAIL, bs=256, out_cap=64, beams=4).sizes.tolist() == [256, 16]


def test_exactly_one_of_bs_and_max_tokens():
    with pytest.raises(ValueError, match="exactly one"):
        make_batches([1, 2], bs=2, max_tokens=10)
    with pytest.raises(ValueError, match="exactly one"):
        make_batches([1, 2])


def test_cost_estimate_hand_checked():
    # encoder 2*256 = 512; decoder 2 rows * 4 beams * 10 steps * (1 + 256/256) = 160
    assert estimate_cost(2, 256, 10, 4) == 672
    assert estimate_cost(1, 0, 0, 1) == 0
    b = make_batches([256, 256], bs=2, out_ratio=0.5, out_cap=10, beams=4)[0]
    assert b.cost == 672  # out_len = min(256 * 0.5, 10)


def test_an_output_floor_raises_the_estimate_of_short_sources_only():
    """min_new_tokens (out_floor): an output is at least that long, so a batch of short sources
    costs what its floor says; longer ones, already estimated above it, do not change."""
    assert make_batches([4, 4], bs=2, out_floor=10)[0].cost == estimate_cost(2, 4, 10, 1)
    assert make_batches([4, 4], bs=2, out_floor=3)[0].cost == make_batches([4, 4], bs=2)[0].cost
    lengths = [40, 40, 3, 3, 3, 3, 3, 3, 3, 3]
    plain = make_batches(lengths, max_tokens=80, out_cap=64)
    floored = make_batches(lengths, max_tokens=80, out_cap=64, out_floor=64)
    assert plain.bounds.tolist() == floored.bounds.tolist() == [0, 2, 10]  # the same batches: only the estimate moves
    assert plain.cost[0] > plain.cost[1]  # by source length, the 2 long sources look costlier ...
    assert floored.cost[0] < floored.cost[1]  # ... and 8 outputs of 64 tokens outweigh 2 of 64: the deal flips
    assert assign_batches(plain, 2) != assign_batches(floored, 2)
    budget, plan = default_plan(lengths, 2, 40, out_cap=64, out_floor=64, step_overhead=16)
    assert plan.cost.tolist() == make_batches(lengths, max_tokens=budget, out_cap=64, out_floor=64,
                                              step_overhead=16).cost.tolist()


def test_costlier_batches_for_longer_sources():
    costs = [b.cost for b in make_batches(random_lengths(3), bs=4, beams=2)]
    assert costs == sorted(costs, reverse=True)


# ---------------------------------------------------------------- world size and ranks


def test_batches_do_not_depend_on_world_size():
    """The global plan is cut before ranks exist; ranks only receive whole batches of it."""
    lengths = random_lengths(11, n=23)
    batches = make_batches(lengths, bs=4)
    for world_size in (1, 2, 3, 5, 8):
        deal = assign_batches(batches, world_size)
        dealt = sorted(i for rank in deal for i in rank)
        assert dealt == list(range(len(batches)))
        assert sorted(i for rank in deal for b in rank for i in batches[b].members) == list(range(23))


@pytest.mark.parametrize(
    "costs, world_size, expected",
    [
        # 5 -> r0; 4 -> r1; 3 -> r1 (4 < 5); 3 -> r0 (5 < 7); 2 -> r1 (7 < 8): loads 8 and 9
        ([5, 4, 3, 3, 2], 2, [[0, 3], [1, 2, 4]]),
        # equal costs and loads: lower batch index first, to the lower rank
        ([1, 1, 1, 1], 2, [[0, 2], [1, 3]]),
        # costliest first, whatever the batch index
        ([1, 9, 4], 2, [[1], [2, 0]]),
        ([1, 9, 4], 1, [[1, 2, 0]]),
        # more ranks than batches: the others stay empty (and still write a rank file)
        ([2, 1], 4, [[0], [1], [], []]),
        ([], 2, [[], []]),
    ],
)
def test_assign_batches_hand_checked(costs, world_size, expected):
    batches = [batch(i, c) for i, c in enumerate(costs)]
    assert assign_batches(batches, world_size) == expected


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_assign_batches_balanced(seed, world_size):
    batches = make_batches(random_lengths(seed, n=80), bs=3, beams=4)
    deal = assign_batches(batches, world_size)
    assert sorted(i for rank in deal for i in rank) == [b.index for b in batches]
    loads = [sum(batches[i].cost for i in rank) for rank in deal]
    # LPT: the fullest rank took its last batch while it was the emptiest one
    assert max(loads) - min(loads) <= max(b.cost for b in batches)
    for rank in deal:  # each rank runs its costliest batches first
        assert [batches[i].cost for i in rank] == sorted((batches[i].cost for i in rank), reverse=True)
    assert assign_batches(list(batches), world_size) == deal


def test_assign_batches_rejects_no_ranks():
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        assign_batches([batch(0, 1.0)], 0)


# ---------------------------------------------------------------- digest and padding


def test_plan_digest_is_sha256_of_compact_member_lists():
    batches = make_batches([3, 1, 4, 1, 5], bs=2)
    assert plan_digest(batches) == hashlib.sha256(b"[[4,2],[0,1],[3]]").hexdigest()


def test_plan_digest_depends_on_members_only():
    batches = make_batches([3, 1, 4, 1, 5], bs=2)
    recosted = [Batch(b.index, b.members, b.padded_len * 2, b.cost + 1) for b in batches]
    assert plan_digest(recosted) == plan_digest(batches)
    assert plan_digest(make_batches([3, 1, 4, 1, 5], bs=2, beams=5)) == plan_digest(batches)
    assert plan_digest(make_batches([3, 1, 4, 1, 5], bs=3)) != plan_digest(batches)
    assert plan_digest(make_batches([1, 3, 4, 1, 5], bs=2)) != plan_digest(batches)


@pytest.mark.parametrize(
    "lengths, mode, expected",
    [
        # [5,4] pads to 10, [3,1] to 6, [1] to 1: 14 real tokens of 17
        ([5, 4, 3, 1, 1], {"bs": 2}, 14 / 17),
        ([5, 4, 3, 1, 1], {"bs": 1}, 1.0),
        ([5, 4, 3, 1, 1], {"bs": 5}, 14 / 25),
        ([4, 4, 4], {"bs": 3}, 1.0),
        # [5] 5, [4,3] 8, [1,1] 2
        ([5, 4, 3, 1, 1], {"max_tokens": 8}, 14 / 15),
        ([], {"bs": 2}, 1.0),
    ],
)
def test_padding_efficiency_hand_checked(lengths, mode, expected):
    assert padding_efficiency(make_batches(lengths, **mode), lengths) == pytest.approx(expected)


@pytest.mark.parametrize("bs, max_tokens, device, engine, half, expected", [
    (None, None, "cpu", "hf", False, (None, 1024)),  # the measured best per engine and device
    (None, None, "cpu", "ctranslate2", False, (None, 2048)),
    (None, None, "cuda", "hf", False, (None, 32768)),
    (None, None, "cuda", "ctranslate2", False, (None, 65536)),
    (None, None, "cuda", "hf", True, (None, 65536)),  # fp16/bf16 peak later (docs/gpu.md, H200)
    (None, None, "cpu", "hf", True, (None, 1024)),  # not measured on CPU: fp32's
    (None, None, "cuda", "ctranslate2", True, (None, 65536)),
    (None, None, "mps", "hf", False, (None, 1024)),  # an unlisted device takes the CPU's
    (8, None, "cpu", "ctranslate2", False, (8, None)),  # a flag given wins
    (8, None, "cuda", "hf", True, (8, None)),
    (None, 300, "cuda", "hf", True, (None, 300)),
    (8, 300, "cpu", "hf", False, (None, 300)),  # both given: the token budget wins
])
def test_batch_budget(bs, max_tokens, device, engine, half, expected):
    assert batch_budget(bs, max_tokens, device, engine, half=half) == expected


@pytest.mark.parametrize("bs, max_tokens, device, engine, beams, expected", [
    (None, None, "cpu", "hf", 1, (None, 4096)),  # a decoder-only model's measured best, greedy
    (None, None, "cpu", "ctranslate2", 1, (None, 8192)),
    (None, None, "cpu", "hf", 4, (None, 1024)),  # the same rows a batch with beams
    (None, None, "cpu", "ctranslate2", 3, (None, 2730)),
    (None, None, "cuda", "hf", 1, (None, 32768)),  # not measured on a GPU: the encoder-decoder's
    (None, None, "cuda", "ctranslate2", 4, (None, 65536)),
    (None, None, "mps", "hf", 2, (None, 2048)),  # an unlisted device takes the CPU's
    (8, None, "cpu", "hf", 1, (8, None)),  # a flag given wins
    (None, 300, "cpu", "ctranslate2", 4, (None, 300)),
])
def test_batch_budget_of_a_decoder_only_model(bs, max_tokens, device, engine, beams, expected):
    assert batch_budget(bs, max_tokens, device, engine, causal=True, beams=beams) == expected
