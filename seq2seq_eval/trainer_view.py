"""What one of a Trainer's evaluations did, read where a subclass cannot change it, for the
callback (callback.py): its name (the prefix of the metric keys its evaluation loop returned), its
rows (the dataloader that loop iterated, back to the dataset as stored) and its generation
settings (what Seq2SeqTrainer's prediction_step hands to generate()). Each reader returns what it
saw, or says why it cannot know; it never fills a gap with a default."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The columns a Trainer's dataset carries its examples in, for the callback to read them.
COLUMNS = {"sources": "source", "references": "target", "ids": "id"}

# Keys Trainer.evaluation_loop itself adds, as f"{metric_key_prefix}_{suffix}": with the keys of
# compute_metrics, the only ones it returns, every one under that prefix.
LOOP_SUFFIXES = ("loss", "model_preparation_time")
# Keys Trainer.evaluate() and predict() add after the loop, before their on_evaluate/on_predict
# event, under the same prefix (speed_metrics); "epoch" is Trainer.log's, under none.
EVENT_SUFFIXES = (*LOOP_SUFFIXES, "runtime", "samples_per_second", "steps_per_second")
_UNPREFIXED = ("epoch",)


def name_of(metrics: Mapping[str, Any], computed: Iterable[str] | None,
            suffixes: Sequence[str] = LOOP_SUFFIXES) -> str | None:
    """The metric_key_prefix an evaluation ran under, from the keys its loop returned (or its
    event carries, with `suffixes` EVENT_SUFFIXES): the one P with every key f"{P}_..." and its
    own keys there (f"{P}_{suffix}", or each of compute_metrics' keys `computed`, as the loop
    prefixes them). None when no P fits or several do (a compute_metrics key "x_loss" without a
    loss fits "eval_x" as well as "eval" unless its keys are known)."""
    keys = [k for k in metrics if isinstance(k, str) and k not in _UNPREFIXED]
    computed = None if computed is None else [k for k in computed if isinstance(k, str)]
    candidates = {k[: -len(s) - 1] for k in keys for s in (*suffixes, *(computed or ()))
                  if k.endswith(f"_{s}") and len(k) > len(s) + 1}

    def fits(prefix: str) -> bool:
        if not all(k.startswith(f"{prefix}_") for k in keys):
            return False
        if computed is None:
            return True
        # What the loop makes of compute_metrics' keys under that prefix (trainer.py: a key
        # already under the prefix stays as it is).
        return {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}" for k in computed} <= set(keys)

    fitting = sorted(p for p in candidates if fits(p))
    return fitting[0] if len(fitting) == 1 else None


@dataclass(frozen=True)
class Rows:
    """The rows an evaluation loop iterated: `dataset` as stored (before the Trainer removed its
    unused columns), `indices` into it (None: all of them, in order); `why` when not known."""

    dataset: Any = None
    indices: tuple[int, ...] | None = None
    why: str | None = None

    @property
    def count(self) -> int | None:
        if self.why is not None:
            return None
        return len(self.indices) if self.indices is not None else len(self.dataset)


def rows_of(loader: Any, stored: Mapping[Any, Any], world_size: int) -> Rows:
    """The rows `loader` gives, each once, when its sampler says which (sequential, a permutation
    of all rows, or a fixed subset); `stored`: the dataset before the Trainer removed columns, for
    each dataset it removed them from."""
    import torch

    if loader is None:
        return Rows(why="the evaluation loop that ran is not the Trainer's own (it iterated no dataloader the "
                        "Trainer knows of)")
    dataset = getattr(loader, "dataset", None)
    if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset):
        return Rows(why=f"its dataloader reads {type(dataset).__name__}, which has no rows to count")
    try:
        size = len(dataset)
    except TypeError:
        return Rows(why=f"its dataloader's {type(dataset).__name__} has no length")
    batches = getattr(loader, "batch_sampler", None)
    while getattr(batches, "batch_sampler", None) is not None:  # accelerate's BatchSamplerShard
        batches = batches.batch_sampler
    if batches is not None and not isinstance(batches, torch.utils.data.BatchSampler):
        # A DataLoader given its own batch_sampler keeps a default sampler it never draws from.
        return Rows(why=f"its batch sampler ({type(batches).__name__}) does not say which rows it draws, each once")
    sampler = getattr(batches, "sampler", None) or getattr(loader, "sampler", None)
    indices = _sampled(sampler, size)
    if isinstance(indices, str):
        return Rows(why=indices)
    batch_size = getattr(batches, "batch_size", None) or getattr(loader, "batch_size", None)
    count = size if indices is None else len(indices)
    if getattr(batches, "drop_last", False) and batch_size and count % (batch_size * max(world_size, 1)):
        return Rows(why=f"its dataloader drops the last batch (dataloader_drop_last): which of the {count} rows "
                        "the loop kept depends on the batches of every rank")
    # A torch Subset (a subclass's own dataloader): its rows are rows of the dataset beneath.
    while isinstance(dataset, torch.utils.data.Subset):
        inner = list(dataset.indices)
        indices = tuple(inner[i] for i in indices) if indices is not None else tuple(inner)
        dataset = dataset.dataset
    return Rows(dataset=_stored(dataset, stored), indices=indices)


def _stored(dataset: Any, stored: Mapping[Any, Any]) -> Any:
    try:
        return stored.get(dataset, dataset)
    except TypeError:  # not hashable or no weak reference: never recorded
        return dataset


def _sampled(sampler: Any, size: int) -> tuple[int, ...] | None | str:
    """The indices `sampler` draws, each once, sorted (the scores do not depend on the order);
    None for all of them; a reason when that is not known without drawing (a random sampler
    drawn here would move the job's random state)."""
    import torch

    from transformers.trainer_pt_utils import LengthGroupedSampler

    name = type(sampler).__name__
    if isinstance(sampler, torch.utils.data.SequentialSampler):
        return None if len(sampler.data_source) == size else f"its {name} is over {len(sampler.data_source)} rows, " \
                                                              f"not its dataset's {size}"
    if isinstance(sampler, LengthGroupedSampler) or (
            isinstance(sampler, torch.utils.data.RandomSampler) and not sampler.replacement
            and sampler.num_samples == size):
        return None  # a permutation of every row
    if isinstance(sampler, torch.utils.data.SubsetRandomSampler):
        chosen = [int(i) for i in sampler.indices]
        if len(set(chosen)) != len(chosen) or not all(0 <= i < size for i in chosen):
            return f"its {name} draws a row twice or past the dataset's {size}"
        return tuple(sorted(chosen))
    return f"its sampler ({name}) does not say which rows it draws, each once"


def examples_of(dataset: Any, indices: Sequence[int] | None = None) -> dict[str, Any] | None:
    """evaluate's in-memory examples from the rows (`indices`, default all) of a Trainer dataset
    (a datasets.Dataset, or a list of dicts) that carry them in COLUMNS (the id column optional),
    read as stored: a datasets.Dataset without its format or transform; None when they do not."""
    if dataset is None:
        return None
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, (list, tuple)) and hasattr(dataset, "with_format"):  # datasets.Dataset
        # with_format(None): the stored values (set_transform's function, a torch format and a
        # format's column selection all change what indexing returns, never what is stored).
        plain = dataset.with_format(None)
        if indices is not None:
            plain = plain.select(list(indices))

        def column(c: str) -> list[Any]:
            return list(plain[c])
    elif isinstance(dataset, Sequence) and not isinstance(dataset, (str, bytes)) and len(dataset):
        chosen = [dataset[i] for i in (indices if indices is not None else range(len(dataset)))]
        if not chosen or not all(isinstance(row, Mapping) for row in chosen):
            return None
        columns = set.intersection(*(set(row) for row in chosen))  # columns every row has

        def column(c: str) -> list[Any]:
            return [row[c] for row in chosen]
    else:
        return None
    if COLUMNS["sources"] not in columns or COLUMNS["references"] not in columns:
        return None
    return {k: column(c) for k, c in COLUMNS.items() if c in columns}


def dataset_key(dataset: Any, indices: Sequence[int] | None) -> Any:
    """What identifies a dataset's rows from one evaluation to the next: a datasets.Dataset's
    fingerprint (the same for the same select() of the same data, made anew at each evaluation),
    else the object itself, with the rows taken."""
    fingerprint = getattr(dataset, "_fingerprint", None)
    rows = None if indices is None else tuple(indices)
    return ("fingerprint", fingerprint, rows) if isinstance(fingerprint, str) else ("object", id(dataset), rows)


def generation_of(trainer: Any) -> dict[str, Any]:
    """The generate() options the Trainer's prediction_step uses in this evaluation: the
    `**gen_kwargs` of Seq2SeqTrainer.evaluate()/predict() with its arguments' generation_num_beams
    and generation_max_length, as it stores them (`_gen_kwargs`), less the None num_beams and
    max_length it drops; {} for a Trainer that takes none."""
    given = getattr(trainer, "_gen_kwargs", None)
    if not isinstance(given, Mapping):
        return {}
    return {k: v for k, v in given.items() if not (v is None and k in ("num_beams", "max_length"))}


# evaluate()'s options that name files (their size and modification time enter the callback's cache key).
_FILE_OPTIONS = ("data_dir", "dataset", "input_path", "reference_path", "type_path", "task")


def data_stamp_of(options: dict[str, Any]) -> list[list[Any]] | None:
    """The local data files the options name, with their sizes and modification times, so that a
    data file changed between two evaluations makes them differ. In-memory sources are in the
    options themselves; a hub dataset has no files here."""
    from .config import EvalConfig
    from .errors import EvalError
    from .outputs.locations import data_stamp

    if options.get("sources") is not None:
        return None
    try:
        cfg = EvalConfig(**{k: options[k] for k in _FILE_OPTIONS if options.get(k) is not None})
        return data_stamp(cfg)
    except (EvalError, OSError):
        return None  # evaluate() says what is wrong with them
