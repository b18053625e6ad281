"""The one frozen run configuration, built once by the CLI and passed down."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .inputs.checks import check_option_texts
from .model.fields import value_error
from .scoring import registry
from .scoring.names import parse_metric_names, split_metric_names
from .selection.options import SelectOptions

TASKS = ("translation", "summarization")
"""Task families: what --task is scored as (BLEU or ROUGE)."""
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "nccl", "gloo")
ENGINE_NAMES = ("hf", "ctranslate2")
"""--engine choices (seq2seq_eval.engines has one module each)."""
COMPUTE_TYPES = ("default", "auto", "float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16")
"""CTranslate2's compute types, passed through by --compute_type."""

# The embedded default (model and data in the repo, in a source checkout or editable install only): no arguments, no network.
REPO_ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_MODEL = REPO_ROOT / "data_samples" / "model"
EMBEDDED_DATA = {task: REPO_ROOT / "data_samples" / task for task in TASKS}

def family_of(task: str) -> str | None:
    """The family a task name belongs to, as the legacy scripts read it: any name containing
    "translation" (translation_en_to_de) is scored with BLEU, one containing "summarization"
    (summarization_xsum) with ROUGE; None for anything else."""
    if "translation" in task:
        return "translation"
    if "summarization" in task:
        return "summarization"
    return None


def parse_value(text: str) -> Any:
    """A command-line value as int, float, bool, None or string (the legacy script's rules)."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for cast in (int, float):
        try:
            value = cast(text)
        except ValueError:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            return text
        return value
    return text


@dataclass(frozen=True)
class EvalConfig:
    """Everything a run needs. Field docstrings double as `--help` text."""

    model_name: str = str(EMBEDDED_MODEL)
    """Local path or Hugging Face hub name of a seq2seq model (default: the embedded model)."""
    data_dir: str = ""
    """Folder with {type_path}.source/.target, or a .jsonl file (default: the embedded sample set of --task)."""
    input_path: str | None = None
    """A file with one source per line, instead of --data_dir (the legacy run_eval.py's INPUT_PATH)."""
    reference_path: str | None = None
    """The references of --input_path, one per line; without it the run only generates."""
    save_dir: str = "eval_results"
    """Where the metrics, generations and pseudolabels are written."""
    save_dir_of: str = ""
    """Not an option: set by the legacy form given no --save_dir to its SAVE_PATH, whose hidden folder (.NAME.seq2seq_eval beside it) is then the save folder; messages name that folder and SAVE_PATH, not --save_dir."""
    type_path: str = "test"
    """Split name: reads {data_dir}/{type_path}.source and .target."""
    task: str = "translation"
    """translation (BLEU), summarization (ROUGE), or a name containing one of them, such as a key of the model's task_specific_params (translation_en_to_de), whose entry is then applied."""
    metrics: str | None = None
    """Comma list of metrics to compute: bleu, chrf, chrf++, ter, rouge, or a model metric (docs/metrics.md) (default: bleu for translation, rouge for summarization); a scored run only."""
    metric_options: tuple[tuple[str, Any], ...] = ()
    """The model metrics' options by name (--comet_model, --model_metric_max_tokens, ...: scoring/registry.py), each given or its default."""
    bs: int | None = None
    """Examples per batch, instead of a --max_tokens budget (default: neither given, the device's measured best budget, the same at any world size: --max_tokens 1024 on CPU (2048 with --engine ctranslate2), on a GPU 32768 (65536 with --fp16/--bf16 or --engine ctranslate2); the run records the budget it took, docs/performance.md)."""
    max_tokens: int | None = None
    """Fill batches up to this many padded source tokens instead of a fixed --bs (the default on every device; see --bs)."""
    budget_for_world_size: bool = False
    """With neither --bs nor --max_tokens: lower the default budget on a set too small to keep every rank busy, so that no rank idles; the budget, and so the outputs' last bits, then depend on the world size (printed and recorded; docs/performance.md)."""
    max_source_length: int | None = None
    """Sources are truncated to this many tokens (default: the model's own limit, as the tokenizer or config gives it)."""
    n_obs: int | None = None
    """Evaluate only the first n_obs examples."""
    num_return_sequences: int = 1
    """>1 writes N candidates per example (pseudolabels) instead of scoring."""
    sync_timeout: float = 600.0
    """Seconds rank 0 waits for the other ranks' files (and for collectives) before failing."""
    tmp_dir: str = ""
    """Per-run working folder with journals and rank files (default: {save_dir}_tmp)."""
    prefix: str | None = None
    """Text prepended to every source (default: the model config's task prefix, if any)."""
    src_lang: str | None = None
    """Source language code for multilingual tokenizers (mBART-50, NLLB, M2M100)."""
    tgt_lang: str | None = None
    """Target language code; also forces the first generated token for multilingual models."""
    device: str = "auto"
    """auto (the local GPU when there is one, else CPU), cpu or cuda."""
    dist_backend: str = "auto"
    """Process group backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo (gloo lets several ranks share one GPU)."""
    seed: int = 0
    """Seed for sampling (--do_sample true); batch k uses seed + k, so a sampled run repeats exactly at any world size."""
    fp16: bool = False
    """Run the model in float16."""
    bf16: bool = False
    """Run the model in bfloat16."""
    engine: str = "hf"
    """Generation engine: hf (model.generate()) or ctranslate2 (converted once into a cache; pip install -e ".[ctranslate2]")."""
    compute_type: str | None = None
    """--engine ctranslate2 only: CTranslate2's compute type (default, float32, int8, int8_float32, float16, int8_float16, bfloat16, ...)."""
    tokenizer_name: str | None = None
    """The Hugging Face tokenizer, when --model_name is an already converted CTranslate2 model folder without one."""
    debug: bool = False
    """Keep the temp dir, write the ordered references, log from every rank, show tracebacks."""
    resume: bool = False
    """Continue a run whose temp dir holds finished batches (same model, data and settings)."""
    no_steal: bool = False
    """Keep every rank to its planned share: no rank takes batches a slower rank has not started (stealing is on by default; this switch exists to measure what it gains, as benchmarks/steal.py does)."""
    shared_tail: bool = False
    """With several ranks: each rank writes its slice of the outputs (by data position) in place, and rank 0 completes them, instead of rank 0 writing every output (docs/scale.md)."""
    dry_run: bool = False
    """Validate flags, data and model, print the batch plan, and exit without generating."""
    pseudo_target: bool = False
    """With --num_return_sequences: also write the best candidates as {type_path}.pseudo.target."""
    selection: SelectOptions = field(default_factory=SelectOptions)
    """--select and --select_metric (selection/options.py): each example's generation chosen of its N candidates."""
    compare_to: str | None = None
    """An earlier run's --save_dir (same examples): adds a paired significance test against it to the metric file and the summary."""
    no_examples_file: bool = False
    """Do not write {type_path}_examples.jsonl (per-example predictions, references and sentence scores)."""
    dataset: str | None = None
    """Hugging Face dataset name or local path (json/csv/parquet file or save_to_disk folder)."""
    dataset_config: str | None = None
    """Configuration name passed to datasets.load_dataset."""
    split: str | None = None
    """Dataset split (default: --type_path)."""
    source_column: str | None = None
    """Source column; dotted paths like translation.en reach into nested columns."""
    target_column: str | tuple[str, ...] | None = None
    """Target column (dotted paths allowed); give it more than once, or name a column of lists, for several references."""
    id_column: str | None = None
    """Id column (default: 'id' when present, else the row number)."""
    prompt_template: str | None = None
    """Decoder-only models: the prompt, with {source} where each source goes and {column} for another column of a JSON Lines or dataset input (default: {source}; the source prefix comes first); \\n in the shell text is a newline (docs/causal.md)."""
    apply_chat_template: bool = False
    """Decoder-only models: put each prompt through the tokenizer's chat template as the user's turn, with the generation prompt."""
    system_instruction: str | None = None
    """With --apply_chat_template: a system turn before the prompt."""
    num_fewshot: int = 0
    """Decoder-only models: this many examples of --fewshot_file before every prompt, the same for all, chosen by --seed."""
    fewshot_file: str | None = None
    """With --num_fewshot: a JSON Lines file of {"source": ..., "target": ...} examples (an "id" each, optional)."""
    truncate_prompt: str | None = None
    """Decoder-only models: left keeps a prompt's last tokens (and its BOS) when it is longer than the model's positions less --max_new_tokens; without it, such a prompt is refused."""
    allow_reference_in_prompt: bool = False
    """Let the model's input hold the evaluated examples' references: a --prompt_template column (or the source column) that is a reference column or holds an example's own reference, few-shot examples that share a string id, a source or a shown text with the evaluated set; refused without it (docs/causal.md)."""
    generate_kwargs: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    """Extra --key value pairs passed to model.generate() (e.g. --num_beams 4)."""

    def __post_init__(self) -> None:
        check_option_texts({f.name: getattr(self, f.name) for f in fields(self)})
        if family_of(self.task) is None:
            raise ConfigError(f"--task must be translation, summarization or a name containing one of them "
                              f"(e.g. translation_en_to_de), got {self.task!r}")
        for flag, value, least in (("--bs", self.bs, 1), ("--max_tokens", self.max_tokens, 1), ("--seed", self.seed, 0),
                                   ("--max_source_length", self.max_source_length, 1), ("--n_obs", self.n_obs, 1),
                                   ("--num_return_sequences", self.num_return_sequences, 1)):
            if value is not None or flag in ("--seed", "--num_return_sequences"):  # the others: None is not given
                _check_min(flag, value, least)
                if self.budget_for_world_size and flag in ("--bs", "--max_tokens"):
                    raise ConfigError(f"--budget_for_world_size adapts the default batch budget, and {flag} {value} "
                                      "gives one; pass only one of them")
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dist_backend not in BACKENDS:
            raise ConfigError(f"--dist_backend must be one of {', '.join(BACKENDS)}, got {self.dist_backend!r}")
        if self.dist_backend == "nccl" and self.device == "cpu":
            raise ConfigError("--dist_backend nccl needs GPUs; with --device cpu use --dist_backend gloo (or auto)")
        if not (isinstance(self.sync_timeout, (int, float)) and math.isfinite(self.sync_timeout) and self.sync_timeout > 0):
            raise ConfigError(f"--sync_timeout must be a number of seconds > 0, got {self.sync_timeout!r}")
        if self.fp16 and self.bf16:
            raise ConfigError("--fp16 and --bf16 are mutually exclusive; pass one")
        if self.engine not in ENGINE_NAMES:
            raise ConfigError(f"--engine must be one of {', '.join(ENGINE_NAMES)}, got {self.engine!r}")
        if self.engine == "ctranslate2":
            if self.fp16 or self.bf16:
                flag, kind = ("--fp16", "float16") if self.fp16 else ("--bf16", "bfloat16")
                raise ConfigError(f"{flag} is for --engine hf; with --engine ctranslate2 use --compute_type {kind}")
            if self.compute_type is None:
                object.__setattr__(self, "compute_type", "default")
            if self.compute_type not in COMPUTE_TYPES:
                raise ConfigError(f"--compute_type must be one of {', '.join(COMPUTE_TYPES)}, got {self.compute_type!r}")
        else:
            for flag, value in (("--compute_type", self.compute_type), ("--tokenizer_name", self.tokenizer_name)):
                if value is not None:
                    raise ConfigError(f"{flag} needs --engine ctranslate2 (the hf engine takes --fp16/--bf16 "
                                      "and the tokenizer beside the model)")
        gen: dict[str, Any] = {}
        for key, value in self.generate_kwargs:
            if key in gen:
                raise ConfigError(f"--{key} given twice ({gen[key]!r} and {value!r}); give it once")
            gen[key] = value
        beams = gen.get("num_beams")
        if beams is not None and (not isinstance(beams, int) or isinstance(beams, bool) or beams < 1):
            raise ConfigError(f"--num_beams must be an integer >= 1, got {beams!r}")
        for key, value in gen.items():  # None (--key none): unset, generate()'s default
            if key in _FIELD_NAMES:  # num_return_sequences: the run's own option would overrule it
                raise ConfigError(f"--{key} is an option of the run, not a generate option; give it as {key}")
            problem = value_error(key, value)
            if problem:
                raise ConfigError(f"--{key} {value!r}: {problem}")
        if beams is not None:
            if self.num_return_sequences > beams and gen.get("do_sample") is not True:
                raise ConfigError(
                    f"--num_return_sequences ({self.num_return_sequences}) must not exceed "
                    f"--num_beams ({beams}): beam search returns at most num_beams sequences; "
                    "sample with --do_sample true for more"
                )
        # Resolved first: which inputs a model metric reads (so whether the run is scored) depends on its options.
        object.__setattr__(self, "metric_options", registry.resolve_options(self.metric_options))
        if self.compare_to is not None and (not self.scored or self.reference_free):
            raise ConfigError("--compare_to needs a scored run: not --num_return_sequences > 1, and with references")
        if self.pseudo_target and self.num_return_sequences < 2:
            raise ConfigError("--pseudo_target needs --num_return_sequences >= 2")
        self.selection.check(self.num_return_sequences)
        if self.metrics is not None:
            names = parse_metric_names(self.metrics, self.task_family)  # '' is refused, never the default
            if self.pseudolabels and not self.selection:
                raise ConfigError(f"--metrics {self.metrics!r}: pseudolabels (--num_return_sequences > 1) are not "
                                  "scored; leave --metrics out")
            if not self.scored:  # the rule `score` and `compare` follow too
                registry.check_inputs(names, dict(self.metric_options), f"--metrics {','.join(names)}",
                                      no_references="--input_path without --reference_path gives none")
            object.__setattr__(self, "metrics", ",".join(names))
        registry.refuse_unused(dict(self.metric_options), self.model_metric_names + self.selection.models(),
                      f"--metrics {self.metrics!r}" if self.metrics is not None else "the task's default metric")
        if self.shared_tail and self.model_metric_names:
            # The ranks write their slices before rank 0 has the model metrics' values.
            raise ConfigError(f"--shared_tail with --metrics {','.join(self.model_metric_names)}: the ranks' slices "
                              "cannot hold the model metrics' values; leave out --shared_tail")
        object.__setattr__(self, "target_column", _target_columns(self.target_column))
        if self.dataset is None and any(
            v is not None
            for v in (self.dataset_config, self.split, self.source_column, self.target_column, self.id_column)
        ):
            raise ConfigError("--dataset_config/--split/--*_column need --dataset")
        if self.reference_path is not None and self.input_path is None:
            raise ConfigError("--reference_path needs --input_path (the sources it goes with)")
        if self.dataset is not None and self.data_dir:
            raise ConfigError(f"--dataset {self.dataset!r} and --data_dir {self.data_dir!r}: both name the data; "
                              "pass only one of them")
        if self.input_path is not None and (self.data_dir or self.dataset is not None):
            raise ConfigError("--input_path replaces --data_dir and --dataset; pass only one of them")
        if not self.data_dir and self.dataset is None and self.input_path is None:
            object.__setattr__(self, "data_dir", str(EMBEDDED_DATA[self.task_family]))
        if not self.tmp_dir:
            object.__setattr__(self, "tmp_dir", f"{self.save_dir.rstrip('/')}_tmp")
        check_output_name("--type_path", self.type_path)
        if self.dataset is not None and self.split:
            check_output_name("--split", self.split)
        _check_prompt_options(self)

    @property
    def gen_kwargs(self) -> dict[str, Any]:
        return dict(self.generate_kwargs)

    @property
    def output_prefix(self) -> str:
        """The name output files start with: the dataset split when one is named, else --type_path."""
        return self.split if self.dataset is not None and self.split else self.type_path

    @property
    def pseudolabels(self) -> bool:
        return self.num_return_sequences > 1

    @property
    def task_family(self) -> str:
        """translation or summarization: what decides the metric, whatever the task's full name."""
        return family_of(self.task)  # type: ignore[return-value]  # checked in __post_init__

    @property
    def scored(self) -> bool:
        """Whether the run computes metrics: not for pseudolabels (but for --select's choices among them), nor for
        --input_path without references unless every metric --metrics names reads none (a reference-free model metric)."""
        return (not self.pseudolabels or bool(self.selection)) and (self.input_path is None or self.reference_path is not None
                                                                    or self.reference_free)

    @property
    def reference_free(self) -> bool:
        """--metrics names only model metrics that read no reference under their options: the
        run reads references where there are any (for the examples file) and needs none."""
        return self.metrics is not None and not self.reference_readers

    @property
    def reference_readers(self) -> tuple[str, ...]:
        """The metrics the run computes that read references (the task's main metric when --metrics is not given)."""
        names = parse_metric_names(self.metrics, self.task_family)
        return registry.needing_references(names, dict(self.metric_options))

    @property
    def metric_name(self) -> str:
        return "bleu" if self.task_family == "translation" else "rouge"

    @property
    def metric_names(self) -> tuple[str, ...]:
        """--metrics' text metrics (scored from strings), in the order given; the task's main
        metric when none is given; none when every metric named is reference-free."""
        if self.reference_free:
            return ()
        return split_metric_names(parse_metric_names(self.metrics, self.task_family), self.task_family)[0]

    @property
    def model_metric_names(self) -> tuple[str, ...]:
        """--metrics' model metrics (scoring/registry.py), scored on the ranks after generation."""
        return split_metric_names(parse_metric_names(self.metrics, self.task_family), self.task_family)[1]

    @property
    def ranking_metric(self) -> str:
        """The first metric --metrics names (the task's main metric when none is given): it ranks
        the summary's lowest-scoring examples."""
        return parse_metric_names(self.metrics, self.task_family)[0]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "generate_kwargs": dict(self.generate_kwargs), "metric_options": dict(self.metric_options)}


def _target_columns(value: Any) -> str | tuple[str, ...] | None:
    """--target_column given once stays a str (as before several references existed); given
    more than once (argparse appends to a list) it becomes a tuple of distinct columns."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"--target_column must be a column name (or several), got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"--target_column: a column is given twice in {', '.join(value)}")
    return None if not value else value[0] if len(value) == 1 else tuple(value)


def check_output_name(flag: str, name: str) -> None:
    """Output files are named after --type_path (or a dataset's --split): it must be a plain name,
    so that every output stays inside --save_dir."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ConfigError(
            f"{flag} {name!r}: output files are named after it, so it must be a plain name without a "
            "path separator (such as test); put folders in --data_dir and --save_dir"
        )


PROMPT_OPTIONS = ("prompt_template", "apply_chat_template", "system_instruction", "num_fewshot", "fewshot_file",
                  "truncate_prompt")
"""The options of a decoder-only model's prompts (inputs/prompts.py); refused for an encoder-decoder."""


def _check_prompt_options(cfg: EvalConfig) -> None:
    """The prompt options' values and the ones that need another; which model they apply to is
    known once its config is read (run/prepare.py)."""
    if cfg.truncate_prompt is not None and cfg.truncate_prompt != "left":
        raise ConfigError(f"--truncate_prompt must be left (or left out), got {cfg.truncate_prompt!r}")
    _check_min("--num_fewshot", cfg.num_fewshot, 0)
    if cfg.num_fewshot and not cfg.fewshot_file:
        raise ConfigError(f"--num_fewshot {cfg.num_fewshot} needs --fewshot_file (the examples to choose from)")
    if cfg.fewshot_file and not cfg.num_fewshot:
        raise ConfigError("--fewshot_file needs --num_fewshot K > 0 (how many of its examples each prompt shows)")
    if cfg.system_instruction is not None and not cfg.apply_chat_template:
        raise ConfigError("--system_instruction needs --apply_chat_template (a plain --prompt_template holds its "
                          "instruction itself)")


def _check_min(flag: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{flag} must be an integer >= {minimum}, got {value!r}")


def field_docs() -> dict[str, str]:
    """Each field's docstring, read from this module's source (used for --help)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(EvalConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)  # type: ignore[union-attr]
    return docs


CONFIG_FIELDS = {f.name: f for f in fields(EvalConfig)}
_FIELD_NAMES = frozenset(CONFIG_FIELDS) - {"generate_kwargs"}
