"""Every path the tool writes or removes, in one place, checked before any work (the dry run too).

A command lists what it writes (`Role`s: the path and what it is to the command) and what it
reads; `check_paths` refuses, in one line naming both roles, a write onto a file it reads or two
writes onto one file, and tries each output folder for real (created and removed again if
missing), so that a folder that cannot take the outputs fails before generation, not after.
Output names built from user text (--type_path, a dataset split) must be plain file names.
Inside --save_dir (and the folders of the files the user names) the tool writes over, and
removes, only the files its record says it wrote, of the same prefix (outputs/record.py), all
published as one unit (outputs/publish.py); the temp dir is the tool's own (run/tmpdir.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..config import EvalConfig
from ..errors import OutputError
from .record import INTENT, RECORD, STAGING, OutputRecord, bookkeeping, tool_files


class Role(NamedTuple):
    """A path a command writes or reads, and what it is to the command (for the messages)."""

    path: Path
    what: str


def _one_line(text: str) -> str:
    # generations.txt is one example per line: a newline inside a prediction would shift every
    # later line against the references of anyone who reads the file by position.
    return " ".join(text.splitlines())


def planned_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Path]:
    """The files this run writes into --save_dir, in the order written, the metric (or run
    info) file last. With --debug, `n_refs` reference files (the number of reference sets).
    Results of an earlier run of the same prefix that this run does not write are removed when
    it publishes, by their names in the record (record.OutputRecord.stale), so a metric file of
    an earlier run (another task, or scores where this run made pseudolabels) is never left
    beside new generations."""
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


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else []


def data_files(cfg: EvalConfig) -> list[Path]:
    """The local data files a run reads (a local dataset's files, the legacy layout's files of
    --type_path, a .jsonl file, --input_path and --reference_path)."""
    return [r.path for r in _data_roles(cfg)]


def data_stamp(cfg: EvalConfig) -> list[list[Any]]:
    """Each local data file (data_files) with its size and modification time: what tells that a
    file changed without reading it (the examples cache, the training callback)."""
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in data_files(cfg)]


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
    if cfg.dataset is not None:
        found = _files(path)
    else:  # the legacy layout: exactly the files iter_legacy reads (a .pseudo.target beside them is not one)
        tp = cfg.type_path
        found = sorted(f for f in path.glob(f"{tp}.*") if f.is_file() and (
            f.name in (f"{tp}.source", f"{tp}.target") or (f.name.startswith(f"{tp}.target.")
                                                         and f.name[len(tp) + 8:].isdigit())))
    return [Role(f, f"{flag} file {f.name}") for f in found]


def run_inputs(cfg: EvalConfig) -> list[Role]:
    """Every local file a run reads: its data, the model's and tokenizer's folders, and the
    earlier run --compare_to names."""
    roles = _data_roles(cfg)
    for flag, name in (("--model_name", cfg.model_name), ("--tokenizer_name", cfg.tokenizer_name),
                       ("--compare_to", cfg.compare_to)):
        if name:
            folder = Path(name).expanduser()
            # The model's loaders read its own files, not what the tool published there (a
            # model folder given as --save_dir too); --compare_to's outputs are what it reads.
            skip = tool_files(folder) if flag != "--compare_to" else bookkeeping(folder)
            roles += [Role(f, f"{flag} file {f.relative_to(folder)}") for f in _files(folder)
                      if os.path.realpath(f) not in skip]
    return roles


def run_outputs(cfg: EvalConfig, n_refs: int = 1) -> list[Role]:
    return [Role(p, f"output {p.name} of {save_dir_flag(cfg)}") for p in planned_outputs(cfg, n_refs)]


def save_dir_flag(cfg: EvalConfig) -> str:
    """How messages name the save folder: --save_dir, or the legacy form's hidden folder."""
    return f"the hidden folder of SAVE_PATH {cfg.save_dir_of}" if cfg.save_dir_of else "--save_dir"


def save_dir_way_out(cfg: EvalConfig) -> str:
    return ("move it away (that folder holds only seq2seq_eval's own files) or name another SAVE_PATH"
            if cfg.save_dir_of else "move it away or pick another --save_dir")


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
    for flag, folder, *names in folders:
        try_folder(flag, folder, names[0] if names else ())


PROBE_TRIES = 100
"""How often a folder is tried again when another process removed a parent it had just created:
several commands trying one new folder at once each create and remove it (a folder another one
created is never removed by this one, but it may go between two steps of this one)."""


def try_folder(flag: str, folder: Path, names: Iterable[str] = ()) -> None:
    """Make sure `folder` is, or can become, a folder this process writes into, and that it takes
    each of `names` (the files the command will create there: their length, characters and the
    permissions are the folder's filesystem's to judge): create what is missing, then a probe
    folder of this process's own (its pid and a random token) and each name inside it, then
    remove them again. Trying is the only check that holds as root, on read-only mounts and on
    pseudo file systems (/sys accepts nothing, whatever the permission bits say)."""
    for attempt in range(PROBE_TRIES):
        try:
            _try_once(flag, folder, list(names))
            return
        except FileNotFoundError:
            if attempt == PROBE_TRIES - 1:
                raise OutputError(f"{flag} {folder}: cannot write there (it kept disappearing while it was tried); "
                                  "expected a folder the run can write") from None


_PROBE = re.compile(r"\.seq2seq_eval_probe\.(\d+)\.[0-9a-f]{8}")


def _remove_dead_probes(folder: Path) -> None:
    """Probe folders a killed command left (its pid no longer runs here): removed with the empty
    files it made in them, which hold nothing. A probe of a live process, or one holding anything
    else, is left alone. (On a folder shared by several nodes a pid may run elsewhere: its probe
    stays until a command on that node clears it.)"""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            m = _PROBE.fullmatch(name)
            path = folder / name
            if m is None or os.path.islink(path) or not path.is_dir() or _alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                for entry in os.listdir(path):
                    st = os.lstat(path / entry)
                    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
                        os.unlink(path / entry)
                os.rmdir(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _try_once(flag: str, folder: Path, names: list[str]) -> None:
    full = Path(os.path.abspath(folder.expanduser()))
    made: list[Path] = []
    doing = f"write in {full}"
    naming = False
    try:
        for parent in [*reversed(full.parents), full]:
            if parent.is_dir():
                continue
            doing = f"create {parent}"
            try:
                os.mkdir(parent)
            except FileExistsError:
                if parent.is_dir():
                    continue  # another process made it meanwhile: it is not this one's to remove
                where = "is a file" if parent == full else f"{parent} is a file"
                raise OutputError(f"{flag} {folder}: {where}; expected a folder (created if missing)") from None
            made.append(parent)
        doing = f"write in {full}"
        _remove_dead_probes(full)
        probe = full / f".seq2seq_eval_probe.{os.getpid()}.{secrets.token_hex(4)}"
        os.mkdir(probe)
        try:
            for name in names:
                doing, naming = f"create {name} in {full}", True
                os.close(os.open(probe / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                os.unlink(probe / name)
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(probe)
    except FileNotFoundError:
        raise  # a parent removed by another process trying it too: tried again
    except OSError as e:
        why = "a read-only file system" if e.errno == errno.EROFS else (e.strerror or str(e))
        expected = ("a name the folder takes (a shorter --type_path or file name, other characters)" if naming
                    else "a folder the run can write")
        raise OutputError(f"{flag} {folder}: cannot {doing} ({why}); expected {expected}") from e
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def output_folders(cfg: EvalConfig, extra: Sequence[tuple[str, Path]] = ()) -> list[tuple[str, Path]]:
    return [(save_dir_flag(cfg), Path(cfg.save_dir)), ("--tmp_dir", Path(cfg.tmp_dir)), *extra]


def try_folders(cfg: EvalConfig, extra_writes: Sequence[Role] = (), extra_folders: Sequence[tuple[str, Path]] = ()) -> None:
    """Every folder the run writes tried once (however it is written: SAVE_PATH, SCORE_PATH and
    --save_dir may share one), with every name the run creates there: its outputs, the record,
    the intent and the staging folder."""
    names: dict[str, list[str]] = {os.path.realpath(cfg.save_dir): [p.name for p in planned_outputs(cfg)]}
    for r in extra_writes:
        names.setdefault(os.path.realpath(Path(r.path).parent), []).append(Path(r.path).name)
    seen = set()
    for flag, folder in output_folders(cfg, extra_folders):
        real = os.path.realpath(folder)
        if real in seen:
            continue
        seen.add(real)
        made = names.get(real, [])
        try_folder(flag, folder, [*dict.fromkeys(made), *((RECORD, INTENT, STAGING) if made else ())])
        if made:
            check_bookkeeping(flag, Path(folder))


def check_bookkeeping(flag: str, folder: Path) -> None:
    """The names the publish uses in `folder`, as they are there now: its staging folder must be a
    folder (not a link, not a file), its record and intent files (not links, not folders), or
    absent; else the publish would fail after all the work, so it is said before any."""
    for name, want_dir in ((STAGING, True), (RECORD, False), (INTENT, False)):
        path = Path(os.path.abspath(folder.expanduser())) / name
        if not os.path.lexists(path):
            continue
        if os.path.islink(path) or (path.is_dir() != want_dir):
            what = "a link" if os.path.islink(path) else "a folder" if path.is_dir() else "a file"
            raise OutputError(f"{flag} {folder}: {path} is {what}, where seq2seq_eval keeps its own "
                              f"{'staging folder' if want_dir else 'bookkeeping file'} while it publishes; "
                              "remove it, or pick another folder")


def check_apart(cfg: EvalConfig) -> None:
    """--save_dir neither is nor lies inside --tmp_dir (emptied and removed after the run: the
    next run would find the outputs there as files the tool did not make), and neither folder
    lies inside a local --dataset folder (read as a whole: the outputs would become data)."""
    save, tmp = os.path.realpath(os.path.expanduser(cfg.save_dir)), os.path.realpath(os.path.expanduser(cfg.tmp_dir))
    if save == tmp or save.startswith(tmp + os.sep):
        where = "is --tmp_dir" if save == tmp else f"is inside --tmp_dir {cfg.tmp_dir}"
        raise OutputError(f"--save_dir {cfg.save_dir}: {where}, the run's scratch folder, which is emptied and "
                          "removed after the run; expected --save_dir apart from it (by default --tmp_dir is "
                          "{save_dir}_tmp)")
    if cfg.dataset is not None and Path(cfg.dataset).expanduser().is_dir():
        data = os.path.realpath(os.path.expanduser(cfg.dataset))
        for flag, value, real in (("--save_dir", cfg.save_dir, save), ("--tmp_dir", cfg.tmp_dir, tmp)):
            if real == data or real.startswith(data + os.sep):
                raise OutputError(f"{flag} {value}: is inside the --dataset folder {cfg.dataset}, which is read "
                                  f"as a whole: what the run writes would become data; expected {flag} outside it")


def check_named(writes: Sequence[Role]) -> None:
    """Files the user named (the legacy form's SAVE_PATH and SCORE_PATH, compare's --report):
    written over only when their folder's record says the tool wrote them, as they are."""
    for r in writes:
        if r.path.name in (RECORD, INTENT, STAGING):
            raise OutputError(f"{r.path}: {r.what} is named like seq2seq_eval's own bookkeeping in its folder; "
                              "name another file")
        if r.path.parent.is_dir():
            OutputRecord(r.path.parent).check_writable([r.path], None, {r.path: r.what}, "move it away or name another file")


def check_output_locations(cfg: EvalConfig, extra_writes: Sequence[Role] = (), n_refs: int = 1) -> None:
    """Before any work (the dry run too), on every rank (the output names were checked with the
    config: config.check_output_name): no output replaces a file the run reads, and none replaces
    a file that is not the tool's, or the tool's file of another prefix, in --save_dir (a --debug
    run once wrote its copy of the references over the user's {type_path}.target; a pseudolabel
    run of another --type_path once replaced pseudolabel_results.json).
    `extra_writes`: the legacy form's SAVE_PATH and SCORE_PATH. The folders are tried apart
    (try_folder: one process at a time, as trying creates and removes them)."""
    save_dir = Path(cfg.save_dir)
    check_apart(cfg)
    outputs = run_outputs(cfg, n_refs)
    writes = [*outputs, Role(save_dir / RECORD, f"the record {RECORD} of {save_dir_flag(cfg)}"), *extra_writes]
    check_paths(writes, run_inputs(cfg))
    if save_dir.is_dir():
        OutputRecord(save_dir).check_writable([r.path for r in outputs], cfg.output_prefix,
                                              {r.path: r.what for r in outputs}, save_dir_way_out(cfg))
    check_named(extra_writes)
