"""The Python API: `evaluate` on the processes of a running job, `score` over lists.

`evaluate` is the command line's run (the same plan, journals, rank files, merge by id and
metrics) called from Python on every rank of a job that is already running, such as a training
job under torchrun, with the model it is training. `compare` lives beside the `compare`
subcommand (comparison.systems.compare); `seq2seq_eval.compare(...)` is it.

Errors are the typed errors the command line turns into one line (errors.py), never SystemExit.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import CONFIG_FIELDS, EvalConfig, family_of
from .errors import ConfigError, DataError, EvalError, as_error, first_line
from .model.in_memory import unwrap, untouched
from .scoring.registry import split_options
from .selection.options import gather

logger = logging.getLogger("seq2seq_eval")

_CONFIG_FIELDS = set(CONFIG_FIELDS)
# Options that make sense only for a separate process on the command line.
_REFUSED = {"dry_run": "evaluate() always runs; --dry_run is for the command line",
            "model_name": "pass the model (an object or a path) as evaluate's first argument",
            "metric_options": "pass each model metric's option by its name (comet_model=...)"}


@dataclass(frozen=True)
class EvalResult:
    """What `evaluate` returns on every rank."""

    metrics: dict[str, Any]
    """The metric file's content ({type_path}_bleu.json or _rouge.json; the run info for pseudolabels)."""
    examples: list[dict[str, Any]] | None = None
    """With return_examples=True: {type_path}_examples.jsonl's records in data order (id, source,
    references, prediction, sentence scores)."""
    files: tuple[str, ...] = ()
    """The files written into save_dir."""


def score(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]] | None, *,
          metrics: str | Sequence[str] | None = CONFIG_FIELDS["metrics"].default,
          task: str | None = CONFIG_FIELDS["task"].default, reference_layout: str | None = None,
          sources: Sequence[str] | None = None, **metric_options: Any) -> dict[str, Any]:
    """`seq2seq_eval score` over lists: corpus scores of `predictions` against `references`.

    `references`, as `evaluate` takes them: one text (or a list of texts) per prediction, or
    reference streams as sacrebleu takes them (a list of lists, each aligned with
    `predictions`). A list of N lists of N texts fits both and is refused unless
    `reference_layout` ("examples" or "streams") says which (scoring.references). `metrics`: a
    comma list or a sequence of names from bleu, chrf, chrf++, ter, rouge and the model metrics
    (default: the task's); a model metric that needs `sources` (comet) is refused without them;
    `references` None runs the reference-free metrics (each metric's inputs: docs/metrics.md), any
    other is refused in one line; a model metric runs its model here (the first GPU, else the CPU). `metric_options`: the model metrics'
    options by name, as the command line's flags (comet_model=..., model_metric_max_tokens=...;
    scoring/registry.py); any other keyword is refused. `sources`, when given, are checked as a
    run checks them (one text per prediction). None for any keyword means not given: its default."""
    return _score(predictions, references, metrics=metrics, task=task, reference_layout=reference_layout,
                  sources=sources, **metric_options)


def _score(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]] | None, *,
           metrics: str | Sequence[str] | None, task: str | None, reference_layout: str | None,
           sources: Sequence[str] | None, ranks: Any = None, **metric_options: Any) -> dict[str, Any]:
    """`score`; `ranks` (model_metric.Ranks): `seq2seq_eval score` under torchrun, the model
    metrics' batches shared among the ranks."""
    from .inputs.memory import source_texts, texts
    from .scoring import registry
    from .scoring import totals as metric_fns
    from .scoring.names import parse_metric_names, split_metric_names
    from .scoring.references import per_example

    task = CONFIG_FIELDS["task"].default if task is None else task
    options = dict(registry.resolve_options(metric_options, "score(): "))
    parsed = parse_metric_names(metrics, task)
    model_names = split_metric_names(parsed, family_of(task) or "translation")[1]
    registry.refuse_unused(options, model_names, f"metrics={metrics!r}")
    names = tuple(n for n in parsed if n not in model_names)  # with a model metric alone, nothing else
    shown = f"metrics {','.join(parsed)}"
    # The run's, `score`'s and compare's rule, before any model loads.
    registry.check_inputs(parsed, options, shown, no_sources=None if sources is not None else "sources=, one per "
                          "prediction", no_references=None if references is not None else "references=, one or more "
                          "per prediction")
    preds = texts(predictions, "predictions")
    if not preds:
        raise DataError("predictions: empty; expected one prediction per example")
    rows = per_example(references, len(preds), reference_layout) if references is not None else [()] * len(preds)
    most = max(len(r) for r in rows)
    registry.check_inputs(parsed, options, shown, references=most, references_from=f"references= gives {most} for an "
                          "example")
    srcs = source_texts(sources, len(preds)) if sources is not None else None
    refs = [r[0] for r in rows] if all(len(r) == 1 for r in rows) else [tuple(r) for r in rows]
    result = metric_fns.score_metrics(names, preds, refs) if names else {}
    if model_names:
        result.update(registry.corpus_scores(model_names, options, srcs if srcs is not None else [""] * len(preds),
                                             preds, rows, ranks=ranks))
    return result


def evaluate(
    model: Any = None,
    tokenizer: Any = None,
    *,
    sources: Sequence[str] | None = None,
    references: Sequence[str] | Sequence[Sequence[str]] | None = None,
    ids: Sequence[int | str] | None = None,
    process_group: Any = None,
    return_examples: bool = False,
    generate_kwargs: Mapping[str, Any] | None = None,
    reference_layout: str | None = None,
    **options: Any,
) -> EvalResult:
    """Evaluate `model` on every rank of the running job; returns the same result on every rank.

    `model`: a seq2seq model object (plain, or wrapped in DistributedDataParallel) with its
    `tokenizer`, or a path / hub name (the command line's --model_name; the tokenizer then
    defaults to the model's). An object is used where it is, in its dtype, in eval mode and
    without gradients; its device, dtype, training mode, requires_grad flags, generation config
    and the torch random state (CPU and CUDA) are as they were afterwards. FSDP-sharded models are
    refused: see docs/python-api.md.

    The data: the command line's options (data_dir, dataset and its columns, input_path and
    reference_path, type_path, n_obs), or in-memory `sources` with optional `references` (one
    text, or a list of texts, per source; or reference streams, as `score` reads them, with
    `reference_layout` for the one shape that fits both) and `ids`; these are published with the
    outputs, in the same transaction, as {save_dir}/{type_path}_inputs.jsonl (or _sources.txt
    without references), which the command line can evaluate again.

    `options`: EvalConfig's fields by their command-line names, with the same defaults (task,
    metrics, bs, max_tokens, save_dir, tmp_dir, sync_timeout, seed, ...); None for any of them
    (and for every keyword above) means not given. Any other keyword, or `generate_kwargs`, is a
    model.generate() option as the command line's --key value (num_beams=4, max_new_tokens=64;
    None is then a value, as --key none is).

    `process_group`: the group whose ranks evaluate together (default: the job's default group,
    which must be initialized when the job has several ranks); a group of every rank, as every
    rank of the job calls evaluate, with the same arguments. The ranks share the work as the command line's ranks do;
    every rank gets the metrics, and the examples with `return_examples=True`."""
    import torch.distributed as tdist

    from .inputs.memory import in_memory_inputs
    from .run.agree import digest, settings_of, what_ranks_run
    from .run.dist import DistEnv, ProcessGroup, dist_env

    in_memory = model is not None and not isinstance(model, (str, Path))
    group = process_group if process_group is not None else (
        tdist.group.WORLD if tdist.is_available() and tdist.is_initialized() else None)
    try:
        cfg = _config(model, in_memory, sources, references, ids, generate_kwargs, options)
        if in_memory:
            model = unwrap(model)
        _check_model_args(cfg, in_memory, tokenizer)
        # What each rank holds (weights, tokenizer, effective generation settings), compared
        # before any work: the same arguments on two ranks can name different objects.
        held = what_ranks_run(cfg, model if in_memory else None, tokenizer) if _several(group) else {}
    except Exception as e:
        if group is not None:  # the other ranks hear it at the check-in, not as a lost peer
            _agreement(group, None, e, 0.0)
        raise
    base = dist_env()
    if group is not None:
        extra = {"model": cfg.model_name, "in_memory_examples": digest([sources, references, ids, reference_layout])
                 if sources is not None else None, **held}
        agreement = _agreement(group, settings_of(cfg, extra), None, cfg.sync_timeout)
        pg, env = ProcessGroup.adopt(base, group, cfg.sync_timeout)
        pg.peer_check = agreement.raise_if_peer_failed if agreement is not None else None
    elif base.world_size > 1:
        raise ConfigError(
            f"rank {base.rank} of {base.world_size}: no process group is initialized; call "
            "torch.distributed.init_process_group() on every rank before evaluate(), or pass process_group"
        )
    else:
        agreement = None
        env = DistEnv(launcher=base.launcher)
        pg = ProcessGroup(env, "gloo", cfg.sync_timeout)
    try:
        # main_first gives rank 0's failure to every rank itself.
        if in_memory:
            pg.main_first(lambda: _clear_failed_run(Path(cfg.tmp_dir)))
        # Read by the run from its temp dir; their copy in save_dir is published with the outputs.
        inputs = pg.main_first(lambda: in_memory_inputs(cfg, sources, references, ids, reference_layout)
                               ) if sources is not None else None
        from .run.runner import run

        failure: BaseException | None = None
        payload: Any = None
        try:
            with untouched(model if in_memory else None), _own_forward(model if in_memory else None):
                outcome = run(cfg, env, process_group=pg, model=model if in_memory else None, tokenizer=tokenizer,
                              inputs=inputs)
            if env.is_main:
                payload = _payload(cfg, outcome, return_examples)
        except BaseException as e:
            if agreement is not None:
                # A rank that failed because another did (its collective lost that peer, rank 0
                # found its rank file missing) raises that rank's error; a rank that failed
                # first says why on the store before its group goes.
                peer = agreement.peer_error()
                if peer is not None:
                    raise peer from e
                if getattr(e, "from_rank", None) is None:  # another rank's error is that rank's to publish
                    agreement.publish(e)
            if not env.is_main:
                raise
            failure = e
            if in_memory and isinstance(e, EvalError) and _RESUME_HINT in str(e):
                # The command line's hint does not apply: a model object's evaluation starts over.
                failure = type(e)(str(e).split(_RESUME_HINT)[0] + "; the next evaluate() starts over")
                failure.__cause__ = e
        return _share(pg, env, payload, failure)
    finally:
        pg.close()


@contextlib.contextmanager
def _own_forward(model: Any) -> Iterator[None]:
    """The model's own forward while it generates. accelerate's mixed precision (a Trainer with
    bf16=True or fp16=True) replaces a model's forward by one under autocast, keeping the original
    as _original_forward: generation would compute in half precision, and differ from the command
    line on a checkpoint of the same weights. The job's forward is put back afterwards."""
    patched = vars(model).get("forward") if model is not None else None
    own = getattr(model, "_original_forward", None)
    if patched is None or own is None:
        yield
        return
    model.forward = own
    try:
        yield
    finally:
        model.forward = patched


def _check_model_args(cfg: EvalConfig, in_memory: bool, tokenizer: Any) -> None:
    if in_memory:
        if tokenizer is None:
            raise ConfigError("evaluate(model, tokenizer): a model object needs its tokenizer")
    elif tokenizer is not None:
        raise ConfigError("evaluate(): tokenizer is for a model object; a model path brings its own tokenizer")
    if in_memory and (cfg.fp16 or cfg.bf16):
        raise ConfigError("fp16/bf16: a model object runs in its own dtype; cast it, or pass a path")
    if in_memory and cfg.engine != "hf":
        raise ConfigError(f"engine {cfg.engine!r} loads its model from a path; a model object runs on engine 'hf'")
    if in_memory and cfg.resume:
        # The manifest cannot tell a model object's weights from its weights an epoch later.
        raise ConfigError("resume: a model object's earlier evaluation cannot be resumed; pass a saved checkpoint's path")


def _several(group: Any) -> bool:
    import torch.distributed as tdist

    return group is not None and tdist.get_world_size(group) > 1


def _agreement(group: Any, settings: dict[str, str] | None, error: BaseException | None, timeout_s: float) -> Any:
    """Check in with the group's other ranks (run.agree): with this rank's settings, or with
    the error its arguments raised. None with one rank; raises on every rank when they differ."""
    import torch.distributed as tdist
    from torch.distributed.distributed_c10d import _get_default_store

    from .run.agree import Agreement

    ranks = tdist.get_process_group_ranks(group)
    if len(ranks) < 2 or tdist.get_rank() not in ranks:
        return None  # one rank: nothing to agree on; not a member: ProcessGroup.adopt says so
    agreement = Agreement(_get_default_store(), ranks, tdist.get_rank(group), timeout_s)
    agreement.check_in(settings, error)
    return agreement


_RESUME_HINT = "; resume with: "
_DATA_OPTIONS = ("data_dir", "dataset", "input_path", "reference_path")  # in-memory sources replace them


def _clear_failed_run(tmp_dir: Path) -> None:
    """A model object's evaluation is never resumed (the weights it ran on are gone), so an
    earlier one that failed in the same tmp_dir (a training loop's previous epoch) would only
    block this one: its files are removed, unless another run holds the folder's lock. Only a
    model object's run is removed, known by its manifest: a command line's interrupted run there
    can still be resumed, and its journals are not this call's to remove."""
    from .run.prepare import IN_MEMORY_NAME
    from .run.tmpdir import MANIFEST, RunLock, cleanup_tmp_dir

    if not (tmp_dir / MANIFEST).exists():
        return
    try:
        name = json.loads((tmp_dir / MANIFEST).read_text(encoding="utf-8"))["model"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = None
    if not (isinstance(name, str) and name.startswith(IN_MEMORY_NAME)):
        raise EvalError(f"--tmp_dir {tmp_dir}: holds an earlier run of {name or 'an unknown model'} that is not a "
                        "model object's and may still be resumed; evaluate() leaves it alone: pass another "
                        "tmp_dir, or finish or remove that run first")
    lock = RunLock(tmp_dir)
    try:
        lock.acquire()
    except EvalError:
        return  # in use: the run itself says so
    try:
        logger.warning("%s: removing a failed earlier evaluation's files (a model object's run starts over)", tmp_dir)
        cleanup_tmp_dir(tmp_dir)
    finally:
        lock.release()


def _config(model: Any, in_memory: bool, sources: Any, references: Any, ids: Any,
            generate_kwargs: Mapping[str, Any] | None, options: dict[str, Any]) -> EvalConfig:
    """The command line's config from keyword arguments: EvalConfig's fields by name, any other
    keyword a generate option (the command line's leftover --key value pairs)."""
    # None for an option means not given: data_dir=args.data_dir beside sources gets the sources.
    # (A generate option's None is a value, as --key none and model.generate(key=None) take it.)
    options = {k: v for k, v in options.items() if not (v is None and k in _CONFIG_FIELDS)}
    for key, why in _REFUSED.items():
        if key in options:
            raise ConfigError(f"evaluate(): {key}: {why}")
    rest, metric_options = split_options(options)  # each model metric's options, by name
    rest = gather(dict(rest))  # select= and select_metric= as the command line's --select (selection/options.py)
    values = {k: v for k, v in rest.items() if k in _CONFIG_FIELDS and k != "generate_kwargs"}
    values["metric_options"] = tuple(metric_options.items())
    gen = {k: v for k, v in rest.items() if k not in _CONFIG_FIELDS}
    if "generate_kwargs" in options:
        raise ConfigError("evaluate(): pass generate options as keywords or as generate_kwargs={...}")
    if generate_kwargs is not None and not isinstance(generate_kwargs, Mapping):
        raise ConfigError(f"evaluate(): generate_kwargs must be a dict of generate options, got "
                          f"{type(generate_kwargs).__name__}")
    for key, value in (generate_kwargs or {}).items():
        if key in gen:
            raise ConfigError(f"evaluate(): generate option {key} given twice")
        gen[key] = value
    values["generate_kwargs"] = tuple(gen.items())
    if in_memory:
        values["model_name"] = f"<in-memory {type(model).__name__}>"
    elif model is not None:
        values["model_name"] = str(model)
    if sources is None:
        if references is not None or ids is not None:
            raise ConfigError("evaluate(): references and ids go with sources")
        return EvalConfig(**values)
    for key in _DATA_OPTIONS:
        if options.get(key):
            raise ConfigError(f"evaluate(): sources replace {key}; pass only one of them")
        values.pop(key, None)  # "" (data_dir's default): not given either
    cfg = EvalConfig(**values)  # validated before its data file is named
    prefix = Path(cfg.save_dir) / cfg.output_prefix
    if references is None:
        if ids is not None:
            raise ConfigError("evaluate(): ids need references (without them the examples are numbered by position)")
        return EvalConfig(**values, input_path=f"{prefix}_sources.txt")
    return EvalConfig(**values, data_dir=f"{prefix}_inputs.jsonl")


def _payload(cfg: EvalConfig, outcome: Any, return_examples: bool) -> dict[str, Any]:
    """Rank 0's result, as every rank receives it."""
    examples = None
    if return_examples:
        path = Path(cfg.save_dir) / f"{cfg.output_prefix}_examples.jsonl"
        if path not in outcome.written:
            raise ConfigError("return_examples needs the examples file: a scored run without no_examples_file")
        with open(path, encoding="utf-8") as f:
            examples = [json.loads(line) for line in f]
    return {"metrics": outcome.metrics, "examples": examples, "files": tuple(str(p) for p in outcome.written)}


def _share(pg: Any, env: Any, payload: Any, failure: BaseException | None) -> EvalResult:
    """Rank 0's result, or its error, on every rank. The other ranks finished their part (a rank
    that failed raised already) and wait here; the wait is bounded by --sync_timeout."""
    if env.is_main:
        if failure is not None:
            with contextlib.suppress(EvalError):  # a rank that is gone does not hear it
                pg.broadcast(("error", type(failure).__name__, first_line(failure)))
            raise failure
        pg.broadcast(("ok", payload))
        return EvalResult(**payload)
    message = pg.broadcast(None)
    if message[0] == "error":
        _, kind, text = message
        raise as_error(0, kind, text)
    return EvalResult(**message[1])
