"""The CTranslate2 engine's rule for every generation setting (see engines/rules.py): how
`ct2.translate_options` maps each honoured one to `translate_batch` (an encoder-decoder model's
Translator, CT2_RULES) or `generate_batch` (a decoder-only model's Generator,
CT2_GENERATOR_RULES: the Translator's rule except the fields GENERATOR names), or why one is
refused.

Honoured means generate()'s texts: every honoured setting and combination is compared with
generate() on the embedded model by tests/test_engine_settings.py's matrix. Where CTranslate2
decides otherwise, the combination is refused (`refuse_if`), not approximated:

- in beam search, generate() masks tokens (a minimum length, a repeated n-gram, suppressed words)
  in log-probabilities it does not normalize again unless renormalize_logits is set; CTranslate2
  masks before normalizing, which is what generate() does with renormalize_logits=True;
- its beam search stops once num_beams hypotheses are finished: early_stopping=True;
- it penalises repeated tokens in the logits, generate()'s beam search in log-probabilities;
- it cannot stop a hypothesis inside beam search at a stop string. With one beam (greedy search,
  sampling) a continuation does not depend on the tokens after it, so the continuation generated
  in full and cut at the first token generate()'s stop-string criterion stops on is the one
  generate() stops there (engines/stops.py).
"""

from __future__ import annotations

from typing import Any

from .rules import Rule, honoured, refused

_NO_EFFECT = "changes how generate() computes, not what it generates; CTranslate2 computes its own way"
_NONE = "CTranslate2 has no counterpart"
_OUTPUT = ("the run writes texts (and with --num_return_sequences > 1, their scores); it returns none "
           "of generate()'s other outputs")
_ASSISTED = "assisted decoding: CTranslate2 has none"
_MASKED = "; with beam search only with renormalize_logits=True"


def _beams(gc: Any) -> int:
    return int(gc.num_beams or 1)


def _masked_in_beam_search(key: str, active: Any) -> Any:
    """A setting that masks tokens: in beam search, generate() leaves the log-probabilities
    unnormalized after masking unless renormalize_logits is set; CTranslate2 always normalizes."""

    def refuse(gc: Any, model_config: Any) -> str | None:
        value = getattr(gc, key)
        if _beams(gc) > 1 and active(value) and not gc.renormalize_logits:
            return (f"{key}={value!r} with num_beams={gc.num_beams} and renormalize_logits={bool(gc.renormalize_logits)} "
                    "(generate()'s beam search leaves the log-probabilities unnormalized after masking, CTranslate2 "
                    "normalizes them; with --renormalize_logits true generate() does the same)")
        return None

    return refuse


def _early_stopping(gc: Any, model_config: Any) -> str | None:
    if _beams(gc) > 1 and gc.early_stopping is not True:
        return (f"early_stopping={gc.early_stopping!r} with num_beams={gc.num_beams} (generate()'s beam search then "
                "goes on while a longer hypothesis could still score better; CTranslate2's stops once num_beams "
                "hypotheses are finished, which is early_stopping=True)")
    return None


def _repetition(gc: Any, model_config: Any) -> str | None:
    if _beams(gc) > 1 and gc.repetition_penalty not in (None, 1, 1.0):
        return (f"repetition_penalty={gc.repetition_penalty!r} with num_beams={gc.num_beams} (CTranslate2 penalises "
                "the logits, generate()'s beam search the log-probabilities)")
    return None


def _sample_one_beam(gc: Any, model_config: Any) -> str | None:
    return (f"do_sample=True with num_beams={gc.num_beams} (CTranslate2 samples with one beam)"
            if gc.do_sample and _beams(gc) > 1 else None)


def _one_forced_end(gc: Any, model_config: Any) -> str | None:
    value = gc.forced_eos_token_id
    if isinstance(value, list) and len(value) > 1:
        return (f"forced_eos_token_id={value!r} (generate() forces one of them by its score at the length limit; "
                "CTranslate2 can end a cut hypothesis with one given token)")
    if (value is not None and _beams(gc) > 1 and not gc.do_sample and (gc.num_return_sequences or 1) > 1
            and gc.length_penalty not in (0, 0.0)):
        return (f"forced_eos_token_id={value!r} with num_beams={gc.num_beams}, num_return_sequences="
                f"{gc.num_return_sequences} and length_penalty={gc.length_penalty!r} (generate() ranks the beams it "
                "ends at the length limit among more hypotheses than CTranslate2 returns)")
    return None


def _stops_one_beam(gc: Any, model_config: Any) -> str | None:
    if gc.stop_strings and _beams(gc) > 1:
        return (f"stop_strings={gc.stop_strings!r} with num_beams={gc.num_beams} (generate()'s beam search finishes a "
                "hypothesis at its stop string and goes on with the others; CTranslate2's cannot stop a hypothesis "
                "there, so its beams would differ)")
    return None


def _first_not_an_end(gc: Any, model_config: Any) -> str | None:
    ends = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
    if gc.forced_bos_token_id is not None and gc.forced_bos_token_id in ends:
        return (f"forced_bos_token_id={gc.forced_bos_token_id!r}, an end token (generate() then ends every text at "
                "once; CTranslate2 decodes on after a first token it is given)")
    return None


def _no_end(gc: Any, model_config: Any) -> str | None:
    return ("eos_token_id=None (generate() then stops only at the length limit; CTranslate2 stops at the converted "
            "model's end token)" if gc.eos_token_id is None else None)


def _own_start(gc: Any, model_config: Any) -> str | None:
    """CTranslate2 starts the decoder from the converted model's decoder_start_token, which the
    conversion takes from the model's config: another start token cannot be asked for."""
    own = getattr(model_config, "decoder_start_token_id", None)
    if own is None or gc.decoder_start_token_id == own:
        return None
    return (f"decoder_start_token_id={gc.decoder_start_token_id!r} (CTranslate2 starts the decoder from the converted "
            f"model's own start token, id {own})")


CT2_RULES: dict[str, Rule] = {
    "num_beams": honoured("`beam_size`"),
    "length_penalty": honoured("`length_penalty`"),
    "max_new_tokens": honoured("`max_decoding_length`"),
    "max_length": honoured("`max_decoding_length` = `max_length` - 1 (transformers counts the decoder start); unset: "
                           "generate()'s 20 new tokens, not CTranslate2's 256"),
    "min_new_tokens": honoured("`min_decoding_length`" + _MASKED, _masked_in_beam_search("min_new_tokens", bool)),
    "min_length": honoured("`min_decoding_length` = `min_length` - 1 (unset: 0, not CTranslate2's 1)" + _MASKED,
                           _masked_in_beam_search("min_length", lambda v: (v or 0) > 1)),
    "forced_eos_token_id": honoured("a hypothesis cut by the length limit ends with it, ranked as generate() ranks "
                                    "it; a list of more than one id refused, and with beam search several candidates "
                                    "(--num_return_sequences) unless length_penalty is 0", _one_forced_end),
    "forced_bos_token_id": honoured("`target_prefix` (the first generated token); an end token refused",
                                    _first_not_an_end),
    "no_repeat_ngram_size": honoured("`no_repeat_ngram_size`" + _MASKED,
                                     _masked_in_beam_search("no_repeat_ngram_size", bool)),
    "repetition_penalty": honoured("`repetition_penalty`; with beam search refused (CTranslate2 penalises logits, "
                                   "generate()'s beam search log-probabilities)", _repetition),
    "renormalize_logits": honoured("CTranslate2 normalizes the scores after masking tokens, which is what it asks of "
                                   "generate()"),
    "num_return_sequences": honoured("`num_hypotheses`, with `return_scores`"),
    "do_sample": honoured("sampling (`sampling_topk` etc.) with CTranslate2's own random draws; refused with more "
                          "than one beam", _sample_one_beam, draws=True),
    "top_k": honoured("`sampling_topk` (unset: generate()'s 50; 0: no limit, in both)", draws=True),
    "top_p": honoured("`sampling_topp`", draws=True),
    "temperature": honoured("`sampling_temperature`", draws=True),
    "eos_token_id": honoured("`end_token` (one or several); unset refused", _no_end),
    "bad_words_ids": honoured("`suppress_sequences`" + _MASKED, _masked_in_beam_search("bad_words_ids", bool)),
    "suppress_tokens": honoured("`suppress_sequences` (one token each)" + _MASKED,
                                _masked_in_beam_search("suppress_tokens", bool)),
    "early_stopping": honoured("CTranslate2 stops once num_beams hypotheses are finished: `True`; with beam search "
                               "`False` (generate()'s default) and `'never'` refused", _early_stopping),
    "decoder_start_token_id": honoured("the converted model's own start token; another value refused", _own_start),
    "pad_token_id": honoured("CTranslate2 pads batches itself; no effect on the texts"),
    "stop_strings": honoured("with one beam (greedy search, sampling): the continuation generated to the end token "
                             "or the length limit, cut at the first token generate()'s stop-string criterion stops "
                             "on, which is where generate() stops it, and its text before the first stop string it "
                             "shows; "
                             "with beam search refused", _stops_one_beam),
    "bos_token_id": honoured("not used by an encoder-decoder's generation (the decoder starts from "
                             "decoder_start_token_id), by either engine"),
    **{key: honoured(_NO_EFFECT) for key in (
        "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile",
        "continuous_batching_config", "prefill_chunk_size", "low_memory")},
    **{key: refused(_NONE) for key in (
        "max_time", "min_p", "top_h", "epsilon_cutoff", "eta_cutoff", "encoder_no_repeat_ngram_size",
        "remove_invalid_values", "exponential_decay_length_penalty", "begin_suppress_tokens", "sequence_bias",
        "token_healing", "watermarking_config", "penalty_alpha", "dola_layers", "diversity_penalty", "constraints",
        "force_words_ids", "encoder_repetition_penalty", "guidance_scale", "num_beam_groups", "typical_p")},
    **{key: refused(_OUTPUT) for key in (
        "output_attentions", "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate")},
    **{key: refused(_ASSISTED) for key in (
        "is_assistant", "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
        "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit", "assistant_lookbehind",
        "target_lookbehind", "assistant_ensemble_weight", "use_mtp", "speculation_type")},
}


# ---------------------------------------------------------------- the Generator (decoder-only models)
#
# `generate_batch` with include_prompt_in_result=False runs a batch's prompts through the decoder
# up to the shortest one's length at once, and the longer ones' remaining prompt tokens inside its
# decoding loop, as a forced prefix. The engine (engines/ct2_generator.py) calls it on prompts of
# one length at a time where that prefix would change the search. What sees the tokens of the
# loop only (penalties, banned n-grams) would see a part of the prompt that depends on the batch,
# where a decoder-only model's generate() sees the whole row, prompt included: refused.

_WHOLE_ROW = ("a decoder-only model's generate() applies it to the whole row, the prompt included; CTranslate2's "
              "Generator only to the tokens of its decoding loop, which hold a part of the prompt that depends on "
              "the batch")


def _single_token_bans(gc: Any, model_config: Any) -> str | None:
    longer = [list(seq) for seq in (gc.bad_words_ids or []) if len(seq) > 1]
    if longer:
        return (f"bad_words_ids={gc.bad_words_ids!r}: {longer[0]} is a sequence of {len(longer[0])} tokens (a "
                "decoder-only model's generate() matches its start against the prompt's end too; CTranslate2's "
                "Generator only against the tokens of its decoding loop)")
    return _masked_in_beam_search("bad_words_ids", bool)(gc, model_config)


GENERATOR: dict[str, Rule] = {
    "max_new_tokens": honoured("`max_length` with `include_prompt_in_result=False`: new tokens only"),
    "max_length": honoured("a decoder-only model's max_length counts the prompt: without max_new_tokens (which "
                           "takes precedence) a run is refused for every engine"),
    "min_new_tokens": honoured("`min_length` (new tokens only)" + _MASKED,
                               _masked_in_beam_search("min_new_tokens", bool)),
    "min_length": honoured("above 1 it counts the prompt: refused for every engine; use min_new_tokens"),
    "num_beams": honoured("`beam_size`; a beam search runs on prompts of one length at a time (with a longer prompt's "
                          "tail as a forced prefix, CTranslate2 keeps an end token out of all but the first beam "
                          "at the first free step, where generate() does not)"),
    "repetition_penalty": refused(_WHOLE_ROW),
    "no_repeat_ngram_size": refused(_WHOLE_ROW),
    "bad_words_ids": honoured("`suppress_sequences`, single tokens only" + _MASKED, _single_token_bans),
    "forced_bos_token_id": refused("a decoder-only model's generate() forces it only where the padded prompt is one "
                                   "token long: refused for every engine"),
    "decoder_start_token_id": honoured("not used by a decoder-only model's generation, by either engine"),
    "bos_token_id": honoured("not used in generation: the prompt's ids carry the BOS token, if any "
                             "([prompts](causal.md#prompts))"),
}
"""The Generator's rule where it differs from the Translator's (docs/engines.md shows these rows)."""

CT2_GENERATOR_RULES: dict[str, Rule] = {**CT2_RULES, **GENERATOR}
