"""Small unit tests: CLI parsing, config checks, the rank environment, line reading, the temp
dir's atomic files and journals, the merge by id and the wait for rank files. No model."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
from pathlib import Path

import pytest

from seq2seq_eval import atomic
from seq2seq_eval.cli import build_config, build_parser, parse_generate_kwargs
from seq2seq_eval.config import EMBEDDED_DATA, EvalConfig, field_docs, parse_value
from seq2seq_eval.inputs.files import read_lines
from seq2seq_eval.run.dist import DistEnv, choose_device, dist_env
from seq2seq_eval.errors import ConfigError, DataError, EvalError, MergeError, SyncTimeoutError
from seq2seq_eval.inputs.examples import Example
from seq2seq_eval.outputs.merge import merge_by_id
from seq2seq_eval.inputs.store import ExampleStore, write_store
from seq2seq_eval.atomic import write_atomic
from seq2seq_eval.run.journal import Journal, journal_file, read_journals
from seq2seq_eval.run.rankfiles import rank_file, RankWriter, read_rank_output, wait_for_rank_files

# ---------------------------------------------------------------- generate options


@pytest.mark.parametrize(
    "text, value",
    [
        ("4", 4), ("-2", -2), ("0.6", 0.6), ("1e3", 1000.0), ("true", True), ("False", False),
        ("none", None), ("None", None), ("beam", "beam"), ("nan", "nan"), ("inf", "inf"), ("", ""),
    ],
)
def test_parse_value(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    "rest, expected",
    [
        ([], ()),
        (["--num_beams", "4"], (("num_beams", 4),)),
        (["--length_penalty", "0.6", "--early_stopping", "true"], (("length_penalty", 0.6), ("early_stopping", True))),
        (["--num_beams=4"], (("num_beams", 4),)),
        (["--length-penalty=-1.5"], (("length_penalty", -1.5),)),
        (["--suppress_tokens", "None"], (("suppress_tokens", None),)),
        (["--prompt=a=b"], (("prompt", "a=b"),)),  # only the first "=" separates
        (["--temperature", "-0.5"], (("temperature", -0.5),)),  # a negative number is a value
        (["--bad_words_ids", "[[1308], [7, 8]]"], (("bad_words_ids", [[1308], [7, 8]]),)),  # JSON, as generate() takes it
        (["--suppress_tokens=[1308]"], (("suppress_tokens", [1308]),)),
    ],
)
def test_parse_generate_kwargs(rest, expected):
    assert parse_generate_kwargs(rest) == expected


@pytest.mark.parametrize(
    "rest, message",
    [
        (["--num_beams"], "--num_beams needs a value"),
        (["--num_beams", "--max_length", "5"], "--num_beams needs a value"),
        (["beam"], "unexpected argument 'beam'"),
        (["--num_beams", "4", "5"], "unexpected argument '5'"),
        (["--"], "unexpected argument '--'"),
    ],
)
def test_parse_generate_kwargs_errors(rest, message):
    with pytest.raises(ConfigError, match=message):
        parse_generate_kwargs(rest)


# ---------------------------------------------------------------- build_config


def test_defaults_come_from_the_config_class():
    assert build_config([]) == EvalConfig()
    helps = {a.dest: a.help for a in build_parser()._actions}
    docs = field_docs()
    for f in dataclasses.fields(EvalConfig):
        # metric_options and selection: groups of flags, each its own (their defaults: None)
        if f.name not in ("generate_kwargs", "metric_options", "selection") and f.default not in (None, "", False):
            # the value itself, unless the field's docstring already words its default
            expected = "(default: " if "(default" in docs[f.name] else f"(default: {f.default})"
            assert expected in helps[f.name], f.name
    # metric_options: each model metric's option is a flag of its own, its default in its help.
    from seq2seq_eval.scoring.registry import options

    for option in options():
        if option.default not in (None, "", False):
            assert f"(default: {option.default})" in helps[option.name], option.name


@pytest.mark.parametrize(
    "argv, field, value",
    [
        (["--max-source-length", "12"], "max_source_length", 12),
        (["--max_source_length", "12"], "max_source_length", 12),
        (["--num-return-sequences", "2"], "num_return_sequences", 2),
        (["--sync-timeout", "2.5"], "sync_timeout", 2.5),
        (["--dry-run"], "dry_run", True),
        (["--bs", "3", "--bs", "5"], "bs", 5),  # the last one wins, as in any argparse CLI
        (["--n_obs", "7"], "n_obs", 7),
    ],
)
def test_build_config_fields(argv, field, value):
    assert getattr(build_config(argv), field) == value


def test_build_config_generate_options_use_underscores():
    cfg = build_config(["--bs", "2", "--num-beams", "3", "--no_repeat_ngram_size=2"])
    assert cfg.bs == 2
    assert cfg.gen_kwargs == {"num_beams": 3, "no_repeat_ngram_size": 2}


@pytest.mark.parametrize(
    "argv, leftover",
    [
        (["--max_source", "8"], ("max_source", 8)),  # not --max_source_length
        (["--n", "3"], ("n", 3)),  # not --n_obs
        (["--sync", "1"], ("sync", 1)),  # not --sync_timeout
    ],
)
def test_no_prefix_matching(argv, leftover):
    """allow_abbrev=False: an abbreviation is an (unknown) generate option, never a real flag."""
    cfg = build_config(argv)
    assert cfg.generate_kwargs == (leftover,)
    assert (cfg.max_source_length, cfg.n_obs, cfg.sync_timeout) == (None, None, 600.0)


def test_abbreviated_switch_needs_a_value():
    with pytest.raises(ConfigError, match="--dry needs a value"):
        build_config(["--dry"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "qa"], r"--task must be translation, summarization or a name containing one of them"),
        (["--bs", "x"], r"argument --bs: invalid int value: 'x'"),
        (["--bs"], r"argument --bs: expected one argument"),
    ],
)
def test_argparse_errors_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        build_config(argv)


# ---------------------------------------------------------------- EvalConfig checks


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"task": "qa"}, r"--task must be translation, summarization or a name containing one of them "
                         r"\(e\.g\. translation_en_to_de\), got 'qa'"),
        ({"bs": 0}, r"--bs must be an integer >= 1, got 0"),
        ({"bs": True}, r"--bs must be an integer >= 1, got True"),
        ({"bs": 2.0}, r"--bs must be an integer >= 1, got 2.0"),
        ({"max_tokens": 0}, r"--max_tokens must be an integer >= 1, got 0"),
        ({"max_source_length": -1}, r"--max_source_length must be an integer >= 1, got -1"),
        ({"n_obs": 0}, r"--n_obs must be an integer >= 1, got 0"),
        ({"num_return_sequences": 0}, r"--num_return_sequences must be an integer >= 1, got 0"),
        ({"sync_timeout": 0}, r"--sync_timeout must be a number of seconds > 0, got 0"),
        ({"sync_timeout": -1.5}, r"--sync_timeout must be a number of seconds > 0, got -1.5"),
        ({"sync_timeout": float("inf")}, r"--sync_timeout must be a number of seconds > 0, got inf"),
        ({"sync_timeout": "10"}, r"--sync_timeout must be a number of seconds > 0, got '10'"),
        ({"fp16": True, "bf16": True}, r"--fp16 and --bf16 are mutually exclusive"),
        ({"generate_kwargs": (("num_beams", 2), ("num_beams", 3))}, r"^--num_beams given twice \(2 and 3\); give it once$"),
        ({"generate_kwargs": (("num_beams", 0),)}, r"--num_beams must be an integer >= 1, got 0"),
        ({"generate_kwargs": (("num_beams", True),)}, r"--num_beams must be an integer >= 1, got True"),
        ({"generate_kwargs": (("num_beams", "4"),)}, r"--num_beams must be an integer >= 1, got '4'"),
        ({"num_return_sequences": 4, "generate_kwargs": (("num_beams", 2),)},
         r"--num_return_sequences \(4\) must not exceed --num_beams \(2\)"),
        ({"generate_kwargs": (("do_sample", "maybe"),)}, r"--do_sample 'maybe': expected true or false"),
        ({"generate_kwargs": (("do_sample", 1),)}, r"--do_sample 1: expected true or false"),
        ({"generate_kwargs": (("max_new_tokens", 1.5),)}, r"--max_new_tokens 1.5: expected an integer"),
        ({"generate_kwargs": (("top_k", False),)}, r"--top_k False: expected an integer"),
        ({"generate_kwargs": (("temperature", "hot"),)}, r"--temperature 'hot': expected a number"),
        ({"generate_kwargs": (("suppress_tokens", 1308),)}, r"--suppress_tokens 1308: expected a JSON list of token ids"),
        ({"generate_kwargs": (("bad_words_ids", [1308]),)}, r"--bad_words_ids \[1308\]: expected a non-empty JSON list of token-id lists"),
        ({"generate_kwargs": (("bad_words_ids", [[]]),)}, r"--bad_words_ids \[\[\]\]: expected a non-empty JSON list of token-id lists"),
        ({"generate_kwargs": (("eos_token_id", [1, -2]),)}, r"--eos_token_id \[1, -2\]: expected a token id, or a JSON list"),
        ({"generate_kwargs": (("sequence_bias", [[1308, -5.0]]),)}, r"--sequence_bias .*: expected a non-empty JSON list of \[token-id list, bias\] pairs"),
        ({"generate_kwargs": (("early_stopping", "always"),)}, r"--early_stopping 'always': expected true, false or never"),
        ({"pseudo_target": True}, r"--pseudo_target needs --num_return_sequences >= 2"),
        ({"split": "train"}, r"--dataset_config/--split/--\*_column need --dataset"),
        ({"source_column": "src"}, r"need --dataset"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EvalConfig(**kwargs)


def test_config_derived_defaults():
    cfg = EvalConfig(save_dir="out/")
    assert cfg.tmp_dir == "out_tmp"
    assert cfg.data_dir == str(EMBEDDED_DATA["translation"])
    assert EvalConfig(task="summarization").data_dir == str(EMBEDDED_DATA["summarization"])
    assert EvalConfig(dataset="x").data_dir == ""
    assert EvalConfig(tmp_dir="t").tmp_dir == "t"
    assert EvalConfig(num_return_sequences=2).pseudolabels
    assert EvalConfig(task="summarization").metric_name == "rouge"
    # num_return_sequences equal to num_beams is fine; so is any count without --num_beams
    EvalConfig(num_return_sequences=3, generate_kwargs=(("num_beams", 3),))
    EvalConfig(num_return_sequences=5)
    # generate options of the right kind, None (the model's own setting), and options not listed
    EvalConfig(generate_kwargs=(("do_sample", True), ("temperature", 1), ("top_p", 0.9), ("max_new_tokens", None),
                                ("early_stopping", "never"), ("length_penalty", -0.5), ("stop_strings", "x"),
                                ("bad_words_ids", [[5], [6, 7]]), ("suppress_tokens", [5]), ("eos_token_id", [1, 2]),
                                ("sequence_bias", [[[5], -1.0]])))


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        EvalConfig().bs = 4  # type: ignore[misc]


# ---------------------------------------------------------------- dist_env


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, DistEnv()),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, DistEnv(1, 1, 2, "torchrun", 0)),
        ({"RANK": "3", "WORLD_SIZE": "4"}, DistEnv(3, 0, 4, "torchrun", 0)),
        ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "2"}, DistEnv(0, 0, 2, "torchrun", 2)),
        ({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"}, DistEnv(2, 0, 4, "slurm", 0)),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEPID": "3"}, DistEnv(1, 0, 2, "slurm", 0)),
        # srun inside a larger allocation: the step's own size counts, not the allocation's
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0",
          "SLURM_STEP_TASKS_PER_NODE": "2(x1)"}, DistEnv(1, 0, 2, "slurm", 0, 2)),
        # an salloc/sbatch shell: allocation variables but no job step, so one plain process
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "17"}, DistEnv()),
        ({"SLURM_NTASKS": "4", "SLURM_NNODES": "2"}, DistEnv()),
        # torchrun inside a SLURM allocation: torchrun's variables describe this process
        ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"},
         DistEnv(1, 0, 2, "torchrun", 0)),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, DistEnv(1, 1, 4, "torchrun", 0, 2)),
    ],
)
def test_dist_env(environ, expected):
    assert dist_env(environ) == expected


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside world size 2"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "rank -1 is outside world size 2"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "rank 0 is outside world size 0"),
        ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, "rank 4 is outside world size 4"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "environment variable RANK must be an integer, got 'one'"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "", "SLURM_STEP_ID": "0"}, "environment variable SLURM_NTASKS must be an integer, got ''"),
    ],
)
def test_dist_env_errors(environ, message):
    with pytest.raises(ConfigError, match=message):
        dist_env(environ)


@pytest.mark.parametrize(
    "device, backend, env, gpus, expected",
    [
        ("auto", "auto", DistEnv(), 0, ("cpu", "gloo")),
        ("auto", "auto", DistEnv(), 1, ("cuda:0", "nccl")),
        ("cpu", "auto", DistEnv(1, 1, 2, "torchrun", 0, 2), 8, ("cpu", "gloo")),
        ("auto", "auto", DistEnv(3, 3, 8, "torchrun", 0, 4), 4, ("cuda:3", "nccl")),
        ("cuda", "nccl", DistEnv(5, 1, 8, "torchrun", 0, 4), 4, ("cuda:1", "nccl")),
        # ranks share GPUs through gloo: round-robin over the visible GPUs
        ("auto", "gloo", DistEnv(1, 1, 2, "torchrun", 0, 2), 1, ("cuda:0", "gloo")),
        ("auto", "gloo", DistEnv(2, 2, 3, "torchrun", 0, 3), 2, ("cuda:0", "gloo")),
        # a single process never builds a process group, whatever the node looks like
        ("auto", "auto", DistEnv(0, 0, 1, "torchrun", 0, 1), 1, ("cuda:0", "nccl")),
    ],
)
def test_choose_device(device, backend, env, gpus, expected):
    assert choose_device(device, backend, env, gpus) == expected


@pytest.mark.parametrize(
    "device, backend, env, gpus, message",
    [
        ("auto", "auto", DistEnv(1, 1, 2, "torchrun", 0, 2), 1,
         r"2 ranks on this node but 1 visible GPU\(s\), and nccl needs a GPU per rank; start at most 1 process\(es\) "
         r"per node \(--nproc_per_node / NPROC\), run on CPU with --device cpu, or let ranks share GPUs with --dist_backend gloo"),
        ("cuda", "nccl", DistEnv(0, 0, 16, "torchrun", 0, 8), 4, "8 ranks on this node but 4 visible GPU"),
        ("cuda", "auto", DistEnv(), 0, r"--device cuda: no CUDA GPU is visible"),
        ("auto", "nccl", DistEnv(), 0, r"--dist_backend nccl needs GPUs, and this run is on CPU"),
    ],
)
def test_choose_device_errors(device, backend, env, gpus, message):
    with pytest.raises(ConfigError, match=message):
        choose_device(device, backend, env, gpus)


def test_dist_env_reads_the_process_environment(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    assert dist_env() == DistEnv()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    env = dist_env()
    assert (env.rank, env.world_size, env.is_main) == (1, 3, False)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ConfigError, match="rank 3 is outside world size 3"):
        dist_env()


# ---------------------------------------------------------------- read_lines


@pytest.mark.parametrize(
    "raw, lines",
    [
        (b"a\nb\n", ["a", "b"]),
        (b"a\nb", ["a", "b"]),  # no final newline
        (b"", []),
        (b"\n", [""]),
        (b"a\n\nb\n", ["a", "", "b"]),
        (b"a\r\nb\r\n", ["a", "b"]),  # CRLF
        (b"\xef\xbb\xbfa\nb\n", ["a", "b"]),  # BOM stripped
        ("one\u2028two\nthree\u0085four\x0cfive\n".encode(), ["one\u2028two", "three\u0085four\x0cfive"]),
        ("caf\u00e9 \u00fcber\n".encode(), ["caf\u00e9 \u00fcber"]),
    ],
)
def test_read_lines(tmp_path, raw, lines):
    path = tmp_path / "f.txt"
    path.write_bytes(raw)
    assert read_lines(path) == lines


def test_read_lines_names_the_bad_line(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"ok\nfine\r\nbad \xc3(\n")
    with pytest.raises(DataError, match=r"f\.txt line 3: invalid UTF-8 \(byte 0xc3 at column 5\)"):
        read_lines(path)


def test_read_lines_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: file not found"):
        read_lines(tmp_path / "nope.txt")


# ---------------------------------------------------------------- write_atomic


def test_write_atomic_replaces_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "out.json"
    write_atomic(path, b"old\n")
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_write_atomic_missing_folder(tmp_path):
    path = tmp_path / "no_such_dir" / "out.json"
    with pytest.raises(EvalError, match=r"no_such_dir/out\.json: cannot write \(No such file or directory\)"):
        write_atomic(path, b"x")
    assert list(tmp_path.iterdir()) == []


def test_write_atomic_keeps_the_old_file_when_the_disk_is_full(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    write_atomic(path, b"old\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(EvalError, match=r"out\.json: cannot write \(disk full\); the previous version, if any, is unchanged"):
        write_atomic(path, b"new, never complete\n")
    assert path.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


# ---------------------------------------------------------------- journals


def entry(batch_index: int, ids: list[int]) -> dict:
    return {"batch": batch_index, "records": [{"id": i, "pred": f"p{i}"} for i in ids], "seconds": 0.5}


def test_journal_appends_and_reads_back(tmp_path):
    journal = Journal(journal_file(tmp_path, 0))
    journal.append(entry(2, [4, 5]))
    journal.append(entry(0, [0, 1]))
    journal.close()
    other = Journal(journal_file(tmp_path, 1))
    other.append(entry(1, [2, 3]))
    other.close()
    done = read_journals(tmp_path)
    assert sorted(done) == [0, 1, 2]
    assert done[2] == entry(2, [4, 5])
    assert done[1]["records"][1] == {"id": 3, "pred": "p3"}


def test_journal_drops_a_torn_last_line_on_reopen(tmp_path):
    path = journal_file(tmp_path, 0)
    journal = Journal(path)
    journal.append(entry(0, [0]))
    journal.close()
    complete = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"batch": 1, "records": [{"id": 1, "pr')  # a crash mid-write
    journal = Journal(path)
    assert path.read_bytes() == complete
    journal.append(entry(1, [1]))
    journal.close()
    assert len(path.read_bytes().splitlines()) == 2
    assert sorted(read_journals(tmp_path)) == [0, 1]


def test_read_journals_skips_unreadable_lines(tmp_path):
    lines = [
        json.dumps(entry(0, [0])),
        "not json at all",
        json.dumps({"records": []}),  # no batch index
        json.dumps({"batch": "two"}),
        '{"batch": 3, "records": [',  # torn
        json.dumps(entry(4, [4])),
    ]
    journal_file(tmp_path, 0).write_text("\n".join(lines) + "\n", encoding="utf-8")
    journal_file(tmp_path, 1).write_bytes(b"\xff\xfe garbage\n" + json.dumps(entry(5, [5])).encode() + b"\n")
    assert sorted(read_journals(tmp_path)) == [0, 4, 5]


def test_read_journals_of_an_empty_folder(tmp_path):
    assert read_journals(tmp_path) == {}


# ---------------------------------------------------------------- merge by id


def rank_outputs(tmp_path: Path, per_rank: list[list[object]], planned: list[object]):
    """Real rank files and a real example store, written and read back the way the runner does.
    A record's data position is where its id is planned (past the end when it is not)."""
    store_path = tmp_path / "examples.arrow"
    write_store(store_path, [Example(i, f"s{i}", f"t{i}") for i in planned])
    store = ExampleStore(store_path, "test data")
    outs = []
    for rank, ids in enumerate(per_rank):
        writer = RankWriter(tmp_path, rank)
        for i in ids:  # one planned batch per record
            position = planned.index(i) if i in planned else len(planned) + 7
            writer.add([position], [{"id": i, "pred": f"p{i}", "n_tokens": 1}])
        path = writer.close({"rank": rank})
        assert path == rank_file(tmp_path, rank)
        outs.append(read_rank_output(path, rank))
    return outs, store


def _merged(outs, store) -> list[tuple[object, str]]:
    table, order = merge_by_id(outs, store)
    rows = table.take(order).to_pylist()
    return [(json.loads(r["id"]), r["pred"][0]) for r in rows]


def test_merge_orders_by_data_not_by_rank(tmp_path):
    outs, store = rank_outputs(tmp_path, [[3, 0], [], [2, 1, 4]], [0, 1, 2, 3, 4])
    assert _merged(outs, store) == [(0, "p0"), (1, "p1"), (2, "p2"), (3, "p3"), (4, "p4")]


def test_merge_string_ids(tmp_path):
    outs, store = rank_outputs(tmp_path, [["b"], ["a", "c"]], ["a", "b", "c"])
    assert [i for i, _ in _merged(outs, store)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "per_rank, planned, message",
    [
        ([[0, 1, 1], [2]], [0, 1, 2], r"rank_0_output\.arrow: example id 1 appears twice"),
        ([[0, 1], [2, 1]], [0, 1, 2], r"rank_1_output\.arrow: example id 1 appears again \(first in rank_0_output\.arrow\)"),
        ([[0, 1], [3]], [0, 1, 2, 3], r"rank files are missing example id\(s\) 2$"),
        ([[0, 1], [2, 99]], [0, 1, 2], r"rank_1_output\.arrow: example id\(s\) 99 are not in the evaluated data"),
        ([["a"], ["b"]], ["a", "b", "c"], r"missing example id\(s\) 'c'"),
        # an int is not the string of its digits (ids keep their JSON type)
        ([[0], [1]], ["0", "1"],
         r"rank_0_output\.arrow: example id\(s\) 0 are not in the evaluated data at that place \(expected id '0'\)"),
        ([list(range(5)), []], list(range(20)), r"missing example id\(s\) 5, 6, .*, 14, \.\.\. \(15 in all\)"),
    ],
    ids=["twice-in-one-file", "again-in-another-file", "missing", "unexpected", "missing-string-id",
         "int-vs-string-id", "many-missing"],
)
def test_merge_errors_name_the_id_and_the_file(tmp_path, per_rank, planned, message):
    if per_rank == [[0], [1]]:
        # positions of the string ids "0" and "1": the records claim those places with int ids
        outs, store = rank_outputs(tmp_path, [["0"], ["1"]], planned)
        outs = _with_ids(tmp_path, outs, [[0], [1]])
    else:
        outs, store = rank_outputs(tmp_path, per_rank, planned)
    with pytest.raises(MergeError, match=message):
        merge_by_id(outs, store)


def _with_ids(tmp_path: Path, outs, ids_per_rank):
    """The same rank files with other ids in the same places."""
    result = []
    for out, ids in zip(outs, ids_per_rank):
        writer = RankWriter(tmp_path, out.rank)
        rows = out.table.to_pylist()
        for row, i in zip(rows, ids):
            writer.add([row["position"]], [{"id": i, "pred": row["pred"], "n_tokens": 1}])
        result.append(read_rank_output(writer.close({"rank": out.rank}), out.rank))
    return result


# ---------------------------------------------------------------- waiting for rank files


def test_wait_returns_when_every_rank_file_exists(tmp_path):
    rank_outputs(tmp_path, [[0], [1]], [0, 1])
    assert wait_for_rank_files(tmp_path, 2, timeout_s=5) == [rank_file(tmp_path, 0), rank_file(tmp_path, 1)]


def test_wait_times_out_naming_the_missing_ranks(tmp_path):
    rank_outputs(tmp_path, [[0], [1]], [0, 1])
    start = time.monotonic()
    with pytest.raises(SyncTimeoutError, match=r"waited 0\.3 s \(--sync_timeout\) for rank files; missing from rank\(s\) 2, 3; hi$"):
        wait_for_rank_files(tmp_path, 4, timeout_s=0.3, describe_missing=lambda missing: "; hi")
    assert 0.3 <= time.monotonic() - start < 2.0


def test_waiting_costs_almost_no_cpu(tmp_path):
    wall0, cpu0 = time.monotonic(), time.process_time()
    with pytest.raises(SyncTimeoutError, match=r"missing from rank\(s\) 0, 1, 2$"):
        wait_for_rank_files(tmp_path, 3, timeout_s=1.5)
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    assert wall >= 1.5
    assert cpu < 0.05 * wall, f"{cpu:.3f} s of CPU over {wall:.2f} s of waiting"


def test_generated_lengths_stop_at_the_first_eos():
    """Beam search pads finished rows with EOS when the pad id is 0; those are not generated."""
    import torch

    from seq2seq_eval.engines.hf import generated_lengths

    seq = torch.tensor([[0, 5, 6, 1, 1, 1], [0, 5, 6, 7, 8, 9], [0, 1, 0, 0, 0, 0], [0, 4, 2, 0, 0, 0]])
    assert generated_lengths(seq, 1, 0).tolist() == [3, 5, 1, 2]
    assert generated_lengths(seq, [1, 2], 0).tolist() == [3, 5, 1, 2]


# ---------------------------------------------------------------- pseudolabel_results.json, streamed


def test_legacy_pseudolabel_records_are_json_dumps_with_indent_1():
    """Streamed one record at a time, the file must be byte-identical to json.dumps of the whole
    list (the legacy format), for every kind of value a record holds."""
    import random

    from seq2seq_eval.outputs.write import _legacy_record

    rng = random.Random(0)

    def value(depth: int = 0) -> object:
        kind = rng.randrange(6 if depth < 2 else 4)
        if kind == 0:
            return None
        if kind == 1:
            return rng.randrange(-5, 10**6)
        if kind == 2:
            return 'ü"\\\n\t\u2028' + str(rng.random())
        if kind == 3:
            return rng.random()
        if kind == 4:
            return []
        return [value(depth + 1) for _ in range(rng.randrange(1, 4))]

    for _ in range(500):
        record = {"id": rng.choice([3, "x y"]), "source": value(), "target": value(),
                  "preds": [value() for _ in range(rng.randrange(0, 3))]}
        whole = json.dumps([record], ensure_ascii=False, sort_keys=True, indent=1)
        assert whole == "[\n" + _legacy_record(record).decode("utf-8") + "\n]"


# ---------------------------------------------------------------- JSON Lines outputs


# Every character str.splitlines() ends a line at, found rather than listed.
LINE_BREAKS = "".join(c for c in map(chr, range(0x110000)) if len(f"a{c}b".splitlines()) == 2)


def test_the_line_breaks_are_those_json_leaves_raw_plus_those_it_escapes():
    from seq2seq_eval.outputs.jsonl import LINE_BREAKS_JSON_KEEPS

    assert LINE_BREAKS == "\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"
    assert LINE_BREAKS_JSON_KEEPS == "".join(c for c in LINE_BREAKS if c in json.dumps(c, ensure_ascii=False))


def test_jsonl_outputs_are_one_line_per_example_for_any_line_splitter(tmp_path):
    """_examples.jsonl, _pseudolabels.jsonl and evaluate()'s _inputs.jsonl: texts holding each line
    break give one line per example to str.splitlines(), and json.loads gives the texts back;
    text without them is written as json.dumps writes it."""
    from seq2seq_eval.inputs.memory import in_memory_inputs
    from seq2seq_eval.outputs.write import output_lines

    texts = [f"a{c}b" for c in LINE_BREAKS] + ["plain ü \"q\" \t"]
    examples = [Example(i, f"source {t}", f"reference {t}") for i, t in enumerate(texts)]
    records = [{"pred": [f"best {t}", f"next {t}"], "scores": [-1.0, -2.0], "sentence_scores": {"bleu": 1.0}}
               for t in texts]
    scored = output_lines(EvalConfig(), examples, records)["out_example"]
    pseudo = output_lines(EvalConfig(num_return_sequences=2, generate_kwargs=(("num_beams", 2),)), examples, records)["out_jsonl"]
    for lines, text_key in ((scored, "prediction"), (pseudo, "candidates")):
        whole = b"".join(lines).decode("utf-8")
        rows = [json.loads(line) for line in whole.splitlines()]
        assert len(rows) == len(texts)
        assert [r["source"] for r in rows] == [e.source for e in examples]
        got = [r[text_key] if text_key == "prediction" else r[text_key][0] for r in rows]
        assert got == [f"best {t}" for t in texts]
        assert lines[-1].decode("utf-8") == json.dumps(rows[-1], ensure_ascii=False) + "\n"  # plain text: unchanged
    cfg = EvalConfig(save_dir=str(tmp_path), data_dir=str(tmp_path / "test_inputs.jsonl"))
    copy = in_memory_inputs(cfg, [f"s {t}" for t in texts], [f"r {t}" for t in texts], None, None)
    rows = [json.loads(line) for line in copy.data.decode("utf-8").splitlines()]
    assert [(r["source"], r["target"]) for r in rows] == [(f"s {t}", f"r {t}") for t in texts]
