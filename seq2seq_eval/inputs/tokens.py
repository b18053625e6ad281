"""Source token ids, tokenized once per run and shared through the temp dir.

Each rank tokenizes a contiguous 1/world of the examples into its own shard (a flat int32 array
of ids and an int32 array of lengths); every rank then maps all shards. A shard is written under
a temporary name, renamed, and described by a small JSON file written last: a shard without its
description (a crash mid-write) is simply tokenized again. A resumed run or a torchrun restart
with the same world size and cache key reuses the shards as they are.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..model.settings import encode_sources
from .prompts import Prompts, encode_prompts

CHUNK = 10_000
"""Sources per tokenizer call: the tokenizer's output for a chunk is the largest transient."""


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    return n * rank // world_size, n * (rank + 1) // world_size


def tokenize_to(cache: Path, key: str, start: int, end: int, tokenizer: Any, sources: Iterable[Sequence[str]],
                prefix: str, max_len: int | None, prompts: Prompts | None = None,
                fields: Iterable[Sequence[Mapping[str, str]]] | None = None) -> None:
    """Tokenize sources start..end-1 chunk by chunk, appending each chunk's ids to the shard's
    file as it goes: memory stays at one chunk (a million sources' ids would be hundreds of MB,
    twice over while concatenated). The description is written last. With `prompts` (a
    decoder-only model), each source's prompt instead (`fields`: the other columns its template
    names, in chunks as `sources`); the first example whose prompt is refused is recorded in the
    description (`refused`: its position and why), for every rank to read."""
    ids_path, lens_path, meta_path = _names(cache, start, end)
    tmp = ids_path.with_name(f".{ids_path.name}.{os.getpid()}.tmp")
    len_parts, truncated, refused, done = [], 0, None, start
    columns = iter(fields) if fields is not None else None
    try:
        with open(tmp, "wb") as f:
            for chunk in sources:
                if prompts is None:
                    ids, n_trunc = encode_sources(tokenizer, chunk, prefix, max_len)
                else:
                    named = next(columns) if columns is not None else None
                    ids, n_trunc, problem = encode_prompts(prompts, tokenizer, chunk, named)
                    if problem is not None and refused is None:
                        refused = [done + problem[0], problem[1]]
                done += len(chunk)
                truncated += n_trunc
                lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
                len_parts.append(lengths)
                f.write(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())).tobytes())
        os.replace(tmp, ids_path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    _save_npy(lens_path, np.concatenate(len_parts) if len_parts else np.zeros(0, np.int32))
    _write_meta(meta_path, key, start, end, truncated, refused)


def _write_meta(meta_path: Path, key: str, start: int, end: int, truncated: int, refused: Any = None) -> None:
    # Renamed into place last: its presence says the shard's two arrays are complete.
    tmp = meta_path.with_name(f".{meta_path.name}.{os.getpid()}.tmp")
    meta = {"key": key, "start": start, "end": end, "truncated": truncated}
    if refused is not None:
        meta["refused"] = refused
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, meta_path)


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _names(cache: Path, start: int, end: int) -> tuple[Path, Path, Path]:
    stem = f"tokens_{start}_{end}"
    return cache / f"{stem}.ids.bin", cache / f"{stem}.lens.npy", cache / f"{stem}.json"


def write_shard(cache: Path, key: str, start: int, end: int, flat: np.ndarray, lengths: np.ndarray, truncated: int) -> None:
    """A shard from arrays already in memory (tests)."""
    ids_path, lens_path, meta_path = _names(cache, start, end)
    ids_path.write_bytes(np.asarray(flat, np.int32).tobytes())
    _save_npy(lens_path, np.asarray(lengths, np.int32))
    _write_meta(meta_path, key, start, end, truncated)


def shard_is_complete(cache: Path, key: str, start: int, end: int) -> bool:
    ids_path, lens_path, meta_path = _names(cache, start, end)
    try:
        meta = json.loads(meta_path.read_text())
        lengths = np.load(lens_path, mmap_mode="r")
        size = ids_path.stat().st_size
    except (OSError, ValueError):
        return False
    return meta.get("key") == key and len(lengths) == end - start and int(lengths.sum()) * 4 == size


STRIDE = 256
"""Every STRIDE-th example's start in its shard's ids is kept; the others' are added up from the
lengths when asked for (at most STRIDE-1 lengths): 8 bytes per STRIDE examples, not per example."""


@dataclass
class SourceTokens:
    """Every shard of a world, mapped: ids of any example by position."""

    starts: np.ndarray  # first position of each shard
    # Each shard's ids file, read with pread: a memory map's pages, once touched, stay counted in the
    # rank's resident memory (90 MB of a 1M-example run's shards after its first batch); a read
    # copies only the ids asked for.
    flats: list[Any]
    offsets: list[np.ndarray]  # per shard: where every STRIDE-th example's ids start in its flat array
    lengths: np.ndarray  # all examples' lengths, in data order
    truncated: int
    refused: tuple[int, str] | None = None
    """The first example (position, why) whose prompt was refused, over all shards."""

    def ids(self, position: int) -> list[int]:
        shard = int(np.searchsorted(self.starts, position, side="right")) - 1
        start = int(self.starts[shard])
        block = (position - start) // STRIDE
        first = start + block * STRIDE
        lo = int(self.offsets[shard][block]) + int(self.lengths[first:position].sum(dtype=np.int64))
        n = int(self.lengths[position])
        if n == 0:
            return []
        data = os.pread(self.flats[shard].fileno(), 4 * n, 4 * lo)
        return np.frombuffer(data, np.int32).tolist()


def load_shards(cache: Path, ranges: Sequence[tuple[int, int]]) -> SourceTokens:
    starts, flats, offsets, lens, truncated, refused = [], [], [], [], 0, []
    for start, end in ranges:
        ids_path, lens_path, meta_path = _names(cache, start, end)
        lengths = np.load(lens_path)
        starts.append(start)
        flats.append(open(ids_path, "rb"))  # noqa: SIM115  (held while the run reads ids from it)
        # The start of every STRIDE-th example: the sums of the lengths of each STRIDE before it.
        blocks = np.add.reduceat(lengths, np.arange(0, len(lengths), STRIDE), dtype=np.int64) if len(lengths) else lengths
        offsets.append(np.r_[0, np.cumsum(blocks, dtype=np.int64)[:-1]].astype(np.int64) if len(lengths) else np.zeros(0, np.int64))
        lens.append(lengths)
        meta = json.loads(meta_path.read_text())
        truncated += int(meta["truncated"])
        if meta.get("refused"):
            refused.append((int(meta["refused"][0]), str(meta["refused"][1])))
    # One shard (a dry run, one process): its array as it is, not a copy.
    all_lengths = lens[0] if len(lens) == 1 else np.concatenate(lens) if lens else np.zeros(0, np.int32)
    return SourceTokens(np.asarray(starts, np.int64), flats, offsets, all_lengths, truncated, min(refused, default=None))
