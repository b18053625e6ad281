"""Where a run's outputs go, checked before any work: the files it will write, earlier results it
would leave stale, and folders that cannot take them (a one-line error, not a lost run)."""

from __future__ import annotations

import os
from pathlib import Path

from ..config import EvalConfig
from ..errors import OutputError


def _one_line(text: str) -> str:
    # generations.txt is one example per line: a newline inside a prediction would shift every
    # later line against the references of anyone who reads the file by position.
    return " ".join(text.splitlines())


# Every result file a run may leave in --save_dir, after its prefix. A run removes the ones of
# its own prefix that it does not write itself, so a metric file of an earlier run (another task,
# or scores where this run made pseudolabels) is never left beside new generations.
RESULT_SUFFIXES = (
    "_bleu.json", "_rouge.json", "_generations.txt", "_pseudolabels.jsonl", ".pseudo.target",
    "_run_info.json", "_references.txt", "_examples.jsonl",
)


def planned_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Path]:
    """The files this run writes into --save_dir, in the order written, the metric (or run
    info) file last. With --debug, `n_refs` reference files (the number of reference sets)."""
    save_dir, p = Path(cfg.save_dir), cfg.output_prefix
    paths = [save_dir / f"{p}_generations.txt"]
    if cfg.pseudolabels:
        paths += [save_dir / "pseudolabel_results.json", save_dir / f"{p}_pseudolabels.jsonl"]
        if cfg.pseudo_target:
            paths.append(save_dir / f"{p}.pseudo.target")
    if cfg.debug:
        paths += [save_dir / (f"{p}_references.txt" if k == 0 else f"{p}_references.{k}.txt") for k in range(n_refs)]
    if cfg.scored and not cfg.no_examples_file:
        paths.append(save_dir / f"{p}_examples.jsonl")
    paths.append(save_dir / (f"{p}_{cfg.metric_name}.json" if cfg.scored else f"{p}_run_info.json"))
    return paths


def stale_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Path]:
    planned = set(planned_outputs(cfg, n_refs))
    save_dir = Path(cfg.save_dir)
    return [save_dir / f"{cfg.output_prefix}{s}" for s in RESULT_SUFFIXES
            if (save_dir / f"{cfg.output_prefix}{s}").is_file() and save_dir / f"{cfg.output_prefix}{s}" not in planned]


def data_files(cfg: EvalConfig) -> list[Path]:
    """The local data files a run reads (a local dataset's files, the legacy layout's files of
    --type_path, a .jsonl file, --input_path and --reference_path)."""
    if cfg.input_path is not None:
        return [Path(p).expanduser() for p in (cfg.input_path, cfg.reference_path) if p is not None and Path(p).is_file()]
    path = Path(cfg.dataset if cfg.dataset is not None else cfg.data_dir).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []  # a hub dataset, or a missing path (reported when the data is read)
    found = path.rglob("*") if cfg.dataset is not None else path.glob(f"{cfg.type_path}.*")
    return sorted(f for f in found if f.is_file())


def input_files(cfg: EvalConfig) -> list[Path]:
    """The local files a run reads: its data files and the model folder's files."""
    model = Path(cfg.model_name).expanduser()
    return data_files(cfg) + (sorted(f for f in model.iterdir() if f.is_file()) if model.is_dir() else [])


def _check_folder(flag: str, folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{flag} {folder}: is a file; expected a folder (created if missing)")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{flag} {folder}: {existing} is a file; expected a folder (created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "on a read-only file system" if read_only else "not writable by this user"
        raise OutputError(f"{flag} {folder}: {existing} is {why}; expected a folder the run can write")


def check_output_locations(cfg: EvalConfig) -> None:
    """Before any work (the dry run too): --save_dir and --tmp_dir must be usable folders, and
    no output may replace a file the run reads (a --debug run once wrote its copy of the
    references over the user's {type_path}.target)."""
    _check_folder("--save_dir", Path(cfg.save_dir))
    _check_folder("--tmp_dir", Path(cfg.tmp_dir))
    inputs = {os.path.realpath(f) for f in input_files(cfg)}
    tmp_dir = Path(cfg.tmp_dir)
    for path in [*planned_outputs(cfg), tmp_dir / "manifest.json", tmp_dir / "run.lock"]:
        if os.path.realpath(path) in inputs:
            raise OutputError(
                f"{path}: this run would write over one of its own input files; "
                "expected --save_dir/--tmp_dir folders apart from the data and the model"
            )
