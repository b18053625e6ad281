"""A transformers Trainer's evaluations and predictions scored by `evaluate`, each on its own data."""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .api import EvalResult, evaluate
from .config import CONFIG_FIELDS
from .errors import ConfigError
from .trainer_view import (data_stamp_of, COLUMNS, EVENT_SUFFIXES, Rows, dataset_key, examples_of, generation_of, name_of,
                           rows_of)

logger = logging.getLogger("seq2seq_eval")

__all__ = ["COLUMNS", "DATA_OPTIONS", "EvalCallback", "examples_of", "scores_of"]

# Keys of the metric file that are about the run, not scores.
_NOT_SCORES = ("n_obs", "n_gpus", "seconds_per_sample", "seconds_per_generated_sample")

# evaluate()'s options that say which examples are evaluated: given for one evaluation name,
# never shared by all of them.
DATA_OPTIONS = ("data_dir", "dataset", "dataset_config", "split", "source_column", "target_column", "id_column",
                "input_path", "reference_path", "type_path", "sources", "references", "ids", "reference_layout")
# generate() options that set one thing between them: an evaluation's one replaces the callback's other.
_TOGETHER = ({"max_length", "max_new_tokens"}, {"min_length", "min_new_tokens"})
_ABSENT = object()
# evaluate()'s options that are generate() options too: an evaluation's own is its setting.
_GENERATE_FIELDS = ("num_return_sequences",)


def scores_of(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """The metric file's numeric scores under `prefix` (eval_bleu, eval_rouge1, ...)."""
    return {f"{prefix}_{k}": v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _NOT_SCORES}


class EvalCallback(TrainerCallback):
    """Scores every evaluation and prediction of `trainer` with `evaluate`, on the rows that
    evaluation iterated, with its generation settings, into the metrics the Trainer computes
    (docs/python-api.md).

    What an evaluation is, is read from what the Trainer's own evaluation loop did, whatever a
    subclass overrides above it (trainer_view.py): its name is the metric_key_prefix of the keys
    the loop returned ("eval", "eval_<key>", "test", ...), its rows those of the dataloader the loop
    iterated, its generate() options those Seq2SeqTrainer hands to generate() for it. Its data is
    the one declared for that name in `data` ({name: evaluate's data options}; the data options
    given directly declare "eval"), else the examples those rows carry (COLUMNS), read as stored.
    What the callback cannot know (the name, the rows, declared data of another size than the rows)
    gives one warning and no score under any name, never a guess.

    The callback joins the Trainer when it is made: the scores are added as the Trainer's own
    evaluation loop returns, so the Trainer logs them with its loss, picks the best checkpoint by
    them, and every callback (EarlyStoppingCallback, whatever its place) reads them.
    `trainer.add_callback(callback)` is accepted and changes nothing.

    A result is reused for an evaluation of the same weights (every tensor's bytes), configs,
    tokenizer, options, generation settings and data; anything else runs `evaluate`, into a folder
    of its own.

    `options`: evaluate's keyword arguments (task, metrics, bs, generate options...), the same for
    every name; a generate() option of the evaluation's own replaces the callback's for it.
    """

    def __init__(self, trainer: Any, *, data: Mapping[str, Mapping[str, Any]] | None = None,
                 save_dir: str | None = None, **options: Any) -> None:
        for key, why in (("model", "the Trainer's"), ("tokenizer", "the Trainer's processing_class"),
                         ("metric_key_prefix", "the Trainer's, for each evaluation; declare each name's data "
                                               "with data={name: {...}}")):
            if options.get(key) is not None:
                raise ConfigError(f"EvalCallback: {key}: {why}; do not pass it")
        self.trainer = trainer
        self.save_dir = save_dir
        self.options = {k: v for k, v in options.items() if k not in DATA_OPTIONS and v is not None}
        self.data = _declared(data, {k: v for k, v in options.items() if k in DATA_OPTIONS and v is not None})
        self.last: EvalResult | None = None
        self._results: dict[str, EvalResult] = {}  # by what_is_evaluated's key
        self._folders: set[Path] = set()  # the folders this callback's evaluations wrote
        self._warned: set[str] = set()  # the warnings given once
        self._bound: dict[str, tuple[Any, Any]] = {}  # declared name -> (dataset_key, dataset held) of its rows
        # A dataset the Trainer removed unused columns from -> the dataset as given (text columns included).
        self._stored: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._computed: list[str] = []  # the keys compute_metrics returned in the running loop
        self._handled: list[_Loop] = []  # the loops this callback saw, until their event
        check_checkpoints_hold_the_model(trainer.model)
        self._unsaved = unsaved_of(trainer.model)  # what a checkpoint rebuilds, as it is now
        self._join(trainer)

    def _join(self, trainer: Any) -> None:
        """Wrap the trainer's evaluation loop (scores added to what it returns, before Trainer.log,
        the best-checkpoint choice and any callback read it), its column removal (the dataset as
        given, before the Trainer drops its text columns) and its evaluate/predict events (an
        evaluation that ran another loop than this one gets its warning)."""
        if isinstance(getattr(trainer, "_seq2seq_eval_callback", None), EvalCallback):
            raise ConfigError("EvalCallback: this Trainer has one already; give every name's data to that one (data=)")
        trainer._seq2seq_eval_callback = self
        loop = trainer.evaluation_loop

        def evaluation_loop(*args: Any, **kwargs: Any) -> Any:
            handler = getattr(trainer, "callback_handler", None)
            if handler is not None:  # Trainer.evaluation_loop sets it to the dataloader it iterates
                handler.eval_dataloader = None
            self._computed = []
            self._watch_compute_metrics()
            for earlier in self._handled:  # a loop whose name no event came to tell
                if earlier.pending:
                    earlier.pending = False
                    self.scores(None, earlier.rows, earlier.generation, earlier.metrics)
            # Seq2SeqTrainer.evaluate/predict store them before the loop, and prediction_step reads them there.
            generation = generation_of(trainer)
            check_generation(generation)  # before the Trainer's loop does its work
            output = loop(*args, **kwargs)
            metrics = output.metrics
            rows = rows_of(getattr(handler, "eval_dataloader", None), self._stored,
                           getattr(getattr(trainer, "args", None), "world_size", 1))
            seen = _Loop(metrics, rows, generation, list(self._computed))
            self._handled.append(seen)
            name = name_of(metrics, seen.computed)
            if name is not None:
                self._add_scores(name, seen, metrics)
            else:
                # Keys without a loss (rows without labels): evaluate() and predict() add their
                # speed metrics under the prefix before their event, where the name is read.
                seen.pending = True
            return output

        trainer.evaluation_loop = evaluation_loop
        remove = getattr(trainer, "_remove_unused_columns", None)
        if remove is not None:
            def _remove_unused_columns(dataset: Any, description: str | None = None) -> Any:
                kept = remove(dataset, description)
                if kept is not dataset:
                    try:
                        self._stored[kept] = self._stored.get(dataset, dataset)
                    except TypeError:
                        pass  # no weak reference to it: its text stays unknown
                return kept

            trainer._remove_unused_columns = _remove_unused_columns
        handler = getattr(trainer, "callback_handler", None)
        for event in ("on_evaluate", "on_predict"):
            original = getattr(handler, event, None)
            if original is not None:
                setattr(handler, event, self._after(event, original))

    def _watch_compute_metrics(self) -> None:
        """Record the keys compute_metrics returns (name_of tells its keys from the loop's by them);
        wrapped at each loop, as a Trainer's compute_metrics can be set at any time."""
        trainer = self.trainer
        compute = getattr(trainer, "compute_metrics", None)
        if compute is None or getattr(compute, "_seq2seq_eval_watched", False):
            return

        def compute_metrics(*args: Any, **kwargs: Any) -> Any:
            result = compute(*args, **kwargs)
            self._computed = [k for k in result if isinstance(k, str)] if isinstance(result, Mapping) else []
            return result

        compute_metrics._seq2seq_eval_watched = True  # type: ignore[attr-defined]
        trainer.compute_metrics = compute_metrics

    def _add_scores(self, name: str, seen: _Loop, metrics: dict[str, Any]) -> None:
        scores = self.scores(name, seen.rows, seen.generation, metrics)
        replaced = sorted(k for k in scores if k in metrics and k not in self._warned)
        if replaced:  # the Trainer's compute_metrics named a score as the tool names its own
            self._warned.update(replaced)
            logger.warning("EvalCallback: %s: the Trainer's compute_metrics gives it too; the tool's score on "
                           "%r's data replaces it", ", ".join(replaced), name)
        metrics.update(scores)

    def _after(self, event: str, original: Any) -> Any:
        def after(args: Any, state: Any, control: Any, metrics: Any = None, *rest: Any, **kwargs: Any) -> Any:
            # The loop's own dict, or a copy a subclass's evaluate made of it (every key it returned).
            mine = [s for s in self._handled if s.metrics is metrics
                    or (s.metrics and set(s.metrics) <= set(metrics or ()))]
            self._handled = []
            if not mine and f"bypass:{event}" not in self._warned:
                self._warned.add(f"bypass:{event}")
                keys = ", ".join(sorted(metrics or {})[:4])
                logger.warning("EvalCallback: an evaluation (%s) ran without the Trainer's evaluation_loop (a subclass "
                               "calls another loop): it has no score under any name", keys or "no metrics")
            for seen in mine[-1:]:
                if seen.pending and isinstance(metrics, dict):
                    name = name_of(metrics, seen.computed, EVENT_SUFFIXES)
                    if name is None:
                        self.scores(None, seen.rows, seen.generation, metrics)  # its warning
                    else:  # in the metrics every callback reads and evaluate()/predict() returns
                        self._add_scores(name, seen, metrics)
            return original(args, state, control, metrics, *rest, **kwargs)

        return after

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def scores(self, name: str | None, rows: Rows, generation: Mapping[str, Any] | None = None,
               metrics: Mapping[str, Any] | None = None) -> dict[str, float]:
        """The scores of the evaluation named `name` (None: not known) of `rows` (what its loop
        iterated), generated with `generation` (the evaluation's own generate() options), under
        that name; {} and one warning when any of it is not known."""
        if name is None:
            keys = ", ".join(sorted(metrics or {})) or "none"
            self._warn_once(f"name:{keys}", "EvalCallback: an evaluation's name is not known: its keys are %s, under "
                            "no one metric_key_prefix; no score under any name", keys)
            return {}
        if rows.why is not None:
            self._warn_once(f"rows:{name}", "EvalCallback: no %s_bleu...: the rows the Trainer evaluated as %r are "
                            "not known: %s", name, name, rows.why)
            return {}
        data = self.data.get(name)
        if data is not None:
            # Declared data belongs to the rows first evaluated under its name; other rows
            # evaluated under that name (trainer.evaluate(eval_dataset=other)) are not it.
            key = dataset_key(rows.dataset, rows.indices)
            if self._bound.setdefault(name, (key, rows.dataset))[0] != key:
                data = None
        declared = data is not None
        if data is None:
            data = examples_of(rows.dataset, rows.indices)
        if data is None:
            why = (f"its declared data is that of the dataset first evaluated as {name!r}, and this is another"
                   if name in self.data else f"no data is declared for it (data={{{name!r}: {{...}}}})")
            self._warn_once(name, "EvalCallback: no %s_bleu...: %s; the dataset evaluated as %r carries no %s and "
                            "%s columns", name, why, name, COLUMNS["sources"], COLUMNS["references"])
            return {}
        result = self.evaluation(name, data, generation or {})
        # The Trainer's loss is on its rows: a score on another number of examples is not of them.
        n_obs = self.options.get("n_obs")
        expected = min(rows.count, n_obs) if isinstance(n_obs, int) else rows.count
        scored = result.metrics.get("n_obs")
        if declared and isinstance(scored, int) and scored != expected:
            self._warn_once(f"count:{name}", "EvalCallback: no %s_bleu...: the Trainer evaluated %d rows as %r, the "
                            "data declared for it gives %d examples%s; declare data of those rows", name,
                            rows.count, name, scored, f" (n_obs={n_obs})" if n_obs else "")
            return {}
        return scores_of(result.metrics, name)

    def evaluation(self, name: str, data: dict[str, Any], generation: Mapping[str, Any] | None = None) -> EvalResult:
        """`evaluate` on the Trainer's model and `data`, with the callback's options and the
        evaluation's own generate() options (`generation`, in place of the callback's), or the
        result of an earlier identical one."""
        trainer = self.trainer
        model, tokenizer = trainer.model, trainer.processing_class
        if model is None or tokenizer is None:
            raise ConfigError("EvalCallback: the Trainer has no model or no processing_class (the tokenizer); "
                              "pass processing_class=tokenizer to the Trainer")
        check_checkpoints_hold_the_model(model, self._unsaved)  # unfrozen or changed since
        generation = dict(generation or {})
        # The evaluation's setting replaces the callback's of the same thing, named either way
        # (max_new_tokens beside the Trainer's max_length would win in generate()).
        replaced = set(generation).union(*(group for group in _TOGETHER if group & set(generation)))
        for k in sorted(replaced & set(self.options)):
            if generation.get(k, _ABSENT) != self.options[k]:
                same = {k}.union(*(group for group in _TOGETHER if k in group)) & set(generation)
                given = ", ".join(f"{g}={generation[g]!r}" for g in sorted(same))
                self._warn_once(f"setting:{k}:{given}", "EvalCallback: the Trainer's evaluation gives %s (the call's, "
                                "or its arguments' generation_*), in place of the callback's %s=%r", given, k,
                                self.options[k])
        options = {**{k: v for k, v in self.options.items() if k not in replaced},
                   **{k: v for k, v in generation.items() if k in CONFIG_FIELDS}}
        generate_kwargs = {k: v for k, v in generation.items() if k not in CONFIG_FIELDS}
        key, _ = self.what_is_evaluated(model, tokenizer, data, {**options, "generate_kwargs": generate_kwargs})
        result = self._results.get(key)
        if result is None:
            step = trainer.state.global_step
            root = Path(self.save_dir or Path(trainer.args.output_dir) / "seq2seq_eval") / name
            # A folder of its own for each evaluation that generates: another at the same step
            # (other data, settings or weights) goes to the next free step_{step}_{k}. The names
            # depend only on this callback's own evaluations, the same on every rank.
            save_dir, k = root / f"step_{step}", 2
            while save_dir in self._folders:
                save_dir, k = root / f"step_{step}_{k}", k + 1
            self._folders.add(save_dir)
            result = evaluate(model, tokenizer, save_dir=str(save_dir), **data, **options,
                              generate_kwargs=generate_kwargs or None)
            self._results[key] = result
        self.last = result
        return result

    def what_is_evaluated(self, model: Any, tokenizer: Any, data: dict[str, Any],
                          options: Mapping[str, Any] | None = None) -> tuple[str, str]:
        """(the key of an evaluation's result, the weights' fingerprint): everything the result
        depends on. The weights (their bytes, dtypes and devices), the model's config and
        generation config (generate() reads its defaults there), the tokenizer, the options
        (default the callback's), the data options or examples, and the size and modification
        time of the data files."""
        from .model.fingerprint import tokenizer_digest, weights_fingerprint

        weights = weights_fingerprint(model)
        configs = [getattr(getattr(model, name, None), "to_json_string", lambda: None)()
                   for name in ("config", "generation_config")]
        devices = sorted({str(t.device) for t in model.state_dict().values() if hasattr(t, "device")})
        options = {**(self.options if options is None else options), **data}
        parts = [weights, devices, configs, tokenizer_digest(tokenizer),
                 json.dumps(options, sort_keys=True, default=str), data_stamp_of(options)]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest(), weights


def check_generation(generation: Mapping[str, Any]) -> None:
    """Refuse, of an evaluation's own settings, an option of evaluate() that is no generate()
    option: Seq2SeqTrainer hands them all to generate(), and evaluate() would read it as its own
    (n_obs=..., data_dir=...: other examples than the Trainer's rows)."""
    other = sorted(k for k in generation if k in CONFIG_FIELDS and k not in _GENERATE_FIELDS)
    if other:
        raise ConfigError(f"EvalCallback: {', '.join(other)}: given to the Trainer's evaluate()/predict(), which "
                          "hands it to generate(), and not a generate() option; give it to EvalCallback")


@dataclass
class _Loop:
    """One run of the Trainer's evaluation loop, as the callback saw it, until its event."""

    metrics: dict[str, Any]
    rows: Rows
    generation: dict[str, Any]
    computed: list[str]
    pending: bool = False  # its name is read at its event


def _declared(data: Any, direct: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{evaluation name: its data options}, each checked to hold data options only."""
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError("EvalCallback: data must be a dict of evaluation name -> data options, got "
                          f"{type(data).__name__}")
    declared = {"eval": direct} if direct else {}
    for name, options in (data or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"EvalCallback: data: {name!r} is not an evaluation name (metric_key_prefix: eval, "
                              "eval_<key>, test, ...)")
        if name in declared:
            raise ConfigError(f"EvalCallback: data[{name!r}]: the data options given directly are "
                              f"{name!r}'s already; give them once")
        if not isinstance(options, Mapping) or not options:
            raise ConfigError(f"EvalCallback: data[{name!r}]: expected evaluate's data options "
                              f"({', '.join(DATA_OPTIONS[:3])}, ... or sources/references/ids), got {options!r}")
        other = sorted(set(options) - set(DATA_OPTIONS))
        if other:
            raise ConfigError(f"EvalCallback: data[{name!r}]: {', '.join(other)} is not a data option (expected "
                              f"{', '.join(DATA_OPTIONS)}); give the other options to EvalCallback itself")
        declared[name] = {k: v for k, v in options.items() if v is not None}
    return declared


def unsaved_of(model: Any) -> dict[str, Any]:
    """The state-dict entries save_pretrained leaves out (exactly the model's
    _keys_to_ignore_on_save), copied to the CPU: a checkpoint rebuilds them when it loads."""
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    if not ignored:
        return {}
    return {k: t.detach().to("cpu", copy=True) for k, t in model.state_dict().items() if k in ignored}


def check_checkpoints_hold_the_model(model: Any, unsaved_at_start: dict[str, Any] | None = None) -> None:
    """Refuse a model whose checkpoints leave out a weight that training changes: a step's score
    would be of another model than its checkpoint's (transformers 5's Marian: sinusoidal position
    tables that are trainable but in _keys_to_ignore_on_save, rebuilt when the checkpoint loads).
    Trainable, or changed since `unsaved_at_start` (by hand, or a buffer its forward updates)."""
    import torch

    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    if not ignored:
        return
    trained = [n for n, p in model.named_parameters() if p.requires_grad and n in ignored]
    if trained:
        raise ConfigError(
            f"EvalCallback: {', '.join(trained)}: trainable, but no checkpoint holds it (the model's "
            "_keys_to_ignore_on_save), so a step's score would not be the score of its checkpoint; "
            "freeze it before training: model.get_parameter(name).requires_grad_(False)")
    now = unsaved_of(model) if unsaved_at_start else {}
    # In the model's dtype now: the Trainer casts the whole model for fp16/bf16_full_eval, as the
    # command line's --fp16/--bf16 casts a loaded checkpoint, tables included.
    changed = [k for k, t in now.items()
               if k in unsaved_at_start and not torch.equal(t, unsaved_at_start[k].to(t.dtype))]
    if changed:
        raise ConfigError(
            f"EvalCallback: {', '.join(changed)}: changed since the callback was made, but no checkpoint holds it "
            "(the model's _keys_to_ignore_on_save), so a step's score would not be the score of its checkpoint; "
            "expected it as loaded")
