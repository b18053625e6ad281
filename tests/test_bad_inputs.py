"""The bad-input catalogue, through real `python -m seq2seq_eval` processes.

Every bad input must give exactly one line on stderr (`seq2seq_eval: error: ...`) naming the
file and 1-based line, or the flag and the value; a non-zero exit; no traceback unless --debug;
and nothing in --save_dir that could be mistaken for a result.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, make_corpus, single, write_legacy

PREFIX = "seq2seq_eval: error: "
RESULT_PATTERNS = ("*_bleu.json", "*_rouge.json", "*_generations.txt", "*_examples.jsonl", "*pseudolabel*", "*.pseudo.target")

# Placeholders in the table: {m} the tiny T5, {d} the folder of bad inputs, {ok} a valid data dir.
# Each case: id, arguments, fragments its one error line must contain, exit code.
CASES = [
    # ---- data: legacy .source/.target layout
    ("missing-data-dir", ["--data_dir", "{d}/nope"], ["--data_dir {d}/nope: no such directory"], 1),
    ("missing-source", ["--data_dir", "{d}/no_source"],
     ["{d}/no_source/test.source: file not found", "expected test.source in --data_dir"], 1),
    ("data-dir-is-a-source-file", ["--data_dir", "{d}/uneven/test.source"],
     ["--data_dir {d}/uneven/test.source: a .source/.target file", "expected the folder"], 1),
    ("missing-target", ["--data_dir", "{d}/no_target"],
     ["{d}/no_target/test.target: file not found", "references"], 1),
    ("line-counts-differ", ["--data_dir", "{d}/uneven"],
     ["{d}/uneven/test.target: 2 lines but test.source has 3"], 1),
    ("empty-source-line", ["--data_dir", "{d}/empty_source"],
     ["{d}/empty_source/test.source line 2: blank source (empty or whitespace only)"], 1),
    ("empty-reference", ["--data_dir", "{d}/empty_reference"],
     ["{d}/empty_reference/test.target line 3: blank reference (empty or whitespace only)"], 1),
    ("invalid-utf8", ["--data_dir", "{d}/bad_utf8"],
     ["{d}/bad_utf8/test.target line 2: invalid UTF-8", "byte 0xff"], 1),
    # ---- data: JSON Lines (a blank line still counts, as in an editor)
    ("malformed-jsonl", ["--data_dir", "{d}/malformed.jsonl"], ["{d}/malformed.jsonl line 3: malformed JSON"], 1),
    ("missing-field", ["--data_dir", "{d}/missing_field.jsonl"],
     ["{d}/missing_field.jsonl line 2: missing field 'target'"], 1),
    ("duplicated-id", ["--data_dir", "{d}/dup_id.jsonl"],
     ["{d}/dup_id.jsonl line 3: duplicated id 'b' (first on line 2)"], 1),
    # ---- flags (all fail in argument parsing, before torch is imported)
    ("task-unknown", ["--task", "translate"], ["--task", "'translate'", "translation", "summarization"], 2),
    ("bs-zero", ["--bs", "0"], ["--bs must be an integer >= 1, got 0"], 2),
    ("bs-negative", ["--bs", "-3"], ["--bs must be an integer >= 1, got -3"], 2),
    ("bs-not-a-number", ["--bs", "eight"], ["--bs", "'eight'"], 2),
    ("bs-no-value", ["--bs"], ["--bs", "expected one argument"], 2),
    ("max-tokens-zero", ["--max_tokens", "0"], ["--max_tokens must be an integer >= 1, got 0"], 2),
    ("max-source-length-zero", ["--max_source_length", "0"], ["--max_source_length must be an integer >= 1, got 0"], 2),
    ("max-source-length-alias", ["--max-source-length", "-1"], ["--max_source_length must be an integer >= 1, got -1"], 2),
    ("n-obs-zero", ["--n_obs", "0"], ["--n_obs must be an integer >= 1, got 0"], 2),
    ("num-beams-zero", ["--num_beams", "0"], ["--num_beams must be an integer >= 1, got 0"], 2),
    ("num-beams-negative", ["--num_beams", "-2"], ["--num_beams must be an integer >= 1, got -2"], 2),
    ("num-beams-not-a-number", ["--num_beams", "four"], ["--num_beams must be an integer >= 1, got 'four'"], 2),
    ("num-beams-fraction", ["--num_beams=2.5"], ["--num_beams must be an integer >= 1, got 2.5"], 2),
    ("sync-timeout-zero", ["--sync_timeout", "0"], ["--sync_timeout must be a number of seconds > 0, got 0"], 2),
    ("sync-timeout-negative", ["--sync_timeout", "-5"], ["--sync_timeout must be a number of seconds > 0, got -5"], 2),
    ("sync-timeout-not-a-number", ["--sync_timeout", "soon"], ["--sync_timeout", "'soon'"], 2),
    ("sync-timeout-nan", ["--sync_timeout", "nan"], ["--sync_timeout must be a number of seconds > 0, got nan"], 2),
    ("return-sequences-over-beams", ["--num_return_sequences", "3", "--num_beams", "2"],
     ["--num_return_sequences (3) must not exceed --num_beams (2)"], 2),
    ("generate-option-no-value", ["--num_beams"], ["--num_beams needs a value"], 2),
    # generate() would take any non-empty string as true, and sample
    ("do-sample-not-a-bool", ["--do_sample", "maybe"], ["--do_sample 'maybe': expected true or false"], 2),
    ("max-length-fraction", ["--max_length", "12.5"], ["--max_length 12.5: expected an integer"], 2),
    ("length-penalty-not-a-number", ["--length_penalty", "high"], ["--length_penalty 'high': expected a number"], 2),
    ("early-stopping-unknown", ["--early_stopping", "soon"],
     ["--early_stopping 'soon': expected true, false or never"], 2),
    ("stray-argument", ["--bs", "4", "extra"], ["unexpected argument 'extra'"], 2),
    # ---- generate options the model config must be read to check
    ("generate-option-misspelt", ["--num_beem", "4"], ["unknown generate option --num_beem", "--num_beams"], 2),
    # with prefix matching on, --max_source would silently set --max_source_length
    ("no-prefix-matching", ["--max_source", "8"], ["unknown generate option --max_source"], 2),
    # GenerationConfig.validate() accepts these; generate() refuses some in the first batch, after the
    # model was loaded and the temp dir claimed, and silently ignores others: each field's range is
    # checked first (model/fields.py), and the limits together (model/generation.py)
    ("max-length-1", ["--max_length", "1"], ["--max_length: max_length=1 leaves no room to generate"], 2),
    ("max-length-negative", ["--max_length", "-1"], ["--max_length -1: expected an integer >= 1"], 2),
    ("temperature-negative", ["--temperature", "-1", "--do_sample", "true"], ["--temperature -1: expected a number > 0"], 2),
    ("top-k-negative", ["--top_k", "-3", "--do_sample", "true"], ["--top_k -3: expected an integer >= 0"], 2),
    ("repetition-penalty-negative", ["--repetition_penalty", "-1"], ["--repetition_penalty -1: expected a number > 0"], 2),
    ("no-repeat-ngram-negative", ["--no_repeat_ngram_size", "-1"], ["--no_repeat_ngram_size -1: expected an integer >= 0"], 2),
    ("top-p-over-1", ["--top_p", "2", "--do_sample", "true"], ["--top_p 2: expected a number > 0 and <= 1"], 2),
    ("max-time-zero", ["--max_time", "0"], ["--max_time 0: expected a number > 0"], 2),
    ("min-over-max", ["--min_new_tokens", "20", "--max_new_tokens", "16"],
     ["--min_new_tokens: asks for at least 20 generated tokens, more than the 16 that --max_new_tokens allows"], 2),
    ("generate-option-twice", ["--num_beams", "2", "--num_beams", "3"], ["--num_beams given twice (2 and 3); give it once"], 2),
    # ---- model
    ("model-path-missing", ["--model_name", "{d}/no_model"], ["--model_name {d}/no_model: no such path"], 1),
    # a decoder-only model is evaluated, but a limit that counts the prompt is not taken
    ("model-gpt2", ["--model_name", "{d}/gpt2"], ["no --max_new_tokens (nor max_new_tokens in the "
                                                  "model's generation config or task entry): generate() would give "
                                                  "each prompt at most 20 new tokens"], 2),
    ("model-bert", ["--model_name", "{d}/bert"], ["--model_name {d}/bert: a 'bert' model (BertModel) is neither a seq2seq nor a causal language model"], 1),
    # ---- output folders, checked before the model loads: we may run as root, so use regular files
    # rather than permissions (a read-only mount is tested in test_new_user.py)
    ("tmp-dir-not-writable", ["--tmp_dir", "{d}/a_file/tmp"],
     ["--tmp_dir {d}/a_file/tmp: {d}/a_file is a file; expected a folder"], 2),
    ("save-dir-is-a-file", ["--save_dir", "{d}/a_file"], ["--save_dir {d}/a_file: is a file; expected a folder"], 2),
    ("save-dir-is-a-file-dry-run", ["--save_dir", "{d}/a_file", "--dry_run"],
     ["--save_dir {d}/a_file: is a file; expected a folder"], 2),
    ("tmp-dir-is-a-file-dry-run", ["--tmp_dir", "{d}/a_file", "--dry_run"],
     ["--tmp_dir {d}/a_file: is a file; expected a folder"], 2),
    # a JSON Lines input whose name is one of the outputs, in the folder the outputs go to
    ("output-over-input", ["--data_dir", "{d}/collide/test_generations.txt", "--save_dir", "{d}/collide"],
     ["{d}/collide/test_generations.txt: output test_generations.txt of --save_dir would write over --data_dir file"], 2),
    # ---- the model's limits and the device
    ("max-source-length-over-model", ["--model_name", "{e}", "--max_source_length", "4096"],
     ["--max_source_length 4096 exceeds the model's 1024 positions", "expected at most 1024"], 2),
    ("fp16-on-cpu", ["--fp16"], ["--fp16 needs a GPU and this run is on CPU; use --bf16"], 2),
    ("device-cuda-without-gpu", ["--device", "cuda"], ["--device cuda: no CUDA GPU is visible"], 2),
    ("device-unknown", ["--device", "tpu"], ["--device", "'tpu'", "auto", "cpu", "cuda"], 2),
    # one beam but a beam-only option the user set: said so, naming it
    ("greedy-with-length-penalty", ["--num_beams", "1", "--length_penalty", "2.0"],
     ["--length_penalty 2.0: used only in beam search; set --num_beams above 1, or leave out --length_penalty"], 2),
    # ---- datasets: a local JSON Lines file is read as --data_dir reads it, with its messages
    ("dataset-malformed-jsonl", ["--dataset", "{d}/malformed.jsonl"], ["{d}/malformed.jsonl line 3: malformed JSON"], 1),
    ("dataset-duplicated-id", ["--dataset", "{d}/dup_id.jsonl"],
     ["dataset {d}/dup_id.jsonl split test row 2 column 'id': duplicated id 'b' (first in row 1)"], 1),
    # ---- arguments that are not UTF-8 (Python passes their bytes on as lone surrogates)
    ("argument-not-utf8", ["--prompt_template", "Q\udcff {{source}}"],
     ["--prompt_template: 'Q\\udcff {{source}}' holds the byte 0xff at character 1, which is not UTF-8; expected UTF-8 "
      "text"], 2),
    ("flag-value-not-utf8", ["--type_path=te\udcfest"],
     ["--type_path: '--type_path=te\\udcfest' holds the byte 0xfe at character 14, which is not UTF-8"], 2),
]

DEBUG_CASES = [
    ("debug-data-error", ["--data_dir", "{d}/empty_source", "--debug"],
     "DataError: {d}/empty_source/test.source line 2: blank source"),
    ("debug-config-error", ["--bs", "0", "--debug"], "ConfigError: --bs must be an integer >= 1, got 0"),
]


def _write_bad_inputs(d: Path) -> None:
    d.mkdir(parents=True)
    write_legacy(d / "no_source", ["unused"], ["unused"])
    (d / "no_source" / "test.source").unlink()
    write_legacy(d / "no_target", ["a b", "c d"], None)
    write_legacy(d / "uneven", ["a", "b", "c"], ["a", "b"])
    write_legacy(d / "empty_source", ["the cat", "", "a dog"], ["x", "y", "z"])
    write_legacy(d / "empty_reference", ["the cat", "a dog", "a mat"], ["x", "y", "   "])
    write_legacy(d / "bad_utf8", ["a", "b", "c"], None)
    (d / "bad_utf8" / "test.target").write_bytes(b"caf\xc3\xa9\r\nbad \xff byte\r\nok\r\n")
    (d / "malformed.jsonl").write_text('{"source": "a", "target": "b"}\n\n{"source": "a", "target"\n', encoding="utf-8")
    (d / "missing_field.jsonl").write_text('{"source": "a", "target": "b"}\n{"source": "c"}\n', encoding="utf-8")
    (d / "dup_id.jsonl").write_text(
        "".join('{"id": "%s", "source": "s", "target": "t"}\n' % i for i in ("a", "b", "b")), encoding="utf-8"
    )
    (d / "a_file").write_text("a regular file, not a folder\n", encoding="utf-8")
    (d / "collide").mkdir()
    (d / "collide" / "test_generations.txt").write_text('{"source": "a b", "target": "c"}\n', encoding="utf-8")
    _write_not_seq2seq_models(d)


def _write_not_seq2seq_models(d: Path) -> None:
    """A decoder-only and an encoder-only model, as tiny as transformers allows, built offline.
    Special token ids inside the vocabulary: transformers warns about them otherwise."""
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(d / "gpt2")
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(d / "bert")


@pytest.fixture(scope="module")
def names(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """What the table's placeholders stand for."""
    root = tmp_path_factory.mktemp("bad_inputs")
    _write_bad_inputs(root / "inputs")
    src, tgt = make_corpus(3, seed=4)
    return {"m": tiny_model, "d": root / "inputs", "ok": write_legacy(root / "ok", src, tgt), "root": root,
            "e": REPO / "data_samples" / "model"}


@pytest.fixture(scope="module")
def runs(names) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case once, side by side; the processes share nothing but the read-only inputs. The
    --debug cases start fresh interpreters, exactly as a user does (the traceback is
    then the interpreter's own); the others are forked from one that imported torch already."""
    root = names["root"]
    fresh = {c[0] for c in DEBUG_CASES}

    def launch(case_id: str, args: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
        save = root / f"save_{case_id}"
        data = [] if "--dataset" in args else ["--data_dir", "{ok}"]  # --dataset with --data_dir is refused
        argv = ["--model_name", "{m}", *data, "--save_dir", str(save), *args]
        # Later flags win in argparse, so a case's own --model_name/--data_dir/--save_dir replace the defaults.
        return single([a.format(**names) for a in argv], cwd=root, timeout=180, fresh=case_id in fresh), save

    table = [(c[0], c[1]) for c in CASES + DEBUG_CASES]
    workers = min(4, (os.cpu_count() or 1) + 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {case_id: pool.submit(launch, case_id, args) for case_id, args in table}
        return {case_id: f.result() for case_id, f in futures.items()}


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _assert_no_results(save: Path) -> None:
    found = [p.name for pattern in RESULT_PATTERNS for p in save.glob(pattern)] if save.exists() else []
    assert found == [], f"a failed run left result-like files in {save}: {found}"


@pytest.mark.parametrize("case_id, args, fragments, exit_code", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line(runs, names, case_id, args, fragments, exit_code):
    proc, save = runs[case_id]
    lines = _lines(proc.stderr)
    assert len(lines) == 1, f"expected one stderr line, got:\n{proc.stderr}"
    line = lines[0]
    assert line.startswith(PREFIX), line
    for fragment in fragments:
        assert fragment.format(**names) in line, f"{fragment.format(**names)!r} not in {line!r}"
    assert "Traceback" not in proc.stderr
    assert proc.returncode == exit_code, f"exit {proc.returncode}: {line}"
    assert proc.stdout.strip() == ""
    _assert_no_results(save)


@pytest.mark.parametrize("case_id, args, exception", DEBUG_CASES, ids=[c[0] for c in DEBUG_CASES])
def test_debug_shows_the_traceback(runs, names, case_id, args, exception):
    proc, save = runs[case_id]
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert exception.format(**names) in proc.stderr
    _assert_no_results(save)
