"""A zoo of config-faithful tiny models: eight published checkpoints as people run them.

For each checkpoint, tests/zoo.py builds a tiny random model from the values below (sizes
shrunk, everything else as published), and the tests check:

  - the effective generation settings and source prefix, from --dry_run and from the run's
    provenance, equal what the legacy run_eval.py would use: the model's generation config, then
    `use_task_specific_params(model, task)` (which applies task_specific_params[task] only when
    that exact key exists: examples/legacy/seq2seq/utils.py in huggingface/transformers), then the
    command line's generate options, with the prefix from that entry or the config
    (examples/legacy/seq2seq/run_eval.py: `prefix = getattr(model.config, "prefix", "") or ""`);
    the expected values are computed here from the published dicts, not by seq2seq_eval;
  - a 2-rank run gives the same generations (and scores) as a 1-rank run.

Published values and their sources (GitHub repository, path, commit) are given next to each
checkpoint. The hub repositories themselves are not on GitHub; the sources are copies of their
files vendored in public repositories, and transformers' own conversion scripts. Values that
could not be found are marked "NOT FOUND" with what stands in for them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import make_corpus, run_ranks, single, write_legacy

import zoo
from zoo import Published

T5_TASK_PARAMS = {
    "summarization": {"early_stopping": True, "length_penalty": 2.0, "max_length": 200, "min_length": 30,
                      "no_repeat_ngram_size": 3, "num_beams": 4, "prefix": "summarize: "},
    "translation_en_to_de": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                             "prefix": "translate English to German: "},
    "translation_en_to_fr": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                             "prefix": "translate English to French: "},
    "translation_en_to_ro": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                             "prefix": "translate English to Romanian: "},
}

ZOO = {
    # google-t5/t5-small. config.json: vijayanandraj/onebillionrow_greencoding t5-small/config.json
    # @16afc6a24e817af641cffcb42baadada2c38ef88 (rsc1102/RVV-DL-Final-Project t5-small/config.json
    # @4057320f has the same values except a resized vocab_size). generation_config.json and
    # tokenizer_config.json (T5Tokenizer, model_max_length 512): rsc1102/RVV-DL-Final-Project
    # t5-small/{generation_config,tokenizer_config}.json @199bbb0ac6243df21897a3d5a0bee7dc9f4fa317.
    "t5-small": Published(
        hub_id="google-t5/t5-small", architecture="T5ForConditionalGeneration",
        config=dict(
            model_type="t5", architectures=["T5ForConditionalGeneration"], d_ff=2048, d_kv=64, d_model=512,
            decoder_start_token_id=0, dense_act_fn="relu", dropout_rate=0.1, eos_token_id=1,
            feed_forward_proj="relu", initializer_factor=1.0, is_encoder_decoder=True, is_gated_act=False,
            layer_norm_epsilon=1e-06, n_positions=512, num_decoder_layers=6, num_heads=8, num_layers=6,
            output_past=True, pad_token_id=0, relative_attention_max_distance=128,
            relative_attention_num_buckets=32, task_specific_params=T5_TASK_PARAMS, use_cache=True,
            vocab_size=32128,
        ),
        generation_config={"_from_model_config": True, "decoder_start_token_id": 0, "eos_token_id": 1,
                           "pad_token_id": 0},
        tokenizer="t5", tokenizer_class="T5Tokenizer", tokenizer_kwargs={"model_max_length": 512},
    ),
    # google/flan-t5-small. config.json: jitendra-789/Adobe_Round_1b models/flan-t5-small/config.json
    # @cd4b97c05ad65a3f946960a03744c7cbe4066ff0 (it ships T5's task_specific_params unchanged).
    # Tokenizer: T5 (tokenizer_config eos </s>, pad <pad>, unk <unk>; files spiece.model,
    # tokenizer.json), from the hub API record in daniel-p-green/alain-ai-learning-platform
    # out/research-google-flan-t5-small/sources/huggingface/model.json @522537bc.
    # NOT FOUND: generation_config.json (the hub has one; no copy in the index) -> transformers'
    # derivation from config.json stands in (decoder_start 0, eos 1, pad 0; from memory the hub
    # file holds the same three ids). NOT FOUND: model_max_length (512 from memory).
    "flan-t5-small": Published(
        hub_id="google/flan-t5-small", architecture="T5ForConditionalGeneration",
        config=dict(
            model_type="t5", architectures=["T5ForConditionalGeneration"], classifier_dropout=0.0, d_ff=1024,
            d_kv=64, d_model=512, decoder_start_token_id=0, dense_act_fn="gelu_new", dropout_rate=0.1,
            eos_token_id=1, feed_forward_proj="gated-gelu", initializer_factor=1.0, is_encoder_decoder=True,
            is_gated_act=True, layer_norm_epsilon=1e-06, n_positions=512, num_decoder_layers=8, num_heads=6,
            num_layers=8, output_past=True, pad_token_id=0, relative_attention_max_distance=128,
            relative_attention_num_buckets=32, task_specific_params=T5_TASK_PARAMS, tie_word_embeddings=False,
            use_cache=True, vocab_size=32128,
        ),
        generation_config=None,
        tokenizer="t5", tokenizer_class="T5Tokenizer", tokenizer_kwargs={"model_max_length": 512},
    ),
    # facebook/bart-large-cnn. config.json: balaji-munusamy/speech-summarizer
    # models/bart-large-cnn/config.json @1b92109df1ebb2dea2bd4def9200949cdf05083d (same
    # task_specific_params in Praneeth2002/finetuning-LLM-for-summarization facebook/bart-large-cnn/
    # config.json @255796533e). generation_config.json: Praneeth2002/finetuning-LLM-for-summarization
    # facebook/bart-large-cnn/generation_config.json @4d0a6cfc0c102f24e1d1edd000062aed4d0efbee.
    # Tokenizer: BartTokenizer (model_type bart, no tokenizer_class in config.json).
    # NOT FOUND: model_max_length (1024 from memory; equal to max_position_embeddings).
    "bart-large-cnn": Published(
        hub_id="facebook/bart-large-cnn", architecture="BartForConditionalGeneration",
        config=dict(
            model_type="bart", architectures=["BartForConditionalGeneration"], activation_dropout=0.0,
            activation_function="gelu", add_final_layer_norm=False, attention_dropout=0.0, bos_token_id=0,
            classif_dropout=0.0, classifier_dropout=0.0, d_model=1024, decoder_attention_heads=16,
            decoder_ffn_dim=4096, decoder_layerdrop=0.0, decoder_layers=12, decoder_start_token_id=2,
            dropout=0.1, early_stopping=True, encoder_attention_heads=16, encoder_ffn_dim=4096,
            encoder_layerdrop=0.0, encoder_layers=12, eos_token_id=2, force_bos_token_to_be_generated=True,
            forced_bos_token_id=0, forced_eos_token_id=2, init_std=0.02, is_encoder_decoder=True,
            length_penalty=2.0, max_length=142, max_position_embeddings=1024, min_length=56,
            no_repeat_ngram_size=3, normalize_before=False, num_beams=4, num_hidden_layers=12, output_past=True,
            pad_token_id=1, prefix=" ", scale_embedding=False,
            task_specific_params={"summarization": {"early_stopping": True, "length_penalty": 2.0, "max_length": 142,
                                                    "min_length": 56, "no_repeat_ngram_size": 3, "num_beams": 4}},
            use_cache=True, vocab_size=50264,
        ),
        generation_config={"_from_model_config": True, "bos_token_id": 0, "decoder_start_token_id": 2,
                           "early_stopping": True, "eos_token_id": 2, "forced_bos_token_id": 0,
                           "forced_eos_token_id": 2, "length_penalty": 2.0, "max_length": 142, "min_length": 56,
                           "no_repeat_ngram_size": 3, "num_beams": 4, "pad_token_id": 1},
        tokenizer="bart", tokenizer_class="BartTokenizer", tokenizer_kwargs={"model_max_length": 1024},
    ),
    # google/pegasus-xsum. NOT FOUND: no copy of its config.json or generation_config.json in the
    # index. What stands in: transformers' conversion recipe, huggingface/transformers
    # src/transformers/models/pegasus/convert_pegasus_tf_to_pytorch.py @15ea02a2 with the DEFAULTS
    # and task_specific_params["summarization_xsum"] of the matching configuration_pegasus.py
    # (vocab 96103, pad 0, eos 1, num_beams 8, relu, sinusoidal positions, normalize_before,
    # scale_embedding; length_penalty 0.6, max_length 64, max_position_embeddings 512, and the
    # tokenizer's model_max_length 512; fine-tuned checkpoints get no task_specific_params, only
    # pegasus-large does). From memory, to be checked against the hub: decoder_start_token_id 0,
    # forced_eos_token_id 1, and that the hub's generation_config.json repeats num_beams 8,
    # length_penalty 0.6, max_length 64. Tokenizer: PegasusTokenizer (<pad> 0, </s> 1, <unk> 105).
    "pegasus-xsum": Published(
        hub_id="google/pegasus-xsum", architecture="PegasusForConditionalGeneration",
        config=dict(
            model_type="pegasus", architectures=["PegasusForConditionalGeneration"], activation_dropout=0.1,
            activation_function="relu", attention_dropout=0.1, d_model=1024, decoder_attention_heads=16,
            decoder_ffn_dim=4096, decoder_layers=16, decoder_start_token_id=0, dropout=0.1,
            encoder_attention_heads=16, encoder_ffn_dim=4096, encoder_layers=16, eos_token_id=1,
            forced_eos_token_id=1, is_encoder_decoder=True, length_penalty=0.6, max_length=64,
            max_position_embeddings=512, normalize_before=True, num_beams=8, pad_token_id=0, scale_embedding=True,
            static_position_embeddings=True, vocab_size=96103,
        ),
        generation_config={"decoder_start_token_id": 0, "eos_token_id": 1, "forced_eos_token_id": 1,
                           "length_penalty": 0.6, "max_length": 64, "num_beams": 8, "pad_token_id": 0},
        tokenizer="pegasus", tokenizer_class="PegasusTokenizer", tokenizer_kwargs={"model_max_length": 512},
    ),
    # Helsinki-NLP/opus-mt-en-de. config.json and tokenizer_config.json: the copies quoted in
    # harisnae/multilingual-translator-offline README.md @79dec573de3a30f8b16b1481efd8cd4c9f459f62
    # ("taken from the English -> German model"); forced_eos_token_id = eos and the pad/
    # decoder_start/bad_words_ids rule from huggingface/transformers
    # src/transformers/models/marian/convert_marian_to_pytorch.py @02c4e2b5. No task_specific_params.
    # NOT FOUND: generation_config.json -> transformers' derivation from config.json stands in
    # (from memory the hub file also sets renormalize_logits true, not reproduced here).
    "opus-mt-en-de": Published(
        hub_id="Helsinki-NLP/opus-mt-en-de", architecture="MarianMTModel",
        config=dict(
            model_type="marian", architectures=["MarianMTModel"], activation_dropout=0.0,
            activation_function="swish", attention_dropout=0.0, bad_words_ids=[[58100]], bos_token_id=0,
            d_model=512, decoder_attention_heads=8, decoder_ffn_dim=2048, decoder_layers=6,
            decoder_start_token_id=58100, decoder_vocab_size=58101, dropout=0.1, encoder_attention_heads=8,
            encoder_ffn_dim=2048, encoder_layers=6, eos_token_id=0, forced_eos_token_id=0, is_encoder_decoder=True,
            max_length=512, max_position_embeddings=512, num_beams=4, pad_token_id=58100, scale_embedding=True,
            share_encoder_decoder_embeddings=True, use_cache=True, vocab_size=58101,
        ),
        generation_config=None,
        tokenizer="marian", tokenizer_class="MarianTokenizer",
        tokenizer_kwargs={"source_lang": "en", "target_lang": "de", "model_max_length": 512},
    ),
    # facebook/mbart-large-50-many-to-many-mmt. config.json, generation_config.json and
    # tokenizer_config.json: wusongbai139/AnyCaption mbart-large-50-many-to-many-mmt/
    # @0d7525416d9bd196ff7154ee23995414b6025b91 (config.json's tokenizer_class MBart50Tokenizer).
    # NOT FOUND: model_max_length (1024 from memory).
    "mbart-large-50-many-to-many-mmt": Published(
        hub_id="facebook/mbart-large-50-many-to-many-mmt", architecture="MBartForConditionalGeneration",
        config=dict(
            model_type="mbart", architectures=["MBartForConditionalGeneration"], activation_dropout=0.0,
            activation_function="relu", add_final_layer_norm=True, attention_dropout=0.0, bos_token_id=0,
            classifier_dropout=0.0, d_model=1024, decoder_attention_heads=16, decoder_ffn_dim=4096,
            decoder_layers=12, decoder_start_token_id=2, dropout=0.1, early_stopping=True, encoder_attention_heads=16,
            encoder_ffn_dim=4096, encoder_layers=12, eos_token_id=2, forced_eos_token_id=2, init_std=0.02,
            is_encoder_decoder=True, max_length=200, max_position_embeddings=1024, normalize_before=True,
            normalize_embedding=True, num_beams=5, num_hidden_layers=12, output_past=True, pad_token_id=1,
            scale_embedding=True, static_position_embeddings=False, tokenizer_class="MBart50Tokenizer",
            use_cache=True, vocab_size=250054,
        ),
        generation_config={"_from_model_config": True, "bos_token_id": 0, "decoder_start_token_id": 2,
                           "early_stopping": True, "eos_token_id": 2, "forced_eos_token_id": 2, "max_length": 200,
                           "num_beams": 5, "pad_token_id": 1},
        tokenizer="mbart50", tokenizer_class="MBart50Tokenizer", tokenizer_kwargs={"model_max_length": 1024},
    ),
    # facebook/nllb-200-distilled-600M. config.json: NguyenThanh26/DATN
    # models/nllb-200-distilled-600M/config.json @b3699622f94016b71ba30437ef0b13bc6fb29047 (same
    # values in Higasa-Yumetaka/PyVoiceTranslate nllb-200-distilled-600M/config.json @27096a00).
    # generation_config.json: Higasa-Yumetaka/PyVoiceTranslate nllb-200-distilled-600M/
    # generation_config.json @27096a0090c4c2254b5dbdde28c4f461754abae5 (no num_beams: greedy).
    # NOT FOUND: model_max_length (1024 from memory).
    "nllb-200-distilled-600M": Published(
        hub_id="facebook/nllb-200-distilled-600M", architecture="M2M100ForConditionalGeneration",
        config=dict(
            model_type="m2m_100", architectures=["M2M100ForConditionalGeneration"], activation_dropout=0.0,
            activation_function="relu", attention_dropout=0.1, bos_token_id=0, d_model=1024,
            decoder_attention_heads=16, decoder_ffn_dim=4096, decoder_layerdrop=0, decoder_layers=12,
            decoder_start_token_id=2, dropout=0.1, encoder_attention_heads=16, encoder_ffn_dim=4096,
            encoder_layerdrop=0, encoder_layers=12, eos_token_id=2, init_std=0.02, is_encoder_decoder=True,
            max_length=200, max_position_embeddings=1024, num_hidden_layers=12, pad_token_id=1,
            scale_embedding=True, tokenizer_class="NllbTokenizer", use_cache=True, vocab_size=256206,
        ),
        generation_config={"_from_model_config": True, "bos_token_id": 0, "decoder_start_token_id": 2,
                           "eos_token_id": 2, "max_length": 200, "pad_token_id": 1},
        tokenizer="nllb", tokenizer_class="NllbTokenizer", tokenizer_kwargs={"model_max_length": 1024},
    ),
    # facebook/m2m100_418M. config.json: clap-esp/clap-ai-core models/m2m100_418M/config.json
    # @647207a426bd2b1170f33a362e8e23c46a794ed9 (same in pappricot/ScriptBuddy; both copies were
    # re-saved by a newer transformers that moved early_stopping/max_length/num_beams out of it).
    # generation_config.json: pappricot/ScriptBuddy models/m2m100_418M/generation_config.json
    # @b829c9996e6df5ebd0b03654a012abca04fe8ced. Tokenizer: M2M100Tokenizer with the __xx__
    # language tokens as special tokens (clap-esp/clap-ai-core models/m2m100_418M/
    # tokenizer_config.json @01d399c4). NOT FOUND: model_max_length (1024 from memory).
    "m2m100_418M": Published(
        hub_id="facebook/m2m100_418M", architecture="M2M100ForConditionalGeneration",
        config=dict(
            model_type="m2m_100", architectures=["M2M100ForConditionalGeneration"], activation_dropout=0.0,
            activation_function="relu", attention_dropout=0.1, bos_token_id=0, d_model=1024,
            decoder_attention_heads=16, decoder_ffn_dim=4096, decoder_layerdrop=0.05, decoder_layers=12,
            decoder_start_token_id=2, dropout=0.1, encoder_attention_heads=16, encoder_ffn_dim=4096,
            encoder_layerdrop=0.05, encoder_layers=12, eos_token_id=2, init_std=0.02, is_encoder_decoder=True,
            max_position_embeddings=1024, num_hidden_layers=12, pad_token_id=1, scale_embedding=True,
            use_cache=True, vocab_size=128112,
        ),
        generation_config={"_from_model_config": True, "bos_token_id": 0, "decoder_start_token_id": 2,
                           "early_stopping": True, "eos_token_id": 2, "max_length": 200, "num_beams": 5,
                           "pad_token_id": 1},
        tokenizer="m2m100", tokenizer_class="M2M100Tokenizer", tokenizer_kwargs={"model_max_length": 1024},
    ),
}


# ---------------------------------------------------------------- what the legacy script would use

# Settings generate() uses only with beams, or only when sampling (GenerationConfig's docs):
# with one beam and no sampling they change nothing, whatever value they carry.
BEAM_ONLY = ("early_stopping", "length_penalty", "num_beam_groups", "diversity_penalty")
SAMPLE_ONLY = ("temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def effective(settings: dict) -> dict:
    """The settings that change what generate() does: transformers' defaults left out, and the
    ones that do not apply (max_length when max_new_tokens is set, which generate() then
    ignores; beam-only settings with one beam; sampling settings without sampling)."""
    from transformers import GenerationConfig

    defaults = GenerationConfig._get_default_generation_params()
    s = {k: v for k, v in settings.items() if not k.startswith("_") and k != "transformers_version" and v is not None}
    if "max_new_tokens" in s:
        s.pop("max_length", None)
    if "min_new_tokens" in s:
        s.pop("min_length", None)
    if s.get("num_beams", 1) == 1:
        s = {k: v for k, v in s.items() if k not in BEAM_ONLY}
    if not s.get("do_sample", False):
        s = {k: v for k, v in s.items() if k not in SAMPLE_ONLY}
    return {k: v for k, v in s.items() if k not in defaults or defaults[k] != v}


def legacy_expectation(spec: Published, task: str, user: dict) -> tuple[dict, str, str | None]:
    """What run_eval.py applies: the model's generation config, then use_task_specific_params(
    model, task) = config.update(task_specific_params.get(task, {})) (the exact key only), then
    the generate kwargs of the command line; the prefix is config.prefix after that update.
    Returns the effective settings, the prefix and the entry used (None when none)."""
    from transformers import GenerationConfig

    generation_keys = set(GenerationConfig().to_dict())
    tsp = spec.config.get("task_specific_params") or {}
    entry = tsp.get(task, {})
    settings = {**spec.generation_dict(), **{k: v for k, v in entry.items() if k in generation_keys}, **user}
    prefix = entry.get("prefix", spec.config.get("prefix")) or ""
    return effective(settings), prefix, task if task in tsp else None


LANGS = {  # --src_lang/--tgt_lang for the multilingual checkpoints (English to Romanian)
    "mbart-large-50-many-to-many-mmt": ("en_XX", "ro_RO"),
    "nllb-200-distilled-600M": ("eng_Latn", "ron_Latn"),
    "m2m100_418M": ("en", "ro"),
}


def lang_args(name: str) -> list[str]:
    return ["--src_lang", LANGS[name][0], "--tgt_lang", LANGS[name][1]] if name in LANGS else []


def forced_bos(name: str, model_dir: Path) -> dict:
    """What a run_eval.py user passes for a target language: --forced_bos_token_id <its token id>."""
    if name not in LANGS:
        return {}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    code = LANGS[name][1]
    token_id = tok.get_lang_id(code) if hasattr(tok, "get_lang_id") else tok.convert_tokens_to_ids(code)
    return {"forced_bos_token_id": token_id}


# Tasks checked by --dry_run against the published settings (no generate options given).
DRY_TASKS = [
    *((m, t) for m in ("t5-small", "flan-t5-small") for t in T5_TASK_PARAMS),
    ("bart-large-cnn", "summarization"), ("bart-large-cnn", "translation"),
    ("pegasus-xsum", "summarization"),
    ("opus-mt-en-de", "translation"), ("opus-mt-en-de", "translation_en_to_de"),
    *((m, "translation") for m in LANGS),
]

# The task each model is run with at 1 and 2 ranks. The runs cap generation (--max_new_tokens,
# which replaces the published max_length of up to 512: random weights rarely stop early) and
# --min_new_tokens (which replaces T5's and BART-CNN's min_length 30/56).
RUN_TASKS = {
    "t5-small": "translation_en_to_fr", "flan-t5-small": "summarization", "bart-large-cnn": "summarization",
    "pegasus-xsum": "summarization", "opus-mt-en-de": "translation", "mbart-large-50-many-to-many-mmt": "translation",
    "nllb-200-distilled-600M": "translation", "m2m100_418M": "translation",
}
# --renormalize_logits true: in beam search CTranslate2 masks tokens (the minimum length, BART-CNN's
# no_repeat_ngram_size) as generate() does only with it (engines/ct2_rules.py).
RUN_OPTIONS = {"max_new_tokens": 6, "min_new_tokens": 1, "renormalize_logits": True}
RUN_ARGS = ["--max_new_tokens", "6", "--min_new_tokens", "1", "--renormalize_logits", "true", "--bs", "2",
            "--device", "cpu"]
# Beam search that stops as CTranslate2's does, for the checkpoints whose published settings leave
# early_stopping unset (generate()'s False): CTranslate2 refuses them as published (tested below).
STOPPING = {"pegasus-xsum": {"early_stopping": True}, "opus-mt-en-de": {"early_stopping": True}}


def run_options(name: str) -> dict:
    return {**RUN_OPTIONS, **STOPPING.get(name, {})}


def run_args(name: str) -> list[str]:
    return [*RUN_ARGS, *(a for k, v in STOPPING.get(name, {}).items() for a in (f"--{k}", str(v).lower()))]
# Every model runs on each engine installed: CTranslate2 converts all eight families.
ENGINES = ("hf", "ctranslate2") if importlib.util.find_spec("ctranslate2") else ("hf",)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def zoo_models(tmp_path_factory) -> dict[str, Path]:
    if not zoo.SPM.exists():
        pytest.skip(f"{zoo.SPM} not available (../shared/realdata): the sentencepiece tokenizers need it")
    src, tgt = make_corpus(200, seed=1)
    base = tmp_path_factory.mktemp("zoo")
    return {name: zoo.build(spec, base / name, src + tgt) for name, spec in ZOO.items()}


@pytest.fixture(scope="module")
def zoo_data(tmp_path_factory) -> Path:
    """7 examples in batches of 2: 4 batches, dealt unevenly to 2 ranks."""
    src, tgt = make_corpus(7, seed=3)
    return write_legacy(tmp_path_factory.mktemp("zoo_data"), src, tgt)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def zoo_runs(zoo_models, zoo_data, tmp_path_factory) -> dict:
    """Every model at 1 rank and at 2 ranks: one process for all the 1-rank runs and two for
    all the 2-rank runs (tests/zoo.py's driver), started together. The two rank processes get
    the variables torchrun gives its workers (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR; each
    run its own MASTER_PORT); a torchrun start per model would cost ~10 s here, 16 of them. The
    three processes are forked from the fork server (conftest), which has the libraries imported
    already: three fresh interpreters cost ~5 CPU s each of imports on a 2-core machine."""
    base = tmp_path_factory.mktemp("zoo_runs")
    runs = [(name, engine) for engine in ENGINES for name in ZOO]
    ports = _free_ports(len(runs))
    plans = {}
    for world in (1, 2):
        plans[world] = [
            {"name": f"{name} {engine}", "port": port,
             "argv": ["--model_name", str(zoo_models[name]), "--data_dir", str(zoo_data), "--task", RUN_TASKS[name],
                      *lang_args(name), *run_args(name), "--engine", engine, "--save_dir", str(base / run_dir(name, engine, world))]}
            for (name, engine), port in zip(runs, ports)
        ]
        (base / f"plan_w{world}.json").write_text(json.dumps(plans[world]))
    driver = Path(zoo.__file__)
    with ThreadPoolExecutor(2) as pool:
        # The 1-rank process without RANK/WORLD_SIZE, as a plain `python tests/zoo.py` starts;
        # run_ranks gives each of the 2 ranks what torchrun gives its workers.
        w1 = pool.submit(single, [str(base / "plan_w1.json")], base, 420, script=driver)
        w2 = pool.submit(run_ranks, 2, [str(base / "plan_w2.json")], base, 420, script=driver)
        procs = [w1.result(), w2.result()]
    for proc in procs:
        assert proc.returncode == 0, f"zoo driver exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}"
    return {"base": base, "log_w1": procs[0].stdout + procs[0].stderr, "log_w2": procs[1].stdout + procs[1].stderr}


def run_dir(name: str, engine: str, world: int) -> str:
    return f"{name}_w{world}" if engine == "hf" else f"{name}_{engine}_w{world}"


def _dry_run(model_dir: Path, data: Path, task: str, tmp: Path, langs: tuple[str, str] | None, **user) -> dict:
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.runner import run

    cfg = EvalConfig(model_name=str(model_dir), data_dir=str(data), task=task, dry_run=True, device="cpu",
                     save_dir=str(tmp / "out"), src_lang=langs[0] if langs else None,
                     tgt_lang=langs[1] if langs else None, generate_kwargs=tuple(user.items()))
    lines = run(cfg, DistEnv()).plan_text.splitlines()
    field = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines if ": " in line}
    return {"generation": json.loads(field["generation"]), "prefix": ast.literal_eval(field["source prefix"]),
            "task settings": field["task settings"]}


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(ZOO))
def test_the_tiny_model_keeps_what_was_published(zoo_models, name):
    import transformers
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    spec, path = ZOO[name], zoo_models[name]
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    assert type(model).__name__ == spec.architecture
    assert config.d_model <= 32 and sum(p.numel() for p in model.parameters()) < 2_500_000
    for key in ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "forced_eos_token_id"):
        if key in spec.config:
            assert getattr(config, key) == spec.config[key], key
    assert (getattr(config, "task_specific_params", None) or None) == spec.config.get("task_specific_params")
    assert getattr(config, "prefix", None) == spec.config.get("prefix")
    saved = GenerationConfig.from_pretrained(path).to_diff_dict()
    published = {k: v for k, v in spec.generation_dict().items() if k != "transformers_version"}
    assert {k: v for k, v in saved.items() if k != "transformers_version"} == published
    tok = AutoTokenizer.from_pretrained(path)
    assert isinstance(tok, getattr(transformers, spec.tokenizer_class))
    assert (tok.pad_token_id, tok.eos_token_id) == (config.pad_token_id, config.eos_token_id)


@pytest.mark.parametrize("name, task", DRY_TASKS)
def test_dry_run_settings_are_the_legacy_scripts(zoo_models, zoo_data, tmp_path, name, task):
    expected, prefix, entry = legacy_expectation(ZOO[name], task, forced_bos(name, zoo_models[name]))
    got = _dry_run(zoo_models[name], zoo_data, task, tmp_path, LANGS.get(name))
    assert effective(got["generation"]) == expected
    assert got["prefix"] == prefix
    if entry is None:
        assert got["task settings"].startswith("none")
    else:
        assert got["task settings"].startswith(f"task_specific_params[{entry!r}]")


def test_plain_translation_on_t5_names_its_three_entries(zoo_models, zoo_data, tmp_path):
    from seq2seq_eval.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--task translation: .*\(translation_en_to_de, translation_en_to_fr, "
                                          r"translation_en_to_ro\) and none named 'translation'; pass one of them"):
        _dry_run(zoo_models["t5-small"], zoo_data, "translation", tmp_path, None)


@pytest.mark.parametrize("name", list(ZOO))
def test_two_ranks_give_what_one_rank_gives(zoo_runs, name):
    one, two = zoo_runs["base"] / f"{name}_w1", zoo_runs["base"] / f"{name}_w2"
    assert (one / "test_generations.txt").read_bytes() == (two / "test_generations.txt").read_bytes()
    assert len((one / "test_generations.txt").read_text().splitlines()) == 7
    metric = "test_bleu.json" if "translation" in RUN_TASKS[name] else "test_rouge.json"
    m1, m2 = (json.loads((d / metric).read_text()) for d in (one, two))
    scores = [k for k in m1 if k.startswith(("bleu", "rouge"))]
    assert scores and {k: m1[k] for k in scores} == {k: m2[k] for k in scores}
    assert (m1["provenance"]["world_size"], m2["provenance"]["world_size"]) == (1, 2)
    assert m1["provenance"]["generation"] == m2["provenance"]["generation"]


@pytest.mark.parametrize("name", list(ZOO))
def test_ctranslate2_two_ranks_give_what_one_rank_gives_with_the_same_settings(zoo_runs, name):
    """Converted, and run with the settings the HF engine uses: the prefix, the task entry's
    beams and the forced first token (the target language of mBART-50, NLLB and M2M100)."""
    if "ctranslate2" not in ENGINES:
        pytest.skip("the ctranslate2 extra is not installed")
    one, two, hf = (zoo_runs["base"] / run_dir(name, e, w) for e, w in (("ctranslate2", 1), ("ctranslate2", 2), ("hf", 1)))
    assert (one / "test_generations.txt").read_bytes() == (two / "test_generations.txt").read_bytes()
    assert len((one / "test_generations.txt").read_text().splitlines()) == 7
    metric = "test_bleu.json" if "translation" in RUN_TASKS[name] else "test_rouge.json"
    ours, theirs = (json.loads((d / metric).read_text())["provenance"] for d in (one, hf))
    assert ours["engine"]["name"] == "ctranslate2"
    for key in ("generation", "prefix", "task_settings"):
        assert ours[key] == theirs[key]
    # The same settings give generate()'s texts: every family converts exactly.
    assert (one / "test_generations.txt").read_text() == (hf / "test_generations.txt").read_text()


@pytest.mark.parametrize("name", sorted(STOPPING))
def test_ctranslate2_refuses_beam_search_that_would_not_stop_as_generates(zoo_models, zoo_data, tmp_path, name):
    """As published, these checkpoints leave early_stopping unset: generate()'s beam search then
    goes on where CTranslate2's stops. One line before any work, naming the setting and its origin."""
    if "ctranslate2" not in ENGINES:
        pytest.skip("the ctranslate2 extra is not installed")
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.errors import ConfigError
    from seq2seq_eval.run.dist import DistEnv
    from seq2seq_eval.run.runner import run

    cfg = EvalConfig(model_name=str(zoo_models[name]), data_dir=str(zoo_data), task=RUN_TASKS[name], dry_run=True,
                     device="cpu", engine="ctranslate2", save_dir=str(tmp_path / "out"),
                     generate_kwargs=tuple(RUN_OPTIONS.items()))
    with pytest.raises(ConfigError, match=r"^--engine ctranslate2 cannot honour the generation setting "
                                          r"early_stopping=False with num_beams=\d+ .*\(generate\(\)'s default, which "
                                          r"the model keeps; set another with --early_stopping\)"):
        run(cfg, DistEnv())


@pytest.mark.parametrize("name", list(ZOO))
def test_run_provenance_settings_are_the_legacy_scripts(zoo_runs, zoo_models, name):
    task = RUN_TASKS[name]
    expected, prefix, entry = legacy_expectation(ZOO[name], task, {**run_options(name), **forced_bos(name, zoo_models[name])})
    for world in (1, 2):
        metric = "test_bleu.json" if "translation" in task else "test_rouge.json"
        prov = json.loads((zoo_runs["base"] / f"{name}_w{world}" / metric).read_text())["provenance"]
        assert effective(prov["generation"]) == expected
        assert prov["prefix"] == prefix
        assert prov["task_settings"]["entry"] == entry


def test_t5_translation_en_to_fr_runs_with_that_entrys_prefix_and_beams(zoo_runs):
    prov = json.loads((zoo_runs["base"] / "t5-small_w1" / "test_bleu.json").read_text())["provenance"]
    assert prov["task_settings"] == {"entry": "translation_en_to_fr", "params": T5_TASK_PARAMS["translation_en_to_fr"]}
    assert prov["prefix"] == "translate English to French: "
    assert prov["generation"]["num_beams"] == 4 and prov["generation"]["early_stopping"] is True
    # --max_new_tokens replaced the entry's max_length 300 instead of conflicting with it.
    assert prov["generation"]["max_new_tokens"] == 6 and prov["generation"]["max_length"] is None


def test_user_lengths_replace_the_models_without_a_warning_per_batch(zoo_runs):
    """--max_new_tokens over max_length 300/512 and --min_new_tokens over min_length 30/56 would
    make transformers warn on every batch that both are set."""
    for log in (zoo_runs["log_w1"], zoo_runs["log_w2"]):
        assert "seem to have been set" not in log
        assert "Unfeasible length constraints" not in log


def test_a_repeated_transformers_warning_is_shown_once(monkeypatch):
    import logging

    from seq2seq_eval.engines.hf import OncePerRun

    library = logging.getLogger("transformers")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Collect()
    monkeypatch.setattr(library, "handlers", [handler])
    once = OncePerRun()
    child = logging.getLogger("transformers.generation.utils")
    for _ in range(3):  # three batches
        with once.on(library):
            child.warning("Both `max_new_tokens` (=6) and `max_length`(=300) seem to have been set.")
            child.warning("another warning")
    child.warning("another warning")  # outside a generate() call: not filtered
    assert seen == ["Both `max_new_tokens` (=6) and `max_length`(=300) seem to have been set.",
                    "another warning", "another warning"]


def test_the_embedded_models_readme_states_its_task_settings():
    """data_samples/README.md quotes config.json's task_specific_params; the quote must be exact."""
    repo = Path(zoo.__file__).resolve().parents[1]
    readme = (repo / "data_samples" / "README.md").read_text(encoding="utf-8")
    start = readme.index('"task_specific_params":')
    end = readme.index("\n      }", start) + len("\n      }")
    stated = json.loads("{" + readme[start:end] + "}")["task_specific_params"]
    config = json.loads((repo / "data_samples" / "model" / "config.json").read_text(encoding="utf-8"))
    assert stated == config["task_specific_params"]


# ---------------------------------------------------------------- task names (no model)

EMBEDDED_STYLE = {"translation": {"num_beams": 4}, "summarization": {"num_beams": 2}}
PEGASUS_LARGE_STYLE = {"summarization_xsum": {"max_length": 64}, "summarization_cnn_dailymail": {"max_length": 128}}


@pytest.mark.parametrize(
    "tsp, task, entry, note",
    [
        # a key equal to the task name: that entry (the legacy rule)
        (T5_TASK_PARAMS, "translation_en_to_fr", "translation_en_to_fr", ""),
        (T5_TASK_PARAMS, "summarization", "summarization", ""),
        (PEGASUS_LARGE_STYLE, "summarization_xsum", "summarization_xsum", ""),
        # the plain family name: the family's only entry, or none when it has none
        ({"summarization_xsum": {"max_length": 64}}, "summarization", "summarization_xsum", ""),
        (EMBEDDED_STYLE, "translation", "translation", ""),
        ({"summarization": {}}, "translation", None, ""),
        (None, "translation", None, ""),
        # another name: the model's plain family entry, else none (and the log says what it has)
        (EMBEDDED_STYLE, "translation_en_to_ro", "translation", ""),
        (T5_TASK_PARAMS, "translation_de_to_en", None,
         "the model's task_specific_params has translation_en_to_de, translation_en_to_fr, translation_en_to_ro "
         "but no 'translation_de_to_en'"),
        (None, "summarization_cnn", None, ""),
    ],
)
def test_task_entry(tsp, task, entry, note):
    from types import SimpleNamespace

    from seq2seq_eval.model.settings import task_entry

    got = task_entry(SimpleNamespace(task_specific_params=tsp), task)
    assert (got.name, got.note) == (entry, note)
    assert got.params == ((tsp or {}).get(entry, {}) if entry else {})


@pytest.mark.parametrize(
    "tsp, task, listed",
    [
        (T5_TASK_PARAMS, "translation", "translation_en_to_de, translation_en_to_fr, translation_en_to_ro"),
        (PEGASUS_LARGE_STYLE, "summarization", "summarization_cnn_dailymail, summarization_xsum"),
    ],
)
def test_a_plain_family_name_with_several_entries_is_refused(tsp, task, listed):
    from types import SimpleNamespace

    from seq2seq_eval.errors import ConfigError
    from seq2seq_eval.model.settings import task_entry

    with pytest.raises(ConfigError, match=rf"^--task {task}: the model has several {task} settings in its "
                                          rf"task_specific_params \({listed}\) and none named '{task}'; "
                                          r"pass one of them as --task$"):
        task_entry(SimpleNamespace(task_specific_params=tsp), task)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_fast_tokenizing_equals_the_tokenizer_call(zoo_models, zoo_data, name):
    """Sources are tokenized through the fast tokenizer's backend directly (model_settings._encode);
    the ids must be the tokenizer's own, with and without truncation, and the tokenizer must be
    left as it was."""
    from transformers import AutoTokenizer

    from seq2seq_eval.inputs.files import read_lines
    from seq2seq_eval.model.settings import _encode

    tokenizer = AutoTokenizer.from_pretrained(zoo_models[name])
    texts = ["translate: " + s for s in read_lines(zoo_data / "test.source")]
    before = (tokenizer.backend_tokenizer.truncation, tokenizer.backend_tokenizer.padding) if tokenizer.is_fast else None
    for limit in (None, 6):
        kwargs = {"truncation": True, "max_length": limit} if limit else {"truncation": False}
        expected = [list(ids) for ids in AutoTokenizer.from_pretrained(zoo_models[name])(texts, **kwargs)["input_ids"]]
        assert _encode(tokenizer, texts, limit) == expected
    if before is not None:
        assert (tokenizer.backend_tokenizer.truncation, tokenizer.backend_tokenizer.padding) == before


@pytest.mark.parametrize("name", list(LANGS))
def test_ctranslate2_starts_every_hypothesis_with_the_target_language(zoo_models, zoo_data, name):
    if "ctranslate2" not in ENGINES:
        pytest.skip("the ctranslate2 extra is not installed")
    import torch

    from seq2seq_eval import engines

    from seq2seq_eval.model import settings as model_settings
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.run.dist import DistEnv

    cfg = EvalConfig(model_name=str(zoo_models[name]), engine="ctranslate2", src_lang=LANGS[name][0],
                     tgt_lang=LANGS[name][1], generate_kwargs=tuple(run_options(name).items()))
    tok = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    gc = model_settings.generation_config_for(model_config, base, tok, cfg)
    engine = engines.load(cfg, tokenizer=tok, model_config=model_config, generation_config=gc,
                          device=torch.device("cpu"), env=DistEnv())
    ids, _ = model_settings.encode_sources(tok, (zoo_data / "test.source").read_text().splitlines(), "", 64)
    results = engine.model.translate_batch([tok.convert_ids_to_tokens(x) for x in ids],
                                                target_prefix=[[engine.mapping.prefix_token]] * len(ids),
                                                **engine.mapping.options)
    target = tok.convert_ids_to_tokens(gc.forced_bos_token_id)
    assert engine.mapping.prefix_token == target
    assert all(r.hypotheses[0][0] == target for r in results)
