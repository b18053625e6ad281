"""The ecosystem around the evaluator: `datasets` inputs, multilingual tokenizers, multi-node
torchrun, srun without torchrun, pseudolabels for distillation, and provenance.

End-to-end runs are real processes, offline. The same 9 examples are written as JSON Lines, CSV,
Parquet and a save_to_disk folder, so every format and launcher must give byte-identical
generations. 9 examples in batches of 2 make 5 batches: uneven over 2 ranks. The column rules and
the language-code conventions are also checked in-process, as tables of tiny cases.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import _env, assert_ok, free_port, make_corpus, metric_values, metrics_of, run_ranks, single
from tiny_multilingual import CONVENTIONS, LANG_CODES, build_tiny_multilingual

N = 9
ARGS = ["--bs", "2"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The same examples in every supported layout, plus the XSum and WMT column layouts."""
    import datasets

    root = tmp_path_factory.mktemp("hf_files")
    src, tgt = make_corpus(N, seed=11)
    ids = [f"ex{i}" for i in range(N)]
    plain = datasets.Dataset.from_dict({"id": ids, "source": src, "target": tgt})
    out = {"jsonl": root / "test.jsonl", "csv": root / "test.csv", "parquet": root / "test.parquet",
           "saved": root / "saved", "xsum": root / "xsum.jsonl", "wmt": root / "wmt.jsonl"}
    plain.to_json(out["jsonl"])
    plain.to_csv(out["csv"], index=False)
    plain.to_parquet(out["parquet"])
    datasets.DatasetDict({"test": plain, "train": plain.select(range(2))}).save_to_disk(out["saved"])
    datasets.Dataset.from_dict({"id": ids, "document": src, "summary": tgt}).to_json(out["xsum"])
    # WMT layout: no id column (ids are row numbers), one dict per row keyed by language
    datasets.Dataset.from_dict({"translation": [{"en": s, "ro": t} for s, t in zip(src, tgt)]}).to_json(out["wmt"])
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """A private datasets cache: runs neither read nor pollute ~/.cache."""
    return {"HF_DATASETS_CACHE": str(tmp_path_factory.mktemp("hf_cache"))}


@pytest.fixture(scope="module")
def reference(tiny_model, files, env, tmp_path_factory) -> Path:
    """One process over the JSON Lines file: what every other format and launcher must match."""
    root = tmp_path_factory.mktemp("reference")
    save = root / "out"
    assert_ok(single(["--model_name", str(tiny_model), "--dataset", str(files["jsonl"]), *ARGS,
                      "--save_dir", str(save)], cwd=root, env=env))
    return save


def _same_results(save: Path, reference: Path) -> None:
    assert (save / "test_generations.txt").read_bytes() == (reference / "test_generations.txt").read_bytes()
    assert metric_values(metrics_of(save)) == metric_values(metrics_of(reference))


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seq2seq_eval: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


# --- datasets inputs --------------------------------------------------------------------------


def test_jsonl_reference(reference, files):
    m = metrics_of(reference)
    assert m["n_obs"] == N
    assert m["provenance"]["data"]["path"] == str(files["jsonl"].resolve())
    assert (m["provenance"]["data"]["split"], m["provenance"]["data"]["dataset_config"]) == (None, None)
    assert len((reference / "test_generations.txt").read_text().splitlines()) == N


def test_csv_equals_jsonl(tiny_model, files, env, reference, tmp_path):
    assert_ok(single(["--model_name", str(tiny_model), "--dataset", str(files["csv"]), *ARGS,
                      "--save_dir", str(tmp_path / "out")], cwd=tmp_path, env=env))
    _same_results(tmp_path / "out", reference)


# Values a loader could change: one id column mixing strings and numbers (the datasets JSON loader
# reads "007" as 7, "1e3" as 1000.0, and 0 and "0" as one id), a 71-bit integer, records without an
# id (--data_dir numbers them by line), a blank line, references mixing a text and a list of texts
# whose texts look like JSON ("42", "null", "true"), and texts holding every character
# str.splitlines() splits on.
AS_WRITTEN = [
    {"id": "007", "source": "the cat sat", "target": "42"},
    {"id": 8, "source": "a dog runs\u2028fast", "target": ["null", "a dog"]},
    {"id": "0x1F", "source": "red house\x85tree", "target": "true"},
    {"id": "1e3", "source": "blue\u2029mat", "target": "1e3"},
    {"id": 0, "source": "Zürich café", "target": "x y"},
    {"id": "0", "source": "big small", "target": ["007", "8"]},
    None,  # a blank line
    {"source": "on the mat", "target": "y z"},
    {"id": 2**70, "source": "slow fast", "target": "z"},
    {"id": "x9", "source": "a\x0bb\x0cc\x1cd\x1de\x1ef\rg\nh", "target": "w"},
]


def test_dataset_and_data_dir_read_one_file_alike(tiny_model, env, tmp_path):
    """--dataset and --data_dir on the same JSON Lines file: every output byte the same, the ids
    as the file holds them, one line per example for any line splitter."""
    data = tmp_path / "test.jsonl"
    data.write_text("".join("\n" if r is None else json.dumps(r) + "\n" for r in AS_WRITTEN), encoding="utf-8")
    saves = {flag: tmp_path / flag.strip("-") for flag in ("--dataset", "--data_dir")}
    for flag, save in saves.items():
        assert_ok(single(["--model_name", str(tiny_model), flag, str(data), *ARGS, "--save_dir", str(save)],
                         cwd=tmp_path, env=env))
    names = sorted(p.name for p in saves["--data_dir"].iterdir())
    assert names == sorted(p.name for p in saves["--dataset"].iterdir())
    for name in names:
        a, b = (saves[flag] / name for flag in saves)
        if name == "test_bleu.json":  # the provenance names the option; the scores are the same
            assert metric_values(json.loads(a.read_text())) == metric_values(json.loads(b.read_text()))
        elif not name.startswith("."):
            assert a.read_bytes() == b.read_bytes(), name
    written = [r.get("id", line) for line, r in enumerate(AS_WRITTEN) if r is not None]
    text = (saves["--dataset"] / "test_examples.jsonl").read_text(encoding="utf-8")
    assert len(text.splitlines()) == len(written)
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["id"] for r in rows] == written
    assert [r["source"] for r in rows] == [r["source"] for r in AS_WRITTEN if r is not None]


def test_a_column_the_loader_changed_is_refused_where_the_file_cannot_be_read(tmp_path):
    """A folder of JSON Lines files is loaded by the datasets loader alone: a column of mixed
    kinds (which it changes) is refused, naming the column and a way out."""
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.errors import DataError
    from seq2seq_eval.inputs.hub import load_hf_examples

    folder = tmp_path / "folder"
    folder.mkdir()
    rows = [{"id": "007", "source": "a", "target": "x"}, {"id": 8, "source": "b", "target": "y"}]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"column 'id': mixes kinds of values .* pass the data file itself as --dataset"):
        load_hf_examples(EvalConfig(dataset=str(folder)), need_targets=True)
    # The file itself: read as written.
    examples = load_hf_examples(EvalConfig(dataset=str(folder / "test.jsonl")), need_targets=True)
    assert [e.id for e in examples.items] == ["007", 8]


def test_saved_folder_at_2_ranks_equals_1_rank(tiny_model, files, env, reference, tmp_path):
    """A save_to_disk DatasetDict, split picked by --type_path, over 2 real ranks."""
    save = tmp_path / "out"
    assert_ok(run_ranks(2, ["--model_name", str(tiny_model), "--dataset", str(files["saved"]), *ARGS,
                           "--save_dir", str(save)], cwd=tmp_path, env=env))
    _same_results(save, reference)
    m = metrics_of(save)
    assert m["provenance"]["world_size"] == 2
    # 5 batches of 2 dealt 2 and 3; a rank that finishes first may take the other's last one.
    per_rank = m["throughput"]["per_rank"]
    assert sorted(r["planned_batches"] for r in per_rank) == [2, 3] and sum(r["examples"] for r in per_rank) == 9


def test_pseudolabels_from_parquet_load_with_datasets(tiny_model, files, env, tmp_path):
    import datasets

    save = tmp_path / "out"
    assert_ok(single(["--model_name", str(tiny_model), "--dataset", str(files["parquet"]), *ARGS,
                      "--num_return_sequences", "2", "--pseudo_target", "--save_dir", str(save)], cwd=tmp_path, env=env))
    labels = datasets.load_dataset("json", data_files=str(save / "test_pseudolabels.jsonl"), split="train",
                                   cache_dir=str(tmp_path / "cache"))
    assert set(labels.column_names) >= {"id", "source", "target", "candidates", "scores"}
    truth = datasets.load_dataset("parquet", data_files=str(files["parquet"]), split="train",
                                  cache_dir=str(tmp_path / "cache"))
    assert labels["id"] == truth["id"] and labels["source"] == truth["source"] and labels["target"] == [[t] for t in truth["target"]]
    assert all(len(c) == 2 and all(isinstance(x, str) for x in c) for c in labels["candidates"])
    assert all(len(s) == 2 and s[0] >= s[1] for s in labels["scores"])
    best = (save / "test.pseudo.target").read_text(encoding="utf-8").splitlines()
    assert best == [c[0] for c in labels["candidates"]]


def test_xsum_default_columns(tiny_model, files, env, tmp_path):
    """document/summary/id are found without --*_column; --debug writes the ordered references."""
    save = tmp_path / "out"
    assert_ok(single(["--model_name", str(tiny_model), "--dataset", str(files["xsum"]), "--task", "summarization",
                      *ARGS, "--save_dir", str(save), "--debug"], cwd=tmp_path, env=env))
    summaries = [json.loads(line)["summary"] for line in files["xsum"].read_text(encoding="utf-8").splitlines()]
    assert (save / "test_references.txt").read_text(encoding="utf-8").splitlines() == summaries
    m = metrics_of(save, "test_rouge.json")
    assert m["n_obs"] == N and "rougeLsum" in m


def test_wmt_translation_dict_with_mbart50_language_codes(ml_models, files, env, tmp_path):
    """translation.en / translation.ro picked from --src_lang en_XX --tgt_lang ro_RO."""
    save = tmp_path / "out"
    assert_ok(single(["--model_name", str(ml_models["mbart50"]), "--dataset", str(files["wmt"]),
                      "--src_lang", "en_XX", "--tgt_lang", "ro_RO", *ARGS, "--save_dir", str(save), "--debug"],
                     cwd=tmp_path, env=env))
    rows = [json.loads(line)["translation"] for line in files["wmt"].read_text(encoding="utf-8").splitlines()]
    assert (save / "test_references.txt").read_text(encoding="utf-8").splitlines() == [r["ro"] for r in rows]
    m = metrics_of(save)
    assert m["n_obs"] == N
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ml_models["mbart50"])
    assert m["provenance"]["generation"]["forced_bos_token_id"] == tok.convert_tokens_to_ids("ro_RO")
    assert "ro_RO" not in (save / "test_generations.txt").read_text(encoding="utf-8")


def test_missing_column_is_one_line_listing_columns(tiny_model, files, env, tmp_path):
    proc = single(["--model_name", str(tiny_model), "--dataset", str(files["wmt"]), "--source_column", "translation.de",
                   "--target_column", "translation.ro", "--save_dir", str(tmp_path / "out")], cwd=tmp_path, env=env)
    line = _one_line_error(proc)
    assert "no column 'translation.de'" in line and "columns: translation, translation.en, translation.ro" in line


def test_missing_split_is_one_line_listing_splits(tiny_model, files, env, tmp_path):
    proc = single(["--model_name", str(tiny_model), "--dataset", str(files["saved"]), "--split", "validation",
                   "--save_dir", str(tmp_path / "out")], cwd=tmp_path, env=env)
    line = _one_line_error(proc)
    assert "no split 'validation'" in line and "available splits: test, train" in line


# --- load_hf_examples in-process: a table of tiny cases -----------------------------------------


def _saved(tmp_path: Path, columns: dict, split: str = "test") -> Path:
    import datasets

    folder = tmp_path / f"ds{len(list(tmp_path.iterdir()))}"
    datasets.DatasetDict({split: datasets.Dataset.from_dict(columns)}).save_to_disk(folder)
    return folder


@pytest.mark.parametrize("columns, flags, expected", [
    ({"article": ["a1", "a2"], "highlights": ["h1", "h2"], "id": ["x", "y"]}, {},
     [("x", "a1", "h1"), ("y", "a2", "h2")]),
    ({"document": ["d"], "summary": ["s"]}, {}, [(0, "d", "s")]),
    ({"source": ["s"], "target": ["t"], "id": [7]}, {}, [(7, "s", "t")]),
    ({"translation": [{"de": "hallo", "en": "hello"}]}, {"src_lang": "en_XX", "tgt_lang": "de_DE"},
     [(0, "hello", "hallo")]),
    ({"meta": [{"q": {"text": "deep"}}], "answer": ["a"], "key": ["k"]},
     {"source_column": "meta.q.text", "target_column": "answer", "id_column": "key"}, [("k", "deep", "a")]),
    ({"article": ["a1", "a2", "a3"], "highlights": ["h1", "h2", "h3"]}, {"n_obs": 2},
     [(0, "a1", "h1"), (1, "a2", "h2")]),
])
def test_columns_table(tmp_path, columns, flags, expected):
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.inputs.hub import load_hf_examples

    cfg = EvalConfig(dataset=str(_saved(tmp_path, columns)), **flags)
    examples = load_hf_examples(cfg, need_targets=True)
    assert [(e.id, e.source, e.target) for e in examples.items] == expected
    assert examples.origin.endswith("split test")


@pytest.mark.parametrize("columns, flags, message", [
    ({"source": ["a", "b"], "target": ["x", "y"], "id": ["k", "k"]}, {},
     "row 1 column 'id': duplicated id 'k' (first in row 0)"),
    ({"source": ["a", "  "], "target": ["x", "y"]}, {}, "split test row 1 column 'source': blank source (whitespace only: '  '); expected a text with a "
     "non-whitespace character"),
    ({"source": ["a"], "target": [None]}, {}, "row 0 column 'target': expected a non-empty string, got None"),
    ({"source": ["a"], "target": ["x"], "id": [1.5]}, {}, "an id must be a string or an integer, got 1.5"),
    ({"source": ["a"]}, {}, "no target column 'target'"),
    ({"text": ["a"], "label": ["b"]}, {}, "no known source column"),
    ({"translation": [{"en": "a", "fr": "b"}]}, {}, "holds languages en, fr; pass --source_column translation.<lang>"),
    ({"translation": [{"en": "a", "fr": "b"}]}, {"src_lang": "en", "tgt_lang": "ro"},
     "--tgt_lang ro is not a language of column 'translation' (it holds en, fr)"),
    ({"nested": [{"a": {"b": "x"}}], "target": ["t"]}, {"source_column": "nested.a.c"},
     "no column 'nested.a.c' (--source_column); columns: nested, nested.a, nested.a.b, target"),
])
def test_data_errors_table(tmp_path, columns, flags, message):
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.errors import DataError
    from seq2seq_eval.inputs.hub import load_hf_examples

    with pytest.raises(DataError, match=re.escape(message)):
        load_hf_examples(EvalConfig(dataset=str(_saved(tmp_path, columns)), **flags), need_targets=True)


def test_pseudolabels_need_no_target_column(tmp_path):
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.inputs.hub import load_hf_examples

    cfg = EvalConfig(dataset=str(_saved(tmp_path, {"article": ["a", "b"]})), num_return_sequences=2)
    assert [(e.id, e.target) for e in load_hf_examples(cfg, need_targets=False).items] == [(0, None), (1, None)]


# --- multilingual tokenizers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ml_models(tmp_path_factory) -> dict[str, Path]:
    src, tgt = make_corpus(100, seed=1)
    root = tmp_path_factory.mktemp("multilingual")
    return {c: build_tiny_multilingual(c, root / c, src + tgt) for c in CONVENTIONS}


# Where each convention puts the source language code in the encoder input.
SOURCE_LANG_AT = {"mbart50": "first", "nllb": "first", "nllb_legacy": "last", "m2m100": "first"}


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_language_codes(convention, ml_models):
    import torch

    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.model.settings import encode_sources, generation_config_for, lang_token_id, load_model, load_model_config, load_tokenizer

    src_code, tgt_code = LANG_CODES[convention]
    cfg = EvalConfig(model_name=str(ml_models[convention]), src_lang=src_code, tgt_lang=tgt_code)
    tokenizer = load_tokenizer(cfg)
    src_id, tgt_id = lang_token_id(tokenizer, src_code, "--src_lang"), lang_token_id(tokenizer, tgt_code, "--tgt_lang")
    sources, _ = make_corpus(4, seed=3)
    ids, _ = encode_sources(tokenizer, sources, "", 64)
    for row in ids:
        if SOURCE_LANG_AT[convention] == "first":
            assert row[0] == src_id and row[-1] == tokenizer.eos_token_id
        else:
            assert row[-2:] == [tokenizer.eos_token_id, src_id]
    model_config, base = load_model_config(cfg)
    gc = generation_config_for(model_config, base, tokenizer, cfg)
    assert gc.forced_bos_token_id == tgt_id
    model = load_model(cfg, torch.device("cpu"))
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([r + [pad] * (width - len(r)) for r in ids]),
            attention_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids]),
            generation_config=gc,
        )
    # decoder_start_token_id, then the target language token, on every sequence
    assert out[:, 0].tolist() == [model.config.decoder_start_token_id] * len(ids)
    assert out[:, 1].tolist() == [tgt_id] * len(ids)
    # the language token is special: decoded predictions do not carry it
    from seq2seq_eval.engines.hf import HFEngine

    preds = HFEngine(model, tokenizer, gc, torch.device("cpu")).generate(ids, 0).preds
    assert len(preds) == 4 and not any(tokenizer.convert_ids_to_tokens(tgt_id) in p[0] for p in preds)


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_unknown_language_code_is_a_config_error(convention, ml_models):
    """mBART-50 and NLLB would otherwise accept any string and prefix sources with <unk>."""
    from seq2seq_eval.config import EvalConfig
    from seq2seq_eval.errors import ConfigError
    from seq2seq_eval.model.settings import load_tokenizer

    with pytest.raises(ConfigError, match=r"--src_lang xx_YY: not a language code of \w+; expected one of"):
        load_tokenizer(EvalConfig(model_name=str(ml_models[convention]), src_lang="xx_YY"))


# --- launchers: multi-node torchrun, srun without torchrun ---------------------------------------

# Variables a launcher sets for its workers: a test started under torchrun or srun must not leak them.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT")


def _launch_together(commands: list[tuple[list[str], dict]], cwd: Path, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """Start every command at once (they rendezvous with each other), then wait for all.
    Output goes to files, not pipes: a full pipe would block one process while we wait on another."""
    procs = []
    for i, (cmd, extra) in enumerate(commands):
        env = {k: v for k, v in _env(extra).items() if k not in LAUNCHER_VARS}
        env.update(extra)
        out, err = open(cwd / f"proc{i}.out", "w+"), open(cwd / f"proc{i}.err", "w+")
        # A session of its own: on failure the whole group (a torchrun agent and its workers) is killed.
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        procs.append((proc, cmd, out, err))
    results = []
    try:
        for proc, cmd, out, err in procs:
            proc.wait(timeout=timeout)
            out.seek(0), err.seek(0)
            results.append(subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read()))
    finally:
        for proc, _, out, err in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close(), err.close()
    return results


def test_two_torchrun_nodes_equal_one_process(tiny_model, files, env, reference, tmp_path):
    """Two torchrun agents as two "nodes" (c10d rendezvous on loopback), one rank each."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"eco-{uuid.uuid4().hex[:8]}"
    args = ["--model_name", str(tiny_model), "--dataset", str(files["jsonl"]), *ARGS,
            "--save_dir", str(tmp_path / "out"), "--tmp_dir", str(tmp_path / "work")]
    commands = [
        ([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
          "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id,
          "-m", "seq2seq_eval", *args], env)
        for node in (0, 1)
    ]
    for proc in _launch_together(commands, tmp_path):
        assert_ok(proc)
    _same_results(tmp_path / "out", reference)
    m = metrics_of(tmp_path / "out")
    assert m["provenance"]["world_size"] == 2 and len(m["throughput"]["per_rank"]) == 2


def test_torchrun_error_is_reported_when_rank_0_reaches_it_last(tiny_model, files, env, tmp_path):
    """torchrun stops every rank once one exits with an error. A rank other than 0 that hits a
    replicated error first (rank 0 alone reports those) must not get rank 0 killed before it
    says what went wrong: a flag's value is refused before the ranks meet. Rank 0 is made 2 s late
    at start-up, as a busy node would make it."""
    slow = tmp_path / "slow_rank_0"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text('import os, time\nif os.environ.get("RANK") == "0":\n    time.sleep(2)\n')
    extra = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(slow), env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "seq2seq_eval",
         "--model_name", str(tiny_model), "--dataset", str(files["jsonl"]), "--num_beams", "0",
         "--save_dir", str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, env=_env(extra))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seq2seq_eval: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "--num_beams must be an integer >= 1, got 0" in errors[0] and "[rank" not in errors[0]


def test_srun_without_torchrun_equals_one_process(tiny_model, files, env, reference, tmp_path):
    """What `srun --ntasks 2 python -m seq2seq_eval` starts: SLURM_* variables, no torchrun ones.
    The two processes are forked from the fork server (conftest.single), started together: srun
    has no agent of its own in them, only these variables."""
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    args = ["--model_name", str(tiny_model), "--dataset", str(files["jsonl"]), *ARGS, "--save_dir", str(tmp_path / "out")]
    ranks = [{**env, **master, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
              "SLURM_STEP_ID": "0"} for rank in (0, 1)]
    with ThreadPoolExecutor(len(ranks)) as pool:
        procs = list(pool.map(lambda extra: single(args, tmp_path, 240, env=extra), ranks))
    for proc in procs:
        assert_ok(proc)
    _same_results(tmp_path / "out", reference)
    assert metrics_of(tmp_path / "out")["provenance"]["world_size"] == 2


# --- provenance ---------------------------------------------------------------------------------

TIMING_FIELDS = ("throughput", "seconds_per_sample", "seconds_per_generated_sample")


def _without_timing(m: dict) -> dict:
    m = copy.deepcopy(m)
    for key in TIMING_FIELDS:
        m.pop(key)
    m["provenance"].pop("date")
    return m


def test_provenance_same_inputs_same_file_but_timings(tiny_model, files, env, reference):
    """The reference command again, in the same place: only timings and the date may change."""
    first = metrics_of(reference)
    cwd = reference.parent
    assert_ok(single(["--model_name", str(tiny_model), "--dataset", str(files["jsonl"]), *ARGS,
                      "--save_dir", str(reference)], cwd=cwd, env=env))
    second = metrics_of(reference)
    assert _without_timing(first) == _without_timing(second)
    p = second["provenance"]
    assert p["config"]["dataset"] == str(files["jsonl"]) and p["config"]["bs"] == 2
    assert p["generation"]["num_beams"] == 2 and p["generation"]["max_length"] == 12
    assert set(p["versions"]) >= {"torch", "transformers", "datasets", "sacrebleu", "rouge-score", "seq2seq_eval"}
    assert all(v != "not installed" for v in p["versions"].values())
    import seq2seq_eval

    # The running code's own version, also where the package has no installed metadata (a checkout
    # on PYTHONPATH); installed, the metadata says the same.
    assert p["versions"]["seq2seq_eval"] == seq2seq_eval.__version__
    from importlib import metadata

    try:
        assert metadata.version("seq2seq_eval") == seq2seq_eval.__version__
    except metadata.PackageNotFoundError:
        pass
    assert len(p["model"]["weights_sha256"]) == 64 and p["model"]["name"] == str(tiny_model)
    assert len(p["data"]["sha256"]) == 64 and p["data"]["n_examples"] == N
    assert p["date"] and p["world_size"] == 1 and p["device_type"] == "cpu"
