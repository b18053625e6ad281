"""Fingerprints of what a rank actually holds in memory: the model's weights and the tokenizer's
content. Two objects with equal fingerprints generate alike; one changed weight, one swapped
token id or another `model_max_length` changes the fingerprint.

Used where a name is not enough: evaluate()'s ranks compare them before any work (a rank whose
model object differs), the Trainer callback keys its cached scores by the weights (a checkpoint
loaded after the last evaluation), and a run's manifest records the tokenizer's, so `--resume`
and the token cache notice a changed tokenizer.

The weights' fingerprint reads every byte of every tensor: a CRC-32 of each tensor's bytes in
element order (a GPU tensor is copied to the CPU a chunk at a time), with its name, dtype and
shape, all under one sha256. A CRC rather than a sha256 of the bytes: about 4 GB/s against
1.4 GB/s on one core, and any change of a tensor changes its CRC but for a chance of 2^-32.
The value depends on the bits only, so it is the same on CPU and GPU and at any thread count.
docs/python-api.md has its measured cost.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

_CHUNK = 1 << 24
"""Elements read at a time: a GPU tensor is copied to the CPU a chunk (at most 128 MB) at a time."""

_INT_OF_SIZE = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def _bits(tensor: Any) -> Any:
    """The tensor's elements reinterpreted as signed integers of the same width, flat (numpy has
    no bfloat16, and the bits are what is compared)."""
    import torch

    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.to(torch.int8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    int_dtype = getattr(torch, _INT_OF_SIZE[flat.element_size()])
    return flat.contiguous().view(int_dtype)


def tensor_crc(tensor: Any) -> int:
    """The CRC-32 of a tensor's bytes in element order (the same on every device)."""
    bits = _bits(tensor)
    crc = 0
    for start in range(0, bits.numel(), _CHUNK):
        crc = zlib.crc32(bits[start:start + _CHUNK].cpu().numpy().data, crc)
    return crc


def weights_fingerprint(model: Any) -> str:
    """A digest of every parameter and buffer of `model`: names, dtypes, shapes and contents. A
    tensor with no data (on the "meta" device: offloaded by accelerate) enters by name, dtype and
    shape only."""
    import torch

    state = model.state_dict()
    entries = []
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        on_meta = tensor.device.type == "meta"
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape),
                        None if on_meta else tensor_crc(tensor)])
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def _backend_text(tokenizer: Any) -> str | None:
    """The whole tokenization pipeline, as text, where the tokenizer exposes it: a fast
    tokenizer's JSON (vocabulary, merges, normalizer, pre-tokenizer, post-processor, added
    tokens), or a sentencepiece tokenizer's serialized models."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        return backend.to_str()
    parts = []
    for attr in ("sp_model", "spm_source", "spm_target"):
        sp = getattr(tokenizer, attr, None)
        if sp is not None and hasattr(sp, "serialized_model_proto"):
            parts.append(hashlib.sha256(sp.serialized_model_proto()).hexdigest())
    return "\n".join(parts) or None


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What decides how a tokenizer encodes and decodes, by field: its class, a digest of its
    vocabulary (token to id) and of its whole pipeline where it exposes one, its special tokens,
    `model_max_length`, and its padding and truncation sides. Fields are kept apart so that a
    difference can be named."""
    vocab = tokenizer.get_vocab()
    special = {
        "map": {k: str(v) for k, v in sorted(getattr(tokenizer, "special_tokens_map", {}).items())},
        "ids": sorted(int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None),
        "added": sorted(str(t) for t in getattr(tokenizer, "get_added_vocab", dict)()),
    }
    backend = _backend_text(tokenizer)
    max_len = getattr(tokenizer, "model_max_length", None)
    return {
        "class": type(tokenizer).__name__,
        "vocab_sha256": hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest(),
        "pipeline_sha256": hashlib.sha256(backend.encode()).hexdigest() if backend is not None else None,
        "special_tokens_sha256": hashlib.sha256(json.dumps(special, sort_keys=True, ensure_ascii=False).encode()).hexdigest(),
        # transformers' "no limit" is a huge float (VERY_LARGE_INTEGER): kept as an int, so JSON
        # round trips compare equal.
        "model_max_length": int(max_len) if isinstance(max_len, (int, float)) and max_len < 1e30 else None,
        "padding_side": getattr(tokenizer, "padding_side", None),
        "truncation_side": getattr(tokenizer, "truncation_side", None),
    }


def tokenizer_digest(tokenizer: Any) -> str:
    """tokenizer_fingerprint in one string (for cache keys)."""
    return hashlib.sha256(json.dumps(tokenizer_fingerprint(tokenizer), sort_keys=True).encode()).hexdigest()
