"""The parts that make a run scale: the example store, the tokenized-source cache and its reuse,
streamed inputs and outputs.

The cache lives in {tmp_dir}/cache: a resumed run (or a torchrun restart) must reuse it when the
inputs are unchanged, rebuild whatever a crash left half-written, and give the same outputs as an
uninterrupted run either way.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import assert_ok, make_corpus, single, write_legacy

from seq2seq_eval.inputs.examples import Example, Examples
from seq2seq_eval.inputs.files import iter_lines, read_lines
from seq2seq_eval.inputs.store import ExampleStore, fingerprint, write_store
from seq2seq_eval.inputs.tokens import load_shards, shard_is_complete, shard_range, write_shard


# ---------------------------------------------------------------- store


EXAMPLES = [Example(0, "a b", "x"), Example("k", "c d e", ("y", "z")), Example(7, "f", None), Example(-3, "g h", "w")]


def test_store_round_trip_and_fingerprint(tmp_path):
    n, sha = write_store(tmp_path / "s.arrow", iter(EXAMPLES))
    store = ExampleStore(tmp_path / "s.arrow", "here")
    assert n == len(store) == 4 and store.origin == "here"
    assert store.examples([3, 0, 1, 2]) == [EXAMPLES[3], EXAMPLES[0], EXAMPLES[1], EXAMPLES[2]]
    assert store.slice(1, 2) == EXAMPLES[1:3]
    assert store.ids(range(4)) == [0, "k", 7, -3]  # ints and strings keep their JSON type
    assert store.reference_counts == (0, 2) and store.max_references == 2 and store.sacrebleu_num_refs == -1
    # the digest a run records equals the in-memory one compare computes, and depends on content
    assert sha == fingerprint(EXAMPLES) == fingerprint(Examples(tuple(EXAMPLES), "x").items)
    assert fingerprint([Example(0, "a b", "x")]) != fingerprint([Example(0, "a b ", "x")])
    assert fingerprint([Example(0, "a", "x")]) != fingerprint([Example("0", "a", "x")])


def test_store_spans_several_record_batches(tmp_path):
    from seq2seq_eval.inputs import store as store_module

    many = [Example(i, f"source {i}", f"target {i}") for i in range(store_module.ROWS_PER_BATCH * 2 + 5)]
    n, sha = write_store(tmp_path / "s.arrow", iter(many))
    store = ExampleStore(tmp_path / "s.arrow", "here")
    assert n == len(many) and sha == fingerprint(many)
    positions = [0, store_module.ROWS_PER_BATCH, len(many) - 1]
    assert store.examples(positions) == [many[p] for p in positions]
    assert [s for chunk in store.iter_sources(3, len(many), rows=1000) for s in chunk] == [e.source for e in many[3:]]


def test_lines_are_streamed_with_the_same_rules(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfone \r\ntwo\xe2\x80\xa8still two\nthree")
    assert read_lines(path) == ["one", "two\u2028still two", "three"]
    assert [n for n, _ in iter_lines(path)] == [1, 2, 3]


# ---------------------------------------------------------------- token shards


def test_shards_cover_the_data_for_any_world_size():
    for n in (0, 1, 7, 100):
        for world in (1, 2, 3, 8):
            ranges = [shard_range(n, r, world) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_a_half_written_shard_is_not_taken_as_complete(tmp_path):
    import numpy as np

    write_shard(tmp_path, "key", 0, 3, np.array([5, 6, 7, 8, 9], np.int32), np.array([2, 1, 2], np.int32), 0)
    assert shard_is_complete(tmp_path, "key", 0, 3)
    assert not shard_is_complete(tmp_path, "other key", 0, 3)
    tokens = load_shards(tmp_path, [(0, 3)])
    assert [tokens.ids(i) for i in range(3)] == [[5, 6], [7], [8, 9]]
    (tmp_path / "tokens_0_3.ids.bin").write_bytes((tmp_path / "tokens_0_3.ids.bin").read_bytes()[:-4])  # torn
    assert not shard_is_complete(tmp_path, "key", 0, 3)
    (tmp_path / "tokens_0_3.json").unlink()  # arrays written, description never was
    assert not shard_is_complete(tmp_path, "key", 0, 3)


# ---------------------------------------------------------------- the cache in real runs


@pytest.fixture(scope="module")
def case(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    src, tgt = make_corpus(30, seed=21)
    data = write_legacy(root / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--bs", "4"]
    reference = root / "reference"
    assert_ok(single(args + ["--save_dir", str(reference)], cwd=root))
    return root, args, reference


def _cache_files(tmp_dir):
    return {p.name: p.stat().st_mtime_ns for p in (tmp_dir / "cache").iterdir()}


def test_resume_reuses_the_cache(case, tmp_path):
    root, args, reference = case
    save = tmp_path / "out"
    assert_ok(single(args + ["--save_dir", str(save), "--debug"], cwd=root))  # --debug keeps the temp dir
    tmp_dir = tmp_path / "out_tmp"
    before = _cache_files(tmp_dir)
    assert {"examples.arrow", "examples.json", "tokens_0_30.ids.bin", "tokens_0_30.lens.npy", "tokens_0_30.json"} <= set(before)
    assert_ok(single(args + ["--save_dir", str(save), "--resume"], cwd=root))
    assert (save / "test_generations.txt").read_bytes() == (reference / "test_generations.txt").read_bytes()
    assert not tmp_dir.exists()  # a complete run cleans up after itself, cache included


def test_resume_rebuilds_a_half_written_cache(case, tmp_path):
    root, args, reference = case
    save = tmp_path / "out"
    assert_ok(single(args + ["--save_dir", str(save), "--debug"], cwd=root))
    cache = tmp_path / "out_tmp" / "cache"
    kept = _cache_files(cache.parent)
    # a crash while tokenizing (arrays without their description) and while converting (the
    # store's description gone, the store torn)
    (cache / "tokens_0_30.json").unlink()
    (cache / "examples.json").unlink()
    (cache / "examples.arrow").write_bytes((cache / "examples.arrow").read_bytes()[:100])
    # every batch is journaled: the resumed run generates nothing, so the outputs prove the rebuilt
    # cache names the same examples in the same places
    resumed = single(args + ["--save_dir", str(save), "--resume", "--debug"], cwd=root)
    assert_ok(resumed)
    again = _cache_files(cache.parent)
    assert again["tokens_0_30.json"] and again["examples.arrow"] != kept["examples.arrow"]
    m = json.loads((save / "test_bleu.json").read_text())
    assert m["throughput"]["generated_examples"] == 0
    assert (save / "test_generations.txt").read_bytes() == (reference / "test_generations.txt").read_bytes()
    assert m["bleu"] == json.loads((reference / "test_bleu.json").read_text())["bleu"]


def test_changed_data_is_converted_again_and_refused_on_resume(case, tmp_path):
    root, args, _ = case
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    own = [a if a != str(root / "data") else str(data) for a in args]
    save = tmp_path / "out"
    assert_ok(single(own + ["--save_dir", str(save), "--debug"], cwd=root))
    lines = (data / "test.target").read_text().splitlines()
    lines[3] = "a changed reference"
    (data / "test.target").write_text("\n".join(lines) + "\n")
    os.utime(data / "test.target", ns=(1, 1))  # a different modification time, whatever the clock
    refused = single(own + ["--save_dir", str(save), "--resume"], cwd=root)
    assert refused.returncode != 0
    assert "belongs to a run with different data" in refused.stderr.strip().splitlines()[-1]
