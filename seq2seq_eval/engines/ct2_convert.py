"""Converting a Hugging Face model for CTranslate2, once, into a cache that later runs reuse.

Conversion goes through CTranslate2's own `TransformersConverter`, configured where checkpoints
saved by transformers 5 trip it (`_fill_legacy_config`, and the loaders `_register_loaders`
registers for Marian and M2M100). The converted model is cached by what decides its weights (the
model's files or hub revision, the CTranslate2 version and CONVERTER_REVISION), so a resume, a
torchrun restart and later runs load it instead of converting again. It is written under a lock
into a temporary folder that is renamed into place: two ranks, two runs, or a crash in the middle
never leave half a model where a reader would find it. The compute type is applied when the model
is loaded (engines/ct2.py), so one conversion serves every compute type.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelError, RunStateError, first_line
from ..model.identity import cache_root, file_sha256, files_digest, hub_revision, known_sha256

logger = logging.getLogger("seq2seq_eval")

INSTALL_HINT = 'pip install -e ".[ctranslate2]" (or pip install ctranslate2)'
CONVERTER_REVISION = 2
"""Bumped whenever `_Converter` or the loaders of `_register_loaders` change what a conversion produces."""
LOCK_POLL_S = 0.5
COMPLETE = "seq2seq_eval_complete.json"
"""Written last into a conversion: the size and sha256 of every file it holds."""


def ctranslate2_module() -> Any:
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


def conversion_source(model_name: str) -> tuple[list[Any], str | None]:
    """What decides the converted weights and vocabulary, for the cache key: every file of a
    local folder, or the hub snapshot a hub name resolves to now. And the revision to convert
    (None for a folder), so that the conversion loads that snapshot even if the hub's refs move
    while it runs."""
    path = Path(os.path.expanduser(model_name))
    if path.is_dir():
        return ["files", files_digest(path)], None
    revision = hub_revision(model_name)
    return ["hub", model_name, revision], revision


def conversion_key(model_name: str, source: list[Any] | None = None) -> str:
    ct2 = ctranslate2_module()
    payload = json.dumps([source or conversion_source(model_name)[0], ct2.__version__, CONVERTER_REVISION])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _manifest_of(folder: Path) -> dict[str, Any]:
    return {f.name: {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
            for f in sorted(folder.iterdir()) if f.is_file() and f.name != COMPLETE}


def damage(folder: Path) -> str | None:
    """Why a cache entry is not a complete conversion (None when it is): its marker, written
    last with the size and digest of every file, must be there and match what is on disk."""
    try:
        recorded = json.loads((folder / COMPLETE).read_text())["files"]
    except FileNotFoundError:
        return f"no {COMPLETE} (an interrupted or older conversion)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {COMPLETE} ({first_line(e)})"
    for name, want in sorted(recorded.items()):
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want.get("bytes"):
            return f"{name} has {f.stat().st_size} bytes, {want.get('bytes')} when converted"
    # Sizes first: cheap, and they catch a truncated or missing file. Contents second: about
    # 1 s per GB of weights, paid once per version of each file (model/identity.py's digest cache:
    # a file changed since, in place or replaced, has another identity and is read again).
    for name, want in sorted(recorded.items()):
        if known_sha256(folder / name) != want.get("sha256"):
            return f"{name} differs from the converted file (sha256)"
    return None


def _fill_legacy_config(model: Any) -> None:
    """CTranslate2's BART-family loaders read `normalize_before` (pre- or post-layer-norm) and
    `normalize_embedding` from the config: keys of the original fairseq configs that transformers
    4 kept from config.json and transformers 5 drops. The module tree says which it is: a final
    encoder `layer_norm` exists only in pre-norm models (mBART, Pegasus, M2M100), a
    `layernorm_embedding` only where embeddings are normalised (BART, mBART).

    Its T5 loader scales the decoder's outputs by d_model^-0.5 when `tie_word_embeddings` is set,
    as T5 did and T5 v1.1 (flan-T5, mT5) does not; transformers 5 sets `tie_word_embeddings` on
    every T5 config and keeps that difference as `scale_decoder_outputs`. Unfixed, a flan-T5's
    log-probabilities come out scaled: the same greedy texts, other beams and samples."""
    config = model.config
    if hasattr(config, "scale_decoder_outputs"):
        config.tie_word_embeddings = bool(config.scale_decoder_outputs)
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
            if self._revision:  # the vocabulary of the same snapshot as the weights (CTranslate2 passes it to those only)
                kwargs.setdefault("revision", self._revision)
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


def converted_model(model_name: str, timeout_s: float) -> Path:
    """The cached conversion of `model_name`, converting it first if no process has yet. One
    process converts (the others wait on its lock); the result appears by one rename. An entry
    that fails its check (a file missing, truncated or changed) is converted again."""
    root = cache_root() / "ctranslate2"
    source, revision = conversion_source(model_name)
    key = conversion_key(model_name, source)
    final = root / key
    if final.is_dir() and damage(final) is None:
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(root / f"{key}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        raise RunStateError(f"{root}: cannot write the CTranslate2 model cache ({e.strerror}); "
                            "set SEQ2SEQ_EVAL_CACHE to a writable folder") from e
    try:
        _lock(lock_fd, root / f"{key}.lock", timeout_s)
        # Checked again under the lock: converted (or repaired) while this process waited.
        why = damage(final) if final.exists() else None
        if final.exists() and why is None:
            return final
        # Whatever a crashed conversion left: no other process holds the lock, so none is using it.
        for stale in root.glob(f"{key}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if why is not None:
            logger.warning("%s: damaged CTranslate2 conversion (%s); converting again", final, why)
            _remove(final)
        work = root / f"{key}.tmp-{os.getpid()}"
        t0 = time.perf_counter()
        logger.info("converting %s%s for CTranslate2 into %s", model_name,
                    f" (revision {revision})" if revision else "", final)
        try:
            _converter_class()(os.path.expanduser(model_name), revision=revision).convert(str(work), force=True)
            # Last: an entry without it, or whose files no longer match it, is not used.
            (work / COMPLETE).write_text(json.dumps({"source": source, "files": _manifest_of(work)}, indent=1))
            # The folder is complete before it gets the name readers look for.
            os.replace(work, final)
        except (ValueError, NotImplementedError, AttributeError, KeyError, OSError, RuntimeError) as e:
            raise ModelError(f"--model_name {model_name}: CTranslate2 cannot convert this model "
                             f"({type(e).__name__}: {first_line(e)}); use --engine hf") from e
        finally:
            # Nothing of a failed or interrupted conversion stays behind (after the rename, work is gone).
            shutil.rmtree(work, ignore_errors=True)
        logger.info("converted in %.1f s", time.perf_counter() - t0)
        return final
    finally:
        os.close(lock_fd)  # releases the lock


def _remove(entry: Path) -> None:
    try:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    except OSError as e:
        raise RunStateError(f"{entry}: a damaged CTranslate2 conversion that cannot be removed ({e.strerror}); "
                            f"remove it with: rm -rf {entry}") from e


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
