"""Texts given as Python lists (predictions, sources) checked as the files are, and evaluate()'s
in-memory examples written as the command line reads them: JSON Lines with references
(`{type_path}_inputs.jsonl`), one source per line without (`_sources.txt`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import DataError
from ..outputs.jsonl import encode_line
from .checks import UniqueIds, check_texts


def texts(values: Any, where: str) -> list[str]:
    """`values` as a list of str, or a DataError saying which element is not one."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise DataError(f"{where}: expected a list of texts, got {type(values).__name__}")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(f"{where}[{i}]: expected a text, got {type(v).__name__}")
    return list(values)


def source_texts(values: Any, n: int) -> list[str]:
    """The sources given beside `n` predictions (score, compare): one text per prediction, each
    a source as the run reads it (inputs.checks)."""
    given = texts(values, "sources")
    if len(given) != n:
        raise DataError(f"sources: {len(given)} entries for {n} predictions; expected one source per prediction")
    check_texts(given, "source", lambda i: f"sources[{i}]")
    return given


def write_inputs(cfg: EvalConfig, sources: Any, references: Any, ids: Any, layout: str | None) -> None:
    """In-memory examples as the command line reads them. Rewritten only when they changed: the
    examples cache is keyed by the file's modification time."""
    given = texts(sources, "sources")
    if not given:
        raise DataError("sources: empty; expected one source per example")
    check_texts(given, "source", lambda i: f"sources[{i}]")
    if references is None:
        for i, s in enumerate(given):
            if "\n" in s or "\r" in s:
                raise DataError(f"sources[{i}]: a line break inside a source; pass references (the examples "
                                "are then written as JSON Lines) or remove it")
        path, data = Path(cfg.input_path), "".join(s + "\n" for s in given).encode("utf-8")  # type: ignore[arg-type]
    else:
        from ..scoring.references import per_example

        rows = per_example(references, len(given), layout, "sources")
        if ids is None:
            ids = range(len(given))
        elif isinstance(ids, str) or not isinstance(ids, Sequence) or len(ids) != len(given):
            n = len(ids) if isinstance(ids, Sequence) else type(ids).__name__
            raise DataError(f"ids: {n} but {len(given)} sources; expected one id per source")
        unique = UniqueIds(lambda i: f"ids[{i}]", lambda i: f"at ids[{i}]")
        lines = []
        for i, (ex_id, s, target) in enumerate(zip(ids, given, rows)):
            unique.add(ex_id, i)
            lines.append(encode_line({"id": ex_id, "source": s, "target": target[0] if len(target) == 1 else target}) + "\n")
        path, data = Path(cfg.data_dir), "".join(lines).encode("utf-8")
    from ..outputs.publish import publish_bytes

    if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
        return  # nothing to write (and the examples cache keeps its key)
    # Published as a run's outputs are: recorded with the run's prefix, written over only when it
    # is the tool's file of that prefix.
    publish_bytes(path.parent, {path.name: data}, cfg.output_prefix, "input",
                  {Path(os.path.abspath(path)): "the examples evaluate() was given"})
