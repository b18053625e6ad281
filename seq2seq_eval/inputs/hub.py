"""Examples from a Hugging Face `datasets` split: a local data file, a save_to_disk folder, or a hub dataset.

--dataset is read as:
  - a local .json/.jsonl/.csv/.parquet file: the file *is* the requested split, whatever its name;
    a JSON Lines or JSON file is read as --data_dir reads it, each value as the file holds it
    (inputs/jsonfile.py), the others by the `datasets` loaders (CSV cells as text);
  - a folder written by `save_to_disk`: `datasets.load_from_disk` (a DatasetDict must hold the split);
  - anything else (a hub name, or a folder of data files): `datasets.load_dataset(name, --dataset_config)`.

Columns come from --source_column/--target_column/--id_column; a dotted path such as
`translation.en` reaches into a nested dict column. Without them, common layouts are recognised:
CNN/DailyMail (article, highlights), XSum (document, summary), plain (source, target), and WMT
(a `translation` dict keyed by language, picked with --src_lang/--tgt_lang).

Ids come from --id_column, else an `id` column, else the row number (in a JSON Lines file, as
--data_dir numbers them: the 0-based line number). Messages number rows from 0. Every value is
checked by inputs.checks, as every other input is.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import DataError
from .columns import (
    _has_path,
    column_paths,
    reference_paths,
    resolve_columns,
)
from .checks import UniqueIds, check_references, check_texts
from .examples import Example, Examples
from .jsonfile import json_slices
from .leaks import ID_FIELD, check_columns

logger = logging.getLogger("seq2seq_eval")


FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

"""Local data file extension -> the `datasets` builder that reads it."""


def load_hf_examples(cfg: EvalConfig, need_targets: bool) -> Examples:
    """The examples of split `--split` (default `--type_path`) of `--dataset`, in memory."""
    examples, where = iter_hf_examples(cfg, need_targets)
    return Examples(tuple(examples), where)


SLICE_ROWS = 10_000

"""Rows read from a split at a time: memory stays bounded however large the split."""


def iter_hf_examples(cfg: EvalConfig, need_targets: bool, fields: Sequence[str] = ()) -> tuple[Iterator[Example], str]:
    """The split's examples one slice at a time, and where they come from (for messages). The
    split is loaded (and checked: rows, columns) at once; its rows are read as the iterator goes.
    A local JSON Lines or JSON file is read as --data_dir reads it (inputs/jsonfile.py).
    `fields`: the other fields a decoder-only model's prompt template names: columns (texts), and
    {id}, the example's id (filled in by inputs.leaks), which is checked here with them: none may
    be a reference column, nor the source (inputs/leaks.py)."""
    if cfg.dataset is None:
        raise DataError("load_hf_examples needs --dataset")
    split = cfg.split or cfg.type_path
    where = f"dataset {cfg.dataset}" + (f" ({cfg.dataset_config})" if cfg.dataset_config else "") + f" split {split}"
    file = Path(cfg.dataset).expanduser()
    if file.is_file() and FILE_BUILDERS.get(file.suffix.lower()) == "json":
        features, slices = json_slices(file, cfg.n_obs, cfg.id_column, SLICE_ROWS)
        id_col = cfg.id_column or "id"
    else:
        ds = _load(cfg, split, where)
        features = ds.features
        id_col = cfg.id_column or ("id" if "id" in ds.column_names else None)
        slices = _dataset_slices(ds, id_col)
    src_col, tgt_col = resolve_columns(features, cfg, where, need_targets)
    has_targets = isinstance(tgt_col, tuple) or (tgt_col is not None and _has_path(features, tgt_col))
    if not has_targets and need_targets:
        raise DataError(
            f"{where}: no target column{f' {tgt_col!r}' if tgt_col else ''}; expected references to score against "
            f"(pass --target_column); columns: {', '.join(column_paths(features))}"
        )
    targets_of = (tgt_col,) if isinstance(tgt_col, str) else tgt_col or ()
    check_columns(reference_paths(features, src_col, targets_of), where, cfg.allow_reference_in_prompt, fields,
                  src_col, id_col)
    fields = tuple(name for name in fields if name != ID_FIELD)
    for name in fields:
        if not _has_path(features, name):
            raise DataError(f"{where}: no column {name!r}, which --prompt_template names; columns: "
                            f"{', '.join(column_paths(features))}")
    _refuse_changed_values(features, [p for p in (src_col, *targets_of, id_col, *fields) if p is not None], where)

    def rows() -> Iterator[Example]:
        unique = UniqueIds(lambda row: f"{where} row {row} column {id_col!r}", lambda row: f"in row {row}")
        base = 0
        for values, ids in slices:
            sources = _texts(values(src_col), src_col, where, base)
            targets = _references(values, tgt_col, where, base) if has_targets else [None] * len(ids)
            for row, value in enumerate(ids, start=base):
                unique.add(value, row)
            named = [_texts(values(name), name, where, base, what=name, note=" (which --prompt_template names)")
                     for name in fields]
            rows_fields = [dict(zip(fields, row)) for row in zip(*named)] if fields else [None] * len(ids)
            yield from (Example(i, s, t, f) for i, s, t, f in zip(ids, sources, targets, rows_fields))
            base += len(ids)

    return rows(), where


def _load(cfg: EvalConfig, split: str, where: str) -> Any:
    """The split as a `datasets.Dataset`, cut to --n_obs; an empty one is refused."""
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
    return ds


def _dataset_slices(ds: Any, id_col: str | None) -> Iterator[tuple[Callable[[str], list[Any]], list[Any]]]:
    """The dataset's rows SLICE_ROWS at a time: the values at a column path, and the ids (the
    id column's, else the row numbers)."""
    for base in range(0, len(ds), SLICE_ROWS):
        part = ds.select(range(base, min(base + SLICE_ROWS, len(ds))))
        values = partial(_values, part)
        yield values, list(range(base, base + len(part))) if id_col is None else values(id_col)


def _datasets() -> Any:
    """The datasets library, with pandas importable again (it uses it; pandas_probe kept it out)."""
    from .. import pandas_probe

    pandas_probe.restore()
    import datasets

    return datasets


def load_split(name: str, config: str | None, split: str) -> Any:
    """One split as a `datasets.Dataset`; every failure is a one-line DataError."""
    datasets = _datasets()
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
            # data_files={split: file}: a lone file is the requested split, so `test.parquet` needs no --split.
            return datasets.load_dataset(builder, data_files={split: str(path)}, split=split, **options)
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

    datasets = _datasets()

    with open(path, encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise DataError(f"{path}: no header line; expected a CSV file whose first line names its columns")
    return datasets.Features({name: datasets.Value("string") for name in header})


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
    datasets = _datasets()

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


def _texts(values: list[Any], path: str, where: str, base: int = 0, what: str = "source", note: str = "") -> list[str]:
    """A column's values, each checked as a `what` text (inputs.checks), the row named."""
    check_texts(values, what, lambda i: f"{where} row {base + i} column {path!r}{note}")
    return values


def _references(values: Callable[[str], list[Any]], columns: str | tuple[str, ...], where: str,
                base: int = 0) -> list[str | tuple[str, ...]]:
    """Each row's reference(s), from one or more target columns (`values(column)`), each holding
    a text or a list of texts per row. A row with one reference gets a str, one with several a
    tuple (in column order)."""
    per_row: list[list[str]] | None = None
    for column in (columns,) if isinstance(columns, str) else columns:
        column_values = values(column)
        if per_row is None:
            per_row = [[] for _ in column_values]
        for i, value in enumerate(column_values):
            refs = check_references(value, lambda: f"{where} row {base + i} column {column!r}")
            per_row[i].extend((refs,) if isinstance(refs, str) else refs)
    return [refs[0] if len(refs) == 1 else tuple(refs) for refs in per_row or []]


def _refuse_changed_values(features: Mapping[str, Any], paths: Sequence[str], where: str) -> None:
    """A column of the datasets JSON loader's `Json` type mixes kinds of values, and the loader
    has changed some of them already (a string "007" read as 7; inputs/jsonfile.py). A local file
    is read as written instead; a folder or a hub dataset cannot be, so it is refused."""
    for path in paths:
        feature: Any = features
        for key in path.split(".") if path not in features else [path]:
            feature = feature.get(key) if isinstance(feature, Mapping) else None
            if _holds_json(feature):
                raise DataError(
                    f"{where} column {path!r}: mixes kinds of values (strings and numbers, or texts and lists), "
                    "which the datasets JSON loader changes (the string \"007\" reads as 7); expected one kind "
                    "per column: pass the data file itself as --dataset (read as written) or as --data_dir, or "
                    "write every value of the column as a string")


def _holds_json(feature: Any) -> bool:
    """Whether a feature is, or holds, the datasets `Json` type."""
    if type(feature).__name__ == "Json":
        return True
    if isinstance(feature, Mapping):
        return any(_holds_json(f) for f in feature.values())
    inner = getattr(feature, "feature", None)
    return inner is not None and _holds_json(inner)
