"""Everything before generation, identical on every rank: the examples as an Arrow store, the
tokenized sources, the model's settings, the batch plan and the manifest that identifies the run."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from .. import engines
from ..config import PROMPT_OPTIONS, EvalConfig
from ..inputs.read import iter_examples
from ..errors import ConfigError, DataError
from ..model.generate_check import check_generate_settings
from ..model.fingerprint import tokenizer_fingerprint
from ..model.generation import full_dict
from ..model.identity import check_safetensors, hub_revision, known_sha256
from ..model.converted import is_converted_folder
from ..model.kind import CAUSAL, SEQ2SEQ, model_kind
from ..model.settings import (
    generation_config_for,
    load_model_config,
    load_tokenizer,
    model_config_of,
    source_limit,
    source_prefix,
    task_entry,
)
from ..outputs.locations import data_stamp
from ..atomic import write_json_atomic
from ..inputs.store import ROWS_PER_BATCH, ExampleStore, write_blocks
from ..inputs.leaks import check_shots
from ..inputs.prompts import Prompts, build_prompts, template_fields
from ..inputs.tokens import CHUNK, SourceTokens, load_shards, shard_is_complete, shard_range, tokenize_to
from .dist import DistEnv, ProcessGroup
from .budget import choose_budget, describe_budget, idle_ranks_warning, layout_warning
from .startup import Steps
from .plan import Plan, assign_batches, padding_efficiency, plan_digest, rank_loads, step_overhead

logger = logging.getLogger("seq2seq_eval")


@dataclass
class Prepared:
    """Everything derived before generation: identical on every rank."""

    store: ExampleStore
    tokenizer: Any
    model_config: Any
    generation_config: Any
    prefix: str
    tokens: SourceTokens
    batches: Plan  # the batches as arrays; batches[i] makes batch i's Batch
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per preparation step on this rank, in order
    budget: dict[str, Any] = field(default_factory=dict)  # how the batch budget was chosen (budget.choose_budget)
    kind: str = SEQ2SEQ  # the model's kind (model/kind.py)
    prompts: Prompts | None = None  # a decoder-only model's prompt construction (inputs/prompts.py)


def _canonical(name: str) -> str:
    """A local path as an absolute, resolved path; a hub name as it is."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def _model_identity(model_config: Any, model_name: str) -> dict[str, Any]:
    """The model's revision when it came from the hub (the snapshot its name resolves to now:
    transformers 5 leaves config._commit_hash unset), else a hash of its local weight files."""
    identity: dict[str, Any] = {"name": _canonical(model_name)}
    revision = hub_revision(model_name)
    if revision:
        identity["revision"] = revision
    path = Path(os.path.expanduser(model_name))
    if path.is_dir():
        # Read once per version of the files (model/identity.py's digest cache), not at every run.
        identity["weights_sha256"] = known_sha256(*(f for f in sorted(path.iterdir())
                                                    if f.suffix in (".safetensors", ".bin") and f.is_file()))
    return identity


def _config_digest(model_config: Any) -> str:
    """The model's configuration as it was loaded, but its own path and the transformers release
    that wrote it (the same model named another way, or saved again, is the same run)."""
    config = {k: v for k, v in model_config.to_diff_dict().items() if k not in ("_name_or_path", "transformers_version")}
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _data_key(cfg: EvalConfig) -> str:
    """What the examples cache depends on: the input options and, for local files, their size
    and modification time (a changed file is converted again; its new fingerprint then tells a
    --resume that the data changed)."""
    stamp = data_stamp(cfg)
    options = [_canonical(cfg.input_path or cfg.dataset or cfg.data_dir), cfg.reference_path, cfg.dataset_config, cfg.split, cfg.type_path, cfg.n_obs,
               cfg.source_column, cfg.target_column, cfg.id_column, cfg.src_lang, cfg.tgt_lang, cfg.pseudolabels]
    fields = template_fields(cfg.prompt_template)
    if fields:  # the columns a prompt template names are in the store too
        options.append(list(fields))
    if cfg.allow_reference_in_prompt:  # a store built with it was not checked for references in prompts
        options.append("allow_reference_in_prompt")
    return hashlib.sha256(json.dumps([options, stamp], default=str).encode()).hexdigest()


def _examples_store(cfg: EvalConfig, pg: ProcessGroup | None, cache: Path) -> tuple[ExampleStore, dict[str, Any]]:
    """The examples as an Arrow file in the cache: converted once by rank 0 (the others wait and
    then map it), reused by a resumed or restarted run whose inputs are unchanged. `cfg`: the
    config the examples are read with (evaluate()'s in-memory examples: from the temp dir)."""
    path, meta_path = cache / "examples.arrow", cache / "examples.json"
    key = _data_key(cfg)

    def build() -> dict[str, Any]:
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("key") == key and path.is_file():
                return meta
        except (OSError, ValueError):
            pass
        blocks, origin = iter_examples(cfg, ROWS_PER_BATCH)
        n, sha = write_blocks(path, blocks, with_fields=bool(template_fields(cfg.prompt_template)))
        meta = {"key": key, "n": n, "sha256": sha, "origin": origin}
        write_json_atomic(meta_path, meta)  # last: the store above is complete
        return meta

    meta = pg.main_first(build) if pg is not None else build()
    return ExampleStore(path, meta["origin"]), meta


def _give_back_freed_memory() -> None:
    """Memory that converting and tokenizing freed, returned to the system. Arrow's pool and
    glibc's malloc keep freed memory for reuse, and a rank would hold it through all of
    generation: at 1M examples about 100 MB on rank 0, growing with N (docs/scale.md)."""
    import ctypes

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


def _source_tokens(env: DistEnv, pg: ProcessGroup | None, cache: Path, key: str, store: ExampleStore,
                   tokenizer: Any, prefix: str, max_len: int | None, prompts: Prompts | None) -> SourceTokens:
    """Each rank tokenizes its 1/world of the sources (a dry run: all of them), then maps every
    shard. Shards already complete for the same key (a resume, a restart) are kept. A prompt
    refused on any rank is refused on every rank, from the shards' descriptions."""
    world = env.world_size if pg is not None else 1
    ranges = [shard_range(len(store), r, world) for r in range(world)]
    start, end = ranges[env.rank if pg is not None else 0]
    if not shard_is_complete(cache, key, start, end):
        tokenize_to(cache, key, start, end, tokenizer, store.iter_sources(start, end, CHUNK), prefix, max_len, prompts,
                    store.iter_fields(start, end, CHUNK))
    if pg is not None:
        pg.barrier()  # every shard is on disk
    tokens = load_shards(cache, ranges)
    if tokens.refused is not None:
        position, why = tokens.refused
        raise DataError(f"{store.origin}: example id {store.ids([position])[0]!r}: {why}")
    return tokens


IN_MEMORY_NAME = "<in-memory "
"""How a manifest names a model passed in memory (api.evaluate removes only such a run's files)."""


def _in_memory_identity(model: Any) -> dict[str, Any]:
    """What the manifest records of a model passed in memory. No weight hash (that would read
    every parameter at every evaluation); such a run is never resumed (api.evaluate refuses
    --resume for it), so the identity only has to describe the model."""
    params = list(model.parameters())
    return {"name": f"{IN_MEMORY_NAME}{type(model).__name__}>", "parameters": sum(p.numel() for p in params),
            "dtype": str(params[0].dtype).removeprefix("torch.") if params else None}


def prepare(cfg: EvalConfig, env: DistEnv, pg: ProcessGroup | None, cache: Path, device_type: str = "cpu",
            model: Any = None, tokenizer: Any = None, recorded: tuple[int | None, int | None] | None = None,
            read_cfg: EvalConfig | None = None) -> Prepared:
    """Everything before generation. `device_type` picks the default batch budget (with
    --budget_for_world_size, the world size too: budget.choose_budget); `recorded`: the budget
    (bs, max_tokens) of the run being resumed (tmpdir.recorded_budget), taken when neither --bs
    nor --max_tokens is given; `model`, `tokenizer`: a model (and its tokenizer) already in memory (api.evaluate), used instead of
    loading --model_name; `read_cfg`: the config the examples are read with, when not `cfg`
    (evaluate()'s in-memory examples, read from the temp dir while `cfg` names their copy in
    --save_dir, as the run's provenance does)."""
    clock = Steps()
    converted = model is None and is_converted_folder(cfg.model_name)
    if converted:  # its config is read with the tokenizer (model.converted): loaded once, first
        tokenizer = load_tokenizer(cfg, tokenizer)
        clock.lap("tokenizer_load")
    if model is None and Path(cfg.model_name).expanduser().is_dir():
        check_safetensors(Path(cfg.model_name).expanduser())
    model_config, base_gc = (load_model_config(cfg, tokenizer if converted else None) if model is None
                             else model_config_of(model, cfg.model_name))
    kind = model_kind(model_config, cfg.model_name)
    _check_prompt_options(cfg, kind)
    clock.lap("model_config")
    if not converted:
        tokenizer = load_tokenizer(cfg, tokenizer)
        clock.lap("tokenizer_load")
    entry = task_entry(model_config, cfg.task)
    if entry.note and (pg is None or pg.env.is_main):  # every rank sees the same; one says it
        logger.warning("--task %s: no task settings apply (%s)", cfg.task, entry.note)
    gc = generation_config_for(model_config, base_gc, tokenizer, cfg)
    engines.check(cfg, model_config, gc, tokenizer, device_type, kind)
    check_generate_settings(gc, model_config)
    prefix = source_prefix(model_config, cfg)
    prompts = build_prompts(cfg, tokenizer, model_config, gc, prefix) if kind == CAUSAL else None
    max_source_length = source_limit(model_config, tokenizer, cfg) if prompts is None else prompts.limit
    clock.lap("settings_checks")
    identity = _model_identity(model_config, cfg.model_name) if model is None else _in_memory_identity(model)
    # The tokenizer's content (vocabulary, pipeline, special tokens, limits and sides), not its
    # name: a tokenizer.json with swapped ids is another tokenizer, for the token cache and --resume.
    tokenizer_identity = tokenizer_fingerprint(tokenizer)
    clock.lap("fingerprint")
    cache.mkdir(parents=True, exist_ok=True)
    store, data = _examples_store(read_cfg or cfg, pg, cache)
    if prompts is not None:  # no few-shot example is one of the evaluated examples (inputs/leaks.py)
        check_shots(prompts.shots, store, prompts.fewshot_file, cfg.allow_reference_in_prompt)
    _give_back_freed_memory()
    clock.lap("examples")
    token_key = hashlib.sha256(json.dumps(
        [data["sha256"], identity, prefix, max_source_length, tokenizer_identity]
        + ([prompts.identity()] if prompts is not None else []), sort_keys=True
    ).encode()).hexdigest()
    tokens = _source_tokens(env, pg, cache, token_key, store, tokenizer, prefix, max_source_length, prompts)
    clock.lap("tokenize")
    cost = {"out_ratio": 1.0 if cfg.task_family == "translation" else 0.25, "out_cap": gc.max_new_tokens or gc.max_length,
            "beams": gc.num_beams or 1, "step_overhead": step_overhead(device_type, cfg.engine, half=cfg.fp16 or cfg.bf16),
            # Outputs are at least this long, whatever the source's length suggests (an
            # encoder-decoder's min_length counts the decoder's start token).
            "out_floor": int(gc.min_new_tokens or max(int(gc.min_length or 0) - 1, 0))}
    batches, bs, max_tokens, budget = choose_budget(cfg, tokens.lengths, env.world_size, device_type, cost, recorded, kind)
    gen_settings = full_dict(gc)  # every field, generate()'s defaults included
    manifest = {
        "model": identity,
        "tokenizer": tokenizer_identity,
        # The model's configuration beyond its generation settings (recorded below).
        "model_config_sha256": _config_digest(model_config),
        "data": {
            # Resolved: the same files named relatively, absolutely or with a trailing slash
            # are the same run to --resume.
            "path": _canonical(cfg.input_path or cfg.dataset or cfg.data_dir),
            "dataset_config": cfg.dataset_config, "split": cfg.split,
            "n_examples": len(store), "sha256": data["sha256"],
        },
        "task": cfg.task,
        "task_settings": {"entry": entry.name, "params": json.loads(json.dumps(entry.params, default=str))},
        "type_path": cfg.type_path,
        "prefix": prefix,
        "max_source_length": max_source_length,
        "dtype": identity["dtype"] if model is not None else "float16" if cfg.fp16 else "bfloat16" if cfg.bf16 else "float32",
        "engine": engines.describe(cfg),
        "num_return_sequences": cfg.num_return_sequences,
        "seed": cfg.seed,
        "generation": json.loads(json.dumps(gen_settings, sort_keys=True, default=str)),
        "plan": {"bs": bs, "max_tokens": max_tokens, "sha256": plan_digest(batches)},
    }
    if prompts is not None:  # an encoder-decoder's manifest stays as it was: its runs still resume
        manifest.update({"model_kind": kind, "prompt": prompts.record()})
    _give_back_freed_memory()
    clock.lap("plan")
    prep = Prepared(store, tokenizer, model_config, gc, prefix, tokens, batches, manifest, clock.seconds, budget, kind,
                    prompts)
    # Said at run time (the dry run prints it with the plan), once: what makes the bytes depend on the layout.
    if pg is not None and pg.env.is_main and (layout := layout_warning(prep)):
        logger.warning("%s", layout)
    return prep


def _check_prompt_options(cfg: EvalConfig, kind: str) -> None:
    """The prompt options are a decoder-only model's: given for an encoder-decoder, one line."""
    if kind == CAUSAL:
        return
    given = [name for name in PROMPT_OPTIONS if getattr(cfg, name) not in (None, False, 0)]
    if given:
        raise ConfigError(f"--{given[0]} is for decoder-only models; {cfg.model_name} is an encoder-decoder model, "
                          "whose sources take --prefix")


def describe_plan(prep: Prepared, world_size: int) -> str:
    deal = assign_batches(prep.batches, world_size)
    loads = rank_loads(prep.batches, world_size, deal)
    lines = [
        f"{len(prep.store)} examples from {prep.store.origin}, {len(prep.batches)} batches ({describe_budget(prep)}), "
        f"source padding efficiency {padding_efficiency(prep.batches, prep.tokens.lengths):.3f}",
        f"engine: {json.dumps(prep.manifest['engine'], sort_keys=True)}",
        f"task settings: {_describe_entry(prep.manifest['task_settings'])}",
        f"generation: {json.dumps(prep.manifest['generation'], sort_keys=True)}",
        f"source prefix: {prep.prefix!r}",
        _describe_limit(prep),
    ]
    if prep.prompts is not None:
        lines.insert(5, f"prompts: {json.dumps(prep.manifest['prompt'], sort_keys=True, ensure_ascii=False)}")
    mean = float(loads.sum()) / world_size if world_size else 0.0
    sizes = prep.batches.sizes
    for rank, indices in enumerate(deal):
        share = f" ({loads[rank] / mean:.2f} of the mean)" if mean else ""
        lines.append(f"rank {rank}: {len(indices)} batches, {int(sizes[indices].sum())} examples, "
                     f"est. cost {loads[rank]:.0f}{share}")
    if mean:
        lines.append(f"predicted load (estimated cost): max/mean {loads.max() / mean:.3f} over {world_size} ranks")
    for warning in (idle_ranks_warning(prep, world_size), layout_warning(prep)):
        if warning:
            lines.append(f"WARNING: {warning}")
    lines.append("prepared in " + ", ".join(f"{k} {v:.1f} s" for k, v in prep.timings.items()))
    return "\n".join(lines)


def _describe_limit(prep: Prepared) -> str:
    limit = prep.manifest["max_source_length"]
    if prep.prompts is not None:
        if limit is None:
            return "prompts are not limited (no model limit)"
        kept = "truncated on the left" if prep.prompts.truncate_left else "refused"
        return f"prompts of more than {limit} tokens ({prep.prompts.limit_why}) are {kept}: {prep.tokens.truncated} truncated"
    return (f"sources truncated to {limit} tokens: {prep.tokens.truncated}" if limit is not None
            else "sources are not truncated (no model limit)")


def _describe_entry(settings: dict[str, Any]) -> str:
    if settings["entry"] is None:
        return "none (no task_specific_params entry applies)"
    return f"task_specific_params[{settings['entry']!r}] = {json.dumps(settings['params'], sort_keys=True)}"
