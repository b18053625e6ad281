"""The reference-leak check compares texts as a reader sees them (inputs/leaks.py): no model, no run.

normalised() against its definition on random texts built from the characters where Arrow's kernels
and Python's differ, invisible characters anywhere in a copy of a reference, the matched reference
named among several, and the label rule for few-shot examples tried on both sides."""

from __future__ import annotations

import functools
import random
import sys
import unicodedata

import pyarrow as pa
import pytest

from seq2seq_eval.errors import ConfigError
from seq2seq_eval.inputs import leaks
from seq2seq_eval.inputs.examples import BLOCK_ROWS, Block, Example
from seq2seq_eval.inputs.prompts import Shot
from seq2seq_eval.inputs.store import ExampleStore, write_store


@functools.cache
def invisible() -> tuple[str, ...]:
    """Every format character Python's Unicode database knows (a scan of every code point, so
    built once, when a test asks), and the other default-ignorable code points (PropList.txt:
    Variation_Selector, Other_Default_Ignorable_Code_Point)."""
    formats = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    others = [chr(c) for c in (0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x2065, 0x3164,
                               0xFFA0, *range(0xFE00, 0xFE10), *range(0xFFF0, 0xFFF9), 0xE0000,
                               *range(0xE0100, 0xE01F0))]
    assert len(formats) > 150 and {"\u200b", "\u00ad", "\ufeff", "\U000e0041"} <= set(formats)
    return tuple(formats + others)


# Characters where case folding, compatibility forms and composition go wrong one way or another.
HARD = list("abcXYZ sS.") + [
    "\n", "\t", "\u00a0", "\u3000", "\u2028", "ß", "ẞ", "SS", "İ", "ı", "I", "i", "\u0307", "\u0323", "Σ", "σ", "ς",
    "ΐ", "\u0345", "ᾳ", "Ꭰ", "ꭰ", "ﬀ", "ﬅ", "ſ", "Ａ", "ａ", "ℌ", "\u212a", "\u212b", "W", "\u030a", "ẘ", "é", "e",
    "\u0301", "ǅ", "Ǆ", "가", "\u1100", "\u1161", "㎒", "①", "Ⓐ", "𝐀", "東", "ك", "\u0600", "😀", "\u200d", "\u00ad",
    "\u200b", "\ufeff", "\ufe0f", "\u034f"]


def reader_sees(text: str) -> str:
    """normalised()'s definition, in Python, text by text."""
    hidden = set(invisible())
    return " ".join(leaks.folded("".join(c for c in text if c not in hidden)).split())


def test_every_format_and_default_ignorable_character_is_removed():
    """All of category Cf (not a list of favourites: 160 and more) and the other default-ignorables,
    alone inside a word."""
    assert leaks.normalised([f"ka{c}tze" for c in invisible()]).to_pylist() == ["katze"] * len(invisible())


def test_folding_and_compatibility_forms_never_make_a_newline_or_an_invisible_character():
    """Why normalised() may remove invisible characters before folding, and fold texts joined by
    newlines: no other character folds into either (all of them as one text, where each one's
    NFKC and case folding show)."""
    hidden = set(invisible())
    others = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c not in hidden and c != "\n"
                     and not "\ud800" <= c <= "\udfff")
    for made in (unicodedata.normalize("NFKC", others), others.casefold()):
        assert [c for c in [*invisible(), "\n"] if c in made] == []


@pytest.mark.parametrize("seed", range(40))
def test_normalised_is_its_definition_on_random_hard_texts(seed, monkeypatch):
    rng = random.Random(seed)
    pool = HARD + rng.sample(invisible(), 8)
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 12))) for _ in range(60)]
    texts += [None, "plain ascii Text", ""]
    rng.shuffle(texts)
    expected = [None if t is None else reader_sees(t) for t in texts]
    assert leaks.normalised(texts).to_pylist() == expected
    monkeypatch.setattr(leaks, "SLICE", 1 + seed % 7)  # the texts folded in several Python calls
    assert leaks.normalised(pa.chunked_array([texts[:10], texts[10:]], pa.string())).to_pylist() == expected


@pytest.mark.parametrize("a, b", [
    ("Straße", "STRASSE"), ("straße", "STRAẞE"), ("Fuß", "fuss"),  # full case folding, not lower-casing
    ("İSTANBUL", "istanbul"), ("ISTANBUL", "ıstanbul"), ("İstanbul", "İstanbul".lower()),  # Turkish i's, i + U+0307
    ("ＨＡＵＳ　１", "Haus 1"), ("ﬁnal", "FINAL"), ("ΟΔΟΣ", "οδος"), ("ΟΔΟΣ", "οδοσ"),
    ("Ꮳ ᏂᎩ", "ꮳ ꮒꭹ"),  # Cherokee folds to its capitals
    ("e\u0301te\u0301", "ÉTÉ"), ("W\u030a", "ẘ"), ("\u212bngstr\u00f6m", "ångström"),
    ("Ein\u00adrotes\u200bHaus", "einroteshaus"), ("\ufeffHaus\u2060", "haus"), ("a\u202eb\u202c", "ab"),
])
def test_what_a_reader_sees_the_same_compares_equal(a, b):
    assert leaks.normalised([a]).equals(leaks.normalised([b])), (leaks.normalised([a, b]))


@pytest.mark.parametrize("a, b", [
    ("résumé", "resume"), ("Haus", "Hause"), ("ein Haus", "einHaus"), ("ß", "s"), ("1", "١"),
    ("a", "\u0430"),  # Cyrillic а looks alike but is another letter: not covered (docs/causal.md)
])
def test_what_a_reader_sees_differ_still_differs(a, b):
    assert not leaks.normalised([a]).equals(leaks.normalised([b]))


# ---------------------------------------------------------------- a column that holds its own reference

def _block(references: list[list[str]], column: list[str], by_set: bool = False) -> Block:
    """Examples with their references per example, or (`by_set`) as a text per example for each
    reference (the layout of reference files and of several target columns)."""
    n = len(references)
    sets = [list(t) for t in zip(*references)] if by_set else None
    return Block([f"e{i}" for i in range(n)], [f"source {i}" for i in range(n)], None if by_set else references,
                 sets, fields=[{"gloss": c} for c in column])


@pytest.mark.parametrize("seed", range(30))
def test_a_reference_with_invisible_characters_anywhere_is_still_found(seed):
    """The issue's U+200B and U+00AD, and every other invisible character, at random positions in
    a random copy of a random example's reference (case changed too): refused, naming it."""
    rng = random.Random(seed)
    references = [[f"the {rng.choice(['red', 'blue'])} house number {i}"] for i in range(20)]
    row = rng.randrange(20)
    copy = list(references[row][0].upper() if seed % 2 else references[row][0])
    for _ in range(rng.randint(1, 4)):
        copy.insert(rng.randint(0, len(copy)), rng.choice(invisible()))
    column = [f"gloss {i}" for i in range(20)]
    column[row] = "".join(copy)
    with pytest.raises(ConfigError, match=rf"^data: example id 'e{row}': its column 'gloss', which --prompt_template "
                                          rf"names, holds its reference 'the (red|blue) house number {row}' "):
        leaks._check_rows(_block(references, column), ["gloss"], "data")


@pytest.mark.parametrize("by_set", [False, True])
@pytest.mark.parametrize("n, matched", [(2, 1), (3, 2), (3, 1), (3, 0)])
def test_the_refusal_names_the_reference_that_matched(n, matched, by_set):
    references = [[f"other {k}" for k in range(n)], [f"reference number {k}" for k in range(n)]]
    column = ["a gloss", f"REFERENCE  number {matched}"]
    with pytest.raises(ConfigError) as e:
        leaks._check_rows(_block(references, column, by_set), ["gloss"], "data")
    assert f"holds its reference {matched + 1} (of {n}) 'reference number {matched}' (compared as a reader " \
           in str(e.value), str(e.value)


def test_a_column_that_holds_its_own_label_is_refused_and_empty_texts_match_nothing():
    """The label rule is for few-shot examples only: a column equal to its own example's label
    tells that example its answer. A text of invisible characters only shows nothing."""
    labels = [["positive"], ["negative"], ["positive"]]
    with pytest.raises(ConfigError, match="example id 'e2': its column 'gloss', which --prompt_template names, "
                                          "holds its reference 'positive'"):
        leaks._check_rows(_block(labels, ["negative", "positive", "Positive"]), ["gloss"], "data")
    leaks._check_rows(_block([["\u200b"], ["\u00ad \u2060"]], ["\ufeff", " "]), ["gloss"], "data")


# ---------------------------------------------------------------- few-shot examples and labels

def _store(tmp_path, references: list, sources: list[str] | None = None, name: str = "s") -> ExampleStore:
    sources = sources or [f"source {i}" for i in range(len(references))]
    path = tmp_path / f"{name}.arrow"
    write_store(path, [Example(f"e{i}", s, r) for i, (s, r) in enumerate(zip(sources, references))])
    return ExampleStore(path, "test.jsonl")


def _refusal(shots: list[Shot], store: ExampleStore) -> str | None:
    try:
        leaks.check_shots(shots, store, "shots.jsonl", False)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).endswith("pass --allow_reference_in_prompt to allow it"), str(e)
        return str(e)
    return None


LABELS = ["positive", "negative", "positive", "neutral", "negative", "positive"]


def test_a_label_task_can_use_few_shot_examples(tmp_path):
    store = _store(tmp_path, LABELS)
    shots = [Shot("s1", "I loved it", "positive"), Shot("s2", "Awful.", " NEGATIVE\u200b"),
             Shot("s3", "the", "the", {"gloss": "Negative"})]
    assert _refusal(shots, store) is None
    # A shared word, as the cloze task: the reference of several examples.
    cloze = _store(tmp_path, ["the", "a", "The", "the"], name="w")
    assert _refusal([Shot("s", "He sat on _ mat", "the")], cloze) is None
    # Asked for by name, nothing is checked.
    leaks.check_shots([Shot("e1", "source 1", "negative")], store, "shots.jsonl", True)


def test_a_label_task_still_refuses_what_is_not_a_label(tmp_path):
    store = _store(tmp_path, LABELS)
    said = _refusal([Shot("s1", "I loved it", "positive"), Shot("s2", "SOURCE 4", "negative")], store)
    assert "few-shot example id 's2' has the source of evaluated example id 'e4' of test.jsonl " in said, said
    said = _refusal([Shot("e3", "a new text", "positive")], store)
    assert "few-shot example id 'e3' has the id of evaluated example id 'e3'" in said, said
    # "neutral" is the reference of one example only: that example's answer.
    said = _refusal([Shot("s", "It was fine", "Neutral")], store)
    assert "few-shot example id 's' shows in its target the reference of evaluated example id 'e3' of test.jsonl " \
           in said and "not a label: the reference of evaluated examples with one source, where a label is the " \
           "reference of examples with 2 or more different sources)" in said, said


def test_a_unique_long_reference_copied_into_a_shot_is_refused(tmp_path):
    references = [f"The committee approved budget number {i} on Tuesday." for i in range(5)] + LABELS
    store = _store(tmp_path, references)
    for shot, what in ((Shot("s", "Der Ausschuss...", "the committee approved budget NUMBER 3 on tuesday."),
                        "its target"),
                       (Shot("s", "the Committee approved bud\u00adget number 3 on Tuesday.", "Der Ausschuss"),
                        "its source"),  # the other direction
                       (Shot("s", "x", "positive", {"gloss": "The committee approved budget number 3 on Tuesday."}),
                        "its column 'gloss'")):
        said = _refusal([Shot("ok", "a text", "negative"), shot], store)
        assert f"few-shot example id 's' shows in {what} the reference of evaluated example id 'e3' " in said, said


@pytest.mark.parametrize("references, sources, allowed", [
    # Shared by 2 examples with different sources, short: a label.
    (["Thank you.", "Thank you.", "x", "y"], ["Thanks.", "Thank you!", "a", "b"], True),
    # Two copies of one example (the same source, as a reader sees it): that example's answer.
    (["Thank you.", "Thank you.", "x", "y"], ["Thanks.", "THANKS.\u200b", "a", "b"], False),
    # Long text shared by 2, or by 5, examples with different sources: never a label.
    (["The committee approved the budget on Tuesday."] * 2 + ["x"], ["a", "b", "c"], False),
    (["The committee approved the budget on Tuesday."] * 5, ["a", "b", "c", "d", "e"], False),
    # At most 40 characters, shared: a label; 41: not.
    (["x" * 40] * 2, ["a", "b"], True),
    (["x" * 41] * 2, ["a", "b"], False),
    # As a second reference of two examples.
    ([("ja", "yes"), ("no", "yes"), "maybe"], ["a", "b", "c"], True),
])
def test_the_label_rule_on_both_sides(tmp_path, references, sources, allowed):
    text = references[0] if isinstance(references[0], str) else references[0][1]
    said = _refusal([Shot("s", "a shot's own source", text.upper())], _store(tmp_path, references, sources))
    assert (said is None) == allowed, said
    if not allowed:
        why = f"{len(text)} characters, where a label has at most 40" if len(text) > 40 else \
            "the reference of evaluated examples with one source"
        assert "shows in its target the reference of evaluated example id 'e0' of test.jsonl" in said, said
        assert why in said, said


def test_the_label_rule_counts_sources_across_record_batches(tmp_path):
    """The examples that share a reference lie in different record batches of the store."""
    n = BLOCK_ROWS + 3
    references = [f"unique reference {i}" for i in range(n)]
    references[5] = references[n - 1] = "ok"
    sources = [f"source {i}" for i in range(n)]
    shot = [Shot("s", "a shot's own source", "OK")]
    assert _refusal(shot, _store(tmp_path, references, sources)) is None
    sources[n - 1] = sources[5]
    said = _refusal(shot, _store(tmp_path, references, sources, name="same"))
    assert "shows in its target the reference of evaluated example id 'e5' " in said, said
    # The first example shared with is named across batches too, for every kind of sharing.
    said = _refusal([Shot("s", "SOURCE 8193", "z")], _store(tmp_path, references, name="far"))
    assert "has the source of evaluated example id 'e8193'" in said, said


@pytest.mark.parametrize("n, matched", [(2, 1), (3, 2), (3, 0)])
def test_a_few_shot_refusal_names_the_reference_that_matched(tmp_path, n, matched):
    references = [tuple(f"other {k}" for k in range(n)), tuple(f"reference number {k}" for k in range(n))]
    said = _refusal([Shot("s", "a source", f"Reference Number {matched}")], _store(tmp_path, references))
    assert f"shows in its target reference {matched + 1} (of {n}) of evaluated example id 'e1' " in said, said


def test_examples_without_references_and_empty_texts_share_nothing(tmp_path):
    store = _store(tmp_path, [None, "\u200b", "ein Haus", None])
    assert _refusal([Shot("s", "a source", "\u00ad", {"gloss": "\ufeff"})], store) is None
    said = _refusal([Shot("s", "a source", "EIN \u2060HAUS")], store)
    assert said is not None and "evaluated example id 'e2'" in said
