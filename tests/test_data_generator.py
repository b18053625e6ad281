"""The committed sample data is exactly what scripts/make_data.py generates, and has the
properties the rest of the test suite relies on (ragged sizes, varied lengths, digits, accents)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
TASKS = ("translation", "summarization")
FILES = [f"{split}.{side}" for split in ("train", "val", "test") for side in ("source", "target")]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("regenerated")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_data.py"), "--out", str(out)],
                   check=True, capture_output=True)
    return out


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", FILES)
def test_committed_data_is_reproducible(regenerated: Path, task: str, name: str) -> None:
    committed = (SAMPLES / task / name).read_bytes()
    assert (regenerated / task / name).read_bytes() == committed, f"{task}/{name} differs from make_data.py output"


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", FILES)
def test_files_are_clean_utf8_lines(task: str, name: str) -> None:
    raw = (SAMPLES / task / name).read_bytes()
    text = raw.decode("utf-8")
    assert text.endswith("\n")
    assert "\r" not in text and "\t" not in text
    lines = read_lines(SAMPLES / task / name)
    assert all(line.strip() == line and line for line in lines), "empty line or stray whitespace"


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_sources_and_targets_align(task: str, split: str) -> None:
    sources = read_lines(SAMPLES / task / f"{split}.source")
    targets = read_lines(SAMPLES / task / f"{split}.target")
    assert len(sources) == len(targets)


@pytest.mark.parametrize("task", TASKS)
def test_test_set_is_not_a_multiple_of_common_batch_sizes(task: str) -> None:
    n = len(read_lines(SAMPLES / task / "test.source"))
    assert 200 <= n <= 1000
    assert all(n % b for b in (2, 4, 8, 16, 32, 64)), f"{task} test size {n}"


@pytest.mark.parametrize("task", TASKS)
def test_test_set_never_repeats_a_training_source(task: str) -> None:
    train = set(read_lines(SAMPLES / task / "train.source"))
    test = read_lines(SAMPLES / task / "test.source")
    assert len(set(test)) == len(test)
    assert not train.intersection(test)


def test_translation_test_lengths_vary_widely() -> None:
    lengths = [len(line.split()) for line in read_lines(SAMPLES / "translation" / "test.source")]
    assert min(lengths) <= 5
    assert max(lengths) >= 50
    assert sum(n <= 5 for n in lengths) >= 10 and sum(n >= 50 for n in lengths) >= 5


def test_summarization_sources_are_multi_sentence_and_long() -> None:
    sources = read_lines(SAMPLES / "summarization" / "test.source")
    lengths = [len(line.split()) for line in sources]
    assert min(lengths) <= 20 and max(lengths) >= 60
    # Every passage has at least two sentences, since ROUGE-Lsum splits on them.
    assert all(line.count(". ") >= 1 for line in sources)
    targets = read_lines(SAMPLES / "summarization" / "test.target")
    assert all(3 <= len(t.split()) <= 15 for t in targets)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("side", ["source", "target"])
def test_test_set_has_digits_and_non_ascii(task: str, side: str) -> None:
    lines = read_lines(SAMPLES / task / f"test.{side}")
    assert sum(any(c.isdigit() for c in line) for line in lines) >= 20
    assert sum(any(ord(c) > 127 for c in line) for line in lines) >= 20


def test_bench_option_writes_a_larger_test_set_elsewhere(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_data.py"), "--task", "translation",
                    "--bench", "600", "--out", str(tmp_path)], check=True, capture_output=True)
    sources = read_lines(tmp_path / "translation" / "test.source")
    assert len(sources) == len(read_lines(tmp_path / "translation" / "test.target")) == 600
    assert not (tmp_path / "translation" / "train.source").exists()
    assert not (tmp_path / "summarization").exists()
    committed = set(read_lines(SAMPLES / "translation" / "test.source"))
    assert len(committed.intersection(sources)) < 30  # another seed, not a copy of the committed set
