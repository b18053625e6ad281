"""The CTranslate2 engine's rule for every generation setting (see engines/rules.py): how
`ct2.translate_options` maps each honoured one to `translate_batch`, or why one is refused."""

from __future__ import annotations

from typing import Any

from .rules import NEUTRAL_ONE, Rule, honoured, refused

_NO_EFFECT = "changes how generate() computes, not what it generates; CTranslate2 computes its own way"
_NONE = "CTranslate2 has no counterpart"
_OUTPUT = ("the run writes texts (and with --num_return_sequences > 1, their scores); it returns none "
           "of generate()'s other outputs")
_ASSISTED = "assisted decoding: CTranslate2 has none"


def _never(gc: Any, model_config: Any) -> str | None:
    return ("early_stopping='never' (CTranslate2's beam search stops once num_beams hypotheses are finished)"
            if gc.early_stopping == "never" else None)


def _sample_one_beam(gc: Any, model_config: Any) -> str | None:
    return (f"do_sample=True with num_beams={gc.num_beams} (CTranslate2 samples with one beam)"
            if gc.do_sample and (gc.num_beams or 1) > 1 else None)


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
    "max_length": honoured("`max_decoding_length` = `max_length` - 1 (transformers counts the decoder start)"),
    "min_new_tokens": honoured("`min_decoding_length`"),
    "min_length": honoured("`min_decoding_length` = `min_length` - 1"),
    "forced_eos_token_id": honoured("a hypothesis cut by the length limit ends with it, as generate() forces it"),
    "forced_bos_token_id": honoured("`target_prefix` (the first generated token)"),
    "no_repeat_ngram_size": honoured("`no_repeat_ngram_size`"),
    "repetition_penalty": honoured("`repetition_penalty` (CTranslate2 penalises logits, generate()'s beam search "
                                   "log-probabilities)"),
    "num_return_sequences": honoured("`num_hypotheses`, with `return_scores`"),
    "do_sample": honoured("sampling (`sampling_topk` etc.); refused with more than one beam", _sample_one_beam),
    "top_k": honoured("`sampling_topk` (0: no limit, in both)"),
    "top_p": honoured("`sampling_topp`"),
    "temperature": honoured("`sampling_temperature`"),
    "eos_token_id": honoured("`end_token` (one or several)"),
    "bad_words_ids": honoured("`suppress_sequences`"),
    "suppress_tokens": honoured("`suppress_sequences` (one token each)"),
    "early_stopping": honoured("CTranslate2 stops once num_beams hypotheses are finished: `True` exactly, `False` "
                               "where it decides the same; `'never'` refused", _never),
    "decoder_start_token_id": honoured("the converted model's own start token; another value refused", _own_start),
    "pad_token_id": honoured("CTranslate2 pads batches itself; no effect on the texts"),
    "bos_token_id": honoured("not used by an encoder-decoder's generation (the decoder starts from "
                             "decoder_start_token_id), by either engine"),
    **{key: honoured(_NO_EFFECT) for key in (
        "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile",
        "continuous_batching_config", "prefill_chunk_size", "low_memory")},
    **{key: refused(_NONE) for key in (
        "max_time", "stop_strings", "min_p", "top_h", "epsilon_cutoff", "eta_cutoff",
        "encoder_no_repeat_ngram_size", "renormalize_logits", "remove_invalid_values",
        "exponential_decay_length_penalty", "begin_suppress_tokens", "sequence_bias", "token_healing",
        "watermarking_config", "penalty_alpha", "dola_layers", "diversity_penalty", "constraints",
        "force_words_ids")},
    **{key: refused(_NONE, NEUTRAL_ONE) for key in ("encoder_repetition_penalty", "guidance_scale", "num_beam_groups", "typical_p")},
    **{key: refused(_OUTPUT) for key in (
        "output_attentions", "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate")},
    **{key: refused(_ASSISTED) for key in (
        "is_assistant", "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
        "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit", "assistant_lookbehind",
        "target_lookbehind", "assistant_ensemble_weight", "use_mtp", "speculation_type")},
}
