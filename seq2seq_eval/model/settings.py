"""Model loading, the effective generation settings, tokenizing once, and generating a batch."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import EvalConfig, family_of
from ..errors import ConfigError, ModelError, first_line
from . import generation
from .converted import converted_model_config, is_converted_folder
from .generate_check import check_token_ids
from .generation import model_generation_config
from .kind import CAUSAL, SEQ2SEQ, kind_of, model_kind

logger = logging.getLogger("seq2seq_eval")


def _model_path(cfg: EvalConfig) -> str:
    """The --model_name to hand to from_pretrained. A hub name is "name" or "org/name"; anything
    else can only be meant as a local path, and a missing one is reported as such (rather than as
    a failed hub lookup)."""
    name = cfg.model_name
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith("/")
    path = os.path.expanduser(name)
    if looks_local and not os.path.exists(path):
        raise ModelError(f"--model_name {name}: no such path; expected a model folder or a hub model name")
    return path


def load_tokenizer(cfg: EvalConfig, given: Any = None) -> Any:
    """The run's tokenizer: loaded from --model_name, or `given` (a caller's tokenizer, copied
    before a language is set on it: the caller's own stays as it was)."""
    from transformers import AutoTokenizer

    if given is not None:
        tokenizer = copy.deepcopy(given) if cfg.src_lang is not None or cfg.tgt_lang is not None else given
    else:
        source, flag = (cfg.tokenizer_name, "--tokenizer_name") if cfg.tokenizer_name else (_model_path(cfg), "--model_name")
        try:
            tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(source))
        except (OSError, ValueError, KeyError) as e:
            hint = ""
            if flag == "--model_name" and _converted_folder(cfg):
                hint = ("; it is a CTranslate2 model folder without the Hugging Face tokenizer: pass --tokenizer_name "
                        "(the model it was converted from)")
            raise ModelError(f"{flag} {source}: cannot load a tokenizer ({first_line(e)}){hint}") from e
    if cfg.src_lang is not None:
        _set_lang(tokenizer, "src_lang", cfg.src_lang)
    if cfg.tgt_lang is not None:
        _set_lang(tokenizer, "tgt_lang", cfg.tgt_lang)
    return tokenizer


def _set_lang(tokenizer: Any, attr: str, code: str) -> None:
    if not hasattr(tokenizer, attr):
        raise ConfigError(f"--{attr} {code}: tokenizer {type(tokenizer).__name__} has no language setting")
    # Checked first: mBART-50's and NLLB's setters accept any string and would silently prefix
    # every source with <unk> instead of a language code.
    lang_token_id(tokenizer, code, f"--{attr}")
    try:
        setattr(tokenizer, attr, code)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"--{attr} {code}: not a language code of {type(tokenizer).__name__}") from e


def forced_bos_token_id(tokenizer: Any, tgt_lang: str) -> int:
    """The target language's token id: the first token every generated sequence must carry."""
    return lang_token_id(tokenizer, tgt_lang, "--tgt_lang")


def lang_token_id(tokenizer: Any, code: str, flag: str) -> int:
    """A language code's token id, by the conventions of M2M100 (get_lang_id: "ro" is the token
    "__ro__") and of mBART-50/NLLB (the code is itself a token: "ro_RO", "ron_Latn")."""
    if hasattr(tokenizer, "get_lang_id"):
        try:
            return int(tokenizer.get_lang_id(code))
        except KeyError as e:
            raise ConfigError(f"{flag} {code}: not a language code of {type(tokenizer).__name__}{_known_langs(tokenizer)}") from e
    token_id = tokenizer.convert_tokens_to_ids(code)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ConfigError(f"{flag} {code}: not a language code of {type(tokenizer).__name__}{_known_langs(tokenizer)}")
    return int(token_id)


def _known_langs(tokenizer: Any, shown: int = 6) -> str:
    codes = list(getattr(tokenizer, "lang_code_to_id", None) or [])
    if not codes:  # NLLB keeps its codes only as special tokens
        standard = {str(t) for t in (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token,
                                     tokenizer.pad_token, getattr(tokenizer, "mask_token", None)) if t}
        codes = [t for t in tokenizer.all_special_tokens if t not in standard]
    if not codes:
        return ""
    more = f", ... ({len(codes)} in all)" if len(codes) > shown else ""
    return f"; expected one of {', '.join(codes[:shown])}{more}"


def _converted_folder(cfg: EvalConfig) -> bool:
    return is_converted_folder(cfg.model_name)


def load_model_config(cfg: EvalConfig, tokenizer: Any = None) -> tuple[Any, Any]:
    """The model's config and its base generation config (as from_pretrained gives the model:
    model/generation.py), without loading any weights: enough to validate a run (--dry_run) and to
    compute the exact settings the real run will use. A model of neither kind (model/kind.py) is
    refused here. `tokenizer`: the run's, already loaded (a converted folder's config is read
    with it; else it is loaded here)."""
    from transformers import AutoConfig

    name = _model_path(cfg)
    if _converted_folder(cfg):
        if cfg.engine != "ctranslate2":
            raise ModelError(f"--model_name {cfg.model_name}: a CTranslate2 model folder; run it with --engine ctranslate2")

        return converted_model_config(name, cfg.tokenizer_name, tokenizer if tokenizer is not None else load_tokenizer(cfg))
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"--model_name {cfg.model_name}: cannot load a model config ({first_line(e)})") from e
    model_kind(config, cfg.model_name)
    # The weights from_pretrained will read, when pickled: nothing but tensors (seq2seq_eval/pickles.py).
    from ..pickles import refuse_code_in_model

    refuse_code_in_model(name)
    return config, model_generation_config(name)


def model_config_of(model: Any, name: str) -> tuple[Any, Any]:
    """load_model_config for a model already in memory: its config and a copy of its own
    generation config (what save_pretrained would write beside its weights)."""
    from transformers import GenerationConfig

    config = getattr(model, "config", None)
    if config is None or kind_of(config, type(model).__name__) is None or not hasattr(model, "generate"):
        what = f"a {config.model_type!r} model" if config is not None and hasattr(config, "model_type") else type(model).__name__
        raise ModelError(f"model {name}: {what} is neither a seq2seq nor a causal language model with generate(); "
                         "expected an encoder-decoder model such as BART, T5, Marian, mBART or Pegasus, or a "
                         "decoder-only one such as Llama, Qwen2, Mistral, Gemma or Phi")
    if kind_of(config) is None:
        # A decoder-only model built in memory has no `architectures` in its config: its class
        # says what it is, on a copy (the caller's model is left as it was).
        config = copy.deepcopy(config)
        config.architectures = [type(model).__name__]
    own = getattr(model, "generation_config", None)  # what generate() would read: the object's own
    base = copy.deepcopy(own) if own is not None else GenerationConfig.from_model_config(config)
    return config, base


def load_model(cfg: EvalConfig, device: Any, kind: str = SEQ2SEQ) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    name = os.path.expanduser(cfg.model_name)
    auto = AutoModelForCausalLM if kind == CAUSAL else AutoModelForSeq2SeqLM
    import pickle

    from ..pickles import refusal

    try:
        model = auto.from_pretrained(name)
    except pickle.UnpicklingError as e:  # transformers' weights_only=True refused a file fetched since the checks
        raise refusal(f"--model_name {cfg.model_name}", e, "model checkpoints hold") from e
    except (OSError, ValueError) as e:
        raise ModelError(f"--model_name {cfg.model_name}: cannot load the model ({first_line(e)})") from e
    if cfg.fp16:
        model = model.to(torch.float16)
    elif cfg.bf16:
        model = model.to(torch.bfloat16)
    return model.to(device).eval()


@dataclass(frozen=True)
class TaskEntry:
    """The model's task_specific_params entry a run applies, or none."""

    name: str | None
    """The key used (translation_en_to_de), or None when no entry applies."""
    params: dict[str, Any]
    """The entry as published (prefix, beams, lengths, ...); empty when none applies."""
    note: str = ""
    """Why no entry applies although the model has entries of the task's family, for the log."""


def task_entry(model_config: Any, task: str) -> TaskEntry:
    """Which task_specific_params entry `--task` selects, by the legacy scripts' rule (an entry
    whose key equals the task name) made safe for the plain family names:

    - a key equal to the task name: that entry (translation_en_to_de, summarization);
    - the plain family name (translation) and one entry of that family: that entry; several: an
      error naming them, since applying none of them would silently evaluate without the prefix
      and beams the model expects (T5 ships translation_en_to_de, _fr and _ro);
    - another name (translation_de_to_en): the model's plain family entry if it has one, else
      none; the note says which entries of the family the model does have.
    """
    tsp = getattr(model_config, "task_specific_params", None) or {}
    if task in tsp:
        return TaskEntry(task, dict(tsp[task]))
    family = family_of(task)
    same_family = sorted(k for k in tsp if family_of(k) == family)
    if task == family:
        if len(same_family) == 1:
            return TaskEntry(same_family[0], dict(tsp[same_family[0]]))
        if same_family:
            raise ConfigError(
                f"--task {task}: the model has several {family} settings in its task_specific_params "
                f"({', '.join(same_family)}) and none named {task!r}; pass one of them as --task"
            )
        return TaskEntry(None, {})
    if family in tsp:
        return TaskEntry(family, dict(tsp[family]))
    note = f"the model's task_specific_params has {', '.join(same_family)} but no {task!r}" if same_family else ""
    return TaskEntry(None, {}, note)


def task_params(model_config: Any, task: str) -> dict[str, Any]:
    """The model config's task_specific_params entry that `task` selects (see task_entry)."""
    return task_entry(model_config, task).params


def generation_config_for(model_config: Any, base: Any, tokenizer: Any, cfg: EvalConfig) -> Any:
    """The effective generation settings: what model.generate() would use on the model. The
    model's own (`base`), then its task-specific parameters, then the user's flags; every value
    and the values together checked, for every engine (model/generation.py); then every field
    generate() fills in when unset made explicit. Unknown user flags are errors, not silently
    ignored."""
    from transformers import GenerationConfig

    known = set(GenerationConfig().to_dict())
    user = cfg.gen_kwargs
    unknown = sorted(set(user) - known)
    if unknown:
        raise ConfigError(
            f"unknown generate option --{unknown[0]}; expected a model.generate() setting "
            "such as --num_beams, --max_length, --max_new_tokens, --length_penalty, --no_repeat_ngram_size"
        )
    check_token_ids(user, model_config, tokenizer)
    gc = copy.deepcopy(base)
    for key, value in task_params(model_config, cfg.task).items():
        if key in known:
            setattr(gc, key, value)
    for key, value in user.items():
        setattr(gc, key, value)
    # A limit of one kind from the user replaces the other kind from the model or its task entry
    # (--max_new_tokens 24 over a task entry's max_length 300): generate() would use the user's
    # anyway, after warning on every batch that both are set.
    for mine, other in (("max_new_tokens", "max_length"), ("max_length", "max_new_tokens"),
                        ("min_new_tokens", "min_length"), ("min_length", "min_new_tokens")):
        if user.get(mine) is not None and other not in user:
            setattr(gc, other, None)
    if "num_beams" not in user and not gc.do_sample and (gc.num_beams or 1) < cfg.num_return_sequences:
        gc.num_beams = cfg.num_return_sequences
    # Sampling draws each candidate independently; beam search returns at most num_beams of them.
    if not gc.do_sample and (gc.num_beams or 1) < cfg.num_return_sequences:
        raise ConfigError(
            f"--num_return_sequences ({cfg.num_return_sequences}) must not exceed num_beams ({gc.num_beams}) "
            "with beam search; raise --num_beams or sample with --do_sample true"
        )
    gc.num_return_sequences = cfg.num_return_sequences
    if cfg.tgt_lang is not None and getattr(model_config, "model_type", "") != "t5":
        gc.forced_bos_token_id = forced_bos_token_id(tokenizer, cfg.tgt_lang)
    dropped = generation.drop_inapplicable(gc, user)
    if dropped:
        mode = "sampling" if gc.do_sample else "greedy decoding" if (gc.num_beams or 1) == 1 else "beam search"
        logger.info("%s: ignoring the model's settings that do not apply: %s", mode, ", ".join(dropped))
    generation.check_values(gc, user)
    try:
        gc.validate(strict=True)
    except (ValueError, TypeError, AttributeError) as e:  # a value of another kind: not a traceback
        raise ConfigError(f"invalid generate options: {generation.validation_reason(e)}") from e
    model_set = {k for k, v in gc.to_dict().items() if v is not None}
    gc = generation.effective(gc, model_config)
    causal = kind_of(model_config) == CAUSAL
    if causal:
        generation.check_causal(gc, user, model_set)
    generation.check_stop_strings(gc, tokenizer, user, model_set)
    generation.check_together(gc, user, model_set, causal)
    return gc


def source_prefix(model_config: Any, cfg: EvalConfig) -> str:
    if cfg.prefix is not None:
        return cfg.prefix
    return task_params(model_config, cfg.task).get("prefix") or getattr(model_config, "prefix", None) or ""


# Tokenizers without a length limit report this sentinel (transformers' VERY_LARGE_INTEGER).
_NO_LIMIT = int(1e20)


def source_limit(model_config: Any, tokenizer: Any, cfg: EvalConfig) -> int | None:
    """The source truncation length: --max_source_length, else the model's own limit, as the
    legacy scripts truncate at the tokenizer's model_max_length. A learned or sinusoidal
    position table (max_position_embeddings) is a hard limit: a longer source fails mid-run with
    an IndexError, so a larger explicit value is refused here, before any work."""
    hard = _positions(model_config)
    if cfg.max_source_length is not None:
        if hard is not None and cfg.max_source_length > hard:
            raise ConfigError(
                f"--max_source_length {cfg.max_source_length} exceeds the model's {hard} positions "
                f"(max_position_embeddings of {cfg.model_name}); expected at most {hard}"
            )
        return cfg.max_source_length
    return model_limit(model_config, tokenizer)


def _positions(model_config: Any) -> int | None:
    hard = getattr(model_config, "max_position_embeddings", None)
    return hard if isinstance(hard, int) and hard > 0 else None


def model_limit(model_config: Any, tokenizer: Any) -> int | None:
    """The model's own input limit: the tokenizer's model_max_length or the config's
    max_position_embeddings, whichever is lower; None when neither states one."""
    soft = getattr(tokenizer, "model_max_length", None)
    soft = soft if isinstance(soft, int) and 0 < soft < _NO_LIMIT else None
    limits = [v for v in (soft, _positions(model_config)) if v is not None]
    return min(limits) if limits else None


def encode_texts(tokenizer: Any, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids of whole texts (no truncation): with the tokenizer's special tokens added, or
    without (a chat template's text, which writes its own)."""
    return _encode(tokenizer, texts, None, add_special_tokens)


def _encode(tokenizer: Any, texts: list[str], max_length: int | None, add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of `texts`, as `tokenizer(texts, truncation=..., max_length=...)` gives them.

    A fast tokenizer's __call__ configures its Rust backend (truncation, no padding) and calls
    its encode_batch, then converts every encoding to Python objects it does not need here
    (attention masks, offsets...): a third of the tokenizing time of a large run. The backend is
    configured and called the same way directly; slow tokenizers take the ordinary call."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    encode = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)
    if encode is None:
        kwargs = {"truncation": True, "max_length": max_length} if max_length is not None else {"truncation": False}
        return [list(x) for x in tokenizer(texts, add_special_tokens=add_special_tokens, **kwargs)["input_ids"]]
    old_truncation, old_padding = backend.truncation, backend.padding
    try:
        if max_length is None:
            backend.no_truncation()
        else:
            backend.enable_truncation(max_length, stride=0, strategy="longest_first",
                                      direction=getattr(tokenizer, "truncation_side", "right"))
        backend.no_padding()
        return [e.ids for e in encode(texts, add_special_tokens=add_special_tokens)]
    finally:
        # Leave the tokenizer as it was: it is used again (decoding, other callers).
        if old_truncation is None:
            backend.no_truncation()
        else:
            backend.enable_truncation(**old_truncation)
        if old_padding is not None:
            backend.enable_padding(**old_padding)


def encode_sources(
    tokenizer: Any, sources: Sequence[str], prefix: str, max_source_length: int | None
) -> tuple[list[list[int]], int]:
    """Tokenize every source once, unpadded; batches are padded from these ids later. Returns
    the ids and how many sources were truncated. Tokenizing to one token more than the limit
    tells exactly which sources are longer; only those are tokenized again at the limit, so the
    truncated ids are the tokenizer's own (its special tokens kept at the end)."""
    texts = [prefix + s for s in sources]
    if max_source_length is None:
        return _encode(tokenizer, texts, None), 0
    ids = _encode(tokenizer, texts, max_source_length + 1)
    long = [i for i, x in enumerate(ids) if len(x) > max_source_length]
    if long:
        again = _encode(tokenizer, [texts[i] for i in long], max_source_length)
        for i, x in zip(long, again):
            ids[i] = x
    return ids, len(long)
