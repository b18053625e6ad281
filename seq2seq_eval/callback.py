"""A transformers TrainerCallback that runs `evaluate` at each of a Trainer's evaluations."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .api import EvalResult, evaluate
from .errors import ConfigError, EvalError

logger = logging.getLogger("seq2seq_eval")

# Keys of the metric file that are about the run, not scores.
_NOT_SCORES = ("n_obs", "n_gpus", "seconds_per_sample", "seconds_per_generated_sample")

# The options that name the data (and decide which files it is read from).
_DATA_OPTIONS = ("data_dir", "dataset", "input_path", "reference_path", "type_path", "task")

# Trainer.evaluate adds f"{metric_key_prefix}_runtime" to every evaluation's metrics
# (transformers' speed_metrics), before it calls on_evaluate: the prefix is read from it.
_RUNTIME = "_runtime"


def scores_of(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """The metric file's numeric scores under `prefix` (eval_bleu, eval_rouge1, ...)."""
    return {f"{prefix}_{k}": v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _NOT_SCORES}


def trainer_prefix(metrics: dict[str, Any] | None) -> str:
    """The metric_key_prefix Trainer.evaluate was called with ("eval", "test", "eval_<name>" for
    each of a dict of eval datasets), read from the metrics it passes; "eval" if none says."""
    found = [k[: -len(_RUNTIME)] for k in metrics or {} if k.endswith(_RUNTIME)]
    return found[0] if len(found) == 1 else "eval"


class EvalCallback(TrainerCallback):
    """At each of the Trainer's evaluations, every rank calls `evaluate` on the model being
    trained (the Trainer's unwrapped model, its processing_class as the tokenizer) and the
    scores are logged where the Trainer logs (`Trainer.log`: its log history, the console,
    TensorBoard, W&B...) as {metric_key_prefix}_bleu, _rouge1, ..., and added to the metrics
    `Trainer.evaluate` returns, so `metric_for_best_model="bleu"` can pick checkpoints by them.
    The prefix is the one `Trainer.evaluate` was called with (`trainer.evaluate(metric_key_prefix="test")`
    gives test_bleu), unless `metric_key_prefix` is given here.

    The numbers are the command line's on the same weights, at any number of ranks: use it
    instead of `predict_with_generate`. Each evaluation writes its outputs into
    {save_dir}/step_{global_step} (default save_dir: {output_dir}/seq2seq_eval).

    Scores belong to the weights they came from: an evaluation whose model weights (every
    tensor's bytes: model.fingerprint.weights_fingerprint), model and generation configs,
    tokenizer, options and data files equal an earlier one's gets that one's scores without
    generating again (the Trainer's
    evaluation of a dict of eval datasets; `trainer.evaluate()` after `load_best_model_at_end`
    loaded the best checkpoint); any other runs `evaluate`, whatever the step. Every rank holds
    the same weights (DistributedDataParallel), so every rank makes the same choice.

        trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=..., eval_dataset=...,
                                 processing_class=tokenizer)
        trainer.add_callback(EvalCallback(trainer, data_dir="data/wmt_en_ro", num_beams=4))

    `options`: evaluate's keyword arguments (data, task, metrics, bs, generate options...).
    """

    def __init__(self, trainer: Any, *, metric_key_prefix: str | None = None, save_dir: str | None = None,
                 **options: Any) -> None:
        if options.get("model") is not None or options.get("tokenizer") is not None:
            raise ConfigError("EvalCallback: the model and tokenizer are the Trainer's; do not pass them")
        self.trainer = trainer
        self.prefix = metric_key_prefix
        self.save_dir = save_dir
        self.options = {k: v for k, v in options.items() if k not in ("model", "tokenizer")}
        self.last: EvalResult | None = None
        self._results: dict[str, EvalResult] = {}  # by what_is_evaluated's key
        self._folders: set[Path] = set()  # the folders this callback's evaluations wrote

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    model: Any = None, processing_class: Any = None, **kwargs: Any) -> Any:
        if model is None or processing_class is None:
            raise ConfigError("EvalCallback: the Trainer has no model or no processing_class (the tokenizer); "
                              "pass processing_class=tokenizer to the Trainer")
        key, weights = self.what_is_evaluated(model, processing_class)
        result = self._results.get(key)
        if result is None:
            root = Path(self.save_dir or Path(args.output_dir) / "seq2seq_eval")
            save_dir = root / f"step_{state.global_step}"
            if save_dir in self._folders:  # other weights at the same step (loaded by hand)
                save_dir = root / f"step_{state.global_step}_weights_{weights[:12]}"
            result = evaluate(model, processing_class, save_dir=str(save_dir), **self.options)
            self._folders.add(save_dir)
            self._results[key] = result
        self.last = result
        scores = scores_of(result.metrics, self.prefix or trainer_prefix(metrics))
        if metrics is not None:
            metrics.update(scores)  # what Trainer.evaluate returns and picks the best model by
        # Trainer.log writes the log history and calls every callback's on_log (the loggers);
        # it does so on every rank, as the Trainer's own evaluation logs.
        self.trainer.log(dict(scores))
        return control

    def what_is_evaluated(self, model: Any, tokenizer: Any) -> tuple[str, str]:
        """(the key of an evaluation's result, the weights' fingerprint): everything the result
        depends on. The weights (their bytes, dtypes and devices), the model's config and
        generation config (generate() reads its defaults there), the tokenizer, the options and
        the size and modification time of the data files."""
        from .model.fingerprint import tokenizer_digest, weights_fingerprint

        weights = weights_fingerprint(model)
        configs = [getattr(getattr(model, name, None), "to_json_string", lambda: None)()
                   for name in ("config", "generation_config")]
        devices = sorted({str(t.device) for t in model.state_dict().values() if hasattr(t, "device")})
        parts = [weights, devices, configs, tokenizer_digest(tokenizer),
                 json.dumps(self.options, sort_keys=True, default=str), _data_stamp(self.options)]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest(), weights


def _data_stamp(options: dict[str, Any]) -> list[list[Any]] | None:
    """The local data files the options name, with their sizes and modification times, so that a
    data file changed between two evaluations makes them differ. In-memory sources are in the
    options themselves; a hub dataset has no files here."""
    from .config import EvalConfig
    from .outputs.locations import data_stamp

    if options.get("sources") is not None:
        return None
    try:
        cfg = EvalConfig(**{k: options[k] for k in _DATA_OPTIONS if options.get(k) is not None})
        return data_stamp(cfg)
    except (EvalError, OSError):
        return None  # evaluate() says what is wrong with them
