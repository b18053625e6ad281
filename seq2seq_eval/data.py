"""Input examples: the legacy {type_path}.source/.target layout, JSON Lines, or a datasets split.

Every example carries an id. Predictions are joined to references by that id, never by
position, so an id must be unique and stable: the 0-based line number in the legacy layout, the
record's "id" (or its 0-based line number) in JSON Lines.
"""

from __future__ import annotations

import json
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import EvalConfig
from .errors import DataError

ExampleId = int | str


@dataclass(frozen=True)
class Example:
    id: ExampleId
    source: str
    target: str | tuple[str, ...] | None
    """One reference as a str, several as a tuple of two or more, None when there are none."""

    @property
    def references(self) -> tuple[str, ...]:
        """The reference(s) as a tuple, whatever the count (empty when there are none)."""
        if self.target is None:
            return ()
        return (self.target,) if isinstance(self.target, str) else tuple(self.target)


@dataclass(frozen=True)
class Examples:
    items: tuple[Example, ...]
    origin: str  # where they came from, for messages and the manifest

    def __len__(self) -> int:
        return len(self.items)

    @property
    def ids(self) -> list[ExampleId]:
        return [e.id for e in self.items]

    def fingerprint(self) -> str:
        """What a run records as its data's sha256 (see store.fingerprint)."""
        from .store import fingerprint

        return fingerprint(self.items)


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


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for each line, read as a stream: a file of any size costs one
    line of memory. Same rules as read_lines: UTF-8 (a BOM is dropped), "\\n" ends a line, trailing
    whitespace (a "\\r" too) is removed."""
    with _open(path) as f:
        for lineno, chunk in enumerate(f, start=1):  # binary mode: lines end at b"\n" only
            if lineno == 1 and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
            if chunk.endswith(b"\n"):
                chunk = chunk[:-1]
            try:
                yield lineno, chunk.decode("utf-8").rstrip()
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path} line {lineno}: invalid UTF-8 (byte 0x{chunk[e.start]:02x} at column {e.start + 1}); "
                    "expected UTF-8 text"
                ) from e


def count_lines(path: Path) -> int:
    """What len(read_lines(path)) would be, counted in 1 MiB blocks without decoding."""
    n, last = 0, b"\n"
    with _open(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _check_text(path: Path, lineno: int, text: str, what: str) -> None:
    if not text.strip():
        raise DataError(f"{path} line {lineno}: empty {what}; expected non-empty text")


def read_references(path: Path, n_lines: int, against: str, per: str) -> list[str]:
    """A reference file: `n_lines` non-empty lines, one per `per` line of the file `against`."""
    refs = read_lines(path)
    if len(refs) != n_lines:
        raise DataError(f"{path}: {len(refs)} lines but {against} has {n_lines}; expected one reference per {per} line")
    for i, t in enumerate(refs, start=1):
        _check_text(path, i, t, "reference")
    return refs


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
    return Examples(tuple(iter_legacy(data_dir, type_path, need_targets)), str(data_dir))


def iter_legacy(data_dir: Path, type_path: str, need_targets: bool) -> Iterator[Example]:
    """The legacy layout as a stream; the id is the 0-based line number. Every file is checked
    (it exists, the line counts agree) before the first example is yielded."""
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
        raise DataError(f"{tgt_path}: file not found; expected references to score against")
    return iter_files(src_path, ref_paths)


def iter_files(src_path: Path, ref_paths: Sequence[Path]) -> Iterator[Example]:
    """One source per line and one reference per line of each reference file, as a stream; ids
    are 0-based line numbers. The line counts are checked before the first example is yielded."""
    n = count_lines(src_path)
    if n == 0:
        raise DataError(f"{src_path}: no examples; expected one source per line")
    for path in ref_paths:
        _check_count(path, n, src_path, "source")
    return _rows(src_path, list(ref_paths))


def _rows(src_path: Path, ref_paths: list[Path]) -> Iterator[Example]:
    ref_streams = [iter_lines(p) for p in ref_paths]
    for (lineno, source), *refs in zip(iter_lines(src_path), *ref_streams):
        _check_text(src_path, lineno, source, "source")
        for path, (_, ref) in zip(ref_paths, refs):
            _check_text(path, lineno, ref, "reference")
        texts = tuple(ref for _, ref in refs)
        target = None if not texts else texts[0] if len(texts) == 1 else texts
        yield Example(lineno - 1, source, target)


def load_jsonl(path: Path, need_targets: bool) -> Examples:
    return Examples(tuple(iter_jsonl(path, need_targets)), str(path))


def iter_jsonl(path: Path, need_targets: bool) -> Iterator[Example]:
    """JSON Lines as a stream: {"id": ..., "source": ..., "target": ...} per line."""
    seen: dict[ExampleId, int] = {}
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(record, dict):
            raise DataError(f"{path} line {lineno}: expected a JSON object, got {type(record).__name__}")
        ex_id = record.get("id", lineno - 1)
        if isinstance(ex_id, bool) or not isinstance(ex_id, (int, str)):
            raise DataError(f"{path} line {lineno}: field 'id' must be a string or an integer, got {ex_id!r}")
        if ex_id in seen:
            raise DataError(f"{path} line {lineno}: duplicated id {ex_id!r} (first on line {seen[ex_id]})")
        seen[ex_id] = lineno
        source = _field(record, "source", path, lineno, required=True)
        target = _target_field(record, path, lineno, required=need_targets)
        yield Example(ex_id, source, target)  # type: ignore[arg-type]
    if not seen:
        raise DataError(f"{path}: no records; expected one JSON object per line")


def _field(record: dict, name: str, path: Path, lineno: int, required: bool) -> str | None:
    if name not in record:
        if required:
            raise DataError(f"{path} line {lineno}: missing field {name!r}; expected a non-empty string")
        return None
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{path} line {lineno}: field {name!r} must be a non-empty string, got {value!r}")
    return value


def _target_field(record: dict, path: Path, lineno: int, required: bool) -> str | tuple[str, ...] | None:
    """The "target" field: a non-empty string, or a list of them for several references (a list
    of one is kept as a plain string: the same example as without the list)."""
    value = record.get("target")
    if not isinstance(value, list):
        return _field(record, "target", path, lineno, required)
    if not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise DataError(
            f"{path} line {lineno}: field 'target' must be a non-empty string or a non-empty list of "
            f"non-empty strings, got {value!r}"
        )
    return value[0] if len(value) == 1 else tuple(value)


def load_examples(cfg: EvalConfig) -> Examples:
    """Every example in memory: for small inputs (compare, tests). A run streams them instead."""
    examples, origin = iter_examples(cfg)
    return Examples(tuple(examples), origin)


def iter_examples(cfg: EvalConfig) -> tuple[Iterator[Example], str]:
    """The examples the run evaluates (the first --n_obs), as a stream, and where they come from.
    The input is opened and checked at once; its rows are read as the iterator goes."""
    need_targets = cfg.scored
    if cfg.dataset is not None:
        from .hf_data import iter_hf_examples

        return iter_hf_examples(cfg, need_targets)  # applies --n_obs before reading any column
    path = Path(cfg.data_dir)
    if cfg.input_path is not None:  # the legacy run_eval.py command line
        path = Path(cfg.input_path)
        refs = [Path(cfg.reference_path)] if cfg.reference_path is not None else []
        examples = iter_files(path, refs)
    elif path.suffix == ".jsonl" or path.is_file():
        if not path.exists():
            raise DataError(f"--data_dir {path}: file not found")
        if path.suffix in (".source", ".target"):
            # Otherwise read as JSON Lines and reported as "line 1: malformed JSON".
            raise DataError(
                f"--data_dir {path}: a .source/.target file; expected the folder that holds "
                f"{cfg.type_path}.source and {cfg.type_path}.target (or a .jsonl file)"
            )
        examples = iter_jsonl(path, need_targets)
    else:
        examples = iter_legacy(path, cfg.type_path, need_targets)
    if cfg.n_obs is not None:
        examples = itertools.islice(examples, cfg.n_obs)
    return examples, str(path)
