"""The Hugging Face engine: `model.generate()` on a PyTorch model, with the beam cache."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigError, first_line
from .base import BatchOutput
from ..model.generation import stop_list
from . import shrink, stops
from .beam_cache import beam_cache, cache_kwarg


def generated_lengths(sequences: Any, eos_token_id: int | list[int] | None, pad_id: int, start: int = 1) -> Any:
    """Tokens each returned sequence generated from position `start` on (after the decoder start,
    or a decoder-only model's padded prompt), up to and including its first EOS. Not "non-pad
    tokens": beam search fills finished rows with pad_token_id or, when that is 0/unset, with EOS,
    which would count every row as long as its batch."""
    import torch

    body = sequences[:, start:]
    eos = [] if eos_token_id is None else eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    is_eos = torch.isin(body, torch.tensor(eos))
    unfinished = (body != pad_id).sum(dim=1)
    return torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, unfinished)


def row_ends(sequences: Any, eos_token_id: int | list[int] | None, start: int = 1) -> list[int]:
    """Where each returned sequence ends: after its first end token from position `start` on,
    else at the sequence's full width."""
    import torch

    eos = [] if eos_token_id is None else eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    is_eos = torch.isin(sequences[:, start:], torch.tensor(eos, dtype=sequences.dtype))
    return torch.where(is_eos.any(dim=1), start + is_eos.int().argmax(dim=1) + 1, sequences.shape[1]).tolist()


class OncePerRun(logging.Filter):
    """Lets each distinct message through once. transformers warns about a generation setting
    on every generate() call, i.e. every batch, over the progress bar; once per run says it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True

    @contextlib.contextmanager
    def on(self, library_logger: logging.Logger) -> Iterator[None]:
        # On the handlers: a logger's own filters do not see records its child loggers
        # (transformers.generation.utils) propagate to it.
        handlers = list(library_logger.handlers)
        for handler in handlers:
            handler.addFilter(self)
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(self)


def attention_backends(device: Any) -> Any:
    """The scaled-dot-product attention kernels generate() may use on `device`: on CUDA, every
    backend but cuDNN's. cuDNN builds an execution plan for each new input shape, and beam search
    brings a new one at every decoding step (the self-attention keys grow by one token) and with
    every batch of another size; only fp16/bf16 run on it, which made half precision slower than
    fp32 (docs/gpu.md, "Half precision"). Elsewhere nothing is restricted."""
    if getattr(device, "type", str(device)) != "cuda":
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3 has no cuDNN attention to avoid
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class HFEngine:
    """Generates one batch at a time with `model.generate()` on one device."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, generation_config: Any, device: Any, seed: int = 0,
                 causal: bool = False) -> None:
        self.model = model
        self.tokenizer = tokenizer
        # Output options live in the (copied) generation config: transformers 5 warns when
        # generation_config and loose generate kwargs are mixed.
        self.gc = copy.deepcopy(generation_config)
        self.gc.return_dict_in_generate = True
        self.gc.output_scores = int(generation_config.num_return_sequences or 1) > 1
        # Stop strings: generate()'s own criterion, built once here and handed to each call with
        # the batch's left padding kept out of it (engines/stops.py); left in the field, generate()
        # would build it again at every call and read the padding as part of each prompt.
        strings = stop_list(generation_config.stop_strings)
        self.stops = stops.Stops(tokenizer, strings) if strings else None
        self.gc.stop_strings = None
        self.causal = causal
        # generate() fills settings left unset (None) in the config it is given from the model's
        # own generation_config: a max_length that generation_config_for cleared, or a beam-only
        # setting it dropped, would come back from there. The model carries exactly the settings
        # computed for this run instead.
        model.generation_config = copy.deepcopy(self.gc)
        self._once = OncePerRun()
        self.device = device
        self.seed = seed
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        self.pad_id = int(pad)
        if causal:
            self.pad_id = left_pad_id(self.gc, self.pad_id)
        self.n_return = int(generation_config.num_return_sequences or 1)
        self._cache_kwarg = cache_kwarg(model)
        # The shortcut rides on the beam cache; its row-count check runs only where both apply.
        self.shrink = beam_cache(model, self.gc) is not None and shrink.usable(model, self.gc, device)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def generate(self, batch_ids: Sequence[Sequence[int]], batch_index: int) -> BatchOutput:
        import torch

        width = max(len(ids) for ids in batch_ids)
        input_ids = torch.full((len(batch_ids), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch_ids), width), dtype=torch.long)
        for row, ids in enumerate(batch_ids):
            # A decoder-only model continues its prompt: padded on the left, every prompt ends
            # where generation starts (generate() derives the positions from the attention mask).
            at = slice(width - len(ids), width) if self.causal else slice(0, len(ids))
            input_ids[row, at] = torch.tensor(ids, dtype=torch.long)
            attention[row, at] = 1
        # Where each returned sequence's continuation starts: after the padded prompts, or after
        # an encoder-decoder's decoder start token.
        start = width if self.causal else 1
        # Seeded per batch, not per rank: sampling options then give the same text whichever
        # rank runs the batch, keeping outputs independent of the world size.
        torch.manual_seed(self.seed + batch_index)
        cache = beam_cache(self.model, self.gc)
        extra = {} if cache is None else {self._cache_kwarg: cache}
        if cache is not None and self.shrink:
            extra["custom_generate"] = shrink.shrinking_beam_search
        input_ids = input_ids.to(self.device, non_blocking=True)
        if self.stops is not None:
            # An encoder-decoder's criterion reads the decoder's tokens, never `input_ids` (the
            # encoder's): there is no padding of the sequence it reads to keep out.
            extra["stopping_criteria"] = (
                self.stops.generate_criteria(input_ids, [width - len(ids) for ids in batch_ids]) if self.causal
                else self.stops.generate_criteria())
        try:
            with torch.inference_mode(), self._once.on(logging.getLogger("transformers")), \
                    attention_backends(self.device):
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention.to(self.device, non_blocking=True),
                    generation_config=self.gc,
                    **extra,
                )
        except (ValueError, TypeError) as e:
            # GenerationConfig.validate() passes some values generate() then rejects (max_length 1,
            # temperature 0 with sampling, a string where a number belongs): one line, not a traceback.
            raise ConfigError(f"model.generate() rejected the generate options: {first_line(e)}") from e
        # One transfer per batch; everything after this is host-side.
        sequences = out.sequences.cpu()
        counts = generated_lengths(sequences, self.gc.eos_token_id, self.pad_id, start).tolist()
        # A row ends at its first end token: generate() fills the rest of a finished row (in a
        # batch, or among beams) with padding, which an end token that is not a special token
        # (--eos_token_id) would not hide from the decoded text.
        rows = [row[:end] for row, end in zip(sequences.tolist(), row_ends(sequences, self.gc.eos_token_id, start))]
        k = self.n_return
        if self.stops is not None:
            # Each row ends at the token the criterion stopped it on: generate() fills the rest with
            # padding, which may be the end token (counted) or a token that is not special (shown).
            # The criterion is asked of the sequence generate() would see for the prompt alone.
            seqs = [(list(batch_ids[i // k]) if self.causal else row[:start]) + row[start:] for i, row in enumerate(rows)]
            begins = [len(batch_ids[i // k]) if self.causal else start for i in range(len(rows))]
            for i, n in enumerate(self.stops.ends(seqs, begins)):
                if n is not None:
                    rows[i], counts[i] = rows[i][: start + n], n
        if self.causal or self.stops is not None:
            texts = self._continuations([row[start:] for row in rows])
        else:
            texts = [t.strip() for t in self.tokenizer.batch_decode(
                rows, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )]
        preds = [texts[i * k : (i + 1) * k] for i in range(len(batch_ids))]
        n_tokens = [sum(counts[i * k : (i + 1) * k]) for i in range(len(batch_ids))]
        scores = None
        if k > 1:
            seq_scores = getattr(out, "sequences_scores", None)
            if seq_scores is not None:
                flat = seq_scores.float().cpu().tolist()
                scores = [flat[i * k : (i + 1) * k] for i in range(len(batch_ids))]
        return BatchOutput(preds, scores, n_tokens)

    def _continuations(self, rows: list[list[int]]) -> list[str]:
        """Each continuation's prediction: cut by token position from its prompt, and before the
        first stop string its text shows."""
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        cut = self.stops.cut if self.stops is not None else (lambda t: t)
        return [cut(t).strip() for t in texts]


def left_pad_id(gc: Any, pad_id: int) -> int:
    """The token a decoder-only model's prompts are padded with on the left: its first end token.
    The attention mask hides padding from the model, but a setting that reads the whole row sees
    it (no_repeat_ngram_size's n-grams; repetition_penalty excludes it by the mask): a padding
    n-gram can only match the tail of a hypothesis that holds the end token, which has ended."""
    eos = gc.eos_token_id
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else pad_id
