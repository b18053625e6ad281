"""The legacy run_eval.py command line, `python -m seq2seq_eval MODEL INPUT_PATH SAVE_PATH ...`.

run_eval.py (huggingface/transformers examples/legacy/seq2seq/run_eval.py) takes the positional
model, input and save paths, --reference_path, --score_path (default metrics.json), --device,
--task (default summarization; "translation" in the name means BLEU), --bs, --n_obs (default -1:
all), --prefix, --fp16, --dump-args, --info, and passes any other --key value to generate().
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import assert_ok, make_corpus, single, torchrun, write_legacy
from tiny_model import build_tiny_t5

from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.legacy import build_legacy, is_legacy_command, legacy_scores

DATA = EMBEDDED_DATA["translation"]

# The legacy README's own example (examples/legacy/seq2seq/README.md, "For t5, you need to
# specify --task translation_{src}_to_{tgt}"), with DATA_DIR the embedded sample set.
README_EXAMPLE = ["t5-base", f"{DATA}/val.source", "t5_val_generations.txt", "--reference_path", f"{DATA}/val.target",
                  "--score_path", "enro_bleu.json", "--task", "translation_en_to_ro", "--n_obs", "100",
                  "--device", "cuda", "--fp16", "--bs", "32"]

T5_TASK_PARAMS = {  # as google-t5/t5-small publishes them (sources in test_zoo.py)
    "summarization": {"early_stopping": True, "length_penalty": 2.0, "max_length": 200, "min_length": 30,
                      "no_repeat_ngram_size": 3, "num_beams": 4, "prefix": "summarize: "},
    **{f"translation_en_to_{lang}": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                                     "prefix": f"translate English to {name}: "}
       for lang, name in (("de", "German"), ("fr", "French"), ("ro", "Romanian"))},
}


def _embedded(argv: list[str]) -> list[str]:
    return [str(EMBEDDED_MODEL) if a == "t5-base" else a for a in argv]


def _on_cpu(argv: list[str]) -> list[str]:
    """The example for a machine without a GPU: --device cpu, and no --fp16 (refused on CPU)."""
    out = [a for a in argv if a != "--fp16"]
    out[out.index("--device") + 1] = "cpu"
    return out


# ---------------------------------------------------------------- parsing (no model)


@pytest.mark.parametrize(
    "argv, legacy",
    [
        (["m", "in.txt", "out.txt"], True),
        (["./m", "in.txt", "out.txt", "--bs", "4"], True),
        (["--model_name", "m"], False),
        ([], False),
        (["score", "--task", "translation"], False),
        (["compare", "a", "b"], False),
    ],
)
def test_the_legacy_form_is_recognised_by_its_positional_model(argv, legacy):
    assert is_legacy_command(argv) is legacy


def test_the_readme_example_parses_to_the_same_run():
    cfg, out = build_legacy(README_EXAMPLE)
    assert (cfg.model_name, cfg.input_path, cfg.reference_path) == ("t5-base", f"{DATA}/val.source", f"{DATA}/val.target")
    assert (cfg.task, cfg.task_family, cfg.metric_name) == ("translation_en_to_ro", "translation", "bleu")
    assert (cfg.n_obs, cfg.device, cfg.fp16, cfg.bs, cfg.data_dir) == (100, "cuda", True, 32, "")
    assert (out.save_path, out.score_path, out.dump_args, out.info) == (
        Path("t5_val_generations.txt"), Path("enro_bleu.json"), False, None)
    assert cfg.save_dir == ".t5_val_generations.txt.seq2seq_eval" and not out.keep_save_dir


@pytest.mark.parametrize(
    "argv, expected",
    [
        # run_eval.py's defaults: --task summarization, --n_obs -1 (all), --score_path metrics.json
        (["m", "a.src", "o/gen.txt", "--reference_path", "a.tgt"],
         {"task": "summarization", "n_obs": None, "score_path": Path("metrics.json"), "gen": {}}),
        (["m", "a.src", "gen.txt", "--n_obs", "-1"], {"n_obs": None, "score_path": None}),
        (["m", "a.src", "gen.txt", "--n_obs", "0"], {"n_obs": None}),
        # generate options anywhere after the positionals, spelt --key value or --key=value
        (["m", "a.src", "gen.txt", "--num_beams", "2", "--task", "translation", "--length_penalty=0.8"],
         {"task": "translation", "gen": {"num_beams": 2, "length_penalty": 0.8}}),
        # a known option before the positionals takes its value, as argparse does for run_eval.py
        (["--bs", "4", "m", "a.src", "gen.txt"], {"bs": 4, "model_name": "m"}),
        (["m", "a.src", "gen.txt", "--dump-args", "--info", "lang=en-ro"], {"dump_args": True, "info": "lang=en-ro"}),
        (["m", "a.src", "gen.txt", "--info", "--dump_args"], {"dump_args": True, "info_is_a_date": True}),
        (["m", "a.src", "gen.txt", "--prefix", "translate: ", "--save_dir", "keep"],
         {"prefix": "translate: ", "save_dir": "keep", "keep_save_dir": True}),
    ],
)
def test_legacy_arguments(argv, expected):
    cfg, out = build_legacy(argv)
    for key, value in expected.items():
        if key == "gen":
            assert cfg.gen_kwargs == value
        elif key == "info_is_a_date":
            assert len(out.info) == len("2020-09-13 18:44:43") and out.info[4] == "-"
        elif hasattr(out, key):
            assert getattr(out, key) == value, key
        else:
            assert getattr(cfg, key) == value, key


@pytest.mark.parametrize(
    "argv, message",
    [
        (["m", "a.src"], r"the following arguments are required: SAVE_PATH"),
        (["m", "a.src", "gen.txt", "--task", "qa"], r"--task must be translation, summarization or a name containing"),
        (["m", "a.src", "gen.txt", "--device", "cuda:1"], r"argument --device: invalid choice: 'cuda:1'"),
        (["m", "a.src", "gen.txt", "--num_beams"], r"--num_beams needs a value"),
    ],
)
def test_legacy_argument_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        build_legacy(argv)


def test_score_path_keys_are_run_evals():
    summary = {"bleu": 26.887, "bleu_signature": "nrefs:1|...", "n_obs": 10, "seconds_per_sample": 0.123,
               "n_gpus": 2, "throughput": {"generation_seconds": 1.9}, "provenance": {}}
    assert legacy_scores(summary, {"num_beams": 8, "early_stopping": True}, "pair=en-ru") == {
        "bleu": 26.887, "bleu_signature": "nrefs:1|...", "n_obs": 10, "runtime": 1, "seconds_per_sample": 0.1,
        "num_beams": 8, "early_stopping": True, "info": "pair=en-ru"}
    assert list(legacy_scores(summary, {}, None)) == ["bleu", "bleu_signature", "n_obs", "runtime", "seconds_per_sample"]


# ---------------------------------------------------------------- real runs


def _bleu(preds: list[str], refs: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(preds, [refs]).score


def test_readme_example_under_torchrun_equals_the_projects_form(tmp_path):
    """The legacy README's example (on CPU: --device cpu, no --fp16) at 2 ranks writes the same
    generations as the project's own form at 1 rank, and SCORE_PATH's bleu is sacrebleu's on
    SAVE_PATH."""
    legacy_dir, own_dir = tmp_path / "legacy", tmp_path / "own"
    legacy_dir.mkdir()
    assert_ok(torchrun(2, _on_cpu(_embedded(README_EXAMPLE)), cwd=legacy_dir, timeout=400))
    own = ["--model_name", str(EMBEDDED_MODEL), "--data_dir", str(DATA), "--type_path", "val",
           "--task", "translation_en_to_ro", "--n_obs", "100", "--device", "cpu", "--bs", "32", "--save_dir", str(own_dir)]
    assert_ok(single(own, cwd=tmp_path, timeout=400))

    save_path = legacy_dir / "t5_val_generations.txt"
    assert save_path.read_bytes() == (own_dir / "val_generations.txt").read_bytes()
    generations = save_path.read_text(encoding="utf-8").splitlines()
    references = (DATA / "val.target").read_text(encoding="utf-8").splitlines()[:100]
    assert len(generations) == 100
    scores = json.loads((legacy_dir / "enro_bleu.json").read_text())
    assert list(scores)[-3:] == ["n_obs", "runtime", "seconds_per_sample"]
    assert "seconds_per_generated_sample" not in scores  # run_eval.py's keys, no others
    assert scores["n_obs"] == 100 and isinstance(scores["runtime"], int)
    assert scores["seconds_per_sample"] == round(scores["runtime"] / 100, 4)
    assert scores["bleu"] == _bleu(generations, references)
    assert scores["bleu"] == json.loads((own_dir / "val_bleu.json").read_text())["bleu"]
    # Only run_eval.py's two files and their folder's record (so that a rerun replaces them, and
    # nothing else): the project's own outputs went to a folder removed afterwards.
    assert sorted(p.name for p in legacy_dir.iterdir()) == [".seq2seq_eval_outputs.json", "enro_bleu.json",
                                                           "t5_val_generations.txt"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_readme_example_as_written_on_a_gpu(tmp_path):
    proc = single(_embedded(README_EXAMPLE), cwd=tmp_path, timeout=400,
                  env={"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")})
    assert_ok(proc)
    generations = (tmp_path / "t5_val_generations.txt").read_text(encoding="utf-8").splitlines()
    references = (DATA / "val.target").read_text(encoding="utf-8").splitlines()[:100]
    scores = json.loads((tmp_path / "enro_bleu.json").read_text())
    assert len(generations) == 100 and scores["bleu"] == _bleu(generations, references)


@pytest.fixture(scope="module")
def t5_style(tmp_path_factory) -> Path:
    """A tiny T5 with t5-small's three translation entries (and its summarization entry)."""
    src, tgt = make_corpus(200, seed=1)
    return build_tiny_t5(tmp_path_factory.mktemp("t5_style") / "model", src + tgt, task_params=T5_TASK_PARAMS)


def test_legacy_runs_and_one_line_errors(t5_style, tmp_path):
    """Four real processes, two at a time: a run without references, and three refusals."""
    src, tgt = make_corpus(5, seed=4)
    data = write_legacy(tmp_path / "data", src, tgt)
    runs = {
        "no-references": ([str(t5_style), str(data / "test.source"), "out/gen.txt", "--task", "translation_en_to_fr",
                           "--device", "cpu", "--max_new_tokens", "4"], tmp_path / "a"),
        "plain-translation": ([str(t5_style), str(data / "test.source"), "gen.txt", "--task", "translation",
                               "--device", "cpu"], tmp_path / "b"),
        "fp16-on-cpu": ([str(t5_style), str(data / "test.source"), "gen.txt", "--task", "translation_en_to_de",
                         "--device", "cpu", "--fp16"], tmp_path / "c"),
        "dump-args-in-own-form": (["--model_name", str(t5_style), "--dump-args"], tmp_path / "d"),
    }
    for _, cwd in runs.values():
        cwd.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(runs, pool.map(lambda item: single(item[0], cwd=item[1]), runs.values())))

    assert_ok(procs["no-references"])
    a = tmp_path / "a"
    generations = (a / "out" / "gen.txt").read_text(encoding="utf-8").splitlines()
    assert len(generations) == 5
    # run_eval.py writes SCORE_PATH only against references; nothing else is left behind.
    assert sorted(str(p.relative_to(a)) for p in a.rglob("*")) == ["out", "out/.seq2seq_eval_outputs.json", "out/gen.txt"]

    expected = {
        "plain-translation": (2, ["--task translation:", "translation_en_to_de, translation_en_to_fr, translation_en_to_ro",
                                  "none named 'translation'"]),
        "fp16-on-cpu": (2, ["--fp16", "--bf16"]),
        "dump-args-in-own-form": (2, ["--dump-args belongs to the legacy command line", "MODEL INPUT_PATH SAVE_PATH"]),
    }
    for case, (code, fragments) in expected.items():
        proc = procs[case]
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("seq2seq_eval: error: ")]
        assert proc.returncode == code and len(lines) == 1, (case, proc.returncode, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, case
        for fragment in fragments:
            assert fragment in lines[0], (case, lines[0])
        assert not (runs[case][1] / "gen.txt").exists()
