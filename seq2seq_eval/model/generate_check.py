"""generate()'s own checks of the generation settings, made before any work.

GenerationConfig.validate() leaves value ranges to the logits processors, which generate()
builds in the first batch: `--temperature -1 --do_sample true` or `--max_length -1` used to pass
the dry run, then fail after the model was loaded. Here generate()'s own builder runs on the
settings with a one-token stand-in input, so the same checks (and messages) come first.

Building them needs transformers' generation module, whose import (torch's distributed tensors
and more) costs more CPU time than anything else a CTranslate2 run starts with, and which that
engine never uses otherwise. Settings that passed are remembered (`_passed`: a file in the
cache, named by the settings, the model config and the generation code they were checked with),
so a run with the same ones does not import it to learn the same verdict again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from ..atomic import write_json_atomic
from ..errors import ConfigError, EvalError, first_line
from .generation import named
from .identity import cache_root


class _Shell:
    """What `_get_logits_processor` reads of the model: its config, and one helper method."""

    def __init__(self, model_config: Any, mixin: type) -> None:
        self.config = model_config
        self._merge_criteria_processor_list = mixin._merge_criteria_processor_list.__get__(self)


def check_generate_settings(gc: Any, model_config: Any) -> None:
    """Raise ConfigError for settings generate() would refuse in its first batch (value ranges
    and limits are checked before, by model/generation.py: this catches what only the processors
    themselves know)."""
    memo = _passed(gc, model_config)
    if memo is not None and memo.is_file():
        return
    import torch
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.utils import GenerationMixin

    build = getattr(GenerationMixin, "_get_logits_processor", None)
    if build is None or not hasattr(GenerationMixin, "_merge_criteria_processor_list"):
        return  # another transformers release: generate() checks them in the first batch
    one = torch.ones((1, 1), dtype=torch.long)
    gc = copy.copy(gc)
    # Set by generate() itself before it builds the processors (_prepare_special_tokens).
    eos = gc.eos_token_id
    gc._eos_token_tensor = None if eos is None else torch.tensor(eos if isinstance(eos, list) else [eos])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its warnings are for generate()'s caller, who sees them there
            build(_Shell(model_config, GenerationMixin), generation_config=gc, input_ids_seq_length=1,
                  encoder_input_ids=one, prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(),
                  device="cpu", model_kwargs={"attention_mask": one, "decoder_attention_mask": one})
    except ValueError as e:
        raise ConfigError(f"invalid generate options: {named(first_line(e))}") from e
    except (TypeError, AttributeError):
        return  # the builder wants what this release's stand-in lacks: generate() checks in the first batch
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(memo, {"passed": True})
        except (OSError, EvalError):
            pass  # only a saving for the next run


def _passed(gc: Any, model_config: Any) -> Path | None:
    """Where the cache records that these settings passed the check: named by every field of the
    settings and of the model config, and by the transformers release and the files of its
    generation code (an edited installation is another one). None where the settings cannot be
    written down (then they are checked every time)."""
    import transformers

    code = Path(transformers.__file__).parent / "generation"
    try:
        files = [[name, *(lambda st: [st.st_size, st.st_mtime_ns])(os.stat(code / name))]
                 for name in ("utils.py", "logits_process.py", "configuration_utils.py")]
        text = json.dumps([transformers.__version__, files, gc.to_dict(), model_config.to_dict()], sort_keys=True)
    except (OSError, TypeError, ValueError):
        return None
    return cache_root() / "checks" / f"generate_{hashlib.sha256(text.encode()).hexdigest()}.json"


# Settings that hold token ids, as generate() takes them (their forms are checked with the
# config: model/fields.py).
TOKEN_ID_SETTINGS = ("pad_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id", "eos_token_id",
                     "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens", "bad_words_ids", "sequence_bias")


def _ids_in(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ids_in(v)]
    return []  # a bias (float) of sequence_bias, or a form the config check refuses


def check_token_ids(user: dict[str, Any], model_config: Any, tokenizer: Any) -> None:
    """Raise ConfigError for a token id the user gave that is outside the model's vocabulary:
    generate() refuses it in the first batch, CTranslate2 has no token to map it to."""
    size = getattr(model_config, "vocab_size", None) or len(tokenizer)
    for key in TOKEN_ID_SETTINGS:
        if key in user:
            outside = [i for i in _ids_in(user[key] if key != "sequence_bias" else [p[0] for p in user[key] or []])
                       if i >= size]
            if outside:
                raise ConfigError(f"--{key}: token id {outside[0]} is outside the model's vocabulary of {size} tokens; "
                                  f"expected ids from 0 to {size - 1}")
