"""Every generation setting, every engine: honoured or refused, by one table per engine.

A table maps each field of transformers' `GenerationConfig` (what a user can pass as --key value,
or a model's generation config can carry) to a `Rule`: honoured (what the engine does with it) or
refused (why it cannot). What a field accepts and where it does nothing is the same for every
engine (model/fields.py); so a cell of the matrix, a field at one kind of value (unset, neutral,
zero, negative, one value, a list: `outcome`), is decided by those two tables alone. `refusals`
reads a run's effective settings (generate()'s defaults made explicit) against a table before any
work; a field the table does not know (a later transformers release) is refused away from its
neutral values, so nothing is dropped silently. docs/engines.md's settings tables are
`markdown_table` of these tables (a test keeps the two equal). This module holds the HF engine's
table; engines/ct2_rules.py CTranslate2's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..model.fields import FIELDS, KINDS, generate_defaults, is_neutral, probe, value_error

# Saved with every generation config; they describe the file, not the generation.
METADATA = ("transformers_version", "_from_model_config")


@dataclass(frozen=True)
class Rule:
    honoured: bool
    how: str
    """Honoured: what the engine does with the setting. Refused: why it cannot honour it."""
    refuse_if: Callable[[Any, Any], str | None] | None = None
    """For an honoured setting: the values or combinations it cannot run, as `f(gc, model_config)`
    giving the refusal's text, else None."""
    draws: bool = False
    """Honoured with the engine's own random draws: the distribution generate() samples from, other
    samples (equal texts only where the distribution leaves one choice)."""


def honoured(how: str, refuse_if: Callable[[Any, Any], str | None] | None = None, draws: bool = False) -> Rule:
    return Rule(True, how, refuse_if, draws)


def refused(why: str) -> Rule:
    return Rule(False, why)


def refusals(rules: Mapping[str, Rule], gc: Any, model_config: Any) -> list[tuple[str, str, str]]:
    """(setting, its value as text, why) for each setting of `gc` that `rules` refuses at its
    value: a refused setting away from its neutral values, a value or combination an honoured one
    excludes (its text then says why), a field the table does not know away from its neutral
    values."""
    from transformers import __version__

    defaults = generate_defaults()
    bad = []
    for key, value in sorted(gc.to_dict().items()):
        if key in METADATA or key.startswith("_"):
            continue
        rule = rules.get(key)
        if rule is None:
            if not is_neutral(key, value, defaults):
                bad.append((key, f"{key}={value!r}", f"a setting of transformers {__version__} with no rule here"))
        elif not rule.honoured:
            if not is_neutral(key, value, defaults):
                bad.append((key, f"{key}={value!r}", rule.how))
        elif rule.refuse_if is not None:  # unset too: generate() does something with it (eos_token_id)
            text = rule.refuse_if(gc, model_config)
            if text:
                bad.append((key, text, ""))
    return bad


def origin(key: str, value: Any, user: Mapping[str, Any]) -> str:
    """Where a setting's value came from, naming its option."""
    if key in user:
        return f"set by --{key}"
    default = generate_defaults().get(key)
    if default is not None and value == default:
        return f"generate()'s default, which the model keeps; set another with --{key}"
    return f"from the model's generation config or task settings; override it with --{key}, or unset it with --{key} none"


def check(engine: str, rules: Mapping[str, Rule], user: Mapping[str, Any], gc: Any, model_config: Any,
          advice: Callable[[str], str]) -> None:
    """Refuse, before any work, a run whose settings `engine` cannot honour, naming the first and
    where it came from: the user's flag, the model's own settings (which a flag overrides), or
    generate()'s default."""
    bad = refusals(rules, gc, model_config)
    if not bad:
        return
    key, text, why = bad[0]
    more = f" (and {len(bad) - 1} more: {', '.join(t for _, t, _ in bad[1:])})" if len(bad) > 1 else ""
    raise ConfigError(f"--engine {engine} cannot honour the generation setting {text} "
                      f"({origin(key, getattr(gc, key, None), user)}){': ' + why if why else ''}{more}; {advice(key)}")


def outcome(rules: Mapping[str, Rule], key: str, kind: str) -> str:
    """What the engine does with `key` at a value of `kind` (model/fields.py's probe), on its own
    (combinations are its rule's text): "—" (the field has no such value), "invalid" (refused for
    every engine: not a value the field accepts), "default" (unset: generate()'s own), "no effect",
    "honoured", "own draws" or "refused"."""
    exists, value = probe(key, kind)
    rule = rules.get(key)
    if not exists:
        return "—"
    if value_error(key, value):
        return "invalid"
    if kind == "unset":
        return "default"
    if is_neutral(key, value):
        return "no effect"
    if rule is None or not rule.honoured:
        return "refused"
    return "own draws" if rule.draws else "honoured"


def unset_text(key: str) -> str:
    """What generate() does with the field unset, for the docs."""
    special = {"max_length": "20 tokens after the decoder's start", "pad_token_id": "the first `eos_token_id`",
               "decoder_start_token_id": "`bos_token_id`",
               "min_length": "0 (with `min_new_tokens` unset)"}
    if key in special:
        return special[key]
    default = generate_defaults().get(key)
    return "nothing" if default is None else f"`{default!r}`".replace("'", "")


def markdown_table(rules: Mapping[str, Rule]) -> str:
    """The docs' table of one engine's rule: each setting, what it accepts, what generate() does
    with it unset, the engine's outcome at each kind of value, and how or why not."""
    labels = {"unset": "unset", "neutral": "neutral", "zero": "0", "negative": "< 0", "scalar": "a value",
              "list": "a list"}
    rows = [f"| setting | accepts | unset, generate() uses | {' | '.join(labels[k] for k in KINDS[1:])} | "
            "how, or why not |", "|---" * (4 + len(KINDS[1:])) + "|"]
    for key in sorted(rules):
        rule = rules[key]
        cells = [outcome(rules, key, kind) for kind in KINDS[1:]]
        cells = [f"**{c}**" if c in ("refused", "invalid") else c for c in cells]
        accepts = FIELDS[key].expected if key in FIELDS else "—"
        rows.append(f"| `{key}` | {accepts} | {unset_text(key)} | {' | '.join(cells)} | "
                    f"{'honoured' if rule.honoured else '**refused**'}: {rule.how} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- the HF engine

_PASSED = "passed to `generate()`"
_OUTPUT = ("the run writes texts (and with --num_return_sequences > 1, their scores); it returns none "
           "of generate()'s other outputs")
_HUB_ONLY = ("transformers 5 runs {} only as hub code (`{}`) with trust_remote_code, which the run does not "
             "pass")
_ASSISTED = "a setting of assisted decoding, which the run does not use (it generates batches, with no assistant model)"
_BATCH_OF_ONE = "assisted decoding, which generate() runs for batches of one example only"


def _hf_low_memory(gc: Any, model_config: Any) -> str | None:
    return ("low_memory=True (generate() no longer supports it in beam search)"
            if gc.low_memory and (gc.num_beams or 1) > 1 else None)


HF_RULES: dict[str, Rule] = {
    **{key: honoured(_PASSED) for key in (
        "max_length", "max_new_tokens", "min_length", "min_new_tokens", "early_stopping", "max_time", "do_sample",
        "num_beams", "use_cache", "cache_implementation", "cache_config", "max_cache_len", "temperature", "top_k",
        "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
        "encoder_repetition_penalty", "length_penalty", "no_repeat_ngram_size", "bad_words_ids",
        "renormalize_logits", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
        "watermarking_config", "num_return_sequences", "pad_token_id", "bos_token_id",
        "eos_token_id", "encoder_no_repeat_ngram_size", "decoder_start_token_id", "compile_config",
        "disable_compile", "continuous_batching_config", "prefill_chunk_size")},
    "low_memory": honoured(_PASSED + "; refused with beam search", _hf_low_memory),
    **{key: refused(_OUTPUT) for key in (
        "output_attentions", "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate")},
    "stop_strings": honoured("each hypothesis stops where generate()'s own stop-string criterion stops it (greedy, "
                             "sampling and inside beam search), the left padding kept out of it, and its prediction "
                             "is cut before the first stop string it shows ([causal models](causal.md#stop-strings))"),
    "guidance_scale": refused("classifier-free guidance needs an unconditional copy of each batch, which "
                              "generate() does not make for an encoder-decoder model (it fails in the first batch); a "
                              "decoder-only model's unconditional pass is not checked against batching"),
    "token_healing": refused("generate() needs the tokenizer for it, which the run does not pass"),
    "num_beam_groups": refused(_HUB_ONLY.format("group beam search", "transformers-community/group-beam-search")),
    "diversity_penalty": refused(_HUB_ONLY.format("group beam search", "transformers-community/group-beam-search")),
    "constraints": refused(_HUB_ONLY.format("constrained beam search", "transformers-community/constrained-beam-search")),
    "force_words_ids": refused(_HUB_ONLY.format("constrained beam search",
                                                "transformers-community/constrained-beam-search")),
    "penalty_alpha": refused(_HUB_ONLY.format("contrastive search", "transformers-community/contrastive-search")),
    "dola_layers": refused(_HUB_ONLY.format("DoLa decoding", "transformers-community/dola")),
    "prompt_lookup_num_tokens": refused(_BATCH_OF_ONE),
    "assistant_early_exit": refused(_BATCH_OF_ONE),
    "use_mtp": refused(_BATCH_OF_ONE),
    **{key: refused(_ASSISTED) for key in (
        "is_assistant", "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
        "max_matching_ngram_size", "assistant_lookbehind", "target_lookbehind", "assistant_ensemble_weight",
        "speculation_type")},
}
