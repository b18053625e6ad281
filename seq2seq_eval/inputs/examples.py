"""Examples and their ids: the types every input format produces and every later step reads.

Every example carries an id. Predictions are joined to references by that id, never by
position, so an id must be unique and stable: the 0-based line number in the legacy layout, the
record's "id" (or its 0-based line number) in JSON Lines, a dataset's id column or row number."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

ExampleId = int | str


@dataclass(frozen=True)
class Example:
    id: ExampleId
    source: str
    target: str | tuple[str, ...] | None
    """One reference as a str, several as a tuple of two or more, None when there are none."""
    fields: Mapping[str, str] | None = None
    """Other columns of the input that a decoder-only model's prompt template names, by name."""

    @property
    def references(self) -> tuple[str, ...]:
        """The reference(s) as a tuple, whatever the count (empty when there are none)."""
        if self.target is None:
            return ()
        return (self.target,) if isinstance(self.target, str) else tuple(self.target)


@dataclass(frozen=True)
class Examples:
    items: tuple[Example, ...]
    origin: str  # where they came from, for messages and the manifest

    def __len__(self) -> int:
        return len(self.items)

    @property
    def ids(self) -> list[ExampleId]:
        return [e.id for e in self.items]


def target_of(references: Sequence[str] | None) -> str | tuple[str, ...] | None:
    """An Example's target from its list of references: the one text, a tuple of several, or None."""
    if references is None:
        return None
    return references[0] if len(references) == 1 else tuple(references)


@dataclass(frozen=True)
class Block:
    """Consecutive examples as columns: how inputs reach the example store. A million Example
    objects cost seconds to build and to take apart again; the legacy layout is read straight
    into these lists, a few MiB of each file at a time."""

    ids: Sequence[ExampleId]  # a range for line-numbered inputs
    sources: list[str]
    targets: list[list[str] | None] | None = None  # per example, its reference(s) or None
    reference_sets: list[list[str]] | None = None  # or: per reference file, a text per example
    fields: list[Mapping[str, str]] | None = None  # per example, the columns a prompt template names

    def __len__(self) -> int:
        return len(self.sources)

    def examples(self) -> Iterator[Example]:
        targets = self.targets
        if self.reference_sets is not None:
            targets = [list(t) for t in zip(*self.reference_sets)]
        fields = self.fields if self.fields is not None else itertools.repeat(None)
        for i, s, t, f in zip(self.ids, self.sources, targets if targets is not None else itertools.repeat(None),
                              fields):
            yield Example(i, s, target_of(t), f)

    def head(self, n: int) -> "Block":
        return Block(self.ids[:n], self.sources[:n], None if self.targets is None else self.targets[:n],
                     None if self.reference_sets is None else [r[:n] for r in self.reference_sets],
                     None if self.fields is None else self.fields[:n])


def blocks_of(examples: Iterable[Example], rows: int) -> Iterator[Block]:
    """Examples regrouped into blocks of `rows` (the last one shorter)."""
    it = iter(examples)
    while chunk := list(itertools.islice(it, rows)):
        fields = [e.fields or {} for e in chunk] if any(e.fields is not None for e in chunk) else None
        yield Block([e.id for e in chunk], [e.source for e in chunk],
                    [list(e.references) if e.target is not None else None for e in chunk], fields=fields)


BLOCK_ROWS = 8192

"""Examples per Block read from an input: also the store's record batch size (store.ROWS_PER_BATCH),
fixed because the data fingerprint hashes batch buffers."""
