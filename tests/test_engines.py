"""The CTranslate2 engine (--engine ctranslate2) against the HF engine, and what it shares with it.

Runs go through the real CLI (forked interpreters and ranks); the settings table calls
the engines directly on the embedded model (the engine on the whole embedded sample sets is in
test_embedded.py, beside the HF engine's runs). Converted models go to a cache of this module's own,
so that what a test says about conversion (once, reused on resume) is about its own runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import _env, assert_ok, metrics_of, run_ranks, single
from faults import wait_for_lines

pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')

from seq2seq_eval import engines  # noqa: E402

from seq2seq_eval.model import settings as model_settings  # noqa: E402
from seq2seq_eval.config import EMBEDDED_DATA, EvalConfig  # noqa: E402
from seq2seq_eval.run.dist import DistEnv  # noqa: E402
from seq2seq_eval.engines import ct2  # noqa: E402
from seq2seq_eval.errors import ConfigError  # noqa: E402

CT2 = ["--engine", "ctranslate2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory, monkeypatch_module) -> Path:
    path = tmp_path_factory.mktemp("ct2_cache")
    monkeypatch_module.setenv("SEQ2SEQ_EVAL_CACHE", str(path))
    return path


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


# ---------------------------------------------------------------- settings, without a model


def _gc(**settings):
    """Settings as a run hands them to the engine: generate()'s defaults made explicit."""
    from transformers import GenerationConfig

    from seq2seq_eval.model.generation import effective

    gc = GenerationConfig(**{"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0, **settings})
    return effective(gc, None)


@pytest.fixture(scope="module")
def tokenizer():
    return model_settings.load_tokenizer(EvalConfig())


@pytest.mark.parametrize("settings, expected", [
    ({"num_beams": 4, "max_length": 11}, {"beam_size": 4, "max_decoding_length": 10, "num_hypotheses": 1}),
    ({"max_new_tokens": 7, "max_length": 99}, {"max_decoding_length": 7}),
    ({"min_length": 5}, {"min_decoding_length": 4}),
    ({"min_new_tokens": 3, "min_length": 9}, {"min_decoding_length": 3}),
    ({"num_beams": 5, "length_penalty": 0.6, "no_repeat_ngram_size": 3, "repetition_penalty": 1.2},
     {"beam_size": 5, "length_penalty": 0.6, "no_repeat_ngram_size": 3, "repetition_penalty": 1.2}),
    ({"do_sample": True, "top_k": 0, "top_p": 0.9, "temperature": 0.7, "num_return_sequences": 3},
     {"sampling_topk": 0, "sampling_topp": 0.9, "sampling_temperature": 0.7, "num_hypotheses": 3, "beam_size": 1}),
    # Unset, generate()'s defaults: not CTranslate2's (sampling_topk 1, 256 tokens at most, 1 at least).
    ({"do_sample": True}, {"sampling_topk": 50, "sampling_topp": 1.0, "sampling_temperature": 1.0}),
    ({}, {"max_decoding_length": 20, "min_decoding_length": 0, "beam_size": 1}),
    ({"eos_token_id": [1, 2]}, {"end_token": ["</s>", "<unk>"]}),
    ({"bad_words_ids": [[0]], "suppress_tokens": [2]}, {"suppress_sequences": [["<pad>"], ["<unk>"]]}),
])
def test_generation_settings_map_to_translate_batch(tokenizer, settings, expected):
    mapping = ct2.translate_options(_gc(**settings), tokenizer)
    assert {k: mapping.options.get(k) for k in expected} == expected
    assert mapping.options["max_input_length"] == 0  # never CTranslate2's default cut at 1024
    assert ("sampling_topk" in mapping.options) == bool(settings.get("do_sample"))


def test_forced_first_and_last_tokens(tokenizer):
    mapping = ct2.translate_options(_gc(forced_bos_token_id=5, forced_eos_token_id=1), tokenizer)
    assert mapping.prefix_token == tokenizer.convert_ids_to_tokens(5) and mapping.forced_eos == 1


@pytest.mark.parametrize("settings, named", [
    ({"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.5}, "diversity_penalty=0.5"),
    ({"typical_p": 0.5, "do_sample": True}, "typical_p=0.5"),
    ({"early_stopping": "never", "num_beams": 2}, "early_stopping='never'"),
    ({"do_sample": True, "num_beams": 3}, "do_sample=True with num_beams=3"),
    ({"encoder_repetition_penalty": 1.3}, "encoder_repetition_penalty=1.3"),
])
def test_settings_ctranslate2_cannot_honour_are_refused(tokenizer, settings, named):
    cfg = EvalConfig(engine="ctranslate2", generate_kwargs=tuple(settings.items()))
    with pytest.raises(ConfigError, match=r"^--engine ctranslate2 cannot honour the generation setting ") as e:
        ct2.check(cfg, None, _gc(**settings), tokenizer)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_model_default_it_cannot_honour_says_where_it_came_from(tokenizer):
    cfg = EvalConfig(engine="ctranslate2")
    with pytest.raises(ConfigError, match=r"typical_p=0.5 \(from the model's generation config or task settings; "
                                          r"override it with --typical_p, or unset it with --typical_p none\)"):
        ct2.check(cfg, None, _gc(typical_p=0.5, do_sample=True), tokenizer)


@pytest.mark.parametrize("omp, local_world, cores, expected", [
    ("", 1, 2, 2), ("", 2, 2, 1), ("", 3, 2, 1), ("", 2, 16, 8), ("4", 2, 16, 4), ("1", 1, 16, 1),
])
def test_cpu_ranks_on_one_machine_share_its_cores(monkeypatch, omp, local_world, cores, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert ct2.cpu_threads(local_world) == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"compute_type": "int8"}, "--compute_type needs --engine ctranslate2"),
    ({"tokenizer_name": "x"}, "--tokenizer_name needs --engine ctranslate2"),
    ({"engine": "ctranslate2", "fp16": True}, "--fp16 is for --engine hf; with --engine ctranslate2 use --compute_type float16"),
    ({"engine": "ctranslate2", "compute_type": "int4"}, "--compute_type must be one of default, auto, float32, int8"),
    ({"engine": "vllm"}, "--engine must be one of hf, ctranslate2, got 'vllm'"),
])
def test_engine_flags_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        EvalConfig(**kwargs)


def test_compute_type_defaults_to_ctranslate2s_default():
    assert EvalConfig(engine="ctranslate2").compute_type == "default" and EvalConfig().compute_type is None


# ---------------------------------------------------------------- settings, on the embedded model


def _engine(name: str, settings: tuple = (), n: int = 1):
    cfg = EvalConfig(engine=name, generate_kwargs=settings, num_return_sequences=n)
    tok = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    gc = model_settings.generation_config_for(model_config, base, tok, cfg)
    engine = engines.load(cfg, tokenizer=tok, model_config=model_config, generation_config=gc,
                          device=__import__("torch").device("cpu"), env=DistEnv())
    sources = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()[:24]
    ids, _ = model_settings.encode_sources(tok, sources, model_settings.source_prefix(model_config, cfg), 1024)
    return engine, [ids[i:i + 8] for i in range(0, len(ids), 8)]


def _outputs(engine, batches) -> list:
    return [engine.generate(batch, i) for i, batch in enumerate(batches)]


@pytest.mark.parametrize("settings", [
    (),  # the model's task settings: 4 beams, max_length 120, forced EOS
    (("num_beams", 1),),
    (("max_new_tokens", 10),),
    (("max_length", 11),),
    (("num_beams", 1), ("min_new_tokens", 40)),
    (("length_penalty", 2.0),),
    (("num_beams", 5), ("length_penalty", 0.5)),
])
def test_ctranslate2_generates_what_generate_does(cache, settings):
    """Texts and generated-token counts, batch for batch: the lengths, the forced EOS at the
    length limit and the beams are mapped exactly."""
    hf = _outputs(*_engine("hf", settings))
    ours = _outputs(*_engine("ctranslate2", settings))
    assert [o.preds for o in ours] == [o.preds for o in hf]
    assert [o.n_tokens for o in ours] == [o.n_tokens for o in hf]


def test_no_repeat_ngram_size_is_honoured(cache):
    engine, batches = _engine("ctranslate2", (("no_repeat_ngram_size", 2), ("renormalize_logits", True)))
    tokens = [r.hypotheses[0] for b in batches for r in engine.model.translate_batch(
        [engine.tokenizer.convert_ids_to_tokens(x) for x in b], **engine.mapping.options)]
    bigrams = [list(zip(t, t[1:])) for t in tokens]
    assert all(len(b) == len(set(b)) for b in bigrams)
    plain, _ = _engine("ctranslate2")
    repeated = [r.hypotheses[0] for b in batches for r in plain.model.translate_batch(
        [plain.tokenizer.convert_ids_to_tokens(x) for x in b], **plain.mapping.options)]
    assert any(len(set(zip(t, t[1:]))) < len(t) - 1 for t in repeated)  # the setting had work to do


def test_repetition_penalty_changes_the_outputs(cache):
    penalised = _outputs(*_engine("ctranslate2", (("num_beams", 1), ("repetition_penalty", 1.5))))
    plain = _outputs(*_engine("ctranslate2", (("num_beams", 1),)))
    assert [o.preds for o in penalised] != [o.preds for o in plain]


def test_candidates_come_with_scores_best_first(cache):
    engine, batches = _engine("ctranslate2", (("num_beams", 4), ("length_penalty", 0.0)), n=3)
    out = engine.generate(batches[0], 0)
    assert all(len(p) == 3 for p in out.preds) and all(len(s) == 3 for s in out.scores)
    assert all(s == sorted(s, reverse=True) for s in out.scores)


def test_sampling_is_seeded_per_batch(cache):
    settings = (("do_sample", True), ("num_beams", 1), ("top_k", 0), ("temperature", 1.5))
    engine, batches = _engine("ctranslate2", settings, n=3)
    first, again, other = engine.generate(batches[0], 4), engine.generate(batches[0], 4), engine.generate(batches[0], 5)
    assert first == again and first.preds != other.preds
    assert all(len(set(p)) > 1 for p in first.preds)  # three draws, not one text three times


SAMPLE = ["--do_sample", "true", "--num_beams", "1", "--num_return_sequences", "3", "--n_obs", "24", "--bs", "4",
          "--seed", "3"]
SELECT = ["--select", "mbr", "--select_metric", "chrf", "--pseudo_target"]


def test_pseudolabels_from_ctranslate2(cache, tmp_path):
    """Beam candidates with their scores, and seeded samples that are the same at 1 and 2 ranks,
    the samples chrF-MBR-selected in the run (--select): each generation is the candidate `select`
    chooses over the run's own pseudolabel file, the same at 1 and 2 ranks."""
    from seq2seq_eval.selection.command import selection_lines

    beams = tmp_path / "beams"
    # length_penalty 0: with forced_eos_token_id, CTranslate2 gives generate()'s candidates below the
    # best only then (ct2_rules).
    assert_ok(single([*CT2, "--num_return_sequences", "3", "--length_penalty", "0", "--n_obs", "24",
                      "--save_dir", str(beams)], cwd=tmp_path,
                     env={"SEQ2SEQ_EVAL_CACHE": str(cache)}))
    rows = [json.loads(line) for line in (beams / "test_pseudolabels.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and all(len(r["candidates"]) == 3 and len(r["scores"]) == 3 for r in rows)
    assert all(r["scores"] == sorted(r["scores"], reverse=True) for r in rows)
    one, two = tmp_path / "one", tmp_path / "two"
    assert_ok(single([*CT2, *SAMPLE, *SELECT, "--save_dir", str(one)], cwd=tmp_path,
                     env={"SEQ2SEQ_EVAL_CACHE": str(cache)}))
    assert_ok(run_ranks(2, [*CT2, *SAMPLE, *SELECT, "--save_dir", str(two)], cwd=tmp_path,
                        env={"SEQ2SEQ_EVAL_CACHE": str(cache)}))
    for name in ("pseudolabel_results.json", "test_pseudolabels.jsonl", "test_generations.txt", "test_examples.jsonl",
                 "test.pseudo.target"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    sampled = json.loads((one / "pseudolabel_results.json").read_text())
    assert sum(len(set(r["preds"])) > 1 for r in sampled) >= len(sampled) // 3  # draws, not one text thrice
    generations = (one / "test_generations.txt").read_text(encoding="utf-8").splitlines()
    examples = [json.loads(line) for line in (one / "test_examples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [e["candidates"][e["selected"]] for e in examples] == generations
    assert any(e["selected"] != 0 for e in examples)  # the selection changed something
    selected = [json.loads(line) for line in selection_lines(one / "test_pseudolabels.jsonl", "mbr", "chrf")]
    assert [s["prediction"] for s in selected] == generations
    assert [s["select_scores"] for s in selected] == [e["select_scores"] for e in examples]
    assert (one / "test.pseudo.target").read_text(encoding="utf-8").splitlines() == generations
    assert [r["preds"][0] for r in sampled] == generations  # the legacy file: the selection first


def test_resume_after_a_kill_reuses_the_converted_model(tmp_path):
    cache, save = tmp_path / "cache", tmp_path / "out"
    slow = [*CT2, "--n_obs", "120", "--bs", "1", "--num_beams", "8", "--min_new_tokens", "60", "--max_new_tokens", "60",
            "--renormalize_logits", "true", "--save_dir", str(save)]
    env = _env({"SEQ2SEQ_EVAL_CACHE": str(cache)})
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_eval", *slow], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = Path(f"{save}_tmp") / "journal_rank_0.jsonl"
    try:
        wait_for_lines(journal, 3)
        proc.send_signal(signal.SIGKILL)
    finally:
        _, first = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, first  # killed mid-run, not finished
    assert first.count("converting ") == 1
    converted = [p for p in (cache / "ctranslate2").iterdir() if p.is_dir()]
    assert len(converted) == 1 and (converted[0] / "model.bin").is_file()
    stamp = (converted[0] / "model.bin").stat().st_mtime_ns
    # Another process (forked from the fork server: only the killed one needed a pid of its own),
    # which finds the conversion where the killed run left it.
    resumed = single([*slow, "--resume"], cwd=tmp_path, timeout=300, env={"SEQ2SEQ_EVAL_CACHE": str(cache)})
    assert_ok(resumed)
    assert "converting " not in resumed.stderr
    assert (converted[0] / "model.bin").stat().st_mtime_ns == stamp
    per_rank = metrics_of(save)["throughput"]["per_rank"][0]
    assert per_rank["resumed_batches"] >= 3 and per_rank["resumed_batches"] + per_rank["generated_examples"] == 120


def test_concurrent_conversions_leave_one_complete_model(tmp_path):
    """Two processes converting the same model at once (two ranks, two runs): one converts, the
    other waits for it; nothing half-written is ever at the final name."""
    cache = tmp_path / "cache"
    (cache / "ctranslate2").mkdir(parents=True)
    script = tmp_path / "convert.py"
    script.write_text("import sys, logging; logging.basicConfig(level=logging.INFO); from seq2seq_eval.engines import ct2; "
                      "from seq2seq_eval.config import EMBEDDED_MODEL; "
                      "print(ct2.converted_model(str(EMBEDDED_MODEL), 120))\n")
    # Both forked from the fork server, started together (new interpreters would spend ~4 s each
    # importing before either reached the conversion).
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda _: single([], tmp_path, 180, env={"SEQ2SEQ_EVAL_CACHE": str(cache)}, script=script),
                              range(2)))
    outs = [(p.stdout, p.stderr) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1
    assert sum(err.count("converting ") for _, err in outs) == 1
    assert sorted(p.name for p in (cache / "ctranslate2").iterdir() if p.is_dir()) == [Path(paths.pop()).name]


def test_a_converted_folder_is_accepted(cache, tmp_path):
    """A CTranslate2 model folder: with --tokenizer_name, or with the tokenizer copied beside it."""
    from seq2seq_eval.config import EMBEDDED_MODEL

    folder = tmp_path / "ct2_model"
    converted = ct2.converted_model(str(EMBEDDED_MODEL), 120)
    subprocess.run(["cp", "-r", str(converted), str(folder)], check=True)
    args = ["--model_name", str(folder), *CT2, "--n_obs", "16"]
    refused = single([*args, "--save_dir", str(tmp_path / "none")], cwd=tmp_path)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "a CTranslate2 model folder without the Hugging Face tokenizer: pass --tokenizer_name" in refused.stderr
    named, direct = tmp_path / "named", tmp_path / "direct"
    assert_ok(single([*args, "--tokenizer_name", str(EMBEDDED_MODEL), "--save_dir", str(named)], cwd=tmp_path))
    assert_ok(single([*CT2, "--n_obs", "16", "--save_dir", str(direct)], cwd=tmp_path,
                     env={"SEQ2SEQ_EVAL_CACHE": str(cache)}))
    # Named after the model it came from, it runs with that model's task settings.
    assert (named / "test_generations.txt").read_bytes() == (direct / "test_generations.txt").read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((EMBEDDED_MODEL / name).read_bytes())
    beside = tmp_path / "beside"
    assert_ok(single([*args, "--save_dir", str(beside)], cwd=tmp_path))
    assert metrics_of(beside)["provenance"]["model"]["name"] == str(folder)
    with_hf = single(["--model_name", str(folder), "--save_dir", str(tmp_path / "hf")], cwd=tmp_path)
    assert with_hf.returncode == 1 and with_hf.stderr.strip().splitlines() == [
        f"seq2seq_eval: error: --model_name {folder}: a CTranslate2 model folder; run it with --engine ctranslate2"]


def test_unsupported_settings_fail_before_any_work(tmp_path):
    save = tmp_path / "out"
    proc = single([*CT2, "--num_beams", "4", "--num_beam_groups", "2", "--diversity_penalty", "0.5",
                   "--save_dir", str(save)], cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cannot honour the generation setting diversity_penalty=0.5 (set by --diversity_penalty)" in proc.stderr
    assert not save.exists() and not list(Path(f"{save}_tmp").glob("journal_*"))


def test_without_the_package_one_line_names_the_extra(tmp_path):
    script = tmp_path / "without.py"  # a process of its own, forked from the fork server (no ctranslate2 in it)
    script.write_text("import sys; sys.modules['ctranslate2'] = None; from seq2seq_eval.cli import main; "
                      f"raise SystemExit(main(['--engine', 'ctranslate2', '--save_dir', {str(tmp_path / 'out')!r}]))\n")
    proc = single([], tmp_path, 120, script=script)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "seq2seq_eval: error: --engine ctranslate2 needs the ctranslate2 package, which is not installed; "
        'install it with: pip install -e ".[ctranslate2]" (or pip install ctranslate2)']


class _NoCublas:
    """A translator whose first matrix product fails as CTranslate2 4.x does on a machine that has
    only CUDA 13's cuBLAS (seen on the lent H100 machine): the library is opened at first use."""

    def translate_batch(self, *args, **kwargs):
        raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")


def test_a_missing_cuda_library_is_one_line_at_load_not_a_traceback_in_a_batch(cache, tokenizer):
    import torch

    from seq2seq_eval.errors import ModelError

    engine, _ = _engine("ctranslate2")
    ct2.check_cuda_libraries(engine.model, tokenizer, "4.8.5", torch.device("cpu"))  # a working one passes
    with pytest.raises(ModelError) as e:
        ct2.check_cuda_libraries(_NoCublas(), tokenizer, "4.8.5", torch.device("cuda", 0))
    assert str(e.value).startswith("CTranslate2 4.8.5 cannot run on cuda:0: Library libcublas.so.12 is not found "
                                   "or cannot be loaded; CTranslate2's CUDA build needs that library")
    assert "\n" not in str(e.value) and "LD_LIBRARY_PATH" in str(e.value)
