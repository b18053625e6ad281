"""Every path the tool writes or removes, in one place, checked before any work (the dry run too).

A command lists what it writes (`Role`s: the path and what it is to the command) and what it
reads; `check_paths` refuses, in one line naming both roles, a write onto a file it reads or two
writes onto one file, and tries each output folder for real (created and removed again if
missing), so that a folder that cannot take the outputs fails before generation, not after.
Output names built from user text (--type_path, a dataset split) must be plain file names.
Inside --save_dir the tool writes over, and removes, only the files its record says it wrote
(outputs/record.py); the temp dir is the tool's own (run/tmpdir.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from ..config import EvalConfig
from ..errors import OutputError
from .record import RECORD, OutputRecord


class Role(NamedTuple):
    """A path a command writes or reads, and what it is to the command (for the messages)."""

    path: Path
    what: str


def _one_line(text: str) -> str:
    # generations.txt is one example per line: a newline inside a prediction would shift every
    # later line against the references of anyone who reads the file by position.
    return " ".join(text.splitlines())


# Every result file a run may leave in --save_dir, after its prefix. A run removes the ones of
# its own prefix that it does not write itself and that the record says an earlier run wrote,
# so a metric file of an earlier run (another task, or scores where this run made pseudolabels)
# is never left beside new generations.
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
    """Results of an earlier run with this prefix that this run does not write: removed, but only
    those the record says the tool wrote, unchanged since, and never a file this run reads."""
    planned = set(planned_outputs(cfg, n_refs))
    save_dir = Path(cfg.save_dir)
    record = OutputRecord(save_dir)
    inputs = {os.path.realpath(r.path) for r in run_inputs(cfg)}
    candidates = [save_dir / f"{cfg.output_prefix}{s}" for s in RESULT_SUFFIXES]
    if cfg.debug or n_refs > 1:
        candidates += sorted(save_dir.glob(f"{cfg.output_prefix}_references.*.txt"))
    return [p for p in candidates
            if p not in planned and record.owns(p) and os.path.realpath(p) not in inputs]


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else []


def data_files(cfg: EvalConfig) -> list[Path]:
    """The local data files a run reads (a local dataset's files, the legacy layout's files of
    --type_path, a .jsonl file, --input_path and --reference_path)."""
    return [r.path for r in _data_roles(cfg)]


def _data_roles(cfg: EvalConfig) -> list[Role]:
    if cfg.input_path is not None:
        named = (("the sources (INPUT_PATH, --input_path)", cfg.input_path),
                 ("the references (--reference_path)", cfg.reference_path))
        return [Role(Path(p).expanduser(), what) for what, p in named if p is not None and Path(p).is_file()]
    flag = "--dataset" if cfg.dataset is not None else "--data_dir"
    path = Path(cfg.dataset if cfg.dataset is not None else cfg.data_dir).expanduser()
    if path.is_file():
        return [Role(path, f"{flag} file")]
    if not path.is_dir():
        return []  # a hub dataset, or a missing path (reported when the data is read)
    found = _files(path) if cfg.dataset is not None else sorted(f for f in path.glob(f"{cfg.type_path}.*") if f.is_file())
    return [Role(f, f"{flag} file {f.name}") for f in found]


def run_inputs(cfg: EvalConfig) -> list[Role]:
    """Every local file a run reads: its data, the model's and tokenizer's folders, and the
    earlier run --compare_to names."""
    roles = _data_roles(cfg)
    for flag, name in (("--model_name", cfg.model_name), ("--tokenizer_name", cfg.tokenizer_name),
                       ("--compare_to", cfg.compare_to)):
        if name:
            folder = Path(name).expanduser()
            roles += [Role(f, f"{flag} file {f.relative_to(folder)}") for f in _files(folder)]
    return roles


def run_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Role]:
    return [Role(p, f"output {p.name} of --save_dir") for p in planned_outputs(cfg, n_refs)]


def check_paths(writes: Sequence[Role], reads: Sequence[Role], folders: Iterable[tuple[str, Path]] = ()) -> None:
    """Refuse a write onto a file the command reads, or two writes onto one file, naming both
    roles; then try every output folder in `folders` (see try_folder)."""
    read_at = {}
    for r in reads:
        read_at.setdefault(os.path.realpath(r.path), r)
    written_at: dict[str, Role] = {}
    for w in writes:
        real = os.path.realpath(w.path)
        other = read_at.get(real)
        if other is not None:
            raise OutputError(
                f"{w.path}: {w.what} would write over {other.what}; expected outputs apart from the inputs"
            )
        earlier = written_at.setdefault(real, w)
        if earlier is not w:
            raise OutputError(f"{w.path}: both {earlier.what} and {w.what}; expected a separate file for each")
    for flag, folder in folders:
        try_folder(flag, folder)


def try_folder(flag: str, folder: Path) -> None:
    """Make sure `folder` is, or can become, a folder this process writes into: create what is
    missing and a probe file, then remove them again. Trying is the only check that holds as
    root, on read-only mounts and on pseudo file systems (/sys accepts nothing, whatever the
    permission bits say)."""
    full = Path(os.path.abspath(folder.expanduser()))
    made: list[Path] = []
    doing = f"write in {full}"
    try:
        for parent in [*reversed(full.parents), full]:
            if parent.is_dir():
                continue
            if parent.exists() or parent.is_symlink():
                where = "is a file" if parent == full else f"{parent} is a file"
                raise OutputError(f"{flag} {folder}: {where}; expected a folder (created if missing)")
            doing = f"create {parent}"
            os.mkdir(parent)
            made.append(parent)
        doing = f"write in {full}"
        probe = full / f".seq2seq_eval_probe.{os.getpid()}"
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        os.unlink(probe)
    except OSError as e:
        why = "a read-only file system" if e.errno == errno.EROFS else (e.strerror or str(e))
        raise OutputError(f"{flag} {folder}: cannot {doing} ({why}); expected a folder the run can write") from e
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def output_folders(cfg: EvalConfig, extra: Sequence[tuple[str, Path]] = ()) -> list[tuple[str, Path]]:
    return [("--save_dir", Path(cfg.save_dir)), ("--tmp_dir", Path(cfg.tmp_dir)), *extra]


def check_output_locations(cfg: EvalConfig, extra_writes: Sequence[Role] = (), n_refs: int = 1) -> None:
    """Before any work (the dry run too), on every rank (the output names were checked with the
    config: config.check_output_name): no output replaces a file the run reads, and none replaces a file of the user's in --save_dir (a
    --debug run once wrote its copy of the references over the user's {type_path}.target).
    `extra_writes`: the legacy form's SAVE_PATH and SCORE_PATH. The folders are tried apart
    (try_folder: one process at a time, as trying creates and removes them)."""
    save_dir = Path(cfg.save_dir)
    outputs = run_outputs(cfg, n_refs)
    writes = [*outputs, Role(save_dir / RECORD, f"the record {RECORD} of --save_dir"), *extra_writes]
    check_paths(writes, run_inputs(cfg))
    if save_dir.is_dir():
        OutputRecord(save_dir).check_writable([r.path for r in outputs], {r.path: r.what for r in outputs})
