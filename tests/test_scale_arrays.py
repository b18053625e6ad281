"""What keeps memory per process flat in N: the plan as arrays, token offsets every STRIDE-th
example, store reads record batch by record batch, ids checked for duplicates by hash, the
merge of one slice of the data. Each against the plain computation it replaces; no model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from seq2seq_eval.errors import DataError
from seq2seq_eval.inputs.examples import Example
from seq2seq_eval.inputs.files import iter_jsonl
from seq2seq_eval.inputs.seen import BLOCK
from seq2seq_eval.inputs.store import ROWS_PER_BATCH, ExampleStore, write_store
from seq2seq_eval.inputs.tokens import STRIDE, load_shards, write_shard
from seq2seq_eval.run.plan import make_batches


def test_plan_is_arrays_of_a_few_bytes_per_example():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, size=1_000_000).astype(np.int32)
    plan = make_batches(lengths, max_tokens=1024)
    held = plan.order.nbytes + plan.bounds.nbytes + plan.padded.nbytes + plan.cost.nbytes
    # 4 bytes of order per example and 20 per batch (about 10 examples here): Batch objects of
    # Python ints were over 40 bytes per example.
    assert held / len(lengths) < 8
    b = plan[len(plan) // 2]  # one batch made into Python ints, on demand
    assert list(b.members) == plan.members(len(plan) // 2).tolist()
    assert b.padded_len == max(int(lengths[i]) for i in b.members)


def test_token_ids_by_position_across_strides_and_shards(tmp_path):
    rng = random.Random(3)
    n = 3 * STRIDE + 17
    seqs = [[rng.randrange(1000) for _ in range(rng.randrange(0, 9))] for _ in range(n)]
    ranges = [(0, 300), (300, 301), (301, n)]
    for start, end in ranges:
        part = seqs[start:end]
        flat = np.asarray([t for s in part for t in s], np.int32)
        write_shard(tmp_path, "k", start, end, flat, np.asarray([len(s) for s in part], np.int32), 0)
    tokens = load_shards(tmp_path, ranges)
    assert [tokens.ids(i) for i in range(n)] == seqs


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ExampleStore:
    path = tmp_path_factory.mktemp("store") / "s.arrow"
    n = 2 * ROWS_PER_BATCH + 123
    write_store(path, (Example(i if i % 3 else f"id{i}", f"source {i}", (f"t{i}",) if i % 2 else f"t{i}")
                       for i in range(n)))
    return ExampleStore(path, "here")


def test_store_takes_rows_from_every_record_batch_in_the_order_asked(store):
    n = len(store)
    positions = [n - 1, 0, ROWS_PER_BATCH, 5, ROWS_PER_BATCH - 1, 2 * ROWS_PER_BATCH + 7, 5]
    assert store.ids(positions) == [p if p % 3 else f"id{p}" for p in positions]
    assert store.sources(positions) == [f"source {p}" for p in positions]
    assert store.targets([1, 2]) == ["t1", "t2"]
    assert store.ids([]) == []
    assert store.id_range(ROWS_PER_BATCH - 2, 4).to_pylist() == [json.dumps(p if p % 3 else f"id{p}") for p in
                                                                 range(ROWS_PER_BATCH - 2, ROWS_PER_BATCH + 2)]


def _jsonl(path: Path, ids: list) -> Path:
    path.write_text("".join(json.dumps({"id": i, "source": "s", "target": "t"}) + "\n" for i in ids))
    return path


def test_duplicate_id_found_blocks_apart_and_named_with_its_first_line(tmp_path):
    ids = list(range(BLOCK * 2 + 10))
    ids[-3] = 17  # the same id 130,000 lines later, after two blocks of hashes went into runs
    with pytest.raises(DataError, match=rf"line {len(ids) - 2}: duplicated id 17 \(first on line 18\)"):
        list(iter_jsonl(_jsonl(tmp_path / "d.jsonl", ids), True))
    ok = list(iter_jsonl(_jsonl(tmp_path / "ok.jsonl", [*range(BLOCK + 5), "1", "2"]), True))
    assert len(ok) == BLOCK + 7  # 1 and "1" are different ids


def test_slices_of_the_merge_make_up_the_whole(tmp_path, store):
    from seq2seq_eval.outputs.merge import merge_by_id
    from seq2seq_eval.run.rankfiles import RankWriter, rank_file, read_rank_output

    n = len(store)
    perm = np.random.default_rng(1).permutation(n)
    writers = [RankWriter(tmp_path, r) for r in range(2)]
    ids = store.ids(range(n))
    for k, lo in enumerate(range(0, n, 500)):
        chunk = perm[lo : lo + 500].tolist()
        writers[k % 2].add(chunk, [{"id": ids[i], "pred": "p", "n_tokens": 1} for i in chunk])
    for r, w in enumerate(writers):
        w.close({"rank": r})
    outputs = [read_rank_output(rank_file(tmp_path, r), r) for r in range(2)]
    table, whole = merge_by_id(outputs, store)
    cuts = [0, 1, n // 3, n // 2, n]
    pieces = [merge_by_id(outputs, store, a, b)[1] for a, b in zip(cuts[:-1], cuts[1:])]
    assert np.array_equal(np.concatenate(pieces), whole)
    positions = table.column("position").to_numpy()
    assert np.array_equal(positions[whole], np.arange(n))
    assert isinstance(table, pa.Table)
