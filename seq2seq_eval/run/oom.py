"""Generating one planned batch so that running out of memory costs a split, not the run.

A batch that runs out of device memory is split in halves (members stay in plan order, longest
first, so the first half holds the longer sources) and each half is retried, recursively, down to
single examples. Only an example that runs out of memory alone fails the run, with an
`OutOfMemory` error naming its id and source length.

Every split and every finished sub-batch is journaled as it happens (see
`journal.JournaledBatch` for the line formats), so a resumed run reuses the finished halves and
goes straight to the halves of a range that ran out of memory, instead of failing on it again. A
batch that never runs out of memory is journaled exactly as before splits existed.

What counts as out of memory (`is_out_of_memory`): `torch.OutOfMemoryError` (the caching
allocator's error on CUDA, and on the other backends that raise it; `torch.cuda.OutOfMemoryError`
is the same class), and a `RuntimeError` whose message says the memory ran out: "out of memory"
(CUDA errors raised outside the caching allocator, older MPS builds), "CUBLAS_STATUS_ALLOC_FAILED"
(cuBLAS cannot get its workspace) and the CPU allocator's "can't allocate memory" (a too-large
allocation; Linux usually kills a process that overcommits instead, which no code can catch).
The same rule as accelerate's `should_reduce_batch_size`. Anything else propagates unchanged.

A split batch may differ from the unsplit one in the last bits: each half is padded only to its
own longest source, and different shapes can select different kernels (and, in fp16/bf16,
different rounding), so a beam's score can move by an ulp and, rarely, a near tie can go the
other way. Sampling (`--do_sample true`) reseeds each sub-batch with the batch's seed, so a split
sampled batch gives other samples than the unsplit one would.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import EvalError, OutOfMemory, RunFailed, first_line

logger = logging.getLogger("seq2seq_eval")

# Substrings of RuntimeError messages that mean the device (or host) memory ran out.
OOM_MESSAGES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "can't allocate memory")


def is_out_of_memory(e: BaseException) -> bool:
    """Whether `e` means the batch did not fit in memory (see the module docstring)."""
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(e, oom_type):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in OOM_MESSAGES)


def free_memory(device: Any) -> None:
    """Return the failed attempt's memory before the retry: drop unreachable tensors, then hand the
    caching allocator's free blocks back (CUDA, MPS, XPU), so the halves start from an empty
    cache rather than a fragmented one."""
    import torch

    gc.collect()
    backend = getattr(torch, getattr(device, "type", "cpu"), None)
    empty_cache = getattr(backend, "empty_cache", None)
    if callable(empty_cache) and getattr(device, "type", "cpu") != "cpu":
        empty_cache()


def halves(start: int, stop: int) -> list[tuple[int, int]]:
    """[start, stop) in two, the first half one longer when the count is odd."""
    middle = start + (stop - start + 1) // 2
    return [(start, middle), (middle, stop)]


def make_records(out: Any, ids: Sequence[Any], pseudolabels: bool) -> list[dict[str, Any]]:
    """One journal/rank-file record per example of a generated (sub-)batch."""
    records = []
    for j, example_id in enumerate(ids):
        rec: dict[str, Any] = {
            "id": example_id,
            "pred": out.preds[j] if pseudolabels else out.preds[j][0],
            "n_tokens": out.n_tokens[j],
        }
        if out.scores is not None:
            rec["scores"] = out.scores[j]
        records.append(rec)
    return records


@dataclass
class BatchResult:
    """One planned batch's records and what it took to make them."""

    records: list[dict[str, Any]]
    seconds: float = 0.0  # wall time in this call, failed attempts and freeing memory included
    generated_examples: int = 0  # examples generated now (not reused from the journal)
    new_tokens: int = 0  # their generated tokens
    source_tokens: int = 0  # their source tokens
    padded_source_tokens: int = 0  # rows x longest source, per sub-batch generated now
    sub_batches: int = 0  # ranges the batch ended up as (1: not split)
    out_of_memory: int = 0  # out-of-memory errors caught now, each one a split
    reused_sub_batches: list[tuple[int, int]] = field(default_factory=list)

    @property
    def split(self) -> bool:
        """Whether the batch ran as two or more sub-batches (split now or in a journaled run)."""
        return self.sub_batches > 1


def run_batch(
    generate: Callable[[Sequence[Sequence[int]], int], Any],
    index: int,
    source_ids: Sequence[Sequence[int]],
    ids: Sequence[Any],
    *,
    journal: Any,
    journaled: Any = None,
    pseudolabels: bool = False,
    device: Any = None,
    note: Mapping[str, Any] | None = None,
) -> BatchResult:
    """Generate planned batch `index` (members' token ids `source_ids`, example ids `ids`), splitting
    on out of memory, journaling every split and every finished (sub-)batch in `journal`.

    `generate` is an engine's `generate` (engines.base.Engine); `journaled` is this
    batch's `journal.JournaledBatch` from an earlier run, or None; `note` is added to every
    journal line (which planned share a stolen batch came from). Raises `OutOfMemory` when one
    example does not fit alone."""
    n = len(ids)
    records: list[dict[str, Any] | None] = [None] * n
    result = BatchResult(records=[])
    t_start = time.perf_counter()

    def journaled_part(span: tuple[int, int]) -> dict[str, Any] | None:
        entry = journaled.parts.get(span) if journaled is not None else None
        if entry is not None and [r.get("id") for r in entry["records"]] == list(ids[span[0]:span[1]]):
            return entry
        return None

    def journaled_split(span: tuple[int, int]) -> list[tuple[int, int]] | None:
        entry = journaled.splits.get(span) if journaled is not None else None
        if entry is not None and entry.get("of") == n and entry.get("ids") == list(ids[span[0]:span[1]]):
            return list(entry["into"])
        return None

    def attempt(span: tuple[int, int]) -> str | None:
        """Generate `span` and journal it; None when done, else why it ran out of memory."""
        start, stop = span
        batch_ids = source_ids[start:stop]
        t0 = time.perf_counter()
        try:
            out = generate(batch_ids, index)
        except Exception as e:
            if isinstance(e, EvalError):
                raise
            if not is_out_of_memory(e):
                # An engine's own failure is one typed line (evaluate()'s callers and every rank
                # see its type), naming the batch; --debug keeps the traceback.
                shown = ", ".join(repr(i) for i in list(ids[start:stop])[:3]) + (", ..." if stop - start > 3 else "")
                raise RunFailed(f"batch {index} (example ids {shown}): the engine failed ({type(e).__name__}: "
                                f"{first_line(e)}); the batches journaled before it are kept: --debug shows the "
                                "traceback, and once the cause is fixed the same command with --resume goes on") from e
            reason = _short_reason(e)
        else:
            dt = time.perf_counter() - t0
            recs = make_records(out, ids[start:stop], pseudolabels)
            if span == (0, n):
                journal.append({"batch": index, "records": recs, "seconds": dt, **(note or {})})
            else:
                journal.append({"batch": index, "part": [start, stop], "of": n, "records": recs, "seconds": dt,
                                **(note or {})})
            records[start:stop] = recs
            result.generated_examples += stop - start
            result.new_tokens += sum(out.n_tokens)
            result.source_tokens += sum(len(x) for x in batch_ids)
            result.padded_source_tokens += max(len(x) for x in batch_ids) * (stop - start)
            return None
        # Out of the except block: the exception and its traceback (which holds the failed
        # attempt's tensors through its frames) are gone before the memory is handed back.
        free_memory(device)
        return reason

    def solve(span: tuple[int, int]) -> None:
        start, stop = span
        part = journaled_part(span)
        if part is not None:
            records[start:stop] = part["records"]
            result.reused_sub_batches.append(span)
            result.sub_batches += 1
            return
        into = journaled_split(span)
        if into is None:
            reason = attempt(span)
            if reason is None:
                result.sub_batches += 1
                return
            result.out_of_memory += 1
            if stop - start == 1:
                raise OutOfMemory(
                    f"example id {ids[start]!r} (source {len(source_ids[start])} tokens, batch {index}) ran out of "
                    f"memory alone ({reason}); its batch was split down to it, so --bs/--max_tokens cannot help: "
                    "lower --max_source_length, --num_beams or --max_new_tokens, run in --fp16 or --bf16, or run "
                    "fewer ranks per GPU; finished batches are kept, rerun with --resume"
                )
            into = halves(start, stop)
            longest = max(len(x) for x in source_ids[start:stop])
            logger.warning(
                "batch %d: out of memory on %d examples (longest source %d tokens); retrying as %s (%s)",
                index, stop - start, longest, " + ".join(str(b - a) for a, b in into), reason,
            )
            journal.append({"batch": index, "split": [start, stop], "of": n, "into": [list(r) for r in into],
                            "ids": list(ids[start:stop]), **(note or {})})
        for sub in into:
            solve(sub)

    solve((0, n))
    # Every range of the recursion was either filled or raised.
    result.records = [r for r in records if r is not None]
    result.seconds = time.perf_counter() - t_start
    return result


def _short_reason(e: BaseException) -> str:
    """The error's first sentences: torch's CUDA message runs on for several lines of allocator
    advice, of which "CUDA out of memory. Tried to allocate 2.00 GiB" is the part that matters."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else type(e).__name__
    sentences = text.split(". ")
    return ". ".join(sentences[:2])[:200]
