"""The generation settings a run uses are those model.generate() would use on that model.

Read the way transformers 5 reads them, without loading any weights: the model's own generation
config as `from_pretrained` builds it (`model_generation_config`: generation_config.json, else the
generation keys of config.json, which checkpoints saved before that file existed carry), then
(model/settings.py) the task entry and the user's flags. Every value is checked against what its
field accepts (model/fields.py) and the fields against each other (`check_together`), for every
engine and before any work; then every field generate() fills in when it is unset is made explicit
(`effective`: top_k 50, max_length 20 tokens after the decoder's start, ...), so that an engine
other than generate() runs the same settings and the provenance records them all.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelError, first_line
from .fields import FIELDS, generate_defaults, is_neutral, value_error

# Settings generate() uses only in beam search, or only when sampling. A model's defaults or task
# entry often carry them (BART-CNN and T5 set early_stopping and length_penalty); with one beam,
# or without sampling, transformers refuses the whole config, so those that did not come from the
# user are reset (to what generate() fills in), and the run says which.
BEAM_ONLY = ("early_stopping", "length_penalty", "num_beam_groups", "diversity_penalty")
SAMPLE_ONLY = ("temperature", "top_p", "top_k", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")

MODEL_ORIGIN = "the model's generation config or task settings"
_OVERRIDE = "override it with --{0}, or unset it with --{0} none"


def model_generation_config(name: str) -> Any:
    """The generation config `from_pretrained(name)` gives the model (GenerationMixin.
    adjust_generation_fn): generation_config.json, else one made from config.json's own keys
    (`no_repeat_ngram_size`, `num_beams`, ... of a legacy checkpoint; `AutoConfig` drops them, so
    `GenerationConfig.from_model_config(AutoConfig...)` would not see them). A local
    generation_config.json that cannot be read is an error, not a silent fallback."""
    from transformers import GenerationConfig

    own = Path(os.path.expanduser(name)) / "generation_config.json"
    # There, whatever it is: a link to a file that is gone, or a folder, is an error too, not a
    # fallback to config.json's settings (which would drop the model's own).
    present = os.path.lexists(own)
    try:
        return GenerationConfig.from_pretrained(os.path.expanduser(name))
    except (ValueError, TypeError, AttributeError) as e:
        # Read, and refused by transformers: a value of the wrong kind (ValueError), a file that is
        # not a JSON object (TypeError) or a sub-config that is not an object (AttributeError).
        raise ModelError(f"{own if present else name}: not a usable generation config ({first_line(e)})") from e
    except OSError as e:
        if present:
            raise ModelError(f"{own}: not a readable generation config ({first_line(e)})") from e
    try:
        return GenerationConfig.from_pretrained(os.path.expanduser(name), config_file_name="config.json",
                                                _from_model_config=True)
    except (OSError, ValueError) as e:
        raise ModelError(f"--model_name {name}: cannot read its config.json's generation settings "
                         f"({first_line(e)})") from e


def drop_inapplicable(gc: Any, user: dict[str, Any]) -> list[str]:
    """Reset the beam-only settings with one beam, and the sampling-only ones without sampling,
    that the user did not give; returns `key=value` of each reset."""
    unused = []
    if (gc.num_beams or 1) == 1:
        unused += [k for k in BEAM_ONLY if k not in user and getattr(gc, k, None) is not None]
    if not gc.do_sample:
        unused += [k for k in SAMPLE_ONLY if k not in user and getattr(gc, k, None) is not None]
    defaults = generate_defaults()
    dropped = []
    for key in unused:
        if getattr(gc, key) != defaults.get(key):
            dropped.append(f"{key}={getattr(gc, key)!r}")
        setattr(gc, key, None)
    return dropped


def where(key: str, user: dict[str, Any], model_set: Any = None) -> str:
    """Where a setting's value came from, naming its option: the user's flag, the model's own
    settings, or (a field in neither `user` nor `model_set`) generate()'s default."""
    if key in user:
        return f"--{key}"
    if model_set is not None and key not in model_set:
        return f"{key} (generate()'s default when unset; set --{key})"
    return f"{key} (from {MODEL_ORIGIN}; {_OVERRIDE.format(key)})"


def check_values(gc: Any, user: dict[str, Any]) -> None:
    """Refuse, naming the option, a value its field does not accept, wherever it came from, and a
    user's sampling-only or beam-only setting where generate() would not use it."""
    for key, value in gc.to_dict().items():
        problem = value_error(key, value)
        if problem:
            shown = (f"--{key} {value!r}" if key in user
                     else f"{key}={value!r} (from {MODEL_ORIGIN}; {_OVERRIDE.format(key)})")
            raise ConfigError(f"{shown}: {problem}")
    for key in (k for k in SAMPLE_ONLY if k in user and not is_neutral(k, user[k]) and not gc.do_sample):
        raise ConfigError(f"--{key} {user[key]!r}: used only when sampling; add --do_sample true, or leave out --{key}")
    for key in (k for k in BEAM_ONLY if k in user and not is_neutral(k, user[k]) and (gc.num_beams or 1) == 1):
        raise ConfigError(f"--{key} {user[key]!r}: used only in beam search; set --num_beams above 1, or leave out "
                          f"--{key}")


def named(text: str) -> str:
    """transformers' message about settings, with each setting named as its option: "`top_k`"
    becomes "--top_k"."""
    return re.sub(r"`([a-z_]+)`", lambda m: f"--{m.group(1)}" if m.group(1) in FIELDS else m.group(0), text)


def validation_reason(e: BaseException) -> str:
    """transformers' reason for refusing a generation config, on one line. Its message starts
    with "GenerationConfig is invalid: " and puts the reasons on the following lines."""
    lines = [ln.strip().lstrip("- ") for ln in str(e).strip().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("If you're using a pretrained model")]
    if len(lines) > 1 and lines[0].rstrip().endswith(":"):
        return named(lines[0].rstrip() + " " + "; ".join(lines[1:]))
    return named("; ".join(lines) or type(e).__name__)


def effective(gc: Any, model_config: Any) -> Any:
    """`gc` with every field generate() fills in when unset made explicit, as generate() fills it
    (GenerationMixin._prepare_generation_config, _prepare_generated_length, _prepare_special_tokens):

    - transformers' defaults for the fields still unset (top_k 50, num_beams 1, ...);
    - max_length, when neither it nor max_new_tokens is set: 20 tokens after the decoder's start,
      within max_position_embeddings; left unset when max_new_tokens is set (generate() derives it);
    - min_length left unset when min_new_tokens is set, for the same reason;
    - pad_token_id: the first end token; decoder_start_token_id: bos_token_id.
    """
    gc = copy.deepcopy(gc)
    defaults = generate_defaults()
    if gc.max_length is None and gc.max_new_tokens is None:
        limit = getattr(model_config, "max_position_embeddings", None)
        total = defaults["max_length"] + 1  # the decoder's start counts in max_length
        gc.max_length = min(total, limit) if isinstance(limit, int) and limit > 1 else total
    for key, value in defaults.items():
        if key in ("max_length", "min_length" if gc.min_new_tokens is not None else "") or not hasattr(gc, key):
            continue
        if getattr(gc, key) is None:
            setattr(gc, key, copy.deepcopy(value))
    if gc.cache_implementation == "hybrid":  # generate() unsets it (transformers#40039)
        gc.cache_implementation = None
    eos = gc.eos_token_id
    if gc.pad_token_id is None and eos is not None:
        gc.pad_token_id = eos[0] if isinstance(eos, list) else eos
    if gc.decoder_start_token_id is None and getattr(model_config, "is_encoder_decoder", True):
        gc.decoder_start_token_id = gc.bos_token_id
    return gc


def full_dict(gc: Any) -> dict[str, Any]:
    """Every field of `gc` (unset ones as None), for the manifest and the provenance: two runs'
    settings compare field by field. transformers' config objects (WatermarkingConfig, ...) are
    given as their dicts: their text is only their class name."""
    return {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in sorted(gc.to_dict().items())
            if not k.startswith("_") and k != "transformers_version"}


def _new_tokens(gc: Any, which: str) -> tuple[int, str]:
    """The effective limit on generated tokens (max or min) and the option it comes from."""
    tokens, length = getattr(gc, f"{which}_new_tokens"), getattr(gc, f"{which}_length")
    if tokens is not None:
        return tokens, f"{which}_new_tokens"
    return max(0, (length or 0) - 1), f"{which}_length"


def check_together(gc: Any, user: dict[str, Any], model_set: Any, causal: bool = False) -> None:
    """Constraints between fields, for every engine, before any work, on the effective settings
    `gc` (a limit nobody set counts at the value generate() would use); `model_set`: the fields set
    before generate()'s defaults were filled in; `causal`: a decoder-only model (check_causal)."""
    if gc.max_new_tokens is None and gc.max_length is not None and gc.max_length < 2:
        raise ConfigError(f"{where('max_length', user, model_set)}: max_length={gc.max_length} leaves no room to "
                          "generate (it counts the decoder's start token); expected max_length >= 2, or set "
                          "--max_new_tokens")
    if not causal and gc.decoder_start_token_id is None and gc.bos_token_id is None:
        raise ConfigError(f"{where('decoder_start_token_id', user, model_set)}: unset, and so is bos_token_id; "
                          "generate() starts an encoder-decoder's decoder from one of them: expected a token id")
    most, most_key = _new_tokens(gc, "max")
    least, least_key = _new_tokens(gc, "min")
    if least > most:
        raise ConfigError(
            f"{where(least_key, user, model_set)}: asks for at least {least} generated tokens, more than the {most} "
            f"that {where(most_key, user, model_set)} allows ({least_key}={getattr(gc, least_key)}, "
            f"{most_key}={getattr(gc, most_key)}); expected {least_key} <= {most_key}")


# What a decoder-only model's generate() applies to the whole prompt row: in a left-padded batch
# the padding is part of it, so the example's output would depend on the batch it is in.
_PROMPT_LENGTH = "counts the prompt's tokens, and in a left-padded batch its padding"
_ENCODER_ONLY = ("encoder_repetition_penalty", "encoder_no_repeat_ngram_size")


def check_causal(gc: Any, user: dict[str, Any], model_set: Any) -> None:
    """A decoder-only model's settings, before any work: its limits in new tokens, and no setting
    generate() would apply to a batch's padding. max_length and min_length count the prompt, so in
    a batch each example would get another number of new tokens (the issue lm-evaluation-harness
    users see as results that change with the batch size); the encoder settings read the padded
    prompt, padding included."""
    if gc.max_new_tokens is None:
        if "max_length" in user:
            shown = f"--max_length {user['max_length']!r}"
        elif model_set is not None and "max_length" in model_set:
            shown = f"max_length={gc.max_length!r} (from {MODEL_ORIGIN})"
        else:
            # transformers 5's generate() (GenerationMixin._prepare_generated_length): with no
            # length set, max_length becomes 20 plus the padded prompt's width, cut to the model's
            # max_position_embeddings.
            raise ConfigError("no --max_new_tokens (nor max_new_tokens in the model's generation config or task "
                              "entry): generate() would give each prompt at most 20 new tokens, its default "
                              "max_length 20 counted after the batch's padded prompts and cut at the model's "
                              "max_position_embeddings (so a prompt near that limit would get fewer, depending on its "
                              "batch); give --max_new_tokens")
        raise ConfigError(f"{shown}: a decoder-only model's max_length {_PROMPT_LENGTH}, so every example would get "
                          "another number of new tokens; give --max_new_tokens")
    if (gc.min_length or 0) > 1:
        raise ConfigError(f"{where('min_length', user, model_set)}: min_length={gc.min_length}: a decoder-only "
                          f"model's min_length {_PROMPT_LENGTH}; give --min_new_tokens instead")
    for key in _ENCODER_ONLY:
        if not is_neutral(key, getattr(gc, key, None)):
            raise ConfigError(f"{where(key, user, model_set)}: {key}={getattr(gc, key)!r}: a decoder-only model has "
                              "no encoder, and generate() would apply it to the left-padded prompt, padding included; "
                              f"leave out --{key}")
    if gc.forced_bos_token_id is not None:
        # generate() forces it where the row is one token long: for a decoder-only model, only in
        # a batch whose padded prompts are one token wide.
        raise ConfigError(f"{where('forced_bos_token_id', user, model_set)}: forced_bos_token_id="
                          f"{gc.forced_bos_token_id!r}: a decoder-only model's generate() forces it only where the "
                          "padded prompt is one token long, so whether it applies would depend on the batch; end the "
                          "prompt with that token instead (--prompt_template)")


def stop_list(value: Any) -> list[str]:
    """stop_strings as a list: one string, a list of them, or none."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check_stop_strings(gc: Any, tokenizer: Any, user: dict[str, Any], model_set: Any) -> None:
    """Stop strings generate() would not run with, refused before any work: an empty list, an
    empty string (it would stop every text at once), and strings transformers' StopStringCriteria
    cannot be built for with this tokenizer (generate() raises then, at its first call). Built
    here from the tokenizer as generate() builds it; the engines build it again from its cache."""
    if gc.stop_strings is None:
        return
    listed = stop_list(gc.stop_strings)
    shown = where("stop_strings", user, model_set)
    if not listed:
        raise ConfigError(f"{shown}: an empty list: generate() builds its stop-string criterion from it and fails "
                          "(no string to stop at); expected at least one stop string, or no stop_strings at all")
    if "" in listed:
        raise ConfigError(f"{shown}: an empty stop string would stop every text at once; expected non-empty strings")
    from transformers.generation.stopping_criteria import StopStringCriteria

    try:
        StopStringCriteria(tokenizer=tokenizer, stop_strings=listed)
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"{shown}: {listed!r}: transformers' StopStringCriteria cannot be built for these with the "
                          f"model's tokenizer ({first_line(e)}); expected strings its vocabulary can spell") from e
