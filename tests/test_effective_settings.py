"""What model.generate() would do, on both engines: the model's own settings wherever they live
(config.json's generation keys of a checkpoint without generation_config.json, its
task_specific_params), transformers' defaults for what nobody set (top_k 50), every value checked
before any work (the dry run included), and the provenance recording every field.

Runs go through the real CLI (forked interpreters); the plain generate() loop the outputs are
compared with runs here, one example at a time, as a user's script would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import assert_ok, metrics_of, single

pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')

from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL  # noqa: E402

N = 16
SOURCES = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:N]


def legacy_checkpoint(folder: Path, generation_keys: dict, task_params: dict | None = None) -> Path:
    """The embedded model saved as checkpoints from before generation_config.json were: its
    generation settings in config.json only (and its task_specific_params, if any)."""
    shutil.copytree(EMBEDDED_MODEL, folder)
    (folder / "generation_config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    config.pop("task_specific_params")
    config.update(generation_keys)
    if task_params:
        config["task_specific_params"] = task_params
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def plain_generate(folder: Path, entry: dict | None = None) -> list[str]:
    """A user's loop: from_pretrained, then generate() on each source, with the task entry's
    prefix and settings as the legacy script passed them."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, tok = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    entry = dict(entry or {})
    prefix = entry.pop("prefix", "")
    out = []
    with torch.inference_mode():
        for source in SOURCES:
            ids = model.generate(**tok(prefix + source, return_tensors="pt"), **entry)
            out.append(tok.decode(ids[0], skip_special_tokens=True, clean_up_tokenization_spaces=False).strip())
    return out


def run_tool(tmp_path: Path, name: str, *args: str) -> tuple:
    save = tmp_path / name
    proc = single([*args, "--n_obs", str(N), "--bs", "1", "--save_dir", str(save)], cwd=tmp_path)
    return proc, save


def _one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("seq2seq_eval: error: "), proc.stderr
    return lines[0]


# ---------------------------------------------------------------- the model's own settings

ENTRY = {"num_beams": 4, "early_stopping": True, "max_length": 40, "prefix": "translate: "}


@pytest.mark.parametrize("keys, entry", [
    # greedy, with the keys a fine-tuned checkpoint of the legacy script's time carries
    ({"no_repeat_ngram_size": 2, "repetition_penalty": 1.5}, None),
    # beam search from the task entry; renormalize_logits lets CTranslate2 mask the same way
    ({"no_repeat_ngram_size": 2, "renormalize_logits": True}, {"translation": ENTRY}),
])
def test_generation_keys_in_config_json_are_what_generate_uses(tmp_path, keys, entry):
    folder = legacy_checkpoint(tmp_path / "model", keys, entry)
    expected = plain_generate(folder, entry["translation"] if entry else None)
    for engine in ("hf", "ctranslate2"):
        proc, save = run_tool(tmp_path, engine, "--model_name", str(folder), "--engine", engine)
        assert_ok(proc)
        assert (save / "test_generations.txt").read_text().splitlines() == expected, engine
        recorded = metrics_of(save)["provenance"]["generation"]
        assert {k: recorded[k] for k in keys} == keys


def test_a_key_in_config_json_ctranslate2_cannot_honour_is_refused_before_any_work(tmp_path):
    folder = legacy_checkpoint(tmp_path / "model", {"encoder_no_repeat_ngram_size": 2})
    proc, save = run_tool(tmp_path, "ct2", "--model_name", str(folder), "--engine", "ctranslate2")
    line = _one_line(proc)
    assert ("cannot honour the generation setting encoder_no_repeat_ngram_size=2 (from the model's generation config "
            "or task settings; override it with --encoder_no_repeat_ngram_size") in line
    assert not save.exists() and not list(Path(f"{save}_tmp").glob("journal_*"))
    proc, save = run_tool(tmp_path, "hf", "--model_name", str(folder))
    assert_ok(proc)
    assert (save / "test_generations.txt").read_text().splitlines() == plain_generate(folder)


def test_a_model_value_out_of_range_names_its_option(tmp_path):
    folder = legacy_checkpoint(tmp_path / "model", {"no_repeat_ngram_size": -1})
    proc, _ = run_tool(tmp_path, "out", "--model_name", str(folder), "--dry_run")
    assert _one_line(proc).endswith(
        "no_repeat_ngram_size=-1 (from the model's generation config or task settings; override it with "
        "--no_repeat_ngram_size, or unset it with --no_repeat_ngram_size none): expected an integer >= 0")


# ---------------------------------------------------------------- what nobody set


def _texts(engine: str, *settings: tuple) -> list[list[str]]:
    """Three sampled candidates for 16 sources, through the engine as a run builds it."""
    import torch

    from seq2seq_eval import engines
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.model import settings as model_settings
    from seq2seq_eval.run.dist import DistEnv

    # A flat distribution (temperature 3): tokens beyond the 50 most likely are drawn now and then.
    cfg = EvalConfig(engine=engine, num_return_sequences=3,
                     generate_kwargs=(("do_sample", True), ("num_beams", 1), ("temperature", 3.0), *settings))
    tok = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    gc = model_settings.generation_config_for(model_config, base, tok, cfg)
    engine_ = engines.load(cfg, tokenizer=tok, model_config=model_config, generation_config=gc,
                           device=torch.device("cpu"), env=DistEnv())
    ids, _ = model_settings.encode_sources(tok, SOURCES, "translate: ", 1024)
    return engine_.generate(ids[:8], 3).preds + engine_.generate(ids[8:], 4).preds


@pytest.mark.parametrize("engine", ["hf", "ctranslate2"])
def test_sampling_without_top_k_samples_from_generates_default_top_50(engine):
    unset = _texts(engine)
    assert unset == _texts(engine, ("top_k", 50))
    assert unset != _texts(engine, ("top_k", 0))  # no limit: other draws, so the default mattered


def test_the_provenance_records_every_field_with_generates_defaults(tmp_path):
    from transformers import GenerationConfig

    proc, save = run_tool(tmp_path, "out", "--engine", "ctranslate2", "--n_obs", "4", "--do_sample", "true",
                          "--num_beams", "1")
    assert_ok(proc)
    recorded = metrics_of(save)["provenance"]["generation"]
    assert set(recorded) == set(GenerationConfig().to_dict()) - {"transformers_version", "_from_model_config"}
    assert (recorded["top_k"], recorded["top_p"], recorded["temperature"], recorded["do_sample"]) == (50, 1.0, 1.0, True)
    assert (recorded["min_length"], recorded["max_length"], recorded["num_beams"]) == (0, 120, 1)


# ---------------------------------------------------------------- refused before any work, in one line

CT2 = ["--engine", "ctranslate2"]


REFUSED = [
    # a list of forced end tokens: generate() picks one by its score, CTranslate2 cannot
    ([*CT2, "--forced_eos_token_id", "[5, 1]"], "generation setting forced_eos_token_id=[5, 1] (generate() forces one"),
    # 0 is not "no limit": generate() stops at once
    (["--max_time", "0"], "--max_time 0: expected a number > 0"),
    ([*CT2, "--max_time", "0"], "--max_time 0: expected a number > 0"),
    ([*CT2, "--max_time", "5"], "cannot honour the generation setting max_time=5 (set by --max_time)"),
    # limits together, for both engines, in the dry run
    ([*CT2, "--min_new_tokens", "20", "--max_new_tokens", "16"],
     "--min_new_tokens: asks for at least 20 generated tokens, more than the 16 that --max_new_tokens allows"),
    (["--min_new_tokens", "20", "--max_new_tokens", "16"], "--min_new_tokens: asks for at least 20"),
    ([*CT2, "--min_new_tokens", "200"],
     "--min_new_tokens: asks for at least 200 generated tokens, more than the 119 that max_length"),
    (["--num_beams", "2", "--num_beams", "3"], "--num_beams given twice (2 and 3); give it once"),
    # value ranges generate() would silently ignore
    (["--no_repeat_ngram_size", "-1"], "--no_repeat_ngram_size -1: expected an integer >= 0"),
    (["--top_p", "2", "--do_sample", "true"], "--top_p 2: expected a number > 0 and <= 1"),
    ([*CT2, "--top_p", "2", "--do_sample", "true"], "--top_p 2: expected a number > 0 and <= 1"),
    (["--top_k", "5"], "--top_k 5: used only when sampling; add --do_sample true, or leave out --top_k"),
    # a compute type the device does not support, before converting
    ([*CT2, "--compute_type", "float16"], "--compute_type float16: CTranslate2 "),
    ([*CT2, "--compute_type", "int8_float16"], "--compute_type int8_float16: CTranslate2 "),
]


@pytest.mark.parametrize("args, line", REFUSED)
def test_refused_by_the_dry_run_in_one_line(tmp_path, monkeypatch, args, line):
    _refused(tmp_path, monkeypatch, args, line, dry=True)


@pytest.mark.parametrize("args, line", [case for case in REFUSED if case[0][:1] == CT2[:1] and any(
    flag in case[0] for flag in ("--forced_eos_token_id", "--min_new_tokens", "--compute_type"))])
def test_refused_by_the_run_before_converting(tmp_path, monkeypatch, args, line):
    """What the dry run refuses, the run refuses too, before the model is converted or loaded (the
    same checks, prepare's): not at the first batch, nor after converting."""
    _refused(tmp_path, monkeypatch, args, line, dry=False)


def _refused(tmp_path: Path, monkeypatch, args: list[str], line: str, dry: bool) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEQ2SEQ_EVAL_CACHE", str(cache))
    proc, save = run_tool(tmp_path, "out", *args, *(["--dry_run"] if dry else []))
    assert line in _one_line(proc)
    assert not save.exists() and not list(Path(f"{save}_tmp").glob("journal_*"))
    assert not cache.exists() or not list(cache.rglob("model.bin"))  # nothing converted
