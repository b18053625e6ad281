"""BERTScore's greedy matching (bert-score 0.3.13's greedy_cos_idf): each token of the candidate
takes its most similar reference token (precision), each reference token its most similar
candidate token (recall), weighted by idf (or 1, 0 for [CLS] and [SEP]); F1 = 2PR / (P + R)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...numerics import one_mkl_thread

CHUNK_ELEMENTS = 1 << 24
"""Similarities held at once (float32: 64 MiB): pairs are matched in chunks of about this many."""


def greedy_scores(hyps: Sequence[Any], refs: Sequence[Any], hyp_weights: Sequence[Any],
                  ref_weights: Sequence[Any]) -> Any:
    """(P, R, F) of each (candidate, reference) pair, an (n, 3) float32 tensor. `hyps[k]` and
    `refs[k]`: normalized token embeddings (length x dim), the weights one per token.

    A token's best match is taken over the other text's tokens only (bert-score also sees its
    batch's padding there, as similarity 0: where every similarity of a token is negative, its
    value would depend on the batch; see docs/metrics.md). A text of two tokens (the special
    tokens around an empty text) gets P = R = 0, as in bert-score, and F stays 2PR / (P + R)
    of the values before, 0 where that is not a number."""
    import torch

    out = []
    start = 0
    while start < len(hyps):
        stop = start + 1
        h_max, r_max = len(hyps[start]), len(refs[start])
        while stop < len(hyps):
            h, r = max(h_max, len(hyps[stop])), max(r_max, len(refs[stop]))
            if (stop + 1 - start) * h * r > CHUNK_ELEMENTS:
                break
            h_max, r_max, stop = h, r, stop + 1
        out.append(_chunk(hyps[start:stop], refs[start:stop], hyp_weights[start:stop], ref_weights[start:stop], torch))
        start = stop
    return torch.cat(out) if out else torch.zeros((0, 3))


def _pad(rows: Sequence[Any], torch: Any) -> tuple[Any, Any]:
    width = max(len(r) for r in rows)
    padded = torch.zeros((len(rows), width, *rows[0].shape[1:]), dtype=rows[0].dtype, device=rows[0].device)
    mask = torch.zeros((len(rows), width), dtype=torch.bool, device=rows[0].device)
    for k, r in enumerate(rows):
        padded[k, : len(r)] = r
        mask[k, : len(r)] = True
    return padded, mask


def _chunk(hyps: Sequence[Any], refs: Sequence[Any], hw: Sequence[Any], rw: Sequence[Any], torch: Any) -> Any:
    h, h_mask = _pad(hyps, torch)
    r, r_mask = _pad(refs, torch)
    h_w, _ = _pad(hw, torch)
    r_w, _ = _pad(rw, torch)
    # A chunk of one pair whose reference has a few more tokens than its prediction is a product
    # MKL's strict mode leaves depending on its threads (numerics.one_mkl_thread): small, on one.
    with one_mkl_thread():
        sim = torch.bmm(h, r.transpose(1, 2))
    sim = sim.masked_fill(~(h_mask.unsqueeze(2) & r_mask.unsqueeze(1)), float("-inf"))
    word_precision = sim.max(dim=2)[0].masked_fill(~h_mask, 0.0)
    word_recall = sim.max(dim=1)[0].masked_fill(~r_mask, 0.0)
    # As bert-score: the weights divided by their sum first (0 / 0 is NaN: a text weighed nowhere).
    p = (word_precision * (h_w / h_w.sum(dim=1, keepdim=True))).sum(dim=1)
    r_ = (word_recall * (r_w / r_w.sum(dim=1, keepdim=True))).sum(dim=1)
    f = 2 * p * r_ / (p + r_)
    empty = h_mask.sum(dim=1).eq(2) | r_mask.sum(dim=1).eq(2)
    p, r_ = p.masked_fill(empty, 0.0), r_.masked_fill(empty, 0.0)
    return torch.stack((p, r_, f.masked_fill(torch.isnan(f), 0.0)), dim=-1)
