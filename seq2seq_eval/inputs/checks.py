"""The rules every entry point applies to the examples it is given, in one place: the run's data
(text files, JSON Lines, datasets), evaluate()'s lists, and the files and lists `score` and
`compare` take. The same input gets the same verdict wherever it enters; only the words for
where differ (a file's line, a dataset's row and column, a list's index).

- A source or a reference is a text: a string with more than whitespace in it and no lone
  surrogate (UTF-8 encodes it). (A prediction may be empty: a model may generate nothing, and the
  outputs say so.)
- An example has at least one reference when it has any (a list of none is refused).
- An id is a string (UTF-8 encodes it) or an integer, never a bool or a float; 1 and "1" are
  two ids, as JSON, the outputs and a join by id tell them apart.
- Ids are unique.
- Counts (one reference per prediction, one source per example) are compared by the callers,
  whose messages name both sides.

`where` arguments are callables, called only to word an error: a check costs one pass over
the values, not a formatted string per value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import DataError
from .examples import ExampleId

Where = Callable[[], str]


def short(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_text(value: Any) -> bool:
    """A string with more than whitespace in it (whitespace as str.strip() removes it), that UTF-8
    can encode (no lone surrogate: a JSON escape such as "\\ud800", or a Python string, can hold
    one; the tokenizer and every file the run writes would fail on it after the work)."""
    return isinstance(value, str) and value != "" and not value.isspace() and surrogate_at(value) is None


def surrogate_at(value: str) -> int | None:
    """The index of the first lone surrogate in `value` (a code point UTF-8 cannot encode), or None."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return e.start


def not_unicode(what: str, value: str, at: int) -> str:
    """Why a string with a lone surrogate is refused, in a message's words."""
    return (f"{what} holds a lone surrogate (U+{ord(value[at]):04X} at character {at}: {short(value)}), which is "
            "not a Unicode character; expected text UTF-8 can encode")


def check_option_texts(options: dict[str, Any]) -> None:
    """Every text among the options (EvalConfig's fields by name; a list's items; generate()'s
    settings by their own names) UTF-8 can encode, else a ConfigError naming the flag: a lone
    surrogate (a Python string given to evaluate()) would fail in the tokenizer or in a file
    written after the work. The command line's arguments are checked as they come (cli)."""
    from ..errors import ConfigError

    def texts(value: Any) -> Any:
        if isinstance(value, str):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from texts(item)

    pairs = [(name, v) for name, v in options.items() if name != "generate_kwargs"]
    pairs += list(options.get("generate_kwargs") or ())
    for name, value in pairs:
        for text in texts(value):
            if (at := surrogate_at(text)) is not None:
                what = "the template" if name == "prompt_template" else "the value"
                raise ConfigError(f"--{name} {text!r}: {not_unicode(what, text, at)}")


def blank(what: str, value: str | None = None) -> str:
    """Why a string is not a text: empty, or whitespace only (`value` None: a line read without
    its trailing whitespace, which may have been either)."""
    kind = "empty or whitespace only" if value is None else "empty" if not value else f"whitespace only: {short(value)}"
    return f"blank {what} ({kind}); expected a text with a non-whitespace character"


def text_error(value: Any, what: str, where: str) -> DataError:
    """Why `value` is not a text, as a DataError at `where` (call only when is_text is False)."""
    if isinstance(value, str):
        at = surrogate_at(value)
        return DataError(f"{where}: {blank(what, value) if at is None else not_unicode(what, value, at)}")
    return DataError(f"{where}: expected a non-empty string, got {short(value)}")


def check_text(value: Any, what: str, where: Where) -> str:
    """`value` when it is a text, else a DataError: `what` (source, reference) at where()."""
    if not is_text(value):
        raise text_error(value, what, where())
    return value


def check_texts(values: Sequence[Any], what: str, where: Callable[[int], str]) -> None:
    """Every value a text; else a DataError at the first that is not (where(i) names it)."""
    if all(map(is_text, values)):
        return
    i = next(i for i, v in enumerate(values) if not is_text(v))
    raise text_error(values[i], what, where(i))


def check_references(value: Any, where: Where) -> str | tuple[str, ...]:
    """One example's references as a JSON Lines record or a dataset row holds them: a text, or
    a non-empty list of texts. Returns the text, or a tuple of two or more (a list of one is the
    same example as its text alone)."""
    if not isinstance(value, list):
        return check_text(value, "reference", where)
    if not value:
        raise DataError(f"{where()}: an empty list; expected one or more references")
    for k, item in enumerate(value):
        check_text(item, "reference", lambda: f"{where()} item {k}")
    return value[0] if len(value) == 1 else tuple(value)


def check_id(value: Any, where: Where) -> ExampleId:
    """`value` when it can be an example's id (a string or an integer, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DataError(f"{where()}: an id must be a string or an integer, got {short(value)}")
    if isinstance(value, str) and (at := surrogate_at(value)) is not None:
        raise DataError(f"{where()}: {not_unicode('the id', value, at)}")
    return value


def duplicate_id(where: str, value: ExampleId, first: str) -> DataError:
    """The error for an id seen before: `first` says where it was ("on line 2", "in row 0")."""
    return DataError(f"{where}: duplicated id {value!r} (first {first}); expected unique ids")


class UniqueIds:
    """Ids checked one at a time against those seen before: each a valid id, none twice. For
    inputs held in memory (evaluate()'s lists, a dataset's rows); a stream of any length uses
    seen.SeenIds for the same verdict (and the same `duplicate_id` message, from an exact second
    pass). `where(i)` names the i-th id ("row 3 column 'id'"), `first(i)` as the earlier one
    ("in row 3")."""

    def __init__(self, where: Callable[[int], str], first: Callable[[int], str]) -> None:
        self._where, self._first_at = where, first
        self._seen: dict[ExampleId, int] = {}

    def add(self, value: Any, i: int) -> ExampleId:
        check_id(value, lambda: self._where(i))
        j = self._seen.setdefault(value, i)
        if j != i:
            raise duplicate_id(self._where(i), value, self._first_at(j))
        return value
