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
    target: str | None


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


def load_legacy(data_dir: Path, type_path: str, need_targets: bool) -> Examples:
    if not data_dir.exists():
        raise DataError(f"--data_dir {data_dir}: no such directory")
    if not data_dir.is_dir():
        raise DataError(f"--data_dir {data_dir}: not a directory (or a .jsonl file)")
    src_path = data_dir / f"{type_path}.source"
    tgt_path = data_dir / f"{type_path}.target"
    if not src_path.exists():
        raise DataError(f"{src_path}: file not found; expected {type_path}.source in --data_dir")
    if not tgt_path.exists() and need_targets:
        raise DataError(f"{tgt_path}: file not found; expected references to score against")
    return load_files(src_path, tgt_path if tgt_path.exists() else None, str(data_dir))


def load_files(src_path: Path, tgt_path: Path | None, origin: str) -> Examples:
    """One source per line and, when given, one reference per line; ids are 0-based line numbers."""
    sources = read_lines(src_path)
    if not sources:
        raise DataError(f"{src_path}: no examples; expected one source per line")
    for i, s in enumerate(sources, start=1):
        _check_text(src_path, i, s, "source")
    targets: list[str | None]
    if tgt_path is not None:
        tgts = read_lines(tgt_path)
        if len(tgts) != len(sources):
            raise DataError(
                f"{tgt_path}: {len(tgts)} lines but {src_path.name} has {len(sources)}; "
                "expected one reference per source line"
            )
        for i, t in enumerate(tgts, start=1):
            _check_text(tgt_path, i, t, "reference")
        targets = list(tgts)
    else:
        targets = [None] * len(sources)
    items = tuple(Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets)))
    return Examples(items, origin)


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
        target = _field(record, "target", path, lineno, required=need_targets)
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


def check_unique_ids(ids: Sequence[ExampleId], origin: str) -> None:
    seen: set[ExampleId] = set()
    for i in ids:
        if i in seen:
            raise DataError(f"{origin}: duplicated id {i!r}; expected unique ids")
        seen.add(i)


def load_examples(cfg: EvalConfig, main_first: Callable | None = None) -> Examples:
    """`main_first(fn)` runs fn on rank 0 before the other ranks: a datasets split is then
    prepared (downloaded, converted to Arrow) once, and the others read rank 0's cache."""
    need_targets = cfg.scored
    if cfg.input_path is not None:
        ref = Path(cfg.reference_path) if cfg.reference_path is not None else None
        examples = load_files(Path(cfg.input_path), ref, cfg.input_path)
    elif cfg.dataset is not None:
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
