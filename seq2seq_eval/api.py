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

from .config import CONFIG_FIELDS, EvalConfig
from .errors import ConfigError, DataError, EvalError, RunFailed, first_line

logger = logging.getLogger("seq2seq_eval")

_CONFIG_FIELDS = set(CONFIG_FIELDS)
# Options that make sense only for a separate process on the command line.
_REFUSED = {"dry_run": "evaluate() always runs; --dry_run is for the command line",
            "model_name": "pass the model (an object or a path) as evaluate's first argument"}


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


def score(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], *,
          metrics: str | Sequence[str] = CONFIG_FIELDS["metrics"].default,
          task: str = CONFIG_FIELDS["task"].default, sources: Sequence[str] | None = None,
          comet_model: str = CONFIG_FIELDS["comet_model"].default) -> dict[str, Any]:
    """`seq2seq_eval score` over lists: corpus scores of `predictions` against `references`.

    `references`: one reference per prediction (a list of str), or several reference streams as
    sacrebleu takes them (a list of lists, each aligned with `predictions`). `metrics`: a comma
    list or a sequence of names from bleu, chrf, chrf++, ter, rouge, comet (default: the task's);
    comet needs `sources` and runs `comet_model` here (the first GPU, else the CPU)."""
    from .scoring import totals as metric_fns
    from .scoring.names import parse_metric_names, split_metric_names

    parsed = parse_metric_names(metrics if isinstance(metrics, str) else ",".join(metrics), task)
    model_names = split_metric_names(parsed, task)[1]
    names = tuple(n for n in parsed if n not in model_names)  # with comet alone, nothing else
    if model_names and sources is None:
        raise ConfigError(f"metrics {','.join(model_names)}: needs sources, one per prediction")
    preds = _texts(predictions, "predictions")
    if not preds:
        raise DataError("predictions: empty; expected one prediction per example")
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise DataError(f"references: expected a list of texts or a list of reference streams, got {type(references).__name__}")
    streams = [references] if all(isinstance(r, str) for r in references) else list(references)
    if not streams:
        raise DataError("references: empty; expected one reference per prediction")
    checked = []
    for k, stream in enumerate(streams):
        where = "references" if len(streams) == 1 else f"references[{k}]"
        texts = _texts(stream, where)
        if len(texts) != len(preds):
            raise DataError(f"{where}: {len(texts)} texts but {len(preds)} predictions; expected one reference per prediction")
        for i, t in enumerate(texts):
            if not t.strip():
                raise DataError(f"{where}[{i}]: empty reference; expected non-empty text")
        checked.append(texts)
    refs = list(zip(*checked)) if len(checked) > 1 else checked[0]
    result = metric_fns.score_metrics(names, preds, refs) if names else {}
    if model_names:
        from .scoring.model_metric import corpus_scores

        result.update(corpus_scores(model_names, comet_model, _texts(sources, "sources"), preds, checked))
    return result


def _texts(values: Any, where: str) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise DataError(f"{where}: expected a list of texts, got {type(values).__name__}")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(f"{where}[{i}]: expected a text, got {type(v).__name__}")
    return list(values)


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
    text, or a list of texts, per source) and `ids`; these are written to
    {save_dir}/{type_path}_inputs.jsonl (or _sources.txt without references), which the command
    line can evaluate again.

    `options`: EvalConfig's fields by their command-line names, with the same defaults (task,
    metrics, bs, max_tokens, save_dir, tmp_dir, sync_timeout, seed, ...); any other keyword, or
    `generate_kwargs`, is a model.generate() option as the command line's --key value
    (num_beams=4, max_new_tokens=64).

    `process_group`: the group whose ranks evaluate together (default: the job's default group,
    which must be initialized when the job has several ranks); a group of every rank, as every
    rank of the job calls evaluate, with the same arguments. The ranks share the work as the command line's ranks do;
    every rank gets the metrics, and the examples with `return_examples=True`."""
    import torch.distributed as tdist

    from .run.dist import DistEnv, ProcessGroup, dist_env

    in_memory = model is not None and not isinstance(model, (str, Path))
    cfg = _config(model, in_memory, sources, references, ids, generate_kwargs, options)
    if in_memory:
        model = _unwrap(model)
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

    base = dist_env()
    if process_group is not None or (tdist.is_available() and tdist.is_initialized()):
        pg, env = ProcessGroup.adopt(base, process_group if process_group is not None else tdist.group.WORLD,
                                     cfg.sync_timeout)
    elif base.world_size > 1:
        raise ConfigError(
            f"rank {base.rank} of {base.world_size}: no process group is initialized; call "
            "torch.distributed.init_process_group() on every rank before evaluate(), or pass process_group"
        )
    else:
        env = DistEnv(launcher=base.launcher)
        pg = ProcessGroup(env, "gloo", cfg.sync_timeout)
    try:
        if in_memory:
            pg.main_first(lambda: _clear_failed_run(Path(cfg.tmp_dir)), EvalError)
        if sources is not None:
            pg.main_first(lambda: _write_inputs(cfg, sources, references, ids), DataError)
        from .run.runner import run

        failure: BaseException | None = None
        payload: Any = None
        try:
            with _untouched(model if in_memory else None):  # the RNG too, for a path
                outcome = run(cfg, env, process_group=pg, model=model if in_memory else None, tokenizer=tokenizer)
            if env.is_main:
                payload = _payload(cfg, outcome, return_examples)
        except BaseException as e:
            if not env.is_main:
                # Rank 0 learns of it when this rank's file never comes (within --sync_timeout).
                raise
            failure = e
            if in_memory and isinstance(e, EvalError) and _RESUME_HINT in str(e):
                # The command line's hint does not apply: a model object's evaluation starts over.
                failure = type(e)(str(e).split(_RESUME_HINT)[0] + "; the next evaluate() starts over")
                failure.__cause__ = e
        return _share(pg, env, payload, failure)
    finally:
        pg.close()


_RESUME_HINT = "; resume with: "


def _clear_failed_run(tmp_dir: Path) -> None:
    """A model object's evaluation is never resumed (the weights it ran on are gone), so an
    earlier one that failed in the same tmp_dir (a training loop's previous epoch) would only
    block this one: its files are removed, unless another run holds the folder's lock."""
    from .run.tmpdir import MANIFEST, RunLock, cleanup_tmp_dir

    if not (tmp_dir / MANIFEST).exists():
        return
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
    for key, why in _REFUSED.items():
        if key in options:
            raise ConfigError(f"evaluate(): {key}: {why}")
    values = {k: v for k, v in options.items() if k in _CONFIG_FIELDS and k != "generate_kwargs"}
    gen = {k: v for k, v in options.items() if k not in _CONFIG_FIELDS}
    if "generate_kwargs" in options:
        raise ConfigError("evaluate(): pass generate options as keywords or as generate_kwargs={...}")
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
    for key in ("data_dir", "dataset", "input_path", "reference_path"):
        if options.get(key):
            raise ConfigError(f"evaluate(): sources replace {key}; pass only one of them")
    cfg = EvalConfig(**values)  # validated before its data file is named
    prefix = Path(cfg.save_dir) / cfg.output_prefix
    if references is None:
        if ids is not None:
            raise ConfigError("evaluate(): ids need references (without them the examples are numbered by position)")
        return EvalConfig(**values, input_path=f"{prefix}_sources.txt")
    return EvalConfig(**values, data_dir=f"{prefix}_inputs.jsonl")


def _write_inputs(cfg: EvalConfig, sources: Any, references: Any, ids: Any) -> None:
    """In-memory examples as the command line reads them. Rewritten only when they changed: the
    examples cache is keyed by the file's modification time."""
    from .atomic import write_atomic

    texts = _texts(sources, "sources")
    if not texts:
        raise DataError("sources: empty; expected one source per example")
    for i, s in enumerate(texts):
        if not s.strip():
            raise DataError(f"sources[{i}]: empty source; expected non-empty text")
    if references is None:
        for i, s in enumerate(texts):
            if "\n" in s or "\r" in s:
                raise DataError(f"sources[{i}]: a line break inside a source; pass references (the examples "
                                "are then written as JSON Lines) or remove it")
        path, data = Path(cfg.input_path), "".join(s + "\n" for s in texts).encode("utf-8")  # type: ignore[arg-type]
    else:
        if isinstance(references, str) or not isinstance(references, Sequence) or len(references) != len(texts):
            n = len(references) if isinstance(references, Sequence) else type(references).__name__
            raise DataError(f"references: {n} but {len(texts)} sources; expected one reference (or list of references) per source")
        if ids is None:
            ids = range(len(texts))
        elif isinstance(ids, str) or not isinstance(ids, Sequence) or len(ids) != len(texts):
            n = len(ids) if isinstance(ids, Sequence) else type(ids).__name__
            raise DataError(f"ids: {n} but {len(texts)} sources; expected one id per source")
        seen: dict[Any, int] = {}
        lines = []
        for i, (ex_id, s, r) in enumerate(zip(ids, texts, references)):
            if isinstance(ex_id, bool) or not isinstance(ex_id, (int, str)):
                raise DataError(f"ids[{i}]: must be a string or an integer, got {ex_id!r}")
            if ex_id in seen:
                raise DataError(f"ids[{i}]: duplicated id {ex_id!r} (first at ids[{seen[ex_id]}])")
            seen[ex_id] = i
            target = [r] if isinstance(r, str) else _texts(r, f"references[{i}]")
            if not target or any(not t.strip() for t in target):
                raise DataError(f"references[{i}]: empty reference; expected non-empty text (or a list of them)")
            lines.append(json.dumps({"id": ex_id, "source": s, "target": target[0] if len(target) == 1 else target}, ensure_ascii=False) + "\n")
        path, data = Path(cfg.data_dir), "".join(lines).encode("utf-8")
    from .outputs.record import OutputRecord

    if path.is_file() and path.read_bytes() == data:
        return  # nothing to write (and the examples cache keeps its key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = OutputRecord(path.parent)
    record.check_writable([path], {path: "the examples evaluate() was given"})
    write_atomic(path, data)
    record.update(written=[path])


def _unwrap(model: Any) -> Any:
    """The module that generates: DistributedDataParallel's (and DataParallel's, torch.compile's)
    inner module, whose generate() runs no collective, so ranks may run different numbers of
    batches. FSDP shards the weights: its forward gathers them with collectives every rank must
    join, which uneven batches would deadlock."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
            model = model._orig_mod
        else:
            break
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"evaluate(): model must be a torch module or a path, got {type(model).__name__}")
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return model
    if isinstance(model, FullyShardedDataParallel) or any(isinstance(p, DTensor) for p in model.parameters()):
        raise ConfigError(
            "evaluate(): the model is sharded by FSDP; generation would gather its weights with collectives "
            "every rank must join, which uneven batches deadlock. Save a checkpoint (full state dict) and pass "
            "its path, or pass an unsharded copy of the model"
        )
    return model


@contextlib.contextmanager
def _untouched(model: Any) -> Iterator[None]:
    """Run generation inside a training job without changing what the job sees afterwards.

    The engine seeds torch per batch (batch k: seed + k, so sampled text does not depend on the
    world size); fork_rng puts the job's CPU and CUDA random states back, so its next dropout
    mask and shuffle are those of a job that never evaluated. The engine also replaces the
    model's generation_config with the run's settings, and generation needs eval mode (no
    dropout): both are restored, per submodule, as are the requires_grad flags."""
    import torch

    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        if model is None:  # a model loaded from a path: only the random state is the job's
            yield
            return
        modes = [(m, m.training) for m in model.modules()]
        flags = [(p, p.requires_grad) for p in model.parameters()]
        own_config = getattr(model, "generation_config", None)
        model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for m, training in modes:
                m.training = training
            for p, requires_grad in flags:
                p.requires_grad_(requires_grad)
            if own_config is not None:
                model.generation_config = own_config


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
        from . import errors

        error_type = getattr(errors, kind, None)
        if isinstance(error_type, type) and issubclass(error_type, EvalError):
            raise error_type(f"rank 0: {text}")
        raise RunFailed(f"rank 0 failed: {kind}: {text}")
    return EvalResult(**message[1])
