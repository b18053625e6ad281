"""Decoder-only models on CTranslate2: `Generator.generate_batch` on each planned batch of prompts.

The prompts are the token ids the HF engine generates from (the shards: inputs/prompts.py), given
to CTranslate2 as their tokens, with `include_prompt_in_result=False`: the prompt is the decoder's
state, `max_length` and `min_length` count new tokens only, and a hypothesis is its continuation
only, its score the continuation's (a forced prompt token adds nothing to it). Everything after
the search is the Translator engine's (engines/ct2.py): the settings' mapping, the forced end
token, stop strings, decoding and scores.

How CTranslate2 4.x runs prompts of several lengths: it forwards every prompt at once up to the
shortest one's length less one token, then the rest of each longer prompt inside its decoding loop,
as a forced prefix. Two consequences, which the engine avoids by calling it on a part of the batch
at a time (`groups`):

- a batch whose shortest prompt is one token long forwards nothing, and CTranslate2 then returns
  the other prompts' tails with their continuations and counts them in `max_length`;
- in beam search, at the first free step after a forced prefix it keeps an end token out of every
  beam but the first (a guard against short hypotheses of its own); generate() does not.

So in beam search each call holds prompts of one length; with one beam, prompts of one token are
kept apart from longer ones; on CPU each call is cut into parts for the workers (engines/ct2.py's
`parts`), and every part of every call is queued before any is awaited. What reads the tokens of
the decoding loop (repetition penalties, banned n-grams) would see a part of the prompt that
depends on the batch: engines/ct2_rules.py's GENERATOR refuses those settings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ModelError, first_line
from .ct2 import CT2Engine, Found, Mapping, gather, parts


def generate_options(m: Mapping) -> dict[str, Any]:
    """`generate_batch`'s keyword arguments for the Translator's mapping of the same settings:
    the same searches, lengths named as the Generator names them (new tokens only, with
    `include_prompt_in_result=False`)."""
    options = {k: v for k, v in m.options.items() if k != "max_input_length"}
    options["max_length"] = options.pop("max_decoding_length")
    options["min_length"] = options.pop("min_decoding_length")
    options["include_prompt_in_result"] = False
    return options


def groups(lengths: Sequence[int], one_length: bool) -> list[list[int]]:
    """The positions of a batch's prompts, in the calls that give generate()'s search (the
    module's docstring): one call per prompt length (`one_length`: beam search), else one for
    the prompts of one token and one for the longer ones. In order of first appearance."""
    calls: dict[Any, list[int]] = {}
    for i, n in enumerate(lengths):
        calls.setdefault(n if one_length else n == 1, []).append(i)
    return list(calls.values())


def vocabulary(folder: Path) -> list[str]:
    """The converted model's tokens, in id order (vocabulary.json, or an older conversion's
    vocabulary.txt: one token a line)."""
    as_json, as_text = folder / "vocabulary.json", folder / "vocabulary.txt"
    try:
        if as_json.is_file():
            tokens = json.loads(as_json.read_text(encoding="utf-8"))
        else:
            tokens = as_text.read_text(encoding="utf-8").split("\n")
            tokens = tokens[:-1] if tokens and tokens[-1] == "" else tokens
    except (OSError, ValueError) as e:
        raise ModelError(f"{folder}: cannot read the converted model's vocabulary ({first_line(e)}); expected "
                         "vocabulary.json or vocabulary.txt") from e
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ModelError(f"{folder / 'vocabulary.json'}: expected a JSON list of tokens")
    return tokens


def vocabulary_problem(tokens: Sequence[str], tokenizer: Any) -> str | None:
    """Why the prompts' tokens would not reach the model as the tokenizer's ids (None when they
    do): CTranslate2 takes tokens, not ids, and maps each through its own vocabulary, so every
    token of the tokenizer must be there once, at the tokenizer's id."""
    mine = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if len(tokens) < len(mine):
        return f"the model has {len(tokens)} tokens, the tokenizer {len(mine)}"
    for i, (theirs, ours) in enumerate(zip(tokens, mine)):
        if theirs != ours:
            return f"token id {i} is {theirs!r} in the model, {ours!r} in the tokenizer"
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in seen and seen[token] < len(mine):
            return f"the token {token!r} is at ids {seen[token]} and {i} in the model"
        seen.setdefault(token, i)
    return None


class GeneratorEngine(CT2Engine):
    """A decoder-only model on CTranslate2's Generator."""

    model_class = "Generator"

    @classmethod
    def check_folder(cls, path: Path, tokenizer: Any) -> None:
        problem = vocabulary_problem(vocabulary(path), tokenizer)
        if problem:
            raise ModelError(f"{path}: the converted model's vocabulary is not the tokenizer's ({problem}); expected "
                             "the tokenizer the model was converted with")

    def stop_prefix(self, ids: Sequence[int]) -> list[int]:
        return list(ids)

    def search(self, model: Any, batch_ids: Sequence[Sequence[int]]) -> Found:
        options = generate_options(self.mapping)
        lengths = [len(ids) for ids in batch_ids]
        runs = [run for call in groups(lengths, one_length=int(options["beam_size"]) > 1)
                for run in parts(call, lengths, model.num_generators, int(options["max_length"]))]
        return gather(runs, len(batch_ids), lambda run: model.generate_batch(
            [self.tokenizer.convert_ids_to_tokens(list(batch_ids[i])) for i in run], asynchronous=True, **options),
            lambda r: [(list(ids), float(s)) for ids, s in zip(r.sequences_ids, r.scores)])
