"""Nothing of an evaluated example's reference reaches the model's input unless the user asks for
it by name (--allow_reference_in_prompt). Checked before any work, the dry run included:

- a column a decoder-only model's --prompt_template names is not a reference column of the input
  (JSON Lines: the "target" field; a dataset: its target column(s) and, when the source is a
  language of a translation dict, the dict's other languages), nor inside one, nor one that holds
  one; the same for `{id}` when the ids come from such a column, and for the source column;
- no column the template names holds its example's own reference (the same text, compared as
  `normalised` compares: a reference column under another name);
- no few-shot example shares a string id, a source or a shown text with the evaluated set
  (`check_shots`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConfigError
from .examples import Block

FLAG = "--allow_reference_in_prompt"

ID_FIELD = "id"
"""The template field that is the example's id as text ({id}), on every input kind: a line
number, a record's "id", a dataset's id column or row number."""

COMPARED = "compared ignoring case, Unicode compatibility forms and runs of whitespace"


def normalised(texts: Sequence[str | None] | pa.Array) -> pa.Array:
    """Texts as they are compared here: NFKC, lower case, each run of (Unicode) whitespace one
    space, no outer whitespace: " ".join(text.split()) of the lower-cased NFKC text. Arrow's
    kernels (a split and a join, 3x faster than a regular expression): about 3 s a million texts
    of 70 characters on a busy 2-core machine."""
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts, pa.string())
    array = pc.utf8_lower(pc.utf8_normalize(array, form="NFKC"))
    return pc.utf8_trim_whitespace(pc.binary_join(pc.utf8_split_whitespace(array), " "))


def _relation(path: str, reference: str) -> str | None:
    """How a column path stands to a reference column path: the same, inside it, holding it."""
    if path == reference:
        return "is"
    if path.startswith(reference + "."):
        return "lies inside"
    if reference.startswith(path + "."):
        return "holds"
    return None


def check_columns(references: Sequence[str], where: str, allow: bool, template: Sequence[str] = (),
                  source: str | None = None, ids: str | None = None) -> None:
    """The input's reference column paths against the columns the template names (`{id}` stands
    for the id column `ids`, when the ids come from one) and the source column."""
    if allow:
        return
    named = [(f"--prompt_template names {{{name}}}, which", ids if name == ID_FIELD else name) for name in template]
    checked = [(f"its source column {source!r}", source), *named]
    for what, path in checked:
        for reference in references:
            relation = _relation(path, reference) if path is not None else None
            if relation is not None:
                raise ConfigError(f"{where}: {what} {relation} the reference column {reference!r}, so each example's "
                                  f"reference would reach the model's input; name another column, or pass {FLAG} "
                                  "to allow it")


def _row_references(block: Block) -> list[list[str]]:
    """Each example's references (none: an empty list), from either of a block's layouts."""
    if block.reference_sets is not None:
        return [list(t) for t in zip(*block.reference_sets)]
    return [list(t) if t is not None else [] for t in (block.targets or [None] * len(block))]


def with_template_fields(blocks: Iterator[Block], template: Sequence[str], origin: str,
                         allow: bool) -> Iterator[Block]:
    """Each block with `{id}` filled in (the example's id as text), and each row checked: no column
    the template names holds its example's own reference."""
    for block in blocks:
        if ID_FIELD in template:
            rows = block.fields if block.fields is not None else [{}] * len(block)
            block = dataclasses.replace(block, fields=[{**f, ID_FIELD: str(i)} for f, i in zip(rows, block.ids)])
        if not allow and block.fields is not None:
            _check_rows(block, template, origin)
        yield block


def _check_rows(block: Block, template: Sequence[str], origin: str) -> None:
    references = _row_references(block)
    parents = [row for row, refs in enumerate(references) for _ in refs]
    if not parents:
        return
    flat = normalised([r for refs in references for r in refs])
    for name in template:
        values = normalised([f.get(name) for f in block.fields])  # type: ignore[union-attr]
        first = pc.index(pc.equal(values.take(pa.array(parents)), flat), True).as_py()
        if first >= 0:
            row = parents[first]
            raise ConfigError(f"{origin}: example id {block.ids[row]!r}: its column {name!r}, which --prompt_template "
                              f"names, holds its reference {_short(references[row][0])} ({COMPARED}), so the prompt "
                              f"would show it; name another column, or pass {FLAG} to allow it")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def check_shots(shots: Sequence[Any], store: Any, fewshot_file: str | None, allow: bool) -> None:
    """No few-shot example shares with the evaluated examples (`store`, an ExampleStore) a string
    id (integer ids are line numbers or counters, which two files share without sharing an
    example), a source, or a text it shows (its source, its target, a column the template names)
    equal to one of their references. The first such example, in the order shown, is named with
    the first evaluated example it shares with."""
    if allow or not shots:
        return
    found: dict[int, tuple[int, str]] = {}  # shot index -> (first evaluated row, what is shared)
    string_ids = {k: _json(s.id) for k, s in enumerate(shots) if isinstance(s.id, str)}
    sources = normalised([s.source for s in shots]).to_pylist()
    parts = [[("its source", s.source), ("its target", s.target),
              *((f"its column {n!r}", v) for n, v in (s.fields or {}).items() if n != ID_FIELD)] for s in shots]
    shown = [list(zip([what for what, _ in p], normalised([text for _, text in p]).to_pylist())) for p in parts]
    base = 0
    for ids, srcs, targets in store.chunks("id", "source", "target"):
        norm, parents, refs = normalised(srcs), pc.list_parent_indices(targets), normalised(targets.flatten())
        for k in range(len(shots)):
            if k in found:
                continue
            hits = [(pc.index(norm, sources[k]).as_py(), "has the source of")]
            for what, text in shown[k]:
                at = pc.index(refs, text).as_py()
                hits.append((parents[at].as_py() if at >= 0 else -1, f"shows in {what} a reference of"))
            if k in string_ids:
                hits.append((pc.index(ids, string_ids[k]).as_py(), "has the id of"))
            # The first evaluated example it shares with; with several kinds of sharing, the
            # first listed (a source before a shown reference before an id).
            hits = [(row, n, why) for n, (row, why) in enumerate(hits) if row >= 0]
            if hits:
                row, _, why = min(hits)
                found[k] = (base + row, why)
        base += len(ids)
    if found:
        k = min(found)
        row, why = found[k]
        raise ConfigError(f"--fewshot_file {fewshot_file}: few-shot example id {shots[k].id!r} {why} evaluated "
                          f"example id {store.ids([row])[0]!r} of {store.origin} ({COMPARED}), so every prompt would "
                          "show an evaluated example or what it is scored against; choose few-shot examples outside "
                          f"the evaluated set, or pass {FLAG} to allow it")


def _json(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # as the store writes a string id
