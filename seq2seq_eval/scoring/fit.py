"""Whether a model metric's tokenizer fits its model, checked before any work (the dry run's checks,
and each load, so `score` too): every id the tokenizer can give has a row in the model's
embeddings (else an IndexError mid-scoring, after generation), and its special ids are those the
model was trained with (else a number computed on another vocabulary's ids: a tokenizer of another
family loads and scores without a word). Each returns the problem in words, or None."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROBE = "a b"
"""A text every tokenizer tokenizes: its ids with and without the special tokens show where a
tokenizer puts them."""


def ids_past_embeddings(tokenizer: Any, rows: int) -> str | None:
    """The highest id the tokenizer gives (its vocabulary, the added tokens counted, and its special
    tokens) against the model's `rows` embeddings."""
    vocab = tokenizer.get_vocab()
    ids = [*vocab.values(), *(i for i in tokenizer.all_special_ids if i is not None)]
    top = max(ids) if ids else -1
    if top < rows:
        return None
    token = next((t for t, i in vocab.items() if i == top), None)
    return (f"its ids reach {top}{f' ({token!r})' if token is not None else ''} ({len(tokenizer)} tokens with the "
            f"added ones), past the model's {rows} embeddings")


def special_ids_disagree(tokenizer: Any, model_ids: Mapping[str, int | None], source: str,
                         needed: Sequence[str] = ()) -> str | None:
    """The tokenizer's pad/bos/eos ids against the model's (`source` names where the model's come
    from). One the model does not name, or the tokenizer does not (a tokenizer.json alone names
    none, and framing_problem sees what it gives), is not compared, unless `needed` (what the
    metric reads of the tokenizer itself)."""
    for name, want in model_ids.items():
        got = getattr(tokenizer, f"{name}_token_id", None)
        if got is None and name in needed:
            return f"it has no {name} token, which {source} names {want}"
        if want is not None and got is not None and got != want:
            return f"its {name} id is {got} where {source} says {want}"
    return None


def framing_problem(tokenizer: Any, before: Sequence[int], after: Sequence[int], expected: str) -> str | None:
    """Whether the tokenizer puts exactly `before` ahead of a text's ids and `after` behind them, as
    the model's own tokenizer does (`expected` says it in words)."""
    plain = list(tokenizer(PROBE, add_special_tokens=False)["input_ids"])
    framed = list(tokenizer(PROBE)["input_ids"])
    if framed == [*before, *plain, *after]:
        return None
    return f"it frames a text as {framed} (the text alone: {plain}) where the model's tokenizer gives {expected}"


PADDED_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text",
                    "roberta-prelayernorm", "xmod")
"""Models whose positions are numbered from the pad id + 1 (fairseq's RoBERTa): a text of n
tokens takes positions up to n + pad id."""
FIRST_POSITIONS = ("bert", "distilbert", "albert", "electra", "xlm", "mobilebert")
"""Models whose positions are numbered from 0."""


def positions_past_embeddings(max_length: int, config: Any) -> str | None:
    """Whether a text of `max_length` tokens (what the metric truncates to) takes a position the
    model has no embedding for, for the absolute-position models above (others: None)."""
    rows = getattr(config, "max_position_embeddings", None)
    kind = getattr(config, "model_type", None)
    if not isinstance(rows, int) or kind not in (*PADDED_POSITIONS, *FIRST_POSITIONS):
        return None
    offset = int(config.pad_token_id or 0) + 1 if kind in PADDED_POSITIONS else 0
    if max_length + offset <= rows:
        return None
    return (f"texts are cut to its model_max_length {max_length}, whose positions reach {max_length + offset - 1}, "
            f"past the model's {rows} position embeddings")


def first_problem(*problems: str | None) -> str | None:
    return next((p for p in problems if p is not None), None)
