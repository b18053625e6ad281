"""Input examples: the legacy {type_path}.source/.target layout, JSON Lines, or a datasets split.

Every example carries an id. Predictions are joined to references by that id, never by
position, so an id must be unique and stable: the 0-based line number in the legacy layout, the
record's "id" (or its 0-based line number) in JSON Lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

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
        """sha256 over ids, sources and targets: what a resumed run must see unchanged."""
        h = hashlib.sha256()
        for e in self.items:
            h.update(json.dumps([e.id, e.source, e.target], ensure_ascii=False).encode("utf-8"))
            h.update(b"\n")
        return h.hexdigest()


def read_lines(path: Path) -> list[str]:
    """One text per line. Splits on "\\n" only: str.splitlines() would also split on U+2028 and
    friends inside a line and silently shift every later example against its reference."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise DataError(f"{path}: file not found") from e
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from e
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    chunks = raw.split(b"\n")
    if chunks and chunks[-1] == b"":
        chunks.pop()
    lines = []
    for lineno, chunk in enumerate(chunks, start=1):
        try:
            lines.append(chunk.decode("utf-8").rstrip())
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path} line {lineno}: invalid UTF-8 (byte 0x{chunk[e.start]:02x} at column {e.start + 1}); "
                "expected UTF-8 text"
            ) from e
    return lines


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
    if not data_dir.exists():
        raise DataError(f"--data_dir {data_dir}: no such directory")
    if not data_dir.is_dir():
        raise DataError(f"--data_dir {data_dir}: not a directory (or a .jsonl file)")
    src_path = data_dir / f"{type_path}.source"
    tgt_path = data_dir / f"{type_path}.target"
    if not src_path.exists():
        raise DataError(f"{src_path}: file not found; expected {type_path}.source in --data_dir")
    sources = read_lines(src_path)
    if not sources:
        raise DataError(f"{src_path}: no examples; expected one source per line")
    for i, s in enumerate(sources, start=1):
        _check_text(src_path, i, s, "source")
    targets: list[str | tuple[str, ...] | None]
    if tgt_path.exists():
        tgts = read_lines(tgt_path)
        if len(tgts) != len(sources):
            raise DataError(
                f"{tgt_path}: {len(tgts)} lines but {src_path.name} has {len(sources)}; "
                "expected one reference per source line"
            )
        for i, t in enumerate(tgts, start=1):
            _check_text(tgt_path, i, t, "reference")
        targets = list(tgts)
        extra = [
            read_references(p, len(sources), src_path.name, "source") for p in extra_reference_files(data_dir, type_path)
        ]
        if extra:
            targets = [tuple(refs) for refs in zip(tgts, *extra)]
    elif need_targets:
        raise DataError(f"{tgt_path}: file not found; expected references to score against")
    else:
        targets = [None] * len(sources)
    items = tuple(Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets)))
    return Examples(items, str(data_dir))


def load_jsonl(path: Path, need_targets: bool) -> Examples:
    items: list[Example] = []
    seen: dict[ExampleId, int] = {}
    for lineno, line in enumerate(read_lines(path), start=1):
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
        items.append(Example(ex_id, source, target))  # type: ignore[arg-type]
    if not items:
        raise DataError(f"{path}: no records; expected one JSON object per line")
    return Examples(tuple(items), str(path))


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


def check_unique_ids(ids: Sequence[ExampleId], origin: str) -> None:
    seen: set[ExampleId] = set()
    for i in ids:
        if i in seen:
            raise DataError(f"{origin}: duplicated id {i!r}; expected unique ids")
        seen.add(i)


def load_examples(cfg: EvalConfig, main_first: Callable | None = None) -> Examples:
    """`main_first(fn)` runs fn on rank 0 before the other ranks: a datasets split is then
    prepared (downloaded, converted to Arrow) once, and the others read rank 0's cache."""
    need_targets = not cfg.pseudolabels
    if cfg.dataset is not None:
        from .hf_data import load_hf_examples

        def load() -> Examples:
            return load_hf_examples(cfg, need_targets)

        examples = main_first(load) if main_first is not None else load()
    else:
        path = Path(cfg.data_dir)
        if path.suffix == ".jsonl" or path.is_file():
            if not path.exists():
                raise DataError(f"--data_dir {path}: file not found")
            if path.suffix in (".source", ".target"):
                # Otherwise read as JSON Lines and reported as "line 1: malformed JSON".
                raise DataError(
                    f"--data_dir {path}: a .source/.target file; expected the folder that holds "
                    f"{cfg.type_path}.source and {cfg.type_path}.target (or a .jsonl file)"
                )
            examples = load_jsonl(path, need_targets)
        else:
            examples = load_legacy(path, cfg.type_path, need_targets)
    if cfg.n_obs is not None:
        examples = Examples(examples.items[: cfg.n_obs], examples.origin)
    return examples
