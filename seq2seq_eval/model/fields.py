"""Every field of transformers' GenerationConfig, whatever the engine: the values it accepts, the
values at which it does nothing, and a value at which it does something.

One table (`FIELDS`) serves every place a generation setting is judged: a --key value on the
command line or an evaluate() keyword (config.py, before any work), a value a model's own
generation config or task entry carries (model/generation.py, before any work), each engine's rule
(engines/rules.py, engines/ct2_rules.py: what the engine does at each kind of value) and the
tests, which walk every field at each kind of value (`KINDS`, `probe`). A value generate() would
silently ignore (`--no_repeat_ngram_size -1`, `--top_p 2` with sampling) is refused here, in one
line naming the option and what it accepts.

What generate() uses for a field left unset is not in this table: it is transformers' own
(`GenerationConfig._get_default_generation_params`), read where it is applied
(model/generation.py), so a later release's defaults are the ones recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("unset", "neutral", "zero", "negative", "scalar", "list")
"""The kinds of value every field is judged at: left unset, at a value where it does nothing,
0, a negative number, a single value, a list."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _id(v: Any) -> bool:
    return _int(v) and v >= 0


def _ids(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(_id(i) for i in v)


def _pairs(v: Any) -> bool:
    if isinstance(v, dict):  # generate()'s own form, as a model's config may carry it
        return all(_number(b) for b in v.values())
    return isinstance(v, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and _ids(p[0]) and len(p[0]) > 0 and _number(p[1]) for p in v)


def _strings(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v))


def _decay(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and _id(v[0]) and _number(v[1]) and v[1] >= 1


def _structured(v: Any) -> bool:
    """A JSON object, or the object transformers builds from one (CompileConfig, WatermarkingConfig)."""
    return isinstance(v, dict) or not isinstance(v, (bool, int, float, str, list, tuple))


def _dola(v: Any) -> bool:
    return v in ("low", "high") or (isinstance(v, (list, tuple)) and all(_id(i) for i in v))


@dataclass(frozen=True)
class Field:
    """What one generation setting accepts and where it does nothing."""

    valid: Callable[[Any], bool]
    """Whether a (non-None) value is one generate() takes and acts on as documented."""
    expected: str
    """The accepted values, as an error message says them ("an integer >= 0")."""
    neutral: tuple[Any, ...]
    """Values at which generate() does what it does with the field unset (besides generate()'s
    default, which is neutral too): a refused setting there is no reason to refuse a run."""
    probe: Any
    """A value at which the field does something (the tests' single value, or list for the
    list-valued fields)."""


def _f(valid: Callable[[Any], bool], expected: str, probe: Any, *neutral: Any) -> Field:
    return Field(valid, expected, tuple(neutral), probe)


_BOOL = (lambda v: isinstance(v, bool), "true or false")
_INT0 = (lambda v: _int(v) and v >= 0, "an integer >= 0")
_INT1 = (lambda v: _int(v) and v >= 1, "an integer >= 1")
_POSITIVE = (lambda v: _number(v) and v > 0, "a number > 0")
_NUMBER = (_number, "a number")
_FRACTION = (lambda v: _number(v) and 0 < v <= 1, "a number > 0 and <= 1")
_CUTOFF = (lambda v: _number(v) and 0 <= v < 1, "a number >= 0 and < 1")
_AT_LEAST_0 = (lambda v: _number(v) and v >= 0, "a number >= 0")
_AT_LEAST_1 = (lambda v: _number(v) and v >= 1, "a number >= 1")
_ID = (_id, "a token id")
_ID_OR_IDS = (lambda v: _id(v) or (_ids(v) and len(v) > 0), "a token id, or a JSON list of them such as [1, 2]")
_ID_LIST = (_ids, "a JSON list of token ids, such as [1308]")
_ID_LISTS = (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_ids(s) and len(s) > 0 for s in v),
             "a non-empty JSON list of token-id lists, such as [[1308]] or [[1308, 12], [7]]")
_BIAS = (lambda v: _pairs(v) and len(v) > 0,
         "a non-empty JSON list of [token-id list, bias] pairs, such as [[[1308], -10.0]]")
_TEXT = (lambda v: isinstance(v, str), "a string")
_TEXTS = (_strings, "a string or a JSON list of strings")
_OBJECT = (_structured, "a JSON object")
# transformers checks these as its own objects (CompileConfig, WatermarkingConfig): a JSON object
# from the command line, which generate() would fail on, is refused; evaluate() can pass one.
_CONFIG_OBJECT = (lambda v: _structured(v) and not isinstance(v, dict),
                  "a transformers config object (evaluate() only)")
_ANY_LIST = (lambda v: isinstance(v, (list, tuple)), "a JSON list")

FIELDS: dict[str, Field] = {
    "max_length": _f(*_INT1, 12),
    "max_new_tokens": _f(*_INT1, 8),
    "min_length": _f(*_INT0, 6, 0, 1),  # it counts the decoder start: 1 asks for nothing
    "min_new_tokens": _f(*_INT0, 5, 0),
    "early_stopping": _f(lambda v: isinstance(v, bool) or v == "never", "true, false or never", True),
    "max_time": _f(*_POSITIVE, 5.0),  # 0 is not "no limit": generate() stops at once
    "stop_strings": _f(*_TEXTS, ["."]),  # [] too starts the stop-string criterion, which needs the tokenizer
    "do_sample": _f(*_BOOL, True),
    "num_beams": _f(*_INT1, 4),
    "use_mtp": _f(*_BOOL, True, False),
    "use_cache": _f(*_BOOL, False),  # computes differently, generates the same
    "cache_implementation": _f(*_TEXT, "static"),
    "cache_config": _f(*_OBJECT, {"max_cache_len": 64}),
    "max_cache_len": _f(*_INT1, 64),
    "temperature": _f(*_POSITIVE, 0.7),
    "top_k": _f(*_INT0, 5),  # 0: no limit, which is not unset (generate()'s default is 50)
    "top_p": _f(*_FRACTION, 0.9),
    "min_p": _f(lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1", 0.1, 0.0),
    "top_h": _f(*_FRACTION, 0.5),
    "typical_p": _f(*_FRACTION, 0.5),
    "epsilon_cutoff": _f(*_CUTOFF, 0.001),
    "eta_cutoff": _f(*_CUTOFF, 0.001),
    "repetition_penalty": _f(*_POSITIVE, 1.3),
    "encoder_repetition_penalty": _f(*_POSITIVE, 1.3),
    "length_penalty": _f(*_NUMBER, 2.0),
    "no_repeat_ngram_size": _f(*_INT0, 2),
    "bad_words_ids": _f(*_ID_LISTS, [[5]]),
    "renormalize_logits": _f(*_BOOL, True, False),
    "forced_bos_token_id": _f(*_ID, 5),
    "forced_eos_token_id": _f(*_ID_OR_IDS, [5, 1]),
    "remove_invalid_values": _f(*_BOOL, True, False),
    "exponential_decay_length_penalty": _f(_decay, "a JSON list [start index, decay factor >= 1], such as [5, 1.5]",
                                           [5, 1.5]),
    "suppress_tokens": _f(*_ID_LIST, [5], []),
    "begin_suppress_tokens": _f(*_ID_LIST, [5], []),
    "sequence_bias": _f(*_BIAS, [[[5], -1.0]]),
    "token_healing": _f(*_BOOL, True, False),
    "guidance_scale": _f(*_AT_LEAST_1, 1.5, 1),  # generate() refuses a scale below 1
    "watermarking_config": _f(*_CONFIG_OBJECT, {"greenlist_ratio": 0.25}),
    "num_return_sequences": _f(*_INT1, 2),
    "output_attentions": _f(*_BOOL, True, False),
    "output_hidden_states": _f(*_BOOL, True, False),
    "output_scores": _f(*_BOOL, True, False),
    "output_logits": _f(*_BOOL, True, False),
    "return_dict_in_generate": _f(*_BOOL, True, False),
    "pad_token_id": _f(*_ID, 0),
    "bos_token_id": _f(*_ID, 1),
    "eos_token_id": _f(*_ID_OR_IDS, [1, 5]),
    "encoder_no_repeat_ngram_size": _f(*_INT0, 2),
    "decoder_start_token_id": _f(*_ID, 5),
    "is_assistant": _f(*_BOOL, True, False),
    "num_assistant_tokens": _f(*_INT1, 5),
    "num_assistant_tokens_schedule": _f(*_TEXT, "heuristic"),
    "assistant_confidence_threshold": _f(*_CUTOFF, 0.5),
    "prompt_lookup_num_tokens": _f(*_INT1, 3),
    "max_matching_ngram_size": _f(*_INT1, 2),
    "assistant_early_exit": _f(*_INT1, 2),
    "assistant_lookbehind": _f(*_INT1, 5),
    "target_lookbehind": _f(*_INT1, 5),
    "assistant_ensemble_weight": _f(*_CUTOFF, 0.5),
    "speculation_type": _f(*_TEXT, "draft"),
    "compile_config": _f(*_CONFIG_OBJECT, {"fullgraph": True}),
    "disable_compile": _f(*_BOOL, True, False),
    "continuous_batching_config": _f(*_OBJECT, {"block_size": 32}),
    "low_memory": _f(*_BOOL, True, False),
    "penalty_alpha": _f(*_AT_LEAST_0, 0.6, 0),
    "dola_layers": _f(_dola, "low, high or a JSON list of layer numbers", "low"),
    "diversity_penalty": _f(*_AT_LEAST_0, 0.5),
    "num_beam_groups": _f(*_INT1, 2),
    "constraints": _f(*_ANY_LIST, ["a constraint"]),  # [] too asks for constrained beam search
    "force_words_ids": _f(*_ID_LISTS, [[5]]),
    "prefill_chunk_size": _f(*_INT1, 16),
}


def generate_defaults() -> dict[str, Any]:
    """What generate() fills in for a field nobody set (transformers' own table)."""
    from transformers import GenerationConfig

    return dict(GenerationConfig._get_default_generation_params())


def value_error(key: str, value: Any) -> str | None:
    """"expected ..." when `value` is not one `key` accepts; None for a valid value or None
    (unset). A field this table does not know is left to the engines' rules."""
    field = FIELDS.get(key)
    if field is None or value is None or field.valid(value):
        return None
    return f"expected {field.expected}"


# generate()'s default max_length (20) is not max_length=20: unset, it means 20 tokens after the
# decoder's start (model/generation.py makes that explicit), set, 19.
_LENGTH_DEFAULT = ("max_length",)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind: True is not 1, 0 is 0.0."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def is_neutral(key: str, value: Any, defaults: dict[str, Any] | None = None) -> bool:
    """Whether generate() does with `value` what it does with the field unset: None, generate()'s
    default, or one of the field's neutral values."""
    if value is None:
        return True
    defaults = generate_defaults() if defaults is None else defaults
    field = FIELDS.get(key)
    default = defaults.get(key) if key not in _LENGTH_DEFAULT else None
    neutral = (field.neutral if field else ()) + ((default,) if default is not None else ())
    return any(_same(value, n) for n in neutral)


def is_list_valued(key: str) -> bool:
    """Whether the field's value is a list (its probe is one)."""
    return isinstance(FIELDS[key].probe, list)


def probe(key: str, kind: str, defaults: dict[str, Any] | None = None) -> tuple[bool, Any]:
    """The value of `kind` the tests try `key` at: (False, None) where the field has no such
    value (no neutral value besides unset). A list-valued field's scalar is its first element, a
    scalar field's list is [its probe]."""
    field = FIELDS[key]
    defaults = generate_defaults() if defaults is None else defaults
    listed = is_list_valued(key)
    if kind == "unset":
        return True, None
    if kind == "neutral":
        default = defaults.get(key) if key not in _LENGTH_DEFAULT else None
        found = [n for n in (default, *field.neutral) if n is not None]
        return (True, found[0]) if found else (False, None)
    if kind == "zero":
        return True, [0] if listed else 0
    if kind == "negative":
        return True, [-1] if listed else -1
    if kind == "scalar":
        return True, _first(field.probe) if listed else field.probe
    return True, field.probe if listed else [field.probe]


def _first(value: list) -> Any:
    return value[0] if value else None
