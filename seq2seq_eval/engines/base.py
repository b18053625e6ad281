"""What every generation engine gives the run: one planned batch of token ids in, each example's
candidates, their scores and token counts out.

Everything around an engine is shared: the plan, journals, rank files, merge, metrics,
pseudolabels, resume and out-of-memory splitting (`oom.run_batch` calls `Engine.generate`). An
engine is therefore free in how it generates, but not in what it returns: texts decoded the way
the HF engine decodes them (special tokens skipped, outer spaces stripped), best candidate first;
for a decoder-only model, the continuation only (the tokens after the prompt), and with stop
strings each hypothesis ended where generate()'s own criterion ends it and its text cut before
the first stop string it shows (engines/stops.py), its scores the continuation's
(docs/causal.md#scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class BatchOutput:
    preds: list[list[str]]  # per example, num_return_sequences candidates (best first)
    scores: list[list[float]] | None  # sequence scores, per candidate, when num_return_sequences > 1
    n_tokens: list[int]  # generated tokens per example (after the decoder start, EOS included), summed over candidates


class Engine(Protocol):
    """One rank's generator. `generate` must not depend on which rank calls it, nor on the batches
    called before it: the same batch gives the same output at any world size, and after a resume."""

    name: str

    def generate(self, batch_ids: Sequence[Sequence[int]], batch_index: int) -> BatchOutput:
        """Candidates for one batch of source (or prompt) token ids, unpadded. `batch_index` seeds
        sampling."""
        ...

    def describe(self) -> dict[str, Any]:
        """What identifies this engine's results, for the manifest and the provenance."""
        ...
