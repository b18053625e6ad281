"""Examples from a Hugging Face `datasets` split: a local data file, a save_to_disk folder, or a hub dataset.

--dataset is read as:
  - a local .json/.jsonl/.csv/.parquet file: the file *is* the requested split, whatever its name;
  - a folder written by `save_to_disk`: `datasets.load_from_disk` (a DatasetDict must hold the split);
  - anything else (a hub name, or a folder of data files): `datasets.load_dataset(name, --dataset_config)`.

Columns come from --source_column/--target_column/--id_column; a dotted path such as
`translation.en` reaches into a nested dict column. Without them, common layouts are recognised:
CNN/DailyMail (article, highlights), XSum (document, summary), plain (source, target), and WMT
(a `translation` dict keyed by language, picked with --src_lang/--tgt_lang).

Ids come from --id_column, else an `id` column, else the row number. Messages number rows from 0,
like those default ids.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import DataError
from .columns import (
    _has_path,
    column_paths,
    resolve_columns,
)
from .examples import Example, ExampleId, Examples

logger = logging.getLogger("seq2seq_eval")


FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

"""Local data file extension -> the `datasets` builder that reads it."""


def load_hf_examples(cfg: EvalConfig, need_targets: bool) -> Examples:
    """The examples of split `--split` (default `--type_path`) of `--dataset`, in memory."""
    examples, where = iter_hf_examples(cfg, need_targets)
    return Examples(tuple(examples), where)


SLICE_ROWS = 10_000

"""Rows read from a split at a time: memory stays bounded however large the split."""


def iter_hf_examples(cfg: EvalConfig, need_targets: bool) -> tuple[Iterator[Example], str]:
    """The split's examples one slice at a time, and where they come from (for messages). The
    split is loaded (and checked: rows, columns) at once; its rows are read as the iterator goes."""
    if cfg.dataset is None:
        raise DataError("load_hf_examples needs --dataset")
    split = cfg.split or cfg.type_path
    where = f"dataset {cfg.dataset}" + (f" ({cfg.dataset_config})" if cfg.dataset_config else "") + f" split {split}"
    # Said only for hub datasets, which may download for a while; a local file loads at once.
    local = Path(cfg.dataset).expanduser().exists()
    logger.log(logging.DEBUG if local else logging.INFO, "loading %s", where)
    with _progress_bars(cfg.debug):
        ds = load_split(cfg.dataset, cfg.dataset_config, split)
    if len(ds) == 0:
        raise DataError(f"{where}: no rows; expected at least one example")
    if cfg.n_obs is not None and cfg.n_obs < len(ds):
        # Before reading any column: --n_obs 100 on a 300k-row split reads 100 rows.
        ds = ds.select(range(cfg.n_obs))
    features = ds.features
    src_col, tgt_col = resolve_columns(features, cfg, where, need_targets)
    has_targets = isinstance(tgt_col, tuple) or (tgt_col is not None and _has_path(features, tgt_col))
    if not has_targets and need_targets:
        raise DataError(
            f"{where}: no target column{f' {tgt_col!r}' if tgt_col else ''}; expected references to score against "
            f"(pass --target_column); columns: {', '.join(column_paths(features))}"
        )

    def rows() -> Iterator[Example]:
        first_row: dict[ExampleId, int] = {}
        for base in range(0, len(ds), SLICE_ROWS):
            part = ds.select(range(base, min(base + SLICE_ROWS, len(ds))))
            sources = _texts(part, src_col, where, base)
            targets = _references(part, tgt_col, where, base) if has_targets else [None] * len(sources)
            ids = _ids(part, cfg.id_column, where, base, first_row)
            yield from (Example(i, s, t) for i, s, t in zip(ids, sources, targets))

    return rows(), where


def load_split(name: str, config: str | None, split: str) -> Any:
    """One split as a `datasets.Dataset`; every failure is a one-line DataError."""
    import datasets
    from datasets.exceptions import DatasetsError

    path = Path(name).expanduser()
    try:
        if path.suffix.lower() in FILE_BUILDERS:
            if not path.is_file():
                raise DataError(f"--dataset {name}: file not found")
            builder = FILE_BUILDERS[path.suffix.lower()]
            # CSV cells are read as the text the file holds: type inference would turn an id
            # "000" into the integer 0 (and "007" into 7, colliding ids that differ as text).
            options = {"features": _csv_text_features(path), "keep_default_na": False} if builder == "csv" else {}
            # data_files={split: file}: a lone file is the requested split, so `test.jsonl` needs no --split.
            try:
                return datasets.load_dataset(builder, data_files={split: str(path)}, split=split, **options)
            except DatasetsError as e:
                if builder == "json":
                    where = _first_schema_difference(path)
                    if where:
                        raise DataError(f"{path} {where}") from e
                raise
        if path.is_file():
            raise DataError(
                f"--dataset {name}: unsupported file type {path.suffix or '(none)'!r}; "
                f"expected one of {', '.join(sorted(FILE_BUILDERS))} or a save_to_disk folder"
            )
        if path.is_dir() and _is_saved_dataset(path):
            saved = datasets.load_from_disk(str(path))
            if isinstance(saved, datasets.DatasetDict):
                return _pick_split(saved, split, name)
            return saved  # a saved single Dataset stands for the requested split
        if _looks_local(name) and not path.exists():
            raise DataError(f"--dataset {name}: no such file or folder")
        # A hub name, or a folder of data files: check the split before preparing anything, so a
        # typo does not first download every split of a large dataset.
        builder = datasets.load_dataset_builder(name, config)
        available = list(builder.info.splits or {}) or list(builder.config.data_files or {})
        if available and split not in available:
            raise DataError(_missing_split(name, split, available))
        builder.download_and_prepare()
        return builder.as_dataset(split=split)
    except DataError:
        raise
    except (OSError, ValueError, KeyError, DatasetsError) as e:
        raise DataError(f"--dataset {name}: cannot load split {split} ({_reason(e)})") from e


def _csv_text_features(path: Path) -> Any:
    import csv

    import datasets

    with open(path, encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise DataError(f"{path}: no header line; expected a CSV file whose first line names its columns")
    return datasets.Features({name: datasets.Value("string") for name in header})


def _first_schema_difference(path: Path) -> str | None:
    """Where a JSON Lines file stops matching its first record's columns and value kinds: what
    `datasets` reports only as "Couldn't cast", without the line or the column."""
    import json

    def kind(value: Any) -> str:
        return {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list",
                dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)

    first: dict[str, str] | None = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return f"line {lineno}: malformed JSON; expected one JSON object per line"
            if not isinstance(record, dict):
                return f"line {lineno}: expected a JSON object, got {kind(record)}"
            kinds = {k: kind(v) for k, v in record.items()}
            if first is None:
                first, first_line = kinds, lineno
                continue
            for key, k in kinds.items():
                if key not in first:
                    return (f"line {lineno}: column {key!r} is not in line {first_line}; "
                            f"expected the same columns in every record ({', '.join(first)})")
                if k != first[key] and "null" not in (k, first[key]):
                    return (f"line {lineno}: column {key!r} holds {k} where line {first_line} holds {first[key]}; "
                            "expected one kind of value per column")
            for key in first:
                if key not in kinds:
                    return (f"line {lineno}: column {key!r} is missing (line {first_line} has it); "
                            f"expected the same columns in every record ({', '.join(first)})")
    return None


def _looks_local(name: str) -> bool:
    """A hub name never starts like a path; such a name that does not exist is a typo, not a download."""
    return name.startswith((".", "/", "~"))


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _pick_split(dd: Mapping[str, Any], split: str, name: str) -> Any:
    if split not in dd:
        raise DataError(_missing_split(name, split, list(dd)))
    return dd[split]


def _missing_split(name: str, split: str, available: Sequence[Any]) -> str:
    names = ", ".join(str(s) for s in available)
    return f"--dataset {name}: no split {split!r}; available splits: {names} (pass --split)"


def _reason(e: BaseException) -> str:
    """The first line of the message; of its cause for DatasetGenerationError, whose own message
    ("An error occurred while generating the dataset") does not say what is wrong."""
    from datasets.exceptions import DatasetGenerationError

    if isinstance(e, DatasetGenerationError) and e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """datasets' "Generating test split" bars, once per rank, only with --debug; restored after."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    if not show:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled and not show:
            datasets.enable_progress_bars()


def _values(ds: Any, path: str) -> list[Any]:
    """The values at a column path, one per row; None where a nested key is missing in a row."""
    # ds[col][:] reads the column in one Arrow conversion; iterating ds[col] would go row by row
    # (25x slower on a 300k-row split).
    if path in ds.column_names:
        return ds[path][:]
    top, *keys = path.split(".")
    values = []
    for value in ds[top][:]:
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        values.append(value)
    return values


def _texts(ds: Any, path: str, where: str, base: int = 0) -> list[str]:
    values = _values(ds, path)
    for row, value in enumerate(values, start=base):
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{where} row {row} column {path!r}: expected a non-empty string, got {_short(value)}")
    return values


def _references(ds: Any, columns: str | tuple[str, ...], where: str, base: int = 0) -> list[str | tuple[str, ...]]:
    """Each row's reference(s), from one or more target columns, each holding a string or a list of
    strings per row. A row with one reference gets a str, one with several a tuple (in column order)."""
    per_row: list[list[str]] = [[] for _ in range(len(ds))]
    for column in (columns,) if isinstance(columns, str) else columns:
        for i, value in enumerate(_values(ds, column)):
            row = base + i
            if isinstance(value, list):
                if not value:
                    raise DataError(f"{where} row {row} column {column!r}: an empty list; expected one or more references")
                for k, item in enumerate(value):
                    if not isinstance(item, str) or not item.strip():
                        raise DataError(
                            f"{where} row {row} column {column!r} item {k}: expected a non-empty string, got {_short(item)}"
                        )
                per_row[i].extend(value)
            elif isinstance(value, str) and value.strip():
                per_row[i].append(value)
            else:
                raise DataError(f"{where} row {row} column {column!r}: expected a non-empty string, got {_short(value)}")
    return [refs[0] if len(refs) == 1 else tuple(refs) for refs in per_row]


def _ids(ds: Any, id_column: str | None, where: str, base: int = 0,
         first_row: dict[ExampleId, int] | None = None) -> list[ExampleId]:
    """Ids from --id_column, else an "id" column when present, else the 0-based row number.
    `first_row` carries the ids seen in earlier slices, so duplicates are found across them."""
    column = id_column or ("id" if "id" in ds.column_names else None)
    if column is None:
        return list(range(base, base + len(ds)))
    ids = _values(ds, column)
    first_row = {} if first_row is None else first_row
    for row, value in enumerate(ids, start=base):
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise DataError(f"{where} row {row} column {column!r}: an id must be a string or an integer, got {_short(value)}")
        if value in first_row:
            raise DataError(
                f"{where} row {row} column {column!r}: duplicated id {value!r} (first in row {first_row[value]}); "
                "expected unique ids"
            )
        first_row[value] = row
    return ids


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
