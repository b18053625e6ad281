"""Already converted CTranslate2 model folders: recognised without importing ctranslate2, and
described (model config, generation config) from the Hugging Face model they came from or from
their own config.json. Below both model.settings and engines.ct2, which use it."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from ..errors import ModelError, first_line
from .generation import model_generation_config
from .kind import CAUSAL, kind_of

# The model specifications CTranslate2 4.x writes for the two kinds (ctranslate2.specs): an
# encoder-decoder's Translator and a decoder-only model's Generator.
SEQ2SEQ_SPEC = "TransformerSpec"
DECODER_SPEC = "TransformerDecoderSpec"
MAX_FORMAT_VERSION = 1000
"""Above any binary version CTranslate2 has written (6 in 4.x), far below what the first four
bytes of another kind of file read as."""
SPEC_NAME = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*\0")


def is_converted_folder(name: str) -> bool:
    """Whether `name` is an already converted CTranslate2 model folder (its model.bin, and no
    weights transformers can load)."""
    path = os.path.expanduser(name)
    return os.path.isfile(os.path.join(path, "model.bin")) and not any(
        os.path.isfile(os.path.join(path, f)) for f in ("model.safetensors", "pytorch_model.bin"))


def converted_spec(folder: str) -> str:
    """The name of the model specification a converted folder's model.bin holds: its header is a
    uint32 format version, then the name as a uint16 length (the terminating NUL included) and
    its bytes (ctranslate2.specs.ModelSpec.save)."""
    path = Path(folder) / "model.bin"
    try:
        with open(path, "rb") as f:
            header = f.read(6)
            version, length = struct.unpack("<IH", header)
            name = f.read(length)
    except (OSError, struct.error) as e:
        raise ModelError(f"{path}: not a CTranslate2 model file ({first_line(e)})") from e
    # A file CTranslate2 did not write (a git-lfs pointer, a PyTorch checkpoint) has other bytes
    # there: no small format version, no NUL-terminated name of a specification class.
    if not 0 < version <= MAX_FORMAT_VERSION or len(name) != length or not SPEC_NAME.fullmatch(name):
        raise ModelError(f"{path}: not a CTranslate2 model file (its first bytes are {header[:6]!r}, not a format "
                         "version and a model specification's name)")
    return name[:-1].decode("ascii")


def converted_model_config(folder: str, tokenizer_name: str | None, tokenizer: Any) -> tuple[Any, Any]:
    """The model config and base generation config of an already converted model: those of the
    Hugging Face model named by --tokenizer_name when it has them (task settings, limits and
    generation defaults as published), else what CTranslate2's config.json says of the special
    tokens, with a generation_config.json in the folder when the conversion copied one. A
    decoder-only model needs the first: its prompts' limit, its kind and its generation settings
    are in no file of CTranslate2's."""
    from transformers import AutoConfig, GenerationConfig, PretrainedConfig

    config = None
    if tokenizer_name:
        try:
            config = AutoConfig.from_pretrained(os.path.expanduser(tokenizer_name))
        except (OSError, ValueError, KeyError):
            config = None
    spec = converted_spec(folder)
    if spec == DECODER_SPEC:
        if config is None or kind_of(config) != CAUSAL:
            given = (f", and --tokenizer_name {tokenizer_name} is not a decoder-only Hugging Face model" if tokenizer_name
                     else "; its config and generation settings come from the model it was converted from")
            raise ModelError(f"{folder}: a decoder-only CTranslate2 model{given}; expected --tokenizer_name naming the "
                             "decoder-only Hugging Face model it was converted from")
        return config, model_generation_config(tokenizer_name)  # type: ignore[arg-type]
    if spec != SEQ2SEQ_SPEC:
        raise ModelError(f"{folder}: a CTranslate2 {spec}; expected a converted encoder-decoder ({SEQ2SEQ_SPEC}) or "
                         f"decoder-only ({DECODER_SPEC}) model")
    if config is not None and getattr(config, "is_encoder_decoder", False):
        return config, model_generation_config(tokenizer_name)  # type: ignore[arg-type]
    path = Path(folder) / "config.json"
    try:
        ct2_config = json.loads(path.read_text())
        tokens = {k: ct2_config[k] for k in ("eos_token", "decoder_start_token")}
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{path}: not a CTranslate2 model config ({first_line(e)}); expected "
                         "eos_token and decoder_start_token entries") from e
    ids = {}
    for key, token in tokens.items():
        token_id = tokenizer.convert_tokens_to_ids(token) if token is not None else None
        if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ModelError(f"{path}: {key} {token!r} is not in the tokenizer's vocabulary; expected the tokenizer "
                             "the model was converted with (--tokenizer_name)")
        ids[key] = int(token_id)
    config = PretrainedConfig(is_encoder_decoder=True, eos_token_id=ids["eos_token"],
                              decoder_start_token_id=ids["decoder_start_token"], pad_token_id=tokenizer.pad_token_id)
    try:
        base = GenerationConfig.from_pretrained(folder)
    except OSError:
        base = GenerationConfig.from_model_config(config)
    return config, base
