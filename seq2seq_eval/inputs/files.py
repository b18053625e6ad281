"""Text inputs: the legacy {type_path}.source/.target layout (with .target.1, .target.2... for more
references), a source file with its reference file (the run_eval.py command line), and JSON Lines.
Read as streams of blocks, with errors that name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import DataError
from .checks import blank, check_id, check_references, check_text, duplicate_id
from .examples import BLOCK_ROWS, Block, Example, ExampleId, Examples
from .seen import SeenIds


def read_lines(path: Path) -> list[str]:
    """One text per line. Splits on "\\n" only: str.splitlines() would also split on U+2028 and
    friends inside a line and silently shift every later example against its reference."""
    return [text for _, text in iter_lines(path)]


def _open(path: Path) -> Any:
    try:
        return open(path, "rb")
    except FileNotFoundError as e:
        raise DataError(f"{path}: file not found") from e
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from e


def _invalid_utf8(path: Path, lineno: int, line: bytes, e: UnicodeDecodeError) -> str:
    return (f"{path} line {lineno}: invalid UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1}); "
            "expected UTF-8 text")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for each line, read as a stream: a file of any size costs one
    line of memory. Same rules as read_lines: UTF-8 (a BOM is dropped), "\\n" ends a line, trailing
    whitespace (a "\\r" too) is removed."""
    for lineno, _, text in iter_lines_at(path):
        yield lineno, text


def iter_lines_at(path: Path, start: int = 0, first: int = 1) -> Iterator[tuple[int, int, str]]:
    """iter_lines with each line's byte offset, from the line at byte `start` (numbered `first`):
    a reader that indexed a file once goes back to any of its lines (selection/candidates.py)."""
    with _open(path) as f:
        f.seek(start)
        offset = start
        for lineno, chunk in enumerate(f, start=first):  # binary mode: lines end at b"\n" only
            at, offset = offset, offset + len(chunk)
            if at == 0 and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
            if chunk.endswith(b"\n"):
                chunk = chunk[:-1]
            try:
                text = chunk.decode("utf-8").rstrip()
            except UnicodeDecodeError as e:
                raise DataError(_invalid_utf8(path, lineno, chunk, e)) from e
            yield lineno, at, text


def count_lines(path: Path) -> int:
    """What len(read_lines(path)) would be, counted in 1 MiB blocks without decoding."""
    n, last = 0, b"\n"
    with _open(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


READ_BYTES = 1 << 22

"""Bytes read from a line file at a time by _Lines."""


class _Lines:
    """A line file read as iter_lines reads it (same rules, same messages), but decoded a few
    MiB at a time and handed out in lists: a Python call per line is most of what reading a
    million-line file costs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = _open(path)
        self._texts: list[str] = []
        self._bad: dict[int, str] = {}  # index into _texts -> the line's invalid-UTF-8 message
        self._read = 0  # lines handed out so far
        self._rest = b""
        self._eof = False
        self._started = False

    def _fill(self) -> None:
        block = self._f.read(READ_BYTES)
        data = self._rest + block
        if not self._started and (len(data) >= 3 or not block):  # a BOM is whole before it is dropped
            self._started = True
            if data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]
        if not block:
            self._eof = True
            self._f.close()
            end = len(data)  # a last line without its newline
        else:
            end = data.rfind(b"\n") + 1 if self._started else 0
        whole, self._rest = data[:end], data[end:]
        if not whole:
            return
        if whole.endswith(b"\n"):
            whole = whole[:-1]
        base = self._read + len(self._texts)  # lines before this block
        try:
            texts = whole.decode("utf-8").split("\n")  # UTF-8 never has a 0x0a inside a character
        except UnicodeDecodeError:
            texts = []
            for i, line in enumerate(whole.split(b"\n")):
                try:
                    texts.append(line.decode("utf-8"))
                except UnicodeDecodeError as e:
                    self._bad[len(self._texts) + i] = _invalid_utf8(self.path, base + i + 1, line, e)
                    texts.append("?")
        self._texts.extend(map(str.rstrip, texts))

    def take(self, n: int) -> tuple[list[str], dict[int, str]]:
        """The next `n` lines (fewer at the end) and their invalid-UTF-8 messages by index."""
        while len(self._texts) < n and not self._eof:
            self._fill()
        texts, self._texts = self._texts[:n], self._texts[n:]
        bad = {i: m for i, m in self._bad.items() if i < n}
        self._bad = {i - n: m for i, m in self._bad.items() if i >= n}
        self._read += len(texts)
        return texts, bad

    def close(self) -> None:
        self._f.close()


def _empty_text(path: Path, lineno: int, what: str) -> str:
    return f"{path} line {lineno}: {blank(what)}"  # the line lost its trailing whitespace: it was either


def check_lines(path: Path, texts: Sequence[str], what: str) -> list[str]:
    """A file's lines (read_lines), each a source or reference text (inputs.checks): the line
    that is not says so."""
    if "" in texts:  # lines lose their trailing whitespace: a line that is not a text is exactly an empty one
        raise DataError(_empty_text(path, list(texts).index("") + 1, what))
    return list(texts)


def read_references(path: Path, n_lines: int, against: str, per: str, what: str = "reference") -> list[str]:
    """A file of `what` texts (references; sources beside predictions for score and compare):
    `n_lines` non-empty lines, one per `per` line of the file `against`."""
    texts = read_lines(path)
    if len(texts) != n_lines:
        raise DataError(f"{path}: {len(texts)} lines but {against} has {n_lines}; expected one {what} per {per} line")
    return check_lines(path, texts, what)


def _check_count(path: Path, n_lines: int, against: Path, per: str) -> None:
    found = count_lines(path)
    if found != n_lines:
        raise DataError(f"{path}: {found} lines but {against.name} has {n_lines}; expected one reference per {per} line")


def extra_reference_files(data_dir: Path, type_path: str) -> list[Path]:
    """{type_path}.target.1, .target.2, ...: the references beyond {type_path}.target.

    Numbered from 1 without gaps; a stray number (a .target.3 with no .target.2) is an error
    rather than a reference set silently left out.
    """
    prefix = f"{type_path}.target."
    numbers = {}
    for path in data_dir.glob(f"{type_path}.target.*"):
        suffix = path.name[len(prefix):]
        if suffix.isdigit():
            numbers[int(suffix)] = path
    expected = list(range(1, len(numbers) + 1))
    if sorted(numbers) != expected:
        missing = next(k for k in range(1, max(numbers) + 2) if k not in numbers)
        found = next(numbers[k] for k in sorted(numbers) if k > missing)
        raise DataError(
            f"{found}: found, but {prefix}{missing} is missing; expected extra references numbered "
            f"{prefix}1, {prefix}2, ... without gaps"
        )
    return [numbers[k] for k in expected]


def load_legacy(data_dir: Path, type_path: str, need_targets: bool) -> Examples:
    blocks = iter_legacy(data_dir, type_path, need_targets)
    return Examples(tuple(e for b in blocks for e in b.examples()), str(data_dir))


def iter_legacy(data_dir: Path, type_path: str, need_targets: bool, rows: int = BLOCK_ROWS,
                missing: Callable[[str], str | None] | None = None) -> Iterator[Block]:
    """The legacy layout as a stream of blocks of `rows` examples; the id is the 0-based line
    number. Every file is checked (it exists, the line counts agree) before the first block.
    `missing`: the run's error where the references are missing (given why), or None."""
    if not data_dir.exists():
        raise DataError(f"--data_dir {data_dir}: no such directory")
    if not data_dir.is_dir():
        raise DataError(f"--data_dir {data_dir}: not a directory (or a .jsonl file)")
    src_path = data_dir / f"{type_path}.source"
    tgt_path = data_dir / f"{type_path}.target"
    if not src_path.exists():
        raise DataError(f"{src_path}: file not found; expected {type_path}.source in --data_dir")
    ref_paths: list[Path] = []
    if tgt_path.exists():
        ref_paths = [tgt_path, *extra_reference_files(data_dir, type_path)]
    elif need_targets:
        why = f"{tgt_path}: file not found"
        raise DataError((missing(why) if missing is not None else None) or f"{why}; expected references to score against")
    return iter_files(src_path, ref_paths, rows)


def iter_files(src_path: Path, ref_paths: Sequence[Path], rows: int = BLOCK_ROWS) -> Iterator[Block]:
    """One source per line and one reference per line of each reference file, as a stream of
    blocks; ids are 0-based line numbers. The line counts are checked before the first block."""
    n = count_lines(src_path)
    if n == 0:
        raise DataError(f"{src_path}: no examples; expected one source per line")
    for path in ref_paths:
        _check_count(path, n, src_path, "source")
    return _blocks(src_path, list(ref_paths), rows)


def _blocks(src_path: Path, ref_paths: list[Path], rows: int) -> Iterator[Block]:
    readers = [_Lines(p) for p in (src_path, *ref_paths)]
    what = ["source"] + ["reference"] * len(ref_paths)
    first = 0  # 0-based line number of the block's first line
    try:
        while True:
            taken = [r.take(rows) for r in readers]
            if not taken[0][0]:
                return
            # The first problem in line order, as a line-by-line reader meets it: on one line,
            # invalid UTF-8 in any file comes before an empty text. Lines lose their trailing
            # whitespace, so a line that is not a text (checks.is_text) is exactly an empty one,
            # found at C speed.
            problems = []
            for k, (reader, (texts, bad)) in enumerate(zip(readers, taken)):
                problems += [(i, 0, k, m) for i, m in bad.items()]
                if "" in texts:
                    i = texts.index("")
                    problems.append((i, 1, k, _empty_text(reader.path, first + i + 1, what[k])))
            if problems:
                raise DataError(min(problems)[3])
            sources, refs = taken[0][0], [texts for texts, _ in taken[1:]]
            yield Block(range(first, first + len(sources)), sources, reference_sets=refs or None)
            first += len(sources)
    finally:
        for r in readers:
            r.close()


def load_jsonl(path: Path, need_targets: bool) -> Examples:
    return Examples(tuple(iter_jsonl(path, need_targets)), str(path))


def json_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for each non-blank line of a JSON Lines file: the one
    reader of JSON Lines, for --data_dir and for --dataset (inputs/jsonfile.py)."""
    for lineno, _, record in json_records_at(path):
        yield lineno, record


def json_records_at(path: Path, start: int = 0, first: int = 1) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """json_records with each record's byte offset, from the line at byte `start` (numbered `first`)."""
    for lineno, at, line in iter_lines_at(path, start, first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(record, dict):
            raise DataError(f"{path} line {lineno}: expected a JSON object, got {type(record).__name__}")
        yield lineno, at, record


def iter_jsonl(path: Path, need_targets: bool, fields: Sequence[str] = ()) -> Iterator[Example]:
    """JSON Lines as a stream: {"id": ..., "source": ..., "target": ...} per line; `fields`: the
    other fields (texts) each record must have, which a decoder-only model's prompt template names."""
    seen = SeenIds()  # 8 bytes an id, not a dict entry (inputs/seen.py)
    for lineno, record in json_records(path):
        ex_id = check_id(record.get("id", lineno - 1), lambda: f"{path} line {lineno} field 'id'")
        if seen.add(ex_id):
            _check_duplicates(path, lineno)
        source = _field(record, "source", path, lineno, required=True)
        target = _target_field(record, path, lineno, required=need_targets)
        named = {name: _template_field(record, name, path, lineno) for name in fields} if fields else None
        yield Example(ex_id, source, target, named)  # type: ignore[arg-type]
    if seen.flush():
        _check_duplicates(path, None)
    if not seen.count:
        raise DataError(f"{path}: no records; expected one JSON object per line")


def _check_duplicates(path: Path, upto: int | None) -> None:
    """The first id of lines 1..upto (all lines: None) that repeats an earlier one, as an error
    naming both lines; nothing when a suspected duplicate was two ids sharing a hash. Only
    called on a suspicion (seen.py), so the dict here is the rare path's."""
    first: dict[ExampleId, int] = {}
    for lineno, line in iter_lines(path):
        if upto is not None and lineno > upto:
            return
        if not line.strip():
            continue
        record = json.loads(line)
        ex_id = record.get("id", lineno - 1)
        if ex_id in first:
            raise duplicate_id(f"{path} line {lineno}", ex_id, f"on line {first[ex_id]}")
        first[ex_id] = lineno


def _field(record: dict, name: str, path: Path, lineno: int, required: bool) -> str | None:
    if name not in record:
        if required:
            raise DataError(f"{path} line {lineno}: missing field {name!r}; expected a non-empty string")
        return None
    what = "reference" if name == "target" else name
    return check_text(record[name], what, lambda: f"{path} line {lineno} field {name!r}")


def _template_field(record: dict, name: str, path: Path, lineno: int) -> str:
    if name not in record:
        raise DataError(f"{path} line {lineno}: missing field {name!r}, which --prompt_template names; expected a "
                        "non-empty string")
    return check_text(record[name], name,
                      lambda: f"{path} line {lineno} field {name!r} (which --prompt_template names)")


def _target_field(record: dict, path: Path, lineno: int, required: bool) -> str | tuple[str, ...] | None:
    """The "target" field: a text, or a list of them for several references (a list of one is
    kept as a plain string: the same example as without the list)."""
    if "target" not in record:
        return _field(record, "target", path, lineno, required)
    return check_references(record["target"], lambda: f"{path} line {lineno} field 'target'")
