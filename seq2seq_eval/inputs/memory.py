"""Texts given as Python lists (predictions, sources) checked as the files are, and evaluate()'s
in-memory examples serialized as the command line reads them: JSON Lines with references
(`{type_path}_inputs.jsonl`), one source per line without (`_sources.txt`), read by the run from
its temp dir and published with its outputs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..config import EvalConfig
from ..errors import DataError
from ..outputs.jsonl import encode_line
from .checks import UniqueIds, check_texts, not_unicode, surrogate_at


def texts(values: Any, where: str) -> list[str]:
    """`values` as a list of str, or a DataError saying which element is not one."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise DataError(f"{where}: expected a list of texts, got {type(values).__name__}")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(f"{where}[{i}]: expected a text, got {type(v).__name__}")
        if (at := surrogate_at(v)) is not None:
            raise DataError(f"{where}[{i}]: {not_unicode('the text', v, at)}")
    return list(values)


def source_texts(values: Any, n: int) -> list[str]:
    """The sources given beside `n` predictions (score, compare): one text per prediction, each
    a source as the run reads it (inputs.checks)."""
    given = texts(values, "sources")
    if len(given) != n:
        raise DataError(f"sources: {len(given)} entries for {n} predictions; expected one source per prediction")
    check_texts(given, "source", lambda i: f"sources[{i}]")
    return given


@dataclass(frozen=True)
class InMemoryInputs:
    """evaluate()'s in-memory examples as the command line reads them (`data`). The run reads them
    from its temp dir (`scratch`) and publishes their copy, `path` in --save_dir, with its outputs
    in one transaction: the folder never holds one run's inputs beside another run's outputs.
    `field`: the config field that names them (data_dir, or input_path without references)."""

    path: Path
    data: bytes
    field: str

    def scratch(self, tmp_dir: Path) -> Path:
        return tmp_dir / SCRATCH_FOLDER / SCRATCH_NAMES[self.field]

    def write_scratch(self, tmp_dir: Path) -> None:
        """Rank 0, once the temp dir is this run's. Rewritten only when they changed: the examples
        cache is keyed by the file's modification time."""
        path = self.scratch(tmp_dir)
        if path.is_file() and not path.is_symlink() and path.read_bytes() == self.data:
            return
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, self.data)

    def reading(self, cfg: EvalConfig, tmp_dir: Path) -> EvalConfig:
        """The config the examples are read with: from the scratch copy."""
        return replace(cfg, **{self.field: str(self.scratch(tmp_dir))})


SCRATCH_FOLDER = "cache"
SCRATCH_NAMES = {"data_dir": "inputs.jsonl", "input_path": "sources.txt"}
"""The scratch copy's names in the temp dir (run.tmpdir.OWN lists them)."""


def in_memory_inputs(cfg: EvalConfig, sources: Any, references: Any, ids: Any, layout: str | None) -> InMemoryInputs:
    """In-memory examples checked and serialized as the command line reads them: JSON Lines with
    references, one source per line without."""
    given = texts(sources, "sources")
    if not given:
        raise DataError("sources: empty; expected one source per example")
    check_texts(given, "source", lambda i: f"sources[{i}]")
    if references is None:
        for i, s in enumerate(given):
            if "\n" in s or "\r" in s:
                raise DataError(f"sources[{i}]: a line break inside a source; pass references (the examples "
                                "are then written as JSON Lines) or remove it")
        data = "".join(s + "\n" for s in given).encode("utf-8")
        return InMemoryInputs(Path(os.path.abspath(cfg.input_path)), data, "input_path")  # type: ignore[arg-type]
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
    return InMemoryInputs(Path(os.path.abspath(cfg.data_dir)), "".join(lines).encode("utf-8"), "data_dir")
