"""Which kind of model a run evaluates, read once from the model's config.

An encoder-decoder model (BART, T5, Marian, ...) reads a source and generates a target; a
decoder-only model (Llama, Qwen2, Mistral, Gemma, Phi, ...) continues a prompt. The kind decides
how sources become token ids (inputs/prompts.py builds a decoder-only model's prompts), which
generation settings mean what (a decoder-only model's max_length counts the prompt:
model/generation.py) and how the HF engine pads a batch (engines/hf.py); everything else, from the
plan to the metrics, is the same for both.

The kind is transformers' own: a config of the auto classes' seq-to-seq mapping is encoder-decoder
(checked first: BART, Marian and others are in both mappings, and `from_pretrained` of their
published checkpoints gives the encoder-decoder); one of the causal-LM mapping is decoder-only when
the model is that mapping's class (config.json's `architectures`, or the class of a model object):
an encoder saved as such (BertModel) is in the causal-LM mapping too, for its LM-head variant.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError

SEQ2SEQ = "seq2seq"
CAUSAL = "causal"

_EXPECTED = ("expected an encoder-decoder model such as BART, T5, Marian, mBART or Pegasus, or a decoder-only "
             "language model such as Llama, Qwen2, Mistral, Gemma or Phi")


def kind_of(config: Any, architecture: str | None = None) -> str | None:
    """SEQ2SEQ, CAUSAL, or None for a model of neither kind; `architecture`: the class of a model
    object (else config.json's `architectures` say which class the model is)."""
    from transformers import PretrainedConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING

    if type(config) in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
        return SEQ2SEQ
    if type(config) is PretrainedConfig and getattr(config, "is_encoder_decoder", False):
        return SEQ2SEQ  # an already converted CTranslate2 folder's description (model/converted.py)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING or getattr(config, "is_encoder_decoder", False):
        return None
    names = [architecture] if architecture else list(getattr(config, "architectures", None) or [])
    return CAUSAL if MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].__name__ in names else None


def model_kind(config: Any, name: str, architecture: str | None = None) -> str:
    """The kind of the model `name` (see kind_of); ModelError for any other model."""
    kind = kind_of(config, architecture)
    if kind is None:
        what = f"a {config.model_type!r} model" if hasattr(config, "model_type") else type(config).__name__
        shown = architecture or ", ".join(getattr(config, "architectures", None) or []) or "no architecture named"
        raise ModelError(f"--model_name {name}: {what} ({shown}) is neither a seq2seq nor a causal language model; "
                         f"{_EXPECTED}")
    return kind
