"""Out-of-memory survival on CPU, by injecting the error: a batch that runs out of memory is split
in halves down to single examples, every split and sub-batch is journaled, a resume reuses the
finished halves without running out of memory again, and only an example that fails alone fails
the run. The same on a real GPU is tests/test_gpu.py::test_out_of_memory_split_for_real."""

from __future__ import annotations

import json
import re
import weakref
from pathlib import Path

import pytest

from seq2seq_eval.errors import RunFailed

from seq2seq_eval.model import settings as model_settings
from seq2seq_eval.run import oom, runner
from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import Interrupted, OutOfMemory
from seq2seq_eval.engines import BatchOutput
from seq2seq_eval.run.journal import Journal, JournalIndex, journal_file, read_journals

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- what counts, and how a range splits


@pytest.mark.parametrize("error, counts", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"), True),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1.2 GB)"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"), True),
    (RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"), False),
    (RuntimeError("CUDA error: device-side assert triggered"), False),
    (ValueError("out of memory"), False),  # not a RuntimeError: some other library's message
    (MemoryError(), False),  # the Python heap, not the batch's tensors
])
def test_what_counts_as_out_of_memory(error, counts):
    assert oom.is_out_of_memory(error) is counts


@pytest.mark.parametrize("span, expected", [
    ((0, 8), [(0, 4), (4, 8)]),
    ((0, 7), [(0, 4), (4, 7)]),  # the first half (the longer sources) takes the odd one
    ((4, 7), [(4, 6), (6, 7)]),
    ((0, 2), [(0, 1), (1, 2)]),
])
def test_halves(span, expected):
    assert oom.halves(*span) == expected


# ---------------------------------------------------------------- run_batch with a fake generator


class FakeGenerator:
    """Stands in for an engine's generate: the prediction of a source is its length, in words;
    raises torch's out-of-memory error when a batch has more than `fits` rows or holds a source
    of `too_long` tokens or more, and Interrupted on the call after `stop_after` successes."""

    def __init__(self, fits: int = 99, too_long: int = 10**9, stop_after: int | None = None) -> None:
        self.fits, self.too_long, self.stop_after = fits, too_long, stop_after
        self.calls: list[int] = []  # rows per call
        self.ok = 0

    def __call__(self, batch_ids, batch_index):
        self.calls.append(len(batch_ids))
        if len(batch_ids) > self.fits or max(len(x) for x in batch_ids) >= self.too_long:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has ...")
        if self.stop_after is not None and self.ok == self.stop_after:
            raise Interrupted("interrupted by SIGTERM")
        self.ok += 1
        return BatchOutput([[f"len {len(x)}"] for x in batch_ids], None, [len(x) for x in batch_ids])


SOURCES = [[7] * n for n in (12, 9, 8, 6, 5)]  # plan order: longest first
IDS = ["e0", "e1", "e2", "e3", "e4"]


def journal_lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in journal_file(tmp_path, 0).read_text().splitlines()]


def run(tmp_path, generator, journaled=None, ids=IDS, sources=SOURCES):
    journal = Journal(journal_file(tmp_path, 0))
    try:
        return oom.run_batch(generator, 3, sources, ids, journal=journal, journaled=journaled)
    finally:
        journal.close()


def test_a_batch_that_fits_is_journaled_as_before(tmp_path):
    result = run(tmp_path, FakeGenerator())
    assert [r["pred"] for r in result.records] == ["len 12", "len 9", "len 8", "len 6", "len 5"]
    assert journal_lines(tmp_path) == [{"batch": 3, "records": result.records, "seconds": pytest.approx(0, abs=1)}]
    assert (result.sub_batches, result.out_of_memory, result.split) == (1, 0, False)
    assert (result.generated_examples, result.source_tokens, result.padded_source_tokens) == (5, 40, 60)


def test_out_of_memory_splits_in_halves_until_it_fits(tmp_path):
    gen = FakeGenerator(fits=2)
    result = run(tmp_path, gen)
    # 5 -> 3 + 2, 3 -> 2 + 1: calls in that order, longest sources first.
    assert gen.calls == [5, 3, 2, 1, 2]
    assert [r["id"] for r in result.records] == IDS
    assert [r["pred"] for r in result.records] == ["len 12", "len 9", "len 8", "len 6", "len 5"]
    assert (result.sub_batches, result.out_of_memory, result.split) == (3, 2, True)
    # Padding is per sub-batch: 12*2 + 8*1 + 6*2.
    assert (result.generated_examples, result.source_tokens, result.padded_source_tokens) == (5, 40, 44)
    lines = journal_lines(tmp_path)
    assert [(k := next(x for x in ("split", "part", "records") if x in e), e[k] if k != "records" else None)
            for e in lines] == [("split", [0, 5]), ("split", [0, 3]), ("part", [0, 2]), ("part", [2, 3]), ("part", [3, 5])]
    assert lines[0] == {"batch": 3, "split": [0, 5], "of": 5, "into": [[0, 3], [3, 5]], "ids": IDS}
    assert lines[2]["of"] == 5 and [r["id"] for r in lines[2]["records"]] == ["e0", "e1"]
    # Put back together, the journal holds the whole batch.
    done = read_journals(tmp_path)[3]
    assert done["records"] == result.records and done["parts"] == [[0, 2], [2, 3], [3, 5]]


def test_an_example_that_fails_alone_fails_the_run_naming_it(tmp_path):
    gen = FakeGenerator(fits=4, too_long=9)  # e0 (12 tokens) and e1 (9) never fit
    with pytest.raises(OutOfMemory, match=r"^example id 'e0' \(source 12 tokens, batch 3\) ran out of memory alone "
                                          r"\(CUDA out of memory\. Tried to allocate 1\.00 GiB\); .*--max_source_length.*"
                                          r"--fp16 or --bf16.*rerun with --resume$") as info:
        run(tmp_path, gen)
    assert "\n" not in str(info.value)
    assert gen.calls == [5, 3, 2, 1]
    # The splits are kept, so a resume goes straight to e0 alone.
    assert [e.get("split") for e in journal_lines(tmp_path)] == [[0, 5], [0, 3], [0, 2]]


def test_other_errors_are_not_retried(tmp_path):
    def broken(batch_ids, batch_index):
        raise RuntimeError("The size of tensor a (3) must match the size of tensor b (4)")

    with pytest.raises(RunFailed) as e:
        run(tmp_path, broken)
    # Not retried, and one typed line naming the batch and the engine's reason, its cause kept.
    assert "\n" not in str(e.value) and re.match(r"batch \d+ \(example ids ", str(e.value))
    assert "the engine failed (RuntimeError: The size of tensor a (3) must match" in str(e.value)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert journal_lines(tmp_path) == []


def test_the_failed_attempt_is_unreachable_when_memory_is_freed(tmp_path, monkeypatch):
    """The retry must not run while the failed attempt's tensors are still held (by the
    exception's traceback): free_memory runs only after they are gone."""
    class Tensor:
        pass

    refs: list[weakref.ref] = []
    seen: list[bool] = []

    def generate(batch_ids, batch_index):
        if len(batch_ids) > 2:
            activations = Tensor()
            refs.append(weakref.ref(activations))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return BatchOutput([["x"]] * len(batch_ids), None, [1] * len(batch_ids))

    monkeypatch.setattr(oom, "free_memory", lambda device: seen.append(all(r() is None for r in refs)))
    run(tmp_path, generate)
    assert seen == [True, True]


def test_a_resume_reuses_finished_halves_and_does_not_run_out_of_memory_again(tmp_path):
    interrupted = FakeGenerator(fits=2, stop_after=1)
    with pytest.raises(Interrupted):
        run(tmp_path, interrupted)
    assert interrupted.calls == [5, 3, 2, 1]  # [0, 2) done, stopped in [2, 3)
    journaled = JournalIndex(tmp_path).batch(3)
    assert sorted(journaled.splits) == [(0, 3), (0, 5)] and sorted(journaled.parts) == [(0, 2)]
    assert journaled.finished() is None

    resumed = FakeGenerator(fits=2)
    result = run(tmp_path, resumed, journaled)
    assert resumed.calls == [1, 2]  # [2, 3) and [3, 5): no batch larger than what fitted
    assert result.reused_sub_batches == [(0, 2)] and result.out_of_memory == 0 and result.split
    assert (result.generated_examples, result.sub_batches) == (3, 3)
    assert [r["pred"] for r in result.records] == ["len 12", "len 9", "len 8", "len 6", "len 5"]
    assert read_journals(tmp_path)[3]["records"] == result.records


def test_journaled_pieces_of_other_examples_are_not_reused(tmp_path):
    run(tmp_path, FakeGenerator(fits=2))
    journaled = JournalIndex(tmp_path).batch(3)
    other_ids = ["x0", "x1", "x2", "x3", "x4"]
    gen = FakeGenerator(fits=2)
    result = run(tmp_path, gen, journaled, ids=other_ids)
    assert gen.calls == [5, 3, 2, 1, 2] and [r["id"] for r in result.records] == other_ids


# ---------------------------------------------------------------- reading journals


def test_journals_without_splits_read_as_before(tmp_path):
    lines = [{"batch": 0, "records": [{"id": 0, "pred": "a"}], "seconds": 0.5},
             {"batch": 1, "records": [{"id": 1, "pred": "b"}], "seconds": 0.25}]
    journal_file(tmp_path, 0).write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert read_journals(tmp_path) == {0: lines[0], 1: lines[1]}


@pytest.mark.parametrize("bad", [
    {"batch": 0, "split": [0, 2], "of": 2, "into": [[0, 1]], "ids": [0, 1]},  # does not tile the range
    {"batch": 0, "split": [0, 2], "of": 2, "into": [[0, 2], [2, 2]], "ids": [0, 1]},  # not smaller
    {"batch": 0, "split": [0, 3], "of": 2, "into": [[0, 1], [1, 3]], "ids": [0, 1, 2]},  # past the batch
    {"batch": 0, "part": [1, 2], "of": 2, "records": []},  # records do not match the range
    {"batch": 0, "part": "0-1", "of": 2, "records": [{"id": 0}]},
    {"batch": 0, "split": [0, 2]},
])
def test_malformed_split_lines_are_skipped(tmp_path, bad):
    good = [{"batch": 0, "split": [0, 2], "of": 2, "into": [[0, 1], [1, 2]], "ids": [0, 1]},
            {"batch": 0, "part": [0, 1], "of": 2, "records": [{"id": 0, "pred": "a"}], "seconds": 1.0}]
    journal_file(tmp_path, 0).write_text("".join(json.dumps(e) + "\n" for e in [bad, *good]))
    journaled = JournalIndex(tmp_path).batch(0)
    assert list(journaled.splits) == [(0, 2)] and list(journaled.parts) == [(0, 1)]
    assert journaled.finished() is None  # [1, 2) is missing


# ---------------------------------------------------------------- a whole run, in process


REAL_LOAD_MODEL = model_settings.load_model


def oom_above(monkeypatch, rows: int, stop_after: int | None = None) -> list[int]:
    """Every model the run loads raises torch's out-of-memory error for more than `rows` rows
    (and Interrupted on the call after `stop_after` successful ones). Returns the rows per call."""
    load = REAL_LOAD_MODEL  # a second call must not wrap the first call's wrapper

    calls: list[int] = []

    def load_model(cfg, device, *kind):
        model = load(cfg, device, *kind)
        generate = model.generate

        def limited(*args, **kwargs):
            n = kwargs["input_ids"].shape[0]
            calls.append(n)
            if n > rows:
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} GiB.")
            if stop_after is not None and sum(c <= rows for c in calls) > stop_after:
                raise Interrupted("interrupted by SIGTERM")
            return generate(*args, **kwargs)

        model.generate = limited
        return model

    monkeypatch.setattr(model_settings, "load_model", load_model)  # engines.load looks it up there
    return calls


def config(tiny_model, data23, save: Path, **kw) -> EvalConfig:
    return EvalConfig(model_name=str(tiny_model), data_dir=str(data23), save_dir=str(save), device="cpu", **kw)


def generations(save: Path) -> list[str]:
    return (save / "test_generations.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def pairs(tiny_model, data23, tmp_path_factory) -> list[str]:
    """The run with --bs 2: exactly the sub-batches of --bs 8 split down to 2 rows (23 examples:
    8 = 2+2+2+2, 8 = 2+2+2+2, 7 = (2+2)+(2+1)), hence the same padding and the same outputs."""
    save = tmp_path_factory.mktemp("pairs") / "out"
    runner.run(config(tiny_model, data23, save, bs=2))
    return generations(save)


def test_a_run_splits_batches_that_run_out_of_memory(tiny_model, data23, tmp_path, monkeypatch, pairs):
    calls = oom_above(monkeypatch, 2)
    outcome = runner.run(config(tiny_model, data23, tmp_path / "out", bs=8))
    assert generations(tmp_path / "out") == pairs
    assert max(calls) == 8 and sum(c <= 2 for c in calls) == 12
    tp = outcome.metrics["throughput"]
    assert tp["split_batches"] == 3 == tp["per_rank"][0]["split_batches"]
    assert tp["per_rank"][0]["out_of_memory_errors"] == 3 + 3 + 3  # 8 -> 4+4 -> 2+2 each; 7 -> 4+3, 4, 3
    assert tp["per_rank"][0]["generated_examples"] == 23 and tp["per_rank"][0]["batches"] == 3
    assert re.search(r"^split_batches +3  \(out of memory: split in halves and retried\)$", outcome.table, re.M)


def test_a_resumed_run_keeps_the_splits_and_the_finished_halves(tiny_model, data23, tmp_path, monkeypatch, pairs):
    save = tmp_path / "out"
    first = oom_above(monkeypatch, 2, stop_after=3)
    with pytest.raises(Interrupted, match="resume with"):
        runner.run(config(tiny_model, data23, save, bs=8))
    assert sum(c <= 2 for c in first) == 4  # 3 pairs done, the 4th interrupted
    calls = oom_above(monkeypatch, 2)
    outcome = runner.run(config(tiny_model, data23, save, bs=8, resume=True))
    # Nothing larger than what fitted runs again, and the 3 finished pairs are not redone.
    assert sum(c > 2 for c in calls) == 3 + 3  # only in the two batches not reached before
    assert sum(c <= 2 for c in calls) == 12 - 3
    assert generations(save) == pairs
    stats = outcome.metrics["throughput"]["per_rank"][0]
    assert stats["generated_examples"] == 23 - 6 and stats["split_batches"] == 3 and stats["resumed_batches"] == 0


def test_a_finished_split_run_resumes_from_its_journal(tiny_model, data23, tmp_path, monkeypatch, pairs):
    save = tmp_path / "out"
    oom_above(monkeypatch, 2)
    runner.run(config(tiny_model, data23, save, bs=8, debug=True))  # --debug keeps the journals
    (save / "test_bleu.json").unlink()
    calls = oom_above(monkeypatch, 2)
    outcome = runner.run(config(tiny_model, data23, save, bs=8, debug=True, resume=True))
    assert calls == [] and generations(save) == pairs
    stats = outcome.metrics["throughput"]["per_rank"][0]
    assert (stats["resumed_batches"], stats["split_batches"], stats["generated_examples"]) == (3, 3, 0)
