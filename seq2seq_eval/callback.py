"""A transformers Trainer's evaluations and predictions scored by `evaluate`, each on its own data."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .api import EvalResult, evaluate
from .errors import ConfigError, EvalError

logger = logging.getLogger("seq2seq_eval")

# Keys of the metric file that are about the run, not scores.
_NOT_SCORES = ("n_obs", "n_gpus", "seconds_per_sample", "seconds_per_generated_sample")

# evaluate()'s options that say which examples are evaluated: given for one evaluation name,
# never shared by all of them.
DATA_OPTIONS = ("data_dir", "dataset", "dataset_config", "split", "source_column", "target_column", "id_column",
                "input_path", "reference_path", "type_path", "sources", "references", "ids", "reference_layout")
# The ones that name files (their size and modification time enter the cache key).
_FILE_OPTIONS = ("data_dir", "dataset", "input_path", "reference_path", "type_path", "task")

# The columns a Trainer's dataset carries its examples in, for the callback to read them.
COLUMNS = {"sources": "source", "references": "target", "ids": "id"}


def scores_of(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """The metric file's numeric scores under `prefix` (eval_bleu, eval_rouge1, ...)."""
    return {f"{prefix}_{k}": v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _NOT_SCORES}


class EvalCallback(TrainerCallback):
    """Scores every evaluation and prediction of `trainer` with `evaluate`, on the data that
    evaluation is of, into the metrics the Trainer computes (docs/python-api.md).

    Each evaluation has a name, the Trainer's metric_key_prefix: "eval" for one eval_dataset,
    "eval_<key>" for each of a dict of them, "test" for `predict` or whatever `evaluate` and
    `predict` are called with. Its data is the one declared for that name, in `data` ({name:
    evaluate's data options}; the data options given directly declare "eval"), else the examples
    of the dataset the Trainer evaluates, when its rows carry them (COLUMNS). A name with
    neither gets no score (and one warning), never another name's.

    The callback joins the Trainer when it is made: the scores are added as the Trainer's own
    evaluation loop returns, so the Trainer logs them with its loss, picks the best checkpoint by
    them, and every callback (EarlyStoppingCallback, whatever its place) reads them.
    `trainer.add_callback(callback)` is accepted and changes nothing.

    A result is reused for an evaluation of the same weights (every tensor's bytes), configs,
    tokenizer, options and data; anything else runs `evaluate`, whatever the step.

    `options`: evaluate's keyword arguments (task, metrics, bs, generate options...), the same for
    every name.
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
        self._warned: set[str] = set()  # the names and score keys that got their warning
        self._bound: dict[str, Any] = {}  # declared name -> the dataset its data is of (held: lists have no weakref)
        self._datasets: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        check_checkpoints_hold_the_model(trainer.model)
        self._unsaved = unsaved_of(trainer.model)  # what a checkpoint rebuilds, as it is now
        self._join(trainer)

    def _join(self, trainer: Any) -> None:
        """Wrap the trainer's evaluation loop (scores added to what it returns, before Trainer.log,
        the best-checkpoint choice and any callback read it) and its dataloaders (which dataset
        each evaluation is of, as given, before the Trainer drops its text columns)."""
        if isinstance(getattr(trainer, "_seq2seq_eval_callback", None), EvalCallback):
            raise ConfigError("EvalCallback: this Trainer has one already; give every name's data to that one (data=)")
        trainer._seq2seq_eval_callback = self
        loop, get_eval, get_test = trainer.evaluation_loop, trainer.get_eval_dataloader, trainer.get_test_dataloader
        signature = inspect.signature(loop)

        def get_eval_dataloader(eval_dataset: Any = None) -> Any:
            loader = get_eval(eval_dataset)
            if isinstance(eval_dataset, str):
                eval_dataset = trainer.eval_dataset[eval_dataset]
            return self._remember(loader, trainer.eval_dataset if eval_dataset is None else eval_dataset)

        def get_test_dataloader(test_dataset: Any) -> Any:
            return self._remember(get_test(test_dataset), test_dataset)

        def evaluation_loop(*args: Any, **kwargs: Any) -> Any:
            output = loop(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            given = signature.parameters.get("metric_key_prefix")
            name = bound.arguments.get("metric_key_prefix", given.default if given is not None else "eval")
            scores = self.scores(name, self._dataset_of(bound.arguments.get("dataloader")))
            replaced = sorted(k for k in scores if k in output.metrics and k not in self._warned)
            if replaced:  # the Trainer's compute_metrics named a score as the tool names its own
                self._warned.update(replaced)
                logger.warning("EvalCallback: %s: the Trainer's compute_metrics gives it too; the tool's score on "
                               "%r's data replaces it", ", ".join(replaced), name)
            output.metrics.update(scores)
            return output

        trainer.get_eval_dataloader, trainer.get_test_dataloader = get_eval_dataloader, get_test_dataloader
        trainer.evaluation_loop = evaluation_loop

    def _remember(self, loader: Any, dataset: Any) -> Any:
        # A loader the Trainer keeps (persistent workers) stays with the dataset it was made for,
        # whatever the dataset later given: it is that one the Trainer evaluates.
        if dataset is not None and self._dataset_of(loader) is None:
            try:
                self._datasets[loader] = dataset
            except TypeError:
                pass  # a loader with no weak reference: its dataset stays unknown
        return loader

    def _dataset_of(self, loader: Any) -> Any:
        try:
            return self._datasets.get(loader)
        except TypeError:  # no weak reference to it: never remembered
            return None

    def scores(self, name: str, dataset: Any) -> dict[str, float]:
        """The scores of the evaluation named `name` of `dataset` (None: not known), under that
        name; {} when there is no data for it."""
        data = self.data.get(name)
        if data is not None and dataset is not None:
            # Declared data belongs to the dataset first evaluated under its name; another dataset
            # evaluated under that name (trainer.evaluate(eval_dataset=other)) is not it.
            first = self._bound.setdefault(name, dataset)
            if first is not dataset:
                data = None
        if data is None:
            data = examples_of(dataset)
        if data is None:
            if name not in self._warned:
                self._warned.add(name)
                why = (f"its declared data is that of the dataset first evaluated as {name!r}, and this is another"
                       if name in self.data else f"no data is declared for it (data={{{name!r}: {{...}}}})")
                logger.warning("EvalCallback: no %s_bleu...: %s; the dataset evaluated as %r carries no %s and %s "
                               "columns", name, why, name, COLUMNS["sources"], COLUMNS["references"])
            return {}
        result = self.evaluation(name, data)
        return scores_of(result.metrics, name)

    def evaluation(self, name: str, data: dict[str, Any]) -> EvalResult:
        """`evaluate` on the Trainer's model and `data`, or the result of an earlier identical one."""
        trainer = self.trainer
        model, tokenizer = trainer.model, trainer.processing_class
        if model is None or tokenizer is None:
            raise ConfigError("EvalCallback: the Trainer has no model or no processing_class (the tokenizer); "
                              "pass processing_class=tokenizer to the Trainer")
        check_checkpoints_hold_the_model(model, self._unsaved)  # unfrozen or changed since
        key, weights = self.what_is_evaluated(model, tokenizer, data)
        result = self._results.get(key)
        if result is None:
            step = trainer.state.global_step
            root = Path(self.save_dir or Path(trainer.args.output_dir) / "seq2seq_eval") / name
            save_dir = root / f"step_{step}"
            if save_dir in self._folders:  # other weights at the same step (loaded by hand)
                save_dir = root / f"step_{step}_weights_{weights[:12]}"
            result = evaluate(model, tokenizer, save_dir=str(save_dir), **data, **self.options)
            self._folders.add(save_dir)
            self._results[key] = result
        self.last = result
        return result

    def what_is_evaluated(self, model: Any, tokenizer: Any, data: dict[str, Any]) -> tuple[str, str]:
        """(the key of an evaluation's result, the weights' fingerprint): everything the result
        depends on. The weights (their bytes, dtypes and devices), the model's config and
        generation config (generate() reads its defaults there), the tokenizer, the options, the
        data options or examples, and the size and modification time of the data files."""
        from .model.fingerprint import tokenizer_digest, weights_fingerprint

        weights = weights_fingerprint(model)
        configs = [getattr(getattr(model, name, None), "to_json_string", lambda: None)()
                   for name in ("config", "generation_config")]
        devices = sorted({str(t.device) for t in model.state_dict().values() if hasattr(t, "device")})
        options = {**self.options, **data}
        parts = [weights, devices, configs, tokenizer_digest(tokenizer),
                 json.dumps(options, sort_keys=True, default=str), _data_stamp(options)]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest(), weights


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


def examples_of(dataset: Any) -> dict[str, Any] | None:
    """evaluate's in-memory examples from the rows of a Trainer dataset (a datasets.Dataset, or a
    list of dicts) that carry them in COLUMNS (the id column optional); None when they do not."""
    if dataset is None:
        return None
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, (list, tuple)):  # datasets.Dataset
        def column(c: str) -> list[Any]:
            return list(dataset[c])
    elif isinstance(dataset, Sequence) and not isinstance(dataset, str) and len(dataset) \
            and all(isinstance(row, Mapping) for row in dataset):
        columns = set.intersection(*(set(row) for row in dataset))  # columns every row has

        def column(c: str) -> list[Any]:
            return [row[c] for row in dataset]
    else:
        return None
    if COLUMNS["sources"] not in columns or COLUMNS["references"] not in columns:
        return None
    return {k: column(c) for k, c in COLUMNS.items() if c in columns}


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


def _data_stamp(options: dict[str, Any]) -> list[list[Any]] | None:
    """The local data files the options name, with their sizes and modification times, so that a
    data file changed between two evaluations makes them differ. In-memory sources are in the
    options themselves; a hub dataset has no files here."""
    from .config import EvalConfig
    from .outputs.locations import data_stamp

    if options.get("sources") is not None:
        return None
    try:
        cfg = EvalConfig(**{k: options[k] for k in _FILE_OPTIONS if options.get(k) is not None})
        return data_stamp(cfg)
    except (EvalError, OSError):
        return None  # evaluate() says what is wrong with them
