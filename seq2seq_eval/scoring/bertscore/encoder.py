"""BERTScore's encoder as bert-score 0.3.13 runs it on transformers: its tokenizer calls
(`utils.sent_encode`), its model cut after the chosen layer (`utils.get_model`), and the
normalized token embeddings of many texts, computed in length-sorted forward passes of at most a
token budget each (bert-score's are 64 texts sorted by word count)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError, ModelError

HUGE = 10**9
"""A tokenizer's model_max_length at or above this is transformers' "no limit" placeholder."""

LIKE_LENGTHS = 0.9
"""A forward pass takes the texts after its longest down to this fraction of its length, so no
text in it is padded by more than a ninth of its own length: a pass's cost is its padded tokens,
and on CPU a pass of a few texts runs as fast per token as a full one."""


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        # use_fast=False, as bert-score's default (transformers 5 has one tokenizer class per model).
        tokenizer = AutoTokenizer.from_pretrained(name, use_fast=False)
    except (OSError, ValueError) as e:
        raise ModelError(f"--bertscore_model {name}: its tokenizer was not found ({type(e).__name__}); "
                         "expected a hub name (or its cached copy with HF_HUB_OFFLINE=1) or a local folder") from e
    if tokenizer.model_max_length >= HUGE:
        # bert-score truncates to it: without one, a long text would fail inside the model mid-run.
        raise ModelError(f"--bertscore_model {name}: its tokenizer sets no model_max_length, which bert-score "
                         "truncates texts to; set model_max_length in its tokenizer_config.json")
    return tokenizer


def token_ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """bert-score's `sent_encode` of each text: stripped, with the special tokens, truncated to
    model_max_length; RoBERTa's and GPT-2's tokenizers are asked for a prefix space (which
    transformers 5 leaves to the tokenizer's own setting, as it does for bert-score)."""
    from transformers import GPT2Tokenizer, RobertaTokenizer

    stripped = [t.strip() for t in texts]
    extra = {"add_prefix_space": True} if isinstance(tokenizer, (GPT2Tokenizer, RobertaTokenizer)) else {}
    present = [t for t in stripped if t]
    encoded = iter(tokenizer(present, add_special_tokens=True, max_length=tokenizer.model_max_length,
                             truncation=True, **extra)["input_ids"] if present else [])
    empty = _empty(tokenizer) if len(present) < len(stripped) else []
    return [list(next(encoded)) if t else list(empty) for t in stripped]


def _empty(tokenizer: Any) -> list[int]:
    # bert-score: build_inputs_with_special_tokens([]), the special tokens around no text, which
    # transformers 5 dropped (bert-score 0.3.13 fails there); the tokenizer gives the same ids.
    build = getattr(tokenizer, "build_inputs_with_special_tokens", None)
    return list(build([])) if build is not None else list(tokenizer("", add_special_tokens=True)["input_ids"])


def load_model(name: str, num_layers: int, device: Any) -> Any:
    """bert-score's get_model: the model (the encoder of an encoder-decoder one) with the layers
    above `num_layers` dropped, so the last hidden state is that layer's output."""
    import torch

    model = _from_pretrained(name)
    model.eval()
    if hasattr(model, "decoder") and hasattr(model, "encoder"):
        model = model.encoder
    owner, attr, count = _layers(model, name)
    if not 0 <= num_layers <= count:
        raise ConfigError(f"--bertscore_num_layers {num_layers}: {name} has {count} layers; expected 0 to {count}")
    if attr == "num_hidden_layers":  # ALBERT shares its layers: it runs config.num_hidden_layers of them
        owner.config.num_hidden_layers = num_layers
    elif attr == "n_layers":  # XLM
        model.n_layers = num_layers
    else:
        setattr(owner, attr, torch.nn.ModuleList(list(getattr(owner, attr))[:num_layers]))
    return model.to(device)


def _from_pretrained(name: str, **kwargs: Any) -> Any:
    """The model, its weights checked against its config: a tensor of another shape, or one the
    encoder has and the checkpoint has not (transformers would initialise it at random, with a
    warning, as bert-score lets it), is refused in one line. The pooler is not read (the hidden
    states are), so a checkpoint without it (saved from a masked-LM model) is taken."""
    from transformers import AutoModel, T5EncoderModel
    from transformers.utils import logging as hf_logging

    import pickle

    from ...pickles import refusal, refuse_code_in_model

    # transformers reads a pytorch_model.bin with weights_only=True; a file naming anything but
    # tensors is refused here in one line (the tool's rule for every pickle it reads).
    refuse_code_in_model(name)

    # transformers logs its load report (a table of keys) as a warning; what it finds is said
    # below in one line, or not at all where it does not matter (the pooler).
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, info = (T5EncoderModel if "t5" in name else AutoModel).from_pretrained(
            name, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelError(f"--bertscore_model {name}: the model was not found ({type(e).__name__}); expected a hub "
                         "name (or its cached copy with HF_HUB_OFFLINE=1) or a local folder") from e
    except pickle.UnpicklingError as e:  # transformers' weights_only=True refused a file fetched since the checks
        raise refusal(f"--bertscore_model {name}", e, "model checkpoints hold") from e
    except RuntimeError as e:  # the checkpoint's tensors could not be read or converted
        raise ModelError(f"--bertscore_model {name}: the weights were not loaded ({str(e).splitlines()[0]})") from e
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    mismatched = sorted(info.get("mismatched_keys") or ())
    missing = sorted(k for k in info.get("missing_keys") or () if not k.startswith("pooler."))
    if mismatched:
        key, *shapes = mismatched[0] if isinstance(mismatched[0], tuple) else (mismatched[0],)
        raise ModelError(f"--bertscore_model {name}: the weights do not fit its config.json ({key} has another shape"
                         f"{': ' + ' against '.join(str(list(x)) for x in shapes) if shapes else ''}; "
                         f"{len(mismatched)} tensor(s) in all)")
    if missing:
        raise ModelError(f"--bertscore_model {name}: the weights do not fit its config.json (missing {missing[:3]}"
                         f"{' ...' if len(missing) > 3 else ''}: they would be initialised at random)")
    return model


def check_model(name: str) -> None:
    """load_model's checks of the weights, before any work: the model built on the meta device
    (transformers reads the checkpoint's names and shapes; no values are loaded)."""
    try:
        import accelerate  # noqa: F401  transformers places a model on the meta device through it
    except ImportError:
        from ...pickles import refuse_code_in_model

        refuse_code_in_model(name)  # that much needs no model
        return  # load_model checks the same when it loads the model
    _from_pretrained(name, device_map="meta")


def _layers(model: Any, name: str) -> tuple[Any, str, int]:
    """(the module holding the layers, the attribute, how many), in get_model's order of tests."""
    if hasattr(model, "n_layers"):
        return model, "n_layers", int(model.n_layers)
    if hasattr(model, "layer"):  # XLNet
        return model, "layer", len(model.layer)
    if hasattr(model, "encoder"):
        encoder = model.encoder
        if hasattr(encoder, "albert_layer_groups"):
            return encoder, "num_hidden_layers", int(encoder.config.num_hidden_layers)
        if hasattr(encoder, "block"):  # T5
            return encoder, "block", len(encoder.block)
        return encoder, "layer", len(encoder.layer)  # BERT, RoBERTa, XLM-R, ELECTRA, DeBERTa, ...
    if hasattr(model, "transformer"):  # DistilBERT
        return model.transformer, "layer", len(model.transformer.layer)
    if hasattr(model, "layers"):  # BART's, mBART's, Pegasus' encoder
        return model, "layers", len(model.layers)
    raise ModelError(f"--bertscore_model {name}: {type(model).__name__} has none of the layer lists bert-score "
                     "cuts (encoder.layer, encoder.block, transformer.layer, layers, layer)")


def embed(model: Any, ids: Sequence[Sequence[int]], pad_id: int, max_tokens: int, device: Any) -> list[Any]:
    """Each text's token embeddings of the cut model's last layer, each row divided by its norm
    (as bert-score's greedy_cos_idf): the texts longest first, cut into forward passes of at
    most `max_tokens` padded tokens (a longer text alone) of like lengths (LIKE_LENGTHS)."""
    import torch

    order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
    out: list[Any] = [None] * len(ids)
    start = 0
    with torch.inference_mode():
        while start < len(order):
            width = len(ids[order[start]])
            stop = start + 1
            while (stop < len(order) and (stop + 1 - start) * width <= max_tokens
                   and len(ids[order[stop]]) >= LIKE_LENGTHS * width):
                stop += 1
            chunk = order[start:stop]
            input_ids = torch.tensor([list(ids[i]) + [pad_id] * (width - len(ids[i])) for i in chunk], device=device)
            mask = torch.tensor([[1] * len(ids[i]) + [0] * (width - len(ids[i])) for i in chunk], device=device)
            hidden = model(input_ids, attention_mask=mask)[0]
            hidden = hidden / torch.norm(hidden, dim=-1).unsqueeze(-1)
            for row, i in enumerate(chunk):
                out[i] = hidden[row, : len(ids[i])]
            start = stop
    return out
