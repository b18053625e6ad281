"""CTranslate2's Generator (--engine ctranslate2 on a decoder-only model) against generate().

On the tiny Llama-style and Qwen2-style models (tests/tiny_causal.py) and the embedded demo, in
float32: the texts, token counts and candidates' scores of a plain one-prompt-at-a-time generate()
loop, for greedy and beam search with several candidates, on batches of prompts of several lengths
(one of a single token included); stop strings; the settings the Generator refuses, in one line;
already converted folders; and whole runs: pseudolabels with scores on both engines, 1 and 2 ranks.
The settings matrix (every field, both engines, the Generator included) is in
test_engine_settings.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_ok, make_corpus, run_ranks, single, write_legacy
from test_causal import DEMO, SOURCES, Setup, _flat, _model
from tiny_causal import build_tiny_llama, build_tiny_qwen2

from seq2seq_eval import engines
from seq2seq_eval.config import EMBEDDED_DATA
from seq2seq_eval.errors import ConfigError, ModelError
from seq2seq_eval.model.kind import CAUSAL
from seq2seq_eval.run.dist import DistEnv

pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')
torch = pytest.importorskip("torch")

from seq2seq_eval.engines import ct2, ct2_generator  # noqa: E402
from seq2seq_eval.engines.ct2 import translate_options  # noqa: E402
from seq2seq_eval.engines.hf import HFEngine  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    src, tgt = make_corpus(200, seed=1)
    root = tmp_path_factory.mktemp("ct2_causal")
    return {"llama": build_tiny_llama(root / "llama", src + tgt), "qwen2": build_tiny_qwen2(root / "qwen2", src + tgt)}


_CT2: dict[str, object] = {}


def _ct2(setup: Setup):
    """CTranslate2's engine for the setup's model (loaded, and converted into the session's cache,
    once per model), with the setup's settings."""
    key = setup.cfg.model_name
    if key not in _CT2:
        _CT2[key] = engines.load(dataclasses.replace(setup.cfg, engine="ctranslate2"), tokenizer=setup.tokenizer, model_config=setup.model_config,
                                 generation_config=setup.gc, device=torch.device("cpu"), env=DistEnv(), kind=CAUSAL)
    engine = _CT2[key]
    engine.mapping = translate_options(setup.gc, setup.tokenizer)
    return engine


def _checked(path: Path, **options) -> Setup:
    """The settings as a --engine ctranslate2 run takes them, checked by the Generator's rule."""
    s = Setup(path, engine="ctranslate2", **options)
    engines.check(s.cfg, s.model_config, s.gc, s.tokenizer, "cpu", CAUSAL)
    return s


def _reference(setup: Setup, prompts):
    """The plain loop: each prompt alone, model.generate(), its candidates' continuations up to
    and including their first end token (generate() pads the shorter among a prompt's beams),
    decoded without special tokens; their token counts and sequence scores."""
    model, gc = _model(Path(setup.cfg.model_name)), copy.deepcopy(setup.gc)
    gc.return_dict_in_generate, gc.output_scores = True, True
    ends = set(gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id])
    texts, counts, scores = [], [], []
    for ids in prompts:
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 generation_config=gc)
        rows = [row[len(ids):] for row in out.sequences.tolist()]
        rows = [row[:next((i + 1 for i, t in enumerate(row) if t in ends), len(row))] for row in rows]
        texts.append([setup.tokenizer.decode(r, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()
                      for r in rows])
        counts.append(sum(len(r) for r in rows))
        scores.append(out.sequences_scores.tolist() if int(gc.num_return_sequences or 1) > 1 else None)
    return texts, counts, scores


BEAMS = {"num_beams": 3, "early_stopping": True}


@pytest.mark.parametrize("name, options", [
    ("llama", {}),
    ("llama", {**BEAMS, "num_return_sequences": 3}),
    ("llama", {**BEAMS, "num_return_sequences": 2, "apply_chat_template": True, "length_penalty": 0.5}),
    ("qwen2", {"min_new_tokens": 4, "suppress_tokens": [300, 301]}),
    ("qwen2", {**BEAMS, "num_return_sequences": 3, "max_new_tokens": 20}),
    ("qwen2", {**BEAMS, "num_return_sequences": 2, "apply_chat_template": True, "min_new_tokens": 6,
               "renormalize_logits": True}),
])
def test_the_generator_gives_the_one_prompt_at_a_time_loop(tiny, name, options):
    s = _checked(tiny[name], **options)
    prompts = s.ids()
    assert len({len(p) for p in prompts}) > 3  # prompts of several lengths in one batch
    if name == "qwen2" and not options.get("apply_chat_template"):
        assert min(len(p) for p in prompts) == 1  # a prompt of one token beside longer ones
    out = _ct2(s).generate(prompts, 0)
    texts, counts, scores = _reference(s, prompts)
    assert out.preds == texts and out.n_tokens == counts
    if scores[0] is None:
        assert out.scores is None
    else:  # the continuation's log-probability over its length^length_penalty, as generate() gives it
        assert _flat(out.scores) == pytest.approx(_flat(scores), rel=1e-4, abs=1e-5)
        assert any(len(set(c)) > 1 for c in texts)  # candidates that differ


def test_an_end_token_among_the_first_steps_candidates_in_beam_search(tiny):
    """An end token ranked second at the first step finishes a hypothesis of one token in
    generate()'s beam search; with length_penalty 0 it is among the best. CTranslate2 keeps an end
    token out of all but the first beam after a forced prompt tail: one call on prompts of several
    lengths would lose that hypothesis, one call per length keeps it."""
    s = Setup(tiny["llama"])
    prompts = s.ids()
    with torch.inference_mode():
        logits = _model(tiny["llama"])(torch.tensor([prompts[1]])).logits[0, -1]
    second = int(logits.topk(2).indices[1])
    s = _checked(tiny["llama"], **{**BEAMS, "num_beams": 4}, num_return_sequences=4, length_penalty=0.0,
                 eos_token_id=second)
    texts, counts, scores = _reference(s, prompts)
    assert s.tokenizer.decode([second]).strip() in texts[1]  # the one-token hypothesis (not a special token)
    engine = _ct2(s)
    out = engine.generate(prompts, 0)
    assert out.preds == texts and out.n_tokens == counts
    assert _flat(out.scores) == pytest.approx(_flat(scores), rel=1e-4, abs=1e-5)
    with pytest.MonkeyPatch.context() as mp:  # the whole batch in one call: not generate()'s search
        mp.setattr(ct2_generator, "groups", lambda lengths, one_length: [list(range(len(lengths)))])
        assert engine.generate(prompts, 0).preds[1] != texts[1]
    # ... and the HF engine's batches, which pad after the end token, cut there too
    assert HFEngine(_model(tiny["llama"]), s.tokenizer, s.gc, torch.device("cpu"), causal=True).generate(
        prompts, 0).preds == texts


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("name, options", [
    ("llama", {}),
    ("llama", {**BEAMS, "num_return_sequences": 3}),
    ("qwen2", {"min_new_tokens": 4}),
])
def test_workers_on_cpu_give_the_loop(tiny, monkeypatch, threads, name, options):
    """A rank's threads as CTranslate2 workers of one thread each, each given a part of a call
    (ct2_generator.parts): the same continuations and scores as the one-prompt-at-a-time loop."""
    s = _checked(tiny[name], **options)
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    engine = engines.load(dataclasses.replace(s.cfg, engine="ctranslate2"), tokenizer=s.tokenizer,
                          model_config=s.model_config, generation_config=s.gc, device=torch.device("cpu"),
                          env=DistEnv(), kind=CAUSAL)
    assert engine.workers == engine.model.num_generators == threads
    prompts = s.ids()
    out = engine.generate(prompts, 0)
    texts, counts, scores = _reference(s, prompts)
    assert out.preds == texts and out.n_tokens == counts
    if scores[0] is not None:
        assert _flat(out.scores) == pytest.approx(_flat(scores), rel=1e-4, abs=1e-5)


def test_sampling_on_several_workers_is_one_workers(tiny, monkeypatch):
    """A sampled batch runs on a model of one worker with all the rank's threads (each worker
    draws from its own generator): the same samples again, and the samples of a one-thread rank."""
    s = _checked(tiny["llama"], do_sample=True, top_k=0, temperature=1.5, max_new_tokens=12)
    prompts = s.ids()
    samples = {}
    for threads in (1, 2):
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        engine = engines.load(dataclasses.replace(s.cfg, engine="ctranslate2"), tokenizer=s.tokenizer,
                              model_config=s.model_config, generation_config=s.gc, device=torch.device("cpu"),
                              env=DistEnv(), kind=CAUSAL)
        samples[threads] = [engine.generate(prompts, 3).preds for _ in range(2)]
        assert samples[threads][0] == samples[threads][1]
    assert samples[1][0] == samples[2][0]
    assert samples[1][0] != engine.generate(prompts, 4).preds  # another batch index, other samples


@pytest.mark.parametrize("lengths, workers, new", [
    ([5, 3, 9, 9, 1, 4, 7], 2, 4), ([5, 3, 9, 9, 1, 4, 7], 3, 0), ([6] * 5, 2, 10), ([2], 4, 8),
    ([40, 1, 1, 1, 1], 2, 0), ([3, 8], 5, 1), ([10, 9, 8, 7, 6, 5, 4, 3, 2, 1], 1, 3),
])
def test_parts_are_runs_in_length_order_of_about_equal_work(lengths, workers, new):
    assert ct2.parts([], lengths, workers, new) == []  # no input, no run (not one empty run)
    positions = list(range(len(lengths)))
    runs = ct2.parts(positions, lengths, workers, new)
    flat = [i for run in runs for i in run]
    assert flat == sorted(positions, key=lambda i: (-lengths[i], i))  # every prompt once, longest first
    assert len(runs) == min(workers, len(lengths)) and all(runs)
    work = [sum(lengths[i] + new for i in run) for run in runs]
    biggest = max(n + new for n in lengths)
    assert max(work) <= sum(work) / len(runs) + biggest  # no run more than one prompt over its share
    subset = positions[1::2]  # a call holds some of a batch's positions
    assert sorted(i for run in ct2.parts(subset, lengths, workers, new) for i in run) == subset


def test_calls_and_options():
    assert ct2_generator.groups([5, 3, 5, 1, 3], one_length=True) == [[0, 2], [1, 4], [3]]
    assert ct2_generator.groups([5, 3, 5, 1, 3], one_length=False) == [[0, 1, 2, 4], [3]]
    assert ct2_generator.groups([4, 2], one_length=False) == [[0, 1]]
    assert ct2_generator.groups([1, 1], one_length=False) == [[0, 1]]


def test_options_count_new_tokens_only(tiny):
    s = _checked(tiny["qwen2"], max_new_tokens=7, min_new_tokens=2)
    options = ct2_generator.generate_options(translate_options(s.gc, s.tokenizer))
    assert {k: options[k] for k in ("max_length", "min_length", "include_prompt_in_result")} == {
        "max_length": 7, "min_length": 2, "include_prompt_in_result": False}
    assert not {"max_input_length", "max_decoding_length", "min_decoding_length"} & set(options)
    assert options["end_token"] == ["<|im_end|>", "<|endoftext|>"]  # both of the model's end tokens


@pytest.mark.parametrize("tokens, problem", [
    (["a", "b", "c"], None),
    (["a", "b", "c", "<extra_id_0>"], None),  # rows beyond the tokenizer's (an embedding table padded)
    (["a", "b"], "the model has 2 tokens, the tokenizer 3"),
    (["a", "c", "b"], "token id 1 is 'c' in the model, 'b' in the tokenizer"),
    (["a", "b", "c", "a"], "the token 'a' is at ids 0 and 3 in the model"),
])
def test_the_converted_vocabulary_must_be_the_tokenizers(tokens, problem):
    class Tokenizer:
        def __len__(self):
            return 3

        def convert_ids_to_tokens(self, ids):
            return ["a", "b", "c"][ids[0]:ids[-1] + 1]

    assert ct2_generator.vocabulary_problem(tokens, Tokenizer()) == problem


# ---------------------------------------------------------------- stop strings and refusals


def test_stop_strings_with_one_beam_are_generates_and_refused_in_beam_search(tiny):
    """Greedy: the HF engine's texts and token counts with the same stop strings (the start of the
    most frequent word; one spanning a space, the end of one token and the start of the next; both
    as a list)."""
    free = Setup(tiny["llama"], max_new_tokens=24)
    prompts = free.ids()
    base = _ct2(free).generate(prompts, 0).preds
    words = [w for p in base for w in p[0].split()]
    within = max(sorted(set(words)), key=words.count)[:2]
    text = next(p[0] for p in base if " " in p[0])
    span = text[text.index(" ") - 1:text.index(" ") + 2]
    for stop in (within, span, [span, within]):
        s = _checked(tiny["llama"], max_new_tokens=24, stop_strings=stop)
        hf = HFEngine(_model(tiny["llama"]), s.tokenizer, s.gc, torch.device("cpu"), causal=True).generate(prompts, 0)
        ours = _ct2(s).generate(prompts, 0)
        assert ours == hf, stop
        assert ours.preds != base and sum(ours.n_tokens) < len(prompts) * 24
    with pytest.raises(ConfigError) as e:
        _checked(tiny["llama"], stop_strings=span, **BEAMS)
    assert str(e.value).startswith(f"--engine ctranslate2 cannot honour the generation setting stop_strings={span!r} "
                                   "with num_beams=3 (generate()'s beam search finishes") and "\n" not in str(e.value)


@pytest.mark.parametrize("options, message", [
    ({"repetition_penalty": 1.3}, "repetition_penalty=1.3 (set by --repetition_penalty): a decoder-only model's "
                                  "generate() applies it to the whole row, the prompt included"),
    ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size=2 (set by --no_repeat_ngram_size): a decoder-only model's"),
    ({"bad_words_ids": [[40, 41]]}, "bad_words_ids=[[40, 41]]: [40, 41] is a sequence of 2 tokens"),
    ({"suppress_tokens": [40], "num_beams": 2, "early_stopping": True},
     "suppress_tokens=[40] with num_beams=2 and renormalize_logits=False"),
    ({"early_stopping": False, "num_beams": 2}, "early_stopping=False with num_beams=2"),
])
def test_settings_the_generator_cannot_honour_are_one_line(tiny, options, message):
    with pytest.raises(ConfigError) as e:
        _checked(tiny["llama"], **options)
    assert str(e.value).startswith("--engine ctranslate2 cannot honour the generation setting " + message), str(e.value)
    assert "\n" not in str(e.value)
    _checked(tiny["llama"], bad_words_ids=[[40]])  # a single token is CTranslate2's suppress_sequences


def test_forced_bos_is_refused_for_a_decoder_only_model_on_both_engines(tiny):
    for engine in ("hf", "ctranslate2"):
        with pytest.raises(ConfigError, match=r"^--forced_bos_token_id: forced_bos_token_id=5: a decoder-only model's "
                                              r"generate\(\) forces it only where the padded prompt is one token long"):
            Setup(tiny["llama"], engine=engine, forced_bos_token_id=5)


# ---------------------------------------------------------------- the embedded demo


@pytest.mark.parametrize("options", [{"num_beams": 1}, {"num_return_sequences": 4}])
def test_the_embedded_demo_on_both_engines(options):
    """The demo's task settings (4 beams, early stopping) on 24 translation prompts through its chat
    template: greedy texts, and 4 candidates with their scores, the same on both engines."""
    sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:24]
    s = _checked(DEMO, apply_chat_template=True, **options)
    prompts = s.ids(sources)
    hf = HFEngine(_model(DEMO), s.tokenizer, s.gc, torch.device("cpu"), causal=True)
    for i in range(0, 24, 12):
        ours, theirs = _ct2(s).generate(prompts[i:i + 12], i), hf.generate(prompts[i:i + 12], i)
        assert ours.preds == theirs.preds and ours.n_tokens == theirs.n_tokens
        if theirs.scores is not None:
            assert _flat(ours.scores) == pytest.approx(_flat(theirs.scores), rel=1e-4, abs=1e-5)


# ---------------------------------------------------------------- converted folders


def test_an_already_converted_decoder_only_folder(tiny, tmp_path):
    """Accepted with --tokenizer_name naming the model it came from (its config, generation
    settings and chat template); refused in one line without it, or with a tokenizer whose
    vocabulary is not the converted model's."""
    from seq2seq_eval.engines.ct2_convert import converted_model

    folder = tmp_path / "ct2_qwen2"
    shutil.copytree(converted_model(str(tiny["qwen2"]), 120), folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny["qwen2"] / name, folder / name)
    data = write_legacy(tmp_path / "data", SOURCES, SOURCES)
    args = ["--engine", "ctranslate2", "--data_dir", str(data), "--apply_chat_template", "--num_beams", "2",
            "--early_stopping", "true"]
    named, direct = tmp_path / "named", tmp_path / "direct"
    assert_ok(single([*args, "--model_name", str(folder), "--tokenizer_name", str(tiny["qwen2"]),
                      "--save_dir", str(named)], cwd=tmp_path))
    assert_ok(single([*args, "--model_name", str(tiny["qwen2"]), "--save_dir", str(direct)], cwd=tmp_path))
    assert (named / "test_generations.txt").read_bytes() == (direct / "test_generations.txt").read_bytes()
    refused = single([*args, "--model_name", str(folder), "--save_dir", str(tmp_path / "none")], cwd=tmp_path)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"seq2seq_eval: error: {folder}: a decoder-only CTranslate2 model; its config and generation settings come "
        "from the model it was converted from; expected --tokenizer_name naming the decoder-only Hugging Face model "
        "it was converted from"]
    other = single([*args, "--model_name", str(folder), "--tokenizer_name", str(tiny["llama"]),
                    "--save_dir", str(tmp_path / "other")], cwd=tmp_path)
    assert other.returncode == 1 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "the converted model's vocabulary is not the tokenizer's (token id" in other.stderr


def test_a_converted_folder_of_another_kind_of_model_is_refused(tmp_path):
    from seq2seq_eval.model.converted import converted_spec, converted_model_config

    folder = tmp_path / "whisper"
    folder.mkdir()
    name = b"WhisperSpec\0"
    (folder / "model.bin").write_bytes((6).to_bytes(4, "little") + len(name).to_bytes(2, "little") + name)
    assert converted_spec(str(folder)) == "WhisperSpec"
    with pytest.raises(ModelError, match=r"whisper: a CTranslate2 WhisperSpec; expected a converted encoder-decoder "
                                         r"\(TransformerSpec\) or decoder-only \(TransformerDecoderSpec\) model$"):
        converted_model_config(str(folder), None, None)


# ---------------------------------------------------------------- whole runs

# 40 examples in batches of 4, through the chat template with 2 few-shot examples, 2 beams and 2
# candidates with their scores (--renormalize_logits: CTranslate2 masks as generate() then does).
RUN = ["--bs", "4", "--min_new_tokens", "3", "--max_new_tokens", "16", "--num_beams", "2", "--early_stopping", "true",
       "--renormalize_logits", "true", "--num_return_sequences", "2", "--apply_chat_template", "--num_fewshot", "2"]


def test_pseudolabels_on_both_engines_at_one_and_two_ranks(tiny, tmp_path):
    src, tgt = make_corpus(40, seed=12)
    data = write_legacy(tmp_path / "data", src, tgt)
    shots = tmp_path / "shots.jsonl"
    shots.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in zip(*make_corpus(5, seed=4))))
    cache = tmp_path / "cache"
    args = ["--model_name", str(tiny["llama"]), "--data_dir", str(data), "--fewshot_file", str(shots), *RUN]
    hf, one, two = tmp_path / "hf", tmp_path / "one", tmp_path / "two"
    assert_ok(single([*args, "--save_dir", str(hf)], cwd=tmp_path))
    first = single([*args, "--engine", "ctranslate2", "--save_dir", str(one)], cwd=tmp_path,
                   env={"SEQ2SEQ_EVAL_CACHE": str(cache)})
    assert_ok(first)
    again = run_ranks(2, [*args, "--engine", "ctranslate2", "--save_dir", str(two)], cwd=tmp_path,
                      env={"SEQ2SEQ_EVAL_CACHE": str(cache)})
    assert_ok(again)
    assert first.stderr.count("converting ") == 1 and "converting " not in again.stderr  # converted once, cached
    for name in ("test_generations.txt", "pseudolabel_results.json", "test_pseudolabels.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    rows = {e: [json.loads(line) for line in (d / "test_pseudolabels.jsonl").read_text().splitlines()]
            for e, d in (("hf", hf), ("ctranslate2", one))}
    assert len(rows["hf"]) == 40 and all(len(r["candidates"]) == 2 for r in rows["ctranslate2"])
    assert [r["candidates"] for r in rows["ctranslate2"]] == [r["candidates"] for r in rows["hf"]]
    assert _flat(r["scores"] for r in rows["ctranslate2"]) == pytest.approx(_flat(r["scores"] for r in rows["hf"]),
                                                                           rel=1e-4, abs=1e-5)
    info = json.loads((one / "test_run_info.json").read_text())["provenance"]
    assert info["engine"]["name"] == "ctranslate2" and info["prompt"]["fewshot"]["ids"]
