"""Every generation setting, every engine, every kind of value: the same texts as generate(), or
one line refusing it before any work.

The matrix is generated from the tables themselves (model/fields.py: what each field accepts and
where it does nothing; engines/rules.py and engines/ct2_rules.py: each engine's rule), so a field
a later transformers release adds cannot be left out: each field at each kind of value (unset,
neutral, 0, negative, one value, a list) goes through the checks a run makes before any work (the
dry run's), on both engines; where the table says refused, one line names the option; where a run
would go ahead, the HF engine generates and CTranslate2's texts must be the same. It is walked on
the embedded encoder-decoder (CTranslate2's Translator) and on the embedded decoder-only demo
(its Generator, by the Generator's rule). The combinations each rule refuses (`refuse_if`) are
walked the same way. docs/engines.md shows the tables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import single

from seq2seq_eval import engines
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL, EvalConfig
from seq2seq_eval.engines import rules
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.model import settings as model_settings
from seq2seq_eval.model.fields import FIELDS, KINDS, probe
from seq2seq_eval.model.generate_check import check_generate_settings
from seq2seq_eval.model.generation import BEAM_ONLY, SAMPLE_ONLY, full_dict
from seq2seq_eval.model.kind import CAUSAL, SEQ2SEQ
from seq2seq_eval.run.dist import DistEnv

DOCS = Path(__file__).resolve().parent.parent / "docs" / "engines.md"
ENGINES = ("hf", "ctranslate2")
DEMO = EMBEDDED_MODEL.parent / "causal_model"


def _ct2_rules(kind: str = SEQ2SEQ):
    pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')
    from seq2seq_eval.engines.ct2_rules import CT2_GENERATOR_RULES, CT2_RULES

    return CT2_GENERATOR_RULES if kind == CAUSAL else CT2_RULES


def _table(engine: str, kind: str = SEQ2SEQ) -> dict:
    return rules.HF_RULES if engine == "hf" else _ct2_rules(kind)


class _ModelConfig:
    decoder_start_token_id = 0


def test_every_generation_config_field_has_a_row_and_a_rule_on_each_engine():
    from transformers import GenerationConfig

    fields = set(GenerationConfig().to_dict()) - set(rules.METADATA)
    assert set(FIELDS) == fields
    assert set(rules.HF_RULES) == fields and set(_ct2_rules()) == fields and set(_ct2_rules(CAUSAL)) == fields
    for table in (rules.HF_RULES, _ct2_rules(), _ct2_rules(CAUSAL)):
        assert all(isinstance(rule.honoured, bool) and rule.how for rule in table.values())


TABLES = [("hf", SEQ2SEQ), ("ctranslate2", SEQ2SEQ), ("ctranslate2", CAUSAL)]


@pytest.mark.parametrize("engine, kind", TABLES)
def test_a_field_without_a_rule_is_refused_away_from_its_neutral_values(engine, kind):
    from transformers import GenerationConfig

    table = {k: v for k, v in _table(engine, kind).items() if k != "top_k"}
    assert [k for k, _, _ in rules.refusals(table, GenerationConfig(top_k=5, eos_token_id=1), None)] == ["top_k"]
    assert rules.refusals(table, GenerationConfig(top_k=50, eos_token_id=1), None) == []  # generate()'s default


@pytest.mark.parametrize("engine, kind", TABLES)
def test_neutral_values_from_older_model_configs_are_let_through(engine, kind):
    from transformers import GenerationConfig

    gc = GenerationConfig(eos_token_id=1, decoder_start_token_id=0)
    for field, value in (("typical_p", 1.0), ("num_beam_groups", 1), ("diversity_penalty", 0.0),
                         ("encoder_repetition_penalty", 1.0), ("output_scores", False), ("num_assistant_tokens", 20)):
        setattr(gc, field, value)
    assert rules.refusals(_table(engine, kind), gc, _ModelConfig()) == []


@pytest.mark.parametrize("engine", [*ENGINES, "ctranslate2 generator"])
def test_the_docs_show_each_engines_table(engine):
    """docs/engines.md's settings tables are the tables the engines run by (for the Generator,
    its rows that differ from the Translator's)."""
    if engine == "ctranslate2 generator":
        _ct2_rules()
        from seq2seq_eval.engines.ct2_rules import GENERATOR

        table = rules.markdown_table(GENERATOR)
    else:
        table = rules.markdown_table(_table(engine))
    text = DOCS.read_text()
    found = re.search(rf"<!-- settings table: {engine} -->\n(.*?)\n<!-- end of table -->", text, re.S)
    assert found, f"docs/engines.md: no '<!-- settings table: {engine} -->' block"
    assert found.group(1) == table, f"docs/engines.md's {engine} table differs from the engine's rule; expected:\n{table}"


# ---------------------------------------------------------------- the matrix, on the embedded model


class Bench:
    """An embedded model (the encoder-decoder, or with `kind` CAUSAL the decoder-only demo through
    its chat template), its tokenizer and 8 sources' ids, loaded once; each engine built once; the
    checks a run makes before any work, and texts per effective setting, cached."""

    def __init__(self, kind: str = SEQ2SEQ) -> None:
        import torch

        from seq2seq_eval.inputs.prompts import build_prompts, encode_prompts

        self.kind = kind
        self.options = {} if kind == SEQ2SEQ else {"model_name": str(DEMO), "apply_chat_template": True}
        cfg = EvalConfig(**self.options)
        self.tokenizer = model_settings.load_tokenizer(cfg)
        self.model_config, self.base = model_settings.load_model_config(cfg)
        self.model = model_settings.load_model(cfg, torch.device("cpu"), kind)
        sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:8]
        if kind == SEQ2SEQ:
            self.ids, _ = model_settings.encode_sources(self.tokenizer, sources, "translate: ", 1024)
        else:
            gc = model_settings.generation_config_for(self.model_config, self.base, self.tokenizer, cfg)
            prompts = build_prompts(cfg, self.tokenizer, self.model_config, gc,
                                    model_settings.source_prefix(self.model_config, cfg))
            self.ids, _, problem = encode_prompts(prompts, self.tokenizer, sources)
            assert problem is None and len({len(ids) for ids in self.ids}) > 2  # prompts of several lengths
        self.ct2 = None
        self.texts: dict[str, list] = {}

    def prepare(self, engine: str, settings: dict, n: int = 1):
        """The effective settings, or the ConfigError the run would stop with before any work."""
        try:
            cfg = EvalConfig(engine=engine, num_return_sequences=n, generate_kwargs=tuple(settings.items()),
                             **self.options)
            gc = model_settings.generation_config_for(self.model_config, self.base, self.tokenizer, cfg)
            engines.check(cfg, self.model_config, gc, self.tokenizer, "cpu", self.kind)
            check_generate_settings(gc, self.model_config)
        except ConfigError as e:
            return None, str(e)
        return gc, None

    def generate(self, engine: str, gc) -> list:
        import torch

        key = json.dumps([engine, full_dict(gc)], sort_keys=True, default=str)
        if key not in self.texts:
            if engine == "hf":
                from seq2seq_eval.engines.hf import HFEngine

                runner = HFEngine(self.model, self.tokenizer, gc, torch.device("cpu"), causal=self.kind == CAUSAL)
            else:
                from seq2seq_eval.engines.ct2 import translate_options

                if self.ct2 is None:
                    cfg = EvalConfig(engine="ctranslate2", **self.options)
                    self.ct2 = engines.load(cfg, tokenizer=self.tokenizer, model_config=self.model_config,
                                            generation_config=gc, device=torch.device("cpu"), env=DistEnv(),
                                            kind=self.kind)
                self.ct2.mapping = translate_options(gc, self.tokenizer)
                runner = self.ct2
            out = runner.generate(self.ids, 0)
            self.texts[key] = [out.preds, out.scores]
        return self.texts[key]


@pytest.fixture(scope="module")
def benches(tmp_path_factory):
    _ct2_rules()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQ2SEQ_EVAL_CACHE", str(tmp_path_factory.mktemp("ct2_cache")))
        made: dict[str, Bench] = {}

        def get(kind: str = SEQ2SEQ) -> Bench:
            if kind not in made:
                made[kind] = Bench(kind)
            return made[kind]

        yield get


@pytest.fixture(scope="module")
def bench(benches):
    return benches(SEQ2SEQ)


NEAR_GREEDY = 1e-4
"""A sampling temperature at which both engines' draws are the most likely token: sampled texts
then compare, and a setting CTranslate2 dropped or mapped wrongly would show."""


def context(key: str, value, model: str = SEQ2SEQ) -> dict:
    """What a field needs beside it to act, on one beam unless it is about beams: sampling (near
    greedy), or beam search that stops as CTranslate2 does. The demo's 120 new tokens are cut to
    24 where the limit is not the field tried (every text the same length would hide nothing: the
    demo's translations end well before)."""
    if model == CAUSAL and key not in ("max_new_tokens", "max_length"):
        return {"max_new_tokens": 24, **context(key, value)}
    if key == "do_sample":
        return {"temperature": NEAR_GREEDY} if value is True else {}
    if key == "temperature":
        return {"do_sample": True, "top_k": 1}
    if key in SAMPLE_ONLY:
        return {"do_sample": True, "temperature": NEAR_GREEDY}
    if key == "early_stopping":
        return {"num_beams": 4}
    if key in BEAM_ONLY:
        return {"num_beams": 4, "early_stopping": True}
    if key == "num_beams" and isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return {"early_stopping": True}
    return {}


def _combination(engine: str, message: str, model: str = SEQ2SEQ) -> bool:
    """A refusal by a combination an engine's rule names (its refuse_if), not by the field alone."""
    found = re.match(rf"--engine {engine} cannot honour the generation setting (\w+)=", message)
    return bool(found) and _table(engine, model)[found.group(1)].refuse_if is not None


@pytest.mark.parametrize("model", [SEQ2SEQ, CAUSAL])
@pytest.mark.parametrize("key", sorted(FIELDS))
def test_each_field_at_each_kind_of_value_gives_generates_texts_or_one_line(benches, key, model):
    """Where the table says refused (a value the field does not accept, or an engine's refusal),
    one line names the option; elsewhere the run goes ahead, unless a constraint between fields
    (the same for both engines) or a combination an engine's rule names stops it in one line; where
    both engines go ahead, their texts (and candidates' scores) are the same. On the encoder-decoder
    (CTranslate2's Translator) and on the decoder-only demo (its Generator, by its own rule)."""
    bench = benches(model)
    for kind in KINDS:
        exists, value = probe(key, kind)
        if not exists:
            continue
        n = 1
        settings = {"num_beams": 1, **context(key, value, model)}
        if key == "num_return_sequences":  # the run's own option, not a generate option: no beams given
            n, settings = (1 if value is None else value), {}
        else:
            settings[key] = value
        results, refusals = {}, {}
        for engine in ENGINES:
            where = f"{engine}: --{key} {value!r} ({kind})"
            expected = rules.outcome(_table(engine, model), key, kind)
            try:
                gc, refusal = bench.prepare(engine, settings, n)
            except TypeError:  # EvalConfig compares num_return_sequences with ints
                gc, refusal = None, f"--{key} must be an integer"
            if expected in ("invalid", "refused"):
                assert refusal is not None, f"{where}: the table says {expected}, the run goes ahead"
            if refusal is None:
                results[engine] = bench.generate(engine, gc)
                continue
            assert "\n" not in refusal and (f"--{key}" in refusal or _combination(engine, refusal, model)), \
                (where, refusal)
            refusals[engine] = refusal
            if expected not in ("invalid", "refused") and not _combination(engine, refusal, model):
                assert f"--{key}" in refusal, (where, refusal)  # a constraint between fields
        together = {e: r for e, r in refusals.items()
                    if not _combination(e, r, model) and not r.startswith("--engine")}
        if together and all(rules.outcome(_table(e, model), key, kind) not in ("invalid", "refused") for e in ENGINES):
            assert len(together) == 2 and len(set(together.values())) == 1, (key, kind, refusals)
        if len(results) == 2:
            hf, ct2 = results["hf"], results["ctranslate2"]
            assert ct2[0] == hf[0], f"--{key} {value!r} ({kind}): CTranslate2's texts differ from generate()'s"
            if hf[1] is not None:
                assert ct2[1] is not None and [s for row in ct2[1] for s in row] == pytest.approx(
                    [s for row in hf[1] for s in row], abs=1e-4)
            else:
                assert ct2[1] is None


# Combinations each CTranslate2 rule names, on beams (where they matter): settings, and whether
# CTranslate2 runs them (then with generate()'s texts) or refuses them (naming the setting).
BEAMS = {"num_beams": 4, "early_stopping": True}
COMBINATIONS = [
    ({**BEAMS, "no_repeat_ngram_size": 2}, "no_repeat_ngram_size"),
    ({**BEAMS, "no_repeat_ngram_size": 2, "renormalize_logits": True}, None),
    ({**BEAMS, "min_new_tokens": 10}, "min_new_tokens"),
    ({**BEAMS, "min_new_tokens": 10, "renormalize_logits": True}, None),
    ({**BEAMS, "min_length": 8, "renormalize_logits": True}, None),
    ({**BEAMS, "suppress_tokens": [7], "renormalize_logits": True, "max_new_tokens": 10}, None),
    ({**BEAMS, "bad_words_ids": [[7]]}, "bad_words_ids"),
    ({**BEAMS, "bad_words_ids": [[7]], "renormalize_logits": True}, None),
    ({**BEAMS, "repetition_penalty": 1.5}, "repetition_penalty"),
    ({**BEAMS, "max_new_tokens": 6}, None),  # every beam cut: forced_eos_token_id ends and ranks them
    ({**BEAMS, "max_new_tokens": 6, "length_penalty": 2.0}, None),
    ({**BEAMS, "max_new_tokens": 1}, None),
    ({"num_beams": 5, "early_stopping": True, "max_new_tokens": 9, "forced_eos_token_id": 5}, None),
    ({"num_beams": 4, "early_stopping": None}, "early_stopping"),  # unset: generate()'s default, False
    ({"num_beams": 4, "early_stopping": "never"}, "early_stopping"),
    ({"num_beams": 2, "do_sample": True}, "do_sample"),
    ({"num_beams": 1, "max_new_tokens": 5, "forced_eos_token_id": [5, 1]}, "forced_eos_token_id"),
    ({"num_beams": 1, "max_new_tokens": 5, "forced_eos_token_id": [5]}, None),
    ({"num_beams": 1, "max_new_tokens": 5, "forced_eos_token_id": 5}, None),
    ({"num_beams": 1, "decoder_start_token_id": 5}, "decoder_start_token_id"),
    ({"num_beams": 1, "forced_bos_token_id": 1}, "forced_bos_token_id"),  # the end token: generate() stops at once
    ({"num_beams": 1, "eos_token_id": [0]}, None),
    ({**BEAMS, "eos_token_id": [1, 5], "max_new_tokens": 9}, None),
    ({"num_beams": 1, "min_new_tokens": 12, "max_new_tokens": 12}, None),
    ({**BEAMS, "min_new_tokens": 12, "max_new_tokens": 12, "renormalize_logits": True}, None),
    ({"num_beams": 1, "do_sample": True, "top_p": 0.001}, None),
    ({**BEAMS, "stop_strings": "."}, "stop_strings"),
    ({"num_beams": 1, "stop_strings": ["e", "."]}, None),
    ({"num_beams": 1, "do_sample": True, "temperature": NEAR_GREEDY, "stop_strings": "e"}, None),
    ({"num_beams": 1, "max_new_tokens": 5, "forced_eos_token_id": 5, "stop_strings": "e"}, None),
]
# The Generator's own, on the decoder-only demo: what it refuses where the Translator does not,
# and its searches on prompts of several lengths.
GENERATOR_COMBINATIONS = [
    ({"num_beams": 1, "max_new_tokens": 24, "repetition_penalty": 1.3}, "repetition_penalty"),
    ({"num_beams": 1, "max_new_tokens": 24, "no_repeat_ngram_size": 2}, "no_repeat_ngram_size"),
    ({"num_beams": 1, "max_new_tokens": 24, "bad_words_ids": [[7, 8]]}, "bad_words_ids"),
    ({"num_beams": 1, "max_new_tokens": 24, "bad_words_ids": [[7], [8]]}, None),
    ({**BEAMS, "max_new_tokens": 24, "bad_words_ids": [[7]]}, "bad_words_ids"),
    ({**BEAMS, "max_new_tokens": 24, "bad_words_ids": [[7]], "renormalize_logits": True}, None),
    ({**BEAMS, "max_new_tokens": 24, "min_new_tokens": 10, "renormalize_logits": True}, None),
    ({**BEAMS, "max_new_tokens": 6}, None),
    ({**BEAMS, "max_new_tokens": 6, "forced_eos_token_id": 1, "length_penalty": 2.0}, None),
    ({**BEAMS, "max_new_tokens": 24, "stop_strings": "."}, "stop_strings"),
    ({"num_beams": 1, "max_new_tokens": 24, "stop_strings": ["e", "."]}, None),
    ({"num_beams": 1, "max_new_tokens": 24, "do_sample": True, "temperature": NEAR_GREEDY, "stop_strings": " "}, None),
    ({**BEAMS, "max_new_tokens": 24, "eos_token_id": [1, 5]}, None),
    ({"num_beams": 4, "early_stopping": None, "max_new_tokens": 24}, "early_stopping"),
]


@pytest.mark.parametrize("model, settings, refused", [(SEQ2SEQ, *c) for c in COMBINATIONS]
                         + [(CAUSAL, *c) for c in GENERATOR_COMBINATIONS])
def test_combinations_give_generates_texts_or_one_line(benches, model, settings, refused):
    bench = benches(model)
    gc, refusal = bench.prepare("ctranslate2", settings)
    if refused:
        assert refusal is not None and "\n" not in refusal and f"{refused}=" in refusal, refusal
        assert f"--{refused}" in refusal or "generate()'s default" in refusal
        return
    assert refusal is None, refusal
    hf_gc, _ = bench.prepare("hf", settings)
    assert bench.generate("ctranslate2", gc)[0] == bench.generate("hf", hf_gc)[0]


@pytest.mark.parametrize("model, n, settings, refused", [
    (SEQ2SEQ, 3, {**BEAMS, "length_penalty": 0.0}, None),
    (SEQ2SEQ, 3, BEAMS, "forced_eos_token_id"),
    (SEQ2SEQ, 2, {"num_beams": 4, "early_stopping": True, "no_repeat_ngram_size": 2, "renormalize_logits": True,
                  "length_penalty": 0.0, "max_new_tokens": 8}, None),
    (CAUSAL, 4, BEAMS, None),
    (CAUSAL, 3, {**BEAMS, "length_penalty": 0.6, "max_new_tokens": 12}, None),
    (CAUSAL, 3, {**BEAMS, "length_penalty": 0.0, "max_new_tokens": 12, "forced_eos_token_id": 1}, None),
])
def test_candidates_and_their_scores_are_generates(benches, model, n, settings, refused):
    bench = benches(model)
    gc, refusal = bench.prepare("ctranslate2", settings, n)
    if refused:
        assert refusal is not None and f"{refused}=" in refusal
        return
    hf_gc, _ = bench.prepare("hf", settings, n)
    ours, theirs = bench.generate("ctranslate2", gc), bench.generate("hf", hf_gc)
    assert ours[0] == theirs[0]
    assert [s for row in ours[1] for s in row] == pytest.approx([s for row in theirs[1] for s in row], abs=1e-4)


# ---------------------------------------------------------------- the command line

CHEAP = ["--n_obs", "8", "--dry_run"]


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
@pytest.mark.parametrize("flag, value", [("--bad_words_ids", "[[1308]]"), ("--suppress_tokens", "[1308]"),
                                         ("--eos_token_id", "[1, 2]"), ("--sequence_bias", "[[[1308], -5.0]]")])
def test_list_valued_settings_parse_as_json(tmp_path, engine, flag, value):
    if engine == "ctranslate2":
        _ct2_rules()
    # One beam: in beam search CTranslate2 honours masking only with --renormalize_logits true.
    proc = single(["--engine", engine, *CHEAP, "--num_beams", "1", flag, value, "--save_dir", str(tmp_path / "out")],
                  cwd=tmp_path)
    if engine == "ctranslate2" and flag == "--sequence_bias":
        assert proc.returncode == 2 and "sequence_bias=[[[1308], -5.0]] (set by --sequence_bias)" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert f'"{flag[2:]}": {value}' in proc.stdout + proc.stderr  # the dry run's generation settings


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
@pytest.mark.parametrize("args, message", [
    (["--suppress_tokens", "1308"], "--suppress_tokens 1308: expected a JSON list of token ids, such as [1308]"),
    (["--bad_words_ids", "[1308]"], "--bad_words_ids [1308]: expected a non-empty JSON list of token-id lists, such as [[1308]]"),
    (["--bad_words_ids", "[]"], "--bad_words_ids []: expected a non-empty JSON list of token-id lists"),
    (["--bad_words_ids", "[[1308"], "--bad_words_ids [[1308: not valid JSON"),
    (["--suppress_tokens", "[99999]"], "--suppress_tokens: token id 99999 is outside the model's vocabulary of 3000"),
])
def test_malformed_list_settings_are_one_line(tmp_path, engine, args, message):
    if engine == "ctranslate2":
        _ct2_rules()
    proc = single(["--engine", engine, *CHEAP, *args, "--save_dir", str(tmp_path / "out")], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"seq2seq_eval: error: {proc.stderr.split('error: ', 1)[-1].strip()}"], proc.stderr
    assert message in proc.stderr


def test_decoder_start_token_id_is_refused_by_ctranslate2_before_any_work(tmp_path):
    _ct2_rules()
    save = tmp_path / "out"
    proc = single(["--engine", "ctranslate2", "--n_obs", "8", "--decoder_start_token_id", "5", "--save_dir", str(save)],
                  cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cannot honour the generation setting decoder_start_token_id=5" in proc.stderr
    assert not save.exists() and not list(Path(f"{save}_tmp").glob("journal_*"))


# ---------------------------------------------------------------- outputs on the embedded model


@pytest.fixture(scope="module")
def ct2_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQ2SEQ_EVAL_CACHE", str(tmp_path_factory.mktemp("ct2_cache")))
        yield


_OUTPUTS: dict[str, list[str]] = {}


def _outputs(engine_name: str, settings: tuple = ()) -> list[str]:
    """Greedy texts of 16 embedded translation sources, through the engine as a run loads it
    (each engine and settings once per module: the tests compare the same few several times)."""
    key = json.dumps([engine_name, settings])
    if key not in _OUTPUTS:
        _OUTPUTS[key] = _generate_outputs(engine_name, settings)
    return list(_OUTPUTS[key])


def _generate_outputs(engine_name: str, settings: tuple) -> list[str]:
    cfg = EvalConfig(engine=engine_name, generate_kwargs=(("num_beams", 1), *settings))
    tok = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    gc = model_settings.generation_config_for(model_config, base, tok, cfg)
    engines.check(cfg, model_config, gc, tok)
    engine = engines.load(cfg, tokenizer=tok, model_config=model_config, generation_config=gc,
                          device=__import__("torch").device("cpu"), env=DistEnv())
    sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:16]
    ids, _ = model_settings.encode_sources(tok, sources, model_settings.source_prefix(model_config, cfg), 1024)
    return [p[0] for i in range(0, 16, 8) for p in engine.generate(ids[i:i + 8], i).preds]


@pytest.fixture(scope="module")
def frequent_token():
    """A token of the embedded model's greedy outputs, in several of them: suppressing it must change them."""
    tok = model_settings.load_tokenizer(EvalConfig())
    counts: dict[int, int] = {}
    for text in _outputs("hf"):
        for i in set(tok(text)["input_ids"]) - set(tok.all_special_ids):
            counts[i] = counts.get(i, 0) + 1
    return max(sorted(counts), key=lambda i: counts[i])


def test_the_hf_engine_honours_decoder_start_token_id():
    assert _outputs("hf", (("decoder_start_token_id", 5),)) != _outputs("hf")


@pytest.mark.parametrize("form", ["bad_words_ids", "suppress_tokens"])
def test_suppressed_tokens_change_both_engines_outputs_alike(ct2_cache, frequent_token, form):
    _ct2_rules()
    value = [[frequent_token]] if form == "bad_words_ids" else [frequent_token]
    hf = _outputs("hf", ((form, value),))
    assert hf != _outputs("hf")
    assert _outputs("ctranslate2", ((form, value),)) == hf
