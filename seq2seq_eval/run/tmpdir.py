"""The temp dir: the tool's own folder for manifest, run lock, per-rank batch journals, and the
final rank files. The tool works only in a folder it made or one that was empty (marked as its
own by MARKER) and that holds no symbolic link, removes only the files it names there (OWN), and
leaves nothing behind after a successful run.

Layout of {tmp_dir}:
    .seq2seq_eval_tmp       the marker: this folder is the tool's (and which folders it created)
    manifest.json           what run these files belong to (model, data, settings, batch plan)
    run.lock                flock'ed by rank 0 while a run is live
    rank0.stopped / .done   rank 0 was interrupted / has written the outputs (for the other ranks)
    rank_<k>.present        flock'ed (shared) by rank k while it may use this folder (presence.py)
    journal_rank_<k>.jsonl  one line per batch rank k finished, appended and fsynced as it finishes
                            (and, for a batch split after running out of memory, one line per
                            split and per finished sub-batch: see JournaledBatch); a batch taken
                            from another rank's share says whose ("from_rank")
    claims/<batch>          which rank runs which batch in this attempt (steal.py); claims/<metric>_<batch>
                            the same for a model metric's (COMET) batches (model_scores.py)
    model_scores_rank_<k>.jsonl  one line per model-metric (COMET) batch rank k scored (model_scores.py)
    select_rank_<k>.jsonl   one line per batch whose candidates rank k selected (--select: selection/in_run.py)
    rank_<k>_output.arrow   rank k's records, one Arrow record batch per planned batch, renamed into place when done
    rank_<k>_output.json    rank k's stats, written atomically last: its presence means rank k is done
    tail_*                  the tail's work: each slice's sizes, spilled rows, scores and completion
                            (sharedtail.py, outputs/shuffle.py), the outputs being assembled
    cache/                  the examples as Arrow and the tokenized sources (see store.py, tokens.py);
                            evaluate()'s in-memory examples, inputs.jsonl or sources.txt (inputs/memory.py)
and, beside any of them, `.<name>.<pid>.tmp` while it is being written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import write_json_atomic
from ..errors import OutputError, RunStateError
from ..outputs.locations import Role
from .journal import journal_files
from .runlock import RunLock  # noqa: F401  (imported from here by the run)
from .steal import CLAIMS, claims_dir
from .tmpmarker import (  # noqa: F401  (MANIFEST, MARKER, tmp_token: read here by the rest of the run)
    FOLDER_KEY, MANIFEST, MARKER, _MARKER_WRITING, folder_token, half_made_markers, manifest_carries, mark_published, marked,
    read_marker, tmp_token, write_marker)

from .runlock import LOCK  # noqa: E402  (one name for the lock file)
STOPPED = "rank0.stopped"  # rank 0 was interrupted and reports for itself (see runner)
DONE = "rank0.done"  # rank 0 wrote the outputs: the other ranks may exit (see runner)
OWN = re.compile(
    r"(manifest\.json|run\.lock|rank0\.(stopped|done)|\.seq2seq_eval_tmp|journal_rank_\d+\.jsonl|model_scores_rank_\d+\.jsonl|select_rank_\d+\.jsonl"
    r"|rank_\d+_output\.(arrow|arrow\.partial|json)|rank_\d+\.present|claims/([a-z][a-z0-9]*_)?\d+"
    r"|tail_\d+\.(json|sizes|scores|spilled)|tail_out\.(gen|pseudo|legacy|jsonl|example)"
    r"|tail_spill_(\d+|all)_\d+\.arrow(\.index)?"
    r"|cache/examples\.(arrow|json)|cache/tokens_\d+_\d+\.(ids\.bin|lens\.npy|json)|cache/(inputs\.jsonl|sources\.txt))"
)
"""Every file the tool makes in its temp dir, by path relative to it: what cleanup removes."""
_OWN_FOLDERS = ("cache", CLAIMS)
logger = logging.getLogger("seq2seq_eval")
_WRITING = re.compile(r"\.(.+)\.\d+\.tmp")  # atomic.write_atomic's and the caches' names while writing


def is_own(relative: str) -> bool:
    """Whether a path inside a temp dir (relative to it) is one the tool makes there."""
    folder, _, name = relative.rpartition("/")
    if not folder and _MARKER_WRITING.fullmatch(name):
        return True
    writing = _WRITING.fullmatch(name)
    if writing:
        relative = f"{folder}/{writing.group(1)}" if folder else writing.group(1)
    return OWN.fullmatch(relative) is not None


def _entries(tmp_dir: Path) -> list[str]:
    """Everything in the temp dir, as paths relative to it (folders with a trailing slash when empty)."""
    found = []
    for root, dirs, files in os.walk(tmp_dir):
        rel = os.path.relpath(root, tmp_dir)
        prefix = "" if rel == "." else rel + "/"
        found += [prefix + f for f in files]
        if not dirs and not files and prefix:
            found.append(prefix)
    return sorted(found)


def _is_our_manifest(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"model", "data", "plan", "generation"} <= set(data)


def _links(tmp_dir: Path) -> list[str]:
    """Every symbolic link inside the temp dir (none is followed to find them), relative to it."""
    found = []
    for root, dirs, files in os.walk(tmp_dir):
        rel = os.path.relpath(root, tmp_dir)
        found += [os.path.normpath(os.path.join(rel, n)) for n in [*dirs, *files] if os.path.islink(os.path.join(root, n))]
    return sorted(found)


def claim_tmp_dir(tmp_dir: Path, inputs: Sequence[Role] = (), create: bool = True) -> None:
    """Make `tmp_dir` the tool's own, or refuse it, before anything is written there. Taken: a
    missing folder (created, with its missing parents), an empty one, or one marked as the
    tool's (MARKER). A folder holding files but no marker is refused, whatever their names
    (a user's run.lock or cache/examples.json would be written over, then removed), rather than
    shared. A folder holding a symbolic link anywhere is refused too: the tool neither writes nor
    removes through a link there. `create=False` (the dry run) checks without writing."""
    made: list[str] = []
    if not tmp_dir.exists():
        if not create:
            return
        for parent in [*reversed(tmp_dir.absolute().parents), tmp_dir.absolute()]:
            if not parent.exists():
                os.mkdir(parent)
                made.append(str(parent))
    elif not tmp_dir.is_dir():
        raise OutputError(f"--tmp_dir {tmp_dir}: is a file; expected a folder (created if missing)")
    else:
        marker = read_marker(tmp_dir)
        half = half_made_markers(tmp_dir) if marker is None else []
        entries = [e for e in _entries(tmp_dir) if e not in half]
        if marker is None and entries:
            if MARKER in entries:
                raise RunStateError(
                    f"--tmp_dir {tmp_dir}: holds a {MARKER} marker without the tokens seq2seq_eval writes in its own "
                    "(an earlier release's, or one written by hand), so its files are not known to be seq2seq_eval's; "
                    "nothing there was touched: give another --tmp_dir, or remove that folder if it is an old temp dir")
            if (tmp_dir / MANIFEST).exists() and not _is_our_manifest(tmp_dir / MANIFEST):
                entries = [f"{MANIFEST} (not a seq2seq_eval manifest)", *(e for e in entries if e != MANIFEST)]
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise RunStateError(
                f"--tmp_dir {tmp_dir}: holds files ({shown}) but no {MARKER} marker, so they are not known to be "
                "seq2seq_eval's; expected a missing or empty folder, or a temp dir a run of this tool made: give "
                "another --tmp_dir"
            )
        links = _links(tmp_dir)
        if links:
            raise RunStateError(
                f"--tmp_dir {tmp_dir}: {links[0]} is a symbolic link (to {os.readlink(tmp_dir / links[0])}); the tool "
                "neither writes nor removes anything through a link in its temp dir: remove the link, or give "
                "another --tmp_dir"
            )
        if marker is not None:
            _check_manifest_token(tmp_dir, marker["folder"])
        if half and create:
            # A kill as the marker was written: the half-made marker carries which folders that
            # claim made, and goes; the folder is then the empty folder it was.
            for name in half:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    data = (tmp_dir / name).read_bytes()
                    made = list((json.loads(data) if data else {}).get("made") or [])
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_dir / name)
    for r in inputs:
        try:
            rel = Path(os.path.realpath(r.path)).relative_to(os.path.realpath(tmp_dir))
        except ValueError:
            continue
        if is_own(rel.as_posix()):
            raise OutputError(f"{r.path}: {r.what} is a file of the temp dir, which the run removes; "
                              "expected inputs outside --tmp_dir")
    if create and not marked(tmp_dir):
        # Both tokens in the first write: there is never a marker of the tool's without them.
        write_marker(tmp_dir, {"tool": "seq2seq_eval", "folder": secrets.token_hex(16),
                                "token": secrets.token_hex(16), "made": made})


def _check_manifest_token(tmp_dir: Path, folder_token: str) -> None:
    """A manifest in a marked temp dir must carry the marker's folder token: one that does not
    (copied in, written by hand, or an earlier release's) is not read as this folder's run."""
    if os.path.lexists(tmp_dir / MANIFEST) and not manifest_carries(tmp_dir, folder_token):
        raise RunStateError(
            f"--tmp_dir {tmp_dir}: {MANIFEST} does not carry the token of the folder's {MARKER} marker, so it was "
            "not written by seq2seq_eval for this temp dir (copied in, written by hand, or an earlier release's); "
            "nothing there was touched: give another --tmp_dir, or remove that folder to start over")


def _through_link(tmp_dir: Path, rel: str) -> bool:
    """Whether a path inside the temp dir is, or lies under, a symbolic link."""
    path = tmp_dir
    for part in rel.split("/"):
        path = path / part
        if os.path.islink(path):
            return True
    return False


def new_token(tmp_dir: Path) -> str:
    """Rank 0, holding the run lock: the marker carries a fresh token, this run's. A publish
    names it, and a recovery that completes that publish removes the temp dir only while the
    marker still carries it: once another run (a --resume too) has claimed the folder, it is
    that run's, whatever its path. A temp dir whose run was published (mark_published) holds
    nothing to resume: what that run left there is removed first."""
    marker = read_marker(tmp_dir)
    if marker is None:
        raise RunStateError(f"--tmp_dir {tmp_dir}: its {MARKER} marker is gone or not the tool's; give another --tmp_dir")
    if marker.get("published"):
        _remove_own_files(tmp_dir, keep=(MARKER, LOCK))
        logger.info("%s: removed what the run published from here had left (its outputs were in place)", tmp_dir)
    token = secrets.token_hex(16)
    write_marker(tmp_dir, {"tool": "seq2seq_eval", "folder": marker["folder"], "made": marker.get("made") or [],
                            "token": token})
    return token


def remove_finished_tmp_dir(tmp_dir: Path, token: str | None) -> None:
    """The temp dir of a run whose outputs were published (a recovery completed the publish the
    run was killed in): removed as that run would have, only while its marker carries that
    run's `token` and no other run holds it; else left alone, said in one line."""
    if tmp_token(tmp_dir) is None:
        return  # gone, or not the tool's: nothing of that run's is left there
    lock = RunLock(tmp_dir)
    try:
        lock.acquire()
    except RunStateError:
        logger.warning("%s: kept: another run is using it (the run whose publish was completed had left it)", tmp_dir)
        return
    try:
        if token is None or tmp_token(tmp_dir) != token:
            logger.warning("%s: kept: it now belongs to another run (its marker %s carries another run's token "
                           "than the one whose publish was completed)", tmp_dir, MARKER)
            return
        mark_published(tmp_dir, token)  # what a fault leaves of it is then cleared, not resumed from
        cleanup_tmp_dir(tmp_dir)
    finally:
        lock.release()


def compare_manifests(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    keys = sorted((set(old) | set(new)) - {FOLDER_KEY})
    return [k for k in keys if old.get(k) != new.get(k)]


def finished_journals(tmp_dir: Path) -> list[Path]:
    """Journals that hold at least part of a line: an earlier run finished (or was writing) a batch."""
    found = []
    for path in journal_files(tmp_dir):
        with contextlib.suppress(OSError):
            if path.stat().st_size:
                found.append(path)
    return found


def refuse_earlier_run(tmp_dir: Path, resume: bool) -> None:
    """Before anything is written into the temp dir: without --resume, an earlier run's work is
    an error (check_tmp_dir compares the manifests once this run's is known). A run that stopped
    before journaling any batch left nothing to resume or to lose: the next run starts over."""
    journals = finished_journals(tmp_dir)
    if not journals or (read_marker(tmp_dir) or {}).get("published"):
        return  # nothing, or a published run's leftovers (new_token removes them)
    if not (tmp_dir / MANIFEST).exists():
        raise RunStateError(f"{tmp_dir} holds journals but no manifest; remove {tmp_dir} to start over")
    if not resume:
        raise RunStateError(
            f"{tmp_dir} holds an earlier run's files ({len(journals)} journal(s)); "
            f"pass --resume to continue it, or remove {tmp_dir} to start over"
        )


def recorded_budget(tmp_dir: Path) -> tuple[int | None, int | None] | None:
    """The batch budget (bs, max_tokens) of the earlier run whose journals a resumed run reuses,
    from its manifest; None when there is nothing to resume or no readable budget (check_tmp_dir
    then says what is wrong). One cut for the world size (--budget_for_world_size) depends on it:
    a run resumed under another one takes this budget, and so the same batches, instead."""
    if not finished_journals(tmp_dir):
        return None
    try:
        plan = json.loads((tmp_dir / MANIFEST).read_text(encoding="utf-8"))["plan"]
        bs, max_tokens = plan["bs"], plan["max_tokens"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    valid = lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)  # noqa: E731
    if not (valid(bs) and valid(max_tokens)) or (bs is None) == (max_tokens is None):
        return None
    return bs, max_tokens


def check_tmp_dir(tmp_dir: Path, manifest: Mapping[str, Any], resume: bool) -> bool:
    """Whether the temp dir already belongs to this run (read-only; raises if it may not be used).

    Without --resume a temp dir holding an earlier run's finished batches is an error, so two
    unrelated runs can never be merged; with --resume its manifest must match this run's exactly.
    """
    path = tmp_dir / MANIFEST
    refuse_earlier_run(tmp_dir, resume)
    if not path.exists() or not finished_journals(tmp_dir) or (read_marker(tmp_dir) or {}).get("published"):
        return False
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunStateError(f"{path}: unreadable manifest ({e}); remove {tmp_dir} to start over") from e
    differ = compare_manifests(old, manifest)
    if differ:
        # The budget is the one plan setting a user may not know: a default chose it.
        budget = recorded_budget(tmp_dir)
        cut = "" if "plan" not in differ or budget is None else (
            f" (its batches were cut with --bs {budget[0]})" if budget[0] is not None
            else f" (its batches were cut with --max_tokens {budget[1]})")
        raise RunStateError(
            f"--resume: {tmp_dir} belongs to a run with different {', '.join(differ)}{cut}; "
            f"rerun with the same settings, or remove {tmp_dir} to start over"
        )
    return True


def prepare_tmp_dir(tmp_dir: Path, manifest: Mapping[str, Any], resume: bool) -> int:
    """Rank 0, holding the lock: make the temp dir ready for this run. Returns how many journal
    files a resumed run found."""
    path = tmp_dir / MANIFEST
    if not check_tmp_dir(tmp_dir, manifest, resume):
        write_json_atomic(path, {**manifest, FOLDER_KEY: folder_token(tmp_dir)})
    journals = journal_files(tmp_dir)
    # Rank files are re-derived from the journals at the end of every run; an old one left by a
    # run with another world size must never be merged into this one.
    for stale in [*tmp_dir.glob("rank_*_output.*"), *tmp_dir.glob("tail_*"), tmp_dir / STOPPED, tmp_dir / DONE]:
        if is_own(stale.name):
            stale.unlink(missing_ok=True)
    # Claims belong to one attempt: a batch claimed by a rank that died before journaling it
    # must be free to run again; a journaled one is reused by whoever claims it.
    claims = claims_dir(tmp_dir)
    if claims.is_dir():
        for stale in claims.iterdir():
            if is_own(f"{CLAIMS}/{stale.name}"):
                stale.unlink(missing_ok=True)
    claims.mkdir(exist_ok=True)
    return len(journals)


def _remove_own_files(tmp_dir: Path, keep: Sequence[str] = (MARKER,)) -> list[str]:
    """The files the tool makes in its temp dir (OWN), found without following a link (a link in
    their place, or in a folder's, is not the tool's, and nothing is removed through one), but
    `keep`; then its own folders if empty. Returns those that could not be removed."""
    token, failed = (read_marker(tmp_dir) or {}).get("folder"), []
    for rel in _entries(tmp_dir):
        if rel == MANIFEST and not manifest_carries(tmp_dir, token):
            continue  # not this folder's manifest (_check_manifest_token): not the tool's to remove
        if is_own(rel) and rel not in keep and not _through_link(tmp_dir, rel):
            try:
                (tmp_dir / rel).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                failed.append(f"{rel} ({e.strerror or e})")
    for folder in _OWN_FOLDERS:
        try:
            (tmp_dir / folder).rmdir()
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:  # not empty: something not the tool's is in it, and stays
                failed.append(f"{folder}/ ({e.strerror or e})")
    return failed


def cleanup_tmp_dir(tmp_dir: Path) -> None:
    """Remove the files the tool made in its temp dir (OWN), then the folders it made, if
    nothing else is left in them. A folder without the tool's marker is not the tool's: left
    alone. The marker goes last, and only once every file of the tool's is gone: a folder it
    could not empty stays the tool's, for the next command to clear."""
    marker = read_marker(tmp_dir)
    if marker is None:
        return
    failed = _remove_own_files(tmp_dir)
    if failed:
        logger.warning("%s: could not remove %s; the folder stays seq2seq_eval's: the next command in it removes "
                       "what is left", tmp_dir, ", ".join(failed[:3]) + (f" and {len(failed) - 3} more" if len(failed) > 3 else ""))
        return
    with contextlib.suppress(OSError):
        (tmp_dir / MARKER).unlink()
    for folder in sorted(marker.get("made") or [], key=len, reverse=True):  # the deepest first
        with contextlib.suppress(OSError):
            os.rmdir(folder)
