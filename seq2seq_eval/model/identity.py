"""What identifies the model a run loads: the hub snapshot a hub name resolves to, or the
content of a local folder. Read by the conversion cache's key (engines/ct2_convert.py) and by the
run's provenance (run/prepare.py), so that both name the same weights; and whether a local
folder's weight files are whole (check_safetensors), before any work.

A file's content digest is computed once per version of the file (`known_sha256`): kept in the
cache (`cache_root()/digests`) under the file's identity on disk (its device, inode, size, and
modification and change times in nanoseconds), so that a later run of the same checkpoint reads
its digest instead of every byte of its weights again. Any write to the file, a rename over it
or a restored modification time changes its change time, which the system sets and no user can,
and so the identity: that version's digest is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ..atomic import write_json_atomic
from ..errors import EvalError, ModelError

SETTLED_NS = 2_000_000_000
"""A digest is kept only for a file whose last change is this much older than the reading of it:
file times advance by the kernel's clock tick, so a write in the same tick as the one before the
reading could leave the same times on other bytes (git's "racily clean" files)."""


def cache_root() -> Path:
    """Where the tool keeps what later runs reuse (converted models, file digests):
    $SEQ2SEQ_EVAL_CACHE, else $XDG_CACHE_HOME/seq2seq_eval, else ~/.cache/seq2seq_eval."""
    explicit = os.environ.get("SEQ2SEQ_EVAL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "seq2seq_eval"


def hub_revision(model_name: str) -> str | None:
    """The commit of the hub snapshot that `model_name` resolves to now: the one from_pretrained
    loads (with HF_HUB_OFFLINE, the one the local cache's refs point at). None for a local folder,
    or a name that cannot be resolved (loading it then fails with its own message).

    Read from the resolved path of its config.json (`.../snapshots/<commit>/config.json`), as
    transformers 4 filled `config._commit_hash`; transformers 5 no longer sets that attribute."""
    if os.path.isdir(os.path.expanduser(model_name)):
        return None
    from transformers.utils.hub import cached_file, extract_commit_hash

    try:
        resolved = cached_file(model_name, "config.json", _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False)
    except (OSError, ValueError):
        return None
    return extract_commit_hash(resolved, None)


def files_digest(folder: Path) -> str:
    """Every regular file of a folder, by name and content: a model's weights, config and tokenizer."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0")
        h.update(known_sha256(f).encode())
    return h.hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def known_sha256(*paths: Path) -> str:
    """The sha256 of the files' contents one after the other (file_sha256 of one file), read from
    the digest cache when these versions of the files were hashed before (the module's
    docstring), else computed and kept there. A cache that cannot be read or written costs only
    the hashing."""
    real = [os.path.realpath(p) for p in paths]
    before = [_identity(os.stat(r)) for r in real]
    key = hashlib.sha256(json.dumps([[r, *i] for r, i in zip(real, before)]).encode()).hexdigest()
    memo = cache_root() / "digests" / f"{key}.json"
    try:
        known = json.loads(memo.read_text())["sha256"]
        if isinstance(known, str) and len(known) == 64:
            return known
    except (OSError, ValueError, KeyError, TypeError):
        pass
    started = time.time_ns()
    h = hashlib.sha256()
    for r in real:
        _update(h, Path(r))
    digest = h.hexdigest()
    settled = all(max(i[3], i[4]) < started - SETTLED_NS for i in before)
    if settled and [_identity(os.stat(r)) for r in real] == before:  # none written while read
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(memo, {"paths": real, "sha256": digest})
        except (OSError, EvalError):
            pass  # only a saving for the next run
    return digest


def _update(h: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    _update(h, path)
    return h.hexdigest()


def check_safetensors(folder: Path) -> None:
    """Every *.safetensors file of a local model folder has a readable header, and its tensors
    lie inside the file: a truncated or damaged file is one line before any work (in the dry run
    too), not a traceback from the loader after the temp dir is made. Reads each file's header only."""
    for path in sorted(folder.glob("*.safetensors")):
        why = _safetensors_problem(path)
        if why is not None:
            raise ModelError(f"--model_name {folder}: {path.name} {why}; expected a complete safetensors file "
                             "(save or download it again)")


def _safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (8 bytes of header length, the JSON header,
    then the tensors' bytes at the header's data_offsets), or None."""
    import json

    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"is {size} bytes long, too short for a safetensors header"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"is truncated: its header says {n} bytes of header, but {size - 8} bytes follow the length"
        try:
            header = json.loads(fh.read(n))
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "has an unreadable header (expected a JSON object of tensors with their data_offsets)"
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"is truncated: its tensors end at byte {need}, but the file holds {size} bytes"
    return None
