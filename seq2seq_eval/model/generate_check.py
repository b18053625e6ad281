"""generate()'s own checks of the generation settings, made before any work.

GenerationConfig.validate() leaves value ranges to the logits processors, which generate()
builds in the first batch: `--temperature -1 --do_sample true` or `--max_length -1` used to pass
the dry run, then fail after the model was loaded. Here generate()'s own builder runs on the
settings with a one-token stand-in input, so the same checks (and messages) come first.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

from ..errors import ConfigError, first_line


class _Shell:
    """What `_get_logits_processor` reads of the model: its config, and one helper method."""

    def __init__(self, model_config: Any, mixin: type) -> None:
        self.config = model_config
        self._merge_criteria_processor_list = mixin._merge_criteria_processor_list.__get__(self)


def check_generate_settings(gc: Any, model_config: Any) -> None:
    """Raise ConfigError for settings generate() would refuse in its first batch."""
    # generate() counts the decoder start token in max_length (see _validate_generated_length).
    if gc.max_new_tokens is None and gc.max_length is not None and gc.max_length < 2:
        raise ConfigError(f"invalid generate options: max_length={gc.max_length} leaves no room to generate "
                          "(it counts the decoder's start token); expected max_length >= 2, or set --max_new_tokens")
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
        raise ConfigError(f"invalid generate options: {first_line(e)}") from e
    except (TypeError, AttributeError):
        return  # the builder wants what this release's stand-in lacks: generate() checks in the first batch
