"""COMET's published layout: a folder (or a hub repository) with `hparams.yaml` and
`checkpoints/model.ckpt`, a Lightning checkpoint whose `state_dict` holds the encoder
(`encoder.model.*`), the layer mix (`layerwise_attention.*`), the estimator (`estimator.ff.*`)
and, in a word-level unified model, the tagger (`hidden2tag.*`). hparams.yaml's
class_identifier says which class computes it, as in unbabel-comet's load_from_checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import ModelError

DEFAULT_MODEL = "Unbabel/wmt22-comet-da"
REGRESSION = "regression_metric"
CLASSES = (REGRESSION, "unified_metric", "xcomet_metric")
"""The classes computed here: COMET-22/20's regression, CometKiwi's unified and XCOMET's."""
REFUSED = {
    "referenceless_regression_metric": "a reference-free regression model (COMET-QE, wmt20/21-comet-qe)",
    "ranking_metric": "a ranking model (COMET-rank)",
}
ENCODERS = ("XLM-RoBERTa", "XLM-RoBERTa-XL")
DEFAULT_ENCODER = {"xcomet_metric": "XLM-RoBERTa-XL"}
"""A class's encoder_model when hparams.yaml does not name one (its constructor's default)."""
FILES = ("hparams.yaml", "checkpoints/model.ckpt")


def model_folder(name_or_path: str) -> Path:
    """A local folder as it is; otherwise a hub repository's two files, from the cache when
    offline (HF_HUB_OFFLINE=1)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        for name in FILES:
            if not (path / name).is_file():
                raise ModelError(f"--comet_model {name_or_path}: {path / name} is missing; "
                                 "expected COMET's layout (hparams.yaml and checkpoints/model.ckpt)")
        return path
    if path.is_absolute() or name_or_path.startswith("."):
        raise ModelError(f"--comet_model {name_or_path}: no such folder")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name_or_path, allow_patterns=list(FILES)))
    except Exception as e:  # the hub's errors have no common base worth naming
        raise ModelError(f"--comet_model {name_or_path}: not a local folder and not found on the hub or in its cache "
                         f"({type(e).__name__}); see docs/metrics.md#comet for offline use") from e


def hparams_of(name_or_path: str) -> dict[str, Any]:
    """hparams.yaml alone, checked: what the model reads and writes is declared from it before
    any work. A hub name fetches only that file (the checkpoint waits for the load)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() or path.is_absolute() or name_or_path.startswith("."):
        return read_hparams(model_folder(name_or_path), name_or_path)
    from huggingface_hub import hf_hub_download

    try:
        return read_hparams(Path(hf_hub_download(name_or_path, "hparams.yaml")).parent, name_or_path)
    except ModelError:
        raise
    except Exception as e:  # the hub's errors have no common base worth naming
        raise ModelError(f"--comet_model {name_or_path}: not a local folder and not found on the hub or in its cache "
                         f"({type(e).__name__}); see docs/metrics.md#comet for offline use") from e


def segments(hparams: dict[str, Any]) -> list[str]:
    """The inputs a class reads besides the translation, in unbabel-comet's names: a regression
    model src and ref; a unified one its input_segments (default all three); XCOMET all three,
    its reference optional."""
    kind = hparams["class_identifier"]
    if kind == "unified_metric":
        return [str(x) for x in hparams.get("input_segments", ["mt", "src", "ref"])]
    return ["mt", "src", "ref"]


def needs_references(hparams: dict[str, Any]) -> bool:
    """A regression model always; a unified one only when trained on [mt, ref] alone (its
    requires_references()); XCOMET never (it falls back to [mt, src])."""
    kind = hparams["class_identifier"]
    return kind == REGRESSION or (kind == "unified_metric" and segments(hparams) == ["mt", "ref"])


def tags_words(hparams: dict[str, Any]) -> bool:
    """Whether it writes error spans: XCOMET always, a unified model trained word-level."""
    return hparams["class_identifier"] == "xcomet_metric" or (
        hparams["class_identifier"] == "unified_metric" and bool(hparams.get("word_level_training", False)))


def _is_layer(v: Any) -> bool:
    return v == "mix" or (isinstance(v, int) and not isinstance(v, bool))


def _is_list(kind: type, v: Any, ok: Any = lambda x: True) -> bool:
    return isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) and ok(x) for x in v)


FIELDS: dict[str, tuple[Any, str]] = {
    # The keys the tool reads (absent: the class's default, as unbabel-comet's constructors give it).
    "class_identifier": (lambda v: isinstance(v, str), "a class name"),
    "encoder_model": (lambda v: isinstance(v, str), "an encoder name"),
    "pretrained_model": (lambda v: isinstance(v, str), "a hub name or a folder"),
    "pool": (lambda v: v in ("avg", "max", "cls", "default"), "avg, max, cls or default"),
    "layer": (_is_layer, "mix or a layer number"),
    "sent_layer": (_is_layer, "mix or a layer number"),
    "word_layer": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a layer number"),
    "layer_transformation": (lambda v: v in ("softmax", "sparsemax", "sparsemax_patch"),
                             "softmax, sparsemax or sparsemax_patch"),
    "layer_norm": (lambda v: isinstance(v, bool), "true or false"),
    "word_level_training": (lambda v: isinstance(v, bool), "true or false"),
    "hidden_sizes": (lambda v: _is_list(int, v, lambda x: x > 0) and bool(v), "a list of positive integers"),
    "activations": (lambda v: isinstance(v, str), "a torch.nn activation's name"),
    "final_activation": (lambda v: v is None or isinstance(v, str), "null or a torch.nn activation's name"),
    "input_segments": (lambda v: _is_list(str, v, lambda x: x in ("mt", "src", "ref")) and "mt" in v
                       and len(set(v)) == len(v), "a list of distinct mt, src, ref, mt among them"),
    "error_labels": (lambda v: _is_list(str, v) and bool(v), "a list of labels"),
}
"""What each hparams.yaml key the tool reads must hold: (test, what is expected)."""


def read_hparams(folder: Path, shown: str) -> dict[str, Any]:
    """hparams.yaml, checked field by field: a file that is not YAML, not a mapping, or a key the
    tool reads holding another kind of value is refused in one line naming the file, the place and
    what was expected (never a parser's several lines, nor a traceback when the network is built)."""
    import yaml

    path = folder / "hparams.yaml"
    where = f"--comet_model {shown}: {path}"
    try:
        hparams = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"{where}: cannot be read ({e.strerror or type(e).__name__})") from e
    except UnicodeDecodeError as e:
        raise ModelError(f"{where}: not UTF-8 text (byte {e.start}); expected COMET's hparams.yaml") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ModelError(f"{where}: not YAML{at} ({problem}); expected a mapping of COMET's hyper-parameters") from e
    if not isinstance(hparams, dict):
        raise ModelError(f"{where}: holds {'nothing' if hparams is None else f'a {type(hparams).__name__}'}; expected "
                         "a mapping of COMET's hyper-parameters (class_identifier, pretrained_model, ...)")
    for key, (ok, expected) in FIELDS.items():
        if key in hparams and not ok(hparams[key]):
            raise ModelError(f"{where}: {key} is {hparams[key]!r}; expected {expected}")
    kind = hparams.get("class_identifier", REGRESSION)
    if kind in REFUSED:
        raise ModelError(f"--comet_model {shown}: {REFUSED[kind]} ({kind}) is not supported; supported classes: "
                         f"{', '.join(CLASSES)} (COMET-22/20, CometKiwi, XCOMET)")
    if kind not in CLASSES:
        raise ModelError(f"--comet_model {shown}: unknown class_identifier {kind!r}; expected one of {', '.join(CLASSES)}")
    hparams["class_identifier"] = kind
    hparams.setdefault("encoder_model", DEFAULT_ENCODER.get(kind, "XLM-RoBERTa"))
    if hparams["encoder_model"] not in ENCODERS:
        raise ModelError(f"--comet_model {shown}: encoder_model {hparams['encoder_model']!r} is not supported; "
                         f"expected one of {', '.join(ENCODERS)}")
    if hparams.get("layer_transformation") == "sparsemax_patch":
        # unbabel-comet 2.2.7 (and 2.2.6) run softmax for it: the hub's XCOMET and CometKiwi-XL
        # checkpoints were trained so, before 2.2.5 began to honour the unified classes' setting.
        hparams["layer_transformation"] = "softmax"
    return hparams


def encoder_source(folder: Path, hparams: dict[str, Any]) -> str:
    """Where the encoder's config and tokenizer come from: `pretrained_model` as an absolute path,
    else a folder of that name beside hparams.yaml (offline use), else that hub name."""
    name = str(hparams.get("pretrained_model", "xlm-roberta-large"))
    if os.path.isabs(name):
        return name
    local = folder / name
    return str(local) if local.is_dir() else name


def load_state_dict(folder: Path) -> dict[str, Any]:
    """The checkpoint's state dict, read with no code from the file run (seq2seq_eval/pickles.py:
    weights_only=True, a checkpoint naming any other global than tensors' and Lightning's
    containers refused in one line before it is read). The tensors are mapped, not read: their
    names and shapes cost nothing whatever the checkpoint's size, and loading copies them once."""
    from ...pickles import read

    path = folder / "checkpoints" / "model.ckpt"
    ckpt = read(path, "COMET checkpoints hold")
    state = ckpt.get("state_dict") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise ModelError(f"{path}: no state_dict; expected a Lightning checkpoint")
    import torch

    odd = next((k for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if odd is not None:
        raise ModelError(f"{path}: state_dict[{odd!r}] is a {type(state[odd]).__name__}; expected a tensor")
    return state


def layout_problem(network: Any, state: dict[str, Any]) -> str | None:
    """What keeps a checkpoint's tensors from being the network's: the names missing or
    unexpected, or the first shape (in the network's order) that differs; None when they fit.
    Buffers that are no parameters are left out: position ids, the layer mix's dropout mask and
    the word loss's class weights (training only)."""
    buffers = ("position_ids", "token_type_ids", "dropout_mask", "dropout_fill")
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items() if not k.endswith(buffers)}
    given = {k: tuple(v.shape) for k, v in state.items() if not k.endswith(buffers) and not k.startswith("wordloss.")}
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    if missing or unexpected:
        return f"missing {missing[:3]}, unexpected {unexpected[:3]}"
    for key, shape in expected.items():
        if given[key] != shape:
            return f"{key} has shape {list(given[key])} where hparams.yaml and the encoder's config give {list(shape)}"
    return None
