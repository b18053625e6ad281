"""The legacy layout read in blocks must give exactly what reading it line by line gives: the
same texts, the same ids, and on bad input the same first error, wherever block boundaries and
read boundaries fall (a multi-byte character, a BOM, a line longer than a read)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import seq2seq_eval.inputs.files as data
from seq2seq_eval.inputs.files import iter_files, iter_lines
from seq2seq_eval.errors import DataError


def _line_by_line(src: Path, refs: list[Path]):
    """The reference semantics: every file line by line, in line order; on one line, invalid
    UTF-8 in any file before an empty text."""
    n = data.count_lines(src)
    for path in refs:
        data._check_count(path, n, src, "source")  # the counts agree before any line is read
    streams = [iter_lines(p) for p in (src, *refs)]
    out = []
    for lineno in range(1, n + 1):
        texts = [next(s)[1] for s in streams]  # raises DataError on invalid UTF-8
        for path, text in zip((src, *refs), texts):
            if not text.strip():
                what = "source" if path == src else "reference"
                raise DataError(f"{path} line {lineno}: blank {what} (empty or whitespace only); expected a text with a non-whitespace character")
        refs_texts = texts[1:]
        target = None if not refs_texts else refs_texts[0] if len(refs_texts) == 1 else tuple(refs_texts)
        out.append((lineno - 1, texts[0], target))
    return out


def _blockwise(src: Path, refs: list[Path], rows: int):
    return [(e.id, e.source, e.target) for b in iter_files(src, refs, rows) for e in b.examples()]


PIECES = ["a", "ü", "日本", "x y", " lead", "tail \t", "\r", "\u2028", "\x1c", "😀", "\xa0"]


def _text(rng: random.Random, bad: bool) -> bytes:
    if bad and rng.random() < 0.15:
        return rng.choice([b"", b"  ", b"\t\r", b"\xff", b"ok\xc3(", b"\xe6\x97"])  # empty, blank, invalid UTF-8
    text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 6)))
    return (text if bad else rng.choice("abc") + text).encode("utf-8")  # a good text is never blank


def _write(path: Path, lines: list[bytes], rng: random.Random) -> None:
    body = b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b"")
    path.write_bytes((b"\xef\xbb\xbf" if rng.random() < 0.3 else b"") + body)


def _outcome(fn):
    try:
        return fn()
    except DataError as e:
        return str(e)


@pytest.mark.parametrize("seed", range(60))
def test_blocks_equal_line_by_line_reading(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    monkeypatch.setattr(data, "READ_BYTES", rng.choice([1, 3, 7, 64, 1 << 20]))
    n = rng.randrange(1, 40)
    bad = seed % 2 == 1  # every other case has empty lines or invalid UTF-8 somewhere
    src = tmp_path / "test.source"
    _write(src, [_text(rng, bad) for _ in range(n)], rng)
    refs = []
    for k in range(rng.randrange(0, 3)):
        refs.append(tmp_path / f"ref{k}")
        _write(refs[-1], [_text(rng, bad) for _ in range(n)], rng)
    expected = _outcome(lambda: _line_by_line(src, refs))
    assert _outcome(lambda: _blockwise(src, refs, rng.choice([1, 2, 5, 1000]))) == expected
    if not bad:
        assert isinstance(expected, list) and len(expected) == n


def test_a_bad_line_after_many_blocks_is_named_by_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "READ_BYTES", 16)
    src, tgt = tmp_path / "s", tmp_path / "t"
    src.write_bytes(b"".join(b"source %d\n" % i for i in range(500)))
    lines = [b"ref %d" % i for i in range(500)]
    lines[433] = b"bad \xe2\x28\xa1"
    tgt.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError, match=r"^.*/t line 434: invalid UTF-8 \(byte 0xe2 at column 5\); expected UTF-8 text$"):
        _blockwise(src, [tgt], 64)
    lines[433] = b"   "
    tgt.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError, match=r"^.*/t line 434: blank reference \(empty or whitespace only\); expected a text with a non-whitespace character$"):
        _blockwise(src, [tgt], 64)
