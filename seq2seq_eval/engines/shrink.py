"""Beam search that stops computing examples whose result is final.

generate()'s beam search runs every example of a batch until the last one is done: an example
whose best hypotheses are all finished (and cannot be beaten) keeps its rows in every matrix
product to the end, with its result frozen. On the embedded set about a tenth of all decoder rows
are such rows (the benchmarks' "gen pad" column).

`shrinking_beam_search` is handed to `model.generate()` as its decoding method
(`custom_generate`): generate() still prepares everything (encoder pass, logits processors,
stopping criteria, the cache), and each step calls generate()'s own beam-search steps, in its
order, on the same tensors. Two things differ. Once an example's result can no longer change, it
is stored and its rows leave the batch; the cache reorder that generate() makes at every step
selects only the surviving rows, so leaving costs no extra copy of the self-attention cache. And
hypotheses are held WIDEN tokens longer than needed instead of at max_length, so each step's
gathers copy less.

Why the results stay generate()'s: an example leaves only when all its `num_beams` finished
slots hold real scores and no candidate can enter them any more (early stopping, or the
early-stop heuristic already satisfied); generate() then adds -1e9 to every later candidate of
that example, so its finished beams never change. The other rows see the same arithmetic with
fewer rows beside them; matrix products on CPU give the same bits per row for any number of
rows above a small-row kernel threshold (8 rows here), so the batch never shrinks below
`MIN_ROWS`, and `rows_independent` checks this on the model's own layers first. On GPUs the kernels chosen depend on the row count, and half-precision kernels were
not checked: it is used on CPU in float32 only.
tests/test_shrink.py holds sequences and scores bit for bit against generate().

Anything outside that reasoning (sampling, a logits processor that keeps per-example state,
outputs of attentions/hidden states/logits, synced GPUs, generate()'s own cache, a transformers
whose steps are missing or require other arguments) keeps generate()'s own loop: `usable()` says so before the call. What comes
back is what the engine reads: the sequences and their scores, not the per-step scores.
"""

from __future__ import annotations

from typing import Any

MIN_ROWS = 32  # decoder rows (examples x beams) under which the batch is not shrunk further
WIDEN = 32  # hypothesis tokens added at a time
CHECK_ROWS = 256  # rows of the row-count check (64 examples at 4 beams)

# Processors that look at each row alone (its own tokens, its own scores): removing other rows
# cannot change what they do to a row.
_ROW_WISE_PROCESSORS = frozenset({
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "RepetitionPenaltyLogitsProcessor", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor", "NoBadWordsLogitsProcessor",
    "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty",
})
# Steps used besides those of _STEP_ARGUMENTS (below): long-standing, only their presence is checked.
_OTHER_STEPS = ("_update_model_kwargs_for_generation", "prepare_inputs_for_generation", "_flatten_beam_dim",
                "_unflatten_beam_dim")


def usable(model: Any, gc: Any, device: Any) -> bool:
    """Whether a generate() call with generation config `gc` may use `shrinking_beam_search`
    (the beam cache must be in use too: the caller checks that)."""
    import torch

    # The row-count argument was checked for float32 CPU kernels only (bf16/fp16 use others).
    if getattr(device, "type", str(device)) != "cpu" or getattr(model, "dtype", None) != torch.float32:
        return False
    if int(gc.num_beams or 1) <= 1 or gc.do_sample or int(getattr(gc, "num_beam_groups", 1) or 1) > 1:
        return False
    if gc.constraints or gc.force_words_ids or getattr(gc, "low_memory", False):
        return False
    if any(getattr(gc, name, False) for name in ("output_attentions", "output_hidden_states", "output_logits")):
        return False
    if gc.early_stopping == "never":  # the heuristic then looks at max_length; None means False
        return False
    if (gc.encoder_no_repeat_ngram_size or gc.encoder_repetition_penalty not in (None, 1.0)
            or gc.sequence_bias or gc.prefill_chunk_size is not None):
        return False
    if not _steps_take_our_arguments(model) or not _takes_decoding_method(model):
        return False
    return rows_independent(model)


# The keyword arguments shrinking_beam_search passes to generate()'s beam-search steps, and the
# ones a transformers version may also require (5.17's _get_top_k_continuations takes vocab_size;
# 5.24's does not).
_STEP_ARGUMENTS = {
    "_prefill": {"input_ids", "generation_config", "model_kwargs", "is_first_iteration"},
    "_get_top_k_continuations": {"accumulated_log_probs", "running_sequences", "running_beam_indices", "cur_len",
                                 "decoder_prompt_len", "do_sample", "beams_to_keep", "num_beams", "batch_size",
                                 "vocab_size"},
    "_get_running_beams_for_next_iteration": {"topk_log_probs", "topk_running_sequences", "topk_running_beam_indices",
                                              "next_token_hits_stopping_criteria", "num_beams"},
    "_update_finished_beams": {"sequences", "topk_running_sequences", "beam_scores", "topk_log_probs", "beam_indices",
                               "topk_running_beam_indices", "is_early_stop_heuristic_unsatisfied", "is_sent_finished",
                               "next_token_hits_stopping_criteria", "top_num_beam_mask", "num_beams", "cur_len",
                               "decoder_prompt_len", "length_penalty", "early_stopping"},
    "_check_early_stop_heuristic": {"is_early_stop_heuristic_unsatisfied", "running_beam_scores", "beam_scores",
                                    "is_sent_finished", "cur_len", "max_length", "decoder_prompt_len", "early_stopping",
                                    "length_penalty"},
    "_beam_search_has_unfinished_sequences": {"is_early_stop_heuristic_unsatisfied", "is_sent_finished",
                                              "next_token_hits_stopping_criteria", "early_stopping"},
}


def _parameters(fn: Any) -> list[Any] | None:
    """`fn`'s parameters (None: no signature to read)."""
    import inspect

    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _required(fn: Any) -> set[str] | None:
    """The parameters `fn` cannot do without (None: no signature to read)."""
    import inspect

    params = _parameters(fn)
    if params is None:
        return None
    return {p.name for p in params if p.default is inspect.Parameter.empty and p.name != "self"
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}


def _steps_take_our_arguments(model: Any) -> bool:
    """generate()'s beam-search steps are private and change between transformers releases: use
    them only where each step exists and requires nothing this module does not pass; anywhere
    else generate() keeps its own loop."""
    if not all(hasattr(model, step) for step in (*_STEP_ARGUMENTS, *_OTHER_STEPS)):
        return False
    for step, ours in _STEP_ARGUMENTS.items():
        required = _required(getattr(type(model), step))
        if required is None or not required <= ours:
            return False
    return True


def _takes_vocab_size(model: Any) -> bool:
    return "vocab_size" in (_required(type(model)._get_top_k_continuations) or set())


def _takes_decoding_method(model: Any) -> bool:
    return any(p.name == "custom_generate" for p in _parameters(model.generate) or ())


def rows_independent(model: Any) -> bool:
    """Whether this machine's kernels give each row of the model's linear layers the same bits at
    every row count the shrinking search can use (MIN_ROWS and up): checked once per model, on its
    own layers (one of each weight shape, with or without bias) and random inputs, in the thread
    setting generation runs with. A CPU whose kernels do not is left with generate()'s own loop."""
    import torch

    seen: set[tuple[Any, ...]] = set()
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            key = (tuple(module.weight.shape), module.bias is not None)
            if key in seen:
                continue
            seen.add(key)
            x = torch.randn(CHECK_ROWS, module.in_features, generator=g, dtype=module.weight.dtype)
            full = module(x)
            for m in (MIN_ROWS, MIN_ROWS + 1, 2 * MIN_ROWS - 1, 3 * MIN_ROWS + 5, CHECK_ROWS // 2 + 1, CHECK_ROWS - 1):
                if not torch.equal(module(x[:m]), full[:m]):
                    return False
    return True


def _row_wise(logits_processor: Any) -> bool:
    return all(type(p).__name__ in _ROW_WISE_PROCESSORS for p in logits_processor)


def shrinking_beam_search(model: Any, input_ids: Any, logits_processor: Any, stopping_criteria: Any,
                          generation_config: Any, synced_gpus: bool = False, **model_kwargs: Any) -> Any:
    """generate()'s beam search for encoder-decoder models, with final examples leaving the batch."""
    import torch
    from transformers.generation.utils import GenerateBeamEncoderDecoderOutput

    cache_key = next((k for k in ("cache", "past_key_values") if model_kwargs.get(k) is not None), None)
    if synced_gpus or cache_key is None or not _row_wise(logits_processor):
        return type(model)._beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                        synced_gpus=synced_gpus, **model_kwargs)
    gc = generation_config
    pad_token_id, eos_token_id = gc._pad_token_tensor, gc._eos_token_tensor
    early_stopping, length_penalty, max_length = gc.early_stopping, gc.length_penalty, gc.max_length
    num_beams, n_return = gc.num_beams, gc.num_return_sequences
    device = input_ids.device

    batch_size, cur_len = input_ids.shape[0] // num_beams, input_ids.shape[1]
    decoder_prompt_len = cur_len
    n_eos = eos_token_id.shape[0] if eos_token_id is not None else 0
    beams_to_keep = max(2, 1 + n_eos) * num_beams
    top_num_beam_mask = torch.cat((torch.ones(num_beams, dtype=torch.bool),
                                   torch.zeros(beams_to_keep - num_beams, dtype=torch.bool))).to(device)

    fill = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1
    # generate() holds every hypothesis at max_length tokens and copies all of them in each step's
    # gathers; here they are WIDEN tokens longer than needed and grow as generation goes on.
    width = min(max_length, cur_len + WIDEN)
    running_sequences = torch.full((batch_size, num_beams, width), fill_value=fill, dtype=torch.int64, device=device)
    running_sequences[:, :, :cur_len] = model._unflatten_beam_dim(input_ids, batch_size, num_beams)
    sequences = running_sequences.detach().clone()
    running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
    running_beam_scores[:, 1:] = -1e9
    beam_scores = torch.full((batch_size, num_beams), fill_value=-1e9, dtype=torch.float, device=device)
    is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
    unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
    running_beam_indices = torch.full((batch_size, num_beams, width - cur_len), fill_value=-1,
                                      dtype=torch.int32, device=device)
    beam_indices = running_beam_indices.detach().clone()

    # Results by original example: the best n_return finished hypotheses, their scores and lengths.
    out_sequences = torch.full((batch_size, n_return, max_length), fill_value=fill, dtype=torch.int64, device=device)
    out_scores = torch.zeros((batch_size, n_return), dtype=torch.float, device=device)
    out_lengths = torch.zeros((batch_size,), dtype=torch.long, device=device)
    active = torch.arange(batch_size, device=device)  # original index of each example still in the batch

    def store(which: Any) -> None:
        rows = active[which]
        out_sequences[rows, :, :width] = sequences[which, :n_return]
        out_scores[rows] = beam_scores[which, :n_return]
        out_lengths[rows] = (beam_indices[which, :n_return] + 1).bool().sum(dim=-1).max(dim=-1).values.long()

    # generate() of transformers 5.17 passes the vocabulary size; later versions read it off the scores.
    takes_vocab_size = _takes_vocab_size(model)
    model_outputs = model._prefill(input_ids, gc, model_kwargs, is_first_iteration=not gc.is_assistant)
    flat_running_sequences = input_ids
    prefill_consumed = False
    while True:
        n = active.shape[0]
        if cur_len == width:
            grow = min(max_length, width + WIDEN) - width
            running_sequences, sequences = (_widen(t, grow, fill) for t in (running_sequences, sequences))
            running_beam_indices, beam_indices = (_widen(t, grow, -1) for t in (running_beam_indices, beam_indices))
            width += grow
        if prefill_consumed:
            flat_running_sequences = model._flatten_beam_dim(running_sequences[:, :, :cur_len])
            model_inputs = model.prepare_inputs_for_generation(
                flat_running_sequences, next_sequence_length=1 if model_kwargs["use_cache"] else None, **model_kwargs)
            model_outputs = model(**model_inputs, return_dict=True)
        prefill_consumed = True
        model_kwargs = model._update_model_kwargs_for_generation(model_outputs, model_kwargs, is_encoder_decoder=True)
        logits = model_outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=device)
        del model_outputs
        log_probs = logits_processor(flat_running_sequences, torch.nn.functional.log_softmax(logits, dim=-1))
        log_probs = model._unflatten_beam_dim(log_probs, n, num_beams) + running_beam_scores[:, :, None]
        vocab = {"vocab_size": log_probs.shape[-1]} if takes_vocab_size else {}
        log_probs = torch.reshape(log_probs, (n, -1))

        topk_log_probs, topk_running_sequences, topk_running_beam_indices = model._get_top_k_continuations(
            accumulated_log_probs=log_probs, running_sequences=running_sequences,
            running_beam_indices=running_beam_indices, cur_len=cur_len, decoder_prompt_len=decoder_prompt_len,
            do_sample=False, beams_to_keep=beams_to_keep, num_beams=num_beams, batch_size=n, **vocab)
        hits = stopping_criteria(model._flatten_beam_dim(topk_running_sequences[:, :, : cur_len + 1]), None)
        hits = model._unflatten_beam_dim(hits, n, beams_to_keep)
        running_sequences, running_beam_scores, running_beam_indices = model._get_running_beams_for_next_iteration(
            topk_log_probs=topk_log_probs, topk_running_sequences=topk_running_sequences,
            topk_running_beam_indices=topk_running_beam_indices, next_token_hits_stopping_criteria=hits,
            num_beams=num_beams)
        sequences, beam_scores, beam_indices, is_sent_finished = model._update_finished_beams(
            sequences=sequences, topk_running_sequences=topk_running_sequences, beam_scores=beam_scores,
            topk_log_probs=topk_log_probs, beam_indices=beam_indices,
            topk_running_beam_indices=topk_running_beam_indices, is_early_stop_heuristic_unsatisfied=unsatisfied,
            is_sent_finished=is_sent_finished, next_token_hits_stopping_criteria=hits,
            top_num_beam_mask=top_num_beam_mask, num_beams=num_beams, cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len, length_penalty=length_penalty, early_stopping=early_stopping)
        beam_idx = model._flatten_beam_dim(running_beam_indices[..., cur_len - decoder_prompt_len])
        cur_len += 1
        unsatisfied = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=unsatisfied, running_beam_scores=running_beam_scores,
            beam_scores=beam_scores, is_sent_finished=is_sent_finished, cur_len=cur_len, max_length=max_length,
            decoder_prompt_len=decoder_prompt_len, early_stopping=early_stopping, length_penalty=length_penalty)
        if not bool(model._beam_search_has_unfinished_sequences(unsatisfied, is_sent_finished, hits, early_stopping)):
            store(slice(None))
            break

        # Final: every finished slot holds a real hypothesis and no candidate can enter any more
        # (see _update_finished_beams: both conditions add -1e9 to every candidate of the example).
        final = is_sent_finished.all(dim=-1) & (~unsatisfied[:, 0] | (early_stopping is True))
        keep = ~final
        n_keep = int(keep.sum())
        if n_keep < n and n_keep * num_beams < MIN_ROWS:
            # Keep some final examples in (their results still cannot change) so that the matrix
            # products never run on fewer rows than MIN_ROWS.
            extra = (~keep).nonzero()[:, 0][: -(-MIN_ROWS // num_beams) - n_keep]
            keep[extra] = True
        if bool(keep.all()):
            # generate()'s own reorder for the next step.
            model_kwargs[cache_key].reorder_cache(beam_idx)
            continue
        store(~keep)
        kept = keep.nonzero()[:, 0]
        rows = (kept[:, None] * num_beams + torch.arange(num_beams, device=device)).reshape(-1)
        # beam_idx points into the rows as they were this step: selecting the kept examples'
        # entries makes the reorder itself drop the rest.
        model_kwargs[cache_key].reorder_cache(beam_idx[rows])
        _select_rows(model_kwargs, cache_key, rows, n * num_beams)
        active = active[kept]
        running_sequences, running_beam_scores, running_beam_indices = (
            running_sequences[kept], running_beam_scores[kept], running_beam_indices[kept])
        sequences, beam_scores, beam_indices = sequences[kept], beam_scores[kept], beam_indices[kept]
        is_sent_finished, unsatisfied = is_sent_finished[kept], unsatisfied[kept]

    # As generate() crops: to the longest generated hypothesis among those returned.
    out = out_sequences[:, :, : decoder_prompt_len + int(out_lengths.max())].reshape(batch_size * n_return, -1)
    if not gc.return_dict_in_generate:
        return out
    # What the engine reads: the sequences and, for several candidates, their scores (per-step
    # scores, beam indices and the cache are not kept).
    return GenerateBeamEncoderDecoderOutput(
        sequences=out, sequences_scores=out_scores.reshape(-1) if gc.output_scores else None)


def _widen(t: Any, grow: int, fill: int) -> Any:
    import torch

    return torch.cat((t, t.new_full((*t.shape[:-1], grow), fill)), dim=-1)


def _select_rows(model_kwargs: dict[str, Any], cache_key: str, rows: Any, n_rows: int) -> None:
    """Keeps `rows` of everything else that has one row per beam: the cross-attention cache (the
    beam cache never reorders it), the encoder outputs and the masks."""
    cache = model_kwargs[cache_key]
    cache.cross_attention_cache.batch_select_indices(rows)
    for key, value in list(model_kwargs.items()):
        if key == cache_key:
            continue
        # Per-row inputs are masks and states (2-D and up); a 1-D tensor such as cache_position is
        # per position, whatever its length.
        if hasattr(value, "shape") and value.dim() >= 2 and value.shape[0] == n_rows:
            model_kwargs[key] = value.index_select(0, rows)
        elif key == "encoder_outputs":
            for name, tensor in list(value.items()):
                if hasattr(tensor, "shape") and tensor.dim() >= 2 and tensor.shape[0] == n_rows:
                    value[name] = tensor.index_select(0, rows)
