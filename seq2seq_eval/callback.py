"""A transformers TrainerCallback that runs `evaluate` at each of a Trainer's evaluations."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .api import EvalResult, evaluate
from .errors import ConfigError

logger = logging.getLogger("seq2seq_eval")

# Keys of the metric file that are about the run, not scores.
_NOT_SCORES = ("n_obs", "n_gpus", "seconds_per_sample", "seconds_per_generated_sample")


def scores_of(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """The metric file's numeric scores under `prefix` (eval_bleu, eval_rouge1, ...)."""
    return {f"{prefix}_{k}": v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _NOT_SCORES}


class EvalCallback(TrainerCallback):
    """At each of the Trainer's evaluations, every rank calls `evaluate` on the model being
    trained (the Trainer's unwrapped model, its processing_class as the tokenizer) and the
    scores are logged where the Trainer logs (`Trainer.log`: its log history, the console,
    TensorBoard, W&B...) as {metric_key_prefix}_bleu, _rouge1, ..., and added to the metrics
    `Trainer.evaluate` returns, so `metric_for_best_model="bleu"` can pick checkpoints by them.

    The numbers are the command line's on the same weights, at any number of ranks: use it
    instead of `predict_with_generate`. Each evaluation writes its outputs into
    {save_dir}/step_{global_step} (default save_dir: {output_dir}/seq2seq_eval).

        trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=..., eval_dataset=...,
                                 processing_class=tokenizer)
        trainer.add_callback(EvalCallback(trainer, data_dir="data/wmt_en_ro", num_beams=4))

    `options`: evaluate's keyword arguments (data, task, metrics, bs, generate options...).
    """

    def __init__(self, trainer: Any, *, metric_key_prefix: str = "eval", save_dir: str | None = None,
                 **options: Any) -> None:
        if "model" in options or "tokenizer" in options:
            raise ConfigError("EvalCallback: the model and tokenizer are the Trainer's; do not pass them")
        self.trainer = trainer
        self.prefix = metric_key_prefix
        self.save_dir = save_dir
        self.options = options
        self.last: EvalResult | None = None
        self._step = -1  # the global step self.last was computed at

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    model: Any = None, processing_class: Any = None, **kwargs: Any) -> Any:
        if model is None or processing_class is None:
            raise ConfigError("EvalCallback: the Trainer has no model or no processing_class (the tokenizer); "
                              "pass processing_class=tokenizer to the Trainer")
        if self.last is not None and self._step == state.global_step:
            # Trainer.evaluate calls this once per eval dataset (a dict of them): same weights,
            # same data, the same result; computed and logged once.
            if metrics is not None:
                metrics.update(scores_of(self.last.metrics, self.prefix))
            return control
        root = Path(self.save_dir or Path(args.output_dir) / "seq2seq_eval")
        save_dir = root / f"step_{state.global_step}"
        self.last = evaluate(model, processing_class, save_dir=str(save_dir), **self.options)
        self._step = state.global_step
        scores = scores_of(self.last.metrics, self.prefix)
        if metrics is not None:
            metrics.update(scores)  # what Trainer.evaluate returns and picks the best model by
        # Trainer.log writes the log history and calls every callback's on_log (the loggers);
        # it does so on every rank, as the Trainer's own evaluation logs.
        self.trainer.log(dict(scores))
        return control
