"""Nothing adopted, replaced or removed that the tool did not make: the temp dir by its marker only
and never through a link, the legacy form's SAVE_PATH and SCORE_PATH and compare's --report by
their folder's record, outputs by their bytes and their prefix, resume by the tokenizer's
content too; and what the dry run catches (a truncated model file) or accepts alike run after
run (a folder reused with itself). Each data-loss test compares every file's bytes before and
after (test_paths.snapshot), over the whole folder of the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import assert_ok, make_corpus, single, write_legacy
from test_paths import one_line, snapshot

from seq2seq_eval.outputs.record import RECORD, OutputRecord


@pytest.fixture(scope="module")
def case(tiny_model, tmp_path_factory):
    """A model folder of its own, and data under three prefixes (test, val, test_references.v2)."""
    root = tmp_path_factory.mktemp("ownership")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    src, tgt = make_corpus(6, seed=43)
    data = root / "data"
    for prefix in ("test", "val", "test_references.v2"):
        write_legacy(data, src, tgt, type_path=prefix)
    return root, model, data


def _all(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda argv: single(argv, cwd=cwd, timeout=180), commands))


def test_a_folder_without_the_marker_is_never_taken_for_a_temp_dir(case, tmp_path):
    """A user's folder holding only files named like the tool's (a run.lock, a
    cache/examples.json) is refused as --tmp_dir, in the dry run and the run: nothing is written
    there, truncated or removed."""
    _, model, data = case
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "run.lock").write_text("my lock\n")
    (tmp_path / "caches" / "cache").mkdir(parents=True)
    (tmp_path / "caches" / "cache" / "examples.json").write_text('{"mine": 1}\n')
    before = snapshot(tmp_path)
    common = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3"]
    commands = [[*common, "--save_dir", str(tmp_path / f"out_{name}"), "--tmp_dir", str(tmp_path / name), *dry]
                for name in ("locks", "caches") for dry in ([], ["--dry_run"])]
    for argv, proc in zip(commands, _all(commands, tmp_path)):
        line = one_line(proc)
        assert "but no .seq2seq_eval_tmp marker, so they are not known to be seq2seq_eval's" in line, (argv, line)
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["caches", "locks"]


def test_no_link_in_the_temp_dir_is_followed(case, tmp_path):
    """`cache` in the temp dir made a link to a folder of the user's (in a temp dir the tool made
    and kept, and in a fresh folder that holds only the link): refused in the dry run and the
    run, the user's folder untouched and nothing of the tool's left in it."""
    _, model, data = case
    mine = tmp_path / "mycache"
    mine.mkdir()
    (mine / "examples.json").write_text('{"mine": 1}\n')
    (mine / "notes.txt").write_text("keep\n")
    save = tmp_path / "out"
    args = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3", "--save_dir", str(save)]
    assert_ok(single([*args, "--debug"], cwd=tmp_path))  # keeps its temp dir, marked
    tmp = Path(f"{save}_tmp")
    shutil.rmtree(tmp / "cache")
    (tmp / "cache").symlink_to(mine)
    fresh = tmp_path / "proj"
    fresh.mkdir()
    (fresh / "cache").symlink_to(mine)
    before = snapshot(mine)
    commands = [[*args, "--resume"], [*args, "--resume", "--dry_run"],
                [*args, "--tmp_dir", str(fresh)], [*args, "--tmp_dir", str(fresh), "--dry_run"]]
    for argv, proc in zip(commands, _all(commands, tmp_path)):
        line = one_line(proc)
        assert "cache is a symbolic link (to " in line and "neither writes nor removes anything through a link" in line, \
            (argv, line)
    assert snapshot(mine) == before and sorted(p.name for p in mine.iterdir()) == ["examples.json", "notes.txt"]
    assert [p.name for p in fresh.iterdir()] == ["cache"]


def test_the_legacy_form_writes_over_only_its_own_save_path_and_score_path(case, tmp_path):
    """run_eval.py's default SCORE_PATH is ./metrics.json: last week's file of the user's there is
    refused before any work (dry run too), untouched. Moved away, the run writes it and SAVE_PATH,
    recorded in their folder's record; run again, it replaces its own files."""
    _, model, data = case
    (tmp_path / "metrics.json").write_text('{"bleu": 99.9, "mine": true}\n')
    before = snapshot(tmp_path)
    legacy = [str(model), str(data / "test.source"), "gen.txt", "--reference_path", str(data / "test.target"),
              "--task", "translation", "--bs", "3"]
    for extra in (["--dry_run"], []):
        line = one_line(single([*legacy, *extra], cwd=tmp_path))
        assert line.startswith("metrics.json (--score_path (the scores)): exists and seq2seq_eval did not write it"), line
        assert "name another file" in line
    line = one_line(single([*legacy, "--score_path", RECORD, "--dry_run"], cwd=tmp_path))
    assert line == (f"{RECORD}: --score_path (the scores) is named like seq2seq_eval's own bookkeeping in its folder; "
                    "name another file")
    assert snapshot(tmp_path) == before
    os.rename(tmp_path / "metrics.json", tmp_path / "mine.json")
    for _ in range(2):
        assert_ok(single(legacy, cwd=tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD, "gen.txt", "metrics.json", "mine.json"]
        record = OutputRecord(tmp_path)
        assert {n: (e.prefix, e.kind) for n, e in record.files.items()} == {"gen.txt": (None, "named"),
                                                                          "metrics.json": (None, "named")}
        assert record.owns(tmp_path / "gen.txt") and record.owns(tmp_path / "metrics.json")
    assert (tmp_path / "mine.json").read_text() == '{"bleu": 99.9, "mine": true}\n'


def test_prefixes_own_their_files(case, tmp_path):
    """The distillation workflow into one folder: pseudolabels of test; val's are refused before
    any work (pseudolabel_results.json keeps its legacy name, and is test's); a scored run of
    test_references.v2; a scored --debug run of test, which removes test's pseudolabel results
    (stale, its own prefix) and never test_references.v2's files (a glob once took them for
    test's references). Each run leaves every other prefix's files as they were."""
    root, model, data = case
    save = tmp_path / "out"
    common = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3", "--save_dir", str(save)]
    pseudo = ["--num_return_sequences", "2", "--num_beams", "2"]
    assert_ok(single([*common, *pseudo], cwd=tmp_path))
    tests = snapshot(save)
    for extra in (["--dry_run"], []):
        line = one_line(single([*common, *pseudo, "--type_path", "val", *extra], cwd=tmp_path))
        assert line.startswith(f"{save / 'pseudolabel_results.json'} (output pseudolabel_results.json of --save_dir): is "
                               "an output of the run with prefix 'test' (--type_path or --split) (it keeps its legacy "
                               "name, without a prefix)"), line
        assert line.endswith("so a run of prefix 'val' does not replace it; give this run another --save_dir"), line
    assert snapshot(save) == tests
    assert_ok(single([*common, "--type_path", "test_references.v2"], cwd=tmp_path))
    now = snapshot(save)
    assert {k: now[k] for k in tests if k != RECORD} == {k: v for k, v in tests.items() if k != RECORD}
    v2 = {k: v for k, v in now.items() if k.startswith("test_references.v2")}
    assert sorted(v2) == ["test_references.v2_bleu.json", "test_references.v2_examples.jsonl",
                          "test_references.v2_generations.txt"]
    assert_ok(single([*common, "--debug"], cwd=tmp_path))
    shutil.rmtree(Path(f"{save}_tmp"))
    after = snapshot(save)
    assert {k: after.get(k) for k in v2} == v2
    assert sorted(after) == sorted([RECORD, *v2, "test_bleu.json", "test_examples.jsonl", "test_generations.txt",
                                    "test_references.txt"])
    removed = json.loads(after["test_bleu.json"])["provenance"]["removed_stale_outputs"]
    assert removed == ["pseudolabel_results.json", "test_pseudolabels.jsonl", "test_run_info.json"]


def test_an_edit_that_keeps_size_and_time_is_the_users_and_a_copy_is_the_tools(case, tmp_path):
    """A generations file edited in place with its size and modification time put back
    (`touch -r`) is the user's: refused (dry run too), said truly, untouched. A `cp -a` copy of a
    save folder is the tool's own: a run into the copy replaces its outputs. A report compare
    wrote and the user annotated since is the user's."""
    _, model, data = case
    save, copy = tmp_path / "out", tmp_path / "copy"
    args = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3"]
    assert_ok(single([*args, "--save_dir", str(save)], cwd=tmp_path))
    subprocess.run(["cp", "-a", str(save), str(copy)], check=True)
    gen = save / "test_generations.txt"
    st = os.stat(gen)
    text = gen.read_bytes()
    gen.write_bytes(text.replace(b" ", b"_", 1) if b" " in text else b"X" + text[1:])  # same size
    os.utime(gen, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = tmp_path / "report.html"
    compare = ["compare", "--predictions", str(copy), str(copy / "test_generations.txt"), "--names", "a", "b",
               "--report", str(report)]
    assert_ok(single(compare, cwd=tmp_path))
    with open(report, "a", encoding="utf-8") as f:
        f.write("<!-- my notes -->\n")
    before = snapshot(tmp_path)
    procs = _all([[*args, "--save_dir", str(save), "--dry_run"], [*args, "--save_dir", str(save)], compare], tmp_path)
    for proc in procs[:2]:
        assert one_line(proc).startswith(f"{gen} (output test_generations.txt of --save_dir): is not the file "
                                         "seq2seq_eval wrote here (its bytes differ from those in "
                                         ".seq2seq_eval_outputs.json)")
    assert one_line(procs[2]).startswith(f"{report} (--report): is not the file seq2seq_eval wrote here")
    assert snapshot(tmp_path) == before
    copied = snapshot(copy)
    assert_ok(single([*args, "--save_dir", str(copy), "--num_return_sequences", "2", "--num_beams", "2"], cwd=tmp_path))
    assert "test_bleu.json" in copied and not (copy / "test_bleu.json").exists()  # its own, stale: removed


def test_a_folder_reused_with_itself_is_treated_alike_run_after_run(case, tmp_path):
    """--save_dir the model's own folder: accepted, and accepted again (the outputs there are the
    tool's, not model files). --tmp_dir the same folder as --save_dir, or a --save_dir inside
    --tmp_dir: refused before any work, the first time as the second, for a true reason."""
    _, model, data = case
    mine = tmp_path / "model"
    shutil.copytree(model, mine)
    args = ["--model_name", str(mine), "--data_dir", str(data), "--bs", "3", "--save_dir", str(mine)]
    for _ in range(2):
        assert_ok(single(args, cwd=tmp_path))
    assert (mine / "test_generations.txt").exists() and (mine / "model.safetensors").exists()
    x = tmp_path / "x"
    common = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3"]
    for _ in range(2):
        for extra in (["--dry_run"], []):
            line = one_line(single([*common, "--save_dir", str(x), "--tmp_dir", str(x), *extra], cwd=tmp_path))
            assert line.startswith(f"--save_dir {x}: is --tmp_dir, the run's scratch folder, which is emptied"), line
            line = one_line(single([*common, "--save_dir", str(x / "out"), "--tmp_dir", str(x), *extra], cwd=tmp_path))
            assert line.startswith(f"--save_dir {x / 'out'}: is inside --tmp_dir {x}"), line
    assert not x.exists()


def test_a_changed_tokenizer_is_another_run(case, tmp_path):
    """Two ids swapped in tokenizer.json, the weights unchanged: --resume of the earlier run is
    refused, naming the tokenizer; a temp dir whose run journaled nothing is started over with
    the sources tokenized again (the token cache is keyed by the tokenizer's content), giving
    what a fresh run with that tokenizer gives."""
    _, model, data = case
    mine = tmp_path / "model"
    shutil.copytree(model, mine)
    save = tmp_path / "out"
    args = ["--model_name", str(mine), "--data_dir", str(data), "--bs", "3", "--save_dir", str(save)]
    assert_ok(single([*args, "--debug"], cwd=tmp_path))
    spec = json.loads((mine / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["the"], vocab["cat"] = vocab["cat"], vocab["the"]
    (mine / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    line = one_line(single([*args, "--resume"], cwd=tmp_path))
    assert "belongs to a run with different tokenizer" in line, line
    tmp = Path(f"{save}_tmp")
    for journal in tmp.glob("journal_rank_*.jsonl"):
        journal.write_bytes(b"")  # as a run killed before its first batch leaves them
    assert_ok(single(args, cwd=tmp_path))
    fresh = tmp_path / "fresh"
    assert_ok(single([*args[:-1], str(fresh)], cwd=tmp_path))
    assert (save / "test_generations.txt").read_bytes() == (fresh / "test_generations.txt").read_bytes()


def test_a_truncated_weights_file_fails_the_dry_run_in_one_line(case, tmp_path):
    _, model, data = case
    broken = tmp_path / "model"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    args = ["--model_name", str(broken), "--data_dir", str(data), "--save_dir", str(tmp_path / "out")]
    for extra in (["--dry_run"], []):
        line = one_line(single([*args, *extra], cwd=tmp_path))
        assert line.startswith(f"--model_name {broken}: model.safetensors is truncated: its tensors end at byte "
                               f"{len(good)}, but the file holds {len(good) // 2} bytes"), line
    weights.write_bytes(good[:4])
    assert "too short for a safetensors header" in one_line(single([*args, "--dry_run"], cwd=tmp_path))


def test_the_tools_writes_and_removals_in_its_temp_dir_refuse_links(tmp_path):
    """Links put in a temp dir after it was claimed (the claim refuses any): the journal, the
    atomic writes and the cleanup neither write, cut nor remove through them, nor remove the links."""
    from seq2seq_eval.atomic import write_atomic
    from seq2seq_eval.errors import EvalError
    from seq2seq_eval.run.journal import Journal
    from seq2seq_eval.run.tmpdir import RunLock, claim_tmp_dir, cleanup_tmp_dir

    tmp = tmp_path / "t"
    claim_tmp_dir(tmp)
    mine = tmp_path / "mine.txt"
    mine.write_text("no newline at the end")  # what a journal's torn tail is cut at
    (tmp / "journal_rank_0.jsonl").symlink_to(mine)
    with pytest.raises(OSError):
        Journal(tmp / "journal_rank_0.jsonl")
    (tmp / f".manifest.json.{os.getpid()}.tmp").symlink_to(mine)
    with pytest.raises(EvalError, match="manifest.json: cannot write"):
        write_atomic(tmp / "manifest.json", b"{}\n")
    (tmp / "run.lock").symlink_to(mine)
    with pytest.raises(EvalError, match="cannot create the run lock"):
        RunLock(tmp).acquire()
    (tmp / "cache").mkdir()
    (tmp / "cache" / "examples.json").symlink_to(mine)
    cleanup_tmp_dir(tmp)
    assert mine.read_text() == "no newline at the end"
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == [
        f".manifest.json.{os.getpid()}.tmp", "cache", "cache/examples.json", "journal_rank_0.jsonl", "run.lock"]
