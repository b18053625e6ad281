"""Stop strings (--stop_strings): each hypothesis stops at its own first stop string, and its
prediction is cut before it.

A stop string is looked for in the continuation's text, decoded as the prediction is decoded
(special tokens skipped, spaces not cleaned up), never in the prompt and never across the prompt's
end: what the prediction would show is what stops it. The criterion below is handed to
generate() as a stopping criterion, which generate() asks of every row after every token: in
greedy search and sampling each example's row stops by itself, and in beam search each candidate
hypothesis (generate() 5.x marks a candidate that meets a stopping criterion finished, as it does
one that ends with the end token, and keeps searching with the others). So with greedy
decoding a run with stop strings gives the run without them, cut before the first stop string,
whichever tokens the stop string spans.

transformers' own StopStringCriteria is not used: it matches token strings from the vocabulary
(a byte-fallback or byte-level token is not the text it decodes to) and lets a stop string begin
in the prompt, so it could stop where the prediction shows no stop string, or not stop where it
shows one.

The score of a hypothesis that stopped (--num_return_sequences > 1) is generate()'s: its
log-probability up to the token that completed the stop string, normalised by that length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """A continuation's text as predictions are decoded (before the outer spaces are stripped)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def first_stop(text: str, stops: Sequence[str]) -> int:
    """Where the first stop string starts in `text`; -1 when there is none."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else -1


def stopped(tokenizer: Any, ids: Sequence[int], text: str, stops: Sequence[str]) -> tuple[str, int | None]:
    """`text`, the decoding of `ids`, cut before its first stop string, and how many tokens were
    generated up to the one that completed it; (text, None) when it shows none. What both engines
    do to a continuation, with `text` decoded once."""
    at = first_stop(text, stops)
    if at < 0:
        return text, None
    return text[:at], _first_showing(tokenizer, ids, stops)


def _first_showing(tokenizer: Any, ids: Sequence[int], stops: Sequence[str]) -> int:
    """The length of the shortest prefix of `ids` whose text shows a stop string (len(ids) when
    none does). A prefix that shows a stop string is followed only by longer ones that do, so the
    first is found by halving."""
    lo, hi = 1, len(ids)  # the shortest prefix that shows a stop string is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if first_stop(decode(tokenizer, ids[:mid]), stops) >= 0:
            hi = mid
        else:
            lo = mid + 1
    return lo


def criterion(tokenizer: Any, stops: Sequence[str], start: int) -> Any:
    """generate()'s `stopping_criteria`: a row is done once the text of its tokens from `start`
    on (the continuation) shows a stop string."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopAtStrings(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            texts = tokenizer.batch_decode(input_ids[:, start:].tolist(), skip_special_tokens=True,
                                           clean_up_tokenization_spaces=False)
            return torch.tensor([first_stop(t, stops) >= 0 for t in texts], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([StopAtStrings()])
