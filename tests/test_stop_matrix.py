"""Stop strings on every model kind and engine: a generated matrix against one-prompt generate().

The matrix is every combination of
- a model kind: the embedded encoder-decoder (data_samples/model, SentencePiece-like), the
  embedded decoder-only demo (data_samples/causal_model, byte-level BPE), and the tiny Llama-style
  (SentencePiece-like BPE, tests/tiny_causal.py) and Qwen2-style (byte-level, two end tokens, the
  padding one of them) decoder-only models;
- an engine: hf, ctranslate2;
- a decoding: greedy, beam search (4 beams, the translation task's default, and 3 beams returning
  3 candidates), sampling with a seed (one candidate, and 3);
- a stop-string shape, each built from the model's own greedy output (`SHAPES`): one token's text,
  several tokens', the first word and the first two (completing at the first steps), a list of a
  string and its own prefix, a leading space, a trailing space, non-ASCII text, one that begins in
  the prompt (an encoder-decoder's: in the decoder start token), a single space, and one that no
  output shows;

and each cell must give what `model.generate(stop_strings=..., tokenizer=tok)` gives for each prompt
alone, each candidate ending where transformers' StopStringCriteria (asked of every prefix of the
prompt, or decoder start token, and the candidate) first stops it or at its first end token, its
text decoded without special tokens, cut before the first stop string it shows and stripped: the
texts, the token counts, and with several beam candidates their scores. Greedy and beam search run
the prompts as one batch (a decoder-only model's padded on the left); sampling runs one prompt per
batch, seeded as the engine seeds it. Where an engine cannot be generate() it must refuse before
any work, in one line: CTranslate2 with beam search. CTranslate2's samples are its own generator's
(docs/engines.md), so its sampled cells compare with its own unstopped samples at the same seed cut
where the criterion first stops them.

The suite runs 50 of the 440 cells (`sample_cells`: each model with every engine and decoding, each
shape on four of them, and issue 61's cells); `STOP_MATRIX=full` runs all of them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import os
from pathlib import Path

import pytest
from conftest import make_corpus
from tiny_causal import build_tiny_llama, build_tiny_qwen2

from seq2seq_eval import engines
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL, EvalConfig
from seq2seq_eval.engines.hf import HFEngine
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.inputs.prompts import build_prompts, encode_prompts
from seq2seq_eval.model import settings
from seq2seq_eval.model.kind import CAUSAL, SEQ2SEQ
from seq2seq_eval.run.dist import DistEnv

torch = pytest.importorskip("torch")
NO_CT2 = 'the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")'

MODELS = ("marian", "demo", "llama", "qwen2")
ENGINES = ("hf", "ctranslate2")
DECODINGS = {
    "greedy": {"num_beams": 1},
    "beams4": {"num_beams": 4, "early_stopping": True},
    "beams3x3": {"num_beams": 3, "early_stopping": True, "num_return_sequences": 3},
    "sample": {"do_sample": True, "num_beams": 1},
    "sample3": {"do_sample": True, "num_beams": 1, "num_return_sequences": 3},
}
NEW_TOKENS = 12
SOURCES = ["a big red house on the mat", "dog", "Zürich 42 7 1999 , . ! ? café"]
NEVER = "\u2603never shown"


# ---------------------------------------------------------------- the shapes, from the model's output


@dataclasses.dataclass
class Free:
    """A model's greedy continuations (no stop strings) of its prompts, as token ids after what
    the criterion reads before them (`heads`: the prompt, or the decoder start token)."""

    tokenizer: object
    heads: list[list[int]]
    rows: list[list[int]]

    def varied(self, rank: int) -> int:
        """The prompt whose continuation has the `rank`-th most distinct tokens (tiny random models
        repeat one token; shapes are built where there is most to build from)."""
        return sorted(range(len(self.rows)), key=lambda i: (-len(set(self.rows[i])), i))[rank]

    def text(self, i: int, n: int, head: bool = False) -> str:
        """The text of prompt i's first n generated tokens (with its prompt's, with `head`)."""
        ids = (self.heads[i] if head else []) + self.rows[i][:n]
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def added(self, i: int, a: int, b: int) -> str:
        """The text tokens a..b-1 of prompt i's continuation add to it (in context: a token's
        leading space is its own, as the criterion reads it)."""
        head, full = self.text(i, a, head=True), self.text(i, b, head=True)
        assert full.startswith(head), (head, full)
        return full[len(head):]

    def first_showing(self, i: int) -> int:
        """How many tokens prompt i's continuation needs before its text shows a character."""
        return next(n for n in range(1, len(self.rows[i]) + 1) if self.text(i, n).strip())

    def as_read(self, ids: list[int]) -> str:
        """`ids` as the stop-string criterion reads them: each token's string in transformers'
        own clean vocabulary (special tokens as their text)."""
        from transformers.generation.stopping_criteria import StopStringCriteria

        strings, indices = StopStringCriteria.clean_tokenizer_vocab(self.tokenizer)
        read = dict(zip(indices, strings))
        return "".join(read[t] for t in ids)


def _one_token(f: Free):
    return f.added(f.varied(0), 2, 3)


def _several(f: Free):
    return f.added(f.varied(0), 2, 5)


def _longest_start(f: Free) -> int:
    """The prompt whose continuation's first word is longest: the stop strings at the first steps
    reach further back than the decoder's tokens go (issue 61 crashed on such a string)."""
    return max(range(len(f.rows)), key=lambda i: (len(f.text(i, f.first_showing(i))), -i))


def _first_token(f: Free):
    i = _longest_start(f)
    return f.text(i, f.first_showing(i)).strip()


def _first_tokens(f: Free):  # completes within the first steps, and spans several tokens
    i = _longest_start(f)
    return f.text(i, f.first_showing(i) + 1)


def _prefix_of_another(f: Free):
    i = f.varied(0)
    longer = next(t for t in (f.added(i, 1, n) for n in range(4, NEW_TOKENS + 1)) if len(t.strip()) > 2)
    return [longer, longer[:-1]]


def _words(f: Free) -> list[str]:
    """The words of the most varied continuation that has two at least."""
    texts = (f.text(f.varied(rank), NEW_TOKENS) for rank in range(len(f.rows)))
    return next(t.split() for t in texts if len(t.split()) > 1)


def _leading_space(f: Free):
    return " " + _words(f)[1]


def _trailing_space(f: Free):
    return _words(f)[0] + " "


def _non_ascii(f: Free):
    for i in sorted(range(len(f.rows)), key=f.varied):
        text = f.text(i, NEW_TOKENS)
        at = next((k for k, c in enumerate(text) if ord(c) > 127), None)
        if at is not None:
            return text[max(0, at - 1):at + 1]
    raise AssertionError("no output shows a non-ASCII character")


def _in_prompt(f: Free):  # begins in the prompt's last token (an encoder-decoder's: the decoder start token)
    i = _longest_start(f)
    return f.as_read(f.heads[i][-1:] + f.rows[i][:f.first_showing(i)])


def _space(f: Free):  # ends where a token ends with a space (SentencePiece's lone word mark)
    return " "


def _never(f: Free):
    return NEVER


SHAPES = {"one token": _one_token, "several tokens": _several, "first token": _first_token,
          "first tokens": _first_tokens, "prefix of another": _prefix_of_another, "leading space": _leading_space,
          "trailing space": _trailing_space, "non-ASCII": _non_ascii, "in the prompt": _in_prompt, "a space": _space,
          "never": _never}


def _listed(strings) -> list[str]:
    return [strings] if isinstance(strings, str) else list(strings)


def before_stop(text: str, strings: list[str]) -> str:
    found = [i for i in (text.find(s) for s in strings) if i >= 0]
    return text[:min(found)] if found else text


# ---------------------------------------------------------------- the models


@dataclasses.dataclass
class Bench:
    """One model, loaded once: its tokenizer, configs, prompts' ids (of three lengths), each
    engine, and its greedy continuations without stop strings (`free`), which the shapes read."""

    name: str
    path: Path
    kind: str
    tokenizer: object = None
    model_config: object = None
    base: object = None
    model: object = None
    ids: list = dataclasses.field(default_factory=list)
    ct2: object = None
    free: Free | None = None

    def __post_init__(self) -> None:
        cfg = EvalConfig(model_name=str(self.path))
        self.tokenizer = settings.load_tokenizer(cfg)
        self.model_config, self.base = settings.load_model_config(cfg)
        self.model = settings.load_model(cfg, torch.device("cpu"), self.kind)
        if self.kind == SEQ2SEQ:
            sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:3]
            prefix = settings.source_prefix(self.model_config, cfg)
            self.ids, _ = settings.encode_sources(self.tokenizer, sources, prefix, 1024)
        else:
            gc = settings.generation_config_for(self.model_config, self.base, self.tokenizer, cfg)
            prompts = build_prompts(cfg, self.tokenizer, self.model_config, gc,
                                    settings.source_prefix(self.model_config, cfg))
            self.ids, _, problem = encode_prompts(prompts, self.tokenizer, SOURCES)
            assert problem is None
        assert len({len(i) for i in self.ids}) == len(self.ids)  # a batch padded differently per row

    def settings(self, engine: str, decoding: str, strings, **extra) -> tuple[EvalConfig, object]:
        """The run's settings and its effective generation config; ConfigError where the run is
        refused before any work (the checks a run and its dry run make)."""
        options = dict(DECODINGS[decoding], max_new_tokens=NEW_TOKENS, **extra)
        n = options.pop("num_return_sequences", 1)
        if strings is not None:
            options["stop_strings"] = strings
        cfg = EvalConfig(model_name=str(self.path), engine=engine, num_return_sequences=n,
                         generate_kwargs=tuple(options.items()))
        gc = settings.generation_config_for(self.model_config, self.base, self.tokenizer, cfg)
        engines.check(cfg, self.model_config, gc, self.tokenizer, "cpu", self.kind)
        return cfg, gc

    def head(self, gc, ids) -> list[int]:
        """What the criterion reads before the generated tokens in generate()."""
        return list(ids) if self.kind == CAUSAL else [int(gc.decoder_start_token_id)]

    def engine(self, cfg: EvalConfig, gc):
        if cfg.engine == "hf":
            return HFEngine(self.model, self.tokenizer, gc, torch.device("cpu"), seed=cfg.seed,
                            causal=self.kind == CAUSAL)
        from seq2seq_eval.engines.ct2 import translate_options

        if self.ct2 is None:
            self.ct2 = engines.load(cfg, tokenizer=self.tokenizer, model_config=self.model_config, generation_config=gc,
                                    device=torch.device("cpu"), env=DistEnv(), kind=self.kind)
        self.ct2.mapping = translate_options(gc, self.tokenizer)
        return self.ct2


@pytest.fixture(scope="module")
def benches(tmp_path_factory, torch_one_thread):
    src, tgt = make_corpus(200, seed=1)
    root = tmp_path_factory.mktemp("stop_matrix")
    paths = {"marian": (EMBEDDED_MODEL, SEQ2SEQ), "demo": (EMBEDDED_MODEL.parent / "causal_model", CAUSAL)}
    made: dict[str, Bench] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQ2SEQ_EVAL_CACHE", str(root / "ct2_cache"))

        def get(name: str) -> Bench:
            if name not in made:
                if name == "llama":
                    paths[name] = (build_tiny_llama(root / name, src + tgt), CAUSAL)
                elif name == "qwen2":
                    paths[name] = (build_tiny_qwen2(root / name, src + tgt), CAUSAL)
                bench = Bench(name, *paths[name])
                cfg, gc = bench.settings("hf", "greedy", None)
                bench.free = Free(bench.tokenizer, [bench.head(gc, ids) for ids in bench.ids],
                                  [row for rows, _, _ in (_generate(bench, gc, ids, 0) for ids in bench.ids)
                                   for row in rows])
                made[name] = bench
            return made[name]

        yield get


# ---------------------------------------------------------------- the references


@functools.cache
def _criterion(tokenizer, strings: tuple[str, ...]):
    from transformers.generation.stopping_criteria import StopStringCriteria

    return StopStringCriteria(tokenizer=tokenizer, stop_strings=list(strings))


def stop_at(tokenizer, strings, head: list[int], row: list[int], ends: set[int]) -> list[int]:
    """`row` up to and including its first end token or the first token on which transformers'
    StopStringCriteria, asked of `head` and the row so far (as generate() asks it for a prompt
    alone), stops it."""
    criterion = _criterion(tokenizer, tuple(_listed(strings))) if strings else None
    for n, token in enumerate(row, 1):
        if token in ends:
            return row[:n]
        if criterion is not None and bool(criterion(torch.tensor([head + row[:n]]), None)[0]):
            return row[:n]
    return row


def _ends(gc) -> set[int]:
    eos = gc.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def _generate(bench: Bench, gc, ids, seed: int):
    """One prompt alone through model.generate(stop_strings=..., tokenizer=...): its candidates
    (token ids after the prompt or decoder start), ended as `stop_at` ends them, and their scores."""
    gc = copy.deepcopy(gc)
    gc.return_dict_in_generate, gc.output_scores = True, True
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = bench.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones_like(torch.tensor([ids])),
                                   generation_config=gc, tokenizer=bench.tokenizer)
    start = len(ids) if bench.kind == CAUSAL else 1
    head = bench.head(gc, ids)
    rows = [stop_at(bench.tokenizer, gc.stop_strings, head, row[start:], _ends(gc)) for row in out.sequences.tolist()]
    scores = out.sequences_scores.tolist() if len(rows) > 1 and not gc.do_sample else None
    return rows, scores, head


def _as_predicted(bench: Bench, rows, strings) -> list[str]:
    return [before_stop(bench.tokenizer.decode(r, skip_special_tokens=True, clean_up_tokenization_spaces=False),
                        _listed(strings or [])).strip() for r in rows]


# ---------------------------------------------------------------- the matrix


CELLS = list(itertools.product(MODELS, ENGINES, DECODINGS, SHAPES))


def sample_cells() -> list[tuple[str, str, str, str]]:
    """Each model with every (engine, decoding) pair, each shape on another pair for each model
    (every value of every axis, every (model, shape) pair), and the cells of issue 61: the
    encoder-decoder on the HF engine, greedy and with the task's 4 beams, with the stop strings
    that complete within the first decoder steps."""
    pairs = list(itertools.product(ENGINES, DECODINGS))
    rotated = [(model, *pairs[(s + 3 * m) % len(pairs)], shape)
               for m, model in enumerate(MODELS) for s, shape in enumerate(SHAPES)]
    issue = [("marian", "hf", decoding, shape) for decoding in ("greedy", "beams4")
             for shape in ("first token", "first tokens", "in the prompt")]
    return rotated + [cell for cell in issue if cell not in rotated]


SELECTED = CELLS if os.environ.get("STOP_MATRIX") == "full" else sample_cells()
_STOPPED: dict[str, bool] = {}


@pytest.mark.parametrize("model, engine, decoding, shape", SELECTED)
def test_stop_strings_are_generates_or_refused_in_one_line(benches, model, engine, decoding, shape):
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2", reason=NO_CT2)
    bench = benches(model)
    strings = SHAPES[shape](bench.free)
    assert all(_listed(strings)), strings
    try:
        cfg, gc = bench.settings(engine, decoding, strings)
    except ConfigError as e:
        # Refused before any work: only where generate()'s stopping cannot be had.
        assert engine == "ctranslate2" and int(DECODINGS[decoding]["num_beams"]) > 1, str(e)
        assert "\n" not in str(e) and str(e).startswith("--engine ctranslate2 cannot honour the generation setting ")
        assert f"stop_strings={strings!r} with num_beams=" in str(e)  # named, beside any other setting refused
        return
    stopped = check_cell(bench, cfg, gc, strings)
    _STOPPED[shape] = _STOPPED.get(shape, False) or stopped


def check_cell(bench: Bench, cfg: EvalConfig, gc, strings) -> bool:
    """The engine's texts, token counts and scores for the bench's prompts are one-prompt
    generate()'s; whether generate() stopped any candidate short of its end token or the limit."""
    engine = cfg.engine
    runner = bench.engine(cfg, gc)
    sampling = bool(gc.do_sample)
    k = int(gc.num_return_sequences or 1)
    # Greedy and beam search: the prompts in one batch. Sampling: one prompt a batch, batch i seeded
    # cfg.seed + i by the engine, as generate() is seeded here.
    calls = [(list(range(len(bench.ids))), 0)] if not sampling else [([i], i) for i in range(len(bench.ids))]
    preds, counts, scores, drawn = [], [], [], []
    for rows, batch_index in calls:
        out = _generate_keeping_draws(runner, [bench.ids[i] for i in rows], batch_index, drawn)
        preds += out.preds
        counts += out.n_tokens
        scores += out.scores or [None] * len(rows)
    wanted = []
    for i, ids in enumerate(bench.ids):
        if engine == "ctranslate2" and sampling:
            # CTranslate2's own draws (it is given no stop strings), as generate() would end them:
            # the forced end token at the length limit, then where the criterion first stops them.
            forced = gc.forced_eos_token_id
            draws = [d[:-1] + [forced] if forced is not None and len(d) >= NEW_TOKENS else d for d in drawn[i]]
            rows = [stop_at(bench.tokenizer, strings, bench.head(gc, ids), d, _ends(gc)) for d in draws]
            want_scores = None
        else:
            rows, want_scores, _ = _generate(bench, gc, ids, cfg.seed + (i if sampling else 0))
        assert len(rows) == k
        wanted.append((_as_predicted(bench, rows, strings), sum(len(r) for r in rows), want_scores, rows))
    assert preds == [w[0] for w in wanted]
    assert counts == [w[1] for w in wanted]
    if k > 1 and not sampling:
        assert [x for c in scores for x in c] == pytest.approx([x for w in wanted for x in w[2]], rel=1e-4, abs=1e-5)
    else:
        assert scores == [None] * len(bench.ids)
    return any(not (r and (r[-1] in _ends(gc) or len(r) >= NEW_TOKENS)) for w in wanted for r in w[3])


def _generate_keeping_draws(runner, batch, batch_index, drawn: list):
    """runner.generate(batch, batch_index); a CTranslate2 engine's hypotheses as CTranslate2 gave
    them (token ids, before the run ends them) appended to `drawn`, one list per input."""
    if runner.name != "ctranslate2":
        return runner.generate(batch, batch_index)
    outputs = type(runner).outputs

    def keep(self, found, batch_ids):
        drawn.extend([list(ids) for ids, _ in hyps] for hyps in found)
        return outputs(self, found, batch_ids)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(runner), "outputs", keep)
        return runner.generate(batch, batch_index)


def test_every_shape_but_never_stopped_some_candidate():
    """Run after the matrix (in file order): a shape that stopped nothing would test nothing."""
    if not _STOPPED:
        pytest.skip("no cell of the matrix ran in this session")
    assert {shape for shape, stopped in _STOPPED.items() if not stopped} <= {"never"}
    assert _STOPPED.get("never") is not True



@pytest.mark.parametrize("engine", ENGINES)
def test_a_forced_first_token_stops_where_generate_stops(benches, engine):
    """An encoder-decoder's forced first token (forced_bos_token_id, as --tgt_lang sets it) is
    generated: a stop string it completes stops at the first step (the HF engine inside
    generate(); CTranslate2 returns it as the target prefix it was given), and so does one that
    begins in the decoder start token before it."""
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2", reason=NO_CT2)
    bench = benches("marian")
    f = bench.free
    i = f.varied(0)
    forced = f.rows[i][f.first_showing(i) + 1]  # a word, not the one greedy search starts with
    word = f.as_read([forced])
    assert word.startswith(" ") and word.strip() and forced not in [r[0] for r in f.rows]
    stopped = []
    for strings in (word.strip(), f.as_read(f.heads[i][-1:] + [forced]), [word + "x", word]):
        cfg, gc = bench.settings(engine, "greedy", strings, forced_bos_token_id=forced)
        stopped.append(check_cell(bench, cfg, gc, strings))
    assert stopped == [True] * 3


def test_beam_search_in_which_finished_examples_leave_the_batch_stops_where_generate_stops(benches, monkeypatch):
    """The HF engine's beam search on an encoder-decoder lets examples whose result is final leave
    the batch (engines/shrink.py) once it holds more than MIN_ROWS rows: 12 prompts at 4 beams,
    some hypotheses stopped by the stop strings, each prompt's candidates and scores generate()'s."""
    from seq2seq_eval.engines import shrink

    bench = copy.copy(benches("marian"))
    sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:12]
    bench.ids, _ = settings.encode_sources(bench.tokenizer, sources, "translate: ", 1024)
    strings = [SHAPES["several tokens"](bench.free), SHAPES["non-ASCII"](bench.free)]
    cfg, gc = bench.settings("hf", "beams3x3", strings, num_beams=4)
    assert len(bench.ids) * gc.num_beams > shrink.MIN_ROWS
    if not bench.engine(cfg, gc).shrink:
        pytest.skip("this CPU's kernels do not give each row the same bits at every row count: no shrinking")
    left = []
    select = shrink._select_rows

    def counting(model_kwargs, cache_key, rows, n_rows):
        left.append(n_rows - rows.shape[0])
        return select(model_kwargs, cache_key, rows, n_rows)

    monkeypatch.setattr(shrink, "_select_rows", counting)
    assert check_cell(bench, cfg, gc, strings)
    assert sum(left) > 0  # examples left the batch
