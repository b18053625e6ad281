"""Every generation setting, every engine: honoured or refused, by each engine's own table.

The tables (engines/rules.py, engines/ct2_rules.py) are walked against every field of the
installed transformers' GenerationConfig; list-valued settings are given on the command line as
generate() takes them; the honoured ones change the outputs as generate()'s do; docs/engines.md
shows the tables themselves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import single

from seq2seq_eval import engines
from seq2seq_eval.config import EMBEDDED_DATA, EvalConfig
from seq2seq_eval.engines import rules
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.model import settings as model_settings
from seq2seq_eval.run.dist import DistEnv

DOCS = Path(__file__).resolve().parent.parent / "docs" / "engines.md"

# A value for every field that makes it do something (away from its neutral values).
EXAMPLES = {
    "max_length": 20, "max_new_tokens": 10, "min_length": 3, "min_new_tokens": 2, "early_stopping": True,
    "max_time": 5.0, "stop_strings": ["."], "do_sample": True, "num_beams": 1, "use_mtp": True, "use_cache": False,
    "cache_implementation": "static", "cache_config": {"max_cache_len": 64}, "max_cache_len": 64, "temperature": 0.7,
    "top_k": 5, "top_p": 0.9, "min_p": 0.1, "top_h": 0.5, "typical_p": 0.5, "epsilon_cutoff": 0.001,
    "eta_cutoff": 0.001, "repetition_penalty": 1.3, "encoder_repetition_penalty": 1.3, "length_penalty": 2.0,
    "no_repeat_ngram_size": 2, "bad_words_ids": [[5]], "renormalize_logits": True, "forced_bos_token_id": 5,
    "forced_eos_token_id": 1, "remove_invalid_values": True, "exponential_decay_length_penalty": [5, 1.5],
    "suppress_tokens": [5], "begin_suppress_tokens": [5], "sequence_bias": [[[5], -1.0]], "token_healing": True,
    "guidance_scale": 1.5, "watermarking_config": {"greenlist_ratio": 0.25}, "num_return_sequences": 1,
    "output_attentions": True, "output_hidden_states": True, "output_scores": True, "output_logits": True,
    "return_dict_in_generate": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": [1, 2],
    "encoder_no_repeat_ngram_size": 2, "decoder_start_token_id": 0, "is_assistant": True, "num_assistant_tokens": 5,
    "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4, "prompt_lookup_num_tokens": 3,
    "max_matching_ngram_size": 2, "assistant_early_exit": 2, "assistant_lookbehind": 10, "target_lookbehind": 10,
    "assistant_ensemble_weight": 0.5, "speculation_type": "draft", "compile_config": {"fullgraph": True},
    "disable_compile": True, "continuous_batching_config": {"block_size": 32}, "low_memory": True,
    "penalty_alpha": 0.6, "dola_layers": "low", "diversity_penalty": 0.5, "num_beam_groups": 2,
    "constraints": ["a constraint"], "force_words_ids": [[5]], "prefill_chunk_size": 16,
}
TABLES = {"hf": rules.HF_RULES, "ctranslate2": None}


def _ct2_rules():
    pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')
    from seq2seq_eval.engines.ct2_rules import CT2_RULES

    return CT2_RULES


def _table(engine: str) -> dict:
    return rules.HF_RULES if engine == "hf" else _ct2_rules()


class _ModelConfig:
    decoder_start_token_id = 0


def _one(field: str, value=None):
    """GenerationConfig() with one field set, as a flag or a model's config would set it (no
    validation: the tables judge values generate()'s own checks would let through)."""
    from transformers import GenerationConfig

    gc = GenerationConfig()
    setattr(gc, field, EXAMPLES[field] if value is None else value)
    return gc


def test_the_examples_cover_every_generation_config_field():
    from transformers import GenerationConfig

    assert set(EXAMPLES) == set(GenerationConfig().to_dict()) - set(rules.METADATA)


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
def test_every_generation_config_field_is_honoured_or_refused(engine):
    """Each field of the installed GenerationConfig has exactly one rule; a refused field at a
    value that does something is refused by name, an honoured one at that value is not (low_memory
    under the HF engine's beam search aside: its rule refuses that combination)."""
    table = _table(engine)
    assert set(table) == set(EXAMPLES)
    for field, rule in table.items():
        assert isinstance(rule.honoured, bool) and rule.how, field
        found = rules.refusals(table, _one(field), _ModelConfig())
        if rule.honoured:
            assert found == [], (engine, field)
        else:
            assert [(key, text) for key, text, _ in found] == [(field, f"{field}={EXAMPLES[field]!r}")], (engine, field)


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
def test_a_field_without_a_rule_is_refused(engine):
    table = {k: v for k, v in _table(engine).items() if k != "top_k"}
    assert [k for k, _, _ in rules.refusals(table, _one("top_k"), None)] == ["top_k"]


@pytest.mark.parametrize("engine, field, value, named", [
    ("ctranslate2", "decoder_start_token_id", 5, "decoder_start_token_id=5 (CTranslate2 starts the decoder from"),
    ("ctranslate2", "early_stopping", "never", "early_stopping='never'"),
    ("ctranslate2", "typical_p", 0.5, "typical_p=0.5 (set by --typical_p): CTranslate2 has no counterpart"),
    ("hf", "stop_strings", ["."], "stop_strings=['.'] (set by --stop_strings): generate() needs the tokenizer"),
    ("hf", "penalty_alpha", 0.6, "transformers-community/contrastive-search"),
])
def test_refusals_are_one_line_naming_the_setting(engine, field, value, named):
    _table(engine)
    cfg = EvalConfig(engine=engine, generate_kwargs=((field, value),))
    with pytest.raises(ConfigError, match=rf"^--engine {engine} cannot honour the generation setting ") as e:
        engines.check(cfg, _ModelConfig(), _one(field, value), None)
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
def test_neutral_values_from_older_model_configs_are_let_through(engine):
    from transformers import GenerationConfig

    gc = GenerationConfig()
    for field, value in (("typical_p", 1.0), ("num_beam_groups", 1), ("diversity_penalty", 0.0),
                         ("encoder_repetition_penalty", 1.0), ("output_scores", False)):
        setattr(gc, field, value)
    assert rules.refusals(_table(engine), gc, _ModelConfig()) == []


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
def test_the_docs_show_each_engines_table(engine):
    """docs/engines.md's settings tables are the tables the engines run by."""
    table = rules.markdown_table(_table(engine))
    text = DOCS.read_text()
    found = re.search(rf"<!-- settings table: {engine} -->\n(.*?)\n<!-- end of table -->", text, re.S)
    assert found, f"docs/engines.md: no '<!-- settings table: {engine} -->' block"
    assert found.group(1) == table, f"docs/engines.md's {engine} table differs from the engine's rule; expected:\n{table}"


# ---------------------------------------------------------------- the command line

CHEAP = ["--n_obs", "8", "--dry_run"]


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
@pytest.mark.parametrize("flag, value", [("--bad_words_ids", "[[1308]]"), ("--suppress_tokens", "[1308]"),
                                         ("--eos_token_id", "[1, 2]"), ("--sequence_bias", "[[[1308], -5.0]]")])
def test_list_valued_settings_parse_as_json(tmp_path, engine, flag, value):
    if engine == "ctranslate2":
        _ct2_rules()
    proc = single(["--engine", engine, *CHEAP, flag, value, "--save_dir", str(tmp_path / "out")], cwd=tmp_path)
    if engine == "ctranslate2" and flag == "--sequence_bias":
        assert proc.returncode == 2 and "sequence_bias=[[[1308], -5.0]] (set by --sequence_bias)" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert f'"{flag[2:]}": {value}' in proc.stdout + proc.stderr  # the dry run's generation settings


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
@pytest.mark.parametrize("args, message", [
    (["--suppress_tokens", "1308"], "--suppress_tokens 1308: expected a JSON list of token ids, such as [1308]"),
    (["--bad_words_ids", "[1308]"], "--bad_words_ids [1308]: expected a JSON list of token-id lists, such as [[1308]]"),
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
