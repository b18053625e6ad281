"""Nothing of an evaluated example's reference reaches the model's input unless the user asks for
it by name (--allow_reference_in_prompt). Checked before any work, the dry run included:

- a column a decoder-only model's --prompt_template names is not a reference column of the input
  (JSON Lines: the "target" field; a dataset: its target column(s) and, when the source is a
  language of a translation dict, the dict's other languages), nor inside one, nor one that holds
  one; the same for `{id}` when the ids come from such a column, and for the source column;
- no column the template names holds its example's own reference (the same text as a reader
  sees it, `normalised`: a reference column under another name);
- no few-shot example shares a string id, a source or a shown text with the evaluated set
  (`check_shots`), but for labels: a shown text that is a short reference of evaluated examples
  with different sources (`positive`, `the`) is the task's answer vocabulary, not one example's
  answer (`LABEL_CHARS`, `LABEL_SOURCES`).
"""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConfigError
from .examples import Block

FLAG = "--allow_reference_in_prompt"

ID_FIELD = "id"
"""The template field that is the example's id as text ({id}), on every input kind: a line
number, a record's "id", a dataset's id column or row number."""

COMPARED = "compared as a reader sees them: without invisible characters, case folded, Unicode compatibility " \
           "forms and runs of whitespace as one"

LABEL_CHARS = 40
"""A shown text of at most this many characters (normalised) may be a label: the longest labels of
common label sets are shorter (Banking77's 'transfer_not_received_by_recipient': 34), while a
sentence that long is one example's answer."""

LABEL_SOURCES = 2
"""...when it is the reference of evaluated examples with at least this many different sources
(normalised): then it answers no one example. Two copies of one example (the same source) are one
example; a unique answer ('Paris' for one question) is that example's."""

# Characters a reader does not see: every format character (Unicode category Cf, RE2's table: the
# zero-width space and joiners, the soft hyphen, the byte order mark, bidi controls, tags...),
# and the rest of Unicode's Default_Ignorable_Code_Point (PropList.txt: Variation_Selector and
# Other_Default_Ignorable_Code_Point), which are not Cf.
INVISIBLE = (r"[\p{Cf}\x{034F}\x{115F}-\x{1160}\x{17B4}-\x{17B5}\x{180B}-\x{180D}\x{180F}\x{2065}\x{3164}"
             r"\x{FE00}-\x{FE0F}\x{FFA0}\x{FFF0}-\x{FFF8}\x{E0000}-\x{E0FFF}]")

SLICE = 1 << 16
"""Texts folded by one Python call: a bound on the one string they are joined into."""


def folded(text: str) -> str:
    """A text as compared here, before whitespace (invisible characters already removed): NFKC,
    full case folding, NFKC, the Turkish and Azeri i's as one letter (ı -> i; an i with a
    combining dot above -> i, which is what case folding makes of İ), NFKC. Each step maps a
    text joined by newlines to the same texts folded, joined by newlines: a newline is a starter
    that composes with nothing, and nothing folds into one."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return unicodedata.normalize("NFKC", text.replace("\u0131", "i").replace("i\u0307", "i"))


def normalised(texts: Sequence[str | None] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """Texts as a reader sees them, as they are compared here: the characters a reader does not
    see (`INVISIBLE`) removed, `folded` (Unicode compatibility forms and full case folding: ß and
    ss, fullwidth and plain letters, the Turkish i's), each run of (Unicode) whitespace one space,
    no outer whitespace: " ".join(folded(text).split()) with the invisible characters removed
    first. Nulls stay null.

    By column, never text by text: an ASCII text is folded by Arrow's lower-casing; the others
    have the invisible characters removed by Arrow's regular expressions (RE2) and go to
    `folded` joined by newlines into one string per SLICE texts (Python's NFKC checks before it
    rebuilds: 15 times faster than Arrow's utf8_normalize on text that is already NFKC); Arrow
    splits them back and joins each run of whitespace. As fast as NFKC and lower-casing by Arrow
    alone, about 0.3 s of CPU for 233,000 texts of 70 characters, two thirds of them German."""
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts, pa.string())
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    out = pc.utf8_lower(array)
    wide = pc.invert(pc.string_is_ascii(array)).fill_null(False)
    if pc.any(wide).as_py():
        rows = pc.replace_substring_regex(array.filter(wide), pattern=INVISIBLE, replacement="")
        # No newline inside a text: the newlines that join them are then where to split.
        rows = pc.replace_substring(rows, "\n", " ").cast(pa.large_string())
        parts = []
        for lo in range(0, len(rows), SLICE):
            part = rows.slice(lo, SLICE)
            joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array([0, len(part)], pa.int64()), part),
                                    pa.scalar("\n", pa.large_string()))
            parts.append(pc.split_pattern(pa.array([folded(joined[0].as_py())], pa.large_string()), "\n").flatten())
        out = pc.replace_with_mask(out, wide, pa.concat_arrays(parts).cast(array.type))
    return pc.utf8_trim_whitespace(pc.binary_join(pc.utf8_split_whitespace(out), " "))


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


def _which(k: int, n: int) -> str:
    """Which of an example's n references, for messages: reference k + 1 of n (.target.k, the
    list's target[k])."""
    return "" if n == 1 else f" {k + 1} (of {n})"


def _check_rows(block: Block, template: Sequence[str], origin: str) -> None:
    """A column that equals its own example's reference is refused, a label included: that column
    tells each example its answer."""
    references = _row_references(block)
    parents = [row for row, refs in enumerate(references) for _ in refs]
    if not parents:
        return
    flat = normalised([r for refs in references for r in refs])
    seen = pc.not_equal(flat, "")  # a reference of invisible characters only shows nothing
    rows = pa.array(parents)
    for name in template:
        values = normalised([f.get(name) for f in block.fields])  # type: ignore[union-attr]
        first = pc.index(pc.and_(pc.equal(values.take(rows), flat), seen), True).as_py()
        if first >= 0:
            row = parents[first]
            k, n = first - parents.index(row), len(references[row])
            raise ConfigError(f"{origin}: example id {block.ids[row]!r}: its column {name!r}, which --prompt_template "
                              f"names, holds its reference{_which(k, n)} {_short(references[row][k])} ({COMPARED}), "
                              f"so the prompt would show it; name another column, or pass {FLAG} to allow it")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


@dataclasses.dataclass
class _Shared:
    """What the evaluated set shares with one text the few-shot examples show."""
    row: int = -1  # the first evaluated example that has it (-1: none)
    source: str | None = None  # the normalised source of one evaluated example that has it
    sources: int = 0  # how many different sources those examples have, up to LABEL_SOURCES

    def add(self, row: int, low: str, high: str) -> None:
        """Examples that have it, in one record batch: the first row, and the least and greatest
        of their sources."""
        if self.row < 0:
            self.row, self.source, self.sources = row, low, 1
        if self.sources < LABEL_SOURCES and (low != self.source or high != self.source):
            self.sources = LABEL_SOURCES

    def label(self, text: str) -> bool:
        return len(text) <= LABEL_CHARS and self.sources >= LABEL_SOURCES


def _first_rows(found: pa.Array, rows: pa.Array, keys: pa.Array | None = None) -> list[tuple[int, int, str, str]]:
    """For each value set position found (index_in's result, null where none): the first row that
    has it, and the least and greatest of `keys` over the rows that have it."""
    table = pa.table({"v": found, "row": rows, **({"key": keys} if keys is not None else {})})
    table = table.filter(pc.is_valid(found))
    if table.num_rows == 0:
        return []
    aggregates = [("row", "min"), *((("key", "min"), ("key", "max")) if keys is not None else ())]
    out = table.group_by("v").aggregate(aggregates).to_pydict()
    lows, highs = out.get("key_min", [None] * len(out["v"])), out.get("key_max", [None] * len(out["v"]))
    return list(zip(out["v"], out["row_min"], lows, highs))


def check_shots(shots: Sequence[Any], store: Any, fewshot_file: str | None, allow: bool) -> None:
    """No few-shot example shares with the evaluated examples (`store`, an ExampleStore) a string
    id (integer ids are line numbers or counters, which two files share without sharing an
    example), a source, or a text it shows (its source, its target, a column the template names)
    equal to one of their references, but for a label: a text of at most LABEL_CHARS characters
    that is the reference of evaluated examples with LABEL_SOURCES or more different sources (all
    texts as `normalised` gives them). The first such example, in the order shown, is named with
    the first evaluated example it shares with.

    One pass over the store, each record batch matched against all the shots' texts at once (Arrow's
    index_in and a group-by): a label shared by every example costs no more than a unique text."""
    if allow or not shots:
        return
    string_ids = [_json(s.id) if isinstance(s.id, str) else None for s in shots]
    sources = normalised([s.source for s in shots]).to_pylist()
    parts = [[("its source", s.source), ("its target", s.target),
              *((f"its column {n!r}", v) for n, v in (s.fields or {}).items() if n != ID_FIELD)] for s in shots]
    shown = [[(what, text) for (what, _), text in zip(p, normalised([text for _, text in p]).to_pylist()) if text]
             for p in parts]
    # Each distinct text once: the value sets Arrow matches every record batch against.
    source_set = sorted({s for s in sources if s})
    shown_set = sorted({text for texts in shown for _, text in texts})
    id_set = sorted({i for i in string_ids if i is not None})
    source_values, shown_values, id_values = (pa.array(v, pa.string()) for v in (source_set, shown_set, id_set))
    first_source: dict[str, int] = {}
    first_id: dict[str, int] = {}
    shared = {text: _Shared() for text in shown_set}
    base = 0
    for ids, srcs, targets in store.chunks("id", "source", "target"):
        norm = normalised(srcs)
        rows = pa.array(range(base, base + len(ids)), pa.int64())
        for v, row, _, _ in _first_rows(pc.index_in(norm, value_set=source_values), rows):
            first_source.setdefault(source_set[v], row)
        for v, row, _, _ in _first_rows(pc.index_in(ids, value_set=id_values), rows):
            first_id.setdefault(id_set[v], row)
        parents = pc.list_parent_indices(targets)
        found = pc.index_in(normalised(targets.flatten()), value_set=shown_values)
        for v, row, low, high in _first_rows(found, rows.take(parents), norm.take(parents)):
            shared[shown_set[v]].add(row, low, high)
        base += len(ids)
    for k, shot in enumerate(shots):
        # The first evaluated example it shares with; with several kinds of sharing, the first
        # listed (a source before a shown reference before an id).
        hits = [(first_source.get(sources[k], -1), 0, "has the source of", None)]
        for n, (what, text) in enumerate(shown[k]):
            if not shared[text].label(text):
                hits.append((shared[text].row, 1 + n, f"shows in {what}", text))
        if string_ids[k] is not None:
            hits.append((first_id.get(string_ids[k], -1), 1 + len(shown[k]), "has the id of", None))
        hits = [h for h in hits if h[0] >= 0]
        if hits:
            row, _, why, text = min(hits)
            compared = COMPARED
            if text is not None:
                why = f"{why} {_reference(store, row, text)} of"
                compared += _not_a_label(text)
            raise ConfigError(f"--fewshot_file {fewshot_file}: few-shot example id {shot.id!r} {why} evaluated example "
                              f"id {store.ids([row])[0]!r} of {store.origin} ({compared}), so every prompt would show "
                              "an evaluated example or what it is scored against; choose few-shot examples outside the "
                              f"evaluated set, or pass {FLAG} to allow it")


def _reference(store: Any, row: int, text: str) -> str:
    """Which reference of evaluated example `row` is `text` (normalised): 'the reference' of one,
    'reference 2 (of 3)' of several."""
    target = store.targets([row])[0]
    references = [target] if isinstance(target, str) else list(target)
    if len(references) == 1:
        return "the reference"
    k = normalised(references).to_pylist().index(text)
    return f"reference{_which(k, len(references))}"


def _not_a_label(text: str) -> str:
    """Why a shown reference is not a label, for the message."""
    if len(text) > LABEL_CHARS:
        return f"; not a label: {len(text)} characters, where a label has at most {LABEL_CHARS}"
    return (f"; not a label: the reference of evaluated examples with one source, where a label is the reference of "
            f"examples with {LABEL_SOURCES} or more different sources")


def _json(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # as the store writes a string id
