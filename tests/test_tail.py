"""Rank 0's tail on real rank files: the lines the ranks serialize, concatenated in data order,
must be the very bytes of json.dumps over the whole data; rows are gathered at random or spilled (outputs/shuffle.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from seq2seq_eval.config import EvalConfig
from seq2seq_eval.inputs.examples import Example
from seq2seq_eval.errors import RunStateError
from seq2seq_eval.outputs import shuffle
from seq2seq_eval.outputs.merge import merge_by_id
from seq2seq_eval.outputs.parts import columns_taken, roles
from seq2seq_eval.outputs.shuffle import Buckets, gathered
from seq2seq_eval.outputs.write import output_lines, write_outputs
from seq2seq_eval.run.rankfiles import RankWriter, read_rank_output
from seq2seq_eval.inputs.store import ExampleStore, write_store


def _examples(n: int) -> list[Example]:
    rng = random.Random(1)
    odd = ['ü"\\\t', "\u2028x", "plain", "a\nb", "</s> <pad>"]
    out = []
    for i in range(n):
        ex_id = i if i % 3 else f"id {i}"
        kind = i % 4
        target = None if kind == 0 else (f"t{i} " + rng.choice(odd)) if kind < 3 else (f"r{i}", f"second {i}")
        out.append(Example(ex_id, f"s{i} " + rng.choice(odd), target))
    return out


def _rank_files(tmp_path: Path, cfg: EvalConfig, examples: list[Example], n_ranks: int, with_lines: bool = True):
    """Batches of 4 dealt to the ranks in a shuffled order, as a length-sorted plan deals them;
    rank files flushed every 8 rows, so each holds many record batches."""
    store_path = tmp_path / "examples.arrow"
    write_store(store_path, examples)
    store = ExampleStore(store_path, "test data")
    rng = random.Random(0)
    batches = [list(range(i, min(i + 4, len(examples)))) for i in range(0, len(examples), 4)]
    rng.shuffle(batches)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    writers = [RankWriter(tmp, r) for r in range(n_ranks)]
    for w in writers:
        w.ROWS_PER_WRITE = 8
    for j, batch in enumerate(batches):
        records = [{"id": examples[i].id, "pred": [f"best {i} \u2028 ü", f"next {i}"], "n_tokens": 3,
                    "scores": [-0.5 * i, -1.0 * i - 1]} for i in batch]
        lines = output_lines(cfg, store.examples(batch), records) if with_lines else None
        writers[j % n_ranks].add(batch, records, lines)
    outputs = [read_rank_output(w.close({"rank": r}), r) for r, w in enumerate(writers)]
    return store, outputs


def _summary(_totals):
    return {"n_obs": 0}


def _gathered(cfg: EvalConfig, store, outputs, tmp_path: Path, gather):
    """Rank 0's rows in data order, as finish.py gathers them for the one-rank tail."""
    _, order = merge_by_id(outputs, store)
    return gathered(outputs, order, columns_taken(roles(cfg), cfg.scored), tmp_path / "tmp" / "tail_spill_all_0.arrow",
                    available=gather[0])


# How rows are gathered: (memory available, bytes of a spill bucket and of a group of rank-file
# rows, rows per chunk taken at random). At random in one chunk, in chunks of 7 and of 1; spilled
# (no memory said to be available) in one bucket, in buckets of a few rows, in one per example.
AT_RANDOM, SPILLED = 1 << 62, 0
GATHERS = {"random": (AT_RANDOM, None, 20_000), "random-7": (AT_RANDOM, None, 7), "random-1": (AT_RANDOM, None, 1),
           "spilled": (SPILLED, None, None), "spilled-900": (SPILLED, (900, 500), None), "spilled-1": (SPILLED, (1, 1), None)}


def _budget(monkeypatch, gather) -> None:
    _, budget, chunk = gather
    if budget is not None:
        monkeypatch.setattr(shuffle, "BUCKET_BYTES", budget[0])
        monkeypatch.setattr(shuffle, "GROUP_BYTES", budget[1])
    if chunk is not None:
        monkeypatch.setattr(shuffle, "ROWS_PER_CHUNK", chunk)


@pytest.mark.parametrize("n, gather", [(1, "random"), (53, "random"), (53, "random-7"), (1, "spilled"), (53, "spilled"),
                                       (53, "spilled-900"), (53, "spilled-1")])
def test_pseudolabel_outputs_are_the_bytes_of_json_dumps(tmp_path, monkeypatch, n, gather):
    gather = GATHERS[gather]
    _budget(monkeypatch, gather)
    examples = _examples(n)
    cfg = EvalConfig(save_dir=str(tmp_path / "out"), task="translation", data_dir=str(tmp_path),
                     num_return_sequences=2, pseudo_target=True)
    store, outputs = _rank_files(tmp_path, cfg, examples, 3)
    write_outputs(cfg, store, _gathered(cfg, store, outputs, tmp_path, gather), _summary)
    assert not list((tmp_path / "tmp").glob("tail_spill_*"))  # a spill goes once read
    out = tmp_path / "out"
    preds = [[f"best {i} \u2028 ü", f"next {i}"] for i in range(n)]
    # target is a list in every row, one reference or several (a str here and a list there
    # breaks datasets.load_dataset("json") and every reader that does not check each row).
    # Without references it is an empty list.
    assert {type(e.target) for e in examples} == {type(None), str, tuple} or n == 1
    legacy = [{"id": e.id, "source": e.source, "target": [e.target] if isinstance(e.target, str) else list(e.target or ()),
               "preds": p} for e, p in zip(examples, preds)]
    assert (out / "pseudolabel_results.json").read_text(encoding="utf-8") == \
        json.dumps(legacy, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
    jsonl = [json.dumps({"id": e.id, "source": e.source, "target": r["target"], "candidates": p,
                         "scores": [-0.5 * i, -1.0 * i - 1]}, ensure_ascii=False)
             for i, (e, p, r) in enumerate(zip(examples, preds, legacy))]
    # U+2028 (in every prediction here), U+2029 and U+0085 escaped: one line per example for any line splitter
    escaped = [x.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085") for x in jsonl]
    assert (out / "test_pseudolabels.jsonl").read_text(encoding="utf-8") == "".join(x + "\n" for x in escaped)
    assert len((out / "test_pseudolabels.jsonl").read_text(encoding="utf-8").splitlines()) == n
    # one line per example: a line separator inside a prediction becomes a space
    best = "".join(f"best {i}   ü\n" for i in range(n))
    assert (out / "test_generations.txt").read_text(encoding="utf-8") == best
    assert (out / "test.pseudo.target").read_text(encoding="utf-8") == best


@pytest.mark.parametrize("gather", list(GATHERS))
def test_rows_gathered_in_data_order_equal_arrow_take(tmp_path, monkeypatch, gather):
    gather = GATHERS[gather]
    _budget(monkeypatch, gather)
    cfg = EvalConfig(save_dir=str(tmp_path / "out"), task="translation", data_dir=str(tmp_path), num_return_sequences=2)
    store, outputs = _rank_files(tmp_path, cfg, _examples(101), 2)
    assert sum(o.table.column("id").num_chunks for o in outputs) > 10  # many record batches to gather from
    table, order = merge_by_id(outputs, store)
    columns = ["position", *columns_taken(roles(cfg), cfg.scored)]
    parts = list(_gathered(cfg, store, outputs, tmp_path, gather))
    assert len(parts) > 1 or gather in (GATHERS["random"], GATHERS["spilled"])
    assert pa.concat_tables(parts).select(columns).to_pylist() == table.take(pa.array(order)).select(columns).to_pylist()


def test_a_tail_spills_once_the_rank_files_outgrow_half_the_memory():
    assert not shuffle.spills(10, 20) and shuffle.spills(11, 20) and shuffle.spills(1, 0)
    assert shuffle.memory_available() > 0  # /proc/meminfo, on Linux


def test_buckets_cover_their_places_once():
    for lo, hi, count in [(0, 1, 1), (5, 58, 7), (3, 10, 7), (0, 100, 3), (4, 4, 1)]:
        buckets = Buckets(lo, hi, count)
        places = np.arange(lo, hi)
        which = buckets.of(places)
        assert list(which) == sorted(which) and set(which) <= set(range(count))
        for b in range(count):
            start, end = buckets.places(b)
            assert list(places[which == b]) == list(range(start, end))
    assert Buckets.sized(0, 10, 1000, budget=300).count == 4
    assert Buckets.sized(0, 3, 1000, budget=1).count == 3  # never more buckets than places


def _spill_of_40(tmp_path: Path, monkeypatch, ranks: int) -> tuple[Buckets, Path]:
    """40 examples' rank files of 2 ranks, the first `ranks` of them spilled to one destination
    in buckets of a few rows: the buckets and the spill file."""
    _budget(monkeypatch, GATHERS["spilled-900"])
    cfg = EvalConfig(save_dir=str(tmp_path / "out"), task="translation", data_dir=str(tmp_path), num_return_sequences=2)
    _, outputs = _rank_files(tmp_path, cfg, _examples(40), 2)
    columns = columns_taken(roles(cfg), cfg.scored)
    buckets = Buckets.sized(0, 40, shuffle.column_bytes(outputs, columns))
    spilled = tmp_path / "tmp" / "tail_spill_0_0.arrow"
    shuffle.spill(outputs[:ranks], columns, [(buckets, spilled)])
    return buckets, spilled


def test_a_spill_missing_rows_is_refused_naming_the_places(tmp_path, monkeypatch):
    """Rows spilled by one rank file only (the other's never arrived) are not taken for a bucket."""
    buckets, spilled = _spill_of_40(tmp_path, monkeypatch, ranks=1)
    with pytest.raises(RunStateError, match=r"the tail's spill files (lack|hold) data places \d+\.\.\d+"):
        list(shuffle.in_data_order([spilled], buckets))


def test_a_spill_index_spans_each_record_batchs_bytes(tmp_path, monkeypatch):
    """The spans the next bucket's reads are asked for (shuffle._Prefetch) are the batches' own
    bytes: each span after the first is one IPC message holding that batch, and they tile the file
    from its start up to the footer."""
    buckets, spilled = _spill_of_40(tmp_path, monkeypatch, ranks=2)
    index = json.loads((tmp_path / "tmp" / "tail_spill_0_0.arrow.index").read_text())
    spans, data = index["spans"], spilled.read_bytes()
    reader = pa.ipc.open_file(pa.py_buffer(data))
    assert len(spans) == len(index["buckets"]) == reader.num_record_batches > 2
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] < len(data)
    for i, (start, end) in enumerate(spans[1:], 1):
        message = pa.ipc.read_message(pa.py_buffer(data[start:end]))
        assert pa.ipc.read_record_batch(message, reader.schema).equals(reader.get_batch(i))
    assert [t.column("position").to_pylist() for t in shuffle.in_data_order([spilled], buckets)] == \
        [list(range(*buckets.places(b))) for b in range(buckets.count)]


def test_a_mapped_arrow_file_reads_as_written(tmp_path):
    from seq2seq_eval.mapped import read_mapped

    table = pa.table({"id": list(range(1000)), "text": [f"row {i}" for i in range(1000)]})
    path = tmp_path / "t.arrow"
    with pa.ipc.new_file(str(path), table.schema) as w:
        for batch in table.to_batches(max_chunksize=64):
            w.write_batch(batch)
    mapping, read = read_mapped(path)
    assert mapping is not None and read.equals(table) and read.num_rows == 1000
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    with pytest.raises(pa.ArrowInvalid):
        read_mapped(empty)


def test_rank_files_without_serialized_lines_are_refused(tmp_path):
    cfg = EvalConfig(save_dir=str(tmp_path / "out"), task="translation", data_dir=str(tmp_path), num_return_sequences=2)
    store, outputs = _rank_files(tmp_path, cfg, _examples(9), 2, with_lines=False)
    for gather in (GATHERS["random"], GATHERS["spilled"]):
        with pytest.raises(RunStateError, match=r"rank files lack the serialized 'out_gen' of some examples"):
            write_outputs(cfg, store, _gathered(cfg, store, outputs, tmp_path, gather), _summary)
    assert not (tmp_path / "out" / "test_generations.txt").exists()  # nothing half-written is left


@pytest.mark.parametrize("n, world, gather", [(1, 2, "random"), (2, 5, "random"), (53, 3, "random-7"), (53, 2, "random-1"),
                                              (1, 2, "spilled"), (2, 5, "spilled"), (53, 3, "spilled-900"), (53, 2, "spilled-1"),
                                              (53, 3, "one rank short of memory")])
def test_shared_tail_in_place_writes_the_one_rank_bytes(tmp_path, monkeypatch, n, world, gather):
    """The ranks' slices written in place at the offsets their sizes give (every rank at once,
    some slices empty when there are more ranks than examples) make exactly the files one rank
    writes alone, the legacy list's brackets and first comma included; rows gathered at random
    or spilled across the ranks."""
    import threading

    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.sharedtail import wait_for_parts, write_my_part

    # One rank short of memory makes every rank spill (a rank gathering at random would find no
    # spill from the others, and one spilling would read none from it).
    short = gather == "one rank short of memory"
    gather = GATHERS["spilled-900"] if short else GATHERS[gather]
    memory = [(SPILLED if k == 1 else AT_RANDOM) if short else gather[0] for k in range(world)]
    _budget(monkeypatch, gather)
    examples = _examples(n)
    alone, shared = tmp_path / "alone", tmp_path / "shared"
    cfg = EvalConfig(save_dir=str(alone), task="translation", data_dir=str(tmp_path), num_return_sequences=2,
                     pseudo_target=True, sync_timeout=60)
    store, outputs = _rank_files(tmp_path, cfg, examples, world)
    write_outputs(cfg, store, _gathered(cfg, store, outputs, tmp_path, (AT_RANDOM, None, None)), _summary)
    tmp = tmp_path / "tmp"
    cfg = EvalConfig(save_dir=str(shared), task="translation", data_dir=str(tmp_path), num_return_sequences=2,
                     pseudo_target=True, sync_timeout=60)
    errors = []

    def rank(k: int) -> None:
        try:
            write_my_part(cfg, DistEnv(rank=k, world_size=world), ExampleStore(tmp_path / "examples.arrow", "d"), tmp,
                          available=memory[k])
        except Exception as e:  # reported below: a thread's exception would be lost
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(k,)) for k in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    write_outputs(cfg, store, wait_for_parts(cfg, world, tmp), _summary)
    names = sorted(p.name for p in alone.iterdir() if not p.name.startswith("."))
    assert names == sorted(p.name for p in shared.iterdir() if not p.name.startswith("."))
    for name in names:
        assert (shared / name).read_bytes() == (alone / name).read_bytes(), name
    assert not list(tmp.glob("tail_out.*"))  # moved into place, not copied
    assert not list(tmp.glob("tail_spill_*"))  # each slice's spill goes once read


def test_layout_places_slices_end_to_end():
    from seq2seq_eval.outputs.parts import SliceInfo, layout

    slices = [SliceInfo(0, 0, 0, 0, {"out_gen": 0, "out_legacy": 0}), SliceInfo(1, 0, 2, 2, {"out_gen": 7, "out_legacy": 30}),
              SliceInfo(2, 2, 3, 1, {"out_gen": 4, "out_legacy": 12})]
    placements, lengths = layout(slices, ["gen", "legacy"])
    assert [p["gen"] for p in placements] == [parts_placement(0, 0), parts_placement(0, 0), parts_placement(7, 0)]
    # "[" first; the first non-empty slice leaves out its leading comma; "\n]\n" last.
    assert [p["legacy"] for p in placements] == [parts_placement(1, 0), parts_placement(1, 1), parts_placement(30, 0)]
    assert lengths == {"gen": 11, "legacy": 1 + 29 + 12 + 3}
    _, empty = layout([SliceInfo(0, 0, 0, 0, {"out_gen": 0, "out_legacy": 0})], ["gen", "legacy"])
    assert empty == {"gen": 0, "legacy": len(b"[]\n")}


def parts_placement(offset: int, skip: int):
    from seq2seq_eval.outputs.parts import Placement

    return Placement(offset, skip)


def test_the_spill_is_the_tools_own_and_goes_on_resume(tmp_path):
    """Every file a tail may leave in the temp dir when killed is one cleanup and --resume remove."""
    from seq2seq_eval.run.sharedtail import part_spilled, spill_file
    from seq2seq_eval.run.tmpdir import is_own

    for path in (spill_file(tmp_path, 0, 1), spill_file(tmp_path, "all", 0), part_spilled(tmp_path, 3)):
        assert is_own(path.name) and path.name.startswith("tail_")  # prepare_tmp_dir removes tail_* it owns
        assert is_own(f"{path.name}.index") or path.suffix == ".spilled"
    assert not is_own("tail_spill_x_0.arrow")


def test_parts_made_ahead_come_in_order_errors_at_their_place_and_an_early_stop_ends_the_thread():
    import threading

    from seq2seq_eval.outputs.shuffle import prefetched

    assert list(prefetched(iter(range(50)))) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise RunStateError("part 3 is missing")

    got = []
    with pytest.raises(RunStateError, match="part 3 is missing"):
        for x in prefetched(failing()):
            got.append(x)
    assert got == [1, 2]
    made = []

    def endless():
        while True:
            made.append(len(made))
            yield made[-1]

    ahead = prefetched(endless())
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    ahead.close()  # the caller stops early, as write_outputs does on an error
    assert not [t for t in threading.enumerate() if t.name == "seq2seq_eval-gather"]
    assert len(made) <= 5  # at most the part handed over and the one in the making


def test_the_memory_a_tail_may_count_on_is_its_cgroups_limit_where_less(tmp_path):
    from seq2seq_eval.outputs.shuffle import cgroup_memory_limit

    (tmp_path / "job" / "step").mkdir(parents=True)
    (tmp_path / "job" / "step" / "memory.max").write_text("2147483648\n")
    assert cgroup_memory_limit("0::/job/step\n", tmp_path) == 2 << 30  # cgroup v2 (a Slurm job step)
    (tmp_path / "job" / "step" / "memory.max").write_text("max\n")
    assert cgroup_memory_limit("0::/job/step\n", tmp_path) is None
    (tmp_path / "memory" / "docker" / "c1").mkdir(parents=True)
    (tmp_path / "memory" / "docker" / "c1" / "memory.limit_in_bytes").write_text("4294967296\n")
    v1 = "9:name=systemd:/\n4:memory:/docker/c1\n3:cpu,cpuacct:/docker/c1\n"
    assert cgroup_memory_limit(v1, tmp_path) == 4 << 30  # cgroup v1 (a container)
    (tmp_path / "memory" / "docker" / "c1" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_limit(v1, tmp_path) is None  # v1's "no limit"
    assert cgroup_memory_limit("4:memory:/gone\n", tmp_path) is None
