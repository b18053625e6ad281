"""The key/value cache handed to beam search on encoder-decoder models: the same values as
generate()'s own cache, with two copies per decoder step fewer.

Beam search ends each step by reordering every cached row to follow the surviving beams, then
the next step appends one position to the self-attention cache. On small models both are
memory copies of the whole cache at every step (a py-spy profile of the embedded model on CPU:
14.5% of beam search in the reorder, 10% in the append, before this module):

- Cross-attention is not reordered. An example's beams all attend to one encoder output
  (expanded per beam) and a beam is only ever replaced by a beam of the same example, so that
  reorder copies rows onto identical rows.
- The self-attention reorder writes into a buffer one position longer than the cache, and the
  next append fills that position in place instead of concatenating (a second full copy). The
  cache handed to attention is then the same contiguous tensor that concatenation would give.

Outputs are identical to generate()'s own cache, bit for bit (tests/test_generate.py compares
sequences and scores on six model families). Wherever that reasoning does not plainly hold,
beam_cache() returns None and generate() builds its own cache.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _classes() -> tuple[type, type]:
    import torch
    from transformers.cache_utils import DynamicLayer, EncoderDecoderCache

    class SpareSlotLayer(DynamicLayer):
        """A DynamicLayer whose reorder leaves room for the next position."""

        _spare: tuple[Any, Any] | None = None

        def reorder_cache(self, beam_idx: Any) -> None:
            n = self.get_seq_length()
            if n == 0:
                return
            beam_idx = beam_idx.to(self.keys.device)
            spare = []
            try:
                for cached in (self.keys, self.values):
                    shape = (beam_idx.shape[0], *cached.shape[1:-2], n + 1, cached.shape[-1])
                    buffer = cached.new_empty(shape)
                    torch.index_select(cached, 0, beam_idx, out=buffer[..., :n, :])
                    spare.append(buffer)
            except RuntimeError:
                # A backend that cannot select into a strided view: reorder as DynamicLayer does
                # (self.keys and self.values are untouched until here).
                super().reorder_cache(beam_idx)
                return
            self._spare = (spare[0], spare[1])
            self.keys, self.values = spare[0][..., :n, :], spare[1][..., :n, :]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            spare, self._spare = self._spare, None
            if spare is not None and self._fits(spare, key_states, value_states):
                n = self.keys.shape[-2]
                spare[0][..., n:, :] = key_states
                spare[1][..., n:, :] = value_states
                self.keys, self.values = spare
                return self.keys, self.values
            return super().update(key_states, value_states, *args, **kwargs)

        def _fits(self, spare: tuple[Any, Any], key_states: Any, value_states: Any) -> bool:
            """The buffers still back this layer's cache and take exactly the new states: anything
            else (a crop or batch select since the reorder, another dtype) concatenates as usual."""
            for buffer, cached, new in zip(spare, (self.keys, self.values), (key_states, value_states)):
                if (cached.data_ptr() != buffer.data_ptr() or new.dtype != buffer.dtype
                        or new.shape[:-2] != buffer.shape[:-2] or new.shape[-1] != buffer.shape[-1]
                        or cached.shape[-2] + new.shape[-2] != buffer.shape[-2]):
                    return False
            return True

    class BeamSearchCache(EncoderDecoderCache):
        def reorder_cache(self, beam_idx: Any) -> None:
            self.self_attention_cache.reorder_cache(beam_idx)

    return SpareSlotLayer, BeamSearchCache


def cache_kwarg(model: Any) -> str:
    """The name generate() takes a ready cache under: later transformers 5 releases (5.24 here)
    renamed `past_key_values` to `cache` (the old name warns on every call and goes in 6.0), and
    a model's forward() takes the name its generate() reads."""
    import inspect

    try:
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def beam_cache(model: Any, gc: Any) -> Any:
    """A fresh cache for one generate() call with generation config `gc`, or None to leave
    generate() its own: not beam search, no cache, a cache implementation asked for, a decoder-only
    model, a model with its own reorder, or a transformers without these cache classes."""
    if int(gc.num_beams or 1) <= 1 or gc.use_cache is False or gc.cache_implementation is not None:
        return None
    if not getattr(model.config, "is_encoder_decoder", False) or hasattr(model, "_reorder_cache"):
        return None
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        return None
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer

        spare_slot_layer, beam_search_cache = _classes()
        decoder_config = model.config.get_text_config(decoder=True)
        # The layer caches generate() would build itself (layer types come from the config); plain
        # full-attention layers get the spare slot, any other kind stays as it is.
        self_attention = DynamicCache(config=decoder_config)
        self_attention.layers = [spare_slot_layer() if type(layer) is DynamicLayer else layer
                                 for layer in self_attention.layers]
        return beam_search_cache(self_attention, DynamicCache(config=decoder_config))
    except (ImportError, TypeError, AttributeError):
        return None  # an older transformers: its own cache is correct, only slower
