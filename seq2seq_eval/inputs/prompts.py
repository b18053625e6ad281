"""A decoder-only model's prompts: built once, as token ids, in the step that tokenizes sources.

A prompt is what the model sees before it generates: the source prefix (--prefix or the model's
task entry) and the source filled into --prompt_template (`{source}`, the default, is the source
alone; `{id}` the example's id as text; `{column}` another column of a JSON Lines or dataset input,
never a reference column: inputs/leaks.py); with --num_fewshot K, the same K examples of
--fewshot_file before it, each its prompt followed by its target and a blank line; with --apply_chat_template, the tokenizer's own chat
template over the turns (--system_instruction, each few-shot example as a user turn and an
assistant turn, then the example's user turn), with the generation prompt added.

Token ids, not text, are what is checked and cached, so the ids the plan, the journals and the
engine use are exactly the model's input:

- special tokens: a plain prompt is tokenized as the tokenizer tokenizes any text (a Llama-style
  tokenizer adds BOS); a chat template writes its own, so its text is tokenized without adding
  them (as transformers' apply_chat_template does). A prompt whose ids start with BOS twice (a
  template that writes it while the tokenizer adds it too) is refused, never doubled.
- length: a prompt longer than the model's positions minus --max_new_tokens (or than
  --max_source_length) is refused, naming the example, unless --truncate_prompt left, which keeps
  its BOS (when it starts with one) and its last tokens.

Both are refused before any work, the dry run included: the rank that tokenizes an example
records its problem with its shard (inputs/tokens.py), and every rank reads every shard's.
"""

from __future__ import annotations

import functools
import hashlib
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import ConfigError, DataError, first_line
from ..model.settings import encode_texts, model_limit
from .leaks import ID_FIELD

SHOT_SEPARATOR = "\n\n"
"""What ends a few-shot example in a plain prompt (after its target), as lm-evaluation-harness's
default fewshot delimiter."""


@dataclass(frozen=True)
class Shot:
    id: Any
    source: str
    target: str
    fields: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Prompts:
    """How every source of a run becomes its prompt's token ids."""

    template: str
    prefix: str
    chat_template: str | None
    """The tokenizer's chat template, with --apply_chat_template; None for plain prompts."""
    system: str | None
    shots: tuple[Shot, ...]
    fewshot_file: str | None
    limit: int | None
    """The most tokens a prompt may have; None when the model states no limit."""
    limit_why: str
    truncate_left: bool
    bos_id: int | None
    bos_text: str | None
    allow_reference: bool = False
    """--allow_reference_in_prompt: the prompts may hold the evaluated examples' references (inputs/leaks.py)."""

    def user_text(self, source: str, fields: Mapping[str, str] | None = None) -> str:
        return self.prefix + fill(self.template, source, fields or {})

    def text(self, tokenizer: Any, source: str, fields: Mapping[str, str] | None = None) -> str:
        """The prompt's text, as it is tokenized; `fields`: the example's other columns the
        template names."""
        if self.chat_template is None:
            shots = "".join(self.user_text(s.source, s.fields) + s.target + SHOT_SEPARATOR for s in self.shots)
            return shots + self.user_text(source, fields)
        turns = [{"role": "system", "content": self.system}] if self.system is not None else []
        for s in self.shots:
            turns += [{"role": "user", "content": self.user_text(s.source, s.fields)},
                      {"role": "assistant", "content": s.target}]
        turns.append({"role": "user", "content": self.user_text(source, fields)})
        return tokenizer.apply_chat_template(turns, chat_template=self.chat_template, tokenize=False,
                                             add_generation_prompt=True)

    def identity(self) -> dict[str, Any]:
        """Everything that decides the prompts' ids (the token cache's key)."""
        return {"template": self.template, "prefix": self.prefix, "chat_template": self.chat_template,
                "system": self.system, "shots": [[s.id, s.source, s.target, s.fields] for s in self.shots],
                "limit": self.limit, "truncate_left": self.truncate_left}

    def record(self) -> dict[str, Any]:
        """What the manifest and the metric file's provenance say of the prompts."""
        chat = self.chat_template
        return {
            "template": self.template,
            "prefix": self.prefix,
            "chat_template_sha256": hashlib.sha256(chat.encode("utf-8")).hexdigest() if chat is not None else None,
            "system_instruction": self.system,
            "fewshot": {"file": self.fewshot_file, "ids": [s.id for s in self.shots]} if self.shots else None,
            "special_tokens": "written by the chat template" if chat is not None else "added by the tokenizer",
            "max_prompt_tokens": self.limit,
            "truncate_prompt": "left" if self.truncate_left else None,
            "allow_reference_in_prompt": self.allow_reference,
        }


@functools.lru_cache(maxsize=8)
def _parts(template: str) -> tuple[tuple[str, str | None], ...]:
    """(literal text, field name or None) in order: str.format's parsing, with the field's name
    taken as it is (a dotted column path such as translation.en is a name, not an attribute)."""
    shown = f"--prompt_template {template!r}"  # UTF-8 text: EvalConfig checked it (inputs.checks)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(f"{shown}: {e}; write literal braces as {{{{ and }}}}") from e
    parts = []
    for literal, name, spec, conv in parsed:
        if name is not None and (spec or conv or not name or "[" in name):
            raise ConfigError(f"{shown}: {{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}: expected "
                              "a plain {source} or {column}, without an index, a conversion or a format")
        parts.append((literal, name))
    if not any(name == "source" for _, name in parts):
        raise ConfigError(f"{shown}: no {{source}}; expected it where each example's source goes")
    return tuple(parts)


def template_fields(template: str | None) -> tuple[str, ...]:
    """The input's columns a template names besides {source}, in order, once each."""
    if template is None:
        return ()
    names = [name for _, name in _parts(template) if name is not None and name != "source"]
    return tuple(dict.fromkeys(names))


def fill(template: str, source: str, fields: Mapping[str, str]) -> str:
    return "".join(literal + ("" if name is None else source if name == "source" else fields[name])
                   for literal, name in _parts(template))


def _shots(cfg: EvalConfig) -> tuple[Shot, ...]:
    """--num_fewshot examples of --fewshot_file, chosen by --seed: the same for every prompt."""
    if not cfg.num_fewshot:
        return ()
    from .files import iter_jsonl

    path = Path(cfg.fewshot_file)  # type: ignore[arg-type]  # EvalConfig requires it with --num_fewshot
    if not path.is_file():
        raise DataError(f"--fewshot_file {path}: no such file; expected a JSON Lines file of source/target pairs")
    template = template_fields(cfg.prompt_template)
    pool = list(iter_jsonl(path, need_targets=True, fields=[name for name in template if name != ID_FIELD]))
    if cfg.num_fewshot > len(pool):
        raise ConfigError(f"--num_fewshot {cfg.num_fewshot}: --fewshot_file {path} holds {len(pool)} examples; "
                          f"expected at most {len(pool)}")
    chosen = random.Random(cfg.seed).sample(range(len(pool)), cfg.num_fewshot)
    # A few-shot example's answer is its (first) reference.
    shots = []
    for i in chosen:
        named = dict(pool[i].fields or {})
        if ID_FIELD in template:  # {id}: the example's id as text, as for the evaluated examples
            named[ID_FIELD] = str(pool[i].id)
        shots.append(Shot(pool[i].id, pool[i].source, pool[i].references[0], named if template else None))
    return tuple(shots)


def _limit(cfg: EvalConfig, model_config: Any, tokenizer: Any, max_new_tokens: int) -> tuple[int | None, str]:
    """The most tokens a prompt may have, and why: --max_source_length, else the model's
    positions less the new tokens."""
    context = model_limit(model_config, tokenizer)
    room = None if context is None else context - max_new_tokens
    why = f"the model's {context} positions less --max_new_tokens {max_new_tokens}"
    if room is not None and room < 1:
        raise ConfigError(f"--max_new_tokens {max_new_tokens}: leaves no room for a prompt in the model's {context} "
                          f"positions; expected at most {context - 1}")
    if cfg.max_source_length is not None:
        if room is not None and cfg.max_source_length > room:
            raise ConfigError(f"--max_source_length {cfg.max_source_length}: a prompt that long and --max_new_tokens "
                              f"{max_new_tokens} exceed the model's {context} positions; expected at most {room}")
        return cfg.max_source_length, f"--max_source_length {cfg.max_source_length}"
    return room, why


def build_prompts(cfg: EvalConfig, tokenizer: Any, model_config: Any, gc: Any, prefix: str) -> Prompts:
    """The run's prompt construction, checked before any work: the template, the few-shot
    examples, the limit, and one prompt rendered (a chat template that fails, or a template that
    doubles BOS, is refused here in one line)."""
    template = cfg.prompt_template if cfg.prompt_template is not None else "{source}"
    probe_fields = {name: f"a {name}" for name in template_fields(template)}
    chat = None
    if cfg.apply_chat_template:
        chat = getattr(tokenizer, "chat_template", None)
        if not chat or not isinstance(chat, str):
            raise ConfigError(f"--apply_chat_template: the tokenizer of {cfg.model_name} has no chat template "
                              "(a single one, as text); leave out --apply_chat_template and give --prompt_template")
    limit, why = _limit(cfg, model_config, tokenizer, int(gc.max_new_tokens))
    bos_id = getattr(tokenizer, "bos_token_id", None)
    fewshot_file = str(Path(cfg.fewshot_file).expanduser().resolve()) if cfg.fewshot_file else None
    prompts = Prompts(template, prefix, chat, cfg.system_instruction, _shots(cfg), fewshot_file, limit, why,
                      cfg.truncate_prompt == "left", bos_id, getattr(tokenizer, "bos_token", None),
                      cfg.allow_reference_in_prompt)
    try:
        text = prompts.text(tokenizer, "a source", probe_fields)
    except Exception as e:  # a chat template is code of the model's: any error it raises is its refusal
        raise ConfigError(f"--apply_chat_template: the chat template of {cfg.model_name} fails "
                          f"({type(e).__name__}: {first_line(e)}); fix the template or leave out "
                          "--apply_chat_template") from e
    if not isinstance(text, str):
        raise ConfigError(f"--apply_chat_template: the chat template of {cfg.model_name} gives "
                          f"{type(text).__name__}, not text")
    shown = "--apply_chat_template" if chat is not None else f"--prompt_template {template!r}"
    ids = encode_texts(tokenizer, [text], chat is None)[0]
    problem = _bos_problem(prompts, ids)
    if problem:
        raise ConfigError(f"{shown}: {problem}")
    ends = set(stop_ids(gc.eos_token_id)) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    if chat is None and ids and ids[-1] in ends and encode_texts(tokenizer, [text], False)[0][-1:] != ids[-1:]:
        # A tokenizer that ends every text with its end token (as a seq2seq source's) tells the
        # model that the prompt is finished: whatever it generates then is not a continuation.
        raise ConfigError(f"{shown}: the tokenizer of {cfg.model_name} adds the end token "
                          f"{tokenizer.convert_ids_to_tokens(ids[-1])!r} after every prompt, so the model would see "
                          "each prompt as finished; use --apply_chat_template, or a tokenizer that does not add it")
    return prompts


def stop_ids(value: Any) -> list[int]:
    """eos_token_id as a list of ids."""
    return [] if value is None else [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _bos_problem(prompts: Prompts, ids: Sequence[int]) -> str | None:
    if prompts.bos_id is None or len(ids) < 2 or ids[0] != prompts.bos_id or ids[1] != prompts.bos_id:
        return None
    if prompts.chat_template is not None:
        return (f"the prompt starts with the BOS token {prompts.bos_text!r} twice (the chat template writes it, and "
                "the text after it starts with it again)")
    return (f"the prompt starts with the BOS token {prompts.bos_text!r} twice (the text starts with it and the "
            f"tokenizer adds it too); leave {prompts.bos_text!r} out of the prompt")


def encode_prompts(prompts: Prompts, tokenizer: Any, sources: Sequence[str],
                   fields: Sequence[Mapping[str, str]] | None = None
                   ) -> tuple[list[list[int]], int, tuple[int, str] | None]:
    """The prompts' ids, how many were truncated (--truncate_prompt left), and the first problem
    as (index in `sources`, why): a doubled BOS, a prompt too long, a chat template that fails.
    `fields`: each example's columns the template names."""
    texts, problem = [], None
    for i, source in enumerate(sources):
        try:
            texts.append(prompts.text(tokenizer, source, fields[i] if fields is not None else None))
        except Exception as e:  # the model's chat template, on this example's text
            texts.append("")
            if problem is None:
                problem = (i, f"the chat template fails on its prompt ({type(e).__name__}: {first_line(e)})")
    ids = encode_texts(tokenizer, texts, prompts.chat_template is None)
    truncated = 0
    for i, row in enumerate(ids):
        if problem is not None and problem[0] <= i:
            break
        why = _bos_problem(prompts, row)
        if why is None and prompts.limit is not None and len(row) > prompts.limit:
            if prompts.truncate_left:
                keep = [row[0]] if prompts.bos_id is not None and row[0] == prompts.bos_id else []
                ids[i] = keep + row[len(row) - (prompts.limit - len(keep)):]
                truncated += 1
                continue
            why = (f"its prompt is {len(row)} tokens, more than the {prompts.limit} that fit ({prompts.limit_why}); "
                   "shorten the prompt, lower --max_new_tokens, or pass --truncate_prompt left")
        if why is not None:
            problem = (i, why)
    return ids, truncated, problem
