"""The command line's options, read from EvalConfig's fields and docstrings (defaults are never
typed twice), and the `--key value` pairs that go to generate(). Below both the CLI and the
legacy run_eval.py form, which share them."""

from __future__ import annotations

import argparse
import json
import typing
from collections.abc import Sequence
from dataclasses import MISSING, fields

from .config import BACKENDS, COMPUTE_TYPES, DEVICES, ENGINE_NAMES, EvalConfig, field_docs, parse_value
from .errors import ConfigError
from .scoring.registry import add_arguments as add_metric_arguments
from .scoring.registry import split_options
from .selection.options import add_arguments as add_select_arguments
from .selection.options import gather as gather_selection

_FLAGS = {"fp16", "bf16", "debug", "resume", "no_steal", "shared_tail", "dry_run", "pseudo_target", "no_examples_file",
          "apply_chat_template", "allow_reference_in_prompt", "budget_for_world_size"}
# Shell text in which \\n is a newline (unescape).
_SHELL_TEXT = ("prompt_template", "system_instruction")


def _field_type(name: str) -> type:
    hint = typing.get_type_hints(EvalConfig)[name]
    for t in (int, float, str):
        if hint is t or t in typing.get_args(hint):
            return t
    return str


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: one line, from one place."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: with prefix matching, a misspelt "--num_beam 4" would be taken for a
    # real option (or swallowed), instead of failing as an unknown generate option.
    parser = Parser(
        prog="seq2seq_eval",
        description="Evaluate a Hugging Face seq2seq model with beam search, sharded over torchrun ranks. "
        "Any other --key value is passed to model.generate(). "
        "Subcommands: `seq2seq_eval score --task T [--metrics M] --predictions F --references F [F ...]` "
        "(scores of existing files) and `seq2seq_eval compare --predictions A B [...]` (paired significance "
        "tests; `seq2seq_eval compare --help`). "
        "The legacy run_eval.py form: `seq2seq_eval MODEL INPUT_PATH SAVE_PATH [--reference_path R] [--score_path S]`.",
        allow_abbrev=False,
    )
    docs = field_docs()
    for f in fields(EvalConfig):
        if f.name in ("generate_kwargs", "save_dir_of"):  # no option: set by the code (save_dir_of: legacy.py)
            continue
        if f.name == "metric_options":
            add_metric_arguments(parser)  # each model metric's own flags, and the shared ones
            continue
        if f.name == "selection":
            add_select_arguments(parser)  # --select, --select_metric (selection/options.py)
            continue
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        default = f.default if f.default is not MISSING else None
        help_text = docs.get(f.name, "")
        if f.name in _FLAGS:
            parser.add_argument(*names, dest=f.name, action="store_true", help=help_text)
            continue
        if default not in (None, "") and "(default" not in help_text:
            help_text += f" (default: {default})"
        kwargs: dict = {"dest": f.name, "type": _field_type(f.name), "default": argparse.SUPPRESS, "help": help_text}
        choices = {"device": DEVICES, "dist_backend": BACKENDS, "engine": ENGINE_NAMES,
                   "compute_type": COMPUTE_TYPES}.get(f.name)
        if choices:
            kwargs["choices"] = choices
        if f.name == "target_column":
            kwargs["action"] = "append"  # several references: one column per --target_column
        if f.name in _SHELL_TEXT:
            kwargs["type"] = unescape
        parser.add_argument(*names, **kwargs)
    # torch.distributed.launch passes --local_rank; rank and local rank come from the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def config_values(values: dict) -> dict:
    """The parsed flags as EvalConfig's keywords: the model metrics' options gathered into
    metric_options, --select and --select_metric into selection."""
    fields_, given = split_options(values)
    return {**gather_selection(fields_), "metric_options": tuple(given.items())}


def parse_generate_kwargs(rest: Sequence[str]) -> tuple[tuple[str, object], ...]:
    """Leftover `--key value` / `--key=value` pairs, values parsed as int, float, bool or str."""
    pairs = []
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(f"unexpected argument {token!r}; expected --key value pairs for model.generate()")
        if "=" in token:
            key, value = token[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                raise ConfigError(f"{token} needs a value (generate options are --key value pairs)")
            key, value = token[2:], rest[i + 1]
            i += 2
        pairs.append((key.replace("-", "_"), _parse_generate_value(key, value)))
    return tuple(pairs)


def unescape(text: str) -> str:
    """Shell text as the command line reads --prompt_template, --system_instruction and a plain
    --stop_strings: `\\n` is a newline, `\\t` a tab, `\\\\` one backslash; any other backslash
    stays as it is."""
    out, i = [], 0
    while i < len(text):
        pair = text[i : i + 2]
        if pair in ("\\n", "\\t", "\\\\"):
            out.append({"\\n": "\n", "\\t": "\t", "\\\\": "\\"}[pair])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_generate_value(key: str, text: str) -> object:
    """A generate option's value: a JSON list or object as generate() takes list-valued settings
    (`--bad_words_ids "[[1308]]"`, `--suppress_tokens "[1308]"`), else int, float, bool or str.
    --stop_strings is a JSON list or one string, in which \\n is a newline."""
    if key.replace("-", "_") == "stop_strings" and not text.lstrip().startswith("["):
        return None if text.lower() == "none" else unescape(text)
    if not text.lstrip().startswith(("[", "{")):
        return parse_value(text)
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--{key} {text}: not valid JSON ({e}); expected a JSON list such as [1308] "
                          "or [[1308]], as generate() takes it") from None
