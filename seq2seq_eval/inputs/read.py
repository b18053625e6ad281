"""The examples a run evaluates, from whichever input the config names: text files, JSON Lines or
a Hugging Face dataset, cut to --n_obs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..config import EvalConfig
from ..errors import ConfigError, DataError
from .examples import BLOCK_ROWS, Block, Examples, blocks_of
from .files import (
    iter_files,
    iter_jsonl,
    iter_legacy,
)
from .leaks import ID_FIELD, check_columns, with_template_fields
from .prompts import template_fields


def load_examples(cfg: EvalConfig) -> Examples:
    """Every example in memory: for small inputs (compare, tests). A run streams them instead."""
    blocks, origin = iter_examples(cfg)
    return Examples(tuple(e for b in blocks for e in b.examples()), origin)


def iter_examples(cfg: EvalConfig, rows: int = BLOCK_ROWS) -> tuple[Iterator[Block], str]:
    """The examples the run evaluates (the first --n_obs), as a stream of blocks of `rows`
    (the last one shorter), and where they come from. The input is opened and checked at once;
    its rows are read as the iterator goes."""
    blocks, origin = _blocks(cfg, rows)
    # {id} filled in, and no column the template names holding its example's reference (inputs/leaks.py).
    return with_template_fields(blocks, template_fields(cfg.prompt_template), origin,
                                cfg.allow_reference_in_prompt), origin


def _blocks(cfg: EvalConfig, rows: int) -> tuple[Iterator[Block], str]:
    need_targets = cfg.scored and not cfg.reference_free  # a reference-free run reads them where there are any
    template = template_fields(cfg.prompt_template)  # the fields a decoder-only model's prompt names
    fields = tuple(name for name in template if name != ID_FIELD)  # the input's own columns among them
    if cfg.dataset is not None:
        from .hub import iter_hf_examples

        examples, origin = iter_hf_examples(cfg, need_targets, template)  # applies --n_obs before reading any column
        return blocks_of(examples, rows), origin
    path = Path(cfg.data_dir)
    if fields and (cfg.input_path is not None or not (path.suffix == ".jsonl" or path.is_file())):
        what = "--input_path's one source per line" if cfg.input_path is not None else "the .source/.target layout"
        raise ConfigError(f"--prompt_template names {{{fields[0]}}}, but {what} has no other columns; expected a "
                          "JSON Lines file or --dataset with that column")
    if cfg.input_path is not None:  # the legacy run_eval.py command line
        path = Path(cfg.input_path)
        refs = [Path(cfg.reference_path)] if cfg.reference_path is not None else []
        blocks = iter_files(path, refs, rows)
    elif path.suffix == ".jsonl" or path.is_file():
        if not path.exists():
            raise DataError(f"--data_dir {path}: file not found")
        if path.suffix in (".source", ".target"):
            # Otherwise read as JSON Lines and reported as "line 1: malformed JSON".
            raise DataError(
                f"--data_dir {path}: a .source/.target file; expected the folder that holds "
                f"{cfg.type_path}.source and {cfg.type_path}.target (or a .jsonl file)"
            )
        if path.suffix != ".jsonl" and not _starts_as_json(path):
            # Otherwise read as JSON Lines and reported as "line 1: malformed JSON".
            raise DataError(
                f"--data_dir {path}: a file whose first line is not a JSON object; expected the folder that "
                f"holds {cfg.type_path}.source and {cfg.type_path}.target, or a JSON Lines file (.jsonl) "
                "with one object per line (for one source per line, use --input_path)"
            )
        # A record's "target" is its reference; its "id" ({id}) is the example's id.
        check_columns(("target",), str(path), cfg.allow_reference_in_prompt, template)
        blocks = blocks_of(iter_jsonl(path, need_targets, fields), rows)
    else:
        blocks = iter_legacy(path, cfg.type_path, need_targets, rows, lambda why: _missing_references(cfg, why))
    if cfg.n_obs is not None:
        blocks = _first(blocks, cfg.n_obs)
    return blocks, str(path)


def _missing_references(cfg: EvalConfig, why: str) -> str | None:
    """The run's metrics against data without references: the rule `score` and `compare` follow."""
    from ..scoring import registry
    from ..scoring.names import parse_metric_names

    names = parse_metric_names(cfg.metrics, cfg.task_family)
    shown = f"--metrics {','.join(names)}" + ("" if cfg.metrics is not None else " (the task's metric)")
    return registry.missing_inputs(names, dict(cfg.metric_options), shown, no_references=why)


def _starts_as_json(path: Path) -> bool:
    """Whether the first non-blank line of `path` parses as a JSON object."""
    import json

    try:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    return isinstance(json.loads(line), dict)
    except ValueError:
        return False
    except OSError:
        return True  # unreadable: iter_jsonl says why
    return True  # an empty file: iter_jsonl says so


def _first(blocks: Iterator[Block], n: int) -> Iterator[Block]:
    for b in blocks:
        if len(b) >= n:
            if n:
                yield b.head(n)
            return
        n -= len(b)
        yield b
