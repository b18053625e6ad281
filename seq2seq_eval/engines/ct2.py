"""The CTranslate2 engine: the model converted once into a cache (engines/ct2_convert.py), then
`Translator.translate_batch` on each planned batch (an encoder-decoder model), or
`Generator.generate_batch` (a decoder-only model: engines/ct2_generator.py).

The compute type is applied when the model is loaded, so one conversion serves every compute
type; it is part of the run's manifest, so a resume under another compute type is refused.

Generation settings are taken from the same effective `GenerationConfig` the HF engine uses
(model defaults, task entry, user flags) and mapped one by one (`translate_options`), by the rule
of engines/ct2_rules.py (the Translator's table, or the Generator's). A setting with no
CTranslate2 counterpart is an error naming it, raised before any work (`check`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import ConfigError, ModelError, first_line
from . import rules, stops
from .base import BatchOutput
from .ct2_rules import CT2_GENERATOR_RULES, CT2_RULES
from .ct2_convert import converted_model
from .ct2_convert import ctranslate2_module as _ctranslate2
from ..model.generation import stop_list

logger = logging.getLogger("seq2seq_eval")

def describe(cfg: EvalConfig) -> dict[str, Any]:
    return {"name": "ctranslate2", "compute_type": cfg.compute_type, "ctranslate2": _ctranslate2().__version__}


# ---------------------------------------------------------------- generation settings

def check(cfg: EvalConfig, model_config: Any, gc: Any, tokenizer: Any, device_type: str = "cpu",
          causal: bool = False) -> None:
    """Refuse, before any work (before converting), a run this engine cannot do: a compute type
    the device does not support, settings it cannot honour (ct2_rules.py: the Translator's rule,
    or with `causal`, a decoder-only model, the Generator's)."""
    check_compute_type(cfg.compute_type, device_type)
    rules.check("ctranslate2", CT2_GENERATOR_RULES if causal else CT2_RULES, cfg.gen_kwargs, gc, model_config,
                lambda key: "use --engine hf for it" if getattr(rules.HF_RULES.get(key), "honoured", False)
                else "remove it (--engine hf cannot run it either)")


def check_compute_type(compute_type: str | None, device_type: str) -> None:
    """--compute_type that CTranslate2 cannot run on the device (float16 on a CPU): refused here,
    not when the converted model is loaded."""
    ct2 = _ctranslate2()
    if compute_type in (None, "default", "auto"):
        return
    try:
        supported = set(ct2.get_supported_compute_types(device_type))
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"--engine ctranslate2: CTranslate2 {ct2.__version__} cannot run on {device_type} "
                          f"({first_line(e)})") from e
    if compute_type not in supported:
        raise ConfigError(f"--compute_type {compute_type}: CTranslate2 {ct2.__version__} does not support it on "
                          f"{device_type}; expected one of default, auto, {', '.join(sorted(supported))}")


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
    n_return: int = 1
    forced_in_beams: bool = False  # the search stops a token early, and the run forces the end (_force_end)
    stops: tuple[str, ...] = ()  # stop strings: each hypothesis stops at them as in generate() (one beam: ct2_rules)
    decoder_start: int | None = None  # what generate() puts before an encoder-decoder's first generated token


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
    # Always given: `gc` is effective (model/generation.py), and CTranslate2's own defaults (at most
    # 256 tokens, at least 1) are not generate()'s (20 new tokens, none required).
    options["max_decoding_length"] = (int(gc.max_new_tokens) if gc.max_new_tokens is not None
                                      else max(1, int(gc.max_length) - 1))
    options["min_decoding_length"] = (int(gc.min_new_tokens) if gc.min_new_tokens is not None
                                      else max(0, int(gc.min_length or 0) - 1))
    eos = _ids(gc.eos_token_id)
    if eos:
        options["end_token"] = tokenizer.convert_ids_to_tokens(eos)
    suppress = [list(seq) for seq in (gc.bad_words_ids or [])] + [[t] for t in _ids(gc.suppress_tokens)]
    if suppress:
        options["suppress_sequences"] = [tokenizer.convert_ids_to_tokens(seq) for seq in suppress]
    if gc.do_sample:
        # Unset values are generate()'s defaults already (top_k 50, not "no limit"); transformers'
        # top_k=0 and CTranslate2's sampling_topk=0 both mean "no limit".
        options.update(sampling_topk=int(gc.top_k), sampling_topp=float(gc.top_p),
                       sampling_temperature=float(gc.temperature))
    prefix = None if gc.forced_bos_token_id is None else tokenizer.convert_ids_to_tokens(int(gc.forced_bos_token_id))
    forced_eos = _ids(gc.forced_eos_token_id)  # one id: ct2_rules refuses more
    forced_in_beams = bool(forced_eos) and options["beam_size"] > 1 and not gc.do_sample
    if forced_in_beams:
        # generate()'s beam search forces the end token on every live beam at the last step; the
        # search runs to the step before it, and _force_end ends and ranks the beams as it does.
        limit = options["max_decoding_length"]
        options.update(max_decoding_length=limit - 1, num_hypotheses=options["beam_size"],
                       min_decoding_length=min(options["min_decoding_length"], limit - 1))
    start = getattr(gc, "decoder_start_token_id", None)
    return Mapping(options, prefix, forced_eos[0] if forced_eos else None, tuple(eos), bool(gc.do_sample), n,
                   forced_in_beams, tuple(stop_list(gc.stop_strings)), None if start is None else int(start))


def _force_end(candidates: list[tuple[list[int], float]], m: Mapping, length_penalty: float
               ) -> list[tuple[list[int], float]]:
    """Beam search with forced_eos_token_id, as generate() ends it: each beam still live at the
    step before the limit gets the end token at no cost (the forcing processor gives it log-
    probability 0), its score normalized by its new length; then the best `n_return` of them and of
    the hypotheses finished earlier. Among the beam_size hypotheses CTranslate2 returns, the best
    one is always generate()'s (the live ones keep their order); ct2_rules refuses more than one
    candidate where the ranks below could need one CTranslate2 dropped."""
    ended = []
    for ids, score in candidates:
        if not (ids and ids[-1] in m.eos_ids):
            length = len(ids)
            score = score * (length ** length_penalty) / ((length + 1) ** length_penalty) if length else 0.0
            ids = ids + [m.forced_eos]  # type: ignore[list-item]
        ended.append((ids, score))
    ended.sort(key=lambda c: -c[1])  # stable: CTranslate2's order among equal scores
    return ended[:m.n_return]


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


def check_cuda_libraries(model: Any, tokenizer: Any, version: str, device: Any) -> None:
    """One decoding step on the GPU at load time. CTranslate2 opens cuBLAS only at its first
    matrix product, so a machine without the cuBLAS its wheel was built against (4.x wheels load
    CUDA 12's libcublas.so.12) would otherwise fail inside the first batch, with a traceback.
    `model`: a Translator or a Generator."""
    token = tokenizer.eos_token or tokenizer.convert_ids_to_tokens(0)
    try:
        if hasattr(model, "generate_batch"):
            model.generate_batch([[token]], beam_size=1, max_length=1)
        else:
            model.translate_batch([[token]], beam_size=1, max_decoding_length=1)
    except RuntimeError as e:
        hint = ("; CTranslate2's CUDA build needs that library: install it (pip install nvidia-cublas-cu12 for "
                "libcublas.so.12) and put its folder on LD_LIBRARY_PATH, or use --device cpu"
                if "cannot be loaded" in str(e) else "")
        raise ModelError(f"CTranslate2 {version} cannot run on {device}: {first_line(e)}{hint}") from e


def parts(positions: Iterable[int], lengths: Sequence[int], workers: int, new_tokens: int) -> list[list[int]]:
    """`positions` (inputs of a batch, by position) cut into min(workers, inputs) runs in length
    order (longest first; equal lengths by position), one input at least each, cut where the work
    so far is nearest a multiple of a share (an input goes to the earlier run when its middle falls
    within it), an input's work being its length plus `new_tokens`: runs of close lengths (little
    padding, few prompt tails forwarded a token a step) on workers that finish together. A pure
    function of the batch: where an input goes, and so its output, is the same on any rank and
    after a resume."""
    ordered = sorted(positions, key=lambda i: (-lengths[i], i))
    work = [lengths[i] + new_tokens for i in ordered]
    n, total = len(ordered), sum(work)
    runs = min(workers, n)
    if runs == 0:
        return []
    cuts, end, done = [0], 0, 0
    for k in range(1, runs):
        start = end
        while end < n - (runs - k) and (end == start or (2 * done + work[end]) * runs <= 2 * total * k):
            done += work[end]
            end += 1
        cuts.append(end)
    cuts.append(n)
    return [ordered[a:b] for a, b in zip(cuts, cuts[1:])]


Found = list[list[tuple[list[int], float]]]
"""Per example, CTranslate2's hypotheses: (token ids, score), best first."""


def gather(runs: Sequence[list[int]], n: int, submit: Callable[[list[int]], list[Any]],
           hypotheses: Callable[[Any], list[tuple[list[int], float]]]) -> Found:
    """The hypotheses of a batch of `n` inputs, its `runs` (positions) each submitted as one
    asynchronous call (`submit`, giving one async result per input); every run is queued before
    any is awaited, so the workers run them at once."""
    found: Found = [[] for _ in range(n)]
    pending = [(run, submit(run)) for run in runs]
    for run, results in pending:
        for i, result in zip(run, results):
            found[i] = hypotheses(result.result())
    return found


class CT2Engine:
    """An encoder-decoder model on CTranslate2's Translator. What is not about the Translator
    (loading, seeding, the end of a hypothesis, stop strings, decoding) is shared with the
    Generator's engine for decoder-only models (engines/ct2_generator.py)."""

    name = "ctranslate2"
    model_class = "Translator"

    def __init__(self, model: Any, tokenizer: Any, mapping: Mapping, compute_type: str, seed: int,
                 model_path: Path, model_kwargs: dict[str, Any]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.mapping = mapping
        self.compute_type = compute_type
        self.seed = seed
        self.model_path = model_path
        self.model_kwargs = model_kwargs

    @classmethod
    def load(cls, cfg: EvalConfig, *, tokenizer: Any, model_config: Any, generation_config: Any, device: Any,
             env: Any) -> "CT2Engine":
        ct2 = _ctranslate2()
        from ..model.converted import is_converted_folder

        t0 = time.perf_counter()
        path = (Path(os.path.expanduser(cfg.model_name)) if is_converted_folder(cfg.model_name)
                else converted_model(cfg.model_name, cfg.sync_timeout))
        cls.check_folder(path, tokenizer)
        t1 = time.perf_counter()
        kwargs: dict[str, Any] = {"compute_type": cfg.compute_type, "inter_threads": 1}
        if device.type == "cuda":
            kwargs.update(device="cuda", device_index=device.index or 0)
        else:
            kwargs.update(device="cpu", **cls.cpu_layout(cpu_threads(getattr(env, "local_world_size", 1) or 1)))
        try:
            model = getattr(ct2, cls.model_class)(str(path), **kwargs)
        except (ValueError, RuntimeError) as e:
            raise ModelError(f"{path}: CTranslate2 cannot load this model with --compute_type {cfg.compute_type} "
                             f"on {device.type} ({first_line(e)})") from e
        if device.type == "cuda":
            check_cuda_libraries(model, tokenizer, ct2.__version__, device)
        logger.info("CTranslate2 %s %s on %s, compute type %s, %s", ct2.__version__, cls.model_class, device,
                    model.compute_type,
                    f"{kwargs['inter_threads']} worker(s) of {kwargs['intra_threads']} thread(s)"
                    if device.type == "cpu" else f"device {device.index or 0}")
        engine = cls(model, tokenizer, translate_options(generation_config, tokenizer), cfg.compute_type, cfg.seed,
                     path, kwargs)
        # The conversion cache (found and checked, or converted) apart from loading the model:
        # time_breakdown.startup_steps.
        engine.load_seconds = {"conversion": t1 - t0, "model_load": time.perf_counter() - t1}
        return engine

    @classmethod
    def cpu_layout(cls, threads: int) -> dict[str, int]:
        """How a CPU rank's `threads` run the model: as workers of one thread each, each given a
        part of a batch (`parts`). A decoder step spends much of its time on memory (the weights,
        the attention caches), which one thread a part keeps closer to its core than threads
        sharing each op of one batch: on 2 cores, whole runs with 2 workers of 1 thread ran 1.47x
        (an opus-mt-size model, beam search) and 1.62x (a 59M-parameter decoder-only model) those
        with 1 worker of 2, with the same outputs (benchmarks/ct2_layout.py, docs/engines.md)."""
        return {"inter_threads": threads, "intra_threads": 1}

    @property
    def workers(self) -> int:
        """Parts of a batch CTranslate2 runs at once (its inter_threads; 1 on a GPU)."""
        return int(self.model_kwargs.get("inter_threads", 1))

    @classmethod
    def check_folder(cls, path: Path, tokenizer: Any) -> None:
        """Refuse a converted model this engine cannot run with `tokenizer` (the Generator's does)."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "compute_type": self.compute_type}

    def search(self, model: Any, batch_ids: Sequence[Sequence[int]]) -> Found:
        """CTranslate2's hypotheses for one batch, as `self.mapping` asks."""
        m = self.mapping
        runs = parts(range(len(batch_ids)), [len(ids) for ids in batch_ids], model.num_translators, 0)
        return gather(runs, len(batch_ids), lambda run: model.translate_batch(
            [self.tokenizer.convert_ids_to_tokens(list(batch_ids[i])) for i in run],
            target_prefix=[[m.prefix_token] for _ in run] if m.prefix_token is not None else None,
            asynchronous=True, **m.options),
            lambda r: [(self.tokenizer.convert_tokens_to_ids(t), float(s)) for t, s in zip(r.hypotheses, r.scores)])

    def generate(self, batch_ids: Sequence[Sequence[int]], batch_index: int) -> BatchOutput:
        import ctranslate2

        m = self.mapping
        model = self.model
        if m.sampling:
            # Seeded per batch, not per rank, so that a batch samples the same text on any rank and
            # after a resume. CTranslate2 draws from a generator per thread, seeded from the global
            # seed when the thread first samples: reseeding reaches only a thread that has not yet
            # sampled. A fresh model object brings fresh worker threads; loading it again from the
            # converted folder costs milliseconds for small models, about 0.3 s at opus-mt size.
            # The new model has one worker with all the rank's threads: each worker draws from its own
            # generator, and which worker takes which part of a batch is not fixed.
            ctranslate2.set_random_seed(self.seed + batch_index)
            kwargs = dict(self.model_kwargs)
            if "intra_threads" in kwargs:
                kwargs.update(inter_threads=1, intra_threads=kwargs["intra_threads"] * self.workers)
            model = getattr(ctranslate2, self.model_class)(str(self.model_path), **kwargs)
        try:
            if m.forced_in_beams and m.options["max_decoding_length"] < 1:
                # The first token is the forced end: nothing to search.
                found = [[([m.forced_eos], 0.0)] * m.n_return for _ in batch_ids]  # type: ignore[list-item]
            else:
                found = self.search(model, batch_ids)
        except ValueError as e:
            raise ConfigError(f"CTranslate2 rejected the generate options: {first_line(e)}") from e
        finally:
            if model is not self.model:
                del model  # its threads and weights go now, not at the next batch
        return self.outputs(found, batch_ids)

    def stop_prefix(self, ids: Sequence[int]) -> list[int]:
        """What the stop-string criterion reads before an input's generated tokens in generate():
        an encoder-decoder's decoder start token (the Generator's: the prompt)."""
        return [] if self.mapping.decoder_start is None else [self.mapping.decoder_start]

    def _stops(self) -> stops.Stops | None:
        """The stop strings' criterion, built once for the mapping's strings."""
        strings = self.mapping.stops
        if not strings:
            return None
        built = getattr(self, "_built_stops", None)
        if built is None or built.strings != strings:
            built = self._built_stops = stops.Stops(self.tokenizer, strings)
        return built

    def outputs(self, found: Found, batch_ids: Sequence[Sequence[int]]) -> BatchOutput:
        """Texts, scores and token counts from CTranslate2's hypotheses: the forced end token
        where generate() forces it, each hypothesis ended at the token on which generate()'s
        stop-string criterion stops it (with one beam: ct2_rules) and its text cut before the
        first stop string it shows, decoded as the HF engine decodes. Sampled candidates have no
        score, as on the HF engine: a score is beam search's."""
        m = self.mapping
        limit = m.options["max_decoding_length"]
        ranked = [_force_end(c, m, float(m.options["length_penalty"])) if m.forced_in_beams else c for c in found]
        hypotheses = [[ids[:-1] + [m.forced_eos]  # type: ignore[list-item]
                       # Greedy or sampled: generate() makes the token at the length limit the forced
                       # end, whatever it would have been (an end token too, when forced_eos is another).
                       if not m.forced_in_beams and m.forced_eos is not None and len(ids) >= limit else list(ids)
                       for ids, _ in candidates] for candidates in ranked]
        stop = self._stops()
        if stop is not None:
            # generate() stops at the token on which its criterion stops; with one beam the tokens
            # before it are the same whatever follows. One call for the whole batch.
            prefixes = [self.stop_prefix(source) for source in batch_ids]
            flat = [(p, ids) for p, hyps in zip(prefixes, hypotheses) for ids in hyps]
            ends = iter(stop.ends([p + ids for p, ids in flat], [len(p) for p, _ in flat]))
            hypotheses = [[ids if n is None else ids[:n] for ids, n in zip(hyps, ends)] for hyps in hypotheses]
        preds = [[(stop.cut(text) if stop is not None else text).strip()
                  for text in (stops.decode(self.tokenizer, ids) for ids in hyps)] for hyps in hypotheses]
        scores = [[score for _, score in candidates] for candidates in ranked]
        n_tokens = [sum(len(ids) for ids in hyps) for hyps in hypotheses]
        return BatchOutput(preds, scores if m.n_return > 1 and not m.sampling else None, n_tokens)
