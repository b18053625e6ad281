"""What identifies the model a run loads: the hub snapshot a hub name resolves to, or the
content of a local folder. Read by the conversion cache's key (engines/ct2_convert.py) and by the
run's provenance (run/prepare.py), so that both name the same weights."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


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
