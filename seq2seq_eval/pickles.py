"""The one rule for every torch pickle the tool reads (a COMET model.ckpt, a MetricX or BERTScore
pytorch_model.bin): no code from the file runs. A pickle names the functions and classes it calls
(its GLOBALs); the file is first scanned for them without unpickling anything, and one that is
neither torch's own (tensors, storages, dtypes, OrderedDict...) nor in the allowed list (_allowed)
is refused in one line naming it, before the file is read. Then torch reads it with weights_only=True, which
enforces the same list (a scan that missed a name would still run nothing).

The allowed list holds what Lightning checkpoints (COMET's layout) hold beside tensors, each a container
of values whose unpickling runs nothing of the file's: Lightning's hyper-parameter dict
(AttributeDict, under each module name Lightning has put it in: it is not a dependency, so a
stand-in of the same behaviour is registered under those names), argparse.Namespace (hparams of
Lightning's older checkpoints), and numpy scalars and dtypes (logged values)."""

from __future__ import annotations

import argparse
import io
import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ModelError


class AttributeDict:
    """Lightning's AttributeDict (lightning_fabric.utilities.data), a dict whose items are also
    attributes, read as the plain dict of its items: its pickle makes the object (NEWOBJ) and then
    sets its items (SETITEMS), which torch's weights-only reader does only on a plain dict. Nothing
    of it is called but this __new__; the tool reads no hyper-parameter from the checkpoint (they
    come from hparams.yaml)."""

    def __new__(cls, *args: Any) -> dict:  # type: ignore[misc]
        return {}


LIGHTNING_DICTS = ("lightning_fabric.utilities.data.AttributeDict", "lightning.fabric.utilities.data.AttributeDict",
                   "pytorch_lightning.utilities.parsing.AttributeDict",
                   "lightning.pytorch.utilities.parsing.AttributeDict")
"""Where Lightning has defined AttributeDict: 2.x (lightning_fabric, the unified `lightning`
package) and 1.x (pytorch_lightning.utilities.parsing)."""


def _allowed() -> list[Any]:
    """What torch.serialization.safe_globals is given: (object, "the dotted name a pickle gives")."""
    import numpy as np

    scalar = np._core.multiarray.scalar if hasattr(np, "_core") else np.core.multiarray.scalar
    pairs: list[Any] = [(AttributeDict, name) for name in LIGHTNING_DICTS]
    pairs += [(argparse.Namespace, "argparse.Namespace"), (np.dtype, "numpy.dtype"),
              # numpy 2 names the scalar's module numpy._core, numpy 1 numpy.core
              (scalar, "numpy._core.multiarray.scalar"), (scalar, "numpy.core.multiarray.scalar")]
    # An unpickled dtype is an instance of its kind's class (numpy.dtypes.Float64DType, ...),
    # which torch's BUILD step wants allowed too; no pickle names these.
    pairs += sorted({type(np.dtype(c)) for c in "?bhilqpBHILQPefdgFDG"}, key=str)
    return pairs


def allowed_names() -> frozenset[str]:
    """The GLOBALs a file may name: torch's defaults and the allowed list's names."""
    from torch import _weights_only_unpickler as wo

    return frozenset(wo._get_allowed_globals()) | {p[1] for p in _allowed() if isinstance(p, tuple)}


def _pickles(path: Path) -> Iterator[bytes | io.BufferedReader]:
    """The pickles a torch file holds: a zip's data.pkl (torch.save's format since torch 1.6); in
    the legacy format, the stream's leading pickles (magic number, protocol, system info, the
    object), read from the file."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith(".pkl"):
                    yield z.read(name)
        return
    with open(path, "rb") as f:
        for _ in range(4):
            if not f.peek(1):
                return
            yield f  # type: ignore[misc]  # genops reads one pickle, up to its STOP


def _globals(data: bytes | io.BufferedReader) -> Iterator[str]:
    """The dotted names the pickle's GLOBAL ops give (STACK_GLOBAL's come from the stack: named
    as such, refused, as torch's weights-only reader refuses the op)."""
    from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING

    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            module, name = str(arg).split(" ", 1)
            # Python 2 names, as torch's reader maps them (__builtin__.set is builtins.set).
            module, name = NAME_MAPPING.get((module, name), (IMPORT_MAPPING.get(module, module), name))
            yield f"{module}.{name}"
        elif op.name in ("STACK_GLOBAL", "INST", "OBJ"):
            yield f"<a global given by the {op.name} op>"


def refuse_code(path: Path | str, holds: str = "checkpoints hold") -> None:
    """Raises ModelError in one line when the torch file names a global that is not a tensor's
    nor in the allowed list (`holds` completes "one of the types ... beside tensors" in the message)."""
    path = Path(path)
    allowed = allowed_names()
    try:
        for data in _pickles(path):
            for name in _globals(data):
                if name not in allowed:
                    raise ModelError(f"{path}: holds a pickled {name}, which is not a tensor or one of the types "
                                     f"{holds} beside tensors; refused: reading it would run code from the file")
    except ModelError:
        raise
    except Exception as e:  # a cut or corrupt file: what its parser meets (ValueError, EOFError, zip errors)
        raise ModelError(f"{path}: not a readable checkpoint ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e


def read(path: Path | str, holds: str = "checkpoints hold", mmap: bool | None = None) -> Any:
    """The torch file's object, read with weights_only=True once refuse_code found only allowed
    globals; its tensors mapped (not read) where the format allows (mmap None: torch's zip format)."""
    import pickle

    import torch

    path = Path(path)
    refuse_code(path, holds)
    if mmap is None:
        mmap = zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(_allowed()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise refusal(str(path), e, holds) from e
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise ModelError(f"{path}: not a readable checkpoint ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e


def refusal(where: str, error: Exception, holds: str = "checkpoints hold") -> ModelError:
    """torch's weights-only refusal (several lines of advice, one of them to run the file's code)
    as one line: the global it names, else its reason."""
    import re

    text = str(error)
    found = re.search(r"GLOBAL (\S+)", text)
    if found:
        return ModelError(f"{where}: holds a pickled {found.group(1)}, which is not a tensor or one of the types "
                          f"{holds} beside tensors; refused: reading it would run code from the file")
    reason = next((line.strip() for line in text.splitlines() if "error:" in line.lower() and line.strip()), "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return ModelError(f"{where}: not a readable checkpoint ({reason or (lines[0] if lines else type(error).__name__)})")


def transformers_weights(name_or_path: str) -> list[Path]:
    """The pickled weight files transformers' from_pretrained reads for this model: pytorch_model.bin
    or the shards its index names, where its folder (a local one, or the hub cache's copy) holds no
    safetensors weights, which from_pretrained prefers. A hub name not in the cache gives none
    here: from_pretrained fetches and reads it with weights_only=True (nothing runs, in its words)."""
    import json

    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name_or_path, local_files_only=True))
        except Exception:  # not cached, or not a hub name: the checks that find the model say so
            return []
    if any((folder / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")):
        return []
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{index}: not a weights index ({type(e).__name__}); expected a JSON object with a "
                             "weight_map") from e
        return [folder / s for s in shards if (folder / s).is_file()]
    return [folder / "pytorch_model.bin"] if (folder / "pytorch_model.bin").is_file() else []


def refuse_code_in_model(name_or_path: str, holds: str = "model checkpoints hold") -> None:
    """refuse_code on every pickled weight file from_pretrained would read for the model."""
    for path in transformers_weights(name_or_path):
        refuse_code(path, holds)
