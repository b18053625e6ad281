"""Decoder-only models: their kind read from the config, prompts built once as token ids and
checked before any work, left-padded batches that give what a plain one-prompt-at-a-time
generate() loop gives, stop strings, and every guarantee of the run (1, 2 and 3 ranks, resume
after a kill, work stealing, pseudolabels) on tiny Llama-style and Qwen2-style models built here.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from conftest import assert_ok, make_corpus, run_ranks, single, write_legacy
from tiny_causal import build_tiny_llama, build_tiny_qwen2

from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL, EvalConfig
from seq2seq_eval.engines import stops
from seq2seq_eval.engines.hf import HFEngine
from seq2seq_eval.errors import ConfigError, DataError, ModelError
from seq2seq_eval.inputs.prompts import build_prompts, encode_prompts
from seq2seq_eval.model import settings
from seq2seq_eval.model.kind import CAUSAL, SEQ2SEQ, model_kind
from seq2seq_eval.options import unescape

torch = pytest.importorskip("torch")

SOURCES = ["the cat sat", "a big red house on the mat", "dog", "Zürich 42 7 1999 , . ! ? café", "slow blue tree",
           "the small dog runs fast on a big red mat near the house", "élan"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    src, tgt = make_corpus(200, seed=1)
    root = tmp_path_factory.mktemp("causal")
    return {"llama": build_tiny_llama(root / "llama", src + tgt), "qwen2": build_tiny_qwen2(root / "qwen2", src + tgt)}


class Setup:
    """What a run builds before generating, in this process: the settings, the prompts' ids."""

    def __init__(self, path: Path, **options) -> None:
        gen = {k: options.pop(k) for k in list(options) if k not in EvalConfig.__dataclass_fields__}
        self.cfg = EvalConfig(model_name=str(path), generate_kwargs=tuple(gen.items()), **options)
        self.tokenizer = settings.load_tokenizer(self.cfg)
        self.model_config, base = settings.load_model_config(self.cfg)
        self.gc = settings.generation_config_for(self.model_config, base, self.tokenizer, self.cfg)
        self.prompts = build_prompts(self.cfg, self.tokenizer, self.model_config, self.gc,
                                     settings.source_prefix(self.model_config, self.cfg))

    def ids(self, sources=SOURCES):
        ids, _, problem = encode_prompts(self.prompts, self.tokenizer, sources)
        assert problem is None
        return ids


_MODELS: dict[str, object] = {}


def _model(path: Path):
    if str(path) not in _MODELS:
        _MODELS[str(path)] = settings.load_model(EvalConfig(model_name=str(path)), torch.device("cpu"), CAUSAL)
    return _MODELS[str(path)]


def _engine(setup: Setup):
    return HFEngine(_model(Path(setup.cfg.model_name)), setup.tokenizer, setup.gc, torch.device("cpu"), causal=True)


# ---------------------------------------------------------------- the kind, from the config


def test_the_kind_comes_from_the_models_config(tiny):
    from transformers import AutoConfig, BertConfig, GPT2Config

    assert model_kind(AutoConfig.from_pretrained(tiny["llama"]), "m") == CAUSAL
    assert model_kind(AutoConfig.from_pretrained(tiny["qwen2"]), "m") == CAUSAL
    assert model_kind(AutoConfig.from_pretrained(EMBEDDED_MODEL), "m") == SEQ2SEQ  # Marian is in both mappings
    assert model_kind(GPT2Config(architectures=["GPT2LMHeadModel"]), "m") == CAUSAL
    assert model_kind(GPT2Config(), "m", architecture="GPT2LMHeadModel") == CAUSAL  # a model object's class
    # BERT is in the causal-LM mapping for its LM-head variant; an encoder saved as such is not one.
    assert model_kind(BertConfig(architectures=["BertLMHeadModel"], is_decoder=True), "m") == CAUSAL
    with pytest.raises(ModelError, match=r"^--model_name m: a 'bert' model \(BertModel\) is neither a seq2seq nor a "):
        model_kind(BertConfig(architectures=["BertModel"]), "m")


# ---------------------------------------------------------------- prompts


def test_plain_prompts_are_the_tokenizers_ids_of_the_text(tiny):
    s = Setup(tiny["llama"], prompt_template="Q: {source}\nA:", prefix="translate: ")
    tok = s.tokenizer
    assert s.ids(["the cat"]) == [tok("translate: Q: the cat\nA:")["input_ids"]]
    first, second = s.ids(["the cat"])[0][:2]
    assert first == tok.bos_token_id and second != tok.bos_token_id  # one BOS, the tokenizer's
    qwen = Setup(tiny["qwen2"], prompt_template="{source} =")
    assert qwen.ids(["the cat"]) == [qwen.tokenizer("the cat =")["input_ids"]]  # no BOS to add


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_chat_prompts_are_what_apply_chat_template_tokenizes(tiny, name):
    s = Setup(tiny[name], apply_chat_template=True, system_instruction="Be brief.", prompt_template="Say: {source}")
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say: the cat"}]
    expected = s.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert s.ids(["the cat"]) == [list(expected)]
    if name == "llama":  # the template writes BOS; it is not added again
        assert expected[0] == s.tokenizer.bos_token_id and expected[1] != s.tokenizer.bos_token_id


def test_few_shot_examples_are_chosen_by_seed_and_the_same_for_every_prompt(tiny, tmp_path):
    pool = tmp_path / "shots.jsonl"
    pool.write_text("".join(json.dumps({"id": f"s{i}", "source": f"dog {i}", "target": f"cat {i}"}) + "\n"
                            for i in range(6)))
    plain = Setup(tiny["llama"], num_fewshot=2, fewshot_file=str(pool), prompt_template="{source} =", seed=3)
    shots = plain.prompts.shots
    assert [s.id for s in Setup(tiny["llama"], num_fewshot=2, fewshot_file=str(pool), seed=3).prompts.shots] == \
        [s.id for s in shots]
    assert [s.id for s in Setup(tiny["llama"], num_fewshot=2, fewshot_file=str(pool), seed=4).prompts.shots] != \
        [s.id for s in shots]
    text = "".join(f"{s.source} ={s.target}\n\n" for s in shots)
    assert plain.ids(["a", "b"]) == [plain.tokenizer(text + "a =")["input_ids"], plain.tokenizer(text + "b =")["input_ids"]]
    assert plain.prompts.record()["fewshot"] == {"file": str(pool), "ids": [s.id for s in shots]}
    chat = Setup(tiny["qwen2"], num_fewshot=2, fewshot_file=str(pool), apply_chat_template=True, seed=3)
    turns = [m for s in shots for m in ({"role": "user", "content": s.source}, {"role": "assistant", "content": s.target})]
    expected = chat.tokenizer.apply_chat_template(turns + [{"role": "user", "content": "a"}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    assert chat.ids(["a"]) == [list(expected)]
    with pytest.raises(ConfigError, match=r"^--num_fewshot 7: --fewshot_file .*shots.jsonl holds 6 examples"):
        Setup(tiny["llama"], num_fewshot=7, fewshot_file=str(pool))


@pytest.mark.parametrize("options, message", [
    ({"prompt_template": "<s>{source}"},
     "--prompt_template '<s>{source}': the prompt starts with the BOS token '<s>' twice (the text starts with it and "
     "the tokenizer adds it too); leave '<s>' out of the prompt"),
    ({"prompt_template": "Q:"}, "--prompt_template 'Q:': no {source}"),
    ({"prompt_template": "Q: {source!r}"}, "--prompt_template 'Q: {source!r}': {source!r}: expected a plain {source} "
                                           "or {column}"),
    ({"prompt_template": "{source} {}"}, "--prompt_template '{source} {}': {}: expected a plain {source} or {column}"),
    ({"prompt_template": "{source} {a[0]}"}, "--prompt_template '{source} {a[0]}': {a[0]}: expected a plain"),
    ({"prompt_template": "Q: {source"}, "--prompt_template 'Q: {source': expected '}' before end of string"),
    ({"prompt_template": "Q \ud83d: {source}"}, "--prompt_template 'Q \\ud83d: {source}': the template holds a lone "
                                              "surrogate (U+D83D at character 2"),
    # Every text option, as evaluate() takes it (the command line's arguments are checked as they come).
    ({"system_instruction": "be \ud800 brief", "apply_chat_template": True},
     "--system_instruction 'be \\ud800 brief': the value holds a lone surrogate (U+D800 at character 3"),
    ({"prefix": "x\udcff "}, "--prefix 'x\\udcff ': the value holds a lone surrogate (U+DCFF at character 1"),
    ({"stop_strings": ["a", "\ud800"]}, "--stop_strings '\\ud800': the value holds a lone surrogate"),
    ({"max_length": 40}, "--max_length 40: a decoder-only model's max_length counts the prompt's tokens"),
    ({"max_new_tokens": None}, "no --max_new_tokens (nor max_new_tokens in the model's generation config or task "
                               "entry): generate() would give each prompt at most 20 new tokens, its default "
                               "max_length 20 counted after the batch's padded prompts"),
    ({"min_length": 5}, "--min_length: min_length=5: a decoder-only model's min_length counts the prompt's tokens"),
    ({"encoder_repetition_penalty": 1.2}, "--encoder_repetition_penalty: encoder_repetition_penalty=1.2: a decoder-only "
                                          "model has no encoder"),
    ({"stop_strings": ["☃", "€"]}, "--stop_strings: ['☃', '€']: transformers' StopStringCriteria cannot be built for "
                                   "these with the model's tokenizer (Stop string preprocessing was unable"),
    ({"stop_strings": ["x", ""]}, "--stop_strings: an empty stop string would stop every text at once"),
    ({"stop_strings": []}, "--stop_strings: an empty list: generate() builds its stop-string criterion from it and "
                           "fails"),
    ({"max_new_tokens": 300}, "--max_new_tokens 300: leaves no room for a prompt in the model's 256 positions"),
    ({"max_source_length": 250}, "--max_source_length 250: a prompt that long and --max_new_tokens 12 exceed the "
                                 "model's 256 positions; expected at most 244"),
])
def test_prompts_and_settings_refused_before_any_work(tiny, options, message):
    with pytest.raises(ConfigError) as e:
        Setup(tiny["llama"], **options)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_a_tokenizer_without_a_chat_template_is_refused(tiny, tmp_path):
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(tiny["llama"], plain)
    (plain / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match="^--apply_chat_template: the tokenizer of .*plain has no chat template"):
        Setup(plain, apply_chat_template=True)


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}", "TemplateAssertionError"),
    ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
     "{% endif %}{{ m['content'] }}{% endfor %}", "System role not supported"),
])
def test_a_chat_template_that_fails_is_refused_not_skipped(tiny, tmp_path, template, message):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny["llama"], broken)
    (broken / "chat_template.jinja").write_text(template)
    with pytest.raises(ConfigError, match="^--apply_chat_template: the chat template of .*broken fails ") as e:
        Setup(broken, apply_chat_template=True, system_instruction="Be brief.")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_prompt_too_long_or_with_two_bos_names_the_example_and_left_truncation_keeps_bos(tiny):
    s = Setup(tiny["llama"], max_source_length=8)
    long = "the small dog runs fast on a big red mat near the house"
    ids, truncated, problem = encode_prompts(s.prompts, s.tokenizer, ["dog", long, "<s>dog"])
    full = s.tokenizer(long)["input_ids"]
    assert problem == (1, f"its prompt is {len(full)} tokens, more than the 8 that fit (--max_source_length 8); "
                          "shorten the prompt, lower --max_new_tokens, or pass --truncate_prompt left")
    _, _, problem = encode_prompts(s.prompts, s.tokenizer, ["dog", "<s>dog"])
    assert problem[0] == 1 and "starts with the BOS token '<s>' twice" in problem[1]
    left = Setup(tiny["llama"], max_source_length=8, truncate_prompt="left")
    ids, truncated, problem = encode_prompts(left.prompts, left.tokenizer, ["dog", long])
    assert problem is None and truncated == 1
    assert ids == [s.tokenizer("dog")["input_ids"], [full[0]] + full[-7:]]


def test_other_columns_of_the_input_fill_the_template(tiny, tmp_path):
    """{column}: a field of a JSON Lines file, a (nested) column of a dataset, and of the few-shot
    examples; missing, or from an input without columns, one line before any work."""
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.prepare import prepare

    rows = [{"id": "a", "source": "dog", "target": "x", "lang": "de", "meta": {"lang": "fr"}},
            {"id": "b", "source": "the cat", "target": "y", "lang": "ro", "meta": {"lang": "it"}}]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shots = tmp_path / "shots.jsonl"
    shots.write_text(json.dumps({"source": "a red house", "target": "z", "lang": "fr"}) + "\n")
    tok = settings.load_tokenizer(EvalConfig(model_name=str(tiny["llama"])))

    def ids(**options):
        cfg = EvalConfig(model_name=str(tiny["llama"]), save_dir=str(tmp_path / "o"), **options)
        prep = prepare(cfg, DistEnv(), None, tmp_path / f"cache{len(list(tmp_path.iterdir()))}")
        return [prep.tokens.ids(i) for i in range(len(prep.store))]

    assert ids(data_dir=str(data), prompt_template="To {lang}: {source} =") == [
        tok("To de: dog =")["input_ids"], tok("To ro: the cat =")["input_ids"]]
    assert ids(data_dir=str(data), prompt_template="To {lang}: {source} =", num_fewshot=1, fewshot_file=str(shots)) \
        == [tok("To fr: a red house =z\n\nTo de: dog =")["input_ids"],
            tok("To fr: a red house =z\n\nTo ro: the cat =")["input_ids"]]
    assert ids(dataset=str(data), source_column="source", target_column="target",
               prompt_template="{meta.lang}: {source}") == [tok("fr: dog")["input_ids"], tok("it: the cat")["input_ids"]]
    with pytest.raises(DataError, match=r"data.jsonl line 1: missing field 'dialect', which --prompt_template names"):
        ids(data_dir=str(data), prompt_template="{dialect}: {source}")
    with pytest.raises(DataError, match=r"no column 'dialect', which --prompt_template names; columns: id, source"):
        ids(dataset=str(data), source_column="source", target_column="target", prompt_template="{dialect} {source}")
    legacy = write_legacy(tmp_path / "legacy", ["dog"], ["x"])
    with pytest.raises(ConfigError, match=r"^--prompt_template names \{lang\}, but the .source/.target layout has no "
                                          r"other columns"):
        ids(data_dir=str(legacy), prompt_template="{lang}: {source}")


# ---------------------------------------------------------------- references never reach a prompt unless asked

# Row "b"'s gloss is its reference in other case and spacing, with invisible characters (a soft hyphen,
# a zero-width space): a reference column under another name.
LEAK_ROWS = [{"id": "a", "source": "the cat sat", "target": "die Katze sass", "lang": "de", "gloss": "cat",
              "translation": {"en": "the cat sat", "de": "die Katze sass", "fr": "le chat"}},
             {"id": "b", "source": "a red house", "target": "ein rotes Haus", "lang": "de",
              "gloss": " EIN ro\u00adtes\tHa\u200bus",
              "translation": {"en": "a red house", "de": "ein rotes Haus", "fr": "une maison"}}]


@pytest.fixture
def leak_data(tmp_path) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in LEAK_ROWS))
    # The same rows as CSV, read by the datasets library (a JSON file given to --dataset is not).
    (tmp_path / "data.csv").write_text("source,target,gloss\n" + "".join(f"{r['source']},{r['target']},{r['gloss']}\n"
                                                                       for r in LEAK_ROWS))
    return data


def _read(**options) -> list:
    """The examples as a run reads them, template fields included (no model needed)."""
    from seq2seq_eval.inputs.read import iter_examples

    blocks, _ = iter_examples(EvalConfig(**options))
    return [e for b in blocks for e in b.examples()]


TR = {"dataset": "{data}", "src_lang": "en", "tgt_lang": "de"}  # WMT's layout: source translation.en


@pytest.mark.parametrize("options, template, message", [
    ({"data_dir": "{data}"}, "{source} => {target}",
     "{data}: --prompt_template names {target}, which is the reference column 'target'"),
    ({"dataset": "{data}", "source_column": "source"}, "{target}: {source}",  # its partner, the reference
     "split test: --prompt_template names {target}, which is the reference column 'target'"),
    ({"dataset": "{csv}"}, "{source} {target}", "split test: --prompt_template names {target}, which is the reference "
                                                "column 'target'"),
    (TR, "{source} = {translation.de}", "--prompt_template names {translation.de}, which is the reference column "
                                         "'translation.de'"),
    (TR, "{translation}: {source}", "--prompt_template names {translation}, which holds the reference column "
                                    "'translation.de'"),
    (TR, "{translation.fr}: {source}",  # another translation of the source is a reference too
     "--prompt_template names {translation.fr}, which is the reference column 'translation.fr'"),
    ({"dataset": "{data}", "source_column": "source", "target_column": "gloss"}, "{gloss} {source}",
     "--prompt_template names {gloss}, which is the reference column 'gloss'"),
    # ids taken from the reference column
    ({"dataset": "{data}", "source_column": "source", "id_column": "target"}, "{id}: {source}",
     "--prompt_template names {id}, which is the reference column 'target'"),
    ({"dataset": "{data}", "source_column": "translation.de", "target_column": "translation"}, "{source}",
     "its source column 'translation.de' lies inside the reference column 'translation'"),
    ({"data_dir": "{data}"}, "{gloss}: {source}",  # a reference column under another name, row by row
     "{data}: example id 'b': its column 'gloss', which --prompt_template names, holds its reference 'ein rotes Haus' "
     "(compared as a reader sees them: without invisible characters, case folded, Unicode compatibility forms and "
     "runs of whitespace as one)"),
    ({"dataset": "{data}", "source_column": "source"}, "{source} ({gloss})",
     "example id 'b': its column 'gloss', which --prompt_template names, "
                                                  "holds its reference"),
])
def test_a_template_that_would_show_the_reference_is_refused_on_every_input_kind(leak_data, options, template,
                                                                                   message):
    csv = leak_data.with_suffix(".csv")
    options = {k: v.replace("{data}", str(leak_data)).replace("{csv}", str(csv)) for k, v in options.items()}
    with pytest.raises(ConfigError) as e:
        _read(prompt_template=template, **options)
    said = str(e.value)
    assert message.replace("{data}", str(leak_data)) in said and "\n" not in said, said
    assert said.endswith("pass --allow_reference_in_prompt to allow it"), said
    # Asked for by name, it is what the user gets (a dict column is no text for a prompt, then).
    if "{translation}" in template or options.get("target_column") == "translation":
        with pytest.raises(DataError, match="column 'translation'.*: expected a non-empty string, got {'en'"):
            _read(prompt_template=template, allow_reference_in_prompt=True, **options)
    else:
        assert len(_read(prompt_template=template, allow_reference_in_prompt=True, **options)) == 2


def test_template_columns_that_are_not_references_and_ids_as_text_fill_prompts(tiny, leak_data, tmp_path):
    """{lang}, {meta...}: accepted; {id}: the example's id as text on every input kind (a line
    number, a record's id, a dataset's id column), also for few-shot examples."""
    assert [e.fields for e in _read(data_dir=str(leak_data), prompt_template="{lang} {source}")] == [{"lang": "de"}] * 2
    assert [e.fields for e in _read(**{**TR, "dataset": str(leak_data)}, prompt_template="{lang} {source}")] == \
        [{"lang": "de"}] * 2
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"source": s, "target": "x"}) + "\n" for s in ("dog", "cat")))
    legacy = write_legacy(tmp_path / "legacy", ["dog", "cat"], ["x", "y"])
    for options, ids in (({"data_dir": str(plain)}, ["0", "1"]), ({"data_dir": str(legacy)}, ["0", "1"]),
                         ({"data_dir": str(leak_data)}, ["a", "b"]),
                         ({"dataset": str(leak_data), "source_column": "source", "id_column": "lang", "n_obs": 1},
                          ["de"])):
        assert [e.fields for e in _read(prompt_template="{id}: {source}", **options)] == [{"id": i} for i in ids]
    shots = tmp_path / "shots.jsonl"
    shots.write_text(json.dumps({"id": 7, "source": "a blue tree", "target": "z"}) + "\n")
    s = Setup(tiny["llama"], prompt_template="{id}: {source} =", num_fewshot=1, fewshot_file=str(shots))
    assert s.prompts.text(s.tokenizer, "dog", {"id": "0"}) == "7: a blue tree =z\n\n0: dog ="


def _prepare(tiny, tmp_path, **options):
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.prepare import prepare

    cfg = EvalConfig(model_name=str(tiny["llama"]), save_dir=str(tmp_path / "o"), **options)
    return prepare(cfg, DistEnv(), None, tmp_path / f"cache{len(list(tmp_path.iterdir()))}")


@pytest.mark.parametrize("shot, template, message", [
    (None, "{source}", r"few-shot example id '(a|b)' has the source of evaluated example id '\1' of"),  # the file itself
    ({"id": "x1", "source": "  A RED\u00a0house ", "target": "?"}, "{source}",  # a copy, other ids, other spacing
     "few-shot example id 'x1' has the source of evaluated example id 'b' of"),
    ({"id": "x2", "source": "a tree", "target": "Ein Rotes Haus"}, "{source}",
     "few-shot example id 'x2' shows in its target the reference of evaluated example id 'b' of"),
    ({"id": "x3", "source": "die katze sass", "target": "the cat"}, "{source}",  # the other direction
     "few-shot example id 'x3' shows in its source the reference of evaluated example id 'a' of"),
    ({"id": "x4", "source": "a tree", "target": "ein Baum", "lang": "ein rotes haus"}, "{lang}: {source}",
     "few-shot example id 'x4' shows in its column 'lang' the reference of evaluated example id 'b' of"),
    ({"id": "b", "source": "a tree", "target": "ein Baum", "lang": "de"}, "{source}",
     "few-shot example id 'b' has the id of evaluated example id 'b' of"),
])
def test_few_shot_examples_from_the_evaluated_set_are_refused(tiny, leak_data, tmp_path, shot, template, message):
    shots = leak_data
    if shot is not None:
        shots = tmp_path / "shots.jsonl"
        shots.write_text(json.dumps({"id": "far", "source": "x", "target": "y", "lang": "de"}) + "\n" +
                         json.dumps(shot) + "\n")
    options = {"data_dir": str(leak_data), "prompt_template": template, "num_fewshot": 2, "fewshot_file": str(shots)}
    with pytest.raises(ConfigError) as e:
        _prepare(tiny, tmp_path, **options)
    said = str(e.value)
    assert said.startswith(f"--fewshot_file {shots.resolve()}: ") and re.search(message, said), said
    assert str(leak_data) in said and said.endswith("choose few-shot examples outside the evaluated set, or pass "
                                                     "--allow_reference_in_prompt to allow it")
    prep = _prepare(tiny, tmp_path, allow_reference_in_prompt=True, **options)
    assert prep.manifest["prompt"]["allow_reference_in_prompt"] is True


def test_few_shot_checks_on_text_files_chat_templates_and_integer_ids(tiny, tmp_path):
    """The .source/.target layout with a chat template: a few-shot copy of its texts is refused;
    integer ids (line numbers, counters) are not compared, so other examples numbered alike are
    accepted; the prompts record that references were not allowed."""
    legacy = write_legacy(tmp_path / "legacy", ["dog", "the cat"], ["ein Hund", "die Katze"])
    (legacy / "test.target.1").write_text("a dog\nthe tomcat\n")  # a second reference each
    shots = tmp_path / "shots.jsonl"
    options = {"data_dir": str(legacy), "apply_chat_template": True, "num_fewshot": 1, "fewshot_file": str(shots)}
    for shot, message in (({"id": 1, "source": "The  Cat", "target": "?"}, "id 1 has the source of evaluated example id 1"),
                          ({"id": 5, "source": "a tree", "target": "The Tomcat"},
                           "id 5 shows in its target reference 2 \\(of 2\\) of evaluated example id 1")):
        shots.write_text(json.dumps(shot) + "\n")
        with pytest.raises(ConfigError, match=f"few-shot example {message} of "):
            _prepare(tiny, tmp_path, **options)
    shots.write_text(json.dumps({"id": 1, "source": "a tree", "target": "ein Baum"}) + "\n")
    prep = _prepare(tiny, tmp_path, **options)
    assert prep.manifest["prompt"]["allow_reference_in_prompt"] is False
    assert prep.manifest["prompt"]["fewshot"]["ids"] == [1]


def test_a_label_task_uses_few_shot_examples_that_show_its_labels(tiny, tmp_path):
    """Labels (short references of examples with different sources) may be few-shot targets; an
    answer of one example may not (docs/causal.md#labels)."""
    data = tmp_path / "sst.jsonl"
    rows = [("a joy to watch", "positive"), ("dull and long", "negative"), ("I loved it", "positive"),
            ("a waste of time", "negative"), ("it was fine", "neutral")]
    data.write_text("".join(json.dumps({"id": f"r{i}", "source": s, "target": t}) + "\n"
                            for i, (s, t) in enumerate(rows)))
    shots = tmp_path / "train.jsonl"
    shots.write_text(json.dumps({"id": "t1", "source": "great fun", "target": "Positive"}) + "\n" +
                     json.dumps({"id": "t2", "source": "so boring", "target": "negative\u200b"}) + "\n")
    options = {"data_dir": str(data), "prompt_template": "Review: {source}\nSentiment:", "num_fewshot": 2,
               "fewshot_file": str(shots)}
    assert sorted(_prepare(tiny, tmp_path, **options).manifest["prompt"]["fewshot"]["ids"]) == ["t1", "t2"]
    shots.write_text(json.dumps({"id": "t3", "source": "not bad", "target": "NEUTRAL"}) + "\n")
    with pytest.raises(ConfigError, match="few-shot example id 't3' shows in its target the reference of evaluated "
                                          "example id 'r4' of .*; not a label: the reference of evaluated examples "
                                          "with one source"):
        _prepare(tiny, tmp_path, **{**options, "num_fewshot": 1})


def test_evaluate_refuses_a_template_that_shows_the_references(tiny, tmp_path):
    import seq2seq_eval

    with pytest.raises(ConfigError, match=r"--prompt_template names \{target\}, which is the reference column "):
        seq2seq_eval.evaluate(str(tiny["llama"]), sources=["dog", "cat"], references=["Hund", "Katze"],
                              save_dir=str(tmp_path / "o"), prompt_template="{source} => {target}")


def test_the_dry_run_refuses_references_in_prompts_before_any_work(tiny, leak_data, tmp_path):
    from seq2seq_eval.run.runner import run

    save = tmp_path / "out"
    for options in ({"prompt_template": "{source} => {target}", "apply_chat_template": True},
                    {"num_fewshot": 1, "fewshot_file": str(leak_data)}):
        with pytest.raises(ConfigError, match="allow_reference_in_prompt"):
            run(EvalConfig(model_name=str(tiny["llama"]), data_dir=str(leak_data), save_dir=str(save), dry_run=True,
                           device="cpu", **options))
        assert not save.exists() and not Path(f"{save}_tmp").exists()


def test_generates_default_length_is_what_the_refusal_says(tiny):
    """With no length setting, transformers' generate() gives at most 20 new tokens after the
    padded prompts, fewer where that passes max_position_embeddings: the short prompt of a batch
    with a long one gets fewer, as the refusal of such a run says."""
    import warnings

    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny["llama"]).eval()
    model.generation_config = GenerationConfig()  # nothing set: generate()'s own defaults
    gc = GenerationConfig(do_sample=False, pad_token_id=2, eos_token_id=None)  # no end: runs to the limit
    ids, mask = torch.full((2, 240), 9), torch.ones(2, 240, dtype=torch.long)
    ids[0, :235], mask[0, :235] = 2, 0  # a 5-token prompt, left-padded beside a 240-token one
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = model.generate(input_ids=ids[:1, 235:], attention_mask=mask[:1, 235:], generation_config=gc)
        batch = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
    assert alone.shape[1] - 5 == 20 and batch.shape[1] - 240 == 256 - 240


def test_shell_text_newlines():
    assert unescape(r"Q: {source}\nA:") == "Q: {source}\nA:"
    assert unescape(r"a\tb\\nc\frac") == "a\tb\\nc\\frac"  # \\ is a backslash; other escapes stay


def test_prompt_options_are_refused_for_an_encoder_decoder(tmp_path):
    from seq2seq_eval.run.runner import run

    with pytest.raises(ConfigError, match="^--apply_chat_template is for decoder-only models; .* is an encoder-decoder"):
        run(EvalConfig(apply_chat_template=True, dry_run=True, save_dir=str(tmp_path / "a")))


@pytest.mark.parametrize("options, message", [
    ({"system_instruction": "x"}, "--system_instruction needs --apply_chat_template"),
    ({"num_fewshot": 2}, "--num_fewshot 2 needs --fewshot_file"),
    ({"fewshot_file": "f.jsonl"}, "--fewshot_file needs --num_fewshot K > 0"),
    ({"truncate_prompt": "right"}, "--truncate_prompt must be left (or left out), got 'right'"),
])
def test_prompt_options_that_need_another(options, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        EvalConfig(**options)


# ---------------------------------------------------------------- generation


def _one_at_a_time(setup: Setup, prompts, **extra):
    """The plain loop: each prompt alone (no padding), model.generate(), the continuation decoded
    without special tokens; with several candidates, generate()'s sequence scores too."""
    model, gc = _model(Path(setup.cfg.model_name)), copy.deepcopy(setup.gc)
    gc.stop_strings = None
    gc.return_dict_in_generate, gc.output_scores = True, True
    k = int(gc.num_return_sequences or 1)
    texts, scores = [], []
    for ids in prompts:
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 generation_config=gc, **extra)
        cont = out.sequences[:, len(ids):].tolist()
        texts.append([setup.tokenizer.decode(c, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()
                      for c in cont])
        scores.append(out.sequences_scores.tolist() if k > 1 else None)
    return texts, scores


def _flat(rows):
    return [x for row in rows for x in row]


@pytest.mark.parametrize("name, options", [
    ("llama", {}),
    ("llama", {"num_beams": 3, "num_return_sequences": 2}),
    ("llama", {"repetition_penalty": 1.3, "max_new_tokens": 20}),
    ("qwen2", {"apply_chat_template": True}),
    ("qwen2", {"apply_chat_template": True, "num_beams": 3, "num_return_sequences": 3, "length_penalty": 0.5}),
    ("qwen2", {"no_repeat_ngram_size": 2, "num_beams": 2, "max_new_tokens": 20}),
])
def test_left_padded_batches_give_the_one_prompt_at_a_time_loop(tiny, name, options):
    s = Setup(tiny[name], **options)
    prompts = s.ids()
    assert len({len(p) for p in prompts}) > 3  # the batch is padded, differently per row
    out = _engine(s).generate(prompts, 0)
    texts, scores = _one_at_a_time(s, prompts)
    assert out.preds == texts
    assert any(len(set(t)) > 1 for t in texts) or len(texts[0]) == 1
    if scores[0] is None:
        assert out.scores is None
    else:  # the continuation's log-probability over its length^length_penalty, as generate() gives it
        assert _flat(out.scores) == pytest.approx(_flat(scores), rel=1e-4, abs=1e-5)


def before_stop(text: str, listed: list[str]) -> str:
    """`text` before its first stop string: what a prediction must be."""
    at = stops.first_stop(text, listed)
    return text if at < 0 else text[:at]


def test_greedy_stop_strings_stop_where_generates_criterion_stops_even_across_tokens(tiny):
    """On a SentencePiece-like tokenizer (word marks, no bytes): the candidates of generate() given
    the same stop strings, one prompt at a time, each text cut before its first stop string; a
    stop string within one token, one spanning two (in a list), and one never generated."""
    free = Setup(tiny["llama"], max_new_tokens=30)
    prompts = free.ids()
    base = _engine(free).generate(prompts, 0)
    words = [p[0].split() for p in base.preds]
    # A stop string that spans two tokens: the end of one word and the start of the next.
    two = next(f"{w[0][-1]} {w[1][0]}" for w in words if len(w) > 1)
    one = next(w[2] for w in words if len(w) > 2)
    for stop_strings in (one, [two, "zz"], "never in any text"):
        s = Setup(tiny["llama"], max_new_tokens=30, stop_strings=stop_strings)
        out = _engine(s).generate(prompts, 0)
        listed = [stop_strings] if isinstance(stop_strings, str) else stop_strings
        texts, _ = _one_at_a_time(s, prompts, stop_strings=stop_strings, tokenizer=s.tokenizer)
        assert out.preds == [[before_stop(t, listed).strip() for t in c] for c in texts], stop_strings
        stopped = [i for i, (n, m) in enumerate(zip(out.n_tokens, base.n_tokens)) if n < m]
        assert bool(stopped) == (stop_strings != "never in any text")
    rows = [s.tokenizer.convert_ids_to_tokens(t) for t in s.tokenizer([p[0] for p in base.preds],
                                                                        add_special_tokens=False)["input_ids"]]
    assert not any(two in t.replace("▁", " ") for r in rows for t in r)  # no single token holds it


def test_inside_beam_search_each_hypothesis_stops_at_its_own_first_stop_string(tiny):
    """generate()'s beam search with transformers' own StopStringCriteria (one prompt at a time)
    stops each hypothesis where the engine's does: the same candidates, cut before the stop
    string, with the same scores."""
    beams = {"max_new_tokens": 24, "num_beams": 4, "num_return_sequences": 4}
    free = Setup(tiny["llama"], **beams)
    candidates = _engine(free).generate(free.ids(), 0).preds
    # A word some hypotheses of an example hold and others do not, in as many examples as any.
    words = sorted({w for c in candidates for t in c for w in t.split()})
    stop = max(words, key=lambda w: sum(any(w in t for t in c) and not all(w in t for t in c) for c in candidates))
    s = Setup(tiny["llama"], stop_strings=stop, **beams)
    prompts = s.ids()
    out = _engine(s).generate(prompts, 0)
    texts, scores = _one_at_a_time(s, prompts, stop_strings=stop, tokenizer=s.tokenizer)
    assert out.preds == [[before_stop(t, [stop]).strip() for t in c] for c in texts]
    assert _flat(out.scores) == pytest.approx(_flat(scores), rel=1e-4, abs=1e-5)
    stopped = sum(stop in t for c in texts for t in c)
    assert 0 < stopped < sum(len(c) for c in texts)  # some hypotheses stopped, others ran on


def test_stop_strings_on_an_encoder_decoder_model():
    import torch as _torch

    cfg = EvalConfig(generate_kwargs=(("num_beams", 1),))
    tok = settings.load_tokenizer(cfg)
    model_config, base = settings.load_model_config(cfg)
    model = settings.load_model(cfg, _torch.device("cpu"))
    sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:8]
    ids, _ = settings.encode_sources(tok, sources, "translate: ", 1024)
    gc = settings.generation_config_for(model_config, base, tok, cfg)
    free = HFEngine(model, tok, gc, _torch.device("cpu")).generate(ids, 0)
    cfg = EvalConfig(generate_kwargs=(("num_beams", 1), ("stop_strings", ",")))
    gc = settings.generation_config_for(model_config, base, tok, cfg)
    out = HFEngine(model, tok, gc, _torch.device("cpu")).generate(ids, 0)
    assert sum("," in p[0] for p in free.preds) >= 2
    assert out.preds == [[p[0].split(",")[0].strip()] for p in free.preds]


# ---------------------------------------------------------------- whole runs


def _refused_before_any_work(proc, save: Path, start: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and lines[-1].startswith(f"seq2seq_eval: error: {start}"), proc.stderr[-3000:]
    assert not save.exists() and not Path(f"{save}_tmp").exists()  # no output, no journal, nothing left


@pytest.mark.parametrize("case, extra, start", [
    ("doubled BOS", ["--prompt_template", "<s>{source}"], "--prompt_template '<s>{source}': the prompt starts with "
                                                           "the BOS token '<s>' twice"),
    ("too long", ["--max_new_tokens", "250"], "{data}: example id 1: its prompt is {n} tokens, more than the 6 that "
                                              "fit (the model's 256 positions less --max_new_tokens 250)"),
    ("broken chat template", ["--apply_chat_template", "--system_instruction", "x"],
     "--apply_chat_template: the chat template of {broken} fails (TemplateError: System role not supported)"),
])
def test_refused_in_one_line_before_any_work_dry_run_included(tiny, tmp_path, case, extra, start):
    import shutil

    data = write_legacy(tmp_path / "data", ["dog", "the small dog runs fast on a big red mat"], ["a", "b"])
    broken = tmp_path / "broken"
    shutil.copytree(tiny["llama"], broken)
    (broken / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}")
    model = broken if case == "broken chat template" else tiny["llama"]
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(tiny["llama"])("the small dog runs fast on a big red mat")["input_ids"])
    start = start.replace("{data}", str(data)).replace("{broken}", str(broken)).replace("{n}", str(n))
    for dry in ([], ["--dry_run"]):
        save = tmp_path / f"out{len(dry)}"
        args = ["--model_name", str(model), "--data_dir", str(data), "--save_dir", str(save), *extra, *dry]
        _refused_before_any_work(single(args, cwd=tmp_path), save, start)


def test_the_dry_run_shows_the_prompts_and_how_many_were_truncated(tiny, tmp_path):
    data = write_legacy(tmp_path / "data", ["dog", "the small dog runs fast on a big red mat"], ["a", "b"])
    proc = single(["--model_name", str(tiny["llama"]), "--data_dir", str(data), "--max_new_tokens", "250",
                   "--truncate_prompt", "left", "--prompt_template", r"Q: {source}\nA:", "--dry_run", "--device", "cpu"],
                  cwd=tmp_path)
    assert_ok(proc)
    assert ("prompts of more than 6 tokens (the model's 256 positions less --max_new_tokens 250) are truncated on "
            "the left: 2 truncated") in proc.stdout
    # A decoder-only model's default budget on CPU, greedy (run/plan.py's CAUSAL_MAX_TOKENS).
    assert "(--max_tokens 4096: the device's default)" in proc.stdout
    shown = json.loads(proc.stdout.split("prompts: ", 1)[1].splitlines()[0])
    assert shown["template"] == "Q: {source}\nA:" and shown["truncate_prompt"] == "left"


# 96 examples in batches of 2, each decoding 20 new tokens with 2 beams and 2 candidates, the
# prompts through the chat template with 2 few-shot examples: pseudolabels with scores.
RUN = ["--bs", "2", "--min_new_tokens", "20", "--max_new_tokens", "20", "--num_beams", "2",
       "--num_return_sequences", "2", "--apply_chat_template", "--num_fewshot", "2"]
PSEUDO = ("test_generations.txt", "pseudolabel_results.json", "test_pseudolabels.jsonl")
N_BATCHES = 48


@pytest.fixture(scope="module")
def pseudo(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("causal_runs")
    src, tgt = make_corpus(96, seed=11)
    data = write_legacy(root / "data", src, tgt)
    shots = root / "shots.jsonl"
    shots.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in zip(*make_corpus(5, seed=3))))
    args = ["--model_name", str(tiny["llama"]), "--data_dir", str(data), "--fewshot_file", str(shots), *RUN]
    reference = root / "reference"
    assert_ok(single(args + ["--save_dir", str(reference)], cwd=root))
    return root, args, reference


def _same_files(save: Path, reference: Path) -> None:
    for name in PSEUDO:
        assert (save / name).read_bytes() == (reference / name).read_bytes(), name


def test_pseudolabels_have_n_candidates_with_scores_and_record_the_prompts(pseudo):
    root, args, reference = pseudo
    rows = [json.loads(line) for line in (reference / "test_pseudolabels.jsonl").read_text().splitlines()]
    assert len(rows) == 96 and all(len(r["candidates"]) == 2 and len(r["scores"]) == 2 for r in rows)
    assert all(r["scores"][0] >= r["scores"][1] for r in rows)  # best first
    info = json.loads((reference / "test_run_info.json").read_text())
    prompt = info["provenance"]["prompt"]
    assert prompt["template"] == "{source}" and len(prompt["chat_template_sha256"]) == 64
    assert prompt["fewshot"]["ids"] and prompt["special_tokens"] == "written by the chat template"
    assert info["provenance"]["generation"]["max_new_tokens"] == 20


@pytest.mark.parametrize("ranks", [2, 3])
def test_two_and_three_ranks_write_the_same_bytes(pseudo, tmp_path, ranks):
    root, args, reference = pseudo
    assert_ok(run_ranks(ranks, args + ["--save_dir", str(tmp_path / "out")], cwd=tmp_path))
    _same_files(tmp_path / "out", reference)


def test_killed_rank_after_stealing_then_resume_generates_each_batch_once(pseudo, tmp_path):
    """A slowed rank: the other takes batches from its share; then it is killed; the resumed run
    reuses every journaled batch and writes the bytes of one undisturbed process."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid
    from collections import Counter

    from conftest import _env
    from faults import Throttle, find_worker, stop_all, wait_for_lines

    root, args, reference = pseudo
    save, tag = tmp_path / "out", uuid.uuid4().hex
    tmp = Path(f"{save}_tmp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "seq2seq_eval", *args, "--save_dir", str(save)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env({"S2S_TEST_TAG": tag}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    throttle = None
    try:
        pid = find_worker(tag, 1)
        wait_for_lines(tmp / "journal_rank_1.jsonl", 0)
        throttle = Throttle(pid)
        throttle.start()
        deadline, journal0 = time.monotonic() + 120, tmp / "journal_rank_0.jsonl"
        while not (journal0.exists() and b'"from_rank"' in journal0.read_bytes()):  # rank 0 has taken work
            assert time.monotonic() < deadline and proc.poll() is None, "rank 0 never took a batch"
            time.sleep(0.02)
        throttle.finish()
        throttle = None
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "--resume" in err, err[-3000:]
    finally:
        stop_all(proc, throttle)

    def finished() -> Counter:
        seen: Counter = Counter()
        for path in tmp.glob("journal_rank_*.jsonl"):
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if "records" in entry and "part" not in entry:
                    seen[entry["batch"]] += 1
        return seen

    before = finished()
    assert 0 < len(before) < N_BATCHES and set(before.values()) == {1}
    assert_ok(run_ranks(2, args + ["--save_dir", str(save), "--resume", "--debug"], cwd=tmp_path))
    assert finished() == {i: 1 for i in range(N_BATCHES)}
    _same_files(save, reference)


def test_evaluate_takes_a_decoder_only_model_object_and_leaves_it_as_it_was(tiny, tmp_path):
    import seq2seq_eval
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny["qwen2"]).train()
    model.config.architectures = None  # as a model built in a training job: its class says what it is
    own = model.generation_config.to_dict()
    tokenizer = AutoTokenizer.from_pretrained(tiny["qwen2"])
    result = seq2seq_eval.evaluate(model, tokenizer, sources=SOURCES, references=SOURCES, save_dir=str(tmp_path / "o"),
                                   apply_chat_template=True, max_new_tokens=8, num_beams=2, return_examples=True)
    s = Setup(tiny["qwen2"], apply_chat_template=True, max_new_tokens=8, num_beams=2)
    texts, _ = _one_at_a_time(s, s.ids())
    assert [e["prediction"] for e in result.examples] == [t[0] for t in texts]
    assert result.metrics["provenance"]["prompt"]["special_tokens"] == "written by the chat template"
    assert model.training and model.generation_config.to_dict() == own and model.config.architectures is None


def test_a_tokenizer_that_ends_every_prompt_with_its_end_token_is_refused(tiny, tmp_path):
    import shutil

    eos_added = tmp_path / "eos_added"
    shutil.copytree(tiny["llama"], eos_added)
    spec = json.loads((eos_added / "tokenizer.json").read_text())
    spec["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}})
    spec["post_processor"]["special_tokens"]["</s>"] = {"id": "</s>", "ids": [2], "tokens": ["</s>"]}
    (eos_added / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match=r"^--prompt_template '\{source\}': the tokenizer of .*eos_added adds the end "
                                          r"token '</s>' after every prompt"):
        Setup(eos_added)
    assert Setup(eos_added, apply_chat_template=True).ids(["dog"])[0][-1] != 2  # the template decides


# ---------------------------------------------------------------- the embedded demo

DEMO = EMBEDDED_MODEL.parent / "causal_model"


def test_the_embedded_demo_scores_and_its_chat_and_plain_prompts_are_the_same_ids(tmp_path):
    """The documented command on the first 40 examples (the whole set scores BLEU 98.22:
    data_samples/README.md): a meaningful score, the outputs of a one-prompt-at-a-time loop, and
    `--prompt_template '{source}\\n'` gives the chat template's ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    size = sum(f.stat().st_size for f in DEMO.iterdir() if f.is_file())
    assert size <= 10 * 1024 * 1024, f"the demo is {size / 2**20:.1f} MiB; expected at most 10 MiB"
    readme = (DEMO.parent / "README.md").read_text(encoding="utf-8").split("## The causal model")[1]
    entries = json.loads((DEMO / "config.json").read_text())["task_specific_params"]
    for task, entry in entries.items():  # the README quotes them exactly
        quoted = next(line for line in readme.splitlines() if line.strip().startswith(f'"{task}":'))
        assert json.loads("{" + quoted.strip() + "}")[task] == entry
    save = tmp_path / "out"
    assert_ok(single(["--model_name", str(DEMO), "--apply_chat_template", "--n_obs", "40", "--save_dir", str(save)],
                     cwd=tmp_path))
    assert json.loads((save / "test_bleu.json").read_text())["bleu"] >= 90
    sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:40]
    chat = Setup(DEMO, apply_chat_template=True)
    assert chat.ids(sources) == Setup(DEMO, prompt_template="{source}\n").ids(sources)
    model, tok = AutoModelForCausalLM.from_pretrained(DEMO).eval(), AutoTokenizer.from_pretrained(DEMO)
    params = {k: v for k, v in model.config.task_specific_params["translation"].items() if k != "prefix"}
    generated = (save / "test_generations.txt").read_text().splitlines()
    for source, prediction in list(zip(sources, generated))[:6]:
        ids = tok.apply_chat_template([{"role": "user", "content": "translate: " + source}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), **params)
        assert tok.decode(out[0, len(ids):], skip_special_tokens=True).strip() == prediction
