"""Beam search with final examples leaving the batch (engines/shrink.py) gives generate()'s own
sequences and scores bit for bit, and really shrinks the batch; where its reasoning does not hold
it is not used."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from seq2seq_eval.config import EMBEDDED_MODEL, EvalConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture
def drops(monkeypatch):
    """Records each shrink: (rows before, rows kept)."""
    from seq2seq_eval.engines import shrink

    seen: list[tuple[int, int]] = []
    select = shrink._select_rows

    def recording(model_kwargs, cache_key, rows, n_rows):
        seen.append((n_rows, len(rows)))
        return select(model_kwargs, cache_key, rows, n_rows)

    monkeypatch.setattr(shrink, "_select_rows", recording)
    return seen


@pytest.fixture(scope="module")
def embedded():
    from seq2seq_eval.inputs.files import read_lines
    from seq2seq_eval.model import settings as model_settings

    cfg = EvalConfig(model_name=str(EMBEDDED_MODEL))
    tokenizer = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    model = model_settings.load_model(cfg, torch.device("cpu"))
    sources = {}
    for task, prefix in (("translation", "translate: "), ("summarization", "summarize: ")):
        lines = read_lines(Path(__file__).parents[1] / "data_samples" / task / "test.source")[:32]
        # Longest first, as the plan cuts batches: a batch of similar lengths, outputs of different ones.
        ids, _ = model_settings.encode_sources(tokenizer, lines, prefix, 128)
        sources[task] = sorted(ids, key=len, reverse=True)
    return model, tokenizer, model_config, base, sources


@pytest.mark.parametrize("task", ["translation", "summarization"])
@pytest.mark.parametrize("options", [
    {},
    {"num_return_sequences": 3},
    {"early_stopping": False, "length_penalty": 2.0},
    {"early_stopping": False, "length_penalty": 0.5, "num_beams": 5},
    {"no_repeat_ngram_size": 3, "min_length": 6, "repetition_penalty": 1.2},
])
def test_shrinking_gives_generates_results_on_the_embedded_model(embedded, task, options, drops):
    from seq2seq_eval.engines.hf import HFEngine
    from seq2seq_eval.model import settings as model_settings

    model, tokenizer, model_config, base, sources = embedded
    n = options.get("num_return_sequences", 1)  # the run's own option, not a generate option
    cfg = EvalConfig(model_name=str(EMBEDDED_MODEL), task=task, num_return_sequences=n,
                     generate_kwargs=tuple((k, v) for k, v in options.items() if k != "num_return_sequences"))
    gc = model_settings.generation_config_for(model_config, copy.deepcopy(base), tokenizer, cfg)
    engine = HFEngine(model, tokenizer, gc, torch.device("cpu"))
    assert engine.shrink
    batches = [sources[task][:20], sources[task][20:]]  # 80 and 48 rows at 4 beams (shrink.MIN_ROWS is 32)
    ours = [engine.generate(b, i) for i, b in enumerate(batches)]
    assert drops and all(kept < rows for rows, kept in drops)
    assert min(kept for _, kept in drops) >= 32  # shrink.MIN_ROWS
    engine.shrink = False
    theirs = [engine.generate(b, i) for i, b in enumerate(batches)]
    assert ours == theirs  # texts, scores (num_return_sequences > 1) and token counts


def _t5_that_stops():
    """A tiny random T5 whose EOS logit is raised, so that its hypotheses end at different steps."""
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=97, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                                pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    head = model.get_output_embeddings()
    bias = torch.zeros(head.weight.shape[0])
    bias[cfg.eos_token_id] = 3.0
    head.bias = torch.nn.Parameter(bias)
    return model


def _generate(model, gc, shrinking: bool):
    from seq2seq_eval.engines import shrink
    from seq2seq_eval.engines.beam_cache import beam_cache, cache_kwarg

    g = torch.Generator().manual_seed(1)
    n, width = 24, 14
    ids = torch.full((n, width), model.config.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row in range(n):
        length = 3 + (row * 5) % 11
        ids[row, : length - 1] = torch.randint(3, 90, (length - 1,), generator=g)
        ids[row, length - 1] = model.config.eos_token_id
        mask[row, :length] = 1
    extra = {cache_kwarg(model): beam_cache(model, gc)}
    if shrinking:
        extra["custom_generate"] = shrink.shrinking_beam_search
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, **extra)


@pytest.mark.parametrize("options", [
    {},
    {"num_return_sequences": 3},
    {"repetition_penalty": 1.3},
    {"length_penalty": 0.6, "no_repeat_ngram_size": 2, "early_stopping": True, "min_length": 8},
])
def test_shrinking_gives_generates_sequences_and_scores_bit_for_bit(options, drops):
    model = _t5_that_stops()
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.update(num_beams=4, max_length=20, return_dict_in_generate=True, output_scores=True, **options)
    ours, theirs = _generate(model, gc, True), _generate(model, gc, False)
    assert drops
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.sequences_scores, theirs.sequences_scores)


def test_a_wrong_row_selection_would_be_caught(monkeypatch):
    """The comparison is sensitive: keeping the wrong encoder rows after a shrink changes outputs."""
    from seq2seq_eval.engines import shrink

    model = _t5_that_stops()
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.update(num_beams=4, max_length=20, return_dict_in_generate=True, output_scores=True)
    theirs = _generate(model, gc, False)
    select = shrink._select_rows
    monkeypatch.setattr(shrink, "_select_rows",
                        lambda kw, key, rows, n: select(kw, key, torch.flip(rows, [0]), n))
    assert not torch.equal(_generate(model, gc, True).sequences, theirs.sequences)


@pytest.mark.parametrize("setting, value", [
    ("do_sample", True), ("num_beams", 1), ("early_stopping", "never"), ("output_attentions", True),
    ("encoder_repetition_penalty", 1.5), ("encoder_no_repeat_ngram_size", 2),
])
def test_not_used_where_its_reasoning_does_not_hold(setting, value):
    from seq2seq_eval.engines import shrink

    model = _t5_that_stops()
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.num_beams = 4
    assert shrink.usable(model, gc, torch.device("cpu"))
    assert not shrink.usable(model, gc, torch.device("cuda"))
    assert not shrink.usable(model.to(torch.bfloat16), gc, torch.device("cpu"))
    model.to(torch.float32)
    setattr(gc, setting, value)
    assert not shrink.usable(model, gc, torch.device("cpu"))


def test_a_processor_outside_the_row_wise_list_keeps_generates_loop(drops):
    """A logits processor the search does not know (a user's own) runs in generate()'s own loop;
    the same call without it does shrink, so the absence of drops is the fallback's doing."""
    from seq2seq_eval.engines import shrink
    from seq2seq_eval.engines.beam_cache import beam_cache, cache_kwarg

    class UsersOwn(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores

    model = _t5_that_stops()
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.update(num_beams=4, max_length=20, return_dict_in_generate=True, output_scores=True)
    ids = torch.randint(3, 90, (24, 9), generator=torch.Generator().manual_seed(2))

    def generate(**extra):
        with torch.inference_mode():
            return model.generate(input_ids=ids, generation_config=gc, **extra)

    shrinking = {"custom_generate": shrink.shrinking_beam_search}
    generate(**shrinking, **{cache_kwarg(model): beam_cache(model, gc)})
    assert drops
    drops.clear()
    out = generate(logits_processor=[UsersOwn()], **shrinking, **{cache_kwarg(model): beam_cache(model, gc)})
    assert not drops
    assert torch.equal(out.sequences, generate(logits_processor=[UsersOwn()]).sequences)


def test_a_machine_whose_kernels_depend_on_the_row_count_keeps_generates_loop(monkeypatch):
    """The row-count argument is checked on the model's own layers before the shortcut is used."""
    from seq2seq_eval.engines import shrink

    model = _t5_that_stops()
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.num_beams = 4
    assert shrink.rows_independent(model) and shrink.usable(model, gc, torch.device("cpu"))
    linear = torch.nn.functional.linear

    def by_row_count(x, weight, bias=None):
        out = linear(x, weight, bias)
        return out + out.shape[0] * 1e-6 if x.dim() == 2 else out  # a kernel whose bits follow the row count

    monkeypatch.setattr(torch.nn.functional, "linear", by_row_count)
    assert not shrink.rows_independent(model)
    assert not shrink.usable(model, gc, torch.device("cpu"))


def test_a_transformers_whose_beam_steps_want_other_arguments_keeps_generates_loop(drops):
    """generate()'s beam-search steps are private: a release whose step requires an argument this
    search does not pass is not driven by it (5.17's extra vocab_size is one it knows)."""
    from seq2seq_eval.engines import shrink

    model = _t5_that_stops()
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.num_beams = 4
    gc.return_dict_in_generate = gc.output_scores = True
    assert shrink.usable(model, gc, torch.device("cpu"))
    base = type(model)

    def wants_vocab(self, accumulated_log_probs, running_sequences, running_beam_indices, cur_len,
                    decoder_prompt_len, do_sample, beams_to_keep, num_beams, vocab_size, batch_size):
        assert vocab_size == accumulated_log_probs.shape[-1] // num_beams
        return base._get_top_k_continuations(self, accumulated_log_probs, running_sequences, running_beam_indices,
                                             cur_len, decoder_prompt_len, do_sample, beams_to_keep, num_beams,
                                             vocab_size=vocab_size, batch_size=batch_size)  # later releases: **kwargs

    def wants_more(self, accumulated_log_probs, running_sequences, running_beam_indices, cur_len,
                   decoder_prompt_len, do_sample, beams_to_keep, num_beams, batch_size, something_new):
        raise AssertionError("not to be called")

    as_517 = type("As517", (base,), {"_get_top_k_continuations": wants_vocab})
    model.__class__ = as_517
    assert shrink.usable(model, gc, torch.device("cpu"))
    with torch.inference_mode():
        ours = _generate(model, gc, shrinking=True)
    assert drops  # this search ran (generate()'s own loop never drops rows)
    model.__class__ = base
    theirs = _generate(model, gc, shrinking=False)
    assert torch.equal(ours.sequences, theirs.sequences) and torch.equal(ours.sequences_scores, theirs.sequences_scores)

    model.__class__ = type("Newer", (base,), {"_get_top_k_continuations": wants_more})
    assert not shrink.usable(model, gc, torch.device("cpu"))


def test_shrinking_stops_hypotheses_at_stop_strings_where_generate_does(embedded, drops):
    """generate(stop_strings=..., tokenizer=...) on the same batch: the same candidates, cut before
    the stop string, and scores, while finished examples leave the batch."""
    from seq2seq_eval.engines.hf import HFEngine
    from seq2seq_eval.model import settings as model_settings

    model, tokenizer, model_config, base, sources = embedded
    cfg = EvalConfig(model_name=str(EMBEDDED_MODEL), task="translation", num_return_sequences=3,
                     generate_kwargs=(("stop_strings", ","),))
    gc = model_settings.generation_config_for(model_config, copy.deepcopy(base), tokenizer, cfg)
    engine = HFEngine(model, tokenizer, gc, torch.device("cpu"))
    assert engine.shrink
    batch = sources["translation"][:12]  # 48 rows at 4 beams
    ours = engine.generate(batch, 0)
    assert drops
    plain = copy.deepcopy(gc)
    plain.return_dict_in_generate, plain.output_scores = True, True
    ids = torch.full((len(batch), max(map(len, batch))), tokenizer.pad_token_id, dtype=torch.long)
    for row, source in enumerate(batch):
        ids[row, :len(source)] = torch.tensor(source)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(),
                             generation_config=plain, tokenizer=tokenizer)
    texts = tokenizer.batch_decode(out.sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert sum("," in t for t in texts) >= 3  # some hypotheses stopped at it
    assert ours.preds == [[t.split(",")[0].strip() for t in texts[i * 3:(i + 1) * 3]] for i in range(len(batch))]
    assert [x for c in ours.scores for x in c] == pytest.approx(out.sequences_scores.tolist(), rel=1e-5)
