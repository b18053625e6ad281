"""The temp dir's marker, `.seq2seq_eval_tmp`: what makes a folder the tool's, by two random
tokens it wrote (run/tmpdir.py claims, uses and cleans the folder)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..atomic import dumps, write_atomic
from ..errors import EvalError

MARKER = ".seq2seq_eval_tmp"
MANIFEST = "manifest.json"
FOLDER_KEY = "tmp_dir_token"
"""The manifest's copy of the marker's folder token: a manifest without it is not this folder's."""

_TOKEN = re.compile(r"[0-9a-f]{32}")
_MARKER_WRITING = re.compile(r"\.seq2seq_eval_tmp\.([0-9a-f]{32})\.tmp")
"""The marker's own temporary file while it is written: named by the marker's folder token, so a
kill between its write and its rename leaves a file the next command knows by that token."""


def read_marker(tmp_dir: Path) -> dict[str, Any] | None:
    """The temp dir's marker when it is one the tool wrote: the tool's name, the folder's token
    (`folder`, written once, when the tool first claims the folder; its manifest carries it
    too) and the token of the run that last claimed it (`token`). A marker without both tokens
    (an earlier release's, or one written by hand) is not the tool's: None."""
    try:
        data = json.loads((tmp_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(data, dict) and data.get("tool") == "seq2seq_eval"
            and all(isinstance(data.get(k), str) and _TOKEN.fullmatch(data[k]) for k in ("folder", "token"))):
        return None
    return data


def marked(tmp_dir: Path) -> bool:
    return read_marker(tmp_dir) is not None


def write_marker(tmp_dir: Path, marker: Mapping[str, Any]) -> None:
    """The marker written whole in one step: its temporary file carries the folder token in its
    name (_MARKER_WRITING), then is renamed into place."""
    write_atomic(tmp_dir / MARKER, dumps(dict(marker)), name=f"{MARKER}.{marker['folder']}.tmp")


def half_made_markers(tmp_dir: Path) -> list[str]:
    """The markers a kill left half made in a folder that holds no marker: regular files named
    by a token (_MARKER_WRITING) that are empty or hold a marker of that token. Nothing else."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp_dir):
            m = _MARKER_WRITING.fullmatch(name)
            if m is None or not os.path.isfile(tmp_dir / name) or os.path.islink(tmp_dir / name):
                continue
            try:
                data = (tmp_dir / name).read_bytes()
                if data and json.loads(data).get("folder") != m.group(1):
                    continue
            except (OSError, ValueError, AttributeError):
                continue
            found.append(name)
    return found


def manifest_carries(tmp_dir: Path, folder_token: str | None) -> bool:
    try:
        token = json.loads((tmp_dir / MANIFEST).read_text(encoding="utf-8")).get(FOLDER_KEY)
    except (OSError, ValueError, AttributeError):
        return False
    return folder_token is not None and token == folder_token


def tmp_token(tmp_dir: Path) -> str | None:
    """The token of the run that last claimed the temp dir (its marker's), or None."""
    marker = read_marker(tmp_dir)
    return marker["token"] if marker is not None else None


def folder_token(tmp_dir: Path) -> str | None:
    """The temp dir's own token (its marker's `folder`), which its manifest carries; or None."""
    marker = read_marker(tmp_dir)
    return marker["folder"] if marker is not None else None


def mark_published(tmp_dir: Path, token: str | None) -> None:
    """The run with `token` has its outputs in place: said in the marker before the run removes
    its files here, so that a kill or a signal while it removes them leaves a folder the next
    command clears (new_token), never one it refuses as an unfinished run."""
    marker = read_marker(tmp_dir)
    if marker is None or token is None or marker["token"] != token:
        return
    with contextlib.suppress(OSError, EvalError):  # then the next command is told to --resume: still safe
        write_marker(tmp_dir, {**marker, "published": True})
