"""Error spans from a unified COMET model's per-token label probabilities, as unbabel-comet
2.2.7's `UnifiedMetric.decode` reads them (argmax decoding, its default), quirks included, and
XCOMET's MQM score from them (`XCOMETMetric.predict_step`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

SEVERITY_PENALTY = {"minor": 1, "major": 5, "critical": 10}
"""MQM points per span (XCOMET's _compute_mqm_from_spans); a severity not named adds 0."""


def labels(error_labels: Sequence[str]) -> list[str]:
    """COMET's LabelSet: "O" (no error) first, then "I-<severity>" in the checkpoint's order."""
    return ["O", *(f"I-{label}" for label in error_labels)]


def decode(probs: Any, token_ids: Sequence[int], offsets: Sequence[tuple[int, int]], names: Sequence[str],
           text: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """One translation's spans: `probs` (tokens x labels, float32) over its tokens, special ones
    included, `token_ids` the joined input's first tokens (those decode() reads), `offsets` the
    translation's character offsets per token ((0, 0) for a special token). A span is a run of
    tokens whose most probable label is not "O"; its severity is its first token's, its
    confidence the float32 mean of its tokens' top probabilities, its end the last token's end.
    As in decode(): a span still open after the last token (the end token is part of the
    translation) is dropped, special tokens inside a span are part of its text, and a span is
    only closed by an "O" (one severity following another continues the span)."""
    import torch

    top, label_ids = torch.topk(probs, 1, dim=-1)
    out: list[dict[str, Any]] = []
    span: dict[str, Any] | None = None
    for token, (probability, label_id), offset in zip(token_ids, zip(top[:, 0], label_ids[:, 0].tolist()), offsets):
        label = names[label_id]
        if label.startswith("I") and span is None:
            span = {"tokens": [token], "severity": label.split("-")[1], "offset": list(offset), "confidence": [probability]}
        elif label.startswith("I"):
            span["tokens"].append(token)
            span["confidence"].append(probability)
            span["offset"][1] = offset[1]
        elif label == "O" and span is not None:
            out.append(span)
            span = None
    return [{"text": text(s["tokens"]), "confidence": torch.stack(s["confidence"]).mean().item(),
             "severity": s["severity"], "start": s["offset"][0], "end": s["offset"][1]} for s in out]


def mqm(spans: Sequence[dict[str, Any]]) -> int:
    """The MQM penalty of one translation's spans, at most 25."""
    return min(25, sum(SEVERITY_PENALTY.get(s["severity"], 0) for s in spans))
