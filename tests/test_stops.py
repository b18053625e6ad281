"""Stop strings stop where generate(stop_strings=..., tokenizer=...) stops, on a byte-level BPE
tokenizer (Llama 3 / Qwen2 style), on both engines, greedy and beam search: each run's candidates,
scores and token counts against a plain one-prompt-at-a-time generate() loop given the same stop
strings, every text cut before the first stop string it shows.

The model is a bigram table (tests/tiny_causal.py, `build_byte_bigram`) whose greedy path runs
through what each case needs: a CJK character and an emoji as byte tokens, U+FFFD's own bytes
(and, elsewhere, continuation bytes with no lead byte, which decode as U+FFFD too), a special
token that does not end the text; beam search's other beams take the table's random runners-up.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
from conftest import make_corpus
from test_causal import Setup, _engine, _model
from tiny_causal import build_byte_bigram, byte_tokens

from seq2seq_eval.engines.stops import Stops
from seq2seq_eval.errors import ConfigError, ModelError
from seq2seq_eval.model.kind import CAUSAL

torch = pytest.importorskip("torch")

# Each chain: a prompt's last token, then what greedy search generates after it.
CHAINS = [["x", *byte_tokens("日😀"), "Ġ", "k"],  # a CJK character, an emoji, each split into byte tokens
          ["z", *byte_tokens("\ufffd"), "q"],  # U+FFFD's own bytes: EF BF BD
          ["w", "<|im_start|>"]]  # a special token that is not an end token
PROMPTS = ["the cat x", "dog z", "red house on the mat w", "z", "café"]
GREEDY = {"max_new_tokens": 10}
BEAMS = {"max_new_tokens": 10, "num_beams": 3, "num_return_sequences": 3}

# (stop strings, whether generate() stops any hypothesis of these prompts at them)
CASES = [
    ("\ufffd", True),  # U+FFFD: only its own bytes stop; a text that shows it elsewhere runs on
    ("日", True),  # three byte tokens
    ("x日", True),  # begins in the prompt
    ("<|im_end|>", False),  # the end token's text: it ends there anyway
    ("<|im_start|>", True),  # a special token's text: decoding skips it, generate() stops at it
    ("<|im_end|>z\ufffd", False),  # reaches into the left padding (the end token) before the prompt 'z'
    # an emoji's four byte tokens and the next word; two tokens of the table's runners-up ('q', 'house')
    (["😀 k", "qho"], True),
]


@pytest.fixture(scope="module")
def bigram(tmp_path_factory) -> Path:
    src, tgt = make_corpus(40, seed=2)
    return build_byte_bigram(tmp_path_factory.mktemp("stops") / "bigram", src + tgt + ["日本 😀 café"], CHAINS)


def before_stop(text: str, strings: list[str]) -> str:
    found = [i for i in (text.find(s) for s in strings) if i >= 0]
    return text[:min(found)] if found else text


_LOOPS: dict[tuple[str, ...], tuple] = {}


def _generate_loop(setup: Setup, prompts, strings):
    """Each prompt alone through model.generate(stop_strings=..., tokenizer=...): its candidates'
    continuations up to their first end token, decoded without special tokens and cut before
    their first stop string; their token counts (greedy: one row, nothing after its end) and
    sequence scores. Kept for the next test that asks the same."""
    key = (setup.cfg.model_name, repr(setup.gc.to_dict()), repr(prompts), repr(strings))
    if key not in _LOOPS:
        _LOOPS[key] = _run_loop(setup, prompts, strings)
    return _LOOPS[key]


def _run_loop(setup: Setup, prompts, strings):
    model, gc = _model(Path(setup.cfg.model_name)), copy.deepcopy(setup.gc)
    gc.stop_strings = strings
    gc.return_dict_in_generate, gc.output_scores = True, True
    ends = set(gc.eos_token_id)
    listed = [] if strings is None else [strings] if isinstance(strings, str) else strings
    texts, counts, scores = [], [], []
    for ids in prompts:
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 generation_config=gc, tokenizer=setup.tokenizer)
        rows = [row[len(ids):] for row in out.sequences.tolist()]
        rows = [row[:next((i + 1 for i, t in enumerate(row) if t in ends), len(row))] for row in rows]
        texts.append([before_stop(setup.tokenizer.decode(r, skip_special_tokens=True,
                                                         clean_up_tokenization_spaces=False), listed).strip()
                      for r in rows])
        counts.append(sum(len(r) for r in rows))
        scores.append(out.sequences_scores.tolist() if len(rows) > 1 else None)
    return texts, counts, scores


@pytest.mark.parametrize("mode", ["greedy", "beams"])
def test_candidates_are_generates_with_its_own_stop_string_criterion(bigram, mode):
    options = GREEDY if mode == "greedy" else BEAMS
    free = Setup(bigram, **options)
    prompts = free.ids(PROMPTS)
    assert len({len(p) for p in prompts}) > 3  # padded, differently per row
    unstopped = _generate_loop(free, prompts, None)
    for strings, changes in CASES:
        s = Setup(bigram, stop_strings=strings, **options)
        out = _engine(s).generate(prompts, 0)
        texts, counts, scores = _generate_loop(s, prompts, strings)
        assert out.preds == texts, strings
        if mode == "greedy":
            assert out.n_tokens == counts, strings
            assert out.scores is None
        else:
            assert [x for c in out.scores for x in c] == pytest.approx([x for c in scores for x in c], rel=1e-4,
                                                                       abs=1e-5), strings
        assert ((texts, counts, scores) != unstopped) == changes, strings


def test_a_text_that_shows_u_fffd_runs_on_to_the_bytes_of_u_fffd(bigram):
    """generate()'s criterion matches bytes: continuation bytes without a lead byte decode as
    U+FFFD but do not stop; the prediction is still cut before the first U+FFFD it shows."""
    s = Setup(bigram, stop_strings="\ufffd", **GREEDY)
    prompts = s.ids(["café"])
    out = _engine(s).generate(prompts, 0)
    free = _engine(Setup(bigram, **GREEDY)).generate(prompts, 0)
    assert out.n_tokens == free.n_tokens == [10]  # no EF BF BD in its path: it ran to the limit
    shown = free.preds[0][0]
    assert "\ufffd" in shown and out.preds == [[shown[:shown.index("\ufffd")].strip()]]


@pytest.mark.parametrize("block", [8192, 2])
def test_ends_are_the_first_token_the_criterion_stops_on(bigram, block, monkeypatch):
    """`Stops.ends` on hand-made sequences: a stop string completed across tokens, one that begins
    before the generated tokens, and a generated text that merely shows it; alone and together,
    the criterion asked in one block or in blocks of 2."""
    from seq2seq_eval.engines import stops as module

    monkeypatch.setattr(module, "WINDOWS_AT_ONCE", block)
    s = Setup(bigram)
    tok = s.tokenizer
    stops = Stops(tok, ["日", "x日"])
    ids = tok.convert_tokens_to_ids
    x, cjk, emoji = ids(["x"]), ids(byte_tokens("日")), ids(byte_tokens("😀"))
    assert stops.ends([x + cjk + emoji], [1]) == [3]  # "x日" from the prompt's 'x' on, completed by the third byte
    assert stops.ends([x + cjk + emoji], [0]) == [4]
    assert stops.ends([emoji + cjk[:2]], [0]) == [None]  # two of its three bytes: the text shows U+FFFD, not 日
    assert stops.ends([cjk[:1] + emoji + cjk[1:]], [0]) == [None]  # its bytes, not in a row
    assert stops.ends([emoji + emoji + x + cjk + cjk, x + cjk, emoji + cjk[:2], x], [8, 1, 0, 1]) == [4, 3, None, None]
    assert stops.cut("a日b日") == "a" and stops.cut("ab") == "ab"


def test_the_padding_is_kept_out_of_the_match_and_an_unknown_layout_refused(bigram):
    """The criterion handed to generate(), asked directly, on two prompts that read the same once
    padded: one end token padded by one, and two end tokens. Continued by 'z', only the second
    ends with the stop string, in every row of its own (one, or several as in beam search); rows
    generate() would not hand over (not each prompt's together) are an error, not a guess."""
    s = Setup(bigram)
    tok = s.tokenizer
    stops = Stops(tok, ["<|im_end|><|im_end|>z"])
    end, z = tok.convert_tokens_to_ids(["<|im_end|>", "z"])
    padded = torch.tensor([[end, end], [end, end]])
    criteria = stops.generate_criteria(padded, [1, 0])
    assert criteria(torch.tensor([[end, end, z]] * 2), None).tolist() == [False, True]
    assert criteria(torch.tensor([[end, end, z]] * 6), None).tolist() == [False] * 3 + [True] * 3
    assert criteria(torch.tensor([[end, end, z, z]] * 2), None).tolist() == [False, False]
    for rows in ([[end, end, z]] * 3, [[end, z, end, end, z]] * 2):
        with pytest.raises(ModelError, match="^generate\\(\\) asked the stop-string criterion about [23] rows for 2 "
                                             "prompts, not each prompt's rows together"):
            criteria(torch.tensor(rows), None)


def test_a_sequence_without_padding_is_asked_as_generate_asks_it(bigram):
    """An encoder-decoder's criterion (no arguments: what it reads is the decoder's tokens, never
    the encoder's input ids) and a decoder-only batch no row of which is padded: the criterion's
    own answer, on sequences shorter than its reach and than the batch's input (issue 61: a
    multi-token stop string met in the first decoder steps crashed comparing them)."""
    s = Setup(bigram)
    tok = s.tokenizer
    stops = Stops(tok, ["x日", "<|im_end|>z"])
    x, z, end = tok.convert_tokens_to_ids(["x", "z", "<|im_end|>"])
    cjk = tok.convert_tokens_to_ids(byte_tokens("日"))
    rows = torch.tensor([[end, x, *cjk], [x] * 5, [x, end, z, z, z]])
    assert stops.reach > 3  # the first three tokens are within its reach
    for criteria in (stops.generate_criteria(), stops.generate_criteria(torch.ones(3, 20, dtype=torch.long), [0] * 3)):
        assert criteria(rows, None).tolist() == [True, False, False]
        assert criteria(rows[:, :3], None).tolist() == [False, False, True]


def test_ctranslate2_greedy_stops_where_generate_stops(bigram):
    """The Generator has no stopping criterion of its own: its continuation is cut at the first
    token generate()'s criterion stops on (with one beam the tokens before it do not depend on
    what follows), then the text before its first stop string."""
    pytest.importorskip("ctranslate2")
    from seq2seq_eval import engines
    from seq2seq_eval.engines.ct2 import translate_options
    from seq2seq_eval.run.dist import DistEnv

    free = Setup(bigram, engine="ctranslate2", **GREEDY)
    engine = engines.load(dataclasses.replace(free.cfg, engine="ctranslate2"), tokenizer=free.tokenizer,
                          model_config=free.model_config, generation_config=free.gc, device=torch.device("cpu"),
                          env=DistEnv(), kind=CAUSAL)
    prompts = free.ids(PROMPTS)
    for strings, _ in CASES:
        s = Setup(bigram, engine="ctranslate2", stop_strings=strings, **GREEDY)
        engines.check(s.cfg, s.model_config, s.gc, s.tokenizer, "cpu", CAUSAL)
        engine.mapping = translate_options(s.gc, s.tokenizer)
        texts, counts, _ = _generate_loop(s, prompts, strings)
        out = engine.generate(prompts, 0)
        assert (out.preds, out.n_tokens) == (texts, counts), strings
    with pytest.raises(ConfigError, match=r"^--engine ctranslate2 cannot honour the generation setting stop_strings"):
        s = Setup(bigram, engine="ctranslate2", stop_strings="日", num_beams=3, early_stopping=True)
        engines.check(s.cfg, s.model_config, s.gc, s.tokenizer, "cpu", CAUSAL)
