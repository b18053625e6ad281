"""What a new user runs into first: inputs never overwritten, greedy and sampled decoding, output
folders checked before any work, sources longer than the model allows, resume after a complete
run, and messages that say what happened (issue: defects found as a new user).

Real processes throughout (`python -m seq2seq_eval`, torchrun with gloo on CPU), a real
read-only mount and a real full disk where this machine allows mounting (root); those skip
cleanly elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, _env, assert_ok, free_port, make_corpus, metrics_of, run_ranks, single, write_legacy
from faults import wait_for_lines

from seq2seq_eval.run.dist import DistEnv
from seq2seq_eval.outputs.summary import summary_table
from seq2seq_eval.run.journal import read_journals
from seq2seq_eval.run.finish import resume_command

EMBEDDED = REPO / "data_samples" / "model"
PREFIX = "seq2seq_eval: error: "


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    src, tgt = make_corpus(9, seed=11)
    return write_legacy(tmp_path_factory.mktemp("new_user") / "data", src, tgt)


# ---------------------------------------------------------------- 1. never write over an input


def test_debug_run_into_the_data_dir_keeps_the_references(tiny_model, data, tmp_path):
    """`--debug --n_obs 5 --save_dir D --data_dir D` once replaced D/test.target with 5 lines."""
    folder = tmp_path / "D"
    shutil.copytree(data, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    proc = single(["--model_name", str(tiny_model), "--data_dir", str(folder), "--save_dir", str(folder),
                   "--debug", "--n_obs", "5"], cwd=tmp_path)
    assert_ok(proc)
    assert {name: (folder / name).read_bytes() for name in before} == before
    refs = before["test.target"].decode().splitlines()
    # the debug copy is in generation (id) order: the first 5 references
    assert (folder / "test_references.txt").read_text().splitlines() == refs[:5]


# ---------------------------------------------------------------- 2./3. greedy and sampling


def test_greedy_drops_the_models_beam_settings_and_says_so(tmp_path):
    proc = single(["--num_beams", "1", "--n_obs", "16", "--save_dir", str(tmp_path / "g")], cwd=tmp_path)
    assert_ok(proc)
    said = [line for line in proc.stderr.splitlines() if "ignoring the model's settings" in line]
    assert len(said) == 1 and "greedy decoding" in said[0] and "early_stopping=True" in said[0], proc.stderr
    m = metrics_of(tmp_path / "g")
    # generate()'s own default in its place, recorded as such
    assert m["provenance"]["generation"]["num_beams"] == 1 and m["provenance"]["generation"]["early_stopping"] is False
    assert m["bleu"] > 60  # the embedded model translates its toy task greedily too


SAMPLE = ["--do_sample", "true", "--num_beams", "1", "--num_return_sequences", "3", "--bs", "2"]


@pytest.fixture(scope="module")
def sampled(tiny_model, data, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sampled")
    base = ["--model_name", str(tiny_model), "--data_dir", str(data), *SAMPLE]
    out = {}
    for name, extra, nproc in (("one", ["--seed", "7"], 1), ("two", ["--seed", "7"], 2), ("other", ["--seed", "8"], 1)):
        save = root / name
        args = base + extra + ["--save_dir", str(save)]
        assert_ok(single(args, cwd=root) if nproc == 1 else run_ranks(nproc, args, cwd=root))
        out[name] = save
    return out


def test_sampling_several_candidates_is_repeatable_at_any_world_size(sampled):
    one = json.loads((sampled["one"] / "pseudolabel_results.json").read_text())
    assert len(one) == 9 and all(len(r["preds"]) == 3 for r in one)
    for name in ("pseudolabel_results.json", "test_pseudolabels.jsonl", "test_generations.txt"):
        assert (sampled["one"] / name).read_bytes() == (sampled["two"] / name).read_bytes()
    other = json.loads((sampled["other"] / "pseudolabel_results.json").read_text())
    assert [r["preds"] for r in other] != [r["preds"] for r in one]  # the seed matters
    info = json.loads((sampled["one"] / "test_run_info.json").read_text())
    assert info["provenance"]["config"]["seed"] == 7 and info["provenance"]["generation"]["do_sample"] is True


# ---------------------------------------------------------------- 4. places the run writes


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")


def test_read_only_save_dir_fails_in_the_dry_run(tiny_model, data, tmp_path):
    ro = tmp_path / "ro"
    _mount_tmpfs(ro, "ro,size=64k")
    try:
        for extra in (["--dry_run"], []):
            proc = single(["--model_name", str(tiny_model), "--data_dir", str(data), "--save_dir", str(ro / "out"),
                           "--tmp_dir", str(tmp_path / "t"), *extra], cwd=tmp_path)
            lines = _lines(proc.stderr)
            assert proc.returncode == 2 and len(lines) == 1, proc.stderr
            assert lines[0] == f"{PREFIX}--save_dir {ro / 'out'}: cannot create {ro / 'out'} (a read-only file system); " \
                               "expected a folder the run can write"
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_full_disk_mid_run_is_one_line_and_the_journal_resumes(tiny_model, tmp_path):
    """The disk fills up while batches are being journaled: one line naming the file, and what
    was journaled resumes to the same result as an uninterrupted run."""
    src, tgt = make_corpus(24, seed=12)
    folder = write_legacy(tmp_path / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(folder), "--bs", "1",
            "--min_length", "30", "--max_length", "30"]
    small = tmp_path / "small"
    _mount_tmpfs(small, "size=256k")
    # The run forked from the fork server, in a thread while this one fills the disk under it.
    with ThreadPoolExecutor(1) as pool:
        try:
            run = pool.submit(single, [*args, "--save_dir", str(tmp_path / "out"), "--tmp_dir", str(small / "tmp")],
                              tmp_path, 180)
            journal = small / "tmp" / "journal_rank_0.jsonl"
            wait_for_lines(journal, 2)
            try:
                with open(small / "filler", "wb", buffering=0) as f:  # fill what is left
                    while True:
                        f.write(b"x" * 4096)
            except OSError:
                pass
            proc = run.result()
            err = proc.stderr
            lines = _lines(err)
            assert proc.returncode != 0 and "Traceback" not in err
            assert lines[-1].startswith(f"{PREFIX}{small / 'tmp'}/") and "cannot write (disk full); the batches " \
                "journaled before this one are kept: make room, then rerun the same command with --resume" in lines[-1], err
            kept = read_journals(small / "tmp")
            assert 2 <= len(kept) < 24
            assert journal.read_bytes().endswith(b"\n")  # whole lines only
            resumed_tmp = tmp_path / "tmp2"
            shutil.copytree(small / "tmp", resumed_tmp)
        finally:
            subprocess.run(["umount", "-l", str(small)], check=False)
    assert_ok(single(args + ["--save_dir", str(tmp_path / "out"), "--tmp_dir", str(resumed_tmp), "--resume"],
                     cwd=tmp_path))
    m = metrics_of(tmp_path / "out")
    assert sum(r["resumed_batches"] for r in m["throughput"]["per_rank"]) == len(kept)
    assert_ok(single(args + ["--save_dir", str(tmp_path / "ref")], cwd=tmp_path))
    assert (tmp_path / "out" / "test_generations.txt").read_bytes() == (tmp_path / "ref" / "test_generations.txt").read_bytes()


# ---------------------------------------------------------------- 5. sources longer than the model


@pytest.fixture(scope="module")
def short_marian(tmp_path_factory) -> Path:
    """A tiny Marian whose position table holds 24 positions: a longer source used to end in an IndexError."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    src, tgt = make_corpus(50, seed=13)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(src + tgt, trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    config = MarianConfig(vocab_size=tok.get_vocab_size(), d_model=16, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                          decoder_ffn_dim=32, max_position_embeddings=24, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0, forced_eos_token_id=1)
    out = tmp_path_factory.mktemp("marian24") / "model"
    MarianMTModel(config).eval().save_pretrained(out)
    fast.save_pretrained(out)
    return out


def test_sources_are_truncated_at_the_models_limit(short_marian, data, tmp_path):
    from transformers import AutoTokenizer

    args = ["--model_name", str(short_marian), "--data_dir", str(data), "--max_length", "8"]
    tokenizer = AutoTokenizer.from_pretrained(short_marian)
    sources = (data / "test.source").read_text().splitlines()
    longer = sum(len(ids) > 24 for ids in tokenizer(sources)["input_ids"])
    assert longer > 0
    dry = single(args + ["--dry_run", "--save_dir", str(tmp_path / "o")], cwd=tmp_path)
    assert_ok(dry)
    assert f"sources truncated to 24 tokens: {longer}" in dry.stdout
    assert_ok(single(args + ["--save_dir", str(tmp_path / "o")], cwd=tmp_path))
    assert metrics_of(tmp_path / "o")["provenance"]["config"]["max_source_length"] is None
    too_long = single(args + ["--dry_run", "--max_source_length", "25", "--save_dir", str(tmp_path / "o")], cwd=tmp_path)
    assert too_long.returncode == 2 and _lines(too_long.stderr) == [
        f"{PREFIX}--max_source_length 25 exceeds the model's 24 positions (max_position_embeddings of "
        f"{short_marian}); expected at most 24"]


# ---------------------------------------------------------------- 6. resume after a complete run, and paths


def test_resume_of_a_complete_run_merges_and_reports(tiny_model, data, tmp_path, monkeypatch):
    """A --debug run keeps its temp dir with every batch journaled; --resume must report, and accept
    the same data and model named differently (relative, with a trailing slash)."""
    rel_data = os.path.relpath(data, tmp_path)
    first = single(["--model_name", str(tiny_model), "--data_dir", rel_data, "--save_dir", "out", "--debug"],
                   cwd=tmp_path)
    assert_ok(first)
    again = single(["--model_name", f"{tiny_model}/", "--data_dir", str(data), "--save_dir", "out", "--resume"],
                   cwd=tmp_path)
    assert_ok(again)
    assert "newly generated" in again.stdout and "(every batch came from the journal)" in again.stdout
    m = metrics_of(tmp_path / "out")
    assert m["throughput"]["generated_examples"] == 0 and m["seconds_per_generated_sample"] is None
    assert m["seconds_per_sample"] == 0.0 and m["n_obs"] == 9
    assert m["provenance"]["removed_stale_outputs"] == ["test_references.txt"]  # the debug copy


def test_seconds_per_sample_is_over_the_runs_examples(tiny_model, data, tmp_path):
    assert_ok(single(["--model_name", str(tiny_model), "--data_dir", str(data), "--save_dir", str(tmp_path / "o")],
                     cwd=tmp_path))
    m = metrics_of(tmp_path / "o")
    assert m["seconds_per_sample"] == m["throughput"]["generation_seconds"] / m["n_obs"]
    assert m["seconds_per_generated_sample"] == m["seconds_per_sample"]  # nothing was resumed


# ---------------------------------------------------------------- 9. messages that mislead


def test_ctrl_c_is_reported_by_rank_0_alone(tiny_model, tmp_path):
    """Ctrl-C reaches every process of the foreground group; rank 0 stops and reports, and no
    other rank may claim it is gone."""
    src, tgt = make_corpus(30, seed=14)
    folder = write_legacy(tmp_path / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(folder), "--bs", "1", "--min_length", "40",
            "--max_length", "40", "--save_dir", str(tmp_path / "out")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "seq2seq_eval", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        wait_for_lines(tmp_path / "out_tmp" / "journal_rank_0.jsonl", 2)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "rank 0 is gone" not in err, err
    ours = [line for line in err.splitlines() if line.startswith(PREFIX)]
    assert len(ours) == 1 and "interrupted by SIGINT" in ours[0] and "--resume" in ours[0], err
    # torchrun's own agent prints a SignalException traceback on Ctrl-C; none comes from a rank.
    assert "seq2seq_eval/" not in "".join(line for line in err.splitlines() if line.strip().startswith("File "))


@pytest.mark.parametrize(
    "env, expected",
    [
        (DistEnv(), f"{sys.executable} -m seq2seq_eval --bs 4 --resume"),
        (DistEnv(1, 1, 2, "torchrun", 0, 2, "127.0.0.1:29500", "x"),
         "torchrun --standalone --nproc_per_node=2 -m seq2seq_eval --bs 4 --resume"),
        (DistEnv(5, 1, 8, "torchrun", 0, 4, "node0:29400", "eval7"),
         "torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=node0:29400 --rdzv_id=eval7 "
         "-m seq2seq_eval --bs 4 --resume (on every node)"),
        (DistEnv(1, 1, 4, "slurm", 0, 2), "srun python -m seq2seq_eval --bs 4 --resume (with the same srun options)"),
    ],
)
def test_resume_command_names_the_whole_launch(env, expected):
    assert resume_command(env, ["--bs", "4", "--resume"]) == expected


def test_a_rank_that_never_joins_is_named(tiny_model, data, tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    start = time.monotonic()
    proc = single(["--model_name", str(tiny_model), "--data_dir", str(data), "--save_dir", str(tmp_path / "o"),
                   "--sync_timeout", "3"], cwd=tmp_path, timeout=120, env=env)
    assert time.monotonic() - start < 60
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert _lines(proc.stderr) == [f"{PREFIX}rank(s) 1 of 2 did not join within --sync_timeout 3 s; check that every "
                                   f"rank was started (and can reach 127.0.0.1:{env['MASTER_PORT']}), or raise --sync_timeout"]


# ---------------------------------------------------------------- 10. small things


def test_outputs_follow_the_split_and_stale_results_go(tiny_model, tmp_path):
    src, tgt = make_corpus(5, seed=15)
    rows = [{"id": f"{i:03d}", "source": s, "target": t} for i, (s, t) in enumerate(zip(src, tgt))]
    path = tmp_path / "valid.csv"
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["id", "source", "target"])
        w.writeheader()
        w.writerows(rows)
    save = tmp_path / "out"
    base = ["--model_name", str(tiny_model), "--dataset", str(path), "--split", "validation", "--save_dir", str(save)]
    assert_ok(single(base, cwd=tmp_path))
    written = ["validation_generations.txt", "validation_examples.jsonl", "validation_bleu.json"]
    assert sorted(p.name for p in save.iterdir()) == sorted([*written, ".seq2seq_eval_outputs.json"])
    assert metrics_of(save, "validation_bleu.json")["provenance"]["outputs"] == written
    # a pseudolabel run into the same folder: the earlier metric file must not stay beside it
    assert_ok(single(base + ["--num_return_sequences", "2"], cwd=tmp_path))
    assert not (save / "validation_bleu.json").exists() and not (save / "validation_examples.jsonl").exists()
    info = json.loads((save / "validation_run_info.json").read_text())
    assert info["provenance"]["removed_stale_outputs"] == ["validation_bleu.json", "validation_examples.jsonl"]
    labels = [json.loads(line) for line in (save / "validation_pseudolabels.jsonl").read_text().splitlines()]
    assert [r["id"] for r in labels] == ["000", "001", "002", "003", "004"]  # ids as the CSV holds them


def test_summary_table_is_aligned():
    metrics = {"bleu": 12.3456, "n_obs": 397, "throughput": {
        "generated_examples": 397, "samples_per_second": 73.35, "generated_tokens_per_second": 3260.7}}
    lines = summary_table(metrics, []).splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1, lines

