"""What identifies the model a run loads: the hub snapshot a hub name resolves to, or the
content of a local folder. Read by the conversion cache's key (engines/ct2_convert.py) and by the
run's provenance (run/prepare.py), so that both name the same weights; and whether a local
folder's weight files are whole (check_safetensors), before any work."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import ModelError


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
        h.update(file_sha256(f).encode())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
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
