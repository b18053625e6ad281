"""BERTScore's baselines (--bertscore_rescale_with_baseline): bert-score's own files, read from an
installed bert-score (its `rescale_baseline/<lang>/<model>.tsv`; the package's code is not run),
or a file of one's own (--bertscore_baseline_path) in the same layout: a header `LAYER,P,R,F`,
then one row per layer, row k for the output of layer k."""

from __future__ import annotations

import csv
from pathlib import Path

from ...errors import ConfigError, ModelError

INSTALL = "pip install bert-score==0.3.13"


def bert_score_folder() -> Path | None:
    """Where an installed bert-score keeps its baselines, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("bert_score")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "rescale_baseline"


def baseline_file(model: str, lang: str, path: str | None) -> tuple[Path, str]:
    """The file to read and what the signature says of it."""
    if path is not None:
        return Path(path), "custom"
    folder = bert_score_folder()
    if folder is None:
        raise ConfigError(f"--bertscore_rescale_with_baseline: bert-score's baselines are read from an installed "
                          f"bert-score, which is not installed ({INSTALL}); or give --bertscore_baseline_path")
    found = Path(f"{folder}/{lang}/{model}.tsv")  # joined as bert-score joins it: a model's path stays inside
    if not found.is_file():
        have = sorted(p.relative_to(folder / lang).with_suffix("").as_posix() for p in (folder / lang).rglob("*.tsv"))
        where = (f"bert-score has them for {lang}: {', '.join(have)}" if have
                 else f"bert-score has none for --bertscore_lang {lang}")
        raise ConfigError(f"--bertscore_rescale_with_baseline: no baseline for {model} in {lang} ({where}); "
                          "give --bertscore_baseline_path, or leave out the rescaling")
    return found, "bert-score"


def read_baseline(path: Path, num_layers: int) -> tuple[float, float, float]:
    """(P, R, F) of row `num_layers`, as bert-score takes it (pandas' iloc[num_layers])."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise ModelError(f"--bertscore_baseline_path {path}: cannot read it ({e.strerror})") from e
    if not rows or [c.strip() for c in rows[0]] != ["LAYER", "P", "R", "F"]:
        raise ModelError(f"{path}: expected bert-score's baseline layout, a header LAYER,P,R,F and a row per layer")
    body = [r for r in rows[1:] if r]
    if num_layers >= len(body):
        raise ConfigError(f"--bertscore_num_layers {num_layers}: {path} has baselines for layers 0 to {len(body) - 1}")
    try:
        p, r, f_ = (float(x) for x in body[num_layers][1:4])
    except ValueError as e:
        raise ModelError(f"{path} row {num_layers + 2}: expected numbers P, R, F ({e})") from e
    return p, r, f_
