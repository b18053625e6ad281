"""The CTranslate2 engine: the model converted once into a cache, then `Translator.translate_batch`
on each planned batch.

Conversion goes through CTranslate2's own `TransformersConverter`, configured where checkpoints
saved by transformers 5 trip it (see `_Converter` and `_MarianLoader`). The converted model is
cached by what decides its weights (the model's files, the CTranslate2 version and this module's
converter revision), so a resume, a torchrun restart and later runs load it instead of converting
again. It is written under a lock into a temporary folder that is renamed into place: two ranks,
two runs, or a crash in the middle never leave half a model where a reader would find it. The
compute type is applied when the model is loaded, so one conversion serves every compute type;
it is part of the run's manifest, so a resume under another compute type is refused.

Generation settings are taken from the same effective `GenerationConfig` the HF engine uses
(model defaults, task entry, user flags) and mapped one by one (`translate_options`). A setting
with no CTranslate2 counterpart is an error naming it, raised before any work (`check`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import ConfigError, ModelError, RunStateError, first_line
from .base import BatchOutput

logger = logging.getLogger("seq2seq_eval")

INSTALL_HINT = 'pip install -e ".[ctranslate2]" (or pip install ctranslate2)'
CONVERTER_REVISION = 1
"""Bumped whenever `_Converter` or the loaders of `_register_loaders` change what a conversion produces."""
LOCK_POLL_S = 0.5


def _ctranslate2() -> Any:
    # CTranslate2 spreads each op over intra_threads itself; MKL's own threads on top of that
    # oversubscribe the cores on small matrices (the embedded model on 2 cores: 38 samples/s with
    # them, 183 without; an opus-mt-size model: 8% faster with them). Read when MKL starts, so
    # set before the import; a user's own setting stands.
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    try:
        import ctranslate2
    except ImportError as e:
        raise ConfigError(f"--engine ctranslate2 needs the ctranslate2 package, which is not installed; "
                          f"install it with: {INSTALL_HINT}") from e
    return ctranslate2


def describe(cfg: EvalConfig) -> dict[str, Any]:
    return {"name": "ctranslate2", "compute_type": cfg.compute_type, "ctranslate2": _ctranslate2().__version__}


# ---------------------------------------------------------------- generation settings

# GenerationConfig fields that do not change what is generated, or that the mapping below reads.
_NOT_GENERATION = {
    "transformers_version", "_from_model_config", "use_cache", "cache_implementation", "cache_config",
    "return_dict_in_generate", "output_scores", "output_logits", "output_attentions", "output_hidden_states",
    "pad_token_id", "bos_token_id", "decoder_start_token_id", "low_memory", "remove_invalid_values",
    "is_assistant", "compile_config", "disable_compile",
}
_MAPPED = {
    "num_beams", "length_penalty", "max_length", "max_new_tokens", "min_length", "min_new_tokens",
    "no_repeat_ngram_size", "repetition_penalty", "num_return_sequences", "do_sample", "top_k", "top_p",
    "temperature", "forced_bos_token_id", "forced_eos_token_id", "eos_token_id", "bad_words_ids",
    "suppress_tokens", "early_stopping",
}


def _unsupported(gc: Any) -> list[tuple[str, str]]:
    """(setting, description) for each setting of `gc` that differs from GenerationConfig's
    defaults and has no CTranslate2 counterpart, and for each combination it cannot run."""
    diff = {k: v for k, v in gc.to_diff_dict().items() if k not in _NOT_GENERATION}
    bad = [(k, f"{k}={v!r}") for k, v in sorted(diff.items()) if k not in _MAPPED]
    if gc.early_stopping == "never":
        bad.append(("early_stopping", "early_stopping='never' (CTranslate2's beam search stops once num_beams "
                                      "hypotheses are finished)"))
    if gc.do_sample and (gc.num_beams or 1) > 1:
        bad.append(("do_sample", f"do_sample=True with num_beams={gc.num_beams} (CTranslate2 samples with one beam)"))
    return bad


def check(cfg: EvalConfig, model_config: Any, gc: Any, tokenizer: Any) -> None:
    """Refuse, before any work, a run whose settings this engine cannot honour, naming where the
    first one came from: the user's flag, or the model's own settings (which a flag overrides)."""
    _ctranslate2()
    bad = _unsupported(gc)
    if not bad:
        return
    key, text = bad[0]
    where = (f"set by --{key}" if key in cfg.gen_kwargs
             else f"from the model's generation config or task settings; override it with --{key}")
    more = f" (and {len(bad) - 1} more: {', '.join(t for _, t in bad[1:])})" if len(bad) > 1 else ""
    raise ConfigError(f"--engine ctranslate2 cannot honour the generation setting {text} ({where}){more}; "
                      "use --engine hf for it")


def _ids(value: Any) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


@dataclass(frozen=True)
class Mapping:
    """`translate_batch` keyword arguments for one run, and what is done after it."""

    options: dict[str, Any]
    prefix_token: str | None  # forced first token (target language), given as a target prefix
    forced_eos: int | None  # forced_eos_token_id: a hypothesis cut by the length limit ends with it
    eos_ids: tuple[int, ...]
    sampling: bool


def translate_options(gc: Any, tokenizer: Any) -> Mapping:
    """How each generation setting of `gc` is passed to CTranslate2. Lengths: transformers'
    max_length/min_length of an encoder-decoder model count the decoder start token, CTranslate2's
    decoding lengths count generated tokens only (the end token included), as max_new_tokens and
    min_new_tokens do."""
    n = int(gc.num_return_sequences or 1)
    options: dict[str, Any] = {
        "beam_size": int(gc.num_beams or 1),
        "num_hypotheses": n,
        "return_scores": True,
        "return_end_token": True,  # tells a finished hypothesis from one cut by the length limit
        "max_input_length": 0,  # sources are already truncated at the model's limit; 0: no cut
        "length_penalty": float(gc.length_penalty if gc.length_penalty is not None else 1.0),
        "repetition_penalty": float(gc.repetition_penalty or 1.0),
        "no_repeat_ngram_size": int(gc.no_repeat_ngram_size or 0),
        "max_batch_size": 0,  # the plan's batch is the batch
    }
    if gc.max_new_tokens is not None:
        options["max_decoding_length"] = int(gc.max_new_tokens)
    elif gc.max_length is not None:
        options["max_decoding_length"] = max(1, int(gc.max_length) - 1)
    if gc.min_new_tokens is not None:
        options["min_decoding_length"] = int(gc.min_new_tokens)
    elif gc.min_length:
        options["min_decoding_length"] = max(0, int(gc.min_length) - 1)
    eos = _ids(gc.eos_token_id)
    if eos:
        options["end_token"] = tokenizer.convert_ids_to_tokens(eos)
    suppress = [list(seq) for seq in (gc.bad_words_ids or [])] + [[t] for t in _ids(gc.suppress_tokens)]
    if suppress:
        options["suppress_sequences"] = [tokenizer.convert_ids_to_tokens(seq) for seq in suppress]
    if gc.do_sample:
        # transformers' top_k=0 and CTranslate2's sampling_topk=0 both mean "no limit".
        options.update(sampling_topk=int(gc.top_k if gc.top_k is not None else 0),
                       sampling_topp=float(gc.top_p if gc.top_p is not None else 1.0),
                       sampling_temperature=float(gc.temperature if gc.temperature is not None else 1.0))
    prefix = None if gc.forced_bos_token_id is None else tokenizer.convert_ids_to_tokens(int(gc.forced_bos_token_id))
    forced_eos = _ids(gc.forced_eos_token_id)
    return Mapping(options, prefix, forced_eos[0] if forced_eos else None, tuple(eos), bool(gc.do_sample))


# ---------------------------------------------------------------- conversion


def cache_root() -> Path:
    """Where converted models are kept: $SEQ2SEQ_EVAL_CACHE, else $XDG_CACHE_HOME/seq2seq_eval,
    else ~/.cache/seq2seq_eval. Runs share it; on a multi-node job each node may convert its own."""
    explicit = os.environ.get("SEQ2SEQ_EVAL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "seq2seq_eval"


def _files_digest(folder: Path) -> str:
    """Every regular file of a model folder, by name and content: weights, config and tokenizer."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def conversion_key(model_name: str, model_config: Any) -> str:
    ct2 = _ctranslate2()
    path = Path(os.path.expanduser(model_name))
    source = (["files", _files_digest(path)] if path.is_dir()
              else ["hub", model_name, getattr(model_config, "_commit_hash", None)])
    payload = json.dumps([source, ct2.__version__, CONVERTER_REVISION])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _fill_legacy_config(model: Any) -> None:
    """CTranslate2's BART-family loaders read `normalize_before` (pre- or post-layer-norm) and
    `normalize_embedding` from the config: keys of the original fairseq configs that transformers
    4 kept from config.json and transformers 5 drops. The module tree says which it is: a final
    encoder `layer_norm` exists only in pre-norm models (mBART, Pegasus, M2M100), a
    `layernorm_embedding` only where embeddings are normalised (BART, mBART)."""
    config = model.config
    encoder = getattr(getattr(model, "model", None), "encoder", None)
    if encoder is None:
        return
    if not hasattr(config, "normalize_before"):
        config.normalize_before = hasattr(encoder, "layer_norm") and encoder.layer_norm is not None
    if not hasattr(config, "normalize_embedding"):
        config.normalize_embedding = getattr(encoder, "layernorm_embedding", None) is not None


def _converter_class() -> type:
    from ctranslate2.converters import TransformersConverter

    class _Converter(TransformersConverter):
        def load_model(self, model_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            _fill_legacy_config(model)
            return model

        def load_tokenizer(self, tokenizer_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            tokenizer = super().load_tokenizer(tokenizer_class, model_name_or_path, **kwargs)
            if tokenizer.bos_token is None:
                # The converted config.json would say "bos_token": null, which Translator refuses
                # to load. A seq2seq decoder starts from decoder_start_token, not from BOS: any
                # token of the vocabulary works, and the end token is one every model has.
                tokenizer.bos_token = tokenizer.eos_token
            return tokenizer

    _register_loaders()
    return _Converter


_LOADERS_REGISTERED = False


def _register_loaders() -> None:
    """Replace CTranslate2's Marian and M2M100 loaders by subclasses, registered through the
    converter's public `register_loader`. Each converts exactly as the original wherever the
    original is right, so registering them for every conversion in this process is safe."""
    global _LOADERS_REGISTERED
    if _LOADERS_REGISTERED:
        return
    from ctranslate2.converters.transformers import BartLoader, M2M100Loader, MarianMTLoader, register_loader

    @register_loader("MarianConfig")
    class _MarianLoader(MarianMTLoader):
        """CTranslate2's Marian loader assumes the Marian-NMT convention: the padding token is
        the last vocabulary entry, its embedding is zero, and the decoder starts from it. It then
        drops that row and starts the decoder from a zero vector. A model trained with
        transformers may put the padding token anywhere (the embedded model has it at id 0) and
        train its embedding: dropping the last row then removes a real word and starting from
        zero changes every output. For such a model every row is kept and the decoder starts from
        the embedding of the model's own decoder_start_token_id, as `generate()` does."""

        @staticmethod
        def _marian_convention(model: Any) -> bool:
            config = model.config
            pad, start = config.pad_token_id, config.decoder_start_token_id
            weight = model.get_input_embeddings().weight
            return (pad is not None and pad == weight.shape[0] - 1 and start == pad
                    and not bool(weight[pad].abs().sum()))

        def get_model_spec(self, model: Any) -> Any:
            self._keep_all = not self._marian_convention(model)
            if not self._keep_all:
                return super().get_model_spec(model)
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return BartLoader.get_model_spec(self, model)

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            super().set_config(config, model, tokenizer)
            if self._keep_all:
                config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)
            if getattr(config, "bos_token", None) is None:
                config.bos_token = tokenizer.eos_token  # see _Converter.load_tokenizer

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            if not self._keep_all:
                return super().set_decoder(spec, decoder)
            BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            if not self._keep_all:
                return super().get_vocabulary(model, tokenizer)
            return BartLoader.get_vocabulary(self, model, tokenizer)

    @register_loader("M2M100Config")
    class _M2M100Loader(M2M100Loader):
        """CTranslate2's M2M100 loader completes the vocabulary with the tokenizer's language
        tokens and `num_madeup_words` filler words, sized for the published checkpoints. A model
        whose embedding table is smaller than that (one trained or resized with transformers)
        has no rows for the extra fillers: they are left out, as many as the table lacks."""

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            tokens = super().get_vocabulary(model, tokenizer)
            size = model.get_input_embeddings().weight.shape[0]
            while len(tokens) > size and tokens[-1].startswith("madeupword"):
                tokens.pop()
            return tokens

    _LOADERS_REGISTERED = True


def converted_model(model_name: str, model_config: Any, timeout_s: float) -> Path:
    """The cached conversion of `model_name`, converting it first if no process has yet. One
    process converts (the others wait on its lock); the result appears by one rename."""
    root = cache_root() / "ctranslate2"
    key = conversion_key(model_name, model_config)
    final = root / key
    if (final / "model.bin").is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(root / f"{key}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        raise RunStateError(f"{root}: cannot write the CTranslate2 model cache ({e.strerror}); "
                            "set SEQ2SEQ_EVAL_CACHE to a writable folder") from e
    try:
        _lock(lock_fd, root / f"{key}.lock", timeout_s)
        if (final / "model.bin").is_file():  # converted while this process waited
            return final
        # Whatever a crashed conversion left: no other process holds the lock, so none is using it.
        for stale in root.glob(f"{key}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = root / f"{key}.tmp-{os.getpid()}"
        t0 = time.perf_counter()
        logger.info("converting %s for CTranslate2 into %s", model_name, final)
        try:
            _converter_class()(os.path.expanduser(model_name)).convert(str(work), force=True)
        except (ValueError, NotImplementedError, AttributeError, KeyError, OSError, RuntimeError) as e:
            shutil.rmtree(work, ignore_errors=True)
            raise ModelError(f"--model_name {model_name}: CTranslate2 cannot convert this model "
                             f"({type(e).__name__}: {first_line(e)}); use --engine hf") from e
        # The folder is complete before it gets the name readers look for.
        os.replace(work, final)
        logger.info("converted in %.1f s", time.perf_counter() - t0)
        return final
    finally:
        os.close(lock_fd)  # releases the lock


def _lock(fd: int, path: Path, timeout_s: float) -> None:
    """Wait for the conversion lock. Polled rather than blocking, so that a conversion that hangs
    on another process becomes an error after --sync_timeout instead of a silent wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RunStateError(f"{path}: another process has been converting this model for more "
                                    f"than --sync_timeout {timeout_s:g} s; expected it to finish") from None
            time.sleep(LOCK_POLL_S)


# ---------------------------------------------------------------- the engine


def cpu_threads(local_world_size: int) -> int:
    """Threads for one rank on CPU: OMP_NUM_THREADS when set (torchrun sets 1 for several ranks a
    node), else this process's cores split between the node's ranks, so that ranks sharing a
    machine do not oversubscribe it."""
    explicit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


class CT2Engine:
    name = "ctranslate2"

    def __init__(self, translator: Any, tokenizer: Any, mapping: Mapping, compute_type: str, seed: int,
                 model_path: Path, translator_kwargs: dict[str, Any]) -> None:
        self.translator = translator
        self.tokenizer = tokenizer
        self.mapping = mapping
        self.compute_type = compute_type
        self.seed = seed
        self.model_path = model_path
        self.translator_kwargs = translator_kwargs

    @classmethod
    def load(cls, cfg: EvalConfig, *, tokenizer: Any, model_config: Any, generation_config: Any, device: Any,
             env: Any) -> "CT2Engine":
        ct2 = _ctranslate2()
        from ..model.converted import is_converted_folder

        path = (Path(os.path.expanduser(cfg.model_name)) if is_converted_folder(cfg.model_name)
                else converted_model(cfg.model_name, model_config, cfg.sync_timeout))
        kwargs: dict[str, Any] = {"compute_type": cfg.compute_type, "inter_threads": 1}
        if device.type == "cuda":
            kwargs.update(device="cuda", device_index=device.index or 0)
        else:
            kwargs.update(device="cpu", intra_threads=cpu_threads(getattr(env, "local_world_size", 1) or 1))
        try:
            translator = ct2.Translator(str(path), **kwargs)
        except (ValueError, RuntimeError) as e:
            raise ModelError(f"{path}: CTranslate2 cannot load this model with --compute_type {cfg.compute_type} "
                             f"on {device.type} ({first_line(e)})") from e
        logger.info("CTranslate2 %s on %s, compute type %s, %s", ct2.__version__, device, translator.compute_type,
                    f"{kwargs.get('intra_threads')} thread(s)" if device.type == "cpu" else f"device {device.index or 0}")
        return cls(translator, tokenizer, translate_options(generation_config, tokenizer), cfg.compute_type,
                   cfg.seed, path, kwargs)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "compute_type": self.compute_type}

    def generate(self, batch_ids: Sequence[Sequence[int]], batch_index: int) -> BatchOutput:
        import ctranslate2

        m = self.mapping
        source = [self.tokenizer.convert_ids_to_tokens(list(ids)) for ids in batch_ids]
        prefix = [[m.prefix_token] for _ in batch_ids] if m.prefix_token is not None else None
        translator = self.translator
        if m.sampling:
            # Seeded per batch, not per rank, so that a batch samples the same text on any rank and
            # after a resume. CTranslate2 draws from a generator per thread, seeded from the global
            # seed when the thread first samples: reseeding reaches only a thread that has not yet
            # sampled. A fresh translator brings fresh worker threads; loading it again from the
            # converted folder costs milliseconds for small models, about 0.3 s at opus-mt size.
            ctranslate2.set_random_seed(self.seed + batch_index)
            translator = ctranslate2.Translator(str(self.model_path), **self.translator_kwargs)
        try:
            results = translator.translate_batch(source, target_prefix=prefix, **m.options)
        except ValueError as e:
            raise ConfigError(f"CTranslate2 rejected the generate options: {first_line(e)}") from e
        finally:
            if translator is not self.translator:
                del translator  # its threads and weights go now, not at the next batch
        limit = m.options.get("max_decoding_length")
        preds, scores, n_tokens = [], [], []
        for result in results:
            texts, counts = [], 0
            for tokens in result.hypotheses:
                ids = self.tokenizer.convert_tokens_to_ids(tokens)
                if (m.forced_eos is not None and limit is not None and len(ids) >= limit
                        and not (ids and ids[-1] in m.eos_ids)):
                    # generate() makes the last token at the length limit the forced EOS; the
                    # words it would have written there are dropped the same way.
                    ids = ids[:-1] + [m.forced_eos]
                counts += len(ids)
                texts.append(self.tokenizer.decode(ids, skip_special_tokens=True,
                                                   clean_up_tokenization_spaces=False).strip())
            preds.append(texts)
            scores.append([float(s) for s in result.scores])
            n_tokens.append(counts)
        return BatchOutput(preds, scores if m.options["num_hypotheses"] > 1 else None, n_tokens)
