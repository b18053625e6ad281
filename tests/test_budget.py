"""The batch budget. By default the device's, at any world size: through real ranks, 1, 2 and 3
ranks give the same bytes for translation, summarization and pseudolabels. --budget_for_world_size
(run/plan.py, default_plan): a pure function of the lengths, the world size and the device's
defaults, tested with no model over a grid of set sizes (300 to 10^6), world sizes (1 to 64) and
every device default; then, through real ranks, that it is recorded and said, that its recorded
budget gives the same bytes at other world sizes and that --resume (or a torchrun restart)
under another world size takes it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_ok, make_corpus, run_ranks, single, write_legacy
from realdata import WMT17

from seq2seq_eval.run.plan import (
    BATCHES_PER_RANK, DEFAULT_MAX_TOKENS, STEP_OVERHEAD, WALL_TOLERANCE, assign_batches, default_plan,
    make_batches, rank_loads, step_overhead,
)
from seq2seq_eval.run.tmpdir import recorded_budget

REPO = Path(__file__).resolve().parent.parent

# Every device default: (budget, step overhead) of each engine, precision and device type.
DEVICES = {
    f"{key} {device}": (DEFAULT_MAX_TOKENS[key][device], STEP_OVERHEAD[key][device])
    for key in ("hf", "ctranslate2", "hf_half") for device in ("cpu", "cuda")
}
WORLDS = (1, 2, 3, 4, 8, 16, 32, 64)
TRANSLATION = {"out_ratio": 1.0, "out_cap": 120, "beams": 4}  # the embedded model's translation settings
SUMMARIZATION = {"out_ratio": 0.25, "out_cap": 142, "beams": 4}


def newstest_lengths() -> np.ndarray | None:
    """newstest2017's German side tokenized as the tool does (the embedded tokenizer, its task
    prefix, the end token), when ../shared/realdata is there."""
    path = WMT17 / "newstest2017-ende-ref.de.txt"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    from realdata import read_lines

    tok = Tokenizer.from_file(str(REPO / "data_samples" / "model" / "tokenizer.json"))
    return np.asarray([len(e.ids) for e in tok.encode_batch(["translate: " + s for s in read_lines(path)])], np.int32)


def synthetic(shape: str, n: int, seed: int = 0) -> np.ndarray:
    """Source lengths shaped like real test sets (log-normal): news sentences under the embedded
    tokenizer (newstest2017's mean 70.8 tokens), the same under a subword vocabulary (mean about
    30), news articles truncated at 1,024 tokens (CNN/DailyMail-like) and short prompts."""
    mu, sigma = {"news": (4.15, 0.5), "subword": (3.3, 0.55), "articles": (6.4, 0.45), "short": (2.3, 0.4)}[shape]
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(mu, sigma, n)), 2, 1024).astype(np.int32)


def sets() -> list[tuple[str, np.ndarray, dict]]:
    """Each shape at 300 to 10^5 examples (articles to 10^4: CNN/DailyMail's test set has 11,490),
    longest first: the budget depends on the lengths only, and sorted they sort in linear time."""
    real = newstest_lengths()
    out = []
    for n in (300, 1_000, 3_004, 10_000, 100_000):
        # The real lengths where there: all of newstest2017 at its own size, resampled at others.
        news = synthetic("news", n) if real is None else (
            real if n == len(real) else real[np.random.default_rng(n).integers(0, len(real), n)])
        out += [(f"news {n}", news, TRANSLATION), (f"subword {n}", synthetic("subword", n), TRANSLATION),
                (f"short {n}", synthetic("short", n), TRANSLATION)]
        if n <= 10_000:
            out.append((f"articles {n}", synthetic("articles", n), SUMMARIZATION))
    return [(name, np.sort(lengths)[::-1].copy(), cost) for name, lengths, cost in out]


def candidates(lengths: np.ndarray, world: int, default: int) -> list[int]:
    """The rule's candidates, found again here by bisection on the token cut's batch count (it
    only falls as the budget grows; counted before make_batches splits the costliest batches,
    which the candidates do not depend on): `default`, and for k = 1 .. BATCHES_PER_RANK the
    largest budget up to it that gives at least k batches per rank, or a batch per example."""

    def count(budget: int) -> int:  # lengths sorted longest first: each batch takes budget // its first
        batches = start = 0
        while start < len(lengths):
            batches += 1
            start = len(lengths) if lengths[start] == 0 else start + max(1, budget // int(lengths[start]))
        return batches

    found = {default}
    for k in range(1, BATCHES_PER_RANK + 1):
        need = min(k * world, len(lengths))  # a batch per example at most
        lo, hi = 1, default + 1  # count(lo) >= need; hi: the first that falls short (or past the range)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if count(mid) >= need else (lo, mid)
        found.add(lo)
    return sorted(found, reverse=True)


def wall(lengths: np.ndarray, budget: int, world: int, cost: dict, overhead: float) -> tuple[float, int]:
    """(predicted wall time, ranks with a batch) of a budget, as assign_batches deals it."""
    loads = rank_loads(make_batches(lengths, max_tokens=budget, step_overhead=overhead, **cost), world)
    return float(loads.max()), int(np.count_nonzero(loads))


@pytest.mark.parametrize("name, lengths, cost", sets(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_default_budget_keeps_every_rank_busy_at_the_lowest_predicted_wall_time(name, lengths, cost):
    """For each device default and world size: every rank gets a batch when there are as many
    examples as ranks; the predicted wall time (busiest rank's estimated cost) is never above
    the old default's (the device default at every world size) and within WALL_TOLERANCE of the
    lowest of the rule's candidates, found here independently (for sets up to 10^4; above, the
    default was already large enough or the search is the same); one rank, or a set that gives
    every rank BATCHES_PER_RANK batches, keeps the device default; on CPU, with at least 200
    examples per rank, the predicted max/mean load is at most 1.10."""
    for device, (default, overhead) in DEVICES.items():
        for world in WORLDS:
            budget, plan = default_plan(lengths, world, default, step_overhead=overhead, **cost)
            where = f"{name}, {device}, {world} ranks: --max_tokens {budget}"
            assert plan == make_batches(lengths, max_tokens=budget, step_overhead=overhead, **cost), where
            assert 1 <= budget <= default, where
            first = make_batches(lengths, max_tokens=default, step_overhead=overhead, **cost)
            if world == 1 or len(first) >= BATCHES_PER_RANK * world:
                assert budget == default, where
                continue
            loads = rank_loads(plan, world)
            assert np.count_nonzero(loads) == min(world, len(lengths)), where
            old_wall, _ = wall(lengths, default, world, cost, overhead)
            assert loads.max() <= old_wall * (1 + 1e-12), where
            if device.endswith("cpu") and len(lengths) >= 200 * world:
                assert loads.max() / loads.mean() <= 1.10, where
            if len(lengths) <= 10_000:
                tried = {b: wall(lengths, b, world, cost, overhead) for b in candidates(lengths, world, default)}
                most_busy = max(busy for _, busy in tried.values())
                lowest = min(w for w, busy in tried.values() if busy == most_busy)
                expected = max(b for b, (w, busy) in tried.items() if busy == most_busy and w <= WALL_TOLERANCE * lowest)
                assert budget == expected, (where, tried)


def test_a_million_examples_keep_the_device_default_in_one_cut():
    """A large set keeps every rank busy and even at the device's default: nothing to lower."""
    lengths = np.sort(synthetic("subword", 1_000_000))[::-1].copy()
    for device, (default, overhead) in DEVICES.items():
        for world in (1, 8, 64):
            assert default_plan(lengths, world, default, step_overhead=overhead, **TRANSLATION)[0] == default, (device, world)


@pytest.mark.parametrize("lengths, world, default, overhead, expected, batches", [
    # Eight examples of 10 tokens, 2 ranks, a budget of 80 (one batch of all 8). Candidates: 80; 79
    # (the largest with 2 batches: 7 + 1); 29 (4 batches of 2); 19 (a batch each). Without a step
    # cost 29 and 19 both load each rank with 4 examples, the lowest: the larger, 29, is taken.
    ([10] * 8, 2, 80, 0.0, 29, [2, 2, 2, 2]),
    # With a step cost far above a row's, every batch costs about its 10 steps: 7 + 1 on two
    # ranks is one batch each, the lowest wall time (a batch of 2 per rank would be two).
    ([10] * 8, 2, 80, 1000.0, 79, [7, 1]),
    # One rank: the default, whatever it leaves to do.
    ([10] * 8, 1, 80, 0.0, 80, [8]),
    # Enough batches at the default for every rank: kept.
    ([10] * 64, 2, 20, 0.0, 20, [2] * 32),
    # Fewer examples than ranks: a batch each, the most ranks that can work; 17 is the largest
    # such budget (at 18 the 9 and the 8 share a batch: 2 x 9 <= 18).
    ([10, 9, 8], 5, 80, 0.0, 17, [1, 1, 1]),
])
def test_default_budget_hand_checked(lengths, world, default, overhead, expected, batches):
    budget, plan = default_plan(lengths, world, default, out_cap=None, beams=1, step_overhead=overhead)
    assert (budget, plan.sizes.tolist()) == (expected, batches)


@pytest.mark.parametrize("device, engine, half, expected", [
    ("cpu", "hf", False, STEP_OVERHEAD["hf"]["cpu"]),
    ("cuda", "hf", False, STEP_OVERHEAD["hf"]["cuda"]),
    ("cuda", "hf", True, STEP_OVERHEAD["hf_half"]["cuda"]),
    ("cuda", "ctranslate2", True, STEP_OVERHEAD["ctranslate2"]["cuda"]),  # --fp16 is the HF engine's
    ("mps", "hf", False, STEP_OVERHEAD["hf"]["cpu"]),  # an unlisted device takes the CPU's, as its budget does
])
def test_step_overhead(device, engine, half, expected):
    assert step_overhead(device, engine, half) == expected


def test_the_step_cost_changes_the_estimate_not_the_batches():
    """Each batch pays the step cost once per decoder step it is estimated to run (its padded
    length here: out_ratio 1, no cap); the batches themselves do not move."""
    lengths = synthetic("news", 500)
    plain, costed = make_batches(lengths, max_tokens=2048), make_batches(lengths, max_tokens=2048, step_overhead=900.0)
    assert [b.members for b in plain] == [b.members for b in costed]
    assert np.allclose(costed.cost - plain.cost, 900.0 * plain.padded)


# ---------------------------------------------------------------- the recorded budget on resume


def _manifest(tmp_path: Path, plan: object, journal: bytes = b'{"batch": 0}\n') -> Path:
    (tmp_path / "manifest.json").write_text(json.dumps({"model": {}, "data": {}, "generation": {}, "plan": plan}))
    (tmp_path / "journal_rank_0.jsonl").write_bytes(journal)
    return tmp_path


@pytest.mark.parametrize("plan, journal, expected", [
    ({"bs": None, "max_tokens": 447, "sha256": "x"}, b'{"batch": 0}\n', (None, 447)),
    ({"bs": 8, "max_tokens": None, "sha256": "x"}, b'{"batch": 0}\n', (8, None)),
    ({"bs": None, "max_tokens": 447, "sha256": "x"}, b"", None),  # nothing journaled: nothing to resume
    ({"bs": 8, "max_tokens": 447}, b'{"batch": 0}\n', None),  # not a budget the tool records
    ({"bs": None, "max_tokens": "447"}, b'{"batch": 0}\n', None),
    ({"bs": None, "max_tokens": 0}, b'{"batch": 0}\n', None),
    ({"bs": True, "max_tokens": None}, b'{"batch": 0}\n', None),
    ("not a plan", b'{"batch": 0}\n', None),
])
def test_recorded_budget(tmp_path, plan, journal, expected):
    assert recorded_budget(_manifest(tmp_path, plan, journal)) == expected


def test_recorded_budget_of_a_missing_or_broken_manifest(tmp_path):
    assert recorded_budget(tmp_path) is None
    (tmp_path / "journal_rank_0.jsonl").write_bytes(b'{"batch": 0}\n')
    assert recorded_budget(tmp_path) is None  # journals, no manifest: check_tmp_dir says so
    (tmp_path / "manifest.json").write_text("{not json")
    assert recorded_budget(tmp_path) is None


# ---------------------------------------------------------------- real ranks


def outputs(save: Path) -> dict[str, bytes]:
    """Every output file but those holding timings and dates (the run info, a metric file)."""
    return {p.name: p.read_bytes() for p in sorted(save.iterdir())
            if p.is_file() and not p.name.endswith(("_run_info.json", "_bleu.json", "_rouge.json"))
            and not p.name.startswith(".")}


def record(save: Path) -> dict:
    """The run info, or a scored run's metric file."""
    name = next(p for p in ("test_run_info.json", "test_bleu.json", "test_rouge.json") if (save / p).exists())
    return json.loads((save / name).read_text())


def run_info(save: Path) -> dict:
    return json.loads((save / "test_run_info.json").read_text())


def plan_of(save: Path) -> dict:
    return record(save)["provenance"]["plan"]


KINDS = {
    "translation": ["--task", "translation"],
    "summarization": ["--task", "summarization"],
    "pseudolabels": ["--num_beams", "2", "--num_return_sequences", "2", "--pseudo_target"],
}


@pytest.fixture(scope="module")
def defaults(tiny_model, data23, tmp_path_factory):
    """23 examples (one batch at the CPU's default) of each kind on 1, 2 and 3 ranks, no budget flag."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("defaults")

    def run(kind: str, n: int):
        save = root / f"{kind}{n}"
        args = ["--model_name", str(tiny_model), "--data_dir", str(data23), *KINDS[kind], "--save_dir", str(save)]
        return save, single(args, cwd=root) if n == 1 else run_ranks(n, args, cwd=root)

    # Two at a time: each run is mostly starting up and waiting for its ranks, on 2 cores.
    with ThreadPoolExecutor(2) as pool:
        out = dict(zip([(k, n) for k in KINDS for n in (1, 2, 3)],
                       pool.map(lambda job: run(*job), [(k, n) for k in KINDS for n in (1, 2, 3)])))
    for save, proc in out.values():
        assert_ok(proc)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_defaults_give_the_same_bytes_at_1_2_and_3_ranks(defaults, kind):
    """No budget flag: the device's budget at every world size, recorded as the default, and every
    output file the same bytes (pseudolabel beam scores included); a third rank with no batch
    costs seconds, and the run says what would keep it busy and what that costs."""
    default = DEFAULT_MAX_TOKENS["hf"]["cpu"]
    files = {n: outputs(defaults[kind, n][0]) for n in (1, 2, 3)}
    assert files[1] and files[1] == files[2] == files[3], kind
    plans = [plan_of(defaults[kind, n][0]) for n in (1, 2, 3)]
    assert all(p == {**plans[0]} for p in plans), plans
    assert plans[0]["budget"] == {"from": "default", "device_default": default} and plans[0]["max_tokens"] == default
    assert [record(defaults[kind, n][0])["provenance"]["config"]["budget_for_world_size"] for n in (1, 2, 3)] == [False] * 3
    assert "--budget_for_world_size:" not in defaults[kind, 3][1].stderr  # nothing depends on the layout
    idle = [line for line in defaults[kind, 3][1].stderr.splitlines() if "ranks get no batch" in line]
    assert len(idle) == 1 and idle[0].endswith(
        "2 of 3 ranks get no batch (1 batches at --max_tokens 1024); run it on fewer ranks, or give "
        "--budget_for_world_size to cut it finer (outputs then depend on the world size in their last bits)")


def test_a_split_batch_gives_the_same_bytes_at_1_and_3_ranks(tiny_model, tmp_path):
    """64 sources of at most 40 tokens fit one batch of --max_tokens 4000; at 4 beams the plan
    splits it (split.split_costly: 4 pieces of 16 examples, 64 rows each), which the metric
    file's per-rank batch counts show; every output file is the same bytes at 1 and 3 ranks
    (pseudolabel beam scores included): the pieces are cut before any rank exists."""
    from concurrent.futures import ThreadPoolExecutor

    src, tgt = make_corpus(64, seed=63)
    data = write_legacy(tmp_path / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--num_beams", "4", "--max_tokens", "4000",
            "--max_new_tokens", "12", "--pseudo_target", "--num_return_sequences", "2"]

    def run(n: int) -> Path:
        save = tmp_path / f"w{n}"
        assert_ok(single([*args, "--save_dir", str(save)], cwd=tmp_path) if n == 1 else
                  run_ranks(n, [*args, "--save_dir", str(save)], cwd=tmp_path))
        return save

    with ThreadPoolExecutor(2) as pool:  # each run is mostly starting up, on 2 cores
        saves = dict(zip((1, 3), pool.map(run, (1, 3))))
    assert {n: sum(r["batches"] for r in record(save)["throughput"]["per_rank"]) for n, save in saves.items()} == {1: 4, 3: 4}
    assert outputs(saves[1]) and outputs(saves[1]) == outputs(saves[3])


@pytest.fixture(scope="module")
def adapted_at_3(tiny_model, tmp_path_factory):
    """41 examples (2 batches at the CPU default) on 3 ranks with --budget_for_world_size, temp dir kept."""
    root = tmp_path_factory.mktemp("budget")
    src, tgt = make_corpus(41, seed=45)
    data = write_legacy(root / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--num_beams", "2", "--pseudo_target",
            "--num_return_sequences", "2"]
    save = root / "w3"
    proc = run_ranks(3, [*args, "--budget_for_world_size", "--save_dir", str(save), "--debug"], cwd=root)
    assert_ok(proc)
    return root, args, save, proc


def test_the_option_lowers_the_budget_says_so_and_records_it(adapted_at_3):
    """--budget_for_world_size gives the adaptive budget (default_plan for 3 ranks), recorded in
    the provenance (how, and the option in the config) and said at run time, once; pinned with
    --max_tokens, that budget gives the same bytes on 1 rank."""
    root, args, save, proc = adapted_at_3
    plan = plan_of(save)
    default = DEFAULT_MAX_TOKENS["hf"]["cpu"]
    assert plan["budget"] == {"from": "--budget_for_world_size", "device_default": default, "world_size": 3}
    assert plan["bs"] is None and plan["max_tokens"] < default  # lowered: 2 batches would leave a rank idle
    assert run_info(save)["provenance"]["config"]["budget_for_world_size"] is True
    said = [line for line in proc.stderr.splitlines() if "--budget_for_world_size: " in line]
    assert len(said) == 1 and said[0].endswith(
        f"--budget_for_world_size: --max_tokens {plan['max_tokens']} for 3 ranks (the device's default is {default}): "
        f"beam scores and near ties may differ in their last bits at another world size; give --max_tokens "
        f"{plan['max_tokens']} for these bytes at any")
    other = root / "pinned1"
    assert_ok(single([*args, "--max_tokens", str(plan["max_tokens"]), "--save_dir", str(other), "--debug"], cwd=root))
    assert outputs(other) == outputs(save)
    assert {k: v for k, v in plan_of(other).items() if k != "budget"} == {k: v for k, v in plan.items() if k != "budget"}
    assert plan_of(other)["budget"] == {"from": "--max_tokens"}
    assert outputs(save)["test_generations.txt"].count(b"\n") == 41


def test_the_option_on_one_rank_keeps_the_device_default(adapted_at_3):
    root, args, _, _ = adapted_at_3
    dry = single([*args, "--budget_for_world_size", "--save_dir", str(root / "one"), "--dry_run"], cwd=root)
    assert_ok(dry)
    assert "(--max_tokens 1024: the device's default, kept by --budget_for_world_size for 1 ranks)" in dry.stdout


def test_the_option_in_the_legacy_form_takes_the_default_not_run_eval_s_bs(adapted_at_3):
    """run_eval.py's form gives --bs 8 by default; the option asks for the default budget instead."""
    root, _, _, _ = adapted_at_3
    data = root / "data"
    legacy = single([str(REPO / "data_samples" / "model"), str(data / "test.source"), str(root / "legacy.txt"),
                     "--budget_for_world_size", "--dry_run"], cwd=root, env=world(3))
    assert_ok(legacy)
    assert "lowered by --budget_for_world_size for 3 ranks from the device's 1024" in legacy.stdout
    given = single([str(REPO / "data_samples" / "model"), str(data / "test.source"), str(root / "legacy.txt"),
                    "--budget_for_world_size", "--bs", "4", "--dry_run"], cwd=root)
    assert given.returncode != 0 and given.stderr.strip().splitlines()[-1].endswith(
        "--budget_for_world_size adapts the default batch budget, and --bs 4 gives one; pass only one of them")


@pytest.mark.parametrize("flags", [["--max_tokens", "60"], ["--bs", "4"]])
def test_the_option_with_a_given_budget_is_refused_in_one_line(flags, tmp_path):
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^--budget_for_world_size adapts the default batch budget, and "
                                          rf"{flags[0]} {flags[1]} gives one; pass only one of them$"):
        EvalConfig(budget_for_world_size=True, **{flags[0][2:]: int(flags[1])})


def test_resume_and_restart_at_other_world_sizes_take_the_recorded_budget(adapted_at_3):
    """The 3-rank run's journals resumed on 1 rank with no budget flag, then the temp dir
    restarted by torchrun on 2 ranks: both take the recorded budget, reuse every batch and
    write the same bytes. The default (the device's) would have planned other batches and been
    refused as a different plan."""
    root, args, save, _ = adapted_at_3
    plan = plan_of(save)
    dry = single([*args, "--save_dir", str(save), "--resume", "--dry_run"], cwd=root)
    assert_ok(dry)
    assert f"(--max_tokens {plan['max_tokens']}: the budget of the run being resumed)" in dry.stdout
    expected = outputs(save)
    for n, extra, env in ((1, ["--resume"], None), (2, [], {"TORCHELASTIC_RESTART_COUNT": "1"})):
        proc = single([*args, *extra, "--save_dir", str(save), "--debug"], cwd=root) if n == 1 else \
            run_ranks(n, [*args, *extra, "--save_dir", str(save), "--debug"], cwd=root, env=env)
        assert_ok(proc)
        info = run_info(save)
        assert info["provenance"]["plan"] == {**{k: v for k, v in plan.items() if k != "budget"}, "budget": {"from": "resumed"}}
        per_rank = info["throughput"]["per_rank"]
        assert sum(r["resumed_batches"] for r in per_rank) == sum(r["batches"] for r in per_rank) > 1, n
        assert outputs(save) == expected, n


def test_resuming_with_another_budget_is_refused_naming_the_recorded_one(adapted_at_3):
    root, args, save, _ = adapted_at_3
    budget = plan_of(save)["max_tokens"]
    proc = single([*args, "--max_tokens", str(budget + 1), "--save_dir", str(save), "--resume", "--dry_run"], cwd=root)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"seq2seq_eval: error: --resume: {save}_tmp belongs to a run with different plan (its batches were cut with "
        f"--max_tokens {budget}); rerun with the same settings, or remove {save}_tmp to start over")


def world(n: int) -> dict[str, str]:
    """A dry run planned for n ranks, as run_eval.sh starts it (one process that joins no group)."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n)}


def test_the_dry_run_prints_each_rank_s_load_and_warns_of_idle_ranks(adapted_at_3):
    root, args, _, _ = adapted_at_3
    default = single([*args, "--save_dir", str(root / "d0"), "--dry_run"], cwd=root, env=world(3))
    assert_ok(default)
    lines = default.stdout.splitlines()
    assert "(--max_tokens 1024: the device's default)" in lines[0]
    assert [line for line in lines if line.startswith("WARNING")] == [
        "WARNING: 1 of 3 ranks get no batch (2 batches at --max_tokens 1024); run it on fewer ranks, or give "
        "--budget_for_world_size to cut it finer (outputs then depend on the world size in their last bits)"]
    lowered = single([*args, "--budget_for_world_size", "--save_dir", str(root / "d1"), "--dry_run"], cwd=root,
                     env=world(3))
    assert_ok(lowered)
    lines = lowered.stdout.splitlines()
    assert "lowered by --budget_for_world_size for 3 ranks from the device's 1024; give --max_tokens" in lines[0]
    ranks = [line for line in lines if line.startswith("rank ")]
    assert len(ranks) == 3 and all("of the mean)" in line and not line.startswith("rank 0: 0 batches") for line in ranks)
    assert any(line.startswith("predicted load (estimated cost): max/mean ") for line in lines)
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: --budget_for_world_size: --max_tokens ")
    pinned = single([*args, "--max_tokens", "100000", "--save_dir", str(root / "d2"), "--dry_run"], cwd=root,
                    env=world(5))
    assert_ok(pinned)
    warnings = [line for line in pinned.stdout.splitlines() if line.startswith("WARNING")]
    assert warnings == ["WARNING: 4 of 5 ranks get no batch (1 batches at --max_tokens 100000); give a smaller budget, "
                        "or neither --bs nor --max_tokens with --budget_for_world_size for one that keeps every rank busy"]
    crowded = single([*args, "--budget_for_world_size", "--save_dir", str(root / "d3"), "--dry_run"], cwd=root,
                     env=world(64))
    assert_ok(crowded)
    warnings = [line for line in crowded.stdout.splitlines() if line.startswith("WARNING")]
    assert warnings[0].startswith("WARNING: 23 of 64 ranks get no batch (41 batches at --max_tokens ")
    assert warnings[0].endswith("); the set has only 41 examples; run it on fewer ranks")


def test_a_run_given_min_new_tokens_estimates_its_outputs_at_least_that_long(tmp_path):
    """prepare passes the generation settings' minimum to the estimate (out_floor): the same
    batches, and short sources' batches estimated as outputs of at least that many tokens; an
    encoder-decoder's min_length counts the decoder's start token."""
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.prepare import prepare

    data = write_legacy(tmp_path / "data", ["a b", "c d e f g h i j k l m n o p q r s t u v w x y z"] * 3, ["x", "y"] * 3)

    def plan(**gen):
        cfg = EvalConfig(data_dir=str(data), save_dir=str(tmp_path / "o"), bs=2, device="cpu",
                         generate_kwargs=tuple(gen.items()))
        return prepare(cfg, DistEnv(), None, tmp_path / f"cache{len(list(tmp_path.iterdir()))}").batches

    plain, floored, by_length = plan(), plan(min_new_tokens=60), plan(min_length=61)
    assert plain.bounds.tolist() == floored.bounds.tolist()
    assert floored.cost[-1] > 5 * plain.cost[-1]  # the short sources' batch: 60 tokens, not about 3
    assert floored.cost.tolist() == by_length.cost.tolist()
